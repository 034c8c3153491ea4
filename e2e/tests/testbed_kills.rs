//! The test bed's kubelet plays the kubelet's own kills on a real containerd and tells a fake
//! API server what the real kubelet tells it: the kill's Event before anything is killed, a
//! Killing Event per container before its preStop hook, the pod's phase `Running` until every
//! container stopped, then the kill's final status. No agent runs: these check the test bed
//! the agent's tests stand on.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use exitorder_e2e::fakeapi::{FakeApi, RequestKind, ServedApi};
use exitorder_e2e::support;
use exitorder_testbed::kubelet::api::{self, reasons};
use exitorder_testbed::kubelet::RunOptions;
use exitorder_testbed::{
    ApiLog, DeleteOptions, Deletion, EventType, Kill, Reported, RunningPod, What, BUSYBOX_IMAGE,
};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::{json, Value};

const NODE: &str = "kills-node";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A container that leaves at once on TERM, its preStop hook a quick exec.
fn container(name: &str) -> Value {
    json!({
        "name": name,
        "image": "busybox:1.36",
        "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"],
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo bye"]}}},
    })
}

fn pod(name: &str, containers: Vec<Value>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 30,
            "containers": containers,
        },
    })
}

/// A node, the fake API server (its kubelet's sink, behind a log of what it was told).
struct KillBed {
    node: exitorder_testbed::Node,
    served: ServedApi,
    log: Arc<ApiLog>,
}

impl KillBed {
    async fn start() -> Option<KillBed> {
        let node = support::node_or_skip().await?;
        let served = FakeApi::for_node(NODE).serve();
        let log = Arc::new(ApiLog::forwarding_to(Arc::new(served.api.clone())));
        Some(KillBed { node, served, log })
    }

    fn api(&self) -> &FakeApi {
        &self.served.api
    }

    /// Runs `pod`, its sink the fake API server, which has it as scheduled here and running.
    async fn run(&self, pod: &Value) -> RunningPod {
        let opts = RunOptions {
            api: Some(self.log.clone()),
            ..Default::default()
        };
        let running = self
            .node
            .run_pod(pod, &opts)
            .await
            .unwrap_or_else(|e| panic!("run pod: {e}"));
        self.api().apply(support::api_pod_of(pod, &running, NODE));
        running
    }
}

/// When `pred` first holds of what the log was told, and its place.
fn told(log: &[(SystemTime, Reported)], pred: impl Fn(&Reported) -> bool) -> (usize, SystemTime) {
    log.iter()
        .enumerate()
        .find(|(_, (_, r))| pred(r))
        .map(|(i, (at, _))| (i, *at))
        .unwrap_or_else(|| panic!("never told; the log: {log:#?}"))
}

fn event_is(r: &Reported, reason: &str, message: &str) -> bool {
    matches!(r, Reported::Event { event, .. } if event.reason == reason && event.message == message)
}

