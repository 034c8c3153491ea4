//! What the file watcher tells the decision loop: changed paths, coalesced per pod and
//! bounded, served round-robin.
//!
//! Everything in a pod's exit directories belongs to that pod's containers, and they can
//! change it as fast as a CPU allows. An unbounded channel of events would let one pod grow
//! the agent's memory without end and keep the loop busy with its events alone. Here:
//! - a path changed any number of times before the loop looks is one entry;
//! - each pod has a bucket of at most [`MAX_POD_PATHS`] paths; past it the bucket only says
//!   "look at the whole pod again" (one bounded walk of it);
//! - at most [`MAX_PODS`] pods wait at once; past it the queue says "rescan";
//! - the loop takes a few pods at a time ([`FsQueue::take`]), oldest first, and a pod that
//!   changes again goes to the back: one pod's churn cannot starve another's decision.
//!
//! The kernel's own queue is bounded as well (`fs.inotify.max_queued_events`); its overflow
//! is a rescan too.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

/// Distinct paths kept for one pod before its bucket turns into "walk the pod".
pub const MAX_POD_PATHS: usize = 64;
/// Pods with changes waiting at once before the queue turns into "rescan".
pub const MAX_PODS: usize = 4096;
/// Paths outside any pod (the roots themselves) kept at once.
const MAX_OTHER: usize = 64;

/// One pod's changes, as the loop takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodChanges {
    /// The pod's directory.
    pub pod_dir: PathBuf,
    /// The paths that changed; `None`: too many, walk the whole pod.
    pub paths: Option<Vec<PathBuf>>,
    /// How many events came for this pod since it was last taken (saturating).
    pub events: u64,
}

/// What the loop takes in one round.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Events were lost (the kernel's queue overflowed, or too many pods at once).
    pub rescan: bool,
    /// Watches of roots the kernel dropped (the directory went, or was unmounted).
    pub lost: Vec<PathBuf>,
    /// Changed paths outside any pod.
    pub other: Vec<PathBuf>,
    pub pods: Vec<PodChanges>,
    /// Errors the watcher met (at most one of a kind is kept).
    pub errors: Vec<String>,
    /// More pods wait than this round took.
    pub more: bool,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        !self.rescan
            && self.lost.is_empty()
            && self.other.is_empty()
            && self.pods.is_empty()
            && self.errors.is_empty()
    }
}

#[derive(Default)]
struct Bucket {
    paths: BTreeSet<PathBuf>,
    overflowed: bool,
    events: u64,
}

#[derive(Default)]
struct Inner {
    order: VecDeque<PathBuf>,
    buckets: HashMap<PathBuf, Bucket>,
    other: BTreeSet<PathBuf>,
    lost: BTreeSet<PathBuf>,
    errors: BTreeSet<String>,
    rescan: bool,
}

/// The bounded, coalescing queue between the watcher's thread and the decision loop.
#[derive(Default)]
pub struct FsQueue {
    inner: Mutex<Inner>,
    ready: Notify,
}

