//! The traffic benchmark's withdrawal rows: one replica of two behind a Service deleted under
//! steady load, its app told to stop with nothing first, after a fixed `sleep` preStop, or
//! once exitorder has seen its endpoints withdrawn (`exitorder.io/wait-for-endpoints`) and the
//! settle time passed. The fake API server plays the EndpointSlice controller (a pod's
//! endpoint `ready`, `serving`, `terminating`, written a lag after each pod write) and haproxy
//! on the host plays the Service's consumer, reprogrammed a propagation lag after each slice
//! change; the agent watches the fake API server as it watches a real one. Per row: requests
//! failed, and the time from the deletion to the pod gone.
//!
//! Parts:
//! - `balancer`: the Service's consumer: haproxy, reprogrammed through its runtime API.

mod balancer;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::net;
use crate::binaries::Binaries;
use crate::clock::until;
use crate::fakeapi::{self, FakeApi};
use crate::kubelet::api::ApiLog;
use crate::kubelet::{pod_from_yaml, DeleteOptions, RunOptions, RunningPod};
use crate::node::{AgentProcess, Node};
use balancer::{Balancer, Lag, DELETED, STAYS};

const REPLICA_POD: &str = include_str!("../../../../pods/replica.yaml");
/// The node's name, as the agent and the fake API server know it.
const NODE: &str = "bench-node";
const APP: &str = "app";
/// How long a replica may take to come up, and the consumer to route to it.
const UP_TIMEOUT: Duration = Duration::from_secs(60);
/// The EndpointSlice controller's lag while a replica comes up, and in the usual rows.
pub const CONTROLLER_LAG_MS: u64 = 100;
/// A busy controller-manager's: later than the `sleep` preStop.
pub const SLOW_CONTROLLER_LAG_MS: u64 = 6_000;
/// How long a draining app keeps serving after TERM.
const DRAIN_SECONDS: u64 = 3;

/// What holds the app's TERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Nothing: the app gets TERM at the deletion.
    Nothing,
    /// The kubelet's `sleep` preStop action, this many seconds.
    Sleep(u64),
    /// exitorder's withdrawal wait, injected by the webhook, its settle time the default.
    Endpoints,
}

impl Wait {
    pub fn name(self) -> String {
        match self {
            Wait::Nothing => "none".to_owned(),
            Wait::Sleep(s) => format!("sleep {s} s preStop"),
            Wait::Endpoints => "exitorder endpoints first".to_owned(),
        }
    }
}

/// How the app stops on TERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum App {
    /// It stops accepting at once (the common case).
    StopsOnTerm,
    /// It keeps serving this many seconds, then exits.
    Drains(u64),
}

impl App {
    pub fn name(self) -> String {
        match self {
            App::StopsOnTerm => "stops on TERM".to_owned(),
            App::Drains(s) => format!("drains {s} s"),
        }
    }

    fn drain_seconds(self) -> u64 {
        match self {
            App::StopsOnTerm => 0,
            App::Drains(s) => s,
        }
    }
}

/// One row: the wait, the app and the controller's lag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WithdrawalCase {
    pub wait: Wait,
    pub app: App,
    pub controller_lag_ms: u64,
}

impl WithdrawalCase {
    pub const fn new(wait: Wait, app: App, controller_lag_ms: u64) -> WithdrawalCase {
        WithdrawalCase {
            wait,
            app,
            controller_lag_ms,
        }
    }

