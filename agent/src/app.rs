//! The agent as one unit: metrics and health, the pod watch when there is an API server, and
//! the decision loop, started together and stopped together within a bounded time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::agent::{Agent, AgentError, Config};
use crate::cluster;
use crate::cluster::owner::Farewell;
use crate::serve::Limits;
use crate::stats::Stats;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("metrics address {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("agent start-up: {0}")]
    Start(#[source] AgentError),
    #[error("agent: {0}")]
    Agent(#[source] AgentError),
    #[error("the decision task failed: {0}")]
    Task(String),
    #[error("graceful shutdown took longer than {0:?}")]
    ShutdownTimeout(Duration),
}

/// Everything `run` needs.
#[derive(Debug, Clone)]
pub struct AppConfig {
    pub agent: Config,
    pub metrics_addr: SocketAddr,
    /// This node's name: with an API server configured, the pod watch's `spec.nodeName`.
    pub node_name: Option<String>,
    /// The agent's own DaemonSet (namespace, name): whether it is gone at SIGTERM tells an
    /// uninstall from a restart.
    pub daemonset: Option<(String, String)>,
    /// How long the drain after `cancel` may take.
    pub shutdown_timeout: Duration,
}

/// The API server client when one is configured and the node is named. Otherwise, or when
/// the configuration cannot be used, the agent runs in runtime-only mode and says why, once:
/// an agent that exits over it would leave every preStop on the node to its own timeout.
async fn api_client(node: Option<&str>) -> Option<(kube::Client, String)> {
    let source = cluster::source(
        std::env::var("KUBECONFIG").ok().as_deref(),
        std::env::var("KUBERNETES_SERVICE_HOST").ok().as_deref(),
    );
    let node = node.filter(|n| !n.is_empty()).map(str::to_owned);
    let why = match (&source, node) {
        (cluster::Source::None, _) => {
            info!(
                reason = "no API server configured (in-cluster or KUBECONFIG)",
                "runtime-only mode"
            );
            return None;
        }
        (_, None) => "an API server is configured but NODE_NAME is not set".to_owned(),
        (_, Some(node)) => match cluster::client(&source).await {
            Ok(Some(client)) => return Some((client, node)),
            Ok(None) => "KUBECONFIG names no usable file".to_owned(),
            Err(e) => format!("the API server configuration cannot be used: {e}"),
        },
    };
    warn!(reason = %why, "runtime-only mode");
    None
}

/// Runs the agent until `cancel`, then drains: the decision loop stops (pending waits stay
/// for the next agent or the entrypoint's own timeout), queued Events are posted, all within
/// `shutdown_timeout`; what has not ended by then is abandoned.
pub async fn run(cfg: AppConfig, cancel: CancellationToken) -> Result<(), AppError> {
    let stats = Arc::new(Stats::default());
    let listener = crate::serve::bind(cfg.metrics_addr).map_err(|source| AppError::Listen {
        addr: cfg.metrics_addr,
        source,
    })?;
    if let Ok(addr) = listener.local_addr() {
        info!(addr = %addr, "metrics listening");
    }
    let http_stop = CancellationToken::new();
    let http = crate::serve::metrics::spawn(listener, stats.clone(), http_stop.clone()).map_err(
        |source| AppError::Listen {
            addr: cfg.metrics_addr,
            source,
        },
    )?;
    let mut agent = Agent::start(cfg.agent.clone(), stats.clone()).map_err(AppError::Start)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut cluster_task: Option<JoinHandle<()>> = None;
    let (farewell_tx, farewell_rx) = tokio::sync::watch::channel(Farewell::Restart);
    let mut owner = None;
    if let Some((client, node)) = api_client(cfg.node_name.as_deref()).await {
        owner = cfg
            .daemonset
            .as_ref()
            .map(|(ns, name)| cluster::owner::Owner::new(client.clone(), ns, name));
        info!(node = %node, "watching this node's pods on the API server");
        let (link, tasks) = cluster::start(client, &node, stats);
        agent = agent.with_cluster(link);
        cluster_task = Some(tokio::spawn(
            tasks
                .run(stop_rx.clone())
                .instrument(tracing::info_span!("cluster")),
        ));
    }
    let owner_task = owner.clone().map(|owner| {
        tokio::spawn(
            owner
                .watch(cluster::stopped(stop_rx.clone()))
                .instrument(tracing::info_span!("owner_watch")),
        )
    });
    let mut decisions = tokio::spawn(
        agent
            .run(async move {
                cluster::stopped(stop_rx).await;
                *farewell_rx.borrow()
            })
            .instrument(tracing::info_span!("decisions")),
    );
    let result = tokio::select! {
        res = &mut decisions => res,
        () = cancel.cancelled() => {
            info!("shutting down");
            // Read before the loop stops: an uninstall lets every wait go on the way out.
            if let Some(owner) = &owner {
                let _ = farewell_tx.send(owner.farewell().await);
            }
            let _ = stop_tx.send(true);
            let all = async {
                let res = (&mut decisions).await;
                if let Some(t) = cluster_task.as_mut() {
                    let _ = t.await;
                }
                res
            };
            match tokio::time::timeout(cfg.shutdown_timeout, all).await {
                Ok(res) => res,
                Err(_) => {
                    decisions.abort();
                    if let Some(t) = &cluster_task {
                        t.abort();
                    }
                    if let Some(t) = &owner_task {
                        t.abort();
                    }
                    http_stop.cancel();
                    return Err(AppError::ShutdownTimeout(cfg.shutdown_timeout));
                }
            }
        }
    };
    // The endpoint answers until the end, so probes see the shutdown through; then its
    // connections get their short drain.
    http_stop.cancel();
    if !http
        .ended_within(Limits::METRICS.drain.saturating_mul(2))
        .await
    {
        warn!("metrics connections still open at the end of the shutdown; dropped");
    }
    if let Some(t) = &cluster_task {
        t.abort();
    }
    if let Some(t) = &owner_task {
        t.abort();
    }
    result
        .map_err(|e| AppError::Task(e.to_string()))?
        .map_err(AppError::Agent)
}
