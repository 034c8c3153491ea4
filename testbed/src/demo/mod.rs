//! `exitorder-testbed demo`: a pod run and deleted on a private containerd the way the kubelet
//! does it, with the agent answering its sidecars, and a timeline and a verdict per container.
//! With `--pod FILE.yaml`, a user's own pod; without, the two-level example of
//! `deploy/examples/`. With `--inject MODE`, the pod is first passed through the admission
//! webhook's own mutation, as a cluster with the webhook admits it.
//!
//! Parts:
//! - `mutation`: the webhook's pass and what it added, in words;
//! - `job`: a Job's pod run until its work is done, then deleted;
//! - `kill`: how `--kill` ends the pod: a deletion, or one of the kubelet's own kills;
//! - `kernel`: the exits in the timeline as the kernel told them, the runtime's stamp beside;
//! - `traffic`: `--traffic`, what clients keep through a deletion without exitorder and with it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use exitorder::webhook::HandshakeVolume;
use serde::Serialize;
use serde_json::Value;

use crate::agentlog::{parse_allow, ALLOWED};
use crate::binaries::{agent_binary, static_entrypoint, BinaryArgs};
use crate::install::{ChartAgent, ChartOptions, Helm};
use crate::kubelet::{DeleteOptions, Kill, Kind, RunOptions, RunningPod, What};
use crate::node::{AgentOptions, AgentProcess, LogLine, Node, NodeOptions, TestbedError};
use crate::verdict::{self, Allowed, ContainerVerdict, Verdict};

mod job;
mod kernel;
mod kill;
mod mutation;
mod traffic;

pub use job::JobRun;
pub use kill::DemoKill;

/// The demo's own pod: the two-level example users start from.
pub const EXAMPLE_POD: &str = include_str!("../../../deploy/examples/two-level.yaml");

/// The demo's pod with `--inject`: the same app and proxy with no hand-written opt-in, only
/// `exitorder.io/inject: "true"` and the proxy's exit priority.
pub const INJECTED_EXAMPLE_POD: &str = include_str!("../../../deploy/examples/injected.yaml");

