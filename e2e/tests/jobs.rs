//! Jobs that finish, and sidecars that start first, on a real containerd: Job pods of
//! deploy/examples/, mutated by the webhook's `mutate`, run by the test bed's Pod runner with
//! the real agent. The agent learns the pods' restart policy and main containers from an API
//! server (a fake one over HTTP, fed the same pods), as it does in a cluster.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use exitorder_e2e::fakeapi;
use exitorder_e2e::support;

use std::time::Duration;

use exitorder_testbed::{manifest, AgentOptions, AgentProcess, Phase, RunningPod, What};
use fakeapi::{FakeApi, ServedApi};
use serde_json::{json, Value};
use support::{agent_bin, Bed};

const NODE: &str = "bed-node";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A node, a fake API server (unless the agent runs without one), and the agent.
struct JobBed {
    bed: Bed,
    api: Option<ServedApi>,
    _dir: tempfile::TempDir,
}

impl JobBed {
    async fn start() -> Option<JobBed> {
        JobBed::start_with(true).await
    }

    /// `with_api`: the agent watches the fake API server, fed every pod run; else it runs in
    /// runtime-only mode and reads the pods from the runtime alone.
    async fn start_with(with_api: bool) -> Option<JobBed> {
        let node = support::node_or_skip().await?;
        // The injected init container copies the entrypoint from the project's image.
        support::project_image(&node).await?;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = AgentOptions::new(agent_bin(), &node, support::static_entrypoint());
        let api = with_api.then(|| FakeApi::default().serve());
        if let Some(api) = &api {
            let kubeconfig = api.write_kubeconfig(dir.path());
            opts.env = vec![
                ("KUBECONFIG".to_owned(), kubeconfig.display().to_string()),
                ("NODE_NAME".to_owned(), NODE.to_owned()),
            ];
        }
        let agent = AgentProcess::start(&opts)
            .await
            .unwrap_or_else(|e| panic!("agent did not start: {e}"));
        Some(JobBed {
            bed: Bed {
                agent,
                agent_opts: opts,
                node,
            },
            api,
            _dir: dir,
        })
    }

    /// Runs `pod` and tells the API server about it, as scheduled to this node.
    async fn run(&self, pod: &Value) -> RunningPod {
        let opts = exitorder_testbed::kubelet::RunOptions {
            force_host_network: true,
            ..Default::default()
        };
        let running = self
            .bed
            .node
            .run_pod(pod, &opts)
            .await
            .unwrap_or_else(|e| panic!("run pod: {e}"));
        if let Some(api) = &self.api {
            api.api.apply(support::api_pod_of(pod, &running, NODE));
        }
        running
    }

    /// Runs `pod` until it completes; its status, with the agent's log on failure.
    async fn complete(&self, pod: &Value) -> (RunningPod, exitorder_testbed::PodStatus) {
        let running = self.run(pod).await;
        let status = running
            .wait_completed(secs(90))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", self.bed.agent.log_tail(30)));
        eprintln!("{}", show(&status.timeline));
        (running, status)
    }