    /// Every row, in the table's order.
    pub const ALL: [WithdrawalCase; 9] = [
        WithdrawalCase::new(Wait::Nothing, App::StopsOnTerm, CONTROLLER_LAG_MS),
        WithdrawalCase::new(Wait::Sleep(5), App::StopsOnTerm, CONTROLLER_LAG_MS),
        WithdrawalCase::new(Wait::Endpoints, App::StopsOnTerm, CONTROLLER_LAG_MS),
        WithdrawalCase::new(Wait::Nothing, App::Drains(DRAIN_SECONDS), CONTROLLER_LAG_MS),
        WithdrawalCase::new(
            Wait::Sleep(5),
            App::Drains(DRAIN_SECONDS),
            CONTROLLER_LAG_MS,
        ),
        WithdrawalCase::new(
            Wait::Endpoints,
            App::Drains(DRAIN_SECONDS),
            CONTROLLER_LAG_MS,
        ),
        WithdrawalCase::new(Wait::Nothing, App::StopsOnTerm, SLOW_CONTROLLER_LAG_MS),
        WithdrawalCase::new(Wait::Sleep(5), App::StopsOnTerm, SLOW_CONTROLLER_LAG_MS),
        WithdrawalCase::new(Wait::Endpoints, App::StopsOnTerm, SLOW_CONTROLLER_LAG_MS),
    ];

    fn tag(&self) -> String {
        let wait = match self.wait {
            Wait::Nothing => "none".to_owned(),
            Wait::Sleep(s) => format!("sleep{s}"),
            Wait::Endpoints => "endpoints".to_owned(),
        };
        let app = match self.app {
            App::StopsOnTerm => "stops",
            App::Drains(_) => "drains",
        };
        format!("{wait}-{app}-{}", self.controller_lag_ms)
    }
}

/// The rows' knobs, fixed before any figure is taken.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WithdrawalSettings {
    pub deletions: usize,
    /// Requests a second through the consumer, from the deletion until the consumer routes
    /// no more to the replica and the replica is gone.
    pub rate: u32,
    /// The consumer reprograms this long after each slice change, ± the spread.
    pub consumer_lag_ms: u64,
    pub consumer_spread_ms: u64,
    /// exitorder's settle time (`exitorder.io/endpoints-settle`; by default its default,
    /// chosen from kube-proxy's sync, not from this benchmark).
    pub settle_ms: u64,
    pub grace_seconds: u64,
}

impl Default for WithdrawalSettings {
    fn default() -> Self {
        WithdrawalSettings {
            deletions: 5,
            rate: 50,
            consumer_lag_ms: 1000,
            consumer_spread_ms: 200,
            settle_ms: exitorder_contract::endpoints::DEFAULT_SETTLE_MS,
            grace_seconds: 30,
        }
    }
}

/// One row's figures.
#[derive(Debug, Clone, Serialize)]
pub struct WithdrawalRow {
    pub wait: String,
    pub app: String,
    pub controller_lag_ms: u64,
    pub deletions: usize,
    pub requests: usize,
    pub requests_failed: usize,
    /// Deletions with at least one failed request.
    pub deletions_with_failures: usize,
    /// Deletion -> pod gone (its sandbox removed), p50 and max.
    pub pod_gone_p50_ms: f64,
    pub pod_gone_max_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct WithdrawalSection {
    pub settings: WithdrawalSettings,
    pub rows: Vec<WithdrawalRow>,
}

impl WithdrawalSection {
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let s = &self.settings;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\nEndpoints withdrawn before the app stops: one replica of two behind a Service deleted ({} per row) \
             under {} requests/s through haproxy, which follows the EndpointSlices {} ± {} ms after each change \
             (retrying nothing); the EndpointSlice controller writes {} ms after each pod change ({} ms in the slow rows); \
             exitorder's settle time {} ms (its default); grace {} s.",
            s.deletions,
            s.rate,
            s.consumer_lag_ms,
            s.consumer_spread_ms,
            CONTROLLER_LAG_MS,
            SLOW_CONTROLLER_LAG_MS,
            s.settle_ms,
            s.grace_seconds
        );
        let _ = writeln!(
            t,
            "{:<12} {:<15} {:<28} {:>18} {:>10} {:>10}",
            "controller", "app", "wait", "requests failed", "gone p50", "gone max"
        );
        for r in &self.rows {
            let _ = writeln!(
                t,
                "{:<12} {:<15} {:<28} {:>18} {:>8.0}ms {:>8.0}ms",
                format!("{} ms", r.controller_lag_ms),
                r.app,
                r.wait,
                format!("{} of {}", r.requests_failed, r.requests),
                r.pod_gone_p50_ms,
                r.pod_gone_max_ms
            );
        }
        t
    }
}

