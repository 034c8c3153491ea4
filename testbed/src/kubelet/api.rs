//! What the test bed's kubelet tells the API server: core/v1 Events through its recorder and
//! the pod's status through its status manager. A test gives a sink ([`ApiSink`], in
//! [`RunOptions::api`](super::RunOptions)) to see them, e.g. the e2e crate's fake API server;
//! without one nothing is reported, as before.
//!
//! The texts are the kubelet's own, one function or constant per message, each beside the
//! upstream code it comes from (kubernetes/kubernetes `pkg/kubelet`), so that the test bed and
//! the tests that check what it reported use the same words.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// The pod an Event or a status is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// An Event's type (core/v1 `EventTypeNormal`, `EventTypeWarning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One Event the kubelet records about a pod (`record.EventRecorder.Eventf` on the pod, or
/// `recordContainerEvent` on one of its containers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletEvent {
    pub reason: String,
    pub kind: EventType,
    pub message: String,
    /// `involvedObject.fieldPath`: `spec.containers{NAME}` or `spec.initContainers{NAME}` for
    /// a container's Event (`fieldpath.ExtractContainerFieldPath`), `None` for the pod's.
    pub field_path: Option<String>,
    /// When the recorder made it (`makeEvent`: first and last timestamp).
    pub at: SystemTime,
}

/// The `DisruptionTarget` condition the kubelet adds when it ends a pod itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisruptionTarget {
    /// `v1.PodReasonTerminationByKubelet` for every kubelet kill.
    pub reason: String,
    pub message: String,
}

/// The part of the pod's status the kubelet reports that a kill changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiStatus {
    /// `status.phase`: `Pending`, `Running`, `Succeeded` or `Failed`.
    pub phase: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// The `DisruptionTarget` condition (status `True`), when the kill sets one.
    pub disruption_target: Option<DisruptionTarget>,
}

