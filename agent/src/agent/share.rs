//! The share and the kubelet's directory of pods as the loop holds them: opened at start with
//! the entrypoint installed, opened again when replaced under the agent; and what a breach
//! of its exit directories found by the mount audit is told as.

use std::collections::BTreeSet;
use std::sync::Arc;

use tracing::{error, info, warn};

use super::{Agent, AgentError};
use crate::cluster::recorder::{BreachNotice, EventSink, PodRef};
use crate::handshake::breach::{Breach, Reached};
use crate::handshake::share::{Place, Share};
use crate::pod::PodUid;
use crate::stats::Stats;

impl Agent {
    /// Opens the share again when its directories were replaced under the agent (removed
    /// and created again by an operator or a node cleanup): the kubelet creates new pods'
    /// directories in the new one, which the old watches and handles never see. The
    /// entrypoint is installed again, as `bin/` went with it.
    pub(super) fn check_share(&mut self, dirty: &mut BTreeSet<PodUid>) {
        if self.share.is_current() {
            return;
        }
        let share = match Share::open(&self.cfg.share_dir) {
            Ok(s) => s,
            Err(e) => {
                self.stats.share_error();
                self.stats.set_watching(false);
                if crate::handshake::share::is_removed(&self.cfg.share_dir) {
                    error!(event = "share_lost", error = %e, "the share's root was removed under the agent");
                    self.fatal = Some(AgentError::ShareRootRemoved {
                        path: self.cfg.share_dir.clone(),
                    });
                    return;
                }
                warn!(event = "share_lost", error = %e, "the share was replaced and cannot be opened again; trying on the next change or reconcile");
                return;
            }
        };
        self.watcher.forget(self.share.root());
        if let Err(e) = self.watcher.watch(&share.pods_path()) {
            self.stats.share_error();
            self.stats.set_watching(false);
            warn!(event = "share_lost", error = %e, "cannot watch the new share; trying on the next change or reconcile");
            return;
        }
        self.share = Arc::new(share);
        self.sync().rescan(dirty);
        dirty.extend(self.waits.pending.keys().cloned());
        self.stats.set_watching(true);
        warn!(
            event = "share_reopened",
            share = %self.cfg.share_dir.display(),
            pending = self.pending_count(),
            "the share was replaced under the agent; watching the new one"
        );
    }

    /// Where the exit directories of `place` are, when the agent serves it.
    pub(super) fn place(&self, place: Place) -> Option<&Share> {
        match place {
            Place::Share => Some(&self.share),
            Place::PodLocal => self.local.as_deref(),
        }
    }

    /// The places of exit directories the agent serves.
    pub(super) fn places(&self) -> Vec<Arc<Share>> {
        std::iter::once(self.share.clone())
            .chain(self.local.clone())
            .collect()
    }
}

/// Installs the entrypoint after checking it can run in sidecar images: only a static
/// binary for this node's architecture does; anything else would fail in every preStop hook,
/// silently leaving pods unordered. It is refused, and the agent stays not ready.
pub(super) fn install_entrypoint(
    bin_dir: &std::path::Path,
    src: &std::path::Path,
    stats: &Stats,
) -> Result<(), AgentError> {
    match crate::handshake::elf::check_static_executable(src) {
        Ok(()) => {
            let dst = crate::handshake::bindir::install(bin_dir, src).map_err(|source| {
                AgentError::Install {
                    path: src.to_owned(),
                    source,
                }
            })?;
            info!(from = %src.display(), to = %dst.display(), "entrypoint installed");
        }
        Err(e) => {
            let why = format!(
                "entrypoint {} refused: {e}; sidecar images need a static build: \
                 scripts/static entrypoint (`cargo rustc -p exitorder-entrypoint --release \
                 --bin exitorder-entrypoint -- -C target-feature=+crt-static -C \
                 panic=abort`), as the exitorder image has it, given with --entrypoint-binary",
                src.display()
            );
            error!(event = "entrypoint_refused", file = %src.display(), problem = %e, "{why}");
            stats.refuse_entrypoint(why);
        }
    }
    Ok(())
}

/// The kubelet's directory of pods under `root`, for pod-local handshakes. Without one (a
/// wrong `--kubelet-root-dir`, or a host that runs no kubelet) only the share is served,
/// and the log says why.
pub(super) fn open_local(root: &std::path::Path) -> Option<Share> {
    match Share::open_kubelet(root) {
        Ok(s) => {
            info!(dir = %s.pods_path().display(), "serving pod-local exit directories");
            Some(s)
        }
        Err(e) => {
            warn!(error = %e, "pod-local exit directories are not served: the kubelet's directory of pods cannot be opened (set --kubelet-root-dir to the kubelet's --root-dir)");
            None
        }
    }
}

/// Tells of a breach: the log, the metric, and an Event on the intruder's pod and on the pod it
/// reaches (when the pods are known: `pod_ref` from the view's sandboxes).
pub(super) fn report_breach(
    b: &Breach,
    pod_ref: impl Fn(&PodUid) -> Option<PodRef>,
    events: Option<&EventSink>,
    stats: &Stats,
) {
    stats.share_breach();
    tracing::warn!(
        event = "share_breach",
        pod = %b.pod_uid,
        container = %b.container,
        host_path = %b.host_path,
        reached = %b.reached,
        "a container can write in exit directories that are not its own pod's; reported, and the waits there go on being answered in order (admit the share only as the webhook injects it: its guard)"
    );
    let Some(events) = events else { return };
    let at = std::time::SystemTime::now();
    let intruder = pod_ref(&b.pod_uid);
    if let Some(pod) = &intruder {
        events.emit(BreachNotice {
            pod: pod.clone(),
            container: b.container.clone(),
            note: format!(
                "container {} can write in {} through its mount of {}: it could let other \
                 pods' sidecars leave early; mount only the container's own exit directory",
                b.container, b.reached, b.host_path
            ),
            at,
        });
    }
    let Some(victim) = b.reached.pod().and_then(&pod_ref) else {
        return;
    };
    let who = intruder.map_or_else(
        || format!("pod {}", b.pod_uid),
        |p| format!("pod {}/{}", p.namespace, p.name),
    );
    let container = match &b.reached {
        Reached::Container(_, _, name) => name.clone(),
        _ => String::new(),
    };
    events.emit(BreachNotice {
        pod: victim,
        container,
        note: format!(
            "container {} of {who} can write in this pod's exit directories ({}): it could let \
             this pod's sidecars leave before the containers they serve",
            b.container, b.host_path
        ),
        at,
    });
}
