use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use exitorder::agent::Agent;
use exitorder::cli::{Cli, Command};
use exitorder::stats::Stats;
use exitorder::telemetry;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init_logging().context("logging setup")?;
    match cli.command {
        Command::Agent(args) => {
            let stats = Arc::new(Stats::default());
            let agent = Agent::start(args.config(), stats).context("agent start-up")?;
            let shutdown = telemetry::shutdown_signal();
            // Bounded graceful shutdown: once the signal came, the loop gets this long to end.
            tokio::select! {
                res = agent.run(shutdown) => res.context("agent")?,
                () = async {
                    telemetry::shutdown_signal().await;
                    tokio::time::sleep(args.shutdown_timeout).await;
                } => anyhow::bail!("graceful shutdown took longer than {:?}", args.shutdown_timeout),
            }
        }
    }
    Ok(())
}
