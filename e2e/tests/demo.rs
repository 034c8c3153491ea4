//! `exitorder-testbed demo` as users run it: a Pod YAML of theirs (here the examples) run on a
//! private containerd with the agent, deleted the kubelet's way, judged container by
//! container.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use exitorder_e2e::support;

use std::path::PathBuf;
use std::time::Duration;

use exitorder::webhook::HandshakeVolume;
use exitorder_testbed::demo::DemoKill;
use exitorder_testbed::demo::{demo, DemoArgs, DemoReport, InitRun, PROJECT_IMAGE};
use exitorder_testbed::verdict::Verdict;

fn args(pod: Option<&str>, without_agent: bool) -> DemoArgs {
    DemoArgs {
        binaries: exitorder_testbed::binaries::BinaryArgs {
            entrypoint_binary: Some(support::static_entrypoint().to_owned()),
            agent_binary: Some(support::agent_bin().into()),
        },
        ..args_without_binaries(pod, without_agent)
    }
}

/// The arguments without the binaries (none built: for what fails before a node starts).
fn args_without_binaries(pod: Option<&str>, without_agent: bool) -> DemoArgs {
    DemoArgs {
        pod: pod.map(|p| exitorder_e2e::repo().to_path_buf().join(p)),
        inject: None,
        image: Vec::new(),
        host_network: true,
        grace_period: None,
        kill: DemoKill::Deletion,
        ready_timeout: Duration::from_secs(60),
        complete_timeout: Duration::from_secs(120),
        without_agent,
        traffic: false,
        json: true,
        binaries: Default::default(),
        chart: None,
        agent_image: PathBuf::new(),
    }
}

#[tokio::test]
async fn a_users_pod_yaml_is_run_and_judged() {
    // Only to know whether this machine can run a node at all (skip or fail as e2e does).
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    node.shutdown().await.expect("probe node teardown");
    let mut lines = Vec::new();
    let report = demo(
        &args(Some("deploy/examples/three-level.yaml"), false),
        &mut |l| lines.push(l.to_owned()),
    )
    .await
    .unwrap_or_else(|e| panic!("demo failed: {e:#}"));
    let text = lines.join("\n");
    assert_eq!(report.pod, "web-with-logs");
    let c = |n: &str| {
        report
            .containers
            .get(n)
            .unwrap_or_else(|| panic!("{n}:\n{text}"))
    };
    assert_eq!(c("app").verdict, Verdict::Unheld);
    assert_eq!(c("proxy").verdict, Verdict::Ordered, "{text}");
    assert_eq!(c("log-shipper").verdict, Verdict::Ordered, "{text}");
    assert!(c("proxy").finished_ms > c("app").finished_ms);
    assert!(c("log-shipper").finished_ms > c("proxy").finished_ms);
    assert!(report.ordered());
    // The JSON form users script against.
    let json = serde_json::to_value(&report).expect("JSON");
    assert_eq!(json["containers"]["proxy"]["verdict"], "ordered");
    assert_eq!(json["containers"]["proxy"]["exit_code"], 0);
    assert!(json["containers"]["app"]["finished_ms"].as_f64().is_some());
    // The printed timeline has the agent's allows in it.
    assert!(
        text.contains("allow written by the agent (reason ordered)"),
        "{text}"
    );
}

#[tokio::test]
async fn without_the_agent_the_proxy_leaves_first() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    node.shutdown().await.expect("probe node teardown");
    let mut lines = Vec::new();
    let report = demo(&args(None, true), &mut |l| lines.push(l.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("demo failed: {e:#}"));
    let text = lines.join("\n");
    let proxy = &report.containers["proxy"];
    assert_ne!(proxy.verdict, Verdict::Ordered, "{text}");
    assert!(
        proxy.finished_ms < report.containers["app"].finished_ms,
        "{text}"
    );
    assert!(!report.ordered());
}

