//! Kubernetes Events about exits the agent held: Normal `SidecarExitAllowed` when a container
//! waited, Warning `SidecarExitDeadline` when the grace deadline released it first; and
//! Warning `SidecarShutdownFailed` when a sidecar a finished Job's shutdown stopped exited
//! with a failure status (which marks the Job's pod failed although its work succeeded); and
//! Warning `ExitDirectoryBreach` on both pods when a container can write in another pod's exit
//! directories.
//!
//! Off the hot path: the decision loop hands a notice to a bounded queue and moves on (a full
//! queue drops the notice and counts it); one task posts them. Each notice is its own event
//! (events.k8s.io/v1 create only), so two containers of one pod never merge into one series.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::decide::Reason;
use crate::pod::PodUid;
use crate::stats::Stats;

pub const REASON_ALLOWED: &str = "SidecarExitAllowed";
pub const REASON_DEADLINE: &str = "SidecarExitDeadline";
pub const REASON_SHUTDOWN_FAILED: &str = "SidecarShutdownFailed";
pub const REASON_BREACH: &str = "ExitDirectoryBreach";
pub const REASON_FLOODED: &str = "ExitDirectoryFlooded";
/// events.k8s.io/v1 `reportingController`.
pub const REPORTING_CONTROLLER: &str = "exitorder.io/agent";
const ACTION: &str = "AllowExit";
const ACTION_SHUTDOWN: &str = "ShutdownSidecar";
const ACTION_BREACH: &str = "CheckMounts";
const ACTION_FLOODED: &str = "WatchExitDirectories";

/// Notices queued before new ones are dropped: a whole node draining at once fits.
pub const QUEUE: usize = 1024;
/// One post may take this long; a slow API server delays Events, never decisions.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// At shutdown, what is queued is posted for at most this long (well inside the agent's
/// shutdown bound).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// The API server refuses a longer note.
const NOTE_MAX: usize = 1024;

/// The pod an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: PodUid,
}

/// One allow worth telling the pod's owner about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitNotice {
    pub pod: PodRef,
    pub container: String,
    pub reason: Reason,
    pub waited: Duration,
    /// Lower-priority containers still running when the allow was written (deadline allows).
    pub still_running: Vec<String>,
    /// The kill the exit belonged to, and what showed it (see `kubelet::evidence`).
    pub kill: crate::kubelet::kills::Kill,
    pub evidence: &'static str,
    pub at: SystemTime,
}

/// A sidecar that a finished Job's shutdown stopped, and that exited with a failure status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownNotice {
    pub pod: PodRef,
    pub container: String,
    pub exit_code: i32,
    /// How it was shut down ("HTTP shutdown URL", "StopContainer").
    pub how: String,
    pub at: SystemTime,
}

/// A container that can write in another pod's exit directories: told to its own pod, and to
/// the pod whose directories it reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreachNotice {
    /// The pod told.
    pub pod: PodRef,
    /// The container of `pod` the event is about.
    pub container: String,
    pub note: String,
    pub at: SystemTime,
}

/// A pod whose exit directories spent their budget of file events or watches: polled for a
/// while.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FloodNotice {
    pub pod: PodRef,
    pub note: String,
    pub at: SystemTime,
}

impl From<FloodNotice> for Notice {
    fn from(n: FloodNotice) -> Self {
        Notice::Flooded(n)
    }
}

/// Anything an event is posted for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Exit(ExitNotice),
    Shutdown(ShutdownNotice),
    Breach(BreachNotice),
    Flooded(FloodNotice),
}

impl From<BreachNotice> for Notice {
    fn from(n: BreachNotice) -> Self {
        Notice::Breach(n)
    }
}

impl From<ExitNotice> for Notice {
    fn from(n: ExitNotice) -> Self {
        Notice::Exit(n)
    }
}

impl From<ShutdownNotice> for Notice {
    fn from(n: ShutdownNotice) -> Self {
        Notice::Shutdown(n)
    }
}

impl Notice {
    fn pod(&self) -> &PodRef {
        match self {
            Notice::Exit(n) => &n.pod,
            Notice::Shutdown(n) => &n.pod,
            Notice::Breach(n) => &n.pod,
            Notice::Flooded(n) => &n.pod,
        }
    }
}

