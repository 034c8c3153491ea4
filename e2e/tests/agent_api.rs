//! The agent with its cluster link: a real kube-rs pod watch and Events recorder against a
//! fake API server over HTTP, beside the fake CRI runtime.

use exitorder_e2e::fakeapi;
use exitorder_e2e::fakecri;
use exitorder_e2e::rig;

use std::sync::Arc;
use std::time::{Duration, Instant};

use exitorder::cluster::recorder::{REASON_ALLOWED, REASON_DEADLINE, REPORTING_CONTROLLER};
use exitorder::cri::ContainerState;
use exitorder::decide::priority::ANNOTATION;
use exitorder::decide::Reason;
use exitorder::stats::Stats;
use exitorder::{cluster, serve::openmetrics};
use fakeapi::{FakeApi, ServedApi};
use fakecri::pod_name;
use rig::*;
use serde_json::Value;
use tokio::sync::watch;

const NODE: &str = "node-a";

struct Linked {
    rig: Rig,
    api: ServedApi,
    stop: watch::Sender<bool>,
    tasks: tokio::task::JoinHandle<()>,
    app: String,
    proxy: String,
}

impl Linked {
    /// A two-container pod (app 0, proxy 1) in the runtime with `runtime_grace` seconds, and
    /// the API server saying `api_pod` about it (or nothing, when `None`).
    fn new(runtime_grace: u64, api_pod: Option<Value>) -> Linked {
        let rig = Rig::new();
        rig.cri()
            .add_pod(APP_UID, &[(ANNOTATION, r#"{"proxy":1}"#)]);
        let app = rig.cri().add_container(APP_UID, "app", 0, runtime_grace);
        let proxy = rig.cri().add_container(APP_UID, "proxy", 0, runtime_grace);
        // Running a while: the kubelet's word on a kill counts for an attempt created in an
        // earlier second than the word (see `kubelet::kills::read_word`).
        for id in [&app, &proxy] {
            rig.cri().backdate(id, Duration::from_secs(60));
        }
        let api = FakeApi::for_node(NODE).serve();
        if let Some(p) = api_pod {
            api.api.apply(p);
        }
        let (stop, _) = watch::channel(false);
        Linked {
            rig,
            api,
            stop,
            tasks: tokio::spawn(async {}),
            app,
            proxy,
        }
    }

    /// As [`Linked::running`], both containers' preStops running exitorder's entrypoint (the
    /// app's `mark`, the proxy's `wait`), as the webhook injects them; the agent judges a
    /// wait from the others' marks within `window`.
    async fn marking(window: Duration) -> Linked {
        let mut l = Linked::new(60, Some(api_pod(None)));
        l.rig.cri().set_prestop(&l.app, &entrypoint_prestop("mark"));
        l.rig
            .cri()
            .set_prestop(&l.proxy, &entrypoint_prestop("wait"));
        l.start_with(Duration::ZERO, |cfg| cfg.evidence.window = window);
        watch_state_becomes(&l.rig.stats, "up", Duration::from_secs(5)).await;
        l
    }

    /// A pod the API server shows running, not deleted; the agent started with `settle` and
    /// its pod watch current.
    async fn running(settle: Duration) -> Linked {
        let mut l = Linked::new(60, Some(api_pod(None)));
        l.start(settle);
        watch_state_becomes(&l.rig.stats, "up", Duration::from_secs(5)).await;
        l
    }

    fn start(&mut self, settle: Duration) {
        self.start_with(settle, |_| {});
    }

    fn start_with(&mut self, settle: Duration, tune: impl FnOnce(&mut exitorder::agent::Config)) {
        self.rig.stats = Arc::new(Stats::default());
        let (link, tasks) = cluster::start(
            exitorder_e2e::support::api_client(&self.api),
            NODE,
            self.rig.stats.clone(),
        );
        self.tasks = tokio::spawn(tasks.run(self.stop.subscribe()));
        self.rig.start_agent_linked(
            |cfg| {
                cfg.poll_interval = Duration::from_millis(10);
                cfg.api_settle = settle;
                tune(cfg);
            },
            Some(link),
        );
    }

    async fn stop(mut self) {
        self.rig.stop_agent().await;
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(5), &mut self.tasks)
            .await
            .expect("cluster tasks stop within their bound")
            .expect("cluster tasks");
    }

    /// The kubelet of this node records `reason`/`message` about the pod (about `container`
    /// when given), as its recorder would, dated now.
    fn kubelet_says(&self, reason: &str, message: &str, container: Option<&str>) {
        use exitorder_testbed::ApiSink as _;
        self.api.api.event(
            &exitorder_testbed::PodRef {
                uid: APP_UID.to_owned(),
                namespace: "default".to_owned(),
                name: pod_name(APP_UID),
            },
            &exitorder_testbed::KubeletEvent {
                reason: reason.to_owned(),
                kind: exitorder_testbed::EventType::Normal,
                message: message.to_owned(),
                field_path: container.map(|c| format!("spec.containers{{{c}}}")),
                at: std::time::SystemTime::now(),
            },
        );
    }

    /// Event LISTs the agent made.
    fn event_reads(&self) -> usize {
        self.api
            .api
            .requests()
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/namespaces/default/events?"))
            .count()
    }

    fn app_exits(&self) {
        self.rig
            .cri()
            .set_state(&self.app, ContainerState::ContainerExited);
    }
}

impl Linked {
    /// Asserts the proxy's wait `f` is held over `span` while the app runs, and allowed as
    /// ordered once the app exits.
    async fn held_until_app_exits(&self, f: &std::path::Path, span: Duration) {
        stays_waiting(f, span).await;
        self.app_exits();
        assert!(allowed_within(f, Duration::from_secs(2)).await);
        allows_reach(&self.rig.stats, Reason::Ordered, 1).await;
    }
}

fn api_pod(deleted: Option<(i64, i64)>) -> Value {
    fakeapi::pod(APP_UID, &pod_name(APP_UID), NODE, deleted)
}

async fn watch_state_becomes(stats: &Stats, state: &str, within: Duration) {
    let end = Instant::now() + within;
    while stats.api_watch() != state {
        assert!(
            Instant::now() < end,
            "pod watch is {} (expected {state})",
            stats.api_watch()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asserts no Event is posted over `span`.
async fn no_events_within(api: &ServedApi, span: Duration) {
    let end = Instant::now() + span;
    while Instant::now() < end {
        assert!(api.api.events().is_empty(), "{:?}", api.api.events());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn metric_value(stats: &Arc<Stats>, sample: &str) -> Option<f64> {
    openmetrics::render(stats)
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
}

fn metric(stats: &Arc<Stats>, sample: &str) -> f64 {
    metric_value(stats, sample)
        .unwrap_or_else(|| panic!("no sample {sample} in:\n{}", openmetrics::render(stats)))
}

/// Waits until the rendered sample is at least `want`.
async fn metric_reaches(stats: &Arc<Stats>, sample: &str, want: f64) {
    let end = Instant::now() + Duration::from_secs(5);
    while metric_value(stats, sample).is_none_or(|v| v < want) {
        assert!(
            Instant::now() < end,
            "{sample} never reached {want}:\n{}",
            openmetrics::render(stats)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pod_waits_is_ordered_and_tells() {
    let mut l = Linked::new(60, Some(api_pod(Some((60, 60)))));
    l.start(Duration::from_millis(250));
    watch_state_becomes(&l.rig.stats, "up", Duration::from_secs(5)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    // Longer than the settle time: a deleted pod is ordered, whatever its age.
    l.held_until_app_exits(&f, Duration::from_millis(500)).await;

    let evs = l.api.api.wait_events(1, Duration::from_secs(5)).await;
    let ev = &evs[0];
    assert_eq!(ev["reason"], REASON_ALLOWED);
    assert_eq!(ev["type"], "Normal");
    assert_eq!(ev["reportingController"], REPORTING_CONTROLLER);
    assert_eq!(ev["reportingInstance"], NODE);
    assert_eq!(ev["regarding"]["kind"], "Pod");
    assert_eq!(ev["regarding"]["uid"], APP_UID);
    assert_eq!(ev["regarding"]["name"], pod_name(APP_UID).as_str());
    assert_eq!(ev["regarding"]["fieldPath"], "spec.containers{proxy}");
    assert_eq!(ev["metadata"]["namespace"], "default");
    let note = ev["note"].as_str().unwrap_or_default();
    assert!(note.contains("container proxy"), "{note}");
    assert!(note.contains("reason ordered"), "{note}");
    assert!(note.contains("after waiting "), "{note}");
    // Counted once the API server has answered.
    metric_reaches(
        &l.rig.stats,
        "exitorder_pod_events_total{outcome=\"posted\"}",
        1.0,
    )
    .await;

    // The watch asked for this node's pods only.
    let reqs = l.api.api.requests();
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("GET /api/v1/pods?") && r.contains("spec.nodeName%3Dnode-a")),
        "{reqs:?}"
    );
    l.stop().await;
}

/// The API server's spec is what says which containers are native sidecars (no annotation on
/// the sandbox): `logs`, declared after `istio-proxy`, is stopped first by the kubelet, so it
/// never waits for it, whatever the priorities say. It still waits for the main containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_sidecars_from_the_spec_keep_the_kubelets_stop_order() {
    let mut pod = api_pod(Some((60, 60)));
    pod["metadata"]["annotations"][ANNOTATION] = r#"{"proxy":2,"istio-proxy":1,"logs":2}"#.into();
    pod["spec"]["initContainers"] = serde_json::json!([
        {"name": "istio-proxy", "image": "p", "restartPolicy": "Always"},
        {"name": "logs", "image": "l", "restartPolicy": "Always"},
    ]);
    let mut l = Linked::new(60, Some(pod));
    l.rig.cri().add_container(APP_UID, "istio-proxy", 0, 60);
    l.rig.cri().add_container(APP_UID, "logs", 0, 60);
    l.start(Duration::from_millis(250));
    watch_state_becomes(&l.rig.stats, "up", Duration::from_secs(5)).await;
    let f = l.rig.request_exit(APP_UID, "logs");
    // Waits for the app (a main container, stopped first)...
    stays_waiting(&f, Duration::from_millis(300)).await;
    l.app_exits();
    // ...and not for istio-proxy, which still runs.
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&l.rig.stats, Reason::Ordered, 1).await;
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_the_kubelet_names_is_allowed_at_once() {
    let l = Linked::running(Duration::ZERO).await;
    // kuberuntime_container.go killContainer: the Event comes before the preStop hook.
    l.kubelet_says(
        "Killing",
        "Container proxy failed liveness probe, will be restarted",
        Some("proxy"),
    );
    let f = l.rig.request_exit(APP_UID, "proxy");
    // The app still runs: only the kubelet's word for this one container can allow this.
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&l.rig.stats, Reason::NotTerminating, 1).await;
    assert_eq!(l.rig.stats.allows(Reason::Ordered), 0);
    assert_eq!(
        metric(
            &l.rig.stats,
            "exitorder_allows_by_kill_total{kill=\"liveness_restart\"}"
        ),
        1.0
    );
    // Not held, so nothing to tell.
    no_events_within(&l.api, Duration::from_millis(200)).await;
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_whose_word_comes_late_waits_only_for_it() {
    let l = Linked::running(Duration::from_millis(300)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    // The kubelet's recorder sends its Event a little after the hook began.
    stays_waiting(&f, Duration::from_millis(400)).await;
    l.kubelet_says(
        "Killing",
        "Container proxy definition changed, will be restarted",
        Some("proxy"),
    );
    // Read at 1.25 s of the wait (a deadline for a busy machine).
    assert!(allowed_within(&f, Duration::from_secs(10)).await);
    allows_reach(&l.rig.stats, Reason::NotTerminating, 1).await;
    assert_eq!(
        metric(
            &l.rig.stats,
            "exitorder_allows_by_kill_total{kill=\"definition_changed\"}"
        ),
        1.0
    );
    l.stop().await;
}

/// The kubelet's own kills keep the pod `Running` with no deletion in the API
/// (status_manager.go mergePodStatus) until every container stopped: a pod the API shows
/// staying, of which the kubelet said nothing (its Events dropped), is ordered, and the agent
/// asks a bounded number of times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_the_kubelet_said_nothing_of_stays_ordered() {
    let l = Linked::running(Duration::ZERO).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    // The agent asks (at 250 ms and 1.25 s of the wait; a deadline for a busy machine), and
    // asks no more however long the wait.
    exitorder_e2e::support::until(
        "the agent asks for the kubelet's word",
        Duration::from_secs(10),
        || std::future::ready(l.event_reads() >= 1),
    )
    .await;
    stays_waiting(&f, Duration::from_millis(2_500)).await;
    let reads = l.event_reads();
    assert!(
        (1..=2).contains(&reads),
        "{reads} reads: {:?}",
        l.api.api.requests()
    );
    l.app_exits();
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&l.rig.stats, Reason::Ordered, 1).await;
    assert_eq!(l.rig.stats.allows(Reason::NotTerminating), 0);
    assert_eq!(
        metric(
            &l.rig.stats,
            "exitorder_allows_by_kill_total{kill=\"unknown\"}"
        ),
        1.0
    );
    // No GET of the pod: the watch and one pod's Events are all the agent reads.
    assert!(
        !l.api
            .api
            .requests()
            .iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces/default/pods/")),
        "{:?}",
        l.api.api.requests()
    );
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_keeps_the_order_while_the_api_says_running() {
    let l = Linked::running(Duration::ZERO).await;
    // eviction_manager.go evictPod records Evicted before it kills; killContainer then
    // "Stopping container" for each container. A liveness word of a moment before does not
    // make this kill a restart.
    l.kubelet_says(
        "Killing",
        "Container proxy failed liveness probe, will be restarted",
        Some("proxy"),
    );
    l.kubelet_says(
        "Evicted",
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. ",
        None,
    );
    l.kubelet_says("Killing", "Stopping container app", Some("app"));
    let f = l.rig.request_exit(APP_UID, "proxy");
    l.held_until_app_exits(&f, Duration::from_millis(600)).await;
    assert_eq!(l.rig.stats.allows(Reason::NotTerminating), 0);
    assert_eq!(
        metric(
            &l.rig.stats,
            "exitorder_allows_by_kill_total{kill=\"eviction\"}"
        ),
        1.0
    );
    // Recognised at the first read: no more asked.
    assert_eq!(l.event_reads(), 1, "{:?}", l.api.api.requests());
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_seen_late_within_the_settle_time_keeps_order() {
    let l = Linked::running(Duration::from_millis(400)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    // The kubelet acted on a deletion the agent's watch delivers only now.
    l.api.api.apply(api_pod(Some((60, 60))));
    // Well past the settle time: still held, because the pod is now known to be deleted.
    l.held_until_app_exits(&f, Duration::from_millis(900)).await;
    assert_eq!(l.rig.stats.allows(Reason::NotTerminating), 0);
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_comes_from_the_pods_own_grace_period() {
    // The runtime says 60 s (the spec); this deletion asked for 6 s (`--grace-period=6`).
    let mut l = Linked::new(60, Some(api_pod(Some((6, 6)))));
    l.rig.reserve = Duration::from_secs(5);
    l.start(Duration::from_millis(250));
    watch_state_becomes(&l.rig.stats, "up", Duration::from_secs(5)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    // Released about 1 s in (6 s - 5 s reserve), with the app still running; from the
    // runtime's 60 s it would be 55 s.
    stays_waiting(&f, Duration::from_millis(500)).await;
    assert!(allowed_within(&f, Duration::from_secs(4)).await);
    allows_reach(&l.rig.stats, Reason::Deadline, 1).await;

    let evs = l.api.api.wait_events(1, Duration::from_secs(5)).await;
    assert_eq!(evs[0]["reason"], REASON_DEADLINE);
    assert_eq!(evs[0]["type"], "Warning");
    let note = evs[0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("container proxy"), "{note}");
    assert!(note.contains("still running: app"), "{note}");
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_deleted_pod_stays_ordered() {
    let l = Linked::running(Duration::ZERO).await;
    // `kubectl delete --force --grace-period=0`: the object is gone at once, but the kubelet
    // still stops the containers with the spec's grace period.
    l.api.api.delete(api_pod(Some((0, 0))));
    let f = l.rig.request_exit(APP_UID, "proxy");
    l.held_until_app_exits(&f, Duration::from_millis(400)).await;
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_api_shows_failed_stays_ordered() {
    // The kubelet sets phase Failed once a kill of its own is over (an agent that comes back
    // late still finds a sidecar waiting): a terminal phase is a pod kill, never a restart.
    let mut l = Linked::new(60, Some(fakeapi::with_phase(api_pod(None), "Failed")));
    l.start(Duration::ZERO);
    watch_state_becomes(&l.rig.stats, "up", Duration::from_secs(5)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    l.held_until_app_exits(&f, Duration::from_millis(400)).await;
    assert_eq!(l.rig.stats.allows(Reason::NotTerminating), 0);
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_watch_is_caught_by_the_kubelets_word() {
    let l = Linked::running(Duration::ZERO).await;
    // The pod is deleted; the kubelet acts on it, but the agent's watch does not deliver it.
    l.api.api.hold_watches(true);
    l.api.api.apply(api_pod(Some((60, 60))));
    l.kubelet_says("Killing", "Stopping container proxy", Some("proxy"));
    let f = l.rig.request_exit(APP_UID, "proxy");
    l.held_until_app_exits(&f, Duration::from_millis(400)).await;
    assert_eq!(l.rig.stats.allows(Reason::NotTerminating), 0);
    assert!(l.event_reads() >= 1, "{:?}", l.api.api.requests());
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_mid_drain_dates_the_wait_from_the_deletion_not_its_own_start() {
    // Deleted 19 s ago with a 20 s grace period, and the proxy already waiting when the agent
    // (re)starts: the kubelet's SIGKILL is about a second away. Dated from the agent's own
    // sight the wait would run another 19 s; the API server's record of the deletion (never
    // the exit file's times) says it is due now.
    let mut l = Linked::new(60, Some(api_pod(Some((1, 20)))));
    let f = l.rig.request_exit(APP_UID, "proxy");
    l.start(Duration::ZERO);
    assert!(allowed_within(&f, Duration::from_secs(10)).await);
    allows_reach(&l.rig.stats, Reason::Deadline, 1).await;
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_seen_late_by_the_kubelet_gets_the_full_grace_period() {
    // Deleted a minute ago (a node back from NotReady): the kubelet starts its 30 s grace
    // now, so the deadline is 30 s from the exit file, not the past deletionTimestamp.
    let mut l = Linked::new(60, Some(api_pod(Some((-60, 30)))));
    l.start(Duration::ZERO);
    watch_state_becomes(&l.rig.stats, "up", Duration::from_secs(5)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    l.held_until_app_exits(&f, Duration::from_millis(500)).await;
    assert_eq!(l.rig.stats.allows(Reason::Deadline), 0);
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_watch_after_a_good_list_backs_off() {
    let l = Linked::new(60, Some(api_pod(None)));
    l.api.api.forbid_watch(true);
    let mut l = l;
    l.start(Duration::ZERO);
    watch_state_becomes(&l.rig.stats, "down", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Backoff 0.5 s, 1 s, 2 s...: at most 4 lists in 3 s, not one every half second.
    let lists = l
        .api
        .api
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/pods?") && !r.contains("watch=true"))
        .count();
    assert!(
        (2..=4).contains(&lists),
        "{lists} lists: {:?}",
        l.api.api.requests()
    );
    assert!(
        metric(
            &l.rig.stats,
            "exitorder_api_errors_total{kind=\"watch_start\"}"
        ) >= 1.0
    );
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_down_at_start_decides_by_the_runtime_rules() {
    let mut l = Linked::new(60, Some(api_pod(None)));
    l.api.api.set_down(true);
    l.start(Duration::ZERO);
    watch_state_becomes(&l.rig.stats, "down", Duration::from_secs(5)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    // The API server would say "not deleted"; unheard, the pod is ordered.
    l.held_until_app_exits(&f, Duration::from_millis(400)).await;
    assert!(metric(&l.rig.stats, "exitorder_api_errors_total{kind=\"list\"}") >= 1.0);
    assert_eq!(
        metric(&l.rig.stats, "exitorder_api_watch{state=\"down\"}"),
        1.0
    );

    // Back up: the watch recovers on its own.
    l.api.api.set_down(false);
    watch_state_becomes(&l.rig.stats, "up", Duration::from_secs(10)).await;
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_down_mid_run_decides_by_the_runtime_rules() {
    let l = Linked::running(Duration::ZERO).await;
    l.api.api.set_down(true);
    watch_state_becomes(&l.rig.stats, "down", Duration::from_secs(5)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    // The last thing heard was "not deleted", but it is no longer current.
    l.held_until_app_exits(&f, Duration::from_millis(400)).await;
    assert_eq!(l.rig.stats.allows(Reason::NotTerminating), 0);
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_failing_never_hold_an_allow() {
    let mut l = Linked::new(60, Some(api_pod(Some((60, 60)))));
    l.start(Duration::ZERO);
    watch_state_becomes(&l.rig.stats, "up", Duration::from_secs(5)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(200)).await;
    l.api.api.set_down(true);
    l.app_exits();
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&l.rig.stats, Reason::Ordered, 1).await;
    metric_reaches(
        &l.rig.stats,
        "exitorder_pod_events_total{outcome=\"failed\"}",
        1.0,
    )
    .await;
    assert!(
        metric(
            &l.rig.stats,
            "exitorder_api_errors_total{kind=\"event_create\"}"
        ) >= 1.0
    );
    l.stop().await;
}

fn agent_options(rig: &Rig, env: Vec<(String, String)>) -> exitorder_testbed::AgentOptions {
    let binary = std::path::PathBuf::from(exitorder_e2e::support::agent_bin());
    exitorder_testbed::AgentOptions {
        cri_socket: rig.served.socket.clone(),
        share_dir: rig.share.clone(),
        // No kubelet here: the share alone is served.
        kubelet_root_dir: rig.share.join("no-kubelet"),
        // Refused (dynamically linked): these tests are about the pod watch, not the share.
        entrypoint_binary: binary.clone(),
        bin_dir: rig.share.join("bin-dir"),
        binary,
        grace_reserve: Duration::from_secs(1),
        poll_interval: Duration::from_millis(10),
        ready_timeout: Duration::from_secs(20),
        env,
        cpu: None,
    }
}

/// The `exitorder agent` binary finds the API server through KUBECONFIG and watches the pods
/// of the node NODE_NAME names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_binary_watches_pods_through_kubeconfig() {
    let l = Linked::new(60, Some(api_pod(None)));
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = l.api.write_kubeconfig(dir.path());
    let env = vec![
        ("KUBECONFIG".to_owned(), kubeconfig.display().to_string()),
        ("NODE_NAME".to_owned(), NODE.to_owned()),
    ];
    let agent = exitorder_testbed::AgentProcess::start(&agent_options(&l.rig, env))
        .await
        .expect("agent starts");
    agent
        .wait_for("pod watch current", Duration::from_secs(10), |line| {
            line.says("pod watch current", &[("node", NODE), ("pods", "1")])
        })
        .await
        .expect("the pod watch syncs");
    l.kubelet_says(
        "Killing",
        "Container proxy failed startup probe, will be restarted",
        Some("proxy"),
    );
    let f = l.rig.request_exit(APP_UID, "proxy");
    assert!(allowed_within(&f, Duration::from_secs(3)).await);
    agent
        .wait_for("the allow", Duration::from_secs(5), |line| {
            line.is("allow", &[("reason", "not_terminating")])
        })
        .await
        .expect("allowed because the kubelet restarts the proxy alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_binary_without_api_server_says_so_once() {
    let l = Linked::new(60, None);
    let env = vec![
        ("KUBECONFIG".to_owned(), String::new()),
        ("KUBERNETES_SERVICE_HOST".to_owned(), String::new()),
    ];
    let agent = exitorder_testbed::AgentProcess::start(&agent_options(&l.rig, env))
        .await
        .expect("agent starts");
    let f = l.rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(300)).await;
    l.app_exits();
    assert!(allowed_within(&f, Duration::from_secs(3)).await);
    let said = agent
        .lines()
        .iter()
        .filter(|line| {
            line.message()
                .is_some_and(|m| m.contains("runtime-only mode"))
        })
        .count();
    assert_eq!(said, 1, "{}", agent.log_tail(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_logs_to_a_pipe_without_colour_codes() {
    use std::io::{BufRead, BufReader};
    let l = Linked::new(60, None);
    let mut child = std::process::Command::new(exitorder_e2e::support::agent_bin())
        .args(["agent", "--cri-socket"])
        .arg(&l.rig.served.socket)
        .arg("--share-dir")
        .arg(&l.rig.share)
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env("EXITORDER_LOG_FORMAT", "plain")
        .env_remove("NO_COLOR")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("agent starts");
    let stderr = child.stderr.take().expect("piped");
    let lines = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let done = line.contains("agent ready");
            seen.push(line);
            if done {
                break;
            }
        }
        seen
    });
    let lines = tokio::time::timeout(Duration::from_secs(20), lines)
        .await
        .expect("agent ready within 20 s")
        .expect("reader");
    let _ = child.kill();
    let _ = child.wait();
    assert!(lines.iter().any(|l| l.contains("agent ready")), "{lines:?}");
    assert!(lines.iter().all(|l| !l.contains('\u{1b}')), "{lines:?}");
}

/// The node's own evidence (see `kubelet::evidence`): every container marks when the kubelet
/// stops it, and the others stay silent in a restart. No Event at all: the proxy restarted
/// alone is let go once the window passed, while the app keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_the_others_silence_shows_is_let_go_without_the_kubelets_word() {
    let l = Linked::marking(Duration::from_millis(500)).await;
    let asked = Instant::now();
    let f = l.rig.request_exit(APP_UID, "proxy");
    assert!(allowed_within(&f, Duration::from_secs(3)).await);
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(500),
        "allowed after {took:?}, inside the window"
    );
    allows_reach(&l.rig.stats, Reason::NotTerminating, 1).await;
    assert_eq!(
        metric(
            &l.rig.stats,
            "exitorder_allows_by_kill_total{kill=\"container_alone\"}"
        ),
        1.0
    );
    l.stop().await;
}

/// A pod kill runs every container's preStop at once: the app's mark, before or after the
/// proxy's wait, keeps the proxy ordered, with no read of the kubelet's Events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_kill_the_marks_show_stays_ordered_without_reading_events() {
    let l = Linked::marking(Duration::from_millis(500)).await;
    // The app's mark first, taken by the agent (it removes what it took)...
    l.rig.mark(APP_UID, "app");
    let mark = l.rig.dir(APP_UID, "app").join("stopping");
    exitorder_testbed::clock::until("the app's mark taken", Duration::from_secs(5), || async {
        !mark.exists()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let f = l.rig.request_exit(APP_UID, "proxy");
    l.held_until_app_exits(&f, Duration::from_millis(1_500))
        .await;
    assert_eq!(l.rig.stats.allows(Reason::NotTerminating), 0);
    assert_eq!(l.event_reads(), 0, "{:?}", l.api.api.requests());
    l.stop().await;
}

/// ...and a mark that comes after the wait, within the window, does too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_coming_after_the_wait_within_the_window_keeps_the_order() {
    let l = Linked::marking(Duration::from_secs(2)).await;
    let f = l.rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(1_000)).await;
    l.rig.mark(APP_UID, "app");
    l.held_until_app_exits(&f, Duration::from_millis(2_000))
        .await;
    assert_eq!(l.rig.stats.allows(Reason::NotTerminating), 0);
    l.stop().await;
}

/// kubernetes/kubernetes `SyncPod` kills a restarted container and starts its next attempt
/// before a pod kill queued meanwhile runs (`pod_workers.go`): the next attempt's wait comes
/// seconds after the restart's Event. That Event is the attempt before's: the new attempt's
/// wait, in a pod killed with no Event of its own, stays ordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_word_on_the_attempt_before_never_releases_the_next() {
    let l = Linked::running(Duration::ZERO).await;
    l.kubelet_says(
        "Killing",
        "Container proxy failed liveness probe, will be restarted",
        Some("proxy"),
    );
    l.rig
        .cri()
        .set_state(&l.proxy, ContainerState::ContainerExited);
    l.rig.cri().add_container(APP_UID, "proxy", 1, 60);
    let f = l.rig.request_exit(APP_UID, "proxy");
    l.held_until_app_exits(&f, Duration::from_millis(2_000))
        .await;
    assert_eq!(l.rig.stats.allows(Reason::NotTerminating), 0);
    l.stop().await;
}

/// Without an API server the node's evidence still tells a restart from a pod kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_api_server_the_marks_still_tell_a_restart() {
    let mut rig = Rig::new();
    rig.cri()
        .add_pod(APP_UID, &[(ANNOTATION, r#"{"proxy":1}"#)]);
    let app = rig.cri().add_container(APP_UID, "app", 0, 60);
    let proxy = rig.cri().add_container(APP_UID, "proxy", 0, 60);
    rig.cri().set_prestop(&app, &entrypoint_prestop("mark"));
    rig.cri().set_prestop(&proxy, &entrypoint_prestop("wait"));
    rig.start_agent_with(|cfg| {
        cfg.poll_interval = Duration::from_millis(10);
        cfg.evidence.window = Duration::from_millis(500);
    });
    let f = rig.request_exit(APP_UID, "proxy");
    assert!(allowed_within(&f, Duration::from_secs(3)).await);
    allows_reach(&rig.stats, Reason::NotTerminating, 1).await;
    // A kill of the pod: ordered.
    let f = rig.request_exit(APP_UID, "proxy");
    rig.mark(APP_UID, "app");
    stays_waiting(&f, Duration::from_millis(1_500)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&rig.stats, Reason::Ordered, 1).await;
    rig.stop_agent().await;
}

/// A pod that makes and removes its `exit` every 150 ms for 10 s (while its app runs) costs
/// the API server a bounded number of Event reads: the reads are per container attempt, per
/// pod and per node, never per wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_churning_its_exit_costs_a_bounded_number_of_reads() {
    let l = Linked::running(Duration::ZERO).await;
    let end = Instant::now() + Duration::from_secs(10);
    let mut toggles = 0;
    while Instant::now() < end {
        let f = l.rig.request_exit(APP_UID, "proxy");
        tokio::time::sleep(Duration::from_millis(75)).await;
        let _ = std::fs::remove_file(&f);
        tokio::time::sleep(Duration::from_millis(75)).await;
        toggles += 1;
    }
    let reads = l.event_reads();
    eprintln!("{toggles} toggles of exit in 10 s: {reads} Event reads");
    assert!(toggles >= 50, "{toggles} toggles");
    assert!(reads <= 3, "{reads} Event reads for {toggles} toggles");
    l.stop().await;
}
