//! inotify on the places of exit directories, one directory level at a time, each watch on
//! the directory the agent opened and checked.
//!
//! Only the levels down to a container's exit directory are watched, each non-recursively:
//! below it a container may create what it likes. What makes this safe against a pod that
//! changes its own volume at full speed:
//! - **A watch is added on an opened directory, never on a name.** The agent opens each
//!   level with `O_NOFOLLOW | O_DIRECTORY` (which a link fails) and adds the watch through
//!   `/proc/self/fd/N`: that magic link resolves to the open file itself, not by looking the
//!   name up again, so a link exchanged in between (`renameat2(RENAME_EXCHANGE)`) cannot
//!   redirect it anywhere outside the pod. (`IN_DONT_FOLLOW` would not do: on the magic link
//!   it refuses, or watches the link.) Without `/proc`, by name with `IN_DONT_FOLLOW`.
//! - **Two inotify instances.** The kubelet's levels (the roots, `pods/<uid>/`, the volume
//!   directories) are in one, the levels a pod can change (the exit directories and their
//!   parent) in the other: a pod's churn cannot overflow the queue that tells of new pods,
//!   and a watch the agent adds or removes for a pod can never be one of the kubelet's levels
//!   (watch descriptors are per instance).
//! - **Bounded.** At most [`MAX_POD_WATCHES`] watches per pod and [`MAX_WATCHES`] in all; a
//!   pod past its share is served by polling ([`WatchError::Budget`]).
//! - **Read off the loop.** A thread reads both instances and files each event in the
//!   [`FsQueue`], which coalesces and bounds them; a lost root watch (`IN_IGNORED`) is told.
//!
//! No inotify instance at all (root's `fs.inotify.max_user_instances`, 128, shared with every
//! root process of the node): the watcher runs without one and says so ([`ShareWatcher::polling`]);
//! the agent then rescans on a timer instead.
//!
//! A pod's volume may be mounted over a directory after the agent watched it (a `medium:
//! Memory` emptyDir): the thread watches the mount table too, and a pod below which a mount
//! came or went is walked again.
//!
//! Parts:
//! - `reader`: the thread that reads both instances and the mount table and files each event
//!   in the queue.
//! - `mounts`: the mount table, and the pods below which a mount came or went.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
use rustix::io::Errno;
use tracing::warn;

use crate::handshake::fsqueue::FsQueue;
use crate::handshake::share::{EXIT_FILE, MARK_FILE};

/// Watches one pod may have: the kubelet's levels down to its exit directories (at most 4)
/// and one per container's exit directory; a pod with more containers than this is rare, and
/// served by polling.
pub const MAX_POD_WATCHES: usize = 40;
/// Watches the agent holds in all (root's `fs.inotify.max_user_watches` is shared with every
/// root process of the node: the kubelet, the runtime, root sidecars).
pub const MAX_WATCHES: usize = 8192;

/// What the watcher reports (for tests and the loop's own use).
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
    Init(#[source] std::io::Error),
    #[error("watch {path}: {source}")]
    Add {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The pod (or the agent as a whole) has all the watches it may: served by polling.
    #[error("watch {path}: {what} has {limit} watches already")]
    Budget {
        path: PathBuf,
        what: &'static str,
        limit: usize,
    },
}

/// A directory of pods whose changes are reported, and how deep below it a container's exit
/// directory is.
#[derive(Debug, Clone)]
pub struct Root {
    pub pods: PathBuf,
    pub container_depth: usize,
}

impl Root {
    /// How deep `path` is below this root, if it is.
    fn depth(&self, path: &Path) -> Option<usize> {
        Some(path.strip_prefix(&self.pods).ok()?.components().count())
    }
}

/// Which instance a watch is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Inst {
    /// The roots and the kubelet's levels.
    Kube,
    /// The levels a pod can change.
    Pods,
}

#[derive(Debug, Clone, Copy)]
struct Watch {
    inst: Inst,
    wd: i32,
    ino: u64,
    dev: u64,
}

/// What the reading thread needs.
struct Shared {
    kube: OwnedFd,
    pods: OwnedFd,
    wake: OwnedFd,
    /// Each watch descriptor's directory.
    table: Mutex<HashMap<(Inst, i32), PathBuf>>,
    queue: Arc<FsQueue>,
    roots: Vec<Root>,
}

