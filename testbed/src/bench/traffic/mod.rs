//! Part 6 (`--only traffic`): what users keep through a pod's deletion, with real parts. Each
//! pod (testbed/pods/traffic.yaml) is an app that drains on TERM (it keeps serving and makes
//! outbound calls through its proxy), a real proxy (haproxy, which stops at once on TERM) and a
//! real log shipper (rsyslog, forwarding the app's log file to a sink on the host). While the
//! pod is deleted, clients still routed to it (its endpoint being removed) send a steady rate
//! of requests through the proxy. The same pods and load run under each way of ordering the
//! sidecars' exits; per strategy the report counts inbound and outbound requests failed, the
//! app's log lines the sink never got, and the time from the deletion to the pod gone.
//!
//! Then the withdrawal rows: whether the app's own clients still reach it while its endpoints
//! are being withdrawn, with nothing, a fixed `sleep` preStop or exitorder's withdrawal wait.
//!
//! Parts:
//! - `pod`: the traffic pod as each way of ordering the sidecars' exits has it;
//! - `net`: the host's side: the service called out to, the log sink, the clients;
//! - `withdrawal`: one replica of two behind a Service deleted under load, its endpoints
//!   withdrawn by the EndpointSlice controller and followed by haproxy.

mod net;
mod pod;
pub mod withdrawal;

use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::agent::start_agent;
use super::baseline::{KruiseDaemon, KRUISE_SCAN};
use crate::binaries::Binaries;
use crate::clock::until;
use crate::kubelet::{DeleteOptions, Deletion, Kill, RunOptions, RunningPod};
use crate::node::dirs::{make_temp_dir, DirGuard};
use crate::node::Node;

pub use net::Load;

pub use pod::Strategy;
use pod::{traffic_pod, Ports, APP, PROXY, SHIPPER};
/// How long a pod's containers and its proxy's and shipper's paths may take to come up.
const UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the sink may lag behind the pod's end for the lines it will get at all.
const SINK_LAG: Duration = Duration::from_secs(2);

/// A strategy, and how the pod goes: a deletion through the API, or one of the kubelet's own
/// kills, which keep the pod `Running` in the API until its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    pub strategy: Strategy,
    pub kill: Kill,
}

/// A soft eviction (`eviction_manager.go` evictPod) with the kubelet's
/// `evictionMaxPodGracePeriod` at 30 s, the pod's own grace then.
pub const SOFT_EVICTION: Kill = Kill::Eviction {
    hard: false,
    max_pod_grace_seconds: 30,
};
/// A graceful node shutdown (`nodeshutdown_manager_linux.go`) with 20 s for regular pods
/// (`shutdownGracePeriod` 30 s less `shutdownGracePeriodCriticalPods` 10 s).
pub const NODE_SHUTDOWN: Kill = Kill::NodeShutdown { grace_seconds: 20 };

impl Case {
    /// Every case the benchmark runs, in the table's order: each strategy through a
    /// deletion, then the kubelet's own kills without and with exitorder.
    pub const ALL: [Case; 10] = [
        Case::deletion(Strategy::None),
        Case::deletion(Strategy::Exitorder),
        Case::deletion(Strategy::Kruise),
        Case::deletion(Strategy::LinkerdWait(1)),
        Case::deletion(Strategy::LinkerdWait(5)),
        Case::deletion(Strategy::Native),
        Case {
            strategy: Strategy::None,
            kill: SOFT_EVICTION,
        },
        Case {
            strategy: Strategy::Exitorder,
            kill: SOFT_EVICTION,
        },
        Case {
            strategy: Strategy::None,
            kill: NODE_SHUTDOWN,
        },
        Case {
            strategy: Strategy::Exitorder,
            kill: NODE_SHUTDOWN,
        },
    ];

    pub const fn deletion(strategy: Strategy) -> Case {
        Case {
            strategy,
            kill: Kill::Deletion,
        }
    }

    /// The strategy's name, and the kill's when it is not a deletion.
    pub fn label(&self) -> String {
        match self.kill {
            Kill::Deletion => self.strategy.name(),
            kill => format!("{}, {}", self.strategy.name(), kill.name()),
        }
    }

    fn tag(&self) -> String {
        let kill = match self.kill {
            Kill::Deletion => "",
            Kill::Eviction { .. } => "-evicted",
            Kill::NodeShutdown { .. } => "-shutdown",
            _ => "-killed",
        };
        format!("{}{kill}", self.strategy.tag())
    }
}

