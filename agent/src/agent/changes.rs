//! What the runtime tells the loop, applied to the node view: its exit and start events, its
//! replies to the reader's reads, and the pods' names they give.

use std::collections::BTreeSet;
use std::time::Instant;

use tracing::{debug, info, warn};

use super::Agent;
use crate::decide::RunState;
use crate::pod::PodUid;
use crate::runtime::reader::{Read, Reply};
use crate::runtime::source::SourceSignal;
use crate::stats::Kept;
use crate::view::{Change, Need};

impl Agent {
    pub(super) fn on_signal(&mut self, sig: SourceSignal, dirty: &mut BTreeSet<PodUid>) {
        match sig {
            SourceSignal::Change(change) => self.apply_change(change, dirty),
            // What happened while the stream was not there is listed.
            SourceSignal::Connected(kind) => self.link.source(kind, true, &self.stats),
            SourceSignal::Down(kind) => self.link.source(kind, false, &self.stats),
        }
    }

    /// Gives the view container `id`'s pod cgroup, once the kernel source found it and the
    /// view knows the container (either may come first).
    pub(super) fn learn_pod_cgroup(&mut self, id: &str) {
        if let Some(dir) = self.kernel.pod_dir(id) {
            self.view.set_pod_cgroup(id, dir.to_path_buf());
        }
    }

    pub(super) fn on_reply(&mut self, reply: Reply, dirty: &mut BTreeSet<PodUid>) {
        match reply {
            Reply::Change(change) => self.apply_change(change, dirty),
            Reply::PodChecked(pod) => {
                if let Some(p) = self.waits.pending.get_mut(&pod) {
                    p.checking = false;
                    p.checked = true;
                    dirty.insert(pod);
                }
            }
            Reply::Failed { read, error } => {
                self.stats.runtime_error(error.kind());
                match &read {
                    Read::Need(Need::Describe(id)) => {
                        if self.warned.first_read(id) {
                            warn!(container_id = %id, error = %error, "cannot read container; its exit priority stays unknown and its pod's waits ordered, retrying");
                        }
                    }
                    Read::ListPod(uid) => {
                        // Asked again as the pod is decided again, now: while the runtime
                        // answers (a busy one timed out), nothing else may come to decide it.
                        if let Some(p) = self.waits.pending.get_mut(uid) {
                            p.checking = false;
                            dirty.insert(uid.clone());
                        }
                        warn!(pod = %uid, error = %error, "cannot list pod");
                    }
                    Read::List => warn!(error = %error, "cannot list the runtime's containers"),
                    // The runtime's events still tell this container's exit.
                    Read::Pid(id) => {
                        debug!(container_id = %id, error = %error, "cannot read the container's process")
                    }
                    Read::Need(Need::Sandbox(uid)) => {
                        warn!(pod = %uid, error = %error, "cannot read the pod's sandbox; its waits stay ordered, retrying");
                    }
                }
            }
            Reply::Process { id, pid } => {
                self.kernel.watch(&id, pid);
                self.learn_pod_cgroup(&id);
            }
            Reply::Mounts(check) => {
                self.audit.push(check);
                self.audit.start(self.places());
            }
            Reply::Health(ok) => {
                self.link.health(ok, &self.stats);
                dirty.extend(self.waits.pending.keys().cloned());
            }
        }
    }

    /// Applies a change to the node view; the pending pods it touched are decided again.
    pub(super) fn apply_change(&mut self, change: Change, dirty: &mut BTreeSet<PodUid>) {
        match &change {
            Change::Exited { id } | Change::Removed { id } | Change::ProcessGone { id, .. } => {
                // The runtime's word first on a running container: whether its pidfd was
                // awaited (the kernel's thread was later) or not (an exit it could not tell).
                if matches!(change, Change::Exited { .. })
                    && self.view.state_of(id) == Some(RunState::Running)
                {
                    debug!(
                        event = "exit_told_by_runtime",
                        container_id = %id,
                        pidfd_held = self.kernel.watches(id),
                        "the runtime told an exit first"
                    );
                }
                self.kernel.forget(id)
            }
            // Described while only created, it had no process: read it now that it runs
            // (a container the view does not know yet is described with its process).
            Change::Started { id } if self.kernel.wants(id) && self.view.knows(id) => {
                self.link.ask(Read::Pid(id.clone()));
            }
            _ => {}
        }
        // Described before it was started (no process yet), while its start event came
        // meanwhile: that event found it not known yet, so its process is read now.
        let pid_due = match &change {
            Change::Described { info, .. }
                if info.state == RunState::Created && self.kernel.wants(&info.id) =>
            {
                Some(info.id.clone())
            }
            _ => None,
        };
        let listing = matches!(change, Change::Listed(_));
        // Its process may have been awaited (and its pod's cgroup found) before the view
        // knew the container: the description brings the two together.
        let described = match &change {
            Change::Described { info, .. } => Some(info.id.clone()),
            _ => None,
        };
        let undescribed = self.view.undescribed();
        let touched = self.view.apply(change, Instant::now());
        if let Some(id) = described {
            self.learn_pod_cgroup(&id);
        }
        if let Some(id) = pid_due {
            if self.view.state_of(&id) == Some(RunState::Running) {
                self.link.ask(Read::Pid(id));
            }
        }
        self.stats
            .set_view_size(self.view.container_count(), self.view.pod_count());
        self.stats
            .set_kept(Kept::ViewTombstones, self.view.tombstones());
        if listing {
            if self.link.listed(&self.stats) {
                info!(
                    event = "relisted",
                    containers = self.view.container_count(),
                    pods = self.view.pod_count(),
                    pending = self.pending_count(),
                    "runtime listed again after a reconnect"
                );
            }
            dirty.extend(self.waits.pending.keys().cloned());
            self.job_check_all();
            return;
        }
        for uid in &touched {
            self.job_check(uid);
        }
        for pod in touched {
            if self.waits.pending.contains_key(&pod) {
                dirty.insert(pod);
            }
        }
        // A container read (or gone) may have been what any pending pod was held for: the
        // answer touches no pod when it was a sandbox, and those pods must be decided again.
        if self.view.undescribed() < undescribed {
            dirty.extend(self.waits.pending.keys().cloned());
        }
    }

    /// A pod's namespace and name, as its sandbox tells them.
    pub(super) fn pod_ref(&self, uid: &PodUid) -> Option<crate::cluster::recorder::PodRef> {
        let s = self.view.pod(uid)?.sandbox.as_ref()?;
        Some(crate::cluster::recorder::PodRef {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            uid: uid.clone(),
        })
    }
}
