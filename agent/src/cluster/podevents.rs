//! The read of the kubelet's word on one pod: its Events, listed by the pod's UID, as a hint
//! for a wait the node's own evidence has not decided yet (see [`crate::kubelet::evidence`]
//! and [`crate::kubelet::kills`]), within a budget per attempt, per pod and per node (see
//! `agent::hints`). One task answers the decision loop's requests, one at a time, off the
//! decision path.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kube::Client;
use tokio::sync::mpsc;
use tracing::debug;

use crate::cluster::PodSignal;
use crate::kubelet::kills::{self, SeenEvent, Word};
use crate::pod::PodUid;
use crate::stats::Stats;

/// A read of the kubelet's word on one pod, asked before any wait of a pod that the API
/// server does not show going away is released early: the pod's Events, where the kubelet
/// says, before it runs a preStop hook, whether it kills the whole pod or restarts one
/// container (see [`crate::kubelet::kills`]). One LIST, selected by the pod's UID: Events
/// cannot be selected by node, and a watch of every Event of the cluster per node would cost
/// the API server far more than a read per kubelet kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmRequest {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
    pub asked_at: Instant,
    /// The earliest wait of the pod began at this Unix second (the agent's clock: the
    /// kubelet's Events carry the same node's).
    pub since_unix: i64,
    /// The attempts the read is for: each waiting container's current one, by when it was
    /// created (Unix seconds). The kubelet's word on a container counts only for that attempt.
    pub attempts: std::collections::BTreeMap<String, i64>,
}

/// At most this many Events of one pod are read; a pod's Events are few (the kubelet's
/// repeat into one Event's count), and more than this come from something else.
const MAX_EVENTS: u32 = 250;

/// How long a confirming read may take; a slower API server leaves the wait ordered.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

/// Answers [`ConfirmRequest`]s, one at a time (they come only for waits of pods the API
/// server does not show going away, and at most a few times each).
pub struct Confirmer {
    client: Client,
    node: String,
    rx: mpsc::UnboundedReceiver<ConfirmRequest>,
    tx: mpsc::UnboundedSender<PodSignal>,
    stats: Arc<Stats>,
}

impl Confirmer {
    pub(crate) fn new(
        client: Client,
        node: &str,
        rx: mpsc::UnboundedReceiver<ConfirmRequest>,
        tx: mpsc::UnboundedSender<PodSignal>,
        stats: Arc<Stats>,
    ) -> Confirmer {
        Confirmer {
            client,
            node: node.to_owned(),
            rx,
            tx,
            stats,
        }
    }

    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let req = tokio::select! {
                () = &mut shutdown => return,
                req = self.rx.recv() => match req {
                    Some(r) => r,
                    None => return,
                },
            };
            let word = self.read(&req).await;
            let _ = self.tx.send(PodSignal::Confirmed {
                uid: req.uid,
                asked_at: req.asked_at,
                word,
            });
        }
    }

    async fn read(&self, req: &ConfirmRequest) -> Option<Word> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &req.namespace);
        let params = ListParams::default()
            .fields(&format!("involvedObject.uid={}", req.uid))
            .limit(MAX_EVENTS);
        self.stats.api_read("events");
        match tokio::time::timeout(CONFIRM_TIMEOUT, api.list(&params)).await {
            Ok(Ok(list)) => {
                let seen: Vec<SeenEvent> = list
                    .items
                    .iter()
                    .filter(|e| e.involved_object.uid.as_deref() == Some(req.uid.as_str()))
                    .map(seen)
                    .collect();
                let word = kills::read_word(&seen, &self.node, req.since_unix, &req.attempts);
                debug!(pod = %req.name, events = seen.len(), word = ?word, "the pod's Events read");
                Some(word)
            }
            Ok(Err(e)) => {
                self.stats.api_error("events_list");
                debug!(pod = %req.name, error = %e, "reading the pod's Events failed");
                None
            }
            Err(_) => {
                self.stats.api_error("events_timeout");
                None
            }
        }
    }
}

/// What the agent reads of one Event.
fn seen(e: &Event) -> SeenEvent {
    let times = [
        e.last_timestamp.as_ref().map(|t| t.0.as_second()),
        e.series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .map(|t| t.0.as_second()),
        e.event_time.as_ref().map(|t| t.0.as_second()),
        e.first_timestamp.as_ref().map(|t| t.0.as_second()),
    ];
    let source = e.source.as_ref();
    SeenEvent {
        reason: e.reason.clone().unwrap_or_default(),
        message: e.message.clone().unwrap_or_default(),
        field_path: e.involved_object.field_path.clone().unwrap_or_default(),
        component: source
            .and_then(|s| s.component.clone())
            .or_else(|| e.reporting_component.clone())
            .unwrap_or_default(),
        host: source
            .and_then(|s| s.host.clone())
            .or_else(|| e.reporting_instance.clone())
            .unwrap_or_default(),
        last_unix: times.into_iter().flatten().max(),
    }
}