/// The replica for `case`, serving on `port`, as its wait has it (the webhook's own
/// mutation for exitorder's).
fn replica(
    name: &str,
    case: &WithdrawalCase,
    port: u16,
    settings: &WithdrawalSettings,
) -> anyhow::Result<Value> {
    let mut pod = pod_from_yaml(REPLICA_POD)?;
    pod["metadata"]["name"] = json!(name);
    pod["spec"]["terminationGracePeriodSeconds"] = json!(settings.grace_seconds);
    let app = &mut pod["spec"]["containers"][0];
    app["env"] = json!([
        {"name": "PORT", "value": port.to_string()},
        {"name": "DRAIN_SECONDS", "value": case.app.drain_seconds().to_string()},
    ]);
    match case.wait {
        Wait::Nothing => {}
        Wait::Sleep(seconds) => {
            app["lifecycle"] = json!({"preStop": {"sleep": {"seconds": seconds}}});
        }
        Wait::Endpoints => {
            use exitorder_contract::annotation;
            pod["metadata"]["annotations"] = json!({
                annotation::INJECT: "true",
                annotation::WAIT_FOR_ENDPOINTS: "true",
                annotation::ENDPOINTS_SETTLE: format!("{}ms", settings.settle_ms),
            });
            let settings = exitorder::webhook::Settings {
                handshake_volume: exitorder::webhook::HandshakeVolume::HostPath,
                ..exitorder::webhook::Settings::default()
            };
            pod = crate::admission::admit(&pod, &settings)
                .with_context(|| format!("admitting {name}"))?
                .pod;
        }
    }
    Ok(pod)
}

/// The node's API server, its consumer, the agent watching it and the replica that stays.
struct Service {
    api: FakeApi,
    log: Arc<ApiLog>,
    balancer: Balancer,
    agent: AgentProcess,
    stays: Option<RunningPod>,
    _served: fakeapi::ServedApi,
    _kubeconfig: crate::node::dirs::DirGuard,
}

impl Service {
    async fn start(
        node: &Node,
        bin: &Binaries,
        settings: &WithdrawalSettings,
    ) -> anyhow::Result<Service> {
        let served = FakeApi::for_node(NODE).serve();
        let api = served.api.clone();
        api.set_slice_lag(Duration::from_millis(CONTROLLER_LAG_MS));
        api.add_service("default", "web", &[("app", "web")], false);
        let dir = crate::node::dirs::DirGuard::new(
            crate::node::dirs::make_temp_dir("eo-withdrawal")
                .context("a directory for the kubeconfig")?,
        );
        let kubeconfig = served.write_kubeconfig(dir.path());
        let kubeconfig = kubeconfig.display().to_string();
        let agent = crate::bench::agent::start_agent_with(
            node,
            bin,
            &[("KUBECONFIG", &kubeconfig), ("NODE_NAME", NODE)],
        )
        .await?;
        agent
            .wait_for("the agent's pod watch", Duration::from_secs(20), |l| {
                l.says("pod watch current", &[("node", NODE)])
            })
            .await?;
        let lag = Lag::new(
            Duration::from_millis(settings.consumer_lag_ms),
            Duration::from_millis(settings.consumer_spread_ms),
        );
        let balancer = Balancer::start(api.clone(), lag).await?;
        let log = Arc::new(ApiLog::forwarding_to(Arc::new(api.clone())));
        let mut service = Service {
            api,
            log,
            balancer,
            agent,
            stays: None,
            _served: served,
            _kubeconfig: dir,
        };
        let case = WithdrawalCase::new(Wait::Nothing, App::StopsOnTerm, CONTROLLER_LAG_MS);
        let (stays, _) = service
            .bring_up(node, "web-stays", &case, STAYS, settings)
            .await?;
        service.stays = Some(stays);
        Ok(service)
    }