/// `--inject MODE` without `--pod`: the built-in un-injected pod passed through the webhook's
/// own mutation, run with the agent and deleted; the report and the printed lines. `None`
/// when the test bed cannot run here (skipped as e2e is).
async fn injected_demo(mode: HandshakeVolume, image: PathBuf) -> Option<(DemoReport, String)> {
    let node = support::node_or_skip().await?;
    node.shutdown().await.expect("probe node teardown");
    let mut a = args(None, false);
    a.inject = Some(mode);
    a.agent_image = image;
    let mut lines = Vec::new();
    let report = demo(&a, &mut |l| lines.push(l.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("demo failed: {e:#}\n{}", lines.join("\n")));
    let text = lines.join("\n");
    assert!(report.ordered(), "{text}");
    let json = serde_json::to_value(&report).expect("JSON");
    assert_eq!(json["containers"]["proxy"]["verdict"], "ordered", "{text}");
    assert_eq!(json["containers"]["app"]["verdict"], "unheld", "{text}");
    assert!(
        report.containers["proxy"].finished_ms > report.containers["app"].finished_ms,
        "{text}"
    );
    assert!(
        text.contains("allow written by the agent (reason ordered)"),
        "{text}"
    );
    Some((report, text))
}

#[tokio::test]
async fn the_built_in_pod_injected_with_emptydir_is_ordered() {
    // The injected exitorder-install runs from the project's image.
    let Some(image) = support::project_image_archive().await else {
        return;
    };
    let Some((report, text)) = injected_demo(HandshakeVolume::EmptyDir, image).await else {
        return;
    };
    assert!(
        text.contains("The webhook (emptyDir handshake) added volumes exitorder (emptyDir)"),
        "{text}"
    );
    assert_eq!(
        report.init_containers.get("exitorder-install"),
        Some(&InitRun {
            image: PROJECT_IMAGE.to_owned(),
            exit_code: Some(0),
        }),
        "{text}"
    );
    let json = serde_json::to_value(&report).expect("JSON");
    assert_eq!(
        json["init_containers"]["exitorder-install"]["exit_code"], 0,
        "{text}"
    );
}

#[tokio::test]
async fn the_built_in_pod_injected_with_hostpath_is_ordered() {
    let Some((report, text)) = injected_demo(HandshakeVolume::HostPath, PathBuf::new()).await
    else {
        return;
    };
    assert!(
        text.contains("The webhook (hostPath handshake) added volumes "),
        "{text}"
    );
    assert!(text.contains("(hostPath /var/lib/exitorder)"), "{text}");
    assert!(report.init_containers.is_empty(), "{text}");
    let json = serde_json::to_value(&report).expect("JSON");
    assert!(json.get("init_containers").is_none(), "{json}");
}

/// A pod the webhook refuses is refused before any node starts, with the webhook's message;
/// the opt-in annotation it lacked is added first.
#[tokio::test]
async fn a_pod_the_webhook_refuses_is_not_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pod.yaml");
    let yaml = r#"
apiVersion: v1
kind: Pod
metadata:
  name: refused
  annotations:
    exitorder.io/container-exit-priority: '{"proxy": 300}'
spec:
  hostNetwork: true
  containers:
    - {name: app, image: busybox:1.36, command: [sleep, "3600"]}
    - {name: proxy, image: busybox:1.36, command: [sleep, "3600"]}
"#;
    std::fs::write(&path, yaml).expect("write the pod");
    let mut a = args_without_binaries(None, false);
    a.pod = Some(path);
    a.inject = Some(HandshakeVolume::EmptyDir);
    let mut lines = Vec::new();
    let err = demo(&a, &mut |l| lines.push(l.to_owned()))
        .await
        .expect_err("the webhook refuses the pod");
    let text = lines.join("\n");
    let message = format!("{err:#}");
    assert!(message.contains("the webhook refuses the pod"), "{message}");
    assert!(
        message.contains("exitorder.io/container-exit-priority"),
        "{message}"
    );
    assert!(
        text.contains("did not carry `exitorder.io/inject: \"true\"`"),
        "{text}"
    );
    assert!(!text.contains("Starting a private containerd"), "{text}");
}

