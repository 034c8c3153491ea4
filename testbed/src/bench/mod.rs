//! `exitorder bench`: how fast exits are ordered, measured on a private containerd (the test
//! bed plays the kubelet), against a baseline built like the OpenKruise proposal.
//!
//! 1. App exit -> `allow` written, over many pod deletions, for the agent with containerd's
//!    events, the agent polling, and the proposal's 1 s daemon, on the same node in one run.
//! 2. `allow` written -> waiter returned, for the static entrypoint and a 1 s polling shell.
//! 3. The agent's memory and CPU, idle with many pods and while all of them are deleted at
//!    once.
//! 4. The admission webhook's answer time over HTTPS (no containerd needed).
//! 5. Only when asked for (`--only churn`, minutes): the agent's memory while thousands of
//!    pods are created and deleted.
//! 6. Only when asked for (`--only traffic`): requests and log lines lost through pod
//!    deletion with a real proxy and log shipper, per strategy.
//! 7. Only when asked for (`--only skew`): how far apart one pod kill's hooks reach the agent
//!    with many pods killed at once.
//!
//! Parts:
//! - `detect`: (1) exit to `allow`, per source, each pod's trigger as the kernel saw it;
//! - `returns`: (2) `allow` to the waiter's return;
//! - `resources`: (3) the agent's memory and CPU, idle and in a burst;
//! - `webhook`: (4) the webhook's answer time over HTTPS;
//! - `churn`: (5) the agent's memory while thousands of pods come and go;
//! - `traffic`: (6) what users keep through a pod's deletion, with real parts;
//! - `skew`: (7) the spread of one pod kill's marks, which the kill evidence window must exceed;
//! - `busy`: `--busy`, a disk writer with fdatasync and a CPU hog per core while it measures;
//! - `agent`: the agent as the benchmark runs it: its exit source, its log's allows;
//! - `baseline`: the OpenKruise proposal's daemon, built as it describes it;
//! - `appclock`: the app's exit as the app stamped it, the benchmark's trigger;
//! - `kernelclock`: the app's exit as the kernel sees it, the trigger of an app that did not;
//! - `measure`: one pod deletion's facts to a delay, or the reason it gives none;
//! - `stages`: where an allow's time goes, from the app's exit to the preStop's return;
//! - `floor`: the machine's own wake-up lateness while a row runs, under every delay;
//! - `summary`: percentiles of latency samples;
//! - `proc`: a process's memory and CPU, from /proc;
//! - `report`: the table for people, one JSON object for tools.

/// Progress goes to stderr: stdout holds the table and the JSON line only.
macro_rules! progress {
    ($($arg:tt)*) => { eprintln!("bench: {}", format_args!($($arg)*)) };
}

mod agent;
pub mod appclock;
pub mod baseline;
pub mod busy;
pub mod churn;
mod detect;
pub mod floor;
pub mod kernelclock;
pub mod measure;
pub mod proc;
pub mod report;
mod resources;
pub mod returns;
pub mod skew;
pub mod stages;
pub mod summary;
pub mod traffic;
pub mod webhook;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tracing::Instrument;

use crate::binaries::Binaries;
use crate::kubelet::{DeleteOptions, Deletion, RunOptions, RunningPod};
use crate::node::{Node, NodeOptions, TestbedError};
use exitorder::handshake::share::Share;

use baseline::KRUISE_SCAN;
use detect::{detect_with_agent, detect_with_kruise, Layout};
use kernelclock::KernelClock;
use report::{DetectSection, Report, ReturnRow, ReturnSection, Settings};
use resources::resources;

use agent::AgentSource;

const APP: &str = "app";
const PROXY: &str = "proxy";
/// The agent's default `--poll-interval`, given explicitly so the report states what ran.
const AGENT_POLL: Duration = Duration::from_millis(25);
/// Kubernetes' default terminationGracePeriodSeconds.
const GRACE_SECONDS: u64 = 30;
/// How long a pod's containers may take to set their TERM traps.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the agent's log may lag behind a finished deletion.
const LOG_LAG: Duration = Duration::from_secs(5);
/// Most a batch of deletions waits before it starts: the baseline's scan period.
const BATCH_JITTER: Duration = KRUISE_SCAN;
/// How often the runtime's responsiveness is sampled during the burst.
const PROBE_PERIOD: Duration = Duration::from_millis(500);

