//! How the agent learns that a container exited, chosen by what the runtime is:
//!
//! - containerd's own events service (`/tasks/exit`, namespace `k8s.io`) on every containerd,
//!   1.6, 1.7 and 2.x: it publishes an exit at once, to any number of subscribers, where 2.x's
//!   CRI event stream follows 30-370 ms later (after containerd's own bookkeeping);
//! - CRI `GetContainerEvents` on CRI-O, and on containerd >= 2.0 when its socket does not
//!   serve the events service (a CRI-only proxy in front of it). Never on containerd 1.x,
//!   whose CRI event stream has a single subscriber: taking it would starve the kubelet;
//! - otherwise nothing here: the agent polls `ListContainers` while an exit is pending.
//!
//! Besides exits, the streams report container starts and removals, which keep the agent's
//! node view current; containerd's also reports each container's execs (added, exited): the
//! kubelet's exec hooks and probes, which tell the agent that a container's hook may be
//! running, or have failed, when its mark has not come (see [`crate::kubelet::evidence`]). A stream that fails or ends is reconnected with backoff; every
//! (re)connect makes the agent re-list and re-decide every pending pod, so an exit during the
//! gap is never missed.

use std::time::Duration;

use prost::Message as _;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::containerd::events::{ContainerDelete, TaskExecAdded, TaskExit, TaskStart};
use crate::containerd::services::events::v1::events_client::EventsClient;
use crate::containerd::services::events::v1::SubscribeRequest;
use crate::cri::runtime_service_client::RuntimeServiceClient;
use crate::cri::{
    ContainerEventResponse, ContainerEventType, GetEventsRequest, VersionRequest, VersionResponse,
};
use crate::view::Change;

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long a subscription must be in flight without failing to count as connected.
const CONNECT_QUIET: Duration = Duration::from_millis(200);
/// containerd's event filters (any may match): task starts and exits, execs added, and
/// container removals, of Kubernetes containers only.
const CONTAINERD_FILTERS: [&str; 4] = [
    r#"topic=="/tasks/start",namespace=="k8s.io""#,
    r#"topic=="/tasks/exit",namespace=="k8s.io""#,
    r#"topic=="/tasks/exec-added",namespace=="k8s.io""#,
    r#"topic=="/containers/delete",namespace=="k8s.io""#,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    CriEvents,
    ContainerdEvents,
    Poll,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::CriEvents => "cri_events",
            SourceKind::ContainerdEvents => "containerd_events",
            SourceKind::Poll => "poll",
        }
    }
}

/// What the operator asked for (`--exit-source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceChoice {
    /// Chosen from the runtime's Version answer.
    Auto,
    /// Never subscribe; poll while an exit is pending.
    Poll,
    /// Also accepted as `containerd_events`, the name logs and metrics use.
    #[value(alias = "containerd_events")]
    ContainerdEvents,
    #[value(alias = "cri_events")]
    CriEvents,
}

