//! The pod's tasks telling the API server what the kubelet tells it (see [`super::api`]):
//! nothing without a sink; with one, each report is also in the pod's timeline.

use std::time::SystemTime;

use super::api::{ApiStatus, EventType, KubeletEvent, PodRef};
use super::plan::Kind;
use super::{Phase, PodCtx, What};

impl PodCtx {
    fn pod_ref(&self) -> PodRef {
        PodRef {
            uid: self.plan.uid.clone(),
            namespace: self.plan.namespace.clone(),
            name: self.plan.name.clone(),
        }
    }

    /// `fieldpath.ExtractContainerFieldPath`: where in the pod's spec the container is.
    fn field_path(&self, container: &str) -> String {
        match self.plan.container(container).map(|c| c.kind) {
            Some(Kind::Init | Kind::Sidecar) => format!("spec.initContainers{{{container}}}"),
            _ => format!("spec.containers{{{container}}}"),
        }
    }

    /// Records an Event about the pod (`container: None`) or one of its containers, as the
    /// kubelet's recorder does (`Eventf` on the pod, `recordContainerEvent` on a container).
    pub(super) fn report_event(
        &self,
        container: Option<&str>,
        reason: &str,
        kind: EventType,
        message: String,
    ) {
        let Some(sink) = &self.api else {
            return;
        };
        self.record(
            container,
            What::ApiEvent {
                reason: reason.to_owned(),
                message: message.clone(),
            },
        );
        let event = KubeletEvent {
            reason: reason.to_owned(),
            kind,
            message,
            field_path: container.map(|c| self.field_path(c)),
            at: SystemTime::now(),
        };
        sink.event(&self.pod_ref(), &event);
    }

    /// Reports `status` as the pod's (the status manager's sync); in the timeline when its
    /// phase or reason changed.
    pub(super) fn set_api_status(&self, status: ApiStatus) {
        let Some(sink) = &self.api else {
            return;
        };
        let changed = {
            let mut last = match self.api_status.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            let changed = last.phase != status.phase || last.reason != status.reason;
            *last = status.clone();
            changed
        };
        if changed {
            self.record(
                None,
                What::ApiStatus {
                    phase: status.phase.clone(),
                    reason: status.reason.clone(),
                },
            );
        }
        sink.status(&self.pod_ref(), &status);
    }

    /// Reports the pod's status again, unchanged in phase: what the status manager writes
    /// when a container's state changed. During a kill the phase stays what it was:
    /// `status_manager.go` `mergePodStatus` withholds a terminal phase "unless the pod is
    /// actually terminal".
    pub(super) fn report_status(&self) {
        if self.api.is_none() {
            return;
        }
        let last = match self.api_status.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        self.set_api_status(last);
    }

    /// The API phase follows the runner's, but for its own `Terminating` and `Deleted`: the
    /// kubelet keeps the phase it had while it kills, and the API object of a deleted pod is
    /// the test's to write.
    pub(super) fn phase_reported(&self, phase: Phase) {
        let api = match phase {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Terminating | Phase::Deleted => return,
        };
        self.set_api_status(ApiStatus::phase(api));
    }

    /// Graceful node shutdown began (the Node's Ready condition), written `after` from now,
    /// while the kill goes on.
    pub(super) fn report_node_shutting_down_after(&self, after: std::time::Duration) {
        if let Some(sink) = self.api.clone() {
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                sink.node_shutting_down();
            });
        }
    }
}
