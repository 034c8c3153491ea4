use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use exitorder::agent::Agent;
use exitorder::cli::{AgentArgs, Cli, Command};
use exitorder::stats::Stats;
use exitorder::{metrics, telemetry};
use tracing::{info, Instrument};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init_logging().context("logging setup")?;
    match cli.command {
        Command::Agent(args) => run_agent(args).await,
        Command::Demo(args) => exitorder::demo::run(args).await,
        Command::Bench(args) => exitorder::bench::run(args).await,
    }
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
    let agent = Agent::start(args.config(), stats).context("agent start-up")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut decisions = tokio::spawn(
        async move {
            let mut rx = stop_rx;
            agent
                .run(async move {
                    let _ = rx.changed().await;
                })
                .await
        }
        .instrument(tracing::info_span!("decisions")),
    );
    let result = tokio::select! {
        res = &mut decisions => res,
        () = telemetry::shutdown_signal() => {
            info!("shutting down");
            let _ = stop_tx.send(true);
            // Bounded: a loop that does not end in time is abandoned.
            match tokio::time::timeout(args.shutdown_timeout, &mut decisions).await {
                Ok(res) => res,
                Err(_) => {
                    decisions.abort();
                    anyhow::bail!("graceful shutdown took longer than {:?}", args.shutdown_timeout)
                }
            }
        }
    };
    http.abort();
    result.context("decision task")?.context("agent")
}