/// A fraction in [0, 1) from the kernel's randomness.
fn random_fraction() -> f64 {
    let v = u64::from_le_bytes(crate::node::random_bytes::<8>()) >> 11;
    v as f64 / (1u64 << 53) as f64
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number above 0")),
    }
}

/// Parts of the benchmark, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// App exit -> allow, for each exit source and the Kruise-style daemon.
    Detect,
    /// Allow -> waiter returned, for the entrypoint and a 1 s polling shell.
    Return,
    /// The agent's memory and CPU, idle and while deleting every pod at once.
    Resources,
    /// The admission webhook's review latency over HTTPS.
    Webhook,
    /// The agent's memory while thousands of pods are created and deleted; only when named.
    Churn,
    /// Requests and log lines kept through pod deletion with a real proxy (haproxy) and log
    /// shipper (rsyslog), per way of ordering exits; only when named.
    Traffic,
    /// How far apart one pod kill's preStop hooks reach the agent with many pods killed at
    /// once (what the agent's kill-evidence window must exceed); only when named.
    Skew,
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Pod deletions per exit source (the agent with containerd events, the agent polling,
    /// the Kruise-style daemon).
    #[arg(long, default_value_t = 200, value_parser = positive)]
    pub deletions: usize,
    /// Pods deleted at once in the exit-source runs.
    #[arg(long, default_value_t = 10, value_parser = positive)]
    pub batch: usize,
    /// Time between the starts of the deletions of a batch, so that their apps do not all
    /// exit in the same millisecond (0: all at once; the burst measures that case).
    #[arg(long, default_value = "100ms", value_parser = exitorder::cli::parse_duration)]
    pub stagger: Duration,
    /// allow -> return measurements per waiter.
    #[arg(long, default_value_t = 200, value_parser = positive)]
    pub returns: usize,
    /// 1 s polling waiters run at once (they would take `--returns` seconds one by one).
    #[arg(long, default_value_t = 50, value_parser = positive)]
    pub poller_batch: usize,
    /// How long the agent is watched idle.
    #[arg(long, default_value = "60s", value_parser = exitorder::cli::parse_duration)]
    pub idle: Duration,
    /// Opted-in pods running while the agent is idle.
    #[arg(long, default_value_t = 110)]
    pub idle_pods: usize,
    /// Pods deleted at once for the burst (the idle pods plus more); as many as start.
    #[arg(long, default_value_t = 250)]
    pub burst_pods: usize,
    /// Pods set up at once.
    #[arg(long, default_value_t = 4, value_parser = positive)]
    pub start_concurrency: usize,
    /// How long each app takes to finish after TERM: its sidecar is waiting by then.
    #[arg(long, default_value = "500ms", value_parser = exitorder::cli::parse_duration)]
    pub app_drain: Duration,
    /// Print the report as one JSON object on the last line of stdout, after the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub binaries: crate::binaries::BinaryArgs,
    /// Admission reviews sent to the webhook, one after another on one connection.
    #[arg(long, default_value_t = 1000, value_parser = positive)]
    pub reviews: usize,
    /// Run only these parts (comma-separated); the others are null in the JSON. `churn`
    /// runs only when named here: it takes minutes.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Part>,
    /// The containerd to run on: `1.6` (the machine's), `1.7` or `2.1` (from
    /// EXITORDER_CONTAINERD_1_7 / _2_1, which `scripts/bench --runtime` sets). The run fails
    /// when the node reports another version.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(crate::node::RUNTIMES))]
    pub runtime: Option<String>,
    /// Pods created and deleted in the churn.
    #[arg(long, default_value_t = 2000, value_parser = positive)]
    pub churn_pods: usize,
    /// Pods alive at once in the churn (each created, started and deleted in turn).
    #[arg(long, default_value_t = 8, value_parser = positive)]
    pub churn_concurrency: usize,
    /// The agent's memory is read every this many pods of the churn.
    #[arg(long, default_value_t = 100, value_parser = positive)]
    pub churn_sample_every: usize,
    /// Pods per case in the traffic part (each deleted, or killed by the kubelet).
    #[arg(long, default_value_t = 5, value_parser = positive)]
    pub traffic_deletions: usize,
    /// Requests a second sent through each pod's proxy while it is deleted.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub traffic_rate: u32,
    /// Pods of three containers killed at once in the skew part.
    #[arg(long, default_value_t = 110, value_parser = positive)]
    pub skew_pods: usize,
    /// Pods killed one at a time after them, each alone on the node.
    #[arg(long, default_value_t = 20, value_parser = positive)]
    pub skew_alone: usize,
    /// Measure on a busy node: a writer syncing 256 MiB to the node's disk in a loop
    /// (`dd … conv=fdatasync`) and one CPU hog per core, for the whole run.
    #[arg(long)]
    pub busy: bool,
}

