//! Replaced exit files removed off the decision path.
//!
//! `allow` takes the place of `exit` by an exchange (see [`super::at::swap_in`]), which
//! leaves the old file under a temp name. Removing it frees its blocks, which can take
//! milliseconds (a `discard` mount hands them to the device before `unlink` returns), or as
//! long as a container likes with a file it made large: one thread per share does it, so
//! no container's file can hold up another's answer.
//!
//! The queue is bounded ([`QUEUE`]), and each entry holds its directory open: a container
//! that keeps the thread busy while making answer after answer cannot spend the agent's
//! descriptors. Past the bound, and after the agent ends (the thread goes with the
//! process), a replaced file stays where it is, a dot-file in the container's own
//! directory, removed with the pod's directory.

use std::os::fd::OwnedFd;
use std::sync::mpsc;

use rustix::fs::{self as rfs, AtFlags};
use tracing::{debug, warn};

/// Removals waiting at most.
const QUEUE: usize = 256;

/// A replaced file: its directory and its temp name there.
type Retired = (OwnedFd, String);

/// The removing thread.
#[derive(Debug)]
pub(super) struct Retirer {
    /// `None` when no thread could be made: removals are then made in place, as before.
    tx: Option<mpsc::SyncSender<Retired>>,
}

impl Retirer {
    /// Starts the thread; it ends once this is dropped and its queue is done.
    pub(super) fn start() -> Self {
        let (tx, rx) = mpsc::sync_channel::<Retired>(QUEUE);
        let spawned = std::thread::Builder::new()
            .name(THREAD.to_owned())
            .spawn(move || {
                let _span = tracing::info_span!("share_retire").entered();
                for (dir, name) in rx {
                    remove(&dir, &name);
                }
            });
        match spawned {
            Ok(_) => Retirer { tx: Some(tx) },
            Err(e) => {
                warn!(error = %e, "no thread to remove replaced exit files: removed on the decision path");
                Retirer { tx: None }
            }
        }
    }

    /// Removes `name` from `dir` on the removing thread. With the queue full, it is left for
    /// the pod's directory's removal; without a thread, it is removed here.
    pub(super) fn retire(&self, dir: OwnedFd, name: String) {
        let Some(tx) = &self.tx else {
            remove(&dir, &name);
            return;
        };
        match tx.try_send((dir, name)) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full((_, name))) => {
                debug!(
                    file = name,
                    "removals queued at most: replaced exit file left for its pod's removal"
                );
            }
            Err(mpsc::TrySendError::Disconnected((dir, name))) => remove(&dir, &name),
        }
    }
}

/// The removing thread's name.
const THREAD: &str = "share_retire";

/// Removes a replaced file; a directory (a container's own, swapped in) or a name already
/// gone is left be: it is the container's, removed with its pod's directory.
fn remove(dir: &OwnedFd, name: &str) {
    #[cfg(test)]
    tests::removed_on(std::thread::current().name());
    if let Err(e) = rfs::unlinkat(dir, name, AtFlags::empty()) {
        debug!(file = name, error = %e, "replaced exit file not removed");
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    static ELSEWHERE: AtomicUsize = AtomicUsize::new(0);

    pub(super) fn removed_on(thread: Option<&str>) {
        if thread != Some(super::THREAD) {
            ELSEWHERE.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Removals made on another thread than the removing one, in this test process.
    pub fn removed_elsewhere() -> usize {
        ELSEWHERE.load(Ordering::Relaxed)
    }
}