    async fn restart_agent(&mut self) {
        self.bed
            .restart_agent()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    async fn finish(self) {
        self.bed.finish().await;
    }
}

/// The Job example's pod, injected by the webhook, its proxy on `port` (tests run at once on
/// one network: each test its own port, 24191 to 24204 but 24202, which tests/demo.rs has).
fn job_pod(port: u16, edit: impl FnOnce(&mut Value)) -> Value {
    let path = exitorder_e2e::repo().join("deploy/examples/job.yaml");
    let text = std::fs::read_to_string(&path).expect("job example");
    let text = text.replace("4191", &port.to_string());
    let docs = manifest::documents(&text).expect("YAML");
    let mut pod = manifest::pod_of(&docs[0]).expect("the Job's pod");
    edit(&mut pod);
    inject(pod)
}

/// Without the shutdown URL: the proxy is stopped through the runtime.
fn without_url(pod: &mut Value) {
    pod["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations")
        .remove("exitorder.io/sidecar-shutdown");
}

fn inject(pod: Value) -> Value {
    exitorder_e2e::support::inject_with(&pod, &exitorder::webhook::Settings::default())
}

fn show(t: &exitorder_testbed::Timeline) -> String {
    t.render(t.sorted().first().map_or(0, |e| e.at_ns))
}

fn log_count(running: &RunningPod, container: &str, needle: &str) -> usize {
    running.container_log(container).matches(needle).count()
}

fn exit_code(running: &RunningPod, container: &str) -> Option<i32> {
    running
        .status()
        .container(container)
        .and_then(|c| c.last_exit.as_ref().map(|e| e.exit_code))
}

fn finished_at(running: &RunningPod, container: &str) -> i64 {
    running
        .status()
        .container(container)
        .and_then(|c| c.last_exit.as_ref().map(|e| e.finished_at_ns))
        .unwrap_or_else(|| panic!("{container} has not exited"))
}

#[tokio::test]
async fn a_meshed_job_completes_with_every_status_zero() {
    let Some(jb) = JobBed::start().await else {
        return;
    };
    let (running, status) = jb.complete(&job_pod(24191, |_| {})).await;
    assert_eq!(
        status.phase,
        Phase::Succeeded,
        "{}",
        jb.bed.agent.log_tail(30)
    );
    assert_eq!(exit_code(&running, "app"), Some(0));
    assert_eq!(exit_code(&running, "proxy"), Some(0));
    assert!(finished_at(&running, "proxy") > finished_at(&running, "app"));
    // Through its own endpoint, once.
    assert_eq!(log_count(&running, "proxy", "shutdown requested"), 1);
    // Logged once the shutdown call returned, which may be after the pod completed.
    jb.bed
        .agent
        .wait_for("the shutdown logged", secs(10), |l| {
            l.is(
                "job_shutdown",
                &[
                    ("pod", running.uid()),
                    ("container", "proxy"),
                    ("how", "http"),
                ],
            )
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let after_ms = (finished_at(&running, "proxy") - finished_at(&running, "app")) / 1_000_000;
    eprintln!("the proxy exited {after_ms} ms after the app");
    let _ = running.delete().await;
    jb.finish().await;
}

#[tokio::test]
async fn a_sidecar_without_a_url_is_stopped_through_the_runtime() {
    let Some(jb) = JobBed::start().await else {
        return;
    };
    let pod = job_pod(24192, without_url);
    let (running, status) = jb.complete(&pod).await;
    assert_eq!(
        status.phase,
        Phase::Succeeded,
        "{}",
        jb.bed.agent.log_tail(30)
    );
    // TERM from the runtime: the proxy's trap, not its endpoint.
    assert_eq!(log_count(&running, "proxy", "shutdown requested"), 0);
    assert_eq!(log_count(&running, "proxy", "TERM: proxy exiting"), 1);
    assert_eq!(exit_code(&running, "proxy"), Some(0));
    jb.bed
        .agent
        .wait_for("the stop logged", secs(10), |l| {
            l.is("job_shutdown", &[("container", "proxy"), ("how", "stop")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = running.delete().await;
    jb.finish().await;
}

#[tokio::test]
async fn a_sidecar_that_ignores_its_shutdown_is_stopped_after_the_grace_period() {
    let Some(jb) = JobBed::start().await else {
        return;
    };
    let pod = job_pod(24198, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 2.into();
        // It answers, and runs on.
        support::edit_script(p, "proxy", "kill -TERM 1", "true");
    });
    let (running, status) = jb.complete(&pod).await;
    assert_eq!(
        status.phase,
        Phase::Succeeded,
        "{}",
        jb.bed.agent.log_tail(30)
    );
    assert_eq!(log_count(&running, "proxy", "shutdown requested"), 1);
    assert_eq!(log_count(&running, "proxy", "TERM: proxy exiting"), 1);
    assert_eq!(exit_code(&running, "proxy"), Some(0));
    jb.bed
        .agent
        .wait_for("the escalation logged", secs(10), |l| {
            l.is(
                "job_shutdown_ignored",
                &[("pod", running.uid()), ("container", "proxy")],
            )
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = running.delete().await;
    jb.finish().await;
}

#[tokio::test]
async fn a_sidecar_that_fails_its_shutdown_is_reported() {
    let Some(jb) = JobBed::start().await else {
        return;
    };
    let pod = job_pod(24197, |p| {
        without_url(p);
        support::edit_script(p, "proxy", "exit 0' TERM", "exit 3' TERM");
    });
    let (running, status) = jb.complete(&pod).await;
    // The Job did its work, and is failed by its sidecar: the user is told which and why.
    assert_eq!(status.phase, Phase::Failed);
    assert_eq!(exit_code(&running, "app"), Some(0));
    assert_eq!(exit_code(&running, "proxy"), Some(3));
    let events = jb
        .api
        .as_ref()
        .expect("an API server")
        .api
        .wait_events(1, secs(10))
        .await;
    let ev = events
        .iter()
        .find(|e| e["reason"] == exitorder::cluster::recorder::REASON_SHUTDOWN_FAILED)
        .unwrap_or_else(|| panic!("no shutdown event in {events:?}"));
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["uid"], running.uid());
    assert_eq!(ev["regarding"]["fieldPath"], "spec.containers{proxy}");
    let note = ev["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("status 3") && note.contains("proxy"),
        "{note}"
    );
    let _ = running.delete().await;
    jb.finish().await;
}

#[tokio::test]
async fn on_failure_waits_for_the_main_containers_success() {
    a_retried_app_keeps_its_proxy(24193, "OnFailure", 1, json!({})).await;
}

/// A Job pod (`restartPolicy: pod_policy`) whose app fails once with `first_code` and then
/// succeeds, restarted by the pod's policy or its own `restart` fields (KEP-5307): the proxy
/// stays up through the second attempt and is shut down once, after it.
async fn a_retried_app_keeps_its_proxy(
    port: u16,
    pod_policy: &str,
    first_code: i32,
    restart: Value,
) {
    a_retried_app_keeps_its_proxy_with(true, port, pod_policy, first_code, restart).await;
}

/// [`a_retried_app_keeps_its_proxy`], with or without the API server.
async fn a_retried_app_keeps_its_proxy_with(
    with_api: bool,
    port: u16,
    pod_policy: &str,
    first_code: i32,
    restart: Value,
) {
    let Some(jb) = JobBed::start_with(with_api).await else {
        return;
    };
    let pod = job_pod(port, |p| {
        p["spec"]["restartPolicy"] = pod_policy.into();
        p["spec"]["volumes"] = json!([{"name": "state", "emptyDir": {}}]);
        let app = &mut p["spec"]["containers"][0];
        for (k, v) in restart.as_object().expect("restart fields") {
            app[k] = v.clone();
        }
        app["volumeMounts"] = json!([{"name": "state", "mountPath": "/state"}]);
        app["command"] = json!(["sh", "-c", format!(
            "if [ ! -e /state/tried ]; then touch /state/tried; echo failing; exit {first_code}; fi; echo done")]);
    });
    let (running, status) = jb.complete(&pod).await;
    assert_eq!(
        status.phase,
        Phase::Succeeded,
        "{}",
        jb.bed.agent.log_tail(30)
    );
    let app = status.container("app").expect("app");
    assert_eq!(app.attempt, 1, "the app was not restarted once: {app:?}");
    assert_eq!(exit_code(&running, "app"), Some(0));
    assert_eq!(log_count(&running, "proxy", "shutdown requested"), 1);
    let success = finished_at(&running, "app");
    let asked = jb
        .bed
        .agent
        .wait_for("the shutdown logged", secs(10), |l| {
            l.is("job_shutdown", &[("container", "proxy")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .at_ns()
        .expect("timestamped");
    assert!(
        asked >= success,
        "the proxy was shut down during the retry\n{}",
        jb.bed.agent.log_tail(30)
    );
    let _ = running.delete().await;
    jb.finish().await;
}

#[tokio::test]
async fn a_container_restart_policy_keeps_the_proxy_through_the_retry() {
    a_retried_app_keeps_its_proxy(24199, "Never", 1, json!({"restartPolicy": "OnFailure"})).await;
}

#[tokio::test]
async fn a_restart_rule_keeps_the_proxy_through_the_retry() {
    a_retried_app_keeps_its_proxy(
        24200,
        "Never",
        42,
        json!({"restartPolicy": "Never", "restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}),
    )
    .await;
}

/// Without an API server the agent reads the restart rules from the webhook's record on the
/// pod (`exitorder.io/restart-policy`, copied to the sandbox by the kubelet): the same Job,
/// the same order.
#[tokio::test]
async fn without_an_api_server_the_webhooks_record_keeps_the_proxy_through_the_retry() {
    a_retried_app_keeps_its_proxy_with(
        false,
        24201,
        "Never",
        42,
        json!({"restartPolicy": "Never", "restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}),
    )
    .await;
}

/// When `container`'s attempt `attempt` exited, from the pod's timeline.
fn exited_at(status: &exitorder_testbed::PodStatus, container: &str, attempt: u32) -> i64 {
    status
        .timeline
        .events
        .iter()
        .find(|e| {
            e.container.as_deref() == Some(container)
                && matches!(e.what, What::Exited { attempt: a, .. } if a == attempt)
        })
        .map(|e| e.at_ns)
        .unwrap_or_else(|| panic!("{container} attempt {attempt} did not exit"))
}

/// Runs `pod` (restarted in place once by a `RestartAllContainers` rule) to completion: it
/// succeeds, every container ran twice, and the proxy was shut down once, after the app's
/// last run. The pod's status and the running pod.
async fn completes_after_one_restart_in_place(
    jb: &JobBed,
    pod: &Value,
) -> (RunningPod, exitorder_testbed::PodStatus) {
    let (running, status) = jb.complete(pod).await;
    assert_eq!(
        status.phase,
        Phase::Succeeded,
        "{}",
        jb.bed.agent.log_tail(30)
    );
    assert_eq!(status.restarts_all, 1, "{}", show(&status.timeline));
    for (name, c) in &status.containers {
        assert_eq!(c.attempt, 1, "{name} did not run again: {c:?}");
    }
    assert_eq!(exit_code(&running, "app"), Some(0));
    let shutdowns: Vec<i64> = jb
        .bed
        .agent
        .lines()
        .iter()
        .filter(|l| l.is("job_shutdown", &[("container", "proxy")]))
        .filter_map(|l| l.at_ns())
        .collect();
    assert_eq!(
        shutdowns.len(),
        1,
        "the proxy was not shut down exactly once\n{}",
        jb.bed.agent.log_tail(40)
    );
    assert!(
        shutdowns[0] >= exited_at(&status, "app", 1),
        "the proxy was shut down before the app's last run ended\n{}",
        jb.bed.agent.log_tail(30)
    );
    assert_eq!(log_count(&running, "proxy", "shutdown requested"), 1);
    (running, status)
}

/// A shell snippet that waits until `condition` holds, at most 60 s, then runs `then`; after
/// 60 s it exits 3, which no rule here restarts.
fn once(condition: &str, then: &str) -> String {
    format!(
        "n=0; until {condition}; do n=$((n+1)); [ $n -lt 600 ] || exit 3; sleep 0.1; done; {then}"
    )
}

/// [`once`] the proxy on `port` answers HTTP (any status).
fn once_the_proxy_serves(port: u16, then: &str) -> String {
    once(
        &format!("wget -S -O /dev/null http://127.0.0.1:{port}/ 2>&1 | grep -q HTTP/"),
        then,
    )
}

/// The exit codes of `container`'s runs, oldest first.
fn exit_codes(status: &exitorder_testbed::PodStatus, container: &str) -> Vec<i32> {
    status
        .timeline
        .sorted()
        .iter()
        .filter(|e| e.container.as_deref() == Some(container))
        .filter_map(|e| match e.what {
            What::Exited { exit_code, .. } => Some(exit_code),
            _ => None,
        })
        .collect()
}

/// KEP-5532: the app's exit 88 matches its `RestartAllContainers` rule, so the kubelet kills
/// every other container at once (no preStop, no grace) and runs the pod again from its init
/// containers, the webhook's among them. That exit is not the end of the Job: the proxy
/// serves until the app has exited, runs again beside the app's next attempt, and is shut
/// down once, after the app's success. (The app's first run exits once the proxy serves, so
/// both ran when the restart came.)
#[tokio::test]
async fn a_restart_of_every_container_keeps_the_proxy_until_the_app_exited() {
    let Some(jb) = JobBed::start().await else {
        return;
    };
    let port = 24203;
    let pod = job_pod(port, |p| {
        p["spec"]["volumes"] = json!([{"name": "state", "emptyDir": {}}]);
        let app = &mut p["spec"]["containers"][0];
        app["restartPolicy"] = "Never".into();
        app["restartPolicyRules"] = json!([
            {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}]);
        app["volumeMounts"] = json!([{"name": "state", "mountPath": "/state"}]);
        let first = once_the_proxy_serves(port, "touch /state/tried; echo again; exit 88");
        app["command"] = json!([
            "sh",
            "-c",
            format!("if [ -e /state/tried ]; then echo done; else {first}; fi")
        ]);
    });
    let (running, status) = completes_after_one_restart_in_place(&jb, &pod).await;
    assert_eq!(
        exit_codes(&status, "app"),
        [88, 0],
        "{}",
        show(&status.timeline)
    );
    assert_eq!(
        exit_codes(&status, "proxy"),
        [137, 0],
        "{}",
        show(&status.timeline)
    );
    assert!(
        exited_at(&status, "proxy", 0) >= exited_at(&status, "app", 0),
        "the proxy's first run ended before the app's\n{}",
        show(&status.timeline)
    );
    let _ = running.delete().await;
    jb.finish().await;
}

/// The same restart, asked for by a native sidecar that watches the app (the KEP's own
/// example), and an agent without an API server, which reads the watcher's rule from the
/// webhook's record. The watcher exits 88 once the app is at work and the proxy serves; the
/// restart kills the app mid-work (exit 137, a failure its own policy never retries): that
/// is not the end of the Job either. (Whether the app's death reaches the agent before the
/// proxy's is up to the kill here; tests/restart_in_place.rs makes it so.)
#[tokio::test]
async fn a_watchers_restart_of_every_container_is_not_the_end_of_the_job() {
    let Some(jb) = JobBed::start_with(false).await else {
        return;
    };
    let port = 24204;
    let pod = job_pod(port, |p| {
        p["spec"]["volumes"] = json!([{"name": "state", "emptyDir": {}}]);
        let state = json!([{"name": "state", "mountPath": "/state"}]);
        let restart = once_the_proxy_serves(
            port,
            &once("[ -e /state/working ]", "touch /state/watched; exit 88"),
        );
        let watcher = json!({
            "name": "watcher",
            "image": "busybox:1.36",
            "restartPolicy": "Always",
            "restartPolicyRules": [
                {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}],
            "volumeMounts": state.clone(),
            "command": ["sh", "-c", format!(
                "if [ ! -e /state/watched ]; then {restart}; fi; \
                 trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done")],
        });
        p["spec"]["initContainers"] = json!([watcher]);
        let app = &mut p["spec"]["containers"][0];
        app["volumeMounts"] = state;
        app["command"] = json!([
            "sh",
            "-c",
            "if [ -e /state/watched ]; then echo done; else echo working; touch /state/working; \
             sleep 120; fi"
        ]);
    });
    let (running, status) = completes_after_one_restart_in_place(&jb, &pod).await;
    assert_eq!(
        exit_codes(&status, "watcher")[0],
        88,
        "{}",
        show(&status.timeline)
    );
    assert_eq!(
        exit_codes(&status, "app"),
        [137, 0],
        "{}",
        show(&status.timeline)
    );
    let _ = running.delete().await;
    jb.finish().await;
}

#[tokio::test]
async fn the_opt_out_leaves_the_sidecar_running() {
    let Some(jb) = JobBed::start().await else {
        return;
    };
    let pod = job_pod(24194, |p| {
        p["metadata"]["annotations"]["exitorder.io/terminate-sidecars-on-completion"] =
            "false".into();
    });
    let running = jb.run(&pod).await;
    running
        .wait_for("the app done", secs(30), |s| {
            s.container("app").is_some_and(|c| c.finished)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The agent saw the work done, and said it leaves the sidecar running...
    jb.bed
        .agent
        .wait_for("the app's exit seen", secs(10), |l| {
            l.is("job_left_running", &[("pod", running.uid())])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // ...which it does.
    assert!(running
        .status()
        .container("proxy")
        .is_some_and(|c| c.running));
    assert!(jb
        .bed
        .agent
        .find(|l| l.is("job_shutdown", &[("pod", running.uid())]))
        .is_none());
    let _ = running.delete().await;
    jb.finish().await;
}

#[tokio::test]
async fn a_restarted_agent_neither_misses_nor_repeats_a_shutdown() {
    let Some(mut jb) = JobBed::start().await else {
        return;
    };
    // Missed: the agent is down when the app finishes.
    let pod = job_pod(24195, |p| {
        p["spec"]["containers"][0]["command"] =
            json!(["sh", "-c", "echo working; sleep 3; echo done"]);
    });
    let running = jb.run(&pod).await;
    jb.bed
        .agent
        .wait_for("the pod watch", secs(10), |l| {
            l.says("pod watch current", &[])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    jb.bed.agent.kill();
    running
        .wait_for("the app done", secs(30), |s| {
            s.container("app").is_some_and(|c| c.finished)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    jb.restart_agent().await;
    let status = running
        .wait_completed(secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", jb.bed.agent.log_tail(30)));
    assert_eq!(status.phase, Phase::Succeeded);
    assert_eq!(log_count(&running, "proxy", "shutdown requested"), 1);
    let _ = running.delete().await;

    // Repeated: the agent restarts after the shutdown, while the proxy is still draining.
    let pod = job_pod(24196, |p| {
        support::edit_script(
            p,
            "proxy",
            "trap 'echo \"TERM: proxy exiting\"; exit 0' TERM",
            "trap 'echo \"TERM: proxy draining\"; sleep 3; exit 0' TERM",
        );
    });
    let running = jb.run(&pod).await;
    jb.bed
        .agent
        .wait_for("the shutdown", secs(30), |l| {
            l.is(
                "job_shutdown",
                &[("pod", running.uid()), ("container", "proxy")],
            )
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    jb.restart_agent().await;
    let status = running
        .wait_completed(secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", jb.bed.agent.log_tail(30)));
    assert_eq!(status.phase, Phase::Succeeded);
    assert_eq!(log_count(&running, "proxy", "shutdown requested"), 1);
    assert!(
        jb.bed
            .agent
            .find(|l| l.is("job_shutdown", &[("pod", running.uid())]))
            .is_none(),
        "the new agent shut the proxy down again"
    );
    let _ = running.delete().await;
    jb.finish().await;
}

#[tokio::test]
async fn the_app_starts_after_its_proxy_is_ready() {
    let Some(jb) = JobBed::start().await else {
        return;
    };
    let pod = inject(support::example("await-sidecars"));
    let names: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["proxy", "app"]);
    let running = jb.run(&pod).await;
    let status = running
        .wait_ready(secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", show(&status.timeline));
    let t = &status.timeline;
    let at = |c: &str, f: &dyn Fn(&What) -> bool| t.first(c, f).map(|e| e.at_ns);
    let hook_done = at("proxy", &|w| {
        matches!(w, What::PostStartEnded { ok: true, .. })
    })
    .expect("the proxy's postStart returned ok");
    let app_created = at("app", &|w| matches!(w, What::Created { .. })).expect("app created");
    let proxy_started = at("proxy", &|w| matches!(w, What::Started { .. })).expect("started");
    // The proxy answers /ready 2 s after it starts; the app is created only after that.
    let shown = t.render(proxy_started);
    assert!(app_created >= hook_done, "{shown}");
    assert!(
        hook_done - proxy_started >= 1_500_000_000,
        "the postStart returned {} ms after the proxy started: before it could be ready\n{shown}",
        (hook_done - proxy_started) / 1_000_000
    );
    let _ = running.delete().await;
    jb.finish().await;
}