impl BenchArgs {
    fn runs(&self, part: Part) -> bool {
        match part {
            Part::Churn | Part::Traffic | Part::Skew => self.only.contains(&part),
            _ => self.only.is_empty() || self.only.contains(&part),
        }
    }

    fn settings(&self) -> Settings {
        Settings {
            deletions: self.deletions,
            batch: self.batch,
            stagger_ms: u64::try_from(self.stagger.as_millis()).unwrap_or(u64::MAX),
            app_drain_ms: u64::try_from(self.app_drain.as_millis()).unwrap_or(u64::MAX),
            pod_grace_seconds: GRACE_SECONDS,
            agent_poll_interval_ms: u64::try_from(AGENT_POLL.as_millis()).unwrap_or(u64::MAX),
            kruise_scan_ms: u64::try_from(KRUISE_SCAN.as_millis()).unwrap_or(u64::MAX),
            returns: self.returns,
            poller_batch: self.poller_batch,
            idle_seconds: self.idle.as_secs_f64(),
            idle_pods: self.idle_pods,
            burst_pods: self.burst_pods,
            start_concurrency: self.start_concurrency,
            reviews: self.reviews,
            churn_pods: self.churn_pods,
            churn_concurrency: self.churn_concurrency,
            churn_sample_every: self.churn_sample_every,
            busy: self.busy,
        }
    }
}

/// Runs the benchmark on a private containerd and prints the report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let report = measure(&args).await?;
    println!("{}", report.table());
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

