use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use exitorder::agent::Agent;
use exitorder::cli::{self, AgentArgs, Cli, Command, TestbedArgs};
use exitorder::stats::Stats;
use exitorder::{cluster, metrics, telemetry};
use tracing::{info, warn, Instrument};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init_logging().context("logging setup")?;
    match cli.command {
        Command::Agent(args) => run_agent(args).await,
        Command::Demo(args) => run_testbed("demo", args),
        Command::Bench(args) => run_testbed("bench", args),
    }
}

/// `exitorder demo|bench`: the test bed is its own binary, kept out of the node's image.
fn run_testbed(sub: &str, args: TestbedArgs) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let bin = cli::testbed_binary();
    let err = std::process::Command::new(&bin)
        .arg(sub)
        .args(&args.args)
        .exec();
    Err(err).with_context(|| {
        format!(
            "`exitorder {sub}` runs {}, the test bed (not part of the node image); build it \
             with `cargo build --release -p exitorder-testbed`",
            bin.display()
        )
    })
}

/// The API server client when one is configured and the node is named. Otherwise, or when
/// the configuration cannot be used, the agent runs in runtime-only mode and says why, once:
/// an agent that exits over it would leave every preStop on the node to its own timeout.
async fn api_client(args: &AgentArgs) -> Option<(kube::Client, String)> {
    let source = cluster::source(
        std::env::var("KUBECONFIG").ok().as_deref(),
        std::env::var("KUBERNETES_SERVICE_HOST").ok().as_deref(),
    );
    let node = args.node_name.clone().filter(|n| !n.is_empty());
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

async fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let stats = Arc::new(Stats::default());
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("metrics address {}", args.metrics_addr))?;
    info!(addr = %listener.local_addr()?, "metrics listening");
    let http = tokio::spawn(
        metrics::serve(listener, stats.clone()).instrument(tracing::info_span!("metrics")),
    );
    let mut agent = Agent::start(args.config(), stats.clone()).context("agent start-up")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut cluster_task = None;
    if let Some((client, node)) = api_client(&args).await {
        info!(node = %node, "watching this node's pods on the API server");
        let (link, tasks) = cluster::start(client, &node, stats);
        agent = agent.with_cluster(link);
        cluster_task = Some(tokio::spawn(
            tasks
                .run(stop_rx.clone())
                .instrument(tracing::info_span!("cluster")),
        ));
    }
    let mut decisions = tokio::spawn(
        agent
            .run(cluster::stopped(stop_rx))
            .instrument(tracing::info_span!("decisions")),
    );
    let result = tokio::select! {
        res = &mut decisions => res,
        () = telemetry::shutdown_signal() => {
            info!("shutting down");
            let _ = stop_tx.send(true);
            // Bounded: whatever has not ended in time is abandoned.
            let all = async {
                let res = (&mut decisions).await;
                if let Some(t) = cluster_task.as_mut() {
                    let _ = t.await;
                }
                res
            };
            match tokio::time::timeout(args.shutdown_timeout, all).await {
                Ok(res) => res,
                Err(_) => {
                    decisions.abort();
                    if let Some(t) = &cluster_task {
                        t.abort();
                    }
                    anyhow::bail!("graceful shutdown took longer than {:?}", args.shutdown_timeout)
                }
            }
        }
    };
    http.abort();
    if let Some(t) = &cluster_task {
        t.abort();
    }
    result.context("decision task")?.context("agent")
}