/// The project's image, as the webhook's `exitorder-install` and the chart name it by default
/// (`scripts/image` tags its archive so).
pub const PROJECT_IMAGE: &str = exitorder::webhook::DEFAULT_INSTALL_IMAGE;

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// A Pod (YAML or JSON), or a workload whose pod template is run (Job, Deployment...),
    /// instead of the two-level example: opt your pod in the way the README says and see its
    /// exits on a real runtime before deploying it. A Job's pod (restartPolicy Never or
    /// OnFailure) runs until it completes before it is deleted.
    #[arg(long, value_name = "FILE")]
    pub pod: Option<PathBuf>,
    /// Pass the pod through the admission webhook's own mutation first, as a cluster with
    /// the webhook (`webhook.enabled=true`) admits it: `emptyDir` (the webhook's default: exit
    /// directories in the pod's own emptyDir, the entrypoint copied in by the init container
    /// `exitorder-install` from the project's image, --agent-image) or `hostPath` (the node's
    /// share and the entrypoint's host directory). `exitorder.io/inject: "true"` is added
    /// when the pod lacks it. Without --pod, the example deploy/examples/injected.yaml.
    #[arg(long, value_name = "MODE")]
    pub inject: Option<HandshakeVolume>,
    /// An image archive (docker-archive or OCI) to import first; repeatable. The node has
    /// busybox (also as busybox:1.36) and nothing is pulled.
    #[arg(long, value_name = "FILE.tar")]
    pub image: Vec<PathBuf>,
    /// Run a pod that does not ask for hostNetwork on the node's network anyway (the test
    /// bed has no CNI; otherwise such a pod is refused). Always on for the built-in example.
    #[arg(long)]
    pub host_network: bool,
    /// Delete with this grace period, as `kubectl delete --grace-period` does. With
    /// `--kill soft-eviction` the kubelet's `evictionMaxPodGracePeriod`, with `--kill
    /// node-shutdown` its grace period for regular pods.
    #[arg(long, value_name = "SECONDS")]
    pub grace_period: Option<i64>,
    /// How the pod goes: deleted through the API (the default), or killed by the kubelet
    /// itself, with that kill's grace period and Events.
    #[arg(long, value_name = "KIND", default_value = "deletion")]
    pub kill: DemoKill,
    /// How long the pod may take to become ready.
    #[arg(long, default_value = "60s", value_parser = exitorder::cli::parse_duration)]
    pub ready_timeout: Duration,
    /// How long a Job's pod (restartPolicy Never or OnFailure) may take to complete before it
    /// is deleted anyway.
    #[arg(long, default_value = "120s", value_parser = exitorder::cli::parse_duration)]
    pub complete_timeout: Duration,
    /// Run the same pod without the agent (and without the entrypoint in the share): what a
    /// node without exitorder does.
    #[arg(long)]
    pub without_agent: bool,
    /// Before the pod's timeline, an app behind a real proxy (haproxy) and log shipper
    /// (rsyslog) deleted under load, once without the agent and once with: how many requests
    /// failed and log lines were lost each time; then one replica of two behind a Service,
    /// without and with `exitorder.io/wait-for-endpoints` (needs the agent; `scripts/demo`
    /// without arguments turns it on).
    #[arg(long, conflicts_with_all = ["without_agent", "chart"])]
    pub traffic: bool,
    /// Print one JSON object as the last line: each container's exit code, exit time and
    /// verdict.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub binaries: BinaryArgs,
    /// Install the agent the way a cluster does instead: this Helm chart rendered by helm
    /// (`EXITORDER_HELM`, PATH, or the one scripts/tools.sh keeps), its DaemonSet's pod run from the
    /// image archive given by --agent-image.
    #[arg(long, value_name = "CHART_DIR")]
    pub chart: Option<PathBuf>,
    /// With --chart or --inject emptyDir: the project's image archive (`scripts/image` writes
    /// it).
    #[arg(long, value_name = "FILE.tar", default_value = crate::install::IMAGE_IN_TREE)]
    pub agent_image: PathBuf,
}

/// What `--json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub pod: String,
    /// What the containers' times count from.
    pub times_from: TimesFrom,
    /// A Job's pod (restartPolicy Never or OnFailure): how it ended before the deletion.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<JobRun>,
    pub containers: BTreeMap<String, ContainerVerdict>,
    /// The init containers that ran to completion before the pod was ready (`exitorder-install`
    /// with `--inject emptyDir`); not in the JSON when there are none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub init_containers: BTreeMap<String, InitRun>,
}

/// The origin of a report's times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimesFrom {
    /// The deletion began.
    Deletion,
    /// The pod's sandbox ran: a Job's pod that completed before it was deleted.
    Start,
}

impl TimesFrom {
    fn words(self) -> &'static str {
        match self {
            TimesFrom::Deletion => "the deletion",
            TimesFrom::Start => "the pod's start",
        }
    }
}

/// An init container as it ran: its image and exit code (`None`: it never exited).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InitRun {
    pub image: String,
    pub exit_code: Option<i32>,
}

impl DemoReport {
    /// Whether every container with a priority above 0 left in order.
    pub fn ordered(&self) -> bool {
        self.containers
            .values()
            .filter(|c| c.priority > 0)
            .all(|c| c.verdict == Verdict::Ordered)
    }
}

/// Runs the demo and prints it; an error when the node cannot start, or when, with the agent,
/// a sidecar did not leave in order.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let report = demo(&args, &mut |line| println!("{line}")).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    let late: Vec<String> = report
        .containers
        .iter()
        .filter(|(_, c)| c.priority > 0 && c.verdict != Verdict::Ordered)
        .map(|(n, c)| format!("{n}: {}", c.why))
        .collect();
    if !args.without_agent && !late.is_empty() {
        bail!("not every sidecar left in order: {}", late.join("; "));
    }
    if !args.without_agent && report.job.as_ref().is_some_and(|j| !j.completed) {
        bail!(
            "the Job's pod did not complete within {}",
            humantime::format_duration(args.complete_timeout)
        );
    }
    Ok(())
}