pub struct ShareWatcher {
    shared: Option<Arc<Shared>>,
    roots: Vec<Root>,
    watched: HashMap<PathBuf, Watch>,
    /// Watches per pod directory.
    per_pod: HashMap<PathBuf, usize>,
    /// Why there is no inotify, when there is none.
    polling: Option<String>,
    /// Pods whose watches are not added: past their share, or polled for a while.
    held: BTreeSet<PathBuf>,
    /// Pods refused a watch since the loop last asked ([`Self::take_refused`]).
    refused: BTreeSet<PathBuf>,
}

fn table(shared: &Shared) -> std::sync::MutexGuard<'_, HashMap<(Inst, i32), PathBuf>> {
    shared.table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The root `path` is below, and the pod directory it belongs to (`None` for a root itself
/// or a path below none).
fn pod_dir_of<'r>(roots: &'r [Root], path: &Path) -> Option<(&'r Root, PathBuf)> {
    for root in roots {
        if let Ok(rel) = path.strip_prefix(&root.pods) {
            let first = rel.components().next()?;
            return Some((root, root.pods.join(first)));
        }
    }
    None
}

/// Whether a changed path can matter: a directory down to a container's exit directory, an
/// exit file or a mark. Whatever else a container makes in its directory is its own business;
/// dropping it on the watcher's thread keeps it off the loop.
fn worth_telling(roots: &[Root], path: &Path) -> bool {
    for root in roots {
        if let Some(depth) = root.depth(path) {
            let name = path.file_name();
            return depth <= root.container_depth
                || (depth == root.container_depth.saturating_add(1)
                    && (name == Some(std::ffi::OsStr::new(EXIT_FILE))
                        || name == Some(std::ffi::OsStr::new(MARK_FILE))));
        }
    }
    // Not below any: a root itself, moved or removed.
    true
}

/// Creations, removals, renames and finished writes: the agent's own reads and `fchmod`
/// produce none of these.
fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::EXCL_UNLINK
}

