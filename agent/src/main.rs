use anyhow::Context;
use clap::Parser;
use exitorder::cli::{
    self, AgentArgs, Cli, Command, ExplainArgs, Output, TestbedArgs, WebhookArgs,
};
use exitorder::{app, telemetry};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init_logging().context("logging setup")?;
    match cli.command {
        Command::Agent(args) => run_agent(args).await,
        Command::Webhook(args) => run_webhook(args).await,
        Command::Explain(args) => explain(&args),
        Command::Demo(args) => run_testbed("demo", args),
        Command::Bench(args) => run_testbed("bench", args),
    }
}

/// A token cancelled by SIGTERM (the kubelet's) or SIGINT: the bounded graceful shutdown.
fn on_signal() -> CancellationToken {
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(
        async move {
            telemetry::shutdown_signal().await;
            on_signal.cancel();
        }
        .instrument(tracing::info_span!("signals")),
    );
    cancel
}

/// Beyond the graceful shutdown's own bound: the time its last steps (the HTTP endpoint's
/// drain, the runtime's teardown) may take before the process ends anyway.
const SHUTDOWN_SLACK: std::time::Duration = std::time::Duration::from_secs(5);

async fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let cfg = args.app_config();
    let cancel = on_signal();
    // The last resort: whatever a task does (a blocking call that does not return, work that
    // never yields), SIGTERM ends the agent within its bound, as the kubelet's KILL would
    // after the pod's grace period, but before it, so the log says why.
    let bound = cfg.shutdown_timeout.saturating_add(SHUTDOWN_SLACK);
    let signalled = cancel.clone();
    tokio::spawn(
        async move {
            signalled.cancelled().await;
            let _ = std::thread::Builder::new()
                .name("shutdown_watchdog".to_owned())
                .spawn(move || {
                    std::thread::sleep(bound);
                    tracing::error!(
                        bound = ?bound,
                        "the graceful shutdown did not end within its bound; exiting"
                    );
                    std::process::exit(1);
                });
        }
        .instrument(tracing::info_span!("shutdown_watchdog")),
    );
    app::run(cfg, cancel).await?;
    Ok(())
}

async fn run_webhook(args: WebhookArgs) -> anyhow::Result<()> {
    let mut cfg = args.config();
    let cancel = on_signal();
    let mut rollout = None;
    if let Some((namespace, name)) = &args.agent_daemonset {
        let source = exitorder::cluster::source(
            std::env::var("KUBECONFIG").ok().as_deref(),
            std::env::var("KUBERNETES_SERVICE_HOST").ok().as_deref(),
        );
        // Without a client the rollout stays unknown: sidecars wait for an agent's answer.
        let client = exitorder::cluster::client(&source)
            .await
            .context("the API client for --agent-daemonset")?
            .context("--agent-daemonset needs an API server (in-cluster or KUBECONFIG)")?;
        let (view, watch) = exitorder::webhook::rollout::rollout_watch(client, namespace, name);
        cfg.agents = Some(view);
        let stop = cancel.clone();
        rollout = Some(tokio::spawn(
            async move { watch.run(stop.cancelled_owned()).await }
                .instrument(tracing::info_span!("agents_rollout")),
        ));
    }
    let webhook = exitorder::webhook::Webhook::bind(cfg)
        .await
        .context("webhook start-up")?;
    webhook
        .run(cancel)
        .instrument(tracing::info_span!("webhook"))
        .await;
    if let Some(r) = rollout {
        r.abort();
    }
    Ok(())
}

fn explain(args: &ExplainArgs) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let mut text = String::new();
    if args.file.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading stdin")?;
    } else {
        text = std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?;
    }
    let report =
        exitorder::cli::explain::report(&text, &args.options(), args.output == Output::Json)?;
    std::io::stdout().write_all(report.text.as_bytes())?;
    if report.denied {
        std::process::exit(2);
    }
    Ok(())
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