/// The demo, writing its lines to `out`; returns each container's verdict.
pub async fn demo(args: &DemoArgs, out: &mut dyn FnMut(&str)) -> anyhow::Result<DemoReport> {
    // A kill that cannot be is refused before anything starts.
    args.kill.with_grace(args.grace_period)?;
    let (mut pod, force_host_network) = load_pod(args)?;
    if let Some(mode) = args.inject {
        mutation::inject(&mut pod, mode, out)?;
    }
    if !args.without_agent && job::add_restart_record(&mut pod)? {
        out(&format!(
            "A Job's pod that did not pass through the webhook: added the record of its restart \
             policies the webhook writes ({}), from which the agent, here without an API \
             server, knows when the work is done.",
            exitorder_contract::annotation::RESTARTS
        ));
    }
    let binaries = if args.without_agent || args.chart.is_some() {
        None
    } else {
        Some((
            agent_binary(args.binaries.agent_binary.clone())?,
            static_entrypoint(args.binaries.entrypoint_binary.clone())?,
        ))
    };
    out("Starting a private containerd (a one-node test bed)...");
    let node = Node::start(NodeOptions::default())
        .await
        .context("cannot start the demo's private containerd")?;
    let v = node.version();
    out(&format!(
        "  {} {} on {}",
        v.runtime_name,
        v.runtime_version,
        node.socket().display()
    ));
    let run = async {
        if let (true, Some((agent, entrypoint))) = (args.traffic, &binaries) {
            let bin = crate::binaries::Binaries {
                agent: agent.clone(),
                entrypoint: entrypoint.clone(),
            };
            traffic::traffic(&node, &bin, out).await?;
        }
        scenario(&node, args, &pod, force_host_network, binaries, out).await
    };
    let outcome = tokio::select! {
        res = run => res,
        () = exitorder::telemetry::shutdown_signal() => Err(anyhow!("interrupted")),
    };
    out("Tearing the test bed down...");
    let teardown = node.shutdown().await;
    let report = outcome?;
    teardown.context("teardown")?;
    Ok(report)
}

/// The pod to run (`--pod`, or the built-in example: injected.yaml with `--inject`), and
/// whether it runs on the node's network whatever it asks.
fn load_pod(args: &DemoArgs) -> anyhow::Result<(Value, bool)> {
    let Some(path) = &args.pod else {
        let example = match args.inject {
            Some(_) => INJECTED_EXAMPLE_POD,
            None => EXAMPLE_POD,
        };
        return Ok((crate::kubelet::pod_from_yaml(example)?, true));
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let docs = crate::manifest::documents(&text)?;
    let pod = docs
        .iter()
        .find_map(|d| crate::manifest::pod_of(d).ok())
        .with_context(|| {
            format!(
                "{}: no Pod, and no workload with a pod template (Job, CronJob, Deployment, \
                 StatefulSet, DaemonSet, ReplicaSet)",
                path.display()
            )
        })?;
    Ok((pod, args.host_network))
}

/// Imports the project's image archive (`scripts/image` writes it, at
/// [`crate::install::IMAGE_IN_TREE`] of the repository) into `node`; its reference,
/// [`PROJECT_IMAGE`]. The demo and the tests import it so.
pub fn import_project_image(node: &Node, archive: &Path) -> anyhow::Result<&'static str> {
    if !archive.is_file() {
        bail!(
            "the project's image {} is not built; build it with scripts/image (scripts/demo \
             does when it is missing)",
            archive.display()
        );
    }
    node.import_image(archive)
        .with_context(|| format!("cannot import {}", archive.display()))?;
    Ok(PROJECT_IMAGE)
}

