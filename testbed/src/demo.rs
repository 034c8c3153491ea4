//! `exitorder demo`: one pod deleted on a private containerd, with a timeline showing the
//! sidecar leaving after the app (or, `--without-agent`, before it: the problem exitorder
//! solves).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

use crate::node::{
    script, AgentOptions, AgentProcess, ContainerSpec, Deletion, LogLine, Node,
    NodeOptions, PodSpec,
};

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 2s)"))
}

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// The static exitorder-entrypoint the agent installs for the pod's preStop hook
    /// (default: beside this executable).
    #[arg(long, env = "EXITORDER_ENTRYPOINT_BINARY")]
    pub entrypoint_binary: Option<PathBuf>,
    /// The `exitorder` agent binary (default: beside this executable).
    #[arg(long, env = "EXITORDER_AGENT_BINARY")]
    pub agent_binary: Option<PathBuf>,
    /// Run the same pod without exitorder (no agent, no preStop hook) to see the problem.
    #[arg(long)]
    pub without_agent: bool,
    /// How long the app takes to finish its requests after TERM.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub drain: Duration,
}

const GRACE_SECONDS: u64 = 15;
const RESERVE: Duration = Duration::from_secs(3);

/// Runs the demo; an error when the node cannot start, or when exitorder did not keep the
/// order.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let entrypoint = if args.without_agent {
        None
    } else {
        Some(static_entrypoint(args.entrypoint_binary.clone())?)
    };
    println!("Starting a private containerd (a one-node test bed)...");
    let node = Node::start(NodeOptions::default())
        .await
        .context("cannot start the demo's private containerd")?;
    let v = node.version();
    println!(
        "  {} {} on {}",
        v.runtime_name,
        v.runtime_version,
        node.socket().display()
    );
    let outcome = tokio::select! {
        res = scenario(&node, &args, entrypoint) => res,
        () = exitorder::telemetry::shutdown_signal() => Err(anyhow!("interrupted")),
    };
    println!("Tearing the test bed down...");
    let teardown = node.shutdown().await;
    let verdict = outcome?;
    teardown.context("teardown")?;
    if !args.without_agent && !verdict.order_kept {
        bail!("exitorder did not keep the order: {}", verdict.line);
    }
    Ok(())
}

/// The static entrypoint given (default: beside this executable), refused with the command
/// that builds it when it is missing or dynamically linked (busybox containers run it).
pub fn static_entrypoint(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = given.unwrap_or_else(|| beside_this_executable(exitorder::share::ENTRYPOINT_NAME));
    const BUILD: &str = "build it with `cargo rustc -p exitorder-entrypoint --release --bin \
                         exitorder-entrypoint --target-dir target/static -- -C \
                         target-feature=+crt-static` (scripts/demo and scripts/bench do)";
    match exitorder::elf::check_static_executable(&path) {
        Ok(()) => Ok(path),
        Err(e) => bail!("entrypoint {}: {e}; {BUILD}", path.display()),
    }
}

/// The agent binary given (default: `exitorder` beside this executable).
pub fn agent_binary(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = given.unwrap_or_else(|| beside_this_executable("exitorder"));
    if path.is_file() {
        Ok(path)
    } else {
        bail!(
            "agent binary {} not found; build it with `cargo build --release -p exitorder` or \
             give --agent-binary",
            path.display()
        )
    }
}