impl ApiStatus {
    /// A phase alone, without reason, message or condition.
    pub fn phase(phase: &str) -> ApiStatus {
        ApiStatus {
            phase: phase.to_owned(),
            reason: None,
            message: None,
            disruption_target: None,
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// Where the test bed's kubelet writes what the real kubelet sends the API server. Called
/// from the pod's tasks, never while the pod's status is locked; keep it quick.
pub trait ApiSink: Send + Sync {
    /// An Event the kubelet recorded about `pod` (the recorder's drops are the sink's to play).
    fn event(&self, pod: &PodRef, event: &KubeletEvent);
    /// The pod's status as the status manager would write it now.
    fn status(&self, pod: &PodRef, status: &ApiStatus);
    /// Graceful node shutdown began: the Node's `Ready` condition goes `False`, "node is
    /// shutting down" ([`NODE_SHUTTING_DOWN`]). Called beside the shutdown's kills, a little
    /// after their preStop hooks began (the kubelet's status sync races them); may be called
    /// once per pod killed.
    fn node_shutting_down(&self) {}
}

/// Event and status reasons, as the kubelet spells them.
pub mod reasons {
    /// `events.KillingContainer` (pkg/kubelet/events/event.go): `killContainer` records it on
    /// every container it kills, before the preStop hook.
    pub const KILLING: &str = "Killing";
    /// `eviction/helpers.go` `Reason`: the Event and the pod's status reason.
    pub const EVICTED: &str = "Evicted";
    /// `active_deadline.go` `reason`: the Event and the pod's status reason.
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    /// `events.PreemptContainer`: `preemption/preemption.go`'s Event and status reason.
    pub const PREEMPTING: &str = "Preempting";
    /// `nodeshutdown` `nodeShutdownReason`: the pod's status reason (no per-pod Event).
    pub const NODE_SHUTDOWN: &str = "Terminated";
    /// `events.NodeShutdown`: the Node's Event when the shutdown manager sees the shutdown.
    pub const NODE_SHUTDOWN_EVENT: &str = "Shutdown";
    /// `v1.PodReasonTerminationByKubelet`: the `DisruptionTarget` condition's reason for
    /// eviction, node shutdown and preemption.
    pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";
    /// `events.FailedPreStopHook`: `executePreStopHook` when the hook failed.
    pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";
    /// `events.FailedPostStartHook`: `startContainer` when the hook failed.
    pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
    /// The Node's Ready condition while the kubelet says it is not
    /// (`nodestatus/setters.go` `ReadyCondition`).
    pub const KUBELET_NOT_READY: &str = "KubeletNotReady";
}

/// `kuberuntime_container.go` `killContainer`: the Killing message when its caller gave none,
/// i.e. for every container of a whole-pod kill (`killContainersWithSyncResult`).
pub fn stopping_container(name: &str) -> String {
    format!("Stopping container {name}")
}

/// `kuberuntime_manager.go` `computePodActions`, a main container whose liveness probe
/// failed; `restarted` when the pod's `restartPolicy` is not `Never`
/// (`shouldRestartOnFailure`), which appends ", will be restarted".
pub fn liveness_failed(name: &str, restarted: bool) -> String {
    will_be_restarted(format!("Container {name} failed liveness probe"), restarted)
}

/// `computePodActions`, a main container whose startup probe failed (see
/// [`liveness_failed`]).
pub fn startup_failed(name: &str, restarted: bool) -> String {
    will_be_restarted(format!("Container {name} failed startup probe"), restarted)
}

/// `computePodActions`, a main container whose spec hash changed (`containerChanged`): always
/// restarted, whatever the policy ("Restart regardless of the restart policy because the
/// container spec changed").
pub fn definition_changed(name: &str) -> String {
    will_be_restarted(format!("Container {name} definition changed"), true)
}

/// `computeInitContainerActions`, a native sidecar whose liveness probe failed: restarted,
/// and the message says nothing of it.
pub fn init_liveness_failed(name: &str) -> String {
    format!("Init container {name} failed liveness probe")
}

/// `computeInitContainerActions`, a native sidecar whose startup probe failed.
pub fn init_startup_failed(name: &str) -> String {
    format!("Init container {name} failed startup probe")
}

/// `computeInitContainerActions`, a running native sidecar whose spec hash changed.
pub fn init_definition_changed(name: &str) -> String {
    format!("Init container {name} definition changed")
}

/// `computePodActions`: `fmt.Sprintf("%s, will be restarted", message)` when a restart follows.
fn will_be_restarted(message: String, restarted: bool) -> String {
    if restarted {
        format!("{message}, will be restarted")
    } else {
        message
    }
}

/// `kuberuntime_container.go` `startContainer`: the Killing message of a container whose
/// postStart hook failed (the kill's reason, `reasonFailedPostStartHook`, passed as message).
pub const FAILED_POST_START_KILL: &str = "FailedPostStartHook";
/// `startContainer`'s Warning `FailedPostStartHook` Event, recorded before that kill.
pub const POST_START_FAILED: &str = "PostStartHook failed";
/// `executePreStopHook`'s Warning `FailedPreStopHook` Event ("do not record the message in the
/// event so that secrets won't leak from the server").
pub const PRE_STOP_FAILED: &str = "PreStopHook failed";

/// `eviction/helpers.go` `evictionMessage`: `nodeLowMessageFmt` ("The node was low on
/// resource: %v. ") then `thresholdMetMessageFmt` ("Threshold quantity: %v, available: %v. ");
/// the per-container usage lines follow only when the kubelet has the pod's stats, which the
/// test bed has not.
pub fn eviction_message(resource: &str, threshold: &str, available: &str) -> String {
    format!(
        "The node was low on resource: {resource}. Threshold quantity: {threshold}, available: \
         {available}. "
    )
}

/// The eviction the test bed plays: memory below a 100Mi threshold.
pub fn memory_pressure_message() -> String {
    eviction_message("memory", "100Mi", "80Mi")
}

/// `active_deadline.go` `message`: the Event's and the pod's status message.
pub const DEADLINE_EXCEEDED_MESSAGE: &str =
    "Pod was active on the node longer than the specified deadline";
/// `preemption/preemption.go` `message`: the Event's and the pod's status message.
pub const PREEMPTION_MESSAGE: &str = "Preempted in order to admit critical pod";
/// `preemption.go`: the `DisruptionTarget` condition's message.
pub const PREEMPTION_CONDITION_MESSAGE: &str =
    "Pod was preempted by Kubelet to accommodate a critical pod.";
/// `nodeshutdown` `nodeShutdownMessage`: the pod's status and condition message.
pub const NODE_SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// `nodeshutdown` `ShutdownStatus()`: the Node's Ready condition message while it shuts down.
pub const NODE_SHUTTING_DOWN: &str = "node is shutting down";
/// The shutdown manager's Node Event (reason [`reasons::NODE_SHUTDOWN_EVENT`]).
pub const NODE_SHUTDOWN_DETECTED: &str = "Shutdown manager detected shutdown event";

/// One thing a sink was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    Event { pod: PodRef, event: KubeletEvent },
    Status { pod: PodRef, status: ApiStatus },
    NodeShuttingDown,
}

/// A sink that keeps what it was told and when, and passes it on to another (or to none):
/// what a test checks the order of.
#[derive(Default)]
pub struct ApiLog {
    next: Option<Arc<dyn ApiSink>>,
    seen: Mutex<Vec<(SystemTime, Reported)>>,
}

impl ApiLog {
    /// A log passing everything on to `next`.
    pub fn forwarding_to(next: Arc<dyn ApiSink>) -> ApiLog {
        ApiLog {
            next: Some(next),
            seen: Mutex::new(Vec::new()),
        }
    }

    fn keep(&self, r: Reported) {
        let mut seen = match self.seen.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        seen.push((SystemTime::now(), r));
    }

    /// Everything told so far, oldest first, each with when it was told.
    pub fn seen(&self) -> Vec<(SystemTime, Reported)> {
        match self.seen.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The statuses told so far, with when.
    pub fn statuses(&self) -> Vec<(SystemTime, ApiStatus)> {
        self.seen()
            .into_iter()
            .filter_map(|(at, r)| match r {
                Reported::Status { status, .. } => Some((at, status)),
                _ => None,
            })
            .collect()
    }

    /// The Events told so far (the recorder's drops are after this).
    pub fn events(&self) -> Vec<KubeletEvent> {
        self.seen()
            .into_iter()
            .filter_map(|(_, r)| match r {
                Reported::Event { event, .. } => Some(event),
                _ => None,
            })
            .collect()
    }
}

impl ApiSink for ApiLog {
    fn event(&self, pod: &PodRef, event: &KubeletEvent) {
        self.keep(Reported::Event {
            pod: pod.clone(),
            event: event.clone(),
        });
        if let Some(next) = &self.next {
            next.event(pod, event);
        }
    }

    fn status(&self, pod: &PodRef, status: &ApiStatus) {
        self.keep(Reported::Status {
            pod: pod.clone(),
            status: status.clone(),
        });
        if let Some(next) = &self.next {
            next.status(pod, status);
        }
    }

    fn node_shutting_down(&self) {
        self.keep(Reported::NodeShuttingDown);
        if let Some(next) = &self.next {
            next.node_shutting_down();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_words() {
        assert_eq!(stopping_container("app"), "Stopping container app");
        assert_eq!(
            liveness_failed("app", true),
            "Container app failed liveness probe, will be restarted"
        );
        assert_eq!(
            liveness_failed("app", false),
            "Container app failed liveness probe"
        );
        assert_eq!(
            startup_failed("app", true),
            "Container app failed startup probe, will be restarted"
        );
        assert_eq!(
            definition_changed("app"),
            "Container app definition changed, will be restarted"
        );
        assert_eq!(
            init_liveness_failed("proxy"),
            "Init container proxy failed liveness probe"
        );
        assert_eq!(
            memory_pressure_message(),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "
        );
    }

    #[test]
    fn a_log_keeps_the_order_and_passes_on() {
        let inner = Arc::new(ApiLog::default());
        let log = ApiLog::forwarding_to(inner.clone());
        let pod = PodRef {
            uid: "u".into(),
            namespace: "default".into(),
            name: "p".into(),
        };
        let ev = KubeletEvent {
            reason: reasons::KILLING.into(),
            kind: EventType::Normal,
            message: stopping_container("app"),
            field_path: Some("spec.containers{app}".into()),
            at: SystemTime::now(),
        };
        log.event(&pod, &ev);
        log.status(&pod, &ApiStatus::phase("Running"));
        log.node_shutting_down();
        assert_eq!(log.seen().len(), 3);
        assert_eq!(log.events(), vec![ev]);
        assert_eq!(log.statuses()[0].1.phase, "Running");
        assert_eq!(inner.seen().len(), 3);
    }
}