fn io_err(e: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

/// Whether an error means root's inotify instances or watches are used up.
fn exhausted(e: Errno) -> bool {
    matches!(e, Errno::MFILE | Errno::NFILE | Errno::NOMEM | Errno::NOSPC)
}

impl ShareWatcher {
    /// Reports the changes below `roots` that can matter into `queue`. Without an inotify
    /// instance to be had (root's limit reached) the watcher polls ([`Self::polling`]); any
    /// other failure is an error.
    pub fn new(queue: Arc<FsQueue>, roots: Vec<Root>) -> Result<Self, WatchError> {
        let init = || inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC);
        let instances = init().and_then(|kube| Ok((kube, init()?)));
        let (kube, pods) = match instances {
            Ok(i) => i,
            Err(e) if exhausted(e) => {
                let why = format!("no inotify instance can be had: {e}");
                warn!(
                    event = "inotify_unavailable",
                    error = %e,
                    "root's inotify instances are used up (fs.inotify.max_user_instances): exit directories are polled"
                );
                return Ok(ShareWatcher {
                    shared: None,
                    roots,
                    watched: HashMap::new(),
                    per_pod: HashMap::new(),
                    polling: Some(why),
                    held: BTreeSet::new(),
                    refused: BTreeSet::new(),
                });
            }
            Err(e) => return Err(WatchError::Init(io_err(e))),
        };
        let wake = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .map_err(|e| WatchError::Init(io_err(e)))?;
        let shared = Arc::new(Shared {
            kube,
            pods,
            wake,
            table: Mutex::new(HashMap::new()),
            queue,
            roots: roots.clone(),
        });
        let mounts = match mounts::MountTable::open(&roots) {
            Ok(m) => Some(m),
            Err(e) => {
                warn!(
                    event = "mount_table_unavailable",
                    error = %e,
                    "the mount table cannot be read (/proc/self/mountinfo): a medium: Memory emptyDir mounted after its directory was watched is seen only at the next walk of its pod"
                );
                None
            }
        };
        let theirs = shared.clone();
        std::thread::Builder::new()
            .name("inotify".to_owned())
            .spawn(move || {
                let _span = tracing::info_span!("inotify").entered();
                reader::read_events(&theirs, mounts);
            })
            .map_err(WatchError::Init)?;
        Ok(ShareWatcher {
            shared: Some(shared),
            roots,
            watched: HashMap::new(),
            per_pod: HashMap::new(),
            polling: None,
            held: BTreeSet::new(),
            refused: BTreeSet::new(),
        })
    }

    /// Why exit directories are polled instead of watched, if they are.
    pub fn polling(&self) -> Option<&str> {
        self.polling.as_deref()
    }

    /// Watches a root (idempotent): opened here without following a link.
    pub fn watch(&mut self, dir: &Path) -> Result<(), WatchError> {
        let fd = rustix::fs::open(
            dir,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| WatchError::Add {
            path: dir.to_owned(),
            source: io_err(e),
        })?;
        self.watch_at(dir, fd.as_fd())
    }

    /// Watches the directory `dir` is, as opened in `fd` by the caller (which checked it):
    /// that directory, whatever `dir` names by now. Idempotent while `dir` is that directory.
    pub fn watch_at(&mut self, dir: &Path, fd: BorrowedFd<'_>) -> Result<(), WatchError> {
        let Some(shared) = self.shared.clone() else {
            return Ok(());
        };
        let add_err = |e: Errno| WatchError::Add {
            path: dir.to_owned(),
            source: io_err(e),
        };
        let st = rustix::fs::fstat(fd).map_err(add_err)?;
        let (ino, dev) = (st.st_ino, st.st_dev);
        if let Some(w) = self.watched.get(dir).copied() {
            // Still the kernel's watch of this directory (an `IN_IGNORED` removes it from the
            // table: unmounted, say): nothing to do.
            let live = table(&shared)
                .get(&(w.inst, w.wd))
                .is_some_and(|p| p == dir);
            if live && w.ino == ino && w.dev == dev {
                return Ok(());
            }
            // Another directory under the same name now (the pod exchanged it): the old
            // watch goes.
            self.forget_one(dir);
        }
        // The levels from the exit directories' parent down are the pod's to change.
        let pod = pod_dir_of(&self.roots, dir).map(|(root, pod_dir)| {
            let pods_level = root.depth(dir).unwrap_or(0).saturating_add(1) >= root.container_depth;
            (pods_level, pod_dir)
        });
        let inst = match &pod {
            Some((true, _)) => Inst::Pods,
            _ => Inst::Kube,
        };
        if let Some((pods_level, pod_dir)) = &pod {
            if *pods_level && self.held.contains(pod_dir) {
                return Err(WatchError::Budget {
                    path: dir.to_owned(),
                    what: "its pod, polled for now,",
                    limit: 0,
                });
            }
            if self.per_pod.get(pod_dir).copied().unwrap_or(0) >= MAX_POD_WATCHES {
                if self.refused.len() < MAX_WATCHES {
                    self.refused.insert(pod_dir.clone());
                }
                return Err(WatchError::Budget {
                    path: dir.to_owned(),
                    what: "its pod",
                    limit: MAX_POD_WATCHES,
                });
            }
        }
        if self.watched.len() >= MAX_WATCHES {
            return Err(WatchError::Budget {
                path: dir.to_owned(),
                what: "the agent",
                limit: MAX_WATCHES,
            });
        }
        let instance = match inst {
            Inst::Kube => &shared.kube,
            Inst::Pods => &shared.pods,
        };
        let by_fd = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let wd = match inotify::add_watch(instance, by_fd.as_str(), mask()) {
            Ok(wd) => wd,
            // The node's watches used up (root's `fs.inotify.max_user_watches`): the pod is
            // polled, as one past its own share.
            Err(e) if exhausted(e) && pod.is_some() => {
                if let Some((_, pod_dir)) = &pod {
                    if self.refused.len() < MAX_WATCHES {
                        self.refused.insert(pod_dir.clone());
                    }
                }
                return Err(WatchError::Budget {
                    path: dir.to_owned(),
                    what: "the node (fs.inotify.max_user_watches)",
                    limit: self.watched.len(),
                });
            }
            // No /proc (a chroot): by name, the last component not followed.
            Err(Errno::NOENT) if !Path::new("/proc/self/fd").exists() => {
                inotify::add_watch(instance, dir, mask() | WatchFlags::DONT_FOLLOW)
                    .map_err(add_err)?
            }
            Err(e) => return Err(add_err(e)),
        };
        {
            let mut t = table(&shared);
            // The same directory under two names of the pod's (it moved it): the watch is
            // one; it is filed under the name seen last, and the other name watches anew.
            if let Some(old) = t.insert((inst, wd), dir.to_owned()) {
                if old != dir {
                    if let Some(w) = self.watched.remove(&old) {
                        debug_assert_eq!(w.wd, wd);
                        let p = pod_dir_of(&self.roots, &old).map(|(_, p)| p);
                        if let Some(p) = p {
                            self.drop_count(&p);
                        }
                    }
                }
            }
        }
        self.watched
            .insert(dir.to_owned(), Watch { inst, wd, ino, dev });
        if let Some((_, pod_dir)) = pod {
            let n = self.per_pod.entry(pod_dir).or_insert(0);
            *n = n.saturating_add(1);
        }
        Ok(())
    }

    fn drop_count(&mut self, pod_dir: &Path) {
        if let Some(n) = self.per_pod.get_mut(pod_dir) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_pod.remove(pod_dir);
            }
        }
    }

    fn forget_one(&mut self, path: &Path) {
        let Some(w) = self.watched.remove(path) else {
            return;
        };
        if let Some(shared) = &self.shared {
            let owner = {
                let mut t = table(shared);
                let mine = t.get(&(w.inst, w.wd)).is_some_and(|p| p == path);
                if mine {
                    t.remove(&(w.inst, w.wd));
                }
                mine
            };
            if owner {
                let instance = match w.inst {
                    Inst::Kube => &shared.kube,
                    Inst::Pods => &shared.pods,
                };
                // Gone already when the directory went (EINVAL): nothing to remove.
                let _ = inotify::remove_watch(instance, w.wd);
            }
        }
        let p = pod_dir_of(&self.roots, path).map(|(_, p)| p);
        if let Some(p) = p {
            self.drop_count(&p);
        }
    }

    /// Forgets every watch at or below `dir`.
    pub fn forget(&mut self, dir: &Path) {
        let gone: Vec<PathBuf> = self
            .watched
            .keys()
            .filter(|p| p.starts_with(dir))
            .cloned()
            .collect();
        for p in gone {
            self.forget_one(&p);
        }
    }

    /// Forgets the watches of the levels a pod can change below `pod_dir` (its exit
    /// directories and their parent), keeping the kubelet's: the pod is polled meanwhile.
    pub fn forget_pod_levels(&mut self, pod_dir: &Path) {
        let gone: Vec<PathBuf> = self
            .watched
            .iter()
            .filter(|(p, w)| p.starts_with(pod_dir) && w.inst == Inst::Pods)
            .map(|(p, _)| p.clone())
            .collect();
        for p in gone {
            self.forget_one(&p);
        }
    }

    /// Holds the levels a pod can change below `pod_dir` unwatched (their watches go): the
    /// pod is polled until [`Self::release`].
    pub fn hold(&mut self, pod_dir: &Path) {
        self.forget_pod_levels(pod_dir);
        self.held.insert(pod_dir.to_owned());
    }

    /// Watches may be added below `pod_dir` again.
    pub fn release(&mut self, pod_dir: &Path) {
        self.held.remove(pod_dir);
    }

    /// The pods refused a watch for want of their share since the last call.
    pub fn take_refused(&mut self) -> BTreeSet<PathBuf> {
        std::mem::take(&mut self.refused)
    }

    /// The kernel dropped this root's watch: forgotten here, to be watched anew.
    pub fn lost(&mut self, root: &Path) {
        if let Some(w) = self.watched.remove(root) {
            if let Some(shared) = &self.shared {
                table(shared).remove(&(w.inst, w.wd));
            }
        }
    }

    /// The names directly below `root` that have watches at or below them: the pods watched
    /// under a root of pod directories.
    pub fn watched_below(&self, root: &Path) -> BTreeSet<std::ffi::OsString> {
        self.watched
            .keys()
            .filter_map(|p| p.strip_prefix(root).ok()?.iter().next())
            .map(ToOwned::to_owned)
            .collect()
    }

    /// Whether `dir` is watched.
    pub fn is_watched(&self, dir: &Path) -> bool {
        self.watched.contains_key(dir)
    }

    /// Watches held on the pod whose directory is `pod_dir`.
    #[cfg(test)]
    pub(crate) fn pod_watches(&self, pod_dir: &Path) -> usize {
        self.per_pod.get(pod_dir).copied().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.watched.len()
    }

    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }
}

impl Drop for ShareWatcher {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            let _ = rustix::io::write(&shared.wake, &1u64.to_ne_bytes());
        }
    }
}

mod mounts;
mod reader;

#[cfg(test)]
mod tests;