/// The event for a notice, as posted.
pub fn event_for(n: &Notice, reporting_instance: &str) -> Event {
    match n {
        Notice::Exit(n) => exit_event(n, reporting_instance),
        Notice::Breach(n) => event(
            &n.pod,
            &n.container,
            n.at,
            ("Warning", REASON_BREACH, ACTION_BREACH),
            n.note.clone(),
            reporting_instance,
        ),
        Notice::Flooded(n) => event(
            &n.pod,
            "",
            n.at,
            ("Warning", REASON_FLOODED, ACTION_FLOODED),
            n.note.clone(),
            reporting_instance,
        ),
        Notice::Shutdown(n) => {
            let note = format!(
                "container {} exited with status {} after exitorder shut it down ({}) once the \
                 main containers had finished; the pod's phase counts this status",
                n.container, n.exit_code, n.how
            );
            event(
                &n.pod,
                &n.container,
                n.at,
                ("Warning", REASON_SHUTDOWN_FAILED, ACTION_SHUTDOWN),
                note,
                reporting_instance,
            )
        }
    }
}

fn exit_event(n: &ExitNotice, reporting_instance: &str) -> Event {
    let waited = format!("{:.3}s", n.waited.as_secs_f64());
    let (type_, reason, note) = if n.reason == Reason::Deadline {
        (
            "Warning",
            REASON_DEADLINE,
            format!(
                "container {} released by the grace deadline of the {} (told by {}) after waiting {waited}; still running: {}",
                n.container,
                n.kill,
                n.evidence,
                if n.still_running.is_empty() {
                    "unknown (runtime not answering)".to_owned()
                } else {
                    n.still_running.join(", ")
                }
            ),
        )
    } else {
        (
            "Normal",
            REASON_ALLOWED,
            format!(
                "container {} allowed to exit after waiting {waited} (reason {}; {} told by {})",
                n.container, n.reason, n.kill, n.evidence
            ),
        )
    };
    event(
        &n.pod,
        &n.container,
        n.at,
        (type_, reason, ACTION),
        note,
        reporting_instance,
    )
}

/// An event about one container of a pod: (type, reason, action).
fn event(
    pod: &PodRef,
    container: &str,
    at: SystemTime,
    (type_, reason, action): (&str, &str, &str),
    note: String,
    reporting_instance: &str,
) -> Event {
    let at = Timestamp::try_from(at).unwrap_or_else(|_| Timestamp::now());
    Event {
        metadata: ObjectMeta {
            // The kubelet's and client-go's naming: unique per object and instant.
            // Cut so the name stays within the 253 characters an object name may have.
            name: Some(format!(
                "{}.{:x}",
                truncate(&pod.name, 230).trim_end_matches(['-', '.']),
                at.as_nanosecond()
            )),
            namespace: Some(pod.namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(at)),
        type_: Some(type_.to_owned()),
        reason: Some(reason.to_owned()),
        action: Some(action.to_owned()),
        note: Some(truncate(&note, NOTE_MAX)),
        regarding: Some(ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.to_string()),
            // The kubelet's own form, so `kubectl describe` groups it with container events;
            // none for an event about the whole pod.
            field_path: (!container.is_empty()).then(|| format!("spec.containers{{{container}}}")),
            ..Default::default()
        }),
        reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
        reporting_instance: Some(truncate(reporting_instance, 128)),
        ..Default::default()
    }
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    s.get(..end).unwrap_or_default().to_owned()
}

/// The decision loop's side of the queue.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Notice>,
    stats: Arc<Stats>,
}

impl EventSink {
    /// Queues a notice; never waits.
    pub fn emit(&self, notice: impl Into<Notice>) {
        if let Err(e) = self.tx.try_send(notice.into()) {
            self.stats.pod_event("dropped");
            debug!(error = %e, "event queue full; event dropped");
        }
    }
}

/// Posts queued notices as events.
pub struct Recorder {
    client: Client,
    instance: String,
    rx: mpsc::Receiver<Notice>,
    stats: Arc<Stats>,
}

/// A recorder reporting as `instance` (the node name), and its sink.
pub fn recorder(client: Client, instance: &str, stats: Arc<Stats>) -> (EventSink, Recorder) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (
        EventSink {
            tx,
            stats: stats.clone(),
        },
        Recorder {
            client,
            instance: instance.to_owned(),
            rx,
            stats,
        },
    )
}