/// Runs the benchmark on a private containerd and returns the report.
pub async fn measure(args: &BenchArgs) -> anyhow::Result<Report> {
    let started = Instant::now();
    let agent = crate::binaries::agent_binary(args.binaries.agent_binary.clone())?;
    let mut report = if [
        Part::Detect,
        Part::Return,
        Part::Resources,
        Part::Churn,
        Part::Traffic,
        Part::Skew,
    ]
    .iter()
    .any(|p| args.runs(*p))
    {
        let bin = Binaries {
            agent: agent.clone(),
            entrypoint: crate::binaries::static_entrypoint(
                args.binaries.entrypoint_binary.clone(),
            )?,
        };
        progress!("starting a private containerd (a one-node test bed)");
        let node = Node::start(node_options(args.runtime.as_deref())?)
            .await
            .context("cannot start the benchmark's private containerd")?;
        if let Err(e) = check_version(&node, args.runtime.as_deref()) {
            let _ = node.shutdown().await;
            return Err(e);
        }
        let load = if args.busy {
            let load = busy::Busy::start(node.dir()).context("--busy")?;
            progress!(
                "busy: a disk writer syncing {} MiB in a loop and {} CPU hogs, all run long",
                busy::WRITE_MIB,
                load.hogs()
            );
            Some(load)
        } else {
            None
        };
        let outcome = tokio::select! {
            res = measure_all(&node, args, &bin) => res,
            () = exitorder::telemetry::shutdown_signal() => Err(anyhow!("interrupted")),
        };
        drop(load);
        progress!("tearing the test bed down");
        let teardown = node.shutdown().await;
        let report = outcome?;
        teardown.context("teardown")?;
        report
    } else {
        Report::new("none (webhook only)".to_owned(), args.settings())
    };
    if args.runs(Part::Webhook) {
        progress!("webhook: {} reviews over HTTPS", args.reviews);
        report.webhook = Some(webhook::measure(&agent, args.reviews).await?);
    }
    report.total_seconds = (started.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    Ok(report)
}

/// The node on containerd `runtime` (`None` or `1.6`: the machine's own).
fn node_options(runtime: Option<&str>) -> anyhow::Result<NodeOptions> {
    let containerd_bin = match runtime {
        None | Some("1.6") => None,
        Some(v) => Some(crate::node::runtime_from_env(v).ok_or_else(|| {
            anyhow!(
                "--runtime {v}: {} is not set (scripts/bench --runtime {v} fetches it)",
                crate::node::runtime_env_var(v)
            )
        })?),
    };
    Ok(NodeOptions {
        containerd_bin,
        ..NodeOptions::default()
    })
}

/// Fails when the node's containerd is not the version asked for.
fn check_version(node: &Node, runtime: Option<&str>) -> anyhow::Result<()> {
    let Some(want) = runtime else { return Ok(()) };
    let got = &node.version().runtime_version;
    let got = got.trim_start_matches('v');
    if got == want || got.starts_with(&format!("{want}.")) {
        Ok(())
    } else {
        bail!("--runtime {want}: the node runs containerd {got}")
    }
}

async fn measure_all(node: &Node, args: &BenchArgs, bin: &Binaries) -> anyhow::Result<Report> {
    let v = node.version();
    let mut report = Report::new(
        format!("{} {}", v.runtime_name, v.runtime_version),
        args.settings(),
    );
    report.cpu_weights = node.cpu_weights();
    if args.runs(Part::Detect) {
        report.detect_to_allow = Some(DetectSection {
            containerd_events: detect_with_agent(
                node,
                args,
                bin,
                AgentSource::Events,
                Layout::Share,
            )
            .await?,
            containerd_events_pod_local: detect_with_agent(
                node,
                args,
                bin,
                AgentSource::Events,
                Layout::PodLocal,
            )
            .await?,
            poll: detect_with_agent(node, args, bin, AgentSource::Poll, Layout::Share).await?,
            kruise_daemon: detect_with_kruise(node, args, bin).await?,
        });
    }
    if args.runs(Part::Return) {
        report.allow_to_return = Some(allow_to_return(node, args, bin).await?);
    }
    if args.runs(Part::Resources) {
        let (idle, burst) = resources(node, args, bin).await?;
        report.agent_idle = Some(idle);
        report.agent_burst = Some(burst);
    }
    if args.runs(Part::Churn) {
        progress!(
            "churn: {} pods created and deleted, {} at a time; the agent's memory every {} pods",
            args.churn_pods,
            args.churn_concurrency,
            args.churn_sample_every
        );
        report.agent_churn = Some(
            churn::churn(
                node,
                bin,
                churn::ChurnPlan {
                    pods: args.churn_pods,
                    concurrency: args.churn_concurrency,
                    sample_every: args.churn_sample_every,
                },
            )
            .await?,
        );
    }
    if args.runs(Part::Traffic) {
        let settings = traffic::TrafficSettings {
            deletions: args.traffic_deletions,
            rate: args.traffic_rate,
            ..traffic::TrafficSettings::default()
        };
        report.traffic = Some(traffic::measure(node, bin, &traffic::Case::ALL, &settings).await?);
    }
    if args.runs(Part::Skew) {
        progress!(
            "skew: {} pods of three containers killed at once",
            args.skew_pods
        );
        report.kill_skew = Some(
            skew::skew(
                node,
                bin,
                args.skew_pods,
                args.skew_alone,
                args.start_concurrency,
            )
            .await?,
        );
    }
    Ok(report)
}

/// The benchmark's pod (testbed/pods/bench.yaml), as the exitorder webhook would leave it:
/// an app, and a proxy sidecar with exit priority 1 and the preStop wait.
const BENCH_POD: &str = include_str!("../../pods/bench.yaml");

fn bench_pod(name: String, app_drain: Duration) -> anyhow::Result<serde_json::Value> {
    let mut pod = crate::kubelet::pod_from_yaml(BENCH_POD)?;
    // Pod names are DNS subdomains: the source tags (containerd_events) become dashes.
    pod["metadata"]["name"] = serde_json::Value::String(name.replace('_', "-"));
    pod["spec"]["terminationGracePeriodSeconds"] = serde_json::json!(GRACE_SECONDS);
    pod["spec"]["containers"][0]["env"][0]["value"] =
        serde_json::Value::String(format!("{:.3}", app_drain.as_secs_f64()));
    pod["spec"]["containers"][1]["lifecycle"]["preStop"]["exec"]["command"][3] =
        serde_json::Value::String(format!("{GRACE_SECONDS}s"));
    Ok(pod)
}

/// Starts pods with bounded concurrency and waits until they can be stopped (each shell has
/// set its TERM trap); returns those that came up and why the others did not.
async fn start_pods(
    node: &Node,
    pods: Vec<serde_json::Value>,
    concurrency: usize,
) -> (Vec<RunningPod>, Vec<TestbedError>) {
    let mut started = Vec::with_capacity(pods.len());
    let mut errors = Vec::new();
    let opts = RunOptions::default();
    for res in node.run_pods(pods, &opts, concurrency, READY_TIMEOUT).await {
        match res {
            Ok(p) => {
                let mut ready = Ok(());
                for c in [APP, PROXY] {
                    if ready.is_ok() {
                        ready = p.wait_output(c, "serving", READY_TIMEOUT).await;
                    }
                }
                match ready {
                    // Not ready means deaf to TERM: it stays out of the measurement, and
                    // runs until the node is torn down.
                    Ok(()) => started.push(p),
                    Err(e) => errors.push(e),
                }
            }
            Err(e) => errors.push(e),
        }
    }
    (started, errors)
}

/// Deletes every pod, the kubelet's way, the i-th `i * stagger` after the first (all at
/// once without a stagger); one result per pod (with its UID).
async fn delete_all(
    pods: Vec<RunningPod>,
    stagger: Duration,
) -> Vec<(String, Result<Deletion, TestbedError>)> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, pod) in pods.into_iter().enumerate() {
        let uid = pod.uid().to_owned();
        let span = tracing::info_span!("delete_pod", pod = %uid);
        let delay = stagger.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
        tasks.spawn(
            async move {
                tokio::time::sleep(delay).await;
                let res = pod
                    .delete_with(DeleteOptions {
                        grace_period: None,
                        probe_exit_files: false,
                        ..Default::default()
                    })
                    .await;
                (uid, res)
            }
            .instrument(span),
        );
    }
    let mut out = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(r) => out.push(r),
            Err(e) => out.push((String::new(), Err(TestbedError::Task(e.to_string())))),
        }
    }
    out
}

