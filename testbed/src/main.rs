use anyhow::Context;
use clap::{Parser, Subcommand};

/// The exitorder test bed: a private containerd playing one Kubernetes node.
#[derive(Debug, Parser)]
#[command(name = "exitorder-testbed", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show exitorder at work on a private containerd: a pod deleted the kubelet's way, with
    /// a timeline (root; `containerd runc busybox-static` installed).
    Demo(exitorder_testbed::demo::DemoArgs),
    /// Measure exit ordering (exit -> allow -> return, memory, CPU) on a private containerd,
    /// against a Kruise-style 1 s polling baseline (root; as for demo).
    Bench(exitorder_testbed::bench::BenchArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    exitorder::telemetry::init_logging().context("logging setup")?;
    match cli.command {
        Command::Demo(args) => exitorder_testbed::demo::run(args).await,
        Command::Bench(args) => exitorder_testbed::bench::run(args).await,
    }
}