impl Recorder {
    /// Posts until every sink is gone or `shutdown` completes; on shutdown, what is already
    /// queued is still posted (the caller bounds how long that may take).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                n = self.rx.recv() => match n {
                    Some(n) => self.post(&n).await,
                    None => return,
                },
                () = &mut shutdown => break,
            }
        }
        self.rx.close();
        let drain = async {
            while let Some(n) = self.rx.recv().await {
                self.post(&n).await;
            }
        };
        if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
            warn!("events still queued at shutdown were not posted");
        }
    }

    async fn post(&self, n: &Notice) {
        let ev = event_for(n, &self.instance);
        let pod = n.pod();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &pod.namespace);
        match tokio::time::timeout(POST_TIMEOUT, api.create(&PostParams::default(), &ev)).await {
            Ok(Ok(_)) => self.stats.pod_event("posted"),
            Ok(Err(e)) => {
                self.stats.pod_event("failed");
                self.stats.api_error("event_create");
                warn!(pod = %pod.name, namespace = %pod.namespace, error = %e, "cannot post event");
            }
            Err(_) => {
                self.stats.pod_event("failed");
                self.stats.api_error("event_timeout");
                warn!(pod = %pod.name, namespace = %pod.namespace, "posting an event timed out");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(reason: Reason, still_running: &[&str]) -> Notice {
        Notice::Exit(exit(reason, still_running))
    }

    fn exit(reason: Reason, still_running: &[&str]) -> ExitNotice {
        ExitNotice {
            pod: PodRef {
                namespace: "shop".into(),
                name: "web-0".into(),
                uid: PodUid::parse("4f2c0000").unwrap(),
            },
            container: "linkerd-proxy".into(),
            reason,
            waited: Duration::from_millis(1234),
            still_running: still_running.iter().map(|s| s.to_string()).collect(),
            kill: crate::kubelet::kills::Kill::Pod(crate::kubelet::kills::PodKill::NodeShutdown),
            evidence: "node",
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        }
    }

    #[test]
    fn waited_allow_is_normal_and_names_container_time_and_reason() {
        let ev = event_for(&notice(Reason::Ordered, &[]), "node-a");
        assert_eq!(ev.type_.as_deref(), Some("Normal"));
        assert_eq!(ev.reason.as_deref(), Some(REASON_ALLOWED));
        let note = ev.note.unwrap_or_default();
        assert!(note.contains("linkerd-proxy"), "{note}");
        assert!(note.contains("1.234s"), "{note}");
        assert!(note.contains("reason ordered"), "{note}");
        assert!(note.contains("node_shutdown told by node"), "{note}");
        let r = ev.regarding.expect("regarding");
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert_eq!(r.uid.as_deref(), Some("4f2c0000"));
        assert_eq!(
            r.field_path.as_deref(),
            Some("spec.containers{linkerd-proxy}")
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("shop"));
        assert!(ev.metadata.name.unwrap_or_default().starts_with("web-0."));
        assert_eq!(ev.reporting_instance.as_deref(), Some("node-a"));
        assert!(ev.event_time.is_some());
    }

    #[test]
    fn deadline_allow_is_a_warning_naming_what_still_ran() {
        let ev = event_for(&notice(Reason::Deadline, &["app", "worker"]), "node-a");
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(ev.reason.as_deref(), Some(REASON_DEADLINE));
        let note = ev.note.unwrap_or_default();
        assert!(note.contains("still running: app, worker"), "{note}");
    }

    #[test]
    fn long_names_stay_within_what_the_api_server_accepts() {
        let mut n = exit(Reason::Deadline, &[]);
        n.still_running = (0..100).map(|i| format!("container-{i:03}")).collect();
        n.pod.name = format!("{}-{}", "a".repeat(229), "b".repeat(20));
        let ev = event_for(&Notice::Exit(n), "node-a");
        assert!(ev.note.unwrap_or_default().len() <= NOTE_MAX);
        let name = ev.metadata.name.unwrap_or_default();
        assert!(name.len() <= 253, "{}", name.len());
        // Cut right after the dash: the name part must not end in one.
        assert!(name.starts_with(&format!("{}.", "a".repeat(229))), "{name}");
    }

    #[test]
    fn a_failed_shutdown_is_a_warning_naming_the_sidecar_and_its_status() {
        let n = Notice::Shutdown(ShutdownNotice {
            pod: PodRef {
                namespace: "batch".into(),
                name: "report-x7".into(),
                uid: PodUid::parse("9a1b0000").unwrap(),
            },
            container: "linkerd-proxy".into(),
            exit_code: 137,
            how: "StopContainer".into(),
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        });
        let ev = event_for(&n, "node-a");
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(ev.reason.as_deref(), Some(REASON_SHUTDOWN_FAILED));
        let note = ev.note.unwrap_or_default();
        assert!(
            note.contains("linkerd-proxy") && note.contains("status 137"),
            "{note}"
        );
        assert_eq!(
            ev.regarding.and_then(|r| r.field_path).as_deref(),
            Some("spec.containers{linkerd-proxy}")
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("batch"));
    }

    #[test]
    fn reporting_instance_is_cut_to_the_api_limit() {
        let long = "n".repeat(300);
        let ev = event_for(&notice(Reason::Ordered, &[]), &long);
        assert_eq!(ev.reporting_instance.map(|s| s.len()), Some(128));
    }
}
