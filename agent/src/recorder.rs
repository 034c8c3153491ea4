//! Kubernetes Events about exits the agent held: Normal `SidecarExitAllowed` when a container
//! waited, Warning `SidecarExitDeadline` when the grace deadline released it first.
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
use crate::stats::Stats;

pub const REASON_ALLOWED: &str = "SidecarExitAllowed";
pub const REASON_DEADLINE: &str = "SidecarExitDeadline";
/// events.k8s.io/v1 `reportingController`.
pub const REPORTING_CONTROLLER: &str = "exitorder.io/agent";
const ACTION: &str = "AllowExit";

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
    pub uid: String,
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
    pub at: SystemTime,
}

/// The event for a notice, as posted.
pub fn event_for(n: &ExitNotice, reporting_instance: &str) -> Event {
    let at = Timestamp::try_from(n.at).unwrap_or_else(|_| Timestamp::now());
    let waited = format!("{:.3}s", n.waited.as_secs_f64());
    let (type_, reason, note) = if n.reason == Reason::Deadline {
        (
            "Warning",
            REASON_DEADLINE,
            format!(
                "container {} released by the grace deadline after waiting {waited}; still running: {}",
                n.container,
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
                "container {} allowed to exit after waiting {waited} (reason {})",
                n.container, n.reason
            ),
        )
    };
    Event {
        metadata: ObjectMeta {
            // The kubelet's and client-go's naming: unique per object and instant.
            // Cut so the name stays within the 253 characters an object name may have.
            name: Some(format!(
                "{}.{:x}",
                truncate(&n.pod.name, 230).trim_end_matches(['-', '.']),
                at.as_nanosecond()
            )),
            namespace: Some(n.pod.namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(at)),
        type_: Some(type_.to_owned()),
        reason: Some(reason.to_owned()),
        action: Some(ACTION.to_owned()),
        note: Some(truncate(&note, NOTE_MAX)),
        regarding: Some(ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(n.pod.namespace.clone()),
            name: Some(n.pod.name.clone()),
            uid: Some(n.pod.uid.clone()),
            // The kubelet's own form, so `kubectl describe` groups it with container events.
            field_path: Some(format!("spec.containers{{{}}}", n.container)),
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
        end -= 1;
    }
    s[..end].to_owned()
}

/// The decision loop's side of the queue.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<ExitNotice>,
    stats: Arc<Stats>,
}

impl EventSink {
    /// Queues a notice; never waits.
    pub fn emit(&self, notice: ExitNotice) {
        if let Err(e) = self.tx.try_send(notice) {
            self.stats.pod_event("dropped");
            debug!(error = %e, "event queue full; event dropped");
        }
    }
}

/// Posts queued notices as events.
pub struct Recorder {
    client: Client,
    instance: String,
    rx: mpsc::Receiver<ExitNotice>,
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

    async fn post(&self, n: &ExitNotice) {
        let ev = event_for(n, &self.instance);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &n.pod.namespace);
        match tokio::time::timeout(POST_TIMEOUT, api.create(&PostParams::default(), &ev)).await {
            Ok(Ok(_)) => self.stats.pod_event("posted"),
            Ok(Err(e)) => {
                self.stats.pod_event("failed");
                self.stats.api_error("event_create");
                warn!(pod = %n.pod.name, namespace = %n.pod.namespace, error = %e, "cannot post event");
            }
            Err(_) => {
                self.stats.pod_event("failed");
                self.stats.api_error("event_timeout");
                warn!(pod = %n.pod.name, namespace = %n.pod.namespace, "posting an event timed out");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(reason: Reason, still_running: &[&str]) -> ExitNotice {
        ExitNotice {
            pod: PodRef {
                namespace: "shop".into(),
                name: "web-0".into(),
                uid: "4f2c".into(),
            },
            container: "linkerd-proxy".into(),
            reason,
            waited: Duration::from_millis(1234),
            still_running: still_running.iter().map(|s| s.to_string()).collect(),
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
        let r = ev.regarding.expect("regarding");
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert_eq!(r.uid.as_deref(), Some("4f2c"));
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
        let mut n = notice(Reason::Deadline, &[]);
        n.still_running = (0..100).map(|i| format!("container-{i:03}")).collect();
        n.pod.name = format!("{}-{}", "a".repeat(229), "b".repeat(20));
        let ev = event_for(&n, "node-a");
        assert!(ev.note.unwrap_or_default().len() <= NOTE_MAX);
        let name = ev.metadata.name.unwrap_or_default();
        assert!(name.len() <= 253, "{}", name.len());
        // Cut right after the dash: the name part must not end in one.
        assert!(name.starts_with(&format!("{}.", "a".repeat(229))), "{name}");
    }

    #[test]
    fn reporting_instance_is_cut_to_the_api_limit() {
        let long = "n".repeat(300);
        let ev = event_for(&notice(Reason::Ordered, &[]), &long);
        assert_eq!(ev.reporting_instance.map(|s| s.len()), Some(128));
    }
}
