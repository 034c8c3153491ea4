//! Part 6 (`--only traffic`): what users keep through a pod's deletion, with real parts. Each
//! pod (testbed/pods/traffic.yaml) is an app that drains on TERM (it keeps serving and makes
//! outbound calls through its proxy), a real proxy (haproxy, which stops at once on TERM) and a
//! real log shipper (rsyslog, forwarding the app's log file to a sink on the host). While the
//! pod is deleted, clients still routed to it (its endpoint being removed) send a steady rate
//! of requests through the proxy. The same pods and load run under each way of ordering the
//! sidecars' exits; per strategy the report counts inbound and outbound requests failed, the
//! app's log lines the sink never got, and the time from the deletion to the pod gone.

mod net;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::baseline::{KruiseDaemon, KRUISE_SCAN};
use super::{start_agent, Binaries};
use crate::kubelet::{DeleteOptions, Deletion, RunOptions, RunningPod};
use crate::node::Node;

pub use net::Load;

const TRAFFIC_POD: &str = include_str!("../../../pods/traffic.yaml");
const APP: &str = "app";
const PROXY: &str = "proxy";
const SHIPPER: &str = "shipper";
/// How long a pod's containers and its proxy's and shipper's paths may take to come up.
const UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the sink may lag behind the pod's end for the lines it will get at all.
const SINK_LAG: Duration = Duration::from_secs(2);

/// How a strategy orders the sidecars' exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The kubelet's default: every container is sent TERM at once.
    None,
    /// exitorder: the sidecars' preStop waits, the agent answers when the app has exited.
    Exitorder,
    /// The OpenKruise proposal: the same waits, answered by a daemon that looks once a second.
    Kruise,
    /// Linkerd's `config.alpha.linkerd.io/proxy-wait-before-exit-seconds`: a fixed preStop
    /// sleep of this many seconds (on the shipper too, to be fair to it).
    LinkerdWait(u64),
    /// Native sidecars (KEP-753): the proxy and the shipper as restartable init containers,
    /// stopped after the app; the proxy's preStop drains it at t = 0 (haproxy's soft stop,
    /// as Istio's native mode drains Envoy in its preStop).
    Native,
}

impl Strategy {
    /// Every strategy the benchmark compares, in the table's order.
    pub const ALL: [Strategy; 6] = [
        Strategy::None,
        Strategy::Exitorder,
        Strategy::Kruise,
        Strategy::LinkerdWait(1),
        Strategy::LinkerdWait(5),
        Strategy::Native,
    ];

    pub fn name(self) -> String {
        match self {
            Strategy::None => "none (kubelet default)".to_owned(),
            Strategy::Exitorder => "exitorder".to_owned(),
            Strategy::Kruise => "Kruise-style 1 s daemon".to_owned(),
            Strategy::LinkerdWait(s) => format!("Linkerd wait-before-exit {s} s"),
            Strategy::Native => "native sidecars, proxy drained in preStop".to_owned(),
        }
    }

