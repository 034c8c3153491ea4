//! The agent's link to the API server: where its credentials come from, and the tasks that use
//! them (the pod watch, the node watch, the read of a pod's Events and the Events recorder).
//!
//! Optional by design: with no API server configured the agent decides from the runtime alone,
//! and an API server that is down or slow never delays a decision.
//!
//! Parts:
//! - [`podwatch`]: this node's pods as the API server sees them;
//! - [`nodewatch`]: this node's own Node: a graceful shutdown, the kubelet's version;
//! - [`podevents`]: the kubelet's word on one pod's kill, from its Events (a hint);
//! - [`endpoints`]: a pod's EndpointSlices, followed while its apps wait for them;
//! - [`recorder`]: Kubernetes Events about held exits;
//! - [`owner`]: the agent's own DaemonSet, which tells an uninstall from a restart;
//! - [`watchloop`]: one way to keep each of these watches running.

pub mod endpoints;
pub mod nodewatch;
pub mod owner;
pub mod podevents;
pub mod podwatch;
pub mod recorder;
pub mod watchloop;

use std::sync::Arc;
use std::time::Instant;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use crate::cluster::nodewatch::{NodeView, NodeWatch};
use crate::cluster::podevents::Confirmer;
use crate::cluster::podwatch::{PodView, PodWatch};
use crate::cluster::recorder::{EventSink, Recorder};
use crate::kubelet::kills::Word;
use crate::pod::PodUid;
use crate::stats::Stats;

/// Where the API server's address and credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `KUBECONFIG` is set (a node agent run outside a pod, or tests).
    Kubeconfig,
    /// The pod's service account (`KUBERNETES_SERVICE_HOST` is set).
    InCluster,
    /// Neither: runtime-only mode.
    None,
}

/// `KUBECONFIG` wins over in-cluster, as in kubectl. `~/.kube/config` is deliberately not
/// read: on a node it is usually an administrator's, and the agent must not borrow it.
pub fn source(kubeconfig: Option<&str>, service_host: Option<&str>) -> Source {
    match (kubeconfig, service_host) {
        (Some(k), _) if !k.trim().is_empty() => Source::Kubeconfig,
        (_, Some(h)) if !h.trim().is_empty() => Source::InCluster,
        _ => Source::None,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("KUBECONFIG: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    #[error("API client: {0}")]
    Client(#[from] kube::Error),
}

/// A client for the configured API server, or `None` when there is none.
pub async fn client(source: &Source) -> Result<Option<Client>, ClusterError> {
    let config = match source {
        Source::None => return Ok(None),
        Source::InCluster => Config::incluster()?,
        Source::Kubeconfig => match Kubeconfig::from_env()? {
            Some(kc) => Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?,
            None => return Ok(None),
        },
    };
    Ok(Some(client_for(config)?))
}

/// A client on `config`, tuned for the agent: kube's own retries are off. Those retry a 503
/// for minutes, during which the watch could neither report the outage nor start over; the
/// watch has its own backoff, a confirming read is only worth its moment, and so is an
/// Event. (No read timeout either: kube's watcher has its own idle timeout, and the other
/// calls have theirs.)
pub fn client_for(mut config: Config) -> Result<Client, ClusterError> {
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}

/// What the decision loop gets from the cluster side.
pub struct Cluster {
    pub view: PodView,
    pub node: NodeView,
    pub signals: mpsc::UnboundedReceiver<PodSignal>,
    pub events: EventSink,
    /// Asks the [`endpoints::Follower`] to follow a pod's endpoints, or to stop.
    pub endpoints: mpsc::UnboundedSender<endpoints::Request>,
}

/// The cluster side's tasks, to be spawned by the caller.
pub struct Tasks {
    pub watch: PodWatch,
    pub node: NodeWatch,
    pub confirmer: Confirmer,
    pub recorder: Recorder,
    pub endpoints: endpoints::Follower,
}

impl Tasks {
    /// Runs them all until `stop` says true (or its sender is gone); queued Events are still
    /// posted after that.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        tokio::join!(
            self.watch
                .run(stopped(stop.clone()))
                .instrument(tracing::info_span!("pod_watch")),
            self.node
                .run(stopped(stop.clone()))
                .instrument(tracing::info_span!("node_watch")),
            self.confirmer
                .run(stopped(stop.clone()))
                .instrument(tracing::info_span!("pod_confirm")),
            self.recorder
                .run(stopped(stop.clone()))
                .instrument(tracing::info_span!("pod_events")),
            self.endpoints
                .run(stopped(stop))
                .instrument(tracing::info_span!("pod_endpoints")),
        );
    }
}

/// Completes when `stop` turns true or its sender is dropped.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The pod and node watches of `node`, the Events read and the Events recorder, on `client`.
pub fn start(client: Client, node: &str, stats: Arc<Stats>) -> (Cluster, Tasks) {
    let (view, watch, confirmer, signals, tx) =
        podwatch::pod_watch(client.clone(), node, stats.clone());
    let (endpoints_tx, endpoints_rx) = mpsc::unbounded_channel();
    let follower =
        endpoints::Follower::new(client.clone(), endpoints_rx, tx.clone(), stats.clone());
    let (node_view, node_watch) = nodewatch::node_watch(client.clone(), node, tx);
    let (events, recorder) = recorder::recorder(client, node, stats);
    (
        Cluster {
            view,
            node: node_view,
            signals,
            events,
            endpoints: endpoints_tx,
        },
        Tasks {
            watch,
            node: node_watch,
            confirmer,
            recorder,
            endpoints: follower,
        },
    )
}

/// What the watch tells the decision loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodSignal {
    /// This pod changed (or was deleted): decide its waits again.
    Changed(PodUid),
    /// The view became current or stopped being so: decide every wait again.
    Resync,
    /// The node's own Node changed (see [`nodewatch`]): decide every wait
    /// again.
    Node,
    /// The answer to a [`podevents::ConfirmRequest`]: what the kubelet of this node said about the pod
    /// since the wait began, as read at or after `asked_at`; `None` when the read failed.
    Confirmed {
        uid: PodUid,
        asked_at: Instant,
        word: Option<Word>,
    },
    /// What is known of a followed pod's endpoints now (see [`endpoints`]).
    Endpoints {
        uid: PodUid,
        withdrawal: crate::decide::endpoints::Withdrawal,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_wins_then_in_cluster_then_none() {
        assert_eq!(
            source(Some("/etc/k.conf"), Some("10.0.0.1")),
            Source::Kubeconfig
        );
        assert_eq!(source(None, Some("10.0.0.1")), Source::InCluster);
        assert_eq!(source(Some(""), Some("10.0.0.1")), Source::InCluster);
        assert_eq!(source(None, None), Source::None);
        assert_eq!(source(Some(" "), Some("")), Source::None);
    }
}