/// Imports `--image` archives, and with `--inject emptyDir` the project's image.
fn import_images(node: &Node, args: &DemoArgs, out: &mut dyn FnMut(&str)) -> anyhow::Result<()> {
    for archive in &args.image {
        node.import_image(archive)
            .with_context(|| format!("cannot import {}", archive.display()))?;
        out(&format!("Imported {}", archive.display()));
    }
    if args.inject == Some(HandshakeVolume::EmptyDir) {
        let image = import_project_image(node, &args.agent_image)?;
        out(&format!(
            "Imported the project's image {image} from {}: the injected exitorder-install \
             copies the entrypoint from it.",
            args.agent_image.display()
        ));
    }
    Ok(())
}

/// The pod's init containers (not native sidecars) as they ran.
fn init_runs(running: &RunningPod) -> BTreeMap<String, InitRun> {
    let status = running.status();
    running
        .plan()
        .init
        .iter()
        .filter(|c| c.kind == Kind::Init)
        .map(|c| {
            let exit_code = status
                .container(&c.name)
                .and_then(|s| s.last_exit.as_ref())
                .map(|e| e.exit_code);
            let run = InitRun {
                image: c.image.clone(),
                exit_code,
            };
            (c.name.clone(), run)
        })
        .collect()
}

async fn scenario(
    node: &Node,
    args: &DemoArgs,
    pod: &Value,
    force_host_network: bool,
    binaries: Option<(PathBuf, PathBuf)>,
    out: &mut dyn FnMut(&str),
) -> anyhow::Result<DemoReport> {
    import_images(node, args, out)?;
    let agent = match (&binaries, &args.chart) {
        (_, Some(chart)) if !args.without_agent => {
            let opts = ChartOptions {
                helm: Helm::find()?,
                chart: chart.clone(),
                image: args.agent_image.clone(),
                metrics_port: crate::node::free_port()
                    .context("finding a free port for the agent's metrics")?,
                values: Vec::new(),
                ready_timeout: args.ready_timeout,
            };
            let a = ChartAgent::install(node, &opts)
                .await
                .context("installing the agent from the chart")?;
            out(&format!(
                "Installed the agent from {} (image {}): the DaemonSet's pod {} is ready.",
                chart.display(),
                a.pod.plan().containers[0].image,
                a.pod.name()
            ));
            Some(DemoAgent::Chart(a))
        }
        (Some((agent, entrypoint)), _) => {
            let opts = AgentOptions::new(agent, node, entrypoint);
            let a = AgentProcess::start(&opts)
                .await
                .context("starting the agent")?;
            out(&format!(
                "Started the exitorder agent (pid {}), grace reserve {} s.",
                a.pid().unwrap_or_default(),
                opts.grace_reserve.as_secs()
            ));
            Some(DemoAgent::Process(a))
        }
        _ => {
            out("No exitorder agent, no entrypoint in the share (--without-agent): a node without exitorder.");
            None
        }
    };
    let opts = RunOptions {
        force_host_network,
        ..RunOptions::default()
    };
    let running = node.run_pod(pod, &opts).await.context("running the pod")?;
    let prio = verdict::priorities(running.plan());
    out("");
    out(&format!(
        "Pod {} ({}), grace period {} s:",
        running.name(),
        running.uid(),
        running.plan().grace_seconds
    ));
    // Names in a column as wide as the longest (`exitorder-install` of an injected pod).
    let width = running
        .plan()
        .all()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(0)
        .max(14);
    for c in running.plan().all() {
        let pre_stop = c
            .pre_stop
            .as_ref()
            .map(|h| format!(", preStop `{}`", crate::kubelet::config::describe(h)))
            .unwrap_or_default();
        out(&format!(
            "  {:<width$} exit priority {}{pre_stop}",
            c.name,
            prio.get(&c.name).copied().unwrap_or(0)
        ));
    }
    for note in running.notes() {
        out(&format!("  note: {note}"));
    }
    out("");
    let job = if job::completes(pod) {
        Some(job::run_to_completion(&running, args.complete_timeout, agent.is_some(), out).await)
    } else {
        running
            .wait_ready(args.ready_timeout)
            .await
            .context("waiting for the pod to be ready")?;
        None
    };
    let init_containers = init_runs(&running);
    for (name, run) in &init_containers {
        let code = run.exit_code.map_or("none".to_owned(), |c| c.to_string());
        out(&format!(
            "  init container {name} ran from {}: exit code {code}",
            run.image
        ));
    }
    let plan = running.plan().clone();
    let (kill, grace_period) = args.kill.with_grace(args.grace_period)?;
    out("");
    if job.as_ref().is_some_and(|j| j.completed) {
        out("Deleting the completed pod: its sandbox is removed.");
    } else {
        let what = match kill {
            Kill::Deletion => "Deleting the pod".to_owned(),
            k => format!("Killing the pod ({})", k.name()),
        };
        out(&format!("{what} the kubelet's way: preStop hooks at once, then TERM, KILL at the end of the grace period..."));
    }
    let clock = match &job {
        Some(j) if j.completed => None,
        _ => kernel::watch(node, &running).await,
    };
    let mut d = running
        .delete_with(DeleteOptions {
            grace_period,
            probe_exit_files: true,
            kill,
            ..Default::default()
        })
        .await
        .context("deleting the pod")?;
    let mut allows: HashMap<String, Allowed> = HashMap::new();
    let mut timeline = d.timeline.clone();
    if let Some(clock) = &clock {
        kernel::restamp(&mut timeline, &mut d, clock);
    }
    if let Some(agent) = &agent {
        // Every held container's allow, if the agent wrote one: its log may trail the
        // deletion by a moment.
        let held: Vec<String> = d
            .exit_files
            .iter()
            .flatten()
            .filter(|(_, e)| e.allowed.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        for name in held {
            let uid = d.pod_uid.clone();
            let _ = agent
                .wait_for("the agent's allow", Duration::from_secs(5), |l| {
                    l.is(ALLOWED, &[("pod", &uid), ("container", &name)])
                })
                .await;
        }
        for line in agent.lines() {
            let Some(json) = &line.json else { continue };
            if let Ok(Some(a)) = parse_allow(json) {
                if a.pod == d.pod_uid {
                    timeline.push(
                        a.at_ns,
                        Some(&a.container),
                        What::Allowed {
                            reason: a.reason.clone(),
                        },
                    );
                    allows.insert(
                        a.container,
                        Allowed {
                            reason: a.reason,
                            at_ns: a.at_ns,
                        },
                    );
                }
            }
        }
    }
    out("");
    let (containers, times_from, origin) = if job.as_ref().is_some_and(|j| j.completed) {
        let c = verdict::judge_completed(&plan, &d);
        (c, TimesFrom::Start, verdict::pod_start(&d.timeline))
    } else {
        let c = verdict::judge(&plan, &d, &allows);
        (c, TimesFrom::Deletion, d.started_ns)
    };
    out(&format!("Timeline (ms from {}):", times_from.words()));
    for line in timeline.render(origin).lines() {
        out(line);
    }
    out("");
    out("Verdict:");
    for (name, c) in &containers {
        out(&format!(
            "  {name:<width$} exit code {:<4} {}",
            c.exit_code, c.why
        ));
    }
    Ok(DemoReport {
        pod: d.pod_name.clone(),
        times_from,
        job,
        containers,
        init_containers,
    })
}

/// The agent of the demo: a process on the node, or the chart's DaemonSet pod.
enum DemoAgent {
    Process(AgentProcess),
    Chart(ChartAgent),
}

impl DemoAgent {
    fn lines(&self) -> Vec<LogLine> {
        match self {
            DemoAgent::Process(a) => a.lines(),
            DemoAgent::Chart(a) => a.lines(),
        }
    }

    async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&LogLine) -> bool,
    ) -> Result<LogLine, TestbedError> {
        match self {
            DemoAgent::Process(a) => a.wait_for(what, timeout, pred).await,
            DemoAgent::Chart(a) => a.wait_for(what, timeout, pred).await,
        }
    }
}