/// A Job's pod runs until its work is done before anything is deleted: its app fails once
/// with exit code 42, which its own rule restarts (KEP-5307), then succeeds; the proxy is shut
/// down after the second attempt by the agent, which runs without an API server and reads the
/// rule from the webhook's record. Each container's attempts are in the report, from the
/// pod's start.
#[tokio::test]
async fn a_jobs_pod_runs_to_completion_with_every_attempt_reported() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    node.shutdown().await.expect("probe node teardown");
    let example = std::fs::read_to_string(
        exitorder_e2e::repo()
            .to_path_buf()
            .join("deploy/examples/job.yaml"),
    )
    .expect("the Job example");
    // Its own port: the tests share the node's network.
    let mut job = exitorder_testbed::manifest::documents(&example.replace("4191", "24202"))
        .expect("YAML")
        .remove(0);
    let spec = &mut job["spec"]["template"]["spec"];
    spec["volumes"] = serde_json::json!([{"name": "state", "emptyDir": {}}]);
    let app = &mut spec["containers"][0];
    app["restartPolicy"] = "Never".into();
    app["restartPolicyRules"] = serde_json::json!([
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]);
    app["volumeMounts"] = serde_json::json!([{"name": "state", "mountPath": "/state"}]);
    app["command"] =
        serde_json::json!(["sh", "-c",
        "if [ ! -e /state/tried ]; then touch /state/tried; echo failing; exit 42; fi; echo done"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("job.json");
    std::fs::write(&path, job.to_string()).expect("write the Job");
    let mut a = args(None, false);
    a.pod = Some(path);
    a.inject = Some(HandshakeVolume::HostPath);
    let mut lines = Vec::new();
    let report = demo(&a, &mut |l| lines.push(l.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("demo failed: {e:#}\n{}", lines.join("\n")));
    let text = lines.join("\n");
    eprintln!("{text}");
    let json = serde_json::to_value(&report).expect("the report serializes");
    eprintln!("{json}");
    assert_eq!(json["times_from"], "start", "{json}");
    assert_eq!(
        json["job"],
        serde_json::json!({"completed": true, "phase": "Succeeded"}),
        "{text}"
    );
    let codes = |name: &str| -> Vec<i64> {
        json["containers"][name]["attempts"]
            .as_array()
            .unwrap_or_else(|| panic!("no attempts for {name}: {json}"))
            .iter()
            .map(|a| a["exit_code"].as_i64().expect("an exit code"))
            .collect()
    };
    assert_eq!(codes("app"), [42, 0], "{text}");
    assert_eq!(codes("proxy"), [0], "{text}");
    let times = |name: &str| -> Vec<f64> {
        json["containers"][name]["attempts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a["finished_ms"].as_f64().expect("a time"))
            .collect()
    };
    let (app, proxy) = (times("app"), times("proxy"));
    assert!(app[0] > 0.0 && app[0] < app[1], "{app:?}");
    assert!(
        proxy[0] > app[1],
        "the proxy left before the app's last run: {text}"
    );
    assert_eq!(
        report.containers["proxy"].verdict,
        Verdict::Ordered,
        "{text}"
    );
    assert!(text.contains("restartPolicy Never: a Job's pod"), "{text}");
    assert!(
        text.contains("The pod completed: phase Succeeded"),
        "{text}"
    );
}

/// `--kill node-shutdown`: the built-in pod killed by the kubelet's graceful node shutdown
/// (its regular pods' 20 s) is ordered as a deletion is.
#[tokio::test]
async fn the_built_in_pod_killed_by_a_node_shutdown_is_ordered() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    node.shutdown().await.expect("probe node teardown");
    let mut a = args(None, false);
    a.kill = DemoKill::NodeShutdown;
    a.grace_period = Some(20);
    let mut lines = Vec::new();
    let report = demo(&a, &mut |l| lines.push(l.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lines.join("\n")));
    let text = lines.join("\n");
    assert!(text.contains("Killing the pod (node shutdown)"), "{text}");
    assert!(report.ordered(), "{text}");
}

/// A kill that takes the pod's own grace refuses `--grace-period`, before any node starts.
#[tokio::test]
async fn a_grace_period_for_a_kill_that_takes_the_pods_is_refused() {
    let mut a = args_without_binaries(None, false);
    a.kill = DemoKill::Preemption;
    a.grace_period = Some(5);
    let mut lines = Vec::new();
    let err = demo(&a, &mut |l| lines.push(l.to_owned()))
        .await
        .expect_err("refused");
    assert!(
        format!("{err:#}").contains("--grace-period does not apply to --kill preemption"),
        "{err:#}"
    );
    assert!(lines.is_empty(), "{lines:?}");
}