fn ns_of(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn prestop_started(d: &Deletion, name: &str) -> i64 {
    d.container(name)
        .and_then(|c| c.prestop.as_ref())
        .map(|h| h.started_ns)
        .unwrap_or_else(|| panic!("{name} ran no preStop:\n{}", d.describe()))
}

#[tokio::test]
async fn a_hard_eviction_is_told_first_and_its_status_last() {
    let Some(bed) = KillBed::start().await else {
        return;
    };
    let running = bed
        .run(&pod("evicted", vec![container("app"), container("proxy")]))
        .await;
    running
        .wait_ready(secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let uid = running.uid().to_owned();
    let kill = Kill::Eviction {
        hard: true,
        max_pod_grace_seconds: 0,
    };
    let d = running
        .delete_with(DeleteOptions::kubelet(kill))
        .await
        .unwrap_or_else(|e| panic!("evict: {e}"));
    eprintln!("{}", d.describe());
    assert_eq!(d.kill, kill);
    // immediateEvictionGracePeriodSeconds, raised to 2 s for the stop after the preStop.
    assert_eq!(d.grace_seconds, 1);
    assert!(d.containers.iter().all(|c| c.stop_timeout_secs == 2));

    let log = bed.log.seen();
    let evicted = api::memory_pressure_message();
    let (evicted_at, evicted_time) = told(&log, |r| event_is(r, reasons::EVICTED, &evicted));
    for name in ["app", "proxy"] {
        let stopping = api::stopping_container(name);
        let (i, at) = told(&log, |r| event_is(r, reasons::KILLING, &stopping));
        assert!(evicted_at < i && evicted_time <= at, "{log:#?}");
        assert!(ns_of(at) <= prestop_started(&d, name), "{}", d.describe());
        let Reported::Event { event, .. } = &log[i].1 else {
            unreachable!("told() found an Event");
        };
        assert_eq!(
            event.field_path.as_deref(),
            Some(format!("spec.containers{{{name}}}").as_str())
        );
        assert_eq!(event.kind, EventType::Normal);
    }

    // Running all through the kill, Failed only once every container had exited.
    let statuses = bed.log.statuses();
    let last_exit = d
        .containers
        .iter()
        .map(|c| c.finished_at_ns)
        .max()
        .expect("containers");
    let (terminal_at, terminal) = statuses
        .iter()
        .find(|(_, s)| s.is_terminal())
        .unwrap_or_else(|| panic!("no terminal status: {statuses:#?}"));
    assert!(ns_of(*terminal_at) >= last_exit, "{statuses:#?}");
    assert!(statuses
        .iter()
        .filter(|(at, _)| at < terminal_at)
        .all(|(_, s)| s.phase == "Running" && s.reason.is_none()));
    assert_eq!(
        Some(terminal),
        kill.terminal_status().as_ref(),
        "{statuses:#?}"
    );

    // What the API server has: the pod Failed (Evicted) with its DisruptionTarget, and the
    // Events as a client lists them.
    let api_pod = bed.api().pod(&uid).expect("the pod in the API");
    assert_eq!(api_pod["status"]["phase"], "Failed");
    assert_eq!(api_pod["status"]["reason"], "Evicted");
    let conditions = api_pod["status"]["conditions"]
        .as_array()
        .expect("conditions");
    assert!(conditions.iter().any(|c| c["type"] == "DisruptionTarget"
        && c["status"] == "True"
        && c["reason"] == "TerminationByKubelet"));
    let events: Api<Event> = Api::namespaced(support::api_client(&bed.served), "default");
    let by_uid = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
    let listed = events.list(&by_uid).await.expect("list the pod's Events");
    assert_eq!(listed.items.len(), 3, "{:#?}", listed.items);
    let evicted_ev = listed
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("Evicted"))
        .expect("the Evicted Event");
    assert_eq!(evicted_ev.type_.as_deref(), Some("Warning"));
    let source = evicted_ev.source.as_ref().expect("its source");
    assert_eq!(source.component.as_deref(), Some("kubelet"));
    assert_eq!(source.host.as_deref(), Some(NODE));
    let killing = events
        .list(
            &by_uid
                .clone()
                .fields(&format!("involvedObject.uid={uid},reason=Killing")),
        )
        .await
        .expect("list the Killing Events");
    assert_eq!(killing.items.len(), 2, "{:#?}", killing.items);
    assert_eq!(bed.api().request_count(RequestKind::EventList), 2);
}

#[tokio::test]
async fn a_liveness_kill_is_told_before_its_prestop() {
    let Some(bed) = KillBed::start().await else {
        return;
    };
    // Alive for 2 s after each start, then failing its probe: killed with the probe's own
    // grace period, and started again.
    let mut app = container("app");
    app["command"] = json!(["sh", "-c",
        "touch /tmp/alive; (sleep 2; rm /tmp/alive) & trap 'exit 0' TERM; while true; do sleep 0.1; done"]);
    app["livenessProbe"] = json!({
        "exec": {"command": ["cat", "/tmp/alive"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
        "terminationGracePeriodSeconds": 5,
    });
    let running = bed.run(&pod("unwell", vec![app, container("proxy")])).await;
    let restarted = running
        .wait_for("app restarted", secs(30), |s| {
            s.container("app")
                .is_some_and(|c| c.attempt >= 1 && c.running)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let message = api::liveness_failed("app", true);
    assert_eq!(
        message,
        "Container app failed liveness probe, will be restarted"
    );
    let log = bed.log.seen();
    let (i, told_at) = told(&log, |r| event_is(r, reasons::KILLING, &message));
    let Reported::Event { event, .. } = &log[i].1 else {
        unreachable!("told() found an Event");
    };
    assert_eq!(event.field_path.as_deref(), Some("spec.containers{app}"));
    // Told, and so stored, before the first attempt's preStop hook began.
    let timeline = &restarted.timeline;
    let prestop = timeline
        .first("app", |w| matches!(w, What::PreStopStarted { .. }))
        .unwrap_or_else(|| panic!("no preStop:\n{}", timeline.render(0)));
    assert!(ns_of(told_at) <= prestop.at_ns, "{}", timeline.render(0));
    let stored = bed.api().kubelet_events();
    assert!(
        stored.iter().any(|e| e["message"] == message.as_str()
            && e["involvedObject"]["fieldPath"] == "spec.containers{app}"
            && e["source"]["host"] == NODE),
        "{stored:#?}"
    );
    // The probe's terminationGracePeriodSeconds, not the pod's 30.
    assert!(
        timeline
            .first("app", |w| matches!(w, What::Term { grace_seconds: 5 }))
            .is_some(),
        "{}",
        timeline.render(0)
    );
    // The proxy was not touched, and the pod stayed Running.
    assert!(!stored
        .iter()
        .any(|e| e["involvedObject"]["fieldPath"] == "spec.containers{proxy}"));
    assert!(bed.log.statuses().iter().all(|(_, s)| s.phase == "Running"));
    running.delete().await.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn an_image_update_restarts_the_container_with_its_prestop() {
    let Some(bed) = KillBed::start().await else {
        return;
    };
    let running = bed
        .run(&pod("updated", vec![container("app"), container("proxy")]))
        .await;
    running
        .wait_ready(secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    running
        .update_image("app", BUSYBOX_IMAGE)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let s = running
        .wait_for("app restarted with the new image", secs(40), |s| {
            s.container("app")
                .is_some_and(|c| c.attempt == 1 && c.running)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let message = api::definition_changed("app");
    let log = bed.log.seen();
    let (_, told_at) = told(&log, |r| event_is(r, reasons::KILLING, &message));
    let prestop = s
        .timeline
        .first("app", |w| matches!(w, What::PreStopStarted { .. }))
        .unwrap_or_else(|| panic!("no preStop:\n{}", s.timeline.render(0)));
    assert!(ns_of(told_at) <= prestop.at_ns);
    assert_eq!(
        s.container("app").map(|c| c.image.as_str()),
        Some(BUSYBOX_IMAGE)
    );
    assert_eq!(s.container("proxy").map(|c| c.attempt), Some(0));
    // Not in crash-loop back-off: started again at once.
    assert!(s.timeline.events.iter().any(|e| e.what
        == What::Restarting {
            attempt: 1,
            after_ms: 0
        }));
    running.delete().await.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn a_node_shutdown_and_a_silent_kill_say_what_the_kubelet_says() {
    let Some(bed) = KillBed::start().await else {
        return;
    };
    let shut = bed.run(&pod("shut", vec![container("app")])).await;
    let silent = bed.run(&pod("silent", vec![container("app")])).await;
    for p in [&shut, &silent] {
        p.wait_ready(secs(30))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let (shut_uid, silent_uid) = (shut.uid().to_owned(), silent.uid().to_owned());
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(support::api_client(&bed.served));
    let ready = |n: &k8s_openapi::api::core::v1::Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| (c.status.clone(), c.message.clone().unwrap_or_default()))
    };
    let before = nodes.get(NODE).await.expect("the Node");
    assert_eq!(ready(&before).map(|r| r.0).as_deref(), Some("True"));

    // shutdownGracePeriod less shutdownGracePeriodCriticalPods: 3 s, under the pod's 30.
    let kill = Kill::NodeShutdown { grace_seconds: 3 };
    let d = shut
        .delete_with(DeleteOptions::kubelet(kill))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.grace_seconds, 3);
    // The kubelet's status sync races the kills (`go m.syncNodeStatus()`): the Node says so
    // within moments, not necessarily before the pod is gone.
    let shutting = Some(("False".to_owned(), api::NODE_SHUTTING_DOWN.to_owned()));
    let end = std::time::Instant::now() + secs(10);
    let mut gets = 1;
    loop {
        gets += 1;
        let after = nodes.get(NODE).await.expect("the Node");
        if ready(&after) == shutting {
            break;
        }
        assert!(std::time::Instant::now() < end, "{:?}", ready(&after));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let stored = bed.api().kubelet_events();
    // No Event of the pod's own: its Killing ones only; the shutdown's is the Node's.
    let of_pod: Vec<&Value> = stored
        .iter()
        .filter(|e| e["involvedObject"]["uid"] == shut_uid.as_str())
        .collect();
    assert_eq!(of_pod.len(), 1, "{stored:#?}");
    assert_eq!(of_pod[0]["message"], "Stopping container app");
    assert!(stored
        .iter()
        .any(|e| e["involvedObject"]["kind"] == "Node"
            && e["reason"] == reasons::NODE_SHUTDOWN_EVENT));
    let api_pod = bed.api().pod(&shut_uid).expect("the pod in the API");
    assert_eq!(api_pod["status"]["reason"], "Terminated");
    assert_eq!(api_pod["status"]["message"], api::NODE_SHUTDOWN_MESSAGE);

    // Silent: the kill's Events all dropped; its status still written.
    let d = silent
        .delete_with(DeleteOptions::kubelet(Kill::Silent))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.grace_seconds, 30);
    assert!(!bed
        .api()
        .kubelet_events()
        .iter()
        .any(|e| e["involvedObject"]["uid"] == silent_uid.as_str()));
    let api_pod = bed.api().pod(&silent_uid).expect("the pod in the API");
    assert_eq!(api_pod["status"]["phase"], "Failed");
    assert!(api_pod["status"].get("reason").is_none());
    // The Node read by name only by this test (the agent watches it by a field selector).
    assert_eq!(bed.api().request_count(RequestKind::NodeGet), gets);
}

/// Two containers failing their liveness probes at once are killed one after the other: a
/// container's kill is done inside the pod worker's `SyncPod` (`kuberuntime_manager.go`, its
/// step 3 kills `ContainersToKill` in a plain loop), so the second one's Killing Event and
/// preStop hook come only once the first one stopped.
#[tokio::test]
async fn a_containers_kill_holds_the_pods_worker() {
    let Some(bed) = KillBed::start().await else {
        return;
    };
    let unwell = |name: &str| {
        let mut c = container(name);
        c["command"] = json!(["sh", "-c",
            "touch /tmp/alive; (sleep 2; rm /tmp/alive) & trap 'exit 0' TERM; while true; do sleep 0.1; done"]);
        c["livenessProbe"] = json!({
            "exec": {"command": ["cat", "/tmp/alive"]},
            "periodSeconds": 1,
            "failureThreshold": 1,
        });
        c["lifecycle"] = json!({"preStop": {"exec": {"command": ["sleep", "1"]}}});
        c
    };
    let running = bed
        .run(&pod("both-unwell", vec![unwell("app"), unwell("proxy")]))
        .await;
    let s = running
        .wait_for("both restarted", secs(40), |s| {
            ["app", "proxy"]
                .iter()
                .all(|n| s.container(n).is_some_and(|c| c.attempt >= 1))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let t = &s.timeline;
    let span = |name: &str| {
        let begun = t
            .first(name, |w| matches!(w, What::Killing { .. }))
            .unwrap_or_else(|| panic!("{name} not killed:\n{}", t.render(0)))
            .at_ns;
        let ended = t
            .first(name, |w| matches!(w, What::Exited { attempt: 0, .. }))
            .unwrap_or_else(|| panic!("{name} did not exit:\n{}", t.render(0)))
            .at_ns;
        (begun, ended)
    };
    let (mut first, mut second) = (span("app"), span("proxy"));
    if second.0 < first.0 {
        std::mem::swap(&mut first, &mut second);
    }
    assert!(
        second.0 >= first.1,
        "the kills overlapped:\n{}",
        t.render(0)
    );
    running.delete().await.unwrap_or_else(|e| panic!("{e}"));
}

/// An exec preStop hook still running when the grace period ends is no longer waited for,
/// and runs on (`executePreStopHook` stops waiting; the hook was started with no timeout):
/// here it writes its mark 1.5 s into a 1 s grace period, while its container ignores TERM
/// for the kubelet's 2 s minimum stop.
#[tokio::test]
async fn a_prestop_past_the_grace_period_runs_on() {
    let Some(bed) = KillBed::start().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mark = dir.path().join("mark");
    let mut c = container("app");
    c["command"] = json!(["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"]);
    c["lifecycle"] = json!({"preStop": {"exec": {"command":
        ["sh", "-c", "sleep 1.5; echo ran > /out/mark"]}}});
    c["volumeMounts"] = json!([{"name": "out", "mountPath": "/out"}]);
    let mut p = pod("slow-hook", vec![c]);
    p["spec"]["terminationGracePeriodSeconds"] = json!(1);
    p["spec"]["volumes"] =
        json!([{"name": "out", "hostPath": {"path": dir.path(), "type": "Directory"}}]);
    let running = bed.run(&p).await;
    running
        .wait_for("app running", secs(30), |s| {
            s.container("app").is_some_and(|c| c.running)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let d = running.delete().await.unwrap_or_else(|e| panic!("{e}"));
    let hook = d
        .container("app")
        .and_then(|c| c.prestop.clone())
        .unwrap_or_else(|| panic!("no preStop:\n{}", d.describe()));
    assert!(
        !hook.ok && hook.took() < Duration::from_millis(1400),
        "waited for {:?}:\n{}",
        hook.took(),
        d.describe()
    );
    assert_eq!(
        std::fs::read_to_string(&mark)
            .map(|s| s.trim().to_owned())
            .ok(),
        Some("ran".to_owned()),
        "the hook was ended at the grace limit:\n{}",
        d.describe()
    );
}