    fn tag(self) -> String {
        match self {
            Strategy::None => "none".to_owned(),
            Strategy::Exitorder => "exitorder".to_owned(),
            Strategy::Kruise => "kruise".to_owned(),
            Strategy::LinkerdWait(s) => format!("linkerd{s}"),
            Strategy::Native => "native".to_owned(),
        }
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
}

impl TrafficSection {
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let s = &self.settings;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\nTraffic through pod deletion: {} deletions per strategy; each pod: an app that drains on TERM \
             (serves, and makes {} outbound calls through the proxy), haproxy, rsyslog shipping the app's log; \
             {} requests/s through the proxy for {} ms after each deletion began; grace {} s.",
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
    logs: tempfile::TempDir,
    stop: CancellationToken,
}

impl World {
    async fn start() -> anyhow::Result<World> {
        let stop = CancellationToken::new();
        let upstream = net::upstream(stop.clone()).await?;
        let sink = net::Sink::default();
        let sink_port = sink.start(stop.clone()).await?;
        let logs = tempfile::Builder::new()
            .prefix("eo-traffic-")
            .tempdir()
            .context("a directory for the apps' logs")?;
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

fn set_env(container: &mut serde_json::Value, name: &str, value: String) {
    if let Some(env) = container["env"].as_array_mut() {
        for e in env.iter_mut() {
            if e["name"] == name {
                e["value"] = serde_json::Value::String(value);
                return;
            }
        }
        env.push(serde_json::json!({ "name": name, "value": value }));
    }
}

/// The ports one pod listens on.
struct Ports {
    app: u16,
    inbound: u16,
    outbound: u16,
}

/// The pod named `name` under `strategy`, its app logging into `log_dir`.
fn traffic_pod(
    name: &str,
    strategy: Strategy,
    settings: &TrafficSettings,
    ports: &Ports,
    world: &World,
    log_dir: &Path,
) -> anyhow::Result<serde_json::Value> {
    let mut pod = crate::kubelet::pod_from_yaml(TRAFFIC_POD)?;
    pod["metadata"]["name"] = serde_json::Value::String(name.to_owned());
    pod["spec"]["terminationGracePeriodSeconds"] = serde_json::json!(settings.grace_seconds);
    pod["spec"]["volumes"][0]["hostPath"]["path"] =
        serde_json::Value::String(log_dir.display().to_string());
    {
        let containers = pod["spec"]["containers"]
            .as_array_mut()
            .ok_or_else(|| anyhow!("traffic.yaml has no containers"))?;
        for c in containers.iter_mut() {
            let port = |p: u16| p.to_string();
            match c["name"].as_str() {
                Some(APP) => {
                    set_env(c, "POD", name.to_owned());
                    set_env(c, "APP_PORT", port(ports.app));
                    set_env(c, "OUT_PORT", port(ports.outbound));
                    set_env(c, "CALLS", settings.app_calls.to_string());
                }
                Some(PROXY) => {
                    set_env(c, "APP_PORT", port(ports.app));
                    set_env(c, "IN_PORT", port(ports.inbound));
                    set_env(c, "OUT_PORT", port(ports.outbound));
                    set_env(c, "UP_PORT", port(world.upstream));
                }
                Some(SHIPPER) => set_env(c, "SINK_PORT", port(world.sink_port)),
                _ => {}
            }
        }
    }
    apply(&mut pod, strategy, settings)?;
    Ok(pod)
}

/// `pod` as `strategy` has it.
fn apply(
    pod: &mut serde_json::Value,
    strategy: Strategy,
    settings: &TrafficSettings,
) -> anyhow::Result<()> {
    let sidecars = [PROXY, SHIPPER];
    let containers = pod["spec"]["containers"]
        .as_array_mut()
        .ok_or_else(|| anyhow!("traffic.yaml has no containers"))?;
    match strategy {
        Strategy::None => {}
        Strategy::Exitorder | Strategy::Kruise => {
            // As the exitorder webhook leaves a pod in hostPath mode (testbed/pods/bench.yaml).
            let timeout = format!("{}s", settings.grace_seconds.saturating_sub(5).max(1));
            for c in containers.iter_mut() {
                let Some(name) = c["name"].as_str().map(str::to_owned) else {
                    continue;
                };
                if !sidecars.contains(&name.as_str()) {
                    continue;
                }
                if let Some(env) = c["env"].as_array_mut() {
                    env.push(serde_json::json!({
                        "name": "POD_UID",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                    }));
                    if strategy == Strategy::Kruise {
                        // The proposal's daemon writes no presence file: wait for its answer.
                        env.push(serde_json::json!({"name": "EXITORDER_PRESENCE", "value": "0"}));
                    }
                }
                let mounts = c["volumeMounts"].as_array_mut();
                let share = serde_json::json!({
                    "name": "exitorder",
                    "mountPath": "/var/run/exitorder",
                    "subPathExpr": format!("pods/$(POD_UID)/{name}"),
                });
                let bin = serde_json::json!({
                    "name": "exitorder-bin",
                    "mountPath": "/var/run/exitorder-bin",
                    "readOnly": true,
                });
                match mounts {
                    Some(m) => m.extend([share, bin]),
                    None => c["volumeMounts"] = serde_json::json!([share, bin]),
                }
                c["lifecycle"] = serde_json::json!({"preStop": {"exec": {"command": [
                    "/var/run/exitorder-bin/exitorder-entrypoint", "wait", "--timeout", timeout,
                ]}}});
            }
            pod["metadata"]["annotations"] = serde_json::json!({
                "exitorder.io/container-exit-priority": r#"{"proxy": 1, "shipper": 1}"#,
            });
            if let Some(volumes) = pod["spec"]["volumes"].as_array_mut() {
                volumes.push(serde_json::json!({
                    "name": "exitorder",
                    "hostPath": {"path": "/var/lib/exitorder", "type": "Directory"},
                }));
                volumes.push(serde_json::json!({
                    "name": "exitorder-bin",
                    "hostPath": {"path": "/var/lib/exitorder-bin", "type": "Directory"},
                }));
            }
        }
        Strategy::LinkerdWait(seconds) => {
            for c in containers.iter_mut() {
                if c["name"].as_str().is_some_and(|n| sidecars.contains(&n)) {
                    c["lifecycle"] = serde_json::json!({"preStop": {"exec": {"command": [
                        "sleep", seconds.to_string(),
                    ]}}});
                }
            }
        }
        Strategy::Native => {
            let mut init = Vec::new();
            containers.retain(|c| {
                let sidecar = c["name"].as_str().is_some_and(|n| sidecars.contains(&n));
                if sidecar {
                    init.push(c.clone());
                }
                !sidecar
            });
            for c in &mut init {
                c["restartPolicy"] = serde_json::json!("Always");
                if c["name"] == PROXY {
                    // haproxy's soft stop: it closes its listeners and leaves once its
                    // connections are done, as Envoy's drain does.
                    c["lifecycle"] = serde_json::json!({"preStop": {"exec": {"command": [
                        "kill", "-USR1", "1",
                    ]}}});
                }
            }
            pod["spec"]["initContainers"] = serde_json::Value::Array(init);
        }
    }
    Ok(())
}

/// Waits until `check` holds, up to `within`.
async fn until<F, Fut>(what: &str, within: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(anyhow!("{what}: not within {within:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
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
    strategy: Strategy,
    settings: &TrafficSettings,
    world: &World,
    n: usize,
) -> anyhow::Result<(Counts, f64)> {
    let name = format!("traffic-{}-{n}", strategy.tag());
    let log_dir = world.logs.path().join(&name);
    std::fs::create_dir_all(&log_dir).with_context(|| format!("{}", log_dir.display()))?;
    let ports = Ports {
        app: net::free_port()?,
        inbound: net::free_port()?,
        outbound: net::free_port()?,
    };
    let pod = traffic_pod(&name, strategy, settings, &ports, world, &log_dir)?;
    let running = bring_up(node, &pod, &name, &ports, world).await?;
    let lag = Duration::from_millis(settings.endpoint_lag_ms);
    let (load, deletion) = tokio::join!(
        net::load(ports.inbound, settings.rate, lag),
        running.delete_with(DeleteOptions {
            probe_exit_files: false,
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
    let world = World::start().await?;
    let server = Server::start(node, bin, strategy).await?;
    let mut counts = Counts::default();
    let mut gone = Vec::new();
    let mut with_loss = 0;
    let mut failure = None;
    for n in 0..settings.deletions {
        match one_deletion(node, strategy, settings, &world, n).await {
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
        return Err(e.context(strategy.name()));
    }
    let summary = super::summary::summarize(&gone);
    Ok(TrafficRow {
        strategy: strategy.name(),
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

/// Every strategy, one after the other on `node`.
pub async fn measure(
    node: &Node,
    bin: &Binaries,
    strategies: &[Strategy],
    settings: &TrafficSettings,
) -> anyhow::Result<TrafficSection> {
    prepare(node)?;
    let mut rows = Vec::new();
    for s in strategies {
        progress!(
            "traffic: {} deletions under load, {}",
            settings.deletions,
            s.name()
        );
        rows.push(run_strategy(node, bin, *s, settings).await?);
    }
    Ok(TrafficSection {
        settings: *settings,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(strategy: Strategy) -> serde_json::Value {
        let mut pod = crate::kubelet::pod_from_yaml(TRAFFIC_POD).expect("traffic.yaml");
        apply(&mut pod, strategy, &TrafficSettings::default()).expect("apply");
        pod
    }

    fn names(v: &serde_json::Value) -> Vec<&str> {
        v.as_array()
            .map(|a| a.iter().filter_map(|c| c["name"].as_str()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn each_strategy_shapes_the_same_pod() {
        let none = pod(Strategy::None);
        assert_eq!(names(&none["spec"]["containers"]), [APP, PROXY, SHIPPER]);
        assert!(none["spec"]["containers"][1]["lifecycle"].is_null());

        let ordered = pod(Strategy::Exitorder);
        let proxy = &ordered["spec"]["containers"][1];
        assert_eq!(
            proxy["lifecycle"]["preStop"]["exec"]["command"][3], "25s",
            "{proxy}"
        );
        assert!(
            ordered["metadata"]["annotations"]["exitorder.io/container-exit-priority"]
                .as_str()
                .is_some_and(|a| a.contains("shipper"))
        );
        assert!(!ordered.to_string().contains("EXITORDER_PRESENCE"));
        assert!(pod(Strategy::Kruise)
            .to_string()
            .contains("EXITORDER_PRESENCE"));

        let linkerd = pod(Strategy::LinkerdWait(5));
        assert_eq!(
            linkerd["spec"]["containers"][2]["lifecycle"]["preStop"]["exec"]["command"],
            serde_json::json!(["sleep", "5"])
        );

        let native = pod(Strategy::Native);
        assert_eq!(names(&native["spec"]["containers"]), [APP]);
        assert_eq!(names(&native["spec"]["initContainers"]), [PROXY, SHIPPER]);
        assert_eq!(
            native["spec"]["initContainers"][0]["restartPolicy"],
            "Always"
        );
        assert_eq!(
            native["spec"]["initContainers"][0]["lifecycle"]["preStop"]["exec"]["command"],
            serde_json::json!(["kill", "-USR1", "1"])
        );
    }

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