impl FsQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `path` changed; `pod_dir` is the pod it belongs to (`None`: a root itself).
    pub fn push(&self, pod_dir: Option<&Path>, path: PathBuf) {
        {
            let mut q = self.lock();
            match pod_dir {
                None => {
                    if q.other.len() < MAX_OTHER {
                        q.other.insert(path);
                    } else {
                        q.rescan = true;
                    }
                }
                Some(dir) => {
                    if !q.buckets.contains_key(dir) {
                        if q.buckets.len() >= MAX_PODS {
                            q.rescan = true;
                            drop(q);
                            self.ready.notify_one();
                            return;
                        }
                        q.order.push_back(dir.to_owned());
                    }
                    let b = q.buckets.entry(dir.to_owned()).or_default();
                    b.events = b.events.saturating_add(1);
                    if !b.overflowed {
                        if b.paths.len() < MAX_POD_PATHS || b.paths.contains(&path) {
                            b.paths.insert(path);
                        } else {
                            b.overflowed = true;
                            b.paths.clear();
                        }
                    }
                }
            }
        }
        self.ready.notify_one();
    }

    /// Events were lost: everything must be looked at again.
    pub fn rescan(&self) {
        self.lock().rescan = true;
        self.ready.notify_one();
    }

    /// The kernel dropped the watch of `root`.
    pub fn lost(&self, root: PathBuf) {
        self.lock().lost.insert(root);
        self.ready.notify_one();
    }

    /// The watcher met an error.
    pub fn error(&self, e: String) {
        {
            let mut q = self.lock();
            if q.errors.len() < 8 {
                q.errors.insert(e);
            }
        }
        self.ready.notify_one();
    }

    /// Whether changes of the pod named `uid` (a pod directory of that name, in any place)
    /// are queued, or a rescan is: what the loop has not read of that pod yet.
    pub fn holds_pod(&self, uid: &str) -> bool {
        let q = self.lock();
        q.rescan
            || q.buckets.keys().any(|dir| {
                dir.file_name()
                    .is_some_and(|n| n == std::ffi::OsStr::new(uid))
            })
    }

    /// Waits until something is queued (returns at once if something is).
    pub async fn ready(&self) {
        if !self.is_empty() {
            return;
        }
        self.ready.notified().await;
    }

    pub fn is_empty(&self) -> bool {
        let q = self.lock();
        q.order.is_empty()
            && q.other.is_empty()
            && q.lost.is_empty()
            && q.errors.is_empty()
            && !q.rescan
    }

    /// Takes at most `max_pods` pods' changes (the oldest first), and everything else queued.
    pub fn take(&self, max_pods: usize) -> Batch {
        let mut q = self.lock();
        let mut pods = Vec::new();
        while pods.len() < max_pods {
            let Some(dir) = q.order.pop_front() else {
                break;
            };
            if let Some(b) = q.buckets.remove(&dir) {
                pods.push(PodChanges {
                    pod_dir: dir,
                    paths: (!b.overflowed).then(|| b.paths.into_iter().collect()),
                    events: b.events,
                });
            }
        }
        Batch {
            rescan: std::mem::take(&mut q.rescan),
            lost: std::mem::take(&mut q.lost).into_iter().collect(),
            other: std::mem::take(&mut q.other).into_iter().collect(),
            errors: std::mem::take(&mut q.errors).into_iter().collect(),
            more: !q.order.is_empty(),
            pods,
        }
    }

    /// Pods with changes waiting.
    #[cfg(test)]
    pub(crate) fn pods_waiting(&self) -> usize {
        self.lock().order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn a_path_changed_a_million_times_is_one_entry() {
        let q = FsQueue::default();
        for _ in 0..1_000_000 {
            q.push(Some(Path::new("/pods/a")), p("/pods/a/proxy/exit"));
        }
        let b = q.take(8);
        assert_eq!(
            b.pods,
            [PodChanges {
                pod_dir: p("/pods/a"),
                paths: Some(vec![p("/pods/a/proxy/exit")]),
                events: 1_000_000,
            }]
        );
        assert!(!b.more && q.is_empty());
    }

    #[test]
    fn too_many_paths_of_one_pod_become_one_walk_of_it() {
        let q = FsQueue::default();
        for i in 0..100_000 {
            q.push(Some(Path::new("/pods/a")), p(&format!("/pods/a/d{i}")));
        }
        let b = q.take(8);
        assert_eq!(b.pods.len(), 1);
        assert_eq!(b.pods[0].paths, None);
        assert_eq!(b.pods[0].events, 100_000);
    }

    #[test]
    fn a_pod_that_changes_again_goes_behind_the_others() {
        let q = FsQueue::default();
        q.push(Some(Path::new("/pods/hostile")), p("/pods/hostile/x/exit"));
        q.push(
            Some(Path::new("/pods/victim")),
            p("/pods/victim/proxy/exit"),
        );
        let first = q.take(1);
        assert_eq!(first.pods[0].pod_dir, p("/pods/hostile"));
        assert!(first.more);
        // The hostile pod at once again: the victim is served first.
        q.push(Some(Path::new("/pods/hostile")), p("/pods/hostile/x/exit"));
        assert_eq!(q.take(1).pods[0].pod_dir, p("/pods/victim"));
        assert_eq!(q.take(1).pods[0].pod_dir, p("/pods/hostile"));
        assert!(q.is_empty());
    }

    #[test]
    fn too_many_pods_at_once_is_a_rescan_and_memory_stays_bounded() {
        let q = FsQueue::default();
        for i in 0..(MAX_PODS + 100) {
            q.push(
                Some(Path::new(&format!("/pods/{i}"))),
                p(&format!("/pods/{i}/c")),
            );
        }
        assert_eq!(q.pods_waiting(), MAX_PODS);
        let b = q.take(usize::MAX);
        assert!(b.rescan);
        assert_eq!(b.pods.len(), MAX_PODS);
    }

    #[tokio::test]
    async fn ready_returns_when_something_is_queued() {
        let q = std::sync::Arc::new(FsQueue::default());
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.ready().await }
        });
        q.lost(p("/pods"));
        tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(q.take(1).lost, [p("/pods")]);
    }
}
