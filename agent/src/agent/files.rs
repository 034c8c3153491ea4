//! The loop's side of the file watcher: a few pods' changes per round, a pod that floods its
//! exit directories polled for a while, and the roots watched again when the kernel drops
//! them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tracing::{info, warn};

use super::Agent;
use crate::handshake::budget::{Spent, POLL_NAMES};
use crate::handshake::share::{Place, ShareEntry};
use crate::handshake::watch::FsEvent;
use crate::pod::PodUid;

/// Pods whose changes one round of the loop takes: between two rounds every other source
/// (shutdown first) is looked at.
pub(super) const PODS_PER_ROUND: usize = 32;

impl Agent {
    /// One round of file changes; `true` when more wait.
    pub(super) fn on_files(&mut self, dirty: &mut BTreeSet<PodUid>) -> bool {
        let batch = self.fs.take(PODS_PER_ROUND);
        for e in batch.errors {
            self.sync().on_event(FsEvent::Error(e), dirty);
        }
        let mut rescan = batch.rescan;
        for root in &batch.lost {
            self.watcher.lost(root);
            warn!(event = "watch_lost", dir = %root.display(), "the kernel dropped the watch of a directory of pods; watching it again");
            rescan = true;
        }
        if !batch.lost.is_empty() {
            self.watch_roots();
        }
        if !batch.other.is_empty() {
            self.sync().on_event(FsEvent::Changed(batch.other), dirty);
        }
        let now = Instant::now();
        for changes in batch.pods {
            if self.budgets.is_polled(&changes.pod_dir) {
                // Its exit files are read on the polling timer; what it does meanwhile is
                // its own business.
                continue;
            }
            if self.budgets.charge(&changes.pod_dir, changes.events, now) {
                self.hold_pod(&changes.pod_dir, Spent::Events, now);
                continue;
            }
            let paths = changes
                .paths
                .unwrap_or_else(|| vec![changes.pod_dir.clone()]);
            self.sync().on_event(FsEvent::Changed(paths), dirty);
        }
        self.hold_refused(now);
        if rescan {
            self.sync().on_event(FsEvent::Rescan, dirty);
        }
        self.check_share(dirty);
        self.stats.set_inotify_watches(self.watcher.len());
        batch.more
    }

    /// Polls the pods refused a watch for want of their share.
    fn hold_refused(&mut self, now: Instant) {
        for pod_dir in self.watcher.take_refused() {
            self.hold_pod(&pod_dir, Spent::Watches, now);
        }
    }

    /// Watches the roots the watcher does not (the kernel dropped one).
    fn watch_roots(&mut self) {
        for share in self.places() {
            let root = share.pods_path();
            if self.watcher.is_watched(&root) {
                continue;
            }
            if let Err(e) = self.watcher.watch(&root) {
                self.stats.share_error();
                warn!(dir = %root.display(), error = %e, "cannot watch a directory of pods again; it is rescanned on each reconcile");
            }
        }
    }

    /// The pod of `pod_dir`: where its exit directories are, and its UID.
    fn pod_of_dir(&self, pod_dir: &Path) -> Option<(Place, PodUid)> {
        self.places()
            .iter()
            .find_map(|share| match share.classify(pod_dir) {
                Ok(Some(ShareEntry::Pod(uid))) => Some((share.place(), uid)),
                _ => None,
            })
    }

    /// Polls the pod of `pod_dir`, which spent its budget (`why`), for a while: its
    /// watches go, it is told so, and only it waits longer for its answers.
    fn hold_pod(&mut self, pod_dir: &Path, why: Spent, now: Instant) {
        if !self.budgets.poll(pod_dir, why, now) {
            return;
        }
        self.watcher.hold(pod_dir);
        self.stats.pod_budget_spent(why);
        self.stats.set_pods_polled(self.budgets.polled_count());
        let pod = self.pod_of_dir(pod_dir);
        let uid = pod.as_ref().map(|(_, u)| u.to_string()).unwrap_or_default();
        warn!(
            event = "pod_budget_spent",
            pod = %uid,
            dir = %pod_dir.display(),
            what = why.as_str(),
            "a pod's exit directories spent their budget of file {}: polled for a while (its own waits are answered up to {:?} later)",
            why.as_str(),
            crate::handshake::budget::POLL_EVERY,
        );
        let (Some(events), Some(pod)) = (
            self.api.events.as_ref(),
            pod.and_then(|(_, uid)| self.pod_ref(&uid)),
        ) else {
            return;
        };
        events.emit(crate::cluster::recorder::FloodNotice {
            pod,
            note: format!(
                "the pod's exit directories spent their budget of file {} (a container \
                 changing them without end?): exitorder reads them every {} ms for a while \
                 instead of watching them; the pod's sidecars are still let go in order",
                why.as_str(),
                crate::handshake::budget::POLL_EVERY.as_millis()
            ),
            at: std::time::SystemTime::now(),
        });
    }

    /// The polling round: each polled pod's exit files read by its containers' names, and
    /// the pods whose hold ended watched again.
    pub(super) fn poll_held(&mut self, dirty: &mut BTreeSet<PodUid>) {
        if self.watcher.polling().is_some() {
            // No inotify at all: every place is walked each round.
            self.sync().rescan(dirty);
            return;
        }
        let now = Instant::now();
        for pod_dir in self.budgets.release_due(now) {
            self.watcher.release(&pod_dir);
            info!(dir = %pod_dir.display(), "a polled pod's exit directories are watched again");
            self.sync()
                .on_event(FsEvent::Changed(vec![pod_dir.clone()]), dirty);
        }
        // Watched again and past its share again: polled again at once.
        self.hold_refused(now);
        let polled: Vec<PathBuf> = self.budgets.polled().map(|(d, _)| d.clone()).collect();
        for pod_dir in polled {
            let Some((place, uid)) = self.pod_of_dir(&pod_dir) else {
                continue;
            };
            // Its containers' names in the runtime first: a real sidecar's wait is found in
            // the first round. Then a window of what else the pod made, a different one each
            // round, so every directory is looked at in time however many there are.
            let mut names: Vec<String> = self
                .view
                .pod(&uid)
                .map(|v| v.containers.values().map(|c| c.info.name.clone()).collect())
                .unwrap_or_default();
            let made = self
                .place(place)
                .and_then(|share| share.containers_in(&uid).ok())
                .unwrap_or_default();
            if !made.is_empty() {
                let cursor = self.budgets.polled_mut(&pod_dir).map_or(0, |p| {
                    let at = p.cursor;
                    p.cursor = p.cursor.wrapping_add(POLL_NAMES);
                    at
                });
                names.extend(
                    made.iter()
                        .cycle()
                        .skip(cursor.checked_rem(made.len()).unwrap_or(0))
                        .take(POLL_NAMES.min(made.len()))
                        .map(|k| k.container.as_str().to_owned()),
                );
            }
            self.sync().poll_pod(place, &uid, &names, dirty);
        }
        self.stats.set_pods_polled(self.budgets.polled_count());
    }

    /// Whether anything is polled: the timer runs only then.
    pub(super) fn polling_files(&self) -> bool {
        self.budgets.polled_count() > 0 || self.watcher.polling().is_some()
    }
}
