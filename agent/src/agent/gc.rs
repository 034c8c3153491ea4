//! Pod directories of pods the runtime no longer has are removed, and the share is rescanned
//! as a safety net for lost inotify events.
//!
//! Which directories go is decided in the decision loop (it owns the view of pods); taking
//! them apart happens on a blocking thread, a bounded number of entries per round, so a pod
//! that filled its directory with millions of files neither stalls the answers of other pods
//! nor costs memory per file. A round that ran out of budget is followed by another soon.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::agent::Agent;
use crate::handshake::share::{Budget, Removal, Share};
use crate::pod::PodUid;
use crate::stats::Stats;

/// Most directory entries one round takes apart, over every pod it removes.
pub const ROUND_ENTRIES: u64 = 50_000;
/// How soon a round follows one that ran out of budget.
pub const AGAIN_AFTER: Duration = Duration::from_secs(1);

/// A round of removals in flight on the blocking pool.
pub(super) type Round = JoinHandle<Report>;

/// What the removals keep between rounds.
#[derive(Default)]
pub(super) struct Removals {
    /// Pods a round found gone from the runtime: found gone again, their directory goes.
    suspects: HashSet<PodUid>,
    /// The round in flight, if any.
    pub(super) round: Option<Round>,
}

/// What a round did.
#[derive(Debug, Default)]
pub(super) struct Report {
    pub removed: Vec<PodUid>,
    /// Taken apart in part; still gone from the runtime, so the next round goes on.
    pub unfinished: Vec<PodUid>,
}

impl Agent {
    /// A pod's directory is removed only when two rounds in a row did not find the pod in the
    /// runtime, the directory is older than `gc_min_age`, and no container of it waits.
    /// Nothing is removed before the node view's first listing, or when the runtime lists no
    /// pods at all (a wrong socket must not empty the share), or while a round still runs.
    pub(super) fn gc(&mut self) {
        let mut dirty = BTreeSet::new();
        self.sync().rescan(&mut dirty);
        self.evaluate(dirty);
        self.waits.prune(Instant::now());
        self.hints.prune(Instant::now());
        // The budgets of pods whose directories are gone.
        self.budgets
            .retain(|dir| std::fs::symlink_metadata(dir).is_ok());
        self.stats.set_pods_polled(self.budgets.polled_count());
        self.forget_gone_pods();
        if self.removals.round.is_some()
            || !self.view.is_listed()
            || !self.link.ok()
            || self.view.pods().next().is_none()
        {
            return;
        }
        let pods = match self.share.pods() {
            Ok(p) => p,
            Err(e) => {
                self.stats.share_error();
                warn!(error = %e, "cannot list the share");
                return;
            }
        };
        let mut suspects = HashSet::new();
        let mut doomed = Vec::new();
        for pod in pods {
            if self.view.pod(&pod).is_some() || self.waits.pending.contains_key(&pod) {
                continue;
            }
            if !self.removals.suspects.contains(&pod) {
                suspects.insert(pod);
                continue;
            }
            let old_enough = self
                .share
                .pod_mtime(&pod)
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age >= self.cfg.gc_min_age);
            if old_enough {
                doomed.push(pod);
            } else {
                suspects.insert(pod);
            }
        }
        self.removals.suspects = suspects;
        for record in
            crate::jobs::stale_records(&self.cfg.share_dir, |uid| self.view.pod(uid).is_some())
        {
            if let Err(e) = std::fs::remove_file(&record) {
                warn!(file = %record.display(), error = %e, "cannot remove the Job record of a pod that is gone");
            }
        }
        if !doomed.is_empty() {
            self.removals.round = Some(start_round(
                Arc::clone(&self.share),
                doomed,
                Arc::clone(&self.stats),
            ));
        }
    }

    /// A round's end: the removed directories' watches go; the unfinished ones stay doomed
    /// (no second confirmation needed) for the round that follows soon.
    pub(super) fn gc_done(&mut self, report: Report) {
        for pod in &report.removed {
            self.watcher.forget(&self.share.pod_path(pod));
        }
        self.removals.suspects.extend(report.unfinished);
    }
}

/// Removes `pods` on the blocking pool, within one round's budget.
fn start_round(share: Arc<Share>, pods: Vec<PodUid>, stats: Arc<Stats>) -> Round {
    let span = tracing::info_span!("gc");
    tokio::task::spawn_blocking(move || {
        let _entered = span.enter();
        remove_within(&share, pods, Budget::new(ROUND_ENTRIES), &stats)
    })
}

fn remove_within(share: &Share, pods: Vec<PodUid>, mut budget: Budget, stats: &Stats) -> Report {
    let mut report = Report::default();
    for pod in pods {
        if budget.left() == 0 {
            report.unfinished.push(pod);
            continue;
        }
        match share.remove_pod(&pod, &mut budget) {
            Ok(Removal::Removed) => {
                info!(pod = %pod, "removed directory of a pod the runtime no longer has");
                report.removed.push(pod);
            }
            Ok(Removal::Unfinished) => {
                info!(pod = %pod, limit = ROUND_ENTRIES, "removing the directory of a pod the runtime no longer has: more entries than a round takes; going on in the next");
                report.unfinished.push(pod);
            }
            Ok(Removal::Waiting) => {}
            Err(e) => {
                stats.share_error();
                warn!(pod = %pod, error = %e, "cannot remove pod directory");
            }
        }
    }
    report
}
