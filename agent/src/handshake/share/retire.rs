//! Replaced exit files removed off the decision path.
//!
//! `allow` takes the place of `exit` by an exchange (see [`super::at::swap_in`]), which
//! leaves the old file under a temp name. Removing it frees its blocks, which can take
//! milliseconds (a `discard` mount hands them to the device before `unlink` returns), or as
//! long as a container likes with a file it made large: one thread per share does it, so
//! no container's file can hold up another's answer.
//!
//! What is queued when the share is dropped is still removed (the thread drains, then
//! ends); what a crashed agent left is a dot-file in the container's own directory, removed
//! with the pod's directory.

use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::sync::OnceLock;

use rustix::fs::{self as rfs, AtFlags};
use tracing::debug;

/// A replaced file: its directory and its temp name there.
type Retired = (OwnedFd, String);

/// The removing thread, started on first use.
#[derive(Debug, Default)]
pub(super) struct Retirer {
    tx: OnceLock<Option<mpsc::Sender<Retired>>>,
}

impl Retirer {
    /// Removes `name` from `dir` on the removing thread; here, when it cannot be started.
    pub(super) fn retire(&self, dir: OwnedFd, name: String) {
        let unsent = match self.tx.get_or_init(start) {
            Some(tx) => tx.send((dir, name)).err().map(|e| e.0),
            None => Some((dir, name)),
        };
        if let Some((dir, name)) = unsent {
            remove(&dir, &name);
        }
    }
}

fn start() -> Option<mpsc::Sender<Retired>> {
    let (tx, rx) = mpsc::channel::<Retired>();
    let spawned = std::thread::Builder::new()
        .name("share_retire".to_owned())
        .spawn(move || {
            let _span = tracing::info_span!("share_retire").entered();
            // Ends once every sender (the share) is gone and the queue is empty.
            for (dir, name) in rx {
                remove(&dir, &name);
            }
        });
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            debug!(error = %e, "no thread to remove replaced exit files; removed in place");
            None
        }
    }
}

/// Removes a replaced file; a directory (a container's own, swapped in) or a name already
/// gone is left be: it is the container's directory, removed with its pod.
fn remove(dir: &OwnedFd, name: &str) {
    if let Err(e) = rfs::unlinkat(dir, name, AtFlags::empty()) {
        debug!(file = name, error = %e, "replaced exit file not removed");
    }
}
