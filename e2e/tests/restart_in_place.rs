//! A completing pod restarted in place (KEP-5532, `RestartAllContainers`), on the fake
//! runtime: the kubelet kills every container at once, and on a real one the agent sees the
//! app dead while the proxy still runs only by chance; here it always does. The agent runs
//! without an API server and reads the rules from the webhook's record on the sandbox.

use exitorder_e2e::fakecri;
use exitorder_e2e::rig;

use std::time::Duration;

use exitorder::cri::{ContainerEventType, ContainerState};
use exitorder::decide::restart::RestartRecord;
use exitorder_contract::annotation;
use fakecri::FakeCri;
use rig::{source_becomes, Rig, APP_UID};

/// Waits for `check`, at most 5 s.
async fn until(what: &str, check: impl Fn() -> bool) {
    exitorder_e2e::support::until(what, Duration::from_secs(5), || {
        let holds = check();
        async move { holds }
    })
    .await;
}

/// A rig whose runtime tells of every change (as the kubelet's own does) and has the Job pod
/// of `spec`: the proxy's priority 1, the webhook's record of its restart rules on the sandbox,
/// and `more` annotations. The agent, not started yet, has no API server.
fn job_pod(spec: serde_json::Value, more: &[(&str, &str)]) -> (Rig, FakeCri) {
    let spec = serde_json::from_value(spec).expect("a pod spec");
    let record = RestartRecord::of_spec(&spec)
        .to_annotation()
        .expect("a small record");
    let rig = Rig::new();
    let cri = rig.cri().clone();
    cri.with_events("cri-o", "1.30.2");
    let mut annotations = vec![
        (annotation::PRIORITY, r#"{"proxy": 1}"#),
        (annotation::RESTARTS, record.as_str()),
    ];
    annotations.extend_from_slice(more);
    cri.add_pod(APP_UID, &annotations);
    (rig, cri)
}

/// The pod's containers, running, at `attempt`: watcher, app, proxy.
fn run(cri: &FakeCri, attempt: u32) -> [String; 3] {
    ["watcher", "app", "proxy"].map(|name| {
        let id = cri.add_container(APP_UID, name, attempt, 30);
        cri.send_event(&id, ContainerEventType::ContainerStartedEvent);
        id
    })
}

/// A Job pod whose native sidecar `watcher` restarts every container when it exits 88. The
/// watcher has exited 88 and the kubelet's kill has reached the app (137, a failure its
/// policy, Never, does not retry) while the proxy still runs: the agent's first look at the
/// pod (it starts now, as one restarted mid-restart does) shows all of it at once. That is not
/// the end of the Job, and the proxy is left alone. In the pod's next run the proxy is shut
/// down once, after the app's success.
#[tokio::test]
async fn a_restart_of_every_container_is_not_the_end_of_the_job() {
    let spec = serde_json::json!({
        "restartPolicy": "Never",
        "initContainers": [{"name": "watcher", "restartPolicy": "Always", "restartPolicyRules": [
            {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}]}],
        "containers": [{"name": "app"}, {"name": "proxy"}]});
    let (mut rig, cri) = job_pod(spec, &[]);
    let [watcher, app, old_proxy] = run(&cri, 0);
    cri.exit(&watcher, 88);
    cri.exit(&app, 137);
    rig.start_agent();
    source_becomes(&rig.stats, "cri_events").await;
    let stats = rig.stats.clone();
    // Counted by the very look that would otherwise have shut the proxy down.
    until("the restart in place seen", || {
        stats.job_restarts_in_place() == 1
    })
    .await;
    assert_eq!(
        cri.stopped(),
        Vec::<String>::new(),
        "the proxy was shut down"
    );

    // The kubelet's kill reaches the proxy; every container is removed and runs again.
    cri.exit(&old_proxy, 137);
    for id in [&watcher, &app, &old_proxy] {
        cri.remove(id);
        cri.send_event(id, ContainerEventType::ContainerDeletedEvent);
    }
    let [_, app, proxy] = run(&cri, 1);
    cri.exit(&app, 0);
    until("the proxy shut down", || !cri.stopped().is_empty()).await;
    assert_eq!(cri.stopped(), [proxy], "not the new proxy, or not once");
    assert_eq!(stats.job_restarts_in_place(), 1);
    rig.stop_agent().await;
}

/// In a pod's next run a quick app can finish while the proxy's next attempt is only created
/// (seen on a real containerd: the app's `echo done` ended before the proxy started). An exec
/// reaches no process in a container not started yet: the proxy is asked over its HTTP
/// shutdown once it runs, not stopped through the runtime after a failed exec.
#[tokio::test]
async fn a_proxy_created_after_the_apps_success_is_asked_to_leave_once_it_runs() {
    let spec = serde_json::json!({
        "restartPolicy": "Never",
        "containers": [{"name": "app"}, {"name": "proxy"}]});
    let (mut rig, cri) = job_pod(
        spec,
        &[(
            annotation::SIDECAR_SHUTDOWN,
            r#"{"proxy": "http://127.0.0.1:4191/shutdown"}"#,
        )],
    );
    let app = cri.add_container(APP_UID, "app", 0, 30);
    cri.exit(&app, 0);
    let proxy = cri.add_container(APP_UID, "proxy", 0, 30);
    cri.set_state_silently(&proxy, ContainerState::ContainerCreated);
    rig.start_agent();
    source_becomes(&rig.stats, "cri_events").await;
    // The agent reads the proxy's status again and again while it waits for the start (the
    // view's own read is one).
    until("the agent waiting for the proxy to start", || {
        cri.status_calls_of(&proxy) >= 3 || !cri.execs().is_empty()
    })
    .await;
    assert_eq!(cri.execs(), Vec::new(), "the proxy was asked before it ran");
    cri.set_state_silently(&proxy, ContainerState::ContainerRunning);
    cri.send_event(&proxy, ContainerEventType::ContainerStartedEvent);
    until("the proxy asked to leave", || !cri.execs().is_empty()).await;
    assert_eq!(
        cri.execs(),
        [(proxy.clone(), ContainerState::ContainerRunning)],
        "not once, or not while it ran"
    );
    assert_eq!(
        cri.stopped(),
        Vec::<String>::new(),
        "stopped through the runtime"
    );
    rig.stop_agent().await;
}