/// Watches each pod's app exit: its own stamp, and the kernel's.
async fn watch_apps(
    node: &Node,
    clock: &mut KernelClock,
    stamps: &mut appclock::AppStamps,
    pods: &[RunningPod],
) {
    for p in pods {
        stamps.watch(p, APP);
        if let Some(id) = p.container_id(APP) {
            clock.watch(node, &id).await;
        }
    }
}

async fn allow_to_return(
    node: &Node,
    args: &BenchArgs,
    bin: &Binaries,
) -> anyhow::Result<ReturnSection> {
    let busybox = crate::node::find_busybox()?;
    let dir = node.dir().join("returns-share");
    let entrypoint = bin.entrypoint.clone();
    let (runs, batch) = (args.returns, args.poller_batch);
    progress!(
        "allow -> return: {runs} entrypoint waits one at a time, {runs} 1 s shell pollers \
         {batch} at once"
    );
    let span = tracing::info_span!("allow_to_return");
    // Dropped with this future (an interrupt), it tells the thread to stop after the waiters
    // at hand rather than run every batch.
    let cancel = returns::Cancel::default();
    let _cancel_on_drop = cancel.on_drop();
    // Waiting on processes blocks: a thread of its own, not the async workers.
    let (ep, sh) = tokio::task::spawn_blocking(move || {
        let _entered = span.enter();
        let share = Share::open(&dir)?;
        let ep = returns::measure(&share, &cancel, runs, 1, Duration::ZERO, |d: &Path| {
            let mut cmd = std::process::Command::new(&entrypoint);
            // Answered as the agent answers, but with no presence file: the presence wait
            // plays no part in allow -> return.
            cmd.arg("wait")
                .arg("--dir")
                .arg(d)
                .arg("--timeout")
                .arg(format!("{GRACE_SECONDS}s"))
                .arg("--presence=0");
            cmd
        })?;
        let sh = returns::measure(
            &share,
            &cancel,
            runs,
            batch,
            baseline::SH_POLL_PERIOD,
            |d: &Path| baseline::sh_poller(&busybox, d),
        )?;
        anyhow::Ok((ep, sh))
    })
    .await
    .context("the allow -> return task")??;
    Ok(ReturnSection {
        entrypoint: ReturnRow::new("exitorder-entrypoint wait (inotify)", &ep),
        sh_poll: ReturnRow::new("sh loop polling every 1 s (Kruise-style)", &sh),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn a_runtime_is_one_of_the_three() {
        let b = Cli::try_parse_from(["bench", "--runtime", "2.1"])
            .unwrap()
            .bench;
        assert_eq!(b.runtime.as_deref(), Some("2.1"));
        assert!(Cli::try_parse_from(["bench", "--runtime", "2.0"]).is_err());
        assert!(node_options(Some("1.6")).unwrap().containerd_bin.is_none());
    }

    #[test]
    fn defaults_and_flags() {
        let d = Cli::try_parse_from(["bench"]).unwrap().bench;
        assert_eq!(
            (d.deletions, d.batch, d.returns, d.idle_pods, d.burst_pods),
            (200, 10, 200, 110, 250)
        );
        assert_eq!(d.idle, Duration::from_secs(60));
        assert!(!d.json && d.only.is_empty());
        assert!(d.runs(Part::Detect) && d.runs(Part::Resources));
        // Minutes long: only when named.
        assert!(!d.runs(Part::Churn));
        assert_eq!((d.churn_pods, d.churn_concurrency), (2000, 8));
        let c = Cli::try_parse_from(["bench", "--only", "churn", "--churn-pods", "50"])
            .unwrap()
            .bench;
        assert!(c.runs(Part::Churn) && !c.runs(Part::Detect) && !c.runs(Part::Webhook));
        assert_eq!(c.settings().churn_pods, 50);

        let a = Cli::try_parse_from([
            "bench",
            "--deletions",
            "6",
            "--batch",
            "3",
            "--idle",
            "1s",
            "--only",
            "detect,return",
            "--json",
        ])
        .unwrap()
        .bench;
        assert_eq!((a.deletions, a.batch), (6, 3));
        assert_eq!(a.idle, Duration::from_secs(1));
        assert!(a.runs(Part::Detect) && a.runs(Part::Return) && !a.runs(Part::Resources));
        assert_eq!(a.settings().idle_seconds, 1.0);
        assert!(Cli::try_parse_from(["bench", "--batch", "0"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--only", "everything"]).is_err());
    }

    #[test]
    fn random_fractions_stay_in_range() {
        for _ in 0..1000 {
            let f = random_fraction();
            assert!((0.0..1.0).contains(&f), "{f}");
        }
    }

    #[test]
    fn bench_pods_are_ordered_and_injected() {
        let pod = bench_pod("p".into(), Duration::from_millis(300)).unwrap();
        let place = crate::kubelet::plan::Placement {
            uid: crate::node::random_uuid(),
            node_name: "n".into(),
            host_ip: "127.0.0.1".into(),
            force_host_network: false,
            name_suffix: String::new(),
        };
        let plan = crate::kubelet::plan::plan(&pod, &place).unwrap();
        let names: Vec<&str> = plan.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [APP, PROXY]);
        assert_eq!(crate::verdict::priorities(&plan)[PROXY], 1);
        assert!(plan.containers[0].command[2].contains("sleep 0.300;"));
        assert!(plan.containers[1].pre_stop.is_some());
        assert_eq!(plan.grace_seconds, 30);
        // Burstable, as pods on a node the scheduler filled.
        assert_eq!(plan.cpu_request_milli, Some(6));
    }
}
