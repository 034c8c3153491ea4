//! `exitorder-testbed demo` as users run it: a Pod YAML of theirs (here the examples) run on a
//! private containerd with the agent, deleted the kubelet's way, judged container by
//! container.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use exitorder_testbed::demo::{demo, DemoArgs};
use exitorder_testbed::verdict::Verdict;

fn args(pod: Option<&str>, without_agent: bool) -> DemoArgs {
    DemoArgs {
        pod: pod.map(|p| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p)),
        image: Vec::new(),
        host_network: true,
        grace_period: None,
        ready_timeout: Duration::from_secs(60),
        without_agent,
        json: true,
        binaries: exitorder_testbed::demo::BinaryArgs {
            entrypoint_binary: Some(support::static_entrypoint().to_owned()),
            agent_binary: Some(support::AGENT_BIN.into()),
        },
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