/// The major number of a version such as `1.6.20~ds1` or `v2.0.1`.
fn major(version: &str) -> Option<u32> {
    let v = version.trim().trim_start_matches('v');
    v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The source for a runtime, from its Version answer: containerd's own events on every
/// containerd (they never take anything from the kubelet, and are the fastest it sends), the
/// CRI stream on CRI-O.
pub fn choose(v: &VersionResponse) -> SourceKind {
    match v.runtime_name.to_ascii_lowercase().as_str() {
        "containerd" => SourceKind::ContainerdEvents,
        "cri-o" | "crio" => SourceKind::CriEvents,
        _ => SourceKind::Poll,
    }
}

/// What `auto` uses when the runtime's socket does not offer `kind` at all (answers
/// UNIMPLEMENTED): on containerd >= 2.0, whose CRI stream serves many subscribers, that
/// stream; nothing on containerd 1.x (its single CRI subscriber is the kubelet's) or a version
/// that cannot be read, which poll.
pub fn fallback(v: &VersionResponse, kind: SourceKind) -> Option<SourceKind> {
    let containerd = v.runtime_name.eq_ignore_ascii_case("containerd");
    match (kind, major(&v.runtime_version)) {
        (SourceKind::ContainerdEvents, Some(m)) if containerd && m >= 2 => {
            Some(SourceKind::CriEvents)
        }
        _ => None,
    }
}

/// What the source task tells the decision loop.
#[derive(Debug)]
pub enum SourceSignal {
    /// Subscribed: exits now arrive as events.
    Connected(SourceKind),
    /// A container started, exited or was removed. containerd publishes an exit before its
    /// CRI side marks the container exited, so the event is what the view trusts, not a
    /// fresh listing.
    Change(Change),
    /// The stream is gone (why is logged where it ended); poll until `Connected` again, if
    /// ever.
    Down(SourceKind),
}

enum StreamEnd {
    /// Failed before it was live: retry with a growing backoff.
    Retry(String),
    /// Was live, then ended (a runtime restart): retry soon, the backoff starts over.
    Lost(String),
    Unsupported(String),
}

/// Runs the exit source until the receiver is gone. Spawned by the agent under a named span
/// and aborted at shutdown. `version` is the runtime's answer when the caller already has it.
pub async fn run(
    channel: Channel,
    choice: SourceChoice,
    version: Option<VersionResponse>,
    tx: mpsc::UnboundedSender<SourceSignal>,
) {
    let mut backoff = Backoff::new(BACKOFF_START, BACKOFF_MAX);
    let mut known = version;
    // What `auto` turns to if the runtime does not offer its first choice; an operator's own
    // choice is kept.
    let (mut kind, mut fallback_kind) = loop {
        let picked = match choice {
            SourceChoice::Poll => return,
            SourceChoice::ContainerdEvents => (SourceKind::ContainerdEvents, None),
            SourceChoice::CriEvents => (SourceKind::CriEvents, None),
            SourceChoice::Auto => {
                let answer = match known.take() {
                    Some(v) => Ok(v),
                    None => RuntimeServiceClient::new(channel.clone())
                        .version(VersionRequest {
                            version: "v1".into(),
                        })
                        .await
                        .map(tonic::Response::into_inner),
                };
                match answer {
                    Ok(v) => {
                        let kind = choose(&v);
                        let then = fallback(&v, kind);
                        info!(
                            runtime = %v.runtime_name.escape_debug(),
                            version = %v.runtime_version.escape_debug(),
                            source = kind.as_str(),
                            fallback = then.map_or("poll", SourceKind::as_str),
                            "exit source chosen for the runtime"
                        );
                        (kind, then)
                    }
                    Err(e) => {
                        debug!(error = %e, "runtime version not known yet");
                        tokio::time::sleep(backoff.next_delay()).await;
                        continue;
                    }
                }
            }
        };
        break picked;
    };
    if kind == SourceKind::Poll {
        info!("runtime offers no exit events exitorder can share; polling while exits are pending");
        return;
    }
    backoff.reset();
    loop {
        let end = match kind {
            SourceKind::ContainerdEvents => containerd_stream(&channel, &tx).await,
            SourceKind::CriEvents => cri_stream(&channel, &tx).await,
            SourceKind::Poll => return,
        };
        if tx.is_closed() {
            return;
        }
        match end {
            StreamEnd::Unsupported(reason) => {
                let _ = tx.send(SourceSignal::Down(kind));
                if let Some(next) = fallback_kind.take() {
                    warn!(source = kind.as_str(), %reason, next = next.as_str(), "exit events not offered; trying the next source");
                    kind = next;
                    backoff.reset();
                    continue;
                }
                warn!(source = kind.as_str(), %reason, "exit events not offered; polling while exits are pending");
                return;
            }
            StreamEnd::Lost(reason) => {
                backoff.reset();
                warn!(source = kind.as_str(), %reason, retry_in = ?backoff.peek(), "exit event stream lost; polling until it is back");
                let _ = tx.send(SourceSignal::Down(kind));
            }
            StreamEnd::Retry(reason) => {
                warn!(source = kind.as_str(), %reason, retry_in = ?backoff.peek(), "exit event stream not available; polling until it is");
                let _ = tx.send(SourceSignal::Down(kind));
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// How a stream that was (`live`) or was not yet announced ended with `status`.
fn classify(status: &tonic::Status, live: bool) -> StreamEnd {
    if status.code() == tonic::Code::Unimplemented && !live {
        StreamEnd::Unsupported(status.to_string())
    } else {
        ended(status.to_string(), live)
    }
}

fn ended(reason: String, live: bool) -> StreamEnd {
    if live {
        StreamEnd::Lost(reason)
    } else {
        StreamEnd::Retry(reason)
    }
}

async fn containerd_stream(
    channel: &Channel,
    tx: &mpsc::UnboundedSender<SourceSignal>,
) -> StreamEnd {
    let mut client = EventsClient::new(channel.clone());
    let req = SubscribeRequest {
        filters: CONTAINERD_FILTERS.iter().map(|f| (*f).to_owned()).collect(),
    };
    // containerd sends the response headers only with the first event, so the call stays
    // pending on a quiet node; once it has been in flight for a moment without failing, the
    // subscription is registered and exits will arrive.
    let call = client.subscribe(req);
    tokio::pin!(call);
    let mut announced = false;
    let resp = loop {
        tokio::select! {
            r = &mut call => break r,
            () = tokio::time::sleep(CONNECT_QUIET), if !announced => {
                announced = true;
                let _ = tx.send(SourceSignal::Connected(SourceKind::ContainerdEvents));
            }
        }
    };
    let mut stream = match resp {
        Ok(s) => s.into_inner(),
        // No subscription ever existed, even if the quiet moment passed before this answer.
        Err(e) if e.code() == tonic::Code::Unimplemented => {
            return StreamEnd::Unsupported(e.to_string())
        }
        Err(e) => return classify(&e, announced),
    };
    if !announced {
        let _ = tx.send(SourceSignal::Connected(SourceKind::ContainerdEvents));
    }
    loop {
        match stream.message().await {
            Ok(Some(env)) => {
                if env.namespace != "k8s.io" {
                    continue;
                }
                let Some(change) = env
                    .event
                    .as_ref()
                    .and_then(|any| containerd_change(&env.topic, any.value.as_slice()))
                else {
                    continue;
                };
                if tx.send(SourceSignal::Change(change)).is_err() {
                    return StreamEnd::Retry("agent stopped".into());
                }
            }
            Ok(None) => return StreamEnd::Lost("stream ended".into()),
            Err(e) => return classify(&e, true),
        }
    }
}

async fn cri_stream(channel: &Channel, tx: &mpsc::UnboundedSender<SourceSignal>) -> StreamEnd {
    let mut client = RuntimeServiceClient::new(channel.clone());
    let mut stream = match client.get_container_events(GetEventsRequest {}).await {
        Ok(s) => s.into_inner(),
        Err(e) => return classify(&e, false),
    };
    // containerd 1.6 accepts the call and fails only when the stream is read; say Connected
    // after the first message or a quiet moment, so an unsupported stream is not announced.
    let mut announced = false;
    loop {
        let next = if announced {
            stream.message().await
        } else {
            match tokio::time::timeout(CONNECT_QUIET, stream.message()).await {
                Ok(m) => m,
                Err(_) => {
                    announced = true;
                    let _ = tx.send(SourceSignal::Connected(SourceKind::CriEvents));
                    continue;
                }
            }
        };
        match next {
            Ok(Some(ev)) => {
                if !announced {
                    announced = true;
                    let _ = tx.send(SourceSignal::Connected(SourceKind::CriEvents));
                }
                let Some(change) = cri_change(ev) else {
                    continue;
                };
                if tx.send(SourceSignal::Change(change)).is_err() {
                    return StreamEnd::Retry("agent stopped".into());
                }
            }
            Ok(None) => return ended("stream ended".into(), announced),
            Err(e) => return classify(&e, announced),
        }
    }
}

/// The view's change for a CRI container event; `None` for what does not change it (a
/// container created but not started yet, an event type this build does not know).
pub fn cri_change(ev: ContainerEventResponse) -> Option<Change> {
    let id = ev.container_id;
    match ContainerEventType::try_from(ev.container_event_type) {
        Ok(ContainerEventType::ContainerStartedEvent) => Some(Change::Started { id }),
        Ok(ContainerEventType::ContainerStoppedEvent) => Some(Change::Exited { id }),
        Ok(ContainerEventType::ContainerDeletedEvent) => Some(Change::Removed { id }),
        _ => None,
    }
}

/// The view's change for a containerd event; `None` for what does not change it.
pub fn containerd_change(topic: &str, payload: &[u8]) -> Option<Change> {
    match topic {
        "/tasks/start" => {
            let e = TaskStart::decode(payload).ok()?;
            (!e.container_id.is_empty()).then_some(Change::Started { id: e.container_id })
        }
        "/tasks/exit" => {
            let e = TaskExit::decode(payload).ok()?;
            if e.container_id.is_empty() {
                return None;
            }
            // Exec processes exit too (the kubelet's hooks and probes): only a container's own
            // process ends the container.
            if !e.id.is_empty() && e.id != e.container_id {
                return Some(Change::ExecExited {
                    id: e.container_id,
                    exec: e.id,
                    failed: e.exit_status != 0,
                });
            }
            Some(Change::Exited { id: e.container_id })
        }
        "/tasks/exec-added" => {
            let e = TaskExecAdded::decode(payload).ok()?;
            (!e.container_id.is_empty() && !e.exec_id.is_empty()).then_some(Change::ExecAdded {
                id: e.container_id,
                exec: e.exec_id,
            })
        }
        "/containers/delete" => {
            let e = ContainerDelete::decode(payload).ok()?;
            (!e.id.is_empty()).then_some(Change::Removed { id: e.id })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_events_become_view_changes() {
        use prost::Message;
        let exit = |id: &str, exec: &str| {
            TaskExit {
                container_id: id.into(),
                id: exec.into(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        assert_eq!(
            containerd_change("/tasks/exit", &exit("c1", "c1")),
            Some(Change::Exited { id: "c1".into() })
        );
        // An exec's exit, and an exec added: the container's hooks and probes, not its end.
        assert_eq!(
            containerd_change("/tasks/exit", &exit("c1", "exec-7")),
            Some(Change::ExecExited {
                id: "c1".into(),
                exec: "exec-7".into(),
                failed: false
            })
        );
        let failed = TaskExit {
            container_id: "c1".into(),
            id: "exec-9".into(),
            exit_status: 64,
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(
            containerd_change("/tasks/exit", &failed),
            Some(Change::ExecExited {
                id: "c1".into(),
                exec: "exec-9".into(),
                failed: true
            })
        );
        let added = TaskExecAdded {
            container_id: "c1".into(),
            exec_id: "exec-8".into(),
        }
        .encode_to_vec();
        assert_eq!(
            containerd_change("/tasks/exec-added", &added),
            Some(Change::ExecAdded {
                id: "c1".into(),
                exec: "exec-8".into()
            })
        );
        let start = TaskStart {
            container_id: "c2".into(),
            pid: 9,
        }
        .encode_to_vec();
        assert_eq!(
            containerd_change("/tasks/start", &start),
            Some(Change::Started { id: "c2".into() })
        );
        let del = ContainerDelete { id: "c3".into() }.encode_to_vec();
        assert_eq!(
            containerd_change("/containers/delete", &del),
            Some(Change::Removed { id: "c3".into() })
        );
        assert_eq!(containerd_change("/tasks/exit", b"\xff\xff"), None);
        assert_eq!(containerd_change("/images/create", &del), None);
    }

    fn v(name: &str, version: &str) -> VersionResponse {
        VersionResponse {
            runtime_name: name.into(),
            runtime_version: version.into(),
            ..Default::default()
        }
    }

    #[test]
    fn source_by_runtime_version() {
        use SourceKind::*;
        // containerd's own events on every containerd.
        assert_eq!(choose(&v("containerd", "1.6.20~ds1")), ContainerdEvents);
        assert_eq!(choose(&v("containerd", "v1.7.24")), ContainerdEvents);
        assert_eq!(choose(&v("containerd", "v2.0.1")), ContainerdEvents);
        assert_eq!(choose(&v("containerd", "2.1.9+unknown")), ContainerdEvents);
        assert_eq!(choose(&v("containerd", "2.1.0-rc.1")), ContainerdEvents);
        assert_eq!(choose(&v("containerd", "weird")), ContainerdEvents);
        assert_eq!(choose(&v("cri-o", "1.30.2")), CriEvents);
        assert_eq!(choose(&v("docker", "26.1")), Poll);
        assert_eq!(choose(&v("", "")), Poll);
    }

    #[test]
    fn fallback_when_containerd_events_are_not_served() {
        use SourceKind::*;
        // 2.x: the CRI stream serves many subscribers.
        let c2 = v("containerd", "v2.0.1");
        assert_eq!(fallback(&c2, ContainerdEvents), Some(CriEvents));
        assert_eq!(
            fallback(&v("containerd", "2.1.9+unknown"), ContainerdEvents),
            Some(CriEvents)
        );
        // 1.x: its one CRI subscriber is the kubelet's; unreadable: the same caution.
        for old in ["1.6.20~ds1", "v1.7.24", "weird"] {
            assert_eq!(
                fallback(&v("containerd", old), ContainerdEvents),
                None,
                "{old}"
            );
        }
        // Nothing after the CRI stream, and nothing for other runtimes.
        assert_eq!(fallback(&c2, CriEvents), None);
        assert_eq!(fallback(&v("cri-o", "1.30.2"), CriEvents), None);
        assert_eq!(fallback(&v("docker", "26.1"), Poll), None);
    }
}
