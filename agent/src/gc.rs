//! Pod directories of pods the runtime no longer has are removed, and the share is rescanned
//! as a safety net for lost inotify events.

use std::collections::{BTreeSet, HashSet};
use std::time::{Instant, SystemTime};

use tracing::{info, warn};

use crate::agent::Agent;

impl Agent {
    /// A pod's directory is removed only when two rounds in a row did not find the pod in the
    /// runtime, the directory is older than `gc_min_age`, and no container of it waits.
    /// Nothing is removed before the node view's first listing, or when the runtime lists no
    /// pods at all (a wrong socket must not empty the share).
    pub(crate) fn gc(&mut self) {
        let mut dirty = BTreeSet::new();
        self.sync().rescan(&mut dirty);
        self.evaluate(dirty);
        self.waits.prune(Instant::now());
        // What was warned about pods that are gone may be warned about again, once.
        let pending: HashSet<_> = self.waits.pending.keys().cloned().collect();
        self.warned.retain(|(p, _)| pending.contains(p));
        if !self.view.is_listed() || !self.runtime_ok || self.view.pods().next().is_none() {
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
        for pod in pods {
            if self.view.pod(pod.as_str()).is_some() || self.waits.pending.contains_key(&pod) {
                continue;
            }
            if !self.gc_suspects.contains(&pod) {
                suspects.insert(pod);
                continue;
            }
            let old_enough = self
                .share
                .pod_mtime(&pod)
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age >= self.cfg.gc_min_age);
            if !old_enough {
                suspects.insert(pod);
                continue;
            }
            match self.share.remove_pod(&pod) {
                Ok(true) => {
                    self.watcher.forget(&self.share.pod_path(&pod));
                    info!(pod = %pod, "removed directory of a pod the runtime no longer has");
                }
                Ok(false) => {}
                Err(e) => {
                    self.stats.share_error();
                    warn!(pod = %pod, error = %e, "cannot remove pod directory");
                }
            }
        }
        self.gc_suspects = suspects;
        for record in
            crate::jobs::stale_records(&self.cfg.share_dir, |uid| self.view.pod(uid).is_some())
        {
            if let Err(e) = std::fs::remove_file(&record) {
                warn!(file = %record.display(), error = %e, "cannot remove the Job record of a pod that is gone");
            }
        }
    }
}