    /// Runs the replica `name` as `server`, until the consumer routes to it; with its API pod.
    async fn bring_up(
        &self,
        node: &Node,
        name: &str,
        case: &WithdrawalCase,
        server: &'static str,
        settings: &WithdrawalSettings,
    ) -> anyhow::Result<(RunningPod, Value)> {
        let port = crate::node::free_port()?;
        let pod = replica(name, case, port, settings)?;
        let opts = RunOptions {
            force_host_network: true,
            api: Some(self.log.clone()),
            ..Default::default()
        };
        let running = node
            .run_pod(&pod, &opts)
            .await
            .with_context(|| format!("starting {name}"))?;
        running
            .wait_output(APP, "serving", UP_TIMEOUT)
            .await
            .with_context(|| format!("{name}: its app did not start"))?;
        until(&format!("{name}: serving"), UP_TIMEOUT, || {
            net::get_ok(port)
        })
        .await?;
        self.balancer.assign(server, running.uid(), port).await?;
        let api_pod = fakeapi::api_pod_of(&pod, &running, NODE);
        self.api.apply(api_pod.clone());
        until(
            &format!("{name}: the consumer routing to it"),
            UP_TIMEOUT,
            || {
                let routed = self.balancer.routes_to(server);
                async move { routed }
            },
        )
        .await?;
        Ok((running, api_pod))
    }

    /// One replica deleted under load: requests sent and failed, and how long it took to go.
    async fn one_deletion(
        &self,
        node: &Node,
        case: &WithdrawalCase,
        settings: &WithdrawalSettings,
        n: usize,
    ) -> anyhow::Result<(net::Load, f64)> {
        let name = format!("web-{}-{n}", case.tag());
        let (running, api_pod) = self.bring_up(node, &name, case, DELETED, settings).await?;
        self.api
            .set_slice_lag(Duration::from_millis(case.controller_lag_ms));
        let stop = CancellationToken::new();
        let grace = i64::try_from(settings.grace_seconds).unwrap_or(i64::MAX);
        let deleted = async {
            self.api.apply(fakeapi::deleting(api_pod.clone(), grace));
            let deletion = running
                .delete_with(DeleteOptions {
                    probe_exit_files: false,
                    ..DeleteOptions::default()
                })
                .await
                .with_context(|| format!("deleting {name}"));
            // Requests go on until the consumer stops routing there: a gone pod still routed
            // to fails them too.
            let withdrawn = until(
                &format!("{name}: the consumer leaving it"),
                Duration::from_millis(case.controller_lag_ms) + UP_TIMEOUT,
                || {
                    let routed = self.balancer.routes_to(DELETED);
                    async move { !routed }
                },
            )
            .await;
            stop.cancel();
            withdrawn.and(deletion)
        };
        let (load, deletion) = tokio::join!(
            net::load_until(self.balancer.port, settings.rate, stop.cancelled()),
            deleted
        );
        self.api
            .set_slice_lag(Duration::from_millis(CONTROLLER_LAG_MS));
        self.api.delete(api_pod);
        let deletion = deletion?;
        Ok((load, deletion.ms(deletion.sandbox_removed_ns)))
    }

    async fn stop(mut self) {
        if let Some(stays) = self.stays.take() {
            let _ = stays.delete_with(DeleteOptions::default()).await;
        }
        let _ = self.agent.terminate(Duration::from_secs(10)).await;
    }
}

