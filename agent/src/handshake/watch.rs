//! inotify on the share, one directory level at a time.
//!
//! Only `pods/`, `pods/<uid>/` and `pods/<uid>/<name>/` are watched, each non-recursively: the
//! first two are created by the kubelet, and below the third a container may create what it
//! likes, so recursing there would let one pod spend the node's inotify watches.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{Config, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::handshake::share::EXIT_FILE;

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

/// A directory of pods whose changes are reported, and how deep below it a container's exit
/// directory is.
#[derive(Debug, Clone)]
pub struct Root {
    pub pods: PathBuf,
    pub container_depth: usize,
}

/// Whether a changed path can matter: a directory down to a container's exit directory, or
/// an exit file. Whatever else a container makes in its directory is its own business;
/// dropping it here, on the watcher's thread, keeps a container that creates files without
/// end from filling the decision loop's queue.
fn worth_telling(roots: &[Root], path: &Path) -> bool {
    for root in roots {
        if let Ok(rel) = path.strip_prefix(&root.pods) {
            let depth = rel.components().count();
            return depth <= root.container_depth
                || (depth == root.container_depth.saturating_add(1)
                    && rel.file_name() == Some(std::ffi::OsStr::new(EXIT_FILE)));
        }
    }
    // Not below any: a root itself, moved or removed.
    true
}

impl ShareWatcher {
    /// Reports the changes below `roots` that can matter.
    pub fn new(tx: mpsc::UnboundedSender<FsEvent>, roots: Vec<Root>) -> Result<Self, WatchError> {
        let handler = move |res: notify::Result<notify::Event>| {
            let ev = match res {
                Ok(ev) if ev.need_rescan() => FsEvent::Rescan,
                Ok(mut ev) if relevant(&ev.kind) => {
                    ev.paths.retain(|p| worth_telling(&roots, p));
                    if ev.paths.is_empty() {
                        return;
                    }
                    FsEvent::Changed(ev.paths)
                }
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

    /// The names directly below `root` that have watches at or below them: the pods watched
    /// under a root of pod directories.
    pub fn watched_below(&self, root: &Path) -> BTreeSet<std::ffi::OsString> {
        self.watched
            .iter()
            .filter_map(|p| p.strip_prefix(root).ok()?.iter().next())
            .map(ToOwned::to_owned)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.watched.len()
    }

    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_can_hold_a_wait_is_told() {
        let pods = &[
            Root {
                pods: "/share/pods".into(),
                container_depth: 2,
            },
            Root {
                pods: "/kubelet/pods".into(),
                container_depth: 5,
            },
        ];
        let uid = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";
        for told in [
            "/share/pods".to_owned(),
            format!("/share/pods/{uid}"),
            format!("/share/pods/{uid}/proxy"),
            format!("/share/pods/{uid}/proxy/exit"),
            "/share".to_owned(),
            format!("/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir"),
            format!("/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/exitorder/proxy"),
            format!("/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/exitorder/proxy/exit"),
        ] {
            assert!(worth_telling(pods, Path::new(&told)), "{told}");
        }
        for dropped in [
            format!("/share/pods/{uid}/proxy/junk-1"),
            format!("/share/pods/{uid}/proxy/.exit.tmp"),
            format!("/share/pods/{uid}/proxy/exit/deeper"),
            format!("/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/exitorder/proxy/junk"),
        ] {
            assert!(!worth_telling(pods, Path::new(&dropped)), "{dropped}");
        }
    }
}
