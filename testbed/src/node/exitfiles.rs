//! Watches a pod's exit files while it is deleted, so a timeline can say when a sidecar's
//! preStop started waiting and when the agent answered. inotify, not polling: the entrypoint
//! removes `exit` within a millisecond of reading `allow`, which a poll would miss.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::event::{ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};

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

/// A running watch on one pod's share directories.
pub struct ExitFileProbe {
    _watcher: RecommendedWatcher,
    seen: Arc<Mutex<Seen>>,
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
    ) -> Result<ExitFileProbe, notify::Error> {
        let seen = Arc::new(Mutex::new(Seen {
            files: containers
                .iter()
                .map(|c| (c.clone(), ExitFileEvents::default()))
                .collect(),
            pod_dir_created: None,
        }));
        let pod_dir = pods_dir.join(uid);
        let handler = {
            let seen = Arc::clone(&seen);
            let pod_dir = pod_dir.clone();
            move |res: notify::Result<notify::Event>| {
                let Ok(ev) = res else { return };
                let at = crate::clock::now_ns();
                record(&mut lock(&seen), &pod_dir, &ev, at);
            }
        };
        let mut watcher = notify::recommended_watcher(handler)?;
        let mut dirs: Vec<PathBuf> = vec![pods_dir.to_owned(), pod_dir.clone()];
        dirs.extend(containers.iter().map(|c| pod_dir.join(c)));
        for d in dirs.iter().filter(|d| d.is_dir()) {
            watcher.watch(d, RecursiveMode::NonRecursive)?;
        }
        Ok(ExitFileProbe {
            _watcher: watcher,
            seen,
        })
    }

    /// What was seen so far.
    pub fn events(&self) -> BTreeMap<String, ExitFileEvents> {
        lock(&self.seen).files.clone()
    }

    /// Stops watching; returns the events and when the pod directory appeared, if it did.
    pub fn finish(self) -> (BTreeMap<String, ExitFileEvents>, Option<i64>) {
        let seen = lock(&self.seen);
        (seen.files.clone(), seen.pod_dir_created)
    }
}

fn record(seen: &mut Seen, pod_dir: &Path, ev: &notify::Event, at: i64) {
    for path in &ev.paths {
        if path == pod_dir {
            if matches!(ev.kind, EventKind::Create(_)) {
                seen.pod_dir_created.get_or_insert(at);
            }
            continue;
        }
        let Ok(rel) = path.strip_prefix(pod_dir) else {
            continue;
        };
        let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
        let [container, file] = parts.as_slice() else {
            continue;
        };
        if *file != EXIT_FILE {
            continue;
        }
        let entry = seen.files.entry((*container).to_owned()).or_default();
        match ev.kind {
            EventKind::Create(_) => {
                entry.created.get_or_insert(at);
            }
            EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {}
            EventKind::Modify(ModifyKind::Name(_)) => {
                entry.allowed.get_or_insert(at);
            }
            EventKind::Remove(_) => {
                entry.removed.get_or_insert(at);
            }
            _ => {}
        }
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