fn beside_this_executable(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

struct Verdict {
    order_kept: bool,
    line: String,
}

async fn scenario(
    node: &Node,
    args: &DemoArgs,
    entrypoint: Option<PathBuf>,
) -> anyhow::Result<Verdict> {
    let agent = match &entrypoint {
        Some(ep) => {
            let exe = agent_binary(args.agent_binary.clone())?;
            let mut opts = AgentOptions::new(exe, node, ep);
            opts.grace_reserve = RESERVE;
            let agent = AgentProcess::start(&opts)
                .await
                .context("starting the agent")?;
            println!(
                "Started the exitorder agent (pid {}).",
                agent.pid().unwrap_or_default()
            );
            Some(agent)
        }
        None => {
            println!("No exitorder agent (--without-agent).");
            None
        }
    };
    let with_agent = agent.is_some();
    let mut proxy = ContainerSpec::new("proxy", script::exits_on_term());
    let mut spec = PodSpec::new("web").grace(GRACE_SECONDS);
    if with_agent {
        proxy = proxy.injected();
        spec = spec.exit_priorities(&[("proxy", 1)]);
    }
    let spec = spec
        .container(ContainerSpec::new("app", script::drains_for(args.drain)))
        .container(proxy);
    let uid = spec.uid.clone();
    println!();
    println!("Pod web ({uid}), grace period {GRACE_SECONDS} s:");
    println!(
        "  app    finishes its in-flight requests for {} after TERM",
        humantime::format_duration(args.drain)
    );
    if with_agent {
        println!(
            "  proxy  exits at once on TERM; exit priority 1, preStop `exitorder-entrypoint wait`"
        );
    } else {
        println!("  proxy  exits at once on TERM; no exitorder annotation, no preStop");
    }
    let pod = node.run_pod(spec).await.context("running the pod")?;
    pod.wait_ready(Duration::from_secs(15))
        .await
        .context("waiting for the containers to start")?;
    println!();
    println!("Deleting the pod (the kubelet's way: preStop hooks, then TERM, for every container at once)...");
    let d = pod.delete().await.context("deleting the pod")?;
    let allow = match &agent {
        Some(a) => a
            .wait_for("the agent's allow", Duration::from_secs(5), |l| {
                l.is("exit allowed", &[("pod", &uid), ("container", "proxy")])
            })
            .await
            .ok(),
        None => None,
    };
    println!();
    print_timeline(&d, allow.as_ref());
    let verdict = verdict(&d, with_agent, args.drain)?;
    println!();
    println!("{}", verdict.line);
    Ok(verdict)
}

fn print_timeline(d: &Deletion, allow: Option<&LogLine>) {
    let mut rows: Vec<(f64, String)> = Vec::new();
    let files = d.exit_files.as_ref();
    for c in &d.containers {
        if let Some(h) = &c.prestop {
            rows.push((
                d.ms(h.started),
                format!("{} preStop started: exitorder-entrypoint wait", c.name),
            ));
            if let Some(t) = files.and_then(|f| f.get(&c.name)).and_then(|e| e.created) {
                rows.push((
                    d.ms(t),
                    format!("{} preStop blocked: exit file appeared", c.name),
                ));
            }
            if let Some(t) = files.and_then(|f| f.get(&c.name)).and_then(|e| e.allowed) {
                let reason = allow
                    .and_then(|l| l.field("reason"))
                    .map(|r| format!(" (reason {r})"))
                    .unwrap_or_default();
                rows.push((d.ms(t), format!("allow written by the agent{reason}")));
            }
            rows.push((
                d.ms(h.returned),
                format!(
                    "{} preStop returned{}",
                    c.name,
                    h.exit_code
                        .map(|code| format!(" (exit {code})"))
                        .unwrap_or_else(|| format!(": {}", h.error.as_deref().unwrap_or("?")))
                ),
            ));
        }
        let how = if c.prestop.is_none() {
            " (no preStop hook)"
        } else {
            ""
        };
        rows.push((d.ms(c.term_sent), format!("TERM sent to {}{how}", c.name)));
        if let Some(ms) = d.finished_ms(&c.name) {
            rows.push((ms, format!("{} exited (code {})", c.name, c.exit_code)));
        }
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    println!("Timeline (ms from the deletion):");
    for (ms, what) in rows {
        println!("  {:>+7.0} ms  {what}", ms.max(0.0));
    }
}

fn verdict(d: &Deletion, with_agent: bool, drain: Duration) -> anyhow::Result<Verdict> {
    let app = d
        .finished_ms("app")
        .ok_or_else(|| anyhow!("no exit time for app"))?;
    let proxy = d
        .finished_ms("proxy")
        .ok_or_else(|| anyhow!("no exit time for proxy"))?;
    let gap = proxy - app;
    let order_kept = gap > 0.0;
    let line = if order_kept {
        format!("proxy exited {gap:.0} ms after app: order kept")
    } else if with_agent {
        format!("proxy exited {:.0} ms before app: order NOT kept", -gap)
    } else {
        format!(
            "proxy exited {:.0} ms before app: the problem; the app's last {} of requests had \
             no proxy (run without --without-agent to see exitorder fix it)",
            -gap,
            humantime::format_duration(drain)
        )
    };
    Ok(Verdict { order_kept, line })
}
