//! Watches a pod's exit files while it is deleted, so a timeline can say when a sidecar's
//! preStop started waiting and when the agent answered. inotify, not polling: the entrypoint
//! removes `exit` within a millisecond of reading `allow`, which a poll would miss.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

use exitorder::handshake::share::EXIT_FILE;

/// First occurrences of what happened to one container's exit file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExitFileEvents {
    /// The preStop created `exit`: from here it waits (Unix ns).
    pub created: Option<i64>,
    /// `allow` took `exit`'s place, exchanged or renamed (only the agent writes it that way).
    pub allowed: Option<i64>,
    /// The preStop removed `exit` after its wait.
    pub removed: Option<i64>,
}

#[derive(Default)]
struct Seen {
    files: BTreeMap<String, ExitFileEvents>,
    pod_dir_created: Option<i64>,
}

/// A running watch on one pod's share directories: a thread reading one inotify instance
/// until the probe is finished or dropped.
pub struct ExitFileProbe {
    seen: Arc<Mutex<Seen>>,
    wake: Arc<OwnedFd>,
    reader: Option<JoinHandle<()>>,
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    match seen.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl ExitFileProbe {
    /// Watches `pods_dir` (for the pod's directory appearing), `pods_dir/<uid>` and each
    /// container's directory, those that exist.
    pub fn start(
        pods_dir: &Path,
        uid: &str,
        containers: &[String],
    ) -> std::io::Result<ExitFileProbe> {
        let seen = Arc::new(Mutex::new(Seen {
            files: containers
                .iter()
                .map(|c| (c.clone(), ExitFileEvents::default()))
                .collect(),
            pod_dir_created: None,
        }));
        let pod_dir = pods_dir.join(uid);
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?;
        let mut dirs: Vec<PathBuf> = vec![pods_dir.to_owned(), pod_dir.clone()];
        dirs.extend(containers.iter().map(|c| pod_dir.join(c)));
        let mut watched = BTreeMap::new();
        for d in dirs.into_iter().filter(|d| d.is_dir()) {
            let mask = WatchFlags::CREATE
                | WatchFlags::MOVED_TO
                | WatchFlags::DELETE
                | WatchFlags::ONLYDIR;
            let wd = inotify::add_watch(&fd, &d, mask)?;
            watched.insert(wd, d);
        }
        let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let reader = {
            let (seen, wake) = (Arc::clone(&seen), Arc::clone(&wake));
            std::thread::Builder::new()
                .name("exit-file-probe".into())
                .spawn(move || read(&fd, &wake, &watched, &pod_dir, &seen))?
        };
        Ok(ExitFileProbe {
            seen,
            wake,
            reader: Some(reader),
        })
    }

    /// What was seen so far.
    pub fn events(&self) -> BTreeMap<String, ExitFileEvents> {
        lock(&self.seen).files.clone()
    }

    /// Stops watching; returns the events and when the pod directory appeared, if it did.
    pub fn finish(mut self) -> (BTreeMap<String, ExitFileEvents>, Option<i64>) {
        self.stop();
        let seen = lock(&self.seen);
        (seen.files.clone(), seen.pod_dir_created)
    }

    /// Wakes the reader to end and waits for it: what it read is recorded when this returns.
    fn stop(&mut self) {
        if let Some(reader) = self.reader.take() {
            let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
            let _ = reader.join();
        }
    }
}

impl Drop for ExitFileProbe {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The probe's thread: reads the instance until woken, then once more, so nothing already
/// queued when the probe finished is lost.
fn read(
    fd: &OwnedFd,
    wake: &OwnedFd,
    watched: &BTreeMap<i32, PathBuf>,
    pod_dir: &Path,
    seen: &Mutex<Seen>,
) {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 16 * 1024];
    loop {
        let mut fds = [
            PollFd::new(fd, PollFlags::IN),
            PollFd::new(wake, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => return,
        }
        let woken = !fds[1].revents().is_empty();
        let mut reader = inotify::Reader::new(fd, &mut buf);
        loop {
            let ev = match reader.next() {
                Ok(ev) => ev,
                Err(Errno::INTR) => continue,
                Err(_) => break,
            };
            let Some(dir) = watched.get(&ev.wd()) else {
                continue;
            };
            let Some(name) = ev.file_name().map(|n| n.to_bytes()) else {
                continue;
            };
            let path = dir.join(OsStr::from_bytes(name));
            record(
                &mut lock(seen),
                pod_dir,
                &path,
                ev.events(),
                crate::clock::now_ns(),
            );
        }
        if woken {
            return;
        }
    }
}

fn record(seen: &mut Seen, pod_dir: &Path, path: &Path, flags: ReadFlags, at: i64) {
    if path == pod_dir {
        if flags.contains(ReadFlags::CREATE) {
            seen.pod_dir_created.get_or_insert(at);
        }
        return;
    }
    let Ok(rel) = path.strip_prefix(pod_dir) else {
        return;
    };
    let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
    let [container, file] = parts.as_slice() else {
        return;
    };
    if *file != EXIT_FILE {
        return;
    }
    let entry = seen.files.entry((*container).to_owned()).or_default();
    if flags.contains(ReadFlags::CREATE) {
        entry.created.get_or_insert(at);
    } else if flags.contains(ReadFlags::MOVED_TO) {
        entry.allowed.get_or_insert(at);
    } else if flags.contains(ReadFlags::DELETE) {
        entry.removed.get_or_insert(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn wait_for(probe: &ExitFileProbe, pred: impl Fn(&ExitFileEvents) -> bool) -> ExitFileEvents {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let ev = probe.events().remove("proxy").unwrap_or_default();
            if pred(&ev) || Instant::now() > deadline {
                return ev;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn sees_the_handshake() {
        let t = tempfile::tempdir().unwrap();
        let pods = t.path().join("pods");
        let dir = pods
            .join("0f5c7a1e-8d2b-4c3e-9f00-123456789abc")
            .join("proxy");
        std::fs::create_dir_all(&dir).unwrap();
        let probe = ExitFileProbe::start(
            &pods,
            "0f5c7a1e-8d2b-4c3e-9f00-123456789abc",
            &["proxy".to_owned()],
        )
        .unwrap();
        std::fs::write(dir.join("exit"), "wait\n").unwrap();
        std::fs::write(dir.join(".exit.tmp"), "allow\n").unwrap();
        std::fs::rename(dir.join(".exit.tmp"), dir.join("exit")).unwrap();
        std::fs::remove_file(dir.join("exit")).unwrap();
        let ev = wait_for(&probe, |e| e.removed.is_some());
        let (c, a, r) = (
            ev.created.unwrap(),
            ev.allowed.unwrap(),
            ev.removed.unwrap(),
        );
        assert!(c <= a && a <= r, "{ev:?}");
        let (_, pod_dir) = probe.finish();
        assert_eq!(pod_dir, None);
    }
}