/// The benchmark's knobs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TrafficSettings {
    pub deletions: usize,
    /// Inbound requests a second during each deletion.
    pub rate: u32,
    /// How long clients go on sending to the pod after its deletion began.
    pub endpoint_lag_ms: u64,
    /// Outbound calls the app makes while it drains (one every 100 ms or so).
    pub app_calls: u32,
    pub grace_seconds: u64,
}

impl Default for TrafficSettings {
    fn default() -> Self {
        TrafficSettings {
            deletions: 5,
            rate: 50,
            endpoint_lag_ms: 1000,
            app_calls: 20,
            grace_seconds: 30,
        }
    }
}

/// One deletion's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub inbound: usize,
    pub inbound_failed: usize,
    pub outbound: usize,
    pub outbound_failed: usize,
    pub lines: usize,
    pub lines_lost: usize,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.inbound += o.inbound;
        self.inbound_failed += o.inbound_failed;
        self.outbound += o.outbound;
        self.outbound_failed += o.outbound_failed;
        self.lines += o.lines;
        self.lines_lost += o.lines_lost;
    }

    /// "N of M requests failed, K log lines lost".
    pub fn sentence(&self) -> String {
        format!(
            "{} of {} requests failed ({} of {} inbound, {} of {} outbound), {} of {} log lines lost",
            self.inbound_failed + self.outbound_failed,
            self.inbound + self.outbound,
            self.inbound_failed,
            self.inbound,
            self.outbound_failed,
            self.outbound,
            self.lines_lost,
            self.lines
        )
    }
}

/// One strategy's row.
#[derive(Debug, Clone, Serialize)]
pub struct TrafficRow {
    pub strategy: String,
    /// How the pods went: `deletion`, `soft eviction`, `node shutdown`.
    pub kill: &'static str,
    pub deletions: usize,
    #[serde(flatten)]
    pub counts: Counts,
    /// Deletions with at least one failed request or lost line.
    pub deletions_with_loss: usize,
    /// Deletion -> pod gone (its sandbox removed), p50 and max.
    pub pod_gone_p50_ms: f64,
    pub pod_gone_max_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrafficSection {
    pub settings: TrafficSettings,
    pub rows: Vec<TrafficRow>,
    /// Endpoints withdrawn before the app stops, or not.
    pub withdrawal: Option<withdrawal::WithdrawalSection>,
}

impl TrafficSection {
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let s = &self.settings;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\nTraffic through pod deletion: {} pods per case, each deleted (or killed by the kubelet); each pod: an app that drains on TERM \
             (serves, and makes {} outbound calls through the proxy), haproxy, rsyslog shipping the app's log; \
             {} requests/s through the proxy for {} ms after each kill began; grace {} s.",
            s.deletions, s.app_calls, s.rate, s.endpoint_lag_ms, s.grace_seconds
        );
        let _ = writeln!(
            t,
            "{:<44} {:>16} {:>16} {:>14} {:>10} {:>10}",
            "strategy", "inbound failed", "outbound failed", "lines lost", "gone p50", "gone max"
        );
        for r in &self.rows {
            let c = &r.counts;
            let _ = writeln!(
                t,
                "{:<44} {:>16} {:>16} {:>14} {:>8.0}ms {:>8.0}ms",
                r.strategy,
                format!("{} of {}", c.inbound_failed, c.inbound),
                format!("{} of {}", c.outbound_failed, c.outbound),
                format!("{} of {}", c.lines_lost, c.lines),
                r.pod_gone_p50_ms,
                r.pod_gone_max_ms
            );
        }
        if let Some(w) = &self.withdrawal {
            t.push_str(&w.table());
        }
        t
    }
}

/// What runs a strategy's waits: the agent, the Kruise-style daemon or nothing.
enum Server {
    Nothing,
    Agent(crate::node::AgentProcess),
    Kruise {
        stop: tokio::sync::watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
    },
}