/// Every deletion of one row.
async fn run_case(
    service: &Service,
    node: &Node,
    case: &WithdrawalCase,
    settings: &WithdrawalSettings,
) -> anyhow::Result<WithdrawalRow> {
    let mut requests = 0;
    let mut failed = 0;
    let mut with_failures = 0;
    let mut gone = Vec::new();
    for n in 0..settings.deletions {
        let (load, ms) = service.one_deletion(node, case, settings, n).await?;
        requests += load.sent;
        failed += load.failed;
        if load.failed > 0 {
            with_failures += 1;
        }
        gone.push(ms);
    }
    let summary = crate::bench::summary::summarize(&gone);
    Ok(WithdrawalRow {
        wait: case.wait.name(),
        app: case.app.name(),
        controller_lag_ms: case.controller_lag_ms,
        deletions: gone.len(),
        requests,
        requests_failed: failed,
        deletions_with_failures: with_failures,
        pod_gone_p50_ms: summary.map_or(0.0, |s| s.p50_ms.round()),
        pod_gone_max_ms: summary.map_or(0.0, |s| s.max_ms.round()),
    })
}

/// Every case of `cases`, one after the other on `node` (the traffic image imported);
/// `starting` is told of each before it runs.
pub async fn measure(
    node: &Node,
    bin: &Binaries,
    cases: &[WithdrawalCase],
    settings: &WithdrawalSettings,
    starting: &mut dyn FnMut(&WithdrawalCase),
) -> anyhow::Result<WithdrawalSection> {
    let service = Service::start(node, bin, settings).await?;
    let mut rows = Vec::new();
    let mut failure = None;
    for case in cases {
        starting(case);
        match run_case(&service, node, case, settings).await {
            Ok(row) => rows.push(row),
            Err(e) => {
                failure = Some(e.context(format!("{} {}", case.app.name(), case.wait.name())));
                break;
            }
        }
    }
    service.stop().await;
    match failure {
        Some(e) => Err(e),
        None => Ok(WithdrawalSection {
            settings: *settings,
            rows,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(wait: Wait) -> WithdrawalCase {
        WithdrawalCase::new(wait, App::Drains(3), CONTROLLER_LAG_MS)
    }

    #[test]
    fn each_wait_shapes_the_same_replica() {
        let none = replica(
            "r",
            &case(Wait::Nothing),
            8080,
            &WithdrawalSettings::default(),
        )
        .expect("replica");
        let app = &none["spec"]["containers"][0];
        assert!(app["lifecycle"].is_null());
        assert_eq!(app["env"][0]["value"], "8080");
        assert_eq!(app["env"][1]["value"], "3");
        assert_eq!(none["metadata"]["labels"]["app"], "web");

        let sleep = replica(
            "r",
            &case(Wait::Sleep(5)),
            8080,
            &WithdrawalSettings::default(),
        )
        .expect("replica");
        assert_eq!(
            sleep["spec"]["containers"][0]["lifecycle"]["preStop"],
            json!({"sleep": {"seconds": 5}})
        );

        let ours = replica(
            "r",
            &case(Wait::Endpoints),
            8080,
            &WithdrawalSettings::default(),
        )
        .expect("replica");
        let hook = ours["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let words: Vec<&str> = hook.iter().filter_map(Value::as_str).collect();
        assert!(words.contains(&"wait"), "{words:?}");
        // The settle time the settings say, not whatever the webhook's default is.
        assert!(words.contains(&"--settle=2000ms"), "{words:?}");
    }

    #[test]
    fn the_rows_compare_each_wait_under_each_lag() {
        for lag in [CONTROLLER_LAG_MS, SLOW_CONTROLLER_LAG_MS] {
            for wait in [Wait::Nothing, Wait::Sleep(5), Wait::Endpoints] {
                assert!(WithdrawalCase::ALL
                    .iter()
                    .any(|c| c.wait == wait && c.controller_lag_ms == lag));
            }
        }
        // The slow rows' controller is later than their sleep: the sleep is too short there.
        for c in WithdrawalCase::ALL {
            if let (Wait::Sleep(s), SLOW_CONTROLLER_LAG_MS) = (c.wait, c.controller_lag_ms) {
                assert!(s * 1000 < c.controller_lag_ms, "{c:?}");
            }
        }
    }
}
