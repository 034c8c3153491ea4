//! inotify on the share, one directory level at a time.
//!
//! Only `pods/`, `pods/<uid>/` and `pods/<uid>/<name>/` are watched, each non-recursively: the
//! first two are created by the kubelet, and below the third a container may create what it
//! likes, so recursing there would let one pod spend the node's inotify watches.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{Config, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// What the watcher reports.
#[derive(Debug)]
pub enum FsEvent {
    /// Something changed at these paths.
    Changed(Vec<PathBuf>),
    /// Events were lost (inotify queue overflow): everything must be scanned again.
    Rescan,
    /// The watcher itself failed.
    Error(String),
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("inotify: {0}")]
    Init(#[source] notify::Error),
    #[error("watch {path}: {source}")]
    Add {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
}

pub struct ShareWatcher {
    inner: RecommendedWatcher,
    watched: HashSet<PathBuf>,
}

/// Kinds that can mean an exit file or a directory came, changed or went. Opens and reads are
/// left out: the agent's own reads would otherwise come back as events.
fn relevant(kind: &EventKind) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        EventKind::Modify(m) => !matches!(m, notify::event::ModifyKind::Metadata(_)),
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Other | EventKind::Any => false,
    }
}

impl ShareWatcher {
    pub fn new(tx: mpsc::UnboundedSender<FsEvent>) -> Result<Self, WatchError> {
        let handler = move |res: notify::Result<notify::Event>| {
            let ev = match res {
                Ok(ev) if ev.need_rescan() => FsEvent::Rescan,
                Ok(ev) if relevant(&ev.kind) => FsEvent::Changed(ev.paths),
                Ok(_) => return,
                Err(e) => FsEvent::Error(e.to_string()),
            };
            // The receiver is gone only during shutdown.
            let _ = tx.send(ev);
        };
        let inner = RecommendedWatcher::new(handler, Config::default().with_follow_symlinks(false))
            .map_err(WatchError::Init)?;
        Ok(ShareWatcher {
            inner,
            watched: HashSet::new(),
        })
    }

    /// Watches one directory (idempotent). The caller has checked it is a real directory.
    pub fn watch(&mut self, dir: &Path) -> Result<(), WatchError> {
        if self.watched.contains(dir) {
            return Ok(());
        }
        self.inner
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|source| WatchError::Add {
                path: dir.to_owned(),
                source,
            })?;
        self.watched.insert(dir.to_owned());
        Ok(())
    }

    /// Forgets every watch at or below `dir` (the kernel drops them when the directory goes;
    /// this keeps our side in step).
    pub fn forget(&mut self, dir: &Path) {
        let gone: Vec<PathBuf> = self
            .watched
            .iter()
            .filter(|p| p.starts_with(dir))
            .cloned()
            .collect();
        for p in gone {
            let _ = self.inner.unwatch(&p);
            self.watched.remove(&p);
        }
    }

    pub fn len(&self) -> usize {
        self.watched.len()
    }

    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }
}