impl Server {
    async fn start(node: &Node, bin: &Binaries, strategy: Strategy) -> anyhow::Result<Server> {
        Ok(match strategy {
            Strategy::Exitorder => Server::Agent(start_agent(node, bin, None).await?),
            Strategy::Kruise => {
                let daemon = KruiseDaemon::new(node.share_dir(), node.client(), KRUISE_SCAN)
                    .context("starting the Kruise-style daemon")?;
                let (stop, stopped) = tokio::sync::watch::channel(false);
                let task = tokio::spawn(
                    daemon
                        .run(stopped)
                        .instrument(tracing::info_span!("kruise_daemon")),
                );
                Server::Kruise { stop, task }
            }
            _ => Server::Nothing,
        })
    }

    async fn stop(self) {
        match self {
            Server::Nothing => {}
            Server::Agent(mut agent) => {
                let _ = agent.terminate(Duration::from_secs(10)).await;
            }
            Server::Kruise { stop, task } => {
                let _ = stop.send(true);
                let _ = task.await;
            }
        }
    }
}

/// The host's side, shared by every deletion of a run.
struct World {
    upstream: u16,
    sink: net::Sink,
    sink_port: u16,
    logs: DirGuard,
    stop: CancellationToken,
}

impl World {
    async fn start() -> anyhow::Result<World> {
        let stop = CancellationToken::new();
        let upstream = net::upstream(stop.clone()).await?;
        let sink = net::Sink::default();
        let sink_port = sink.start(stop.clone()).await?;
        let logs =
            DirGuard::new(make_temp_dir("eo-traffic").context("a directory for the apps' logs")?);
        Ok(World {
            upstream,
            sink,
            sink_port,
            logs,
            stop,
        })
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts `pod` and waits until traffic flows both ways and the shipper forwards.
async fn bring_up(
    node: &Node,
    pod: &serde_json::Value,
    name: &str,
    ports: &Ports,
    world: &World,
) -> anyhow::Result<RunningPod> {
    let running = node
        .run_pod(pod, &RunOptions::default())
        .await
        .with_context(|| format!("starting {name}"))?;
    for c in [APP, PROXY, SHIPPER] {
        running
            .wait_output(c, "serving", UP_TIMEOUT)
            .await
            .with_context(|| format!("{name}: {c} did not start"))?;
    }
    let inbound = ports.inbound;
    until(
        &format!("{name}: requests through the proxy"),
        UP_TIMEOUT,
        || net::get_ok(inbound),
    )
    .await?;
    let outbound = ports.outbound;
    until(
        &format!("{name}: calls out through the proxy"),
        UP_TIMEOUT,
        || net::get_ok(outbound),
    )
    .await?;
    let sink = world.sink.clone();
    let serving = format!("{name} serving");
    until(
        &format!("{name}: the shipper forwarding"),
        UP_TIMEOUT,
        || {
            let found = sink.lines_of(name).contains(&serving);
            async move { found }
        },
    )
    .await?;
    Ok(running)
}

/// One pod deleted under load: its counts and how long it took to go.
async fn one_deletion(
    node: &Node,
    case: Case,
    settings: &TrafficSettings,
    world: &World,
    n: usize,
) -> anyhow::Result<(Counts, f64)> {
    let strategy = case.strategy;
    let name = format!("traffic-{}-{n}", case.tag());
    let log_dir = world.logs.path().join(&name);
    std::fs::create_dir_all(&log_dir).with_context(|| format!("{}", log_dir.display()))?;
    let ports = Ports {
        app: crate::node::free_port()?,
        inbound: crate::node::free_port()?,
        outbound: crate::node::free_port()?,
    };
    let pod = traffic_pod(&name, strategy, settings, &ports, world, &log_dir)?;
    let running = bring_up(node, &pod, &name, &ports, world).await?;
    let lag = Duration::from_millis(settings.endpoint_lag_ms);
    let (load, deletion) = tokio::join!(
        net::load(ports.inbound, settings.rate, lag),
        running.delete_with(DeleteOptions {
            probe_exit_files: false,
            kill: case.kill,
            ..Default::default()
        })
    );
    let deletion: Deletion = deletion.with_context(|| format!("deleting {name}"))?;
    let gone_ms = deletion.ms(deletion.sandbox_removed_ns);
    let log = log_dir.join("app.log");
    let written: Vec<String> = std::fs::read_to_string(&log)
        .with_context(|| format!("{}", log.display()))?
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    // Lines the shipper sent before it stopped are in by the pod's end but for the socket's
    // last bytes; those it never read will not come.
    let sink = world.sink.clone();
    let _ = until("the sink", SINK_LAG, || {
        let got = sink.lines_of(&name);
        let all = written.iter().all(|w| got.contains(w));
        async move { all }
    })
    .await;
    let got = world.sink.lines_of(&name);
    let outbound: Vec<&String> = written
        .iter()
        .filter(|l| l.contains(" out ") || l.starts_with("out "))
        .collect();
    let counts = Counts {
        inbound: load.sent,
        inbound_failed: load.failed,
        outbound: outbound.len(),
        outbound_failed: outbound.iter().filter(|l| l.ends_with(" failed")).count(),
        lines: written.len(),
        lines_lost: written.iter().filter(|w| !got.contains(w)).count(),
    };
    Ok((counts, gone_ms))
}

/// Every deletion of one strategy, with its waits' server running.
pub async fn run_strategy(
    node: &Node,
    bin: &Binaries,
    strategy: Strategy,
    settings: &TrafficSettings,
) -> anyhow::Result<TrafficRow> {
    run_case(node, bin, Case::deletion(strategy), settings).await
}

/// Every kill of one case, with its strategy's waits' server running.
pub async fn run_case(
    node: &Node,
    bin: &Binaries,
    case: Case,
    settings: &TrafficSettings,
) -> anyhow::Result<TrafficRow> {
    let strategy = case.strategy;
    let world = World::start().await?;
    let server = Server::start(node, bin, strategy).await?;
    let mut counts = Counts::default();
    let mut gone = Vec::new();
    let mut with_loss = 0;
    let mut failure = None;
    for n in 0..settings.deletions {
        match one_deletion(node, case, settings, &world, n).await {
            Ok((c, ms)) => {
                if c.inbound_failed + c.outbound_failed + c.lines_lost > 0 {
                    with_loss += 1;
                }
                counts.add(&c);
                gone.push(ms);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    server.stop().await;
    if let Some(e) = failure {
        return Err(e.context(case.label()));
    }
    let summary = super::summary::summarize(&gone);
    Ok(TrafficRow {
        strategy: case.label(),
        kill: case.kill.name(),
        deletions: gone.len(),
        counts,
        deletions_with_loss: with_loss,
        pod_gone_p50_ms: summary.map_or(0.0, |s| s.p50_ms.round()),
        pod_gone_max_ms: summary.map_or(0.0, |s| s.max_ms.round()),
    })
}

/// Imports the traffic image into `node` (built from the host's haproxy and rsyslog).
pub fn prepare(node: &Node) -> anyhow::Result<()> {
    crate::node::traffic_image_available()?;
    node.import_traffic_image()
        .context("importing the traffic image (haproxy, rsyslog)")
}

/// Every case, one after the other on `node`.
pub async fn measure(
    node: &Node,
    bin: &Binaries,
    cases: &[Case],
    settings: &TrafficSettings,
) -> anyhow::Result<TrafficSection> {
    prepare(node)?;
    let mut rows = Vec::new();
    for case in cases {
        progress!(
            "traffic: {} pods under load, {}",
            settings.deletions,
            case.label()
        );
        rows.push(run_case(node, bin, *case, settings).await?);
    }
    let withdrawal_settings = withdrawal::WithdrawalSettings {
        deletions: settings.deletions,
        rate: settings.rate,
        grace_seconds: settings.grace_seconds,
        ..withdrawal::WithdrawalSettings::default()
    };
    let withdrawal = withdrawal::measure(
        node,
        bin,
        &withdrawal::WithdrawalCase::ALL,
        &withdrawal_settings,
        &mut |case| {
            progress!(
                "traffic: a replica deleted {} times, controller {} ms, app {}, {}",
                settings.deletions,
                case.controller_lag_ms,
                case.app.name(),
                case.wait.name()
            );
        },
    )
    .await?;
    Ok(TrafficSection {
        settings: *settings,
        rows,
        withdrawal: Some(withdrawal),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentence_counts_both_ways() {
        let c = Counts {
            inbound: 50,
            inbound_failed: 49,
            outbound: 20,
            outbound_failed: 20,
            lines: 23,
            lines_lost: 20,
        };
        assert_eq!(
            c.sentence(),
            "69 of 70 requests failed (49 of 50 inbound, 20 of 20 outbound), 20 of 23 log lines lost"
        );
    }
}
