//! Grace periods no kubelet would pick, on a real containerd: the API server bounds no
//! `terminationGracePeriodSeconds`, and the agent reads the kubelet's copy of it from each
//! container's `io.kubernetes.pod.terminationGracePeriod`. A pod whose number does not fit
//! a clock once ended the agent for every pod of its node; now each such pod is decided like
//! any other, and the same agent process goes on ordering the pods after it.
//!
//! Needs root and `containerd runc busybox-static`; without them the test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use exitorder_e2e::support;

use std::time::Duration;

use exitorder_testbed::kubelet::config::RUNTIME_GRACE_ANNOTATION;
use serde_json::Value;
use support::{example, http_get, metrics_addr, Bed};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The two-level example pod (an app that drains 2 s, a proxy of priority 1), named `name`,
/// with the grace period changed as `edit` says.
fn pod(name: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut p = example("two-level");
    p["metadata"]["name"] = name.into();
    edit(&mut p);
    p
}

fn runtime_grace(text: &str) -> impl FnOnce(&mut Value) + '_ {
    move |p| {
        p["metadata"]["annotations"][RUNTIME_GRACE_ANNOTATION] = text.into();
    }
}

/// Runs `pod`, deletes it, and returns the reason the agent gave for letting the proxy go.
async fn reason(bed: &Bed, test: &str, pod: &Value) -> String {
    let running = bed.run_ready(pod).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show(test, &d);
    let proxy = d.container("proxy").expect("proxy");
    assert!(
        proxy.prestop.as_ref().is_some_and(|h| h.ok),
        "{test}: the proxy's preStop did not end well{}",
        bed.context(&d)
    );
    let allow = bed.allowed(&uid, "proxy").await;
    let why = allow.field("reason").unwrap_or_default();
    if why == "ordered" {
        support::assert_exited_after(bed, &d, "proxy", "app");
    }
    why
}

#[tokio::test]
async fn grace_periods_out_of_any_range_are_decided_and_the_agent_goes_on() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let pid = bed.agent.pid();
    let huge = "9".repeat(40);
    // Each case: what the kubelet's annotation says, and the reason the proxy must go with.
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "spec-i64-max",
            pod("spec-i64-max", |p| {
                p["spec"]["terminationGracePeriodSeconds"] = i64::MAX.into();
            }),
            "ordered",
        ),
        (
            "annotation-u64-max",
            pod("annotation-u64-max", runtime_grace(&u64::MAX.to_string())),
            "ordered",
        ),
        (
            "annotation-40-digits",
            pod("annotation-40-digits", runtime_grace(&huge)),
            "ordered",
        ),
        // Not a number: the default grace period (30 s) applies.
        (
            "annotation-junk",
            pod("annotation-junk", runtime_grace("thirty\n\u{202e}1e9")),
            "ordered",
        ),
        // The kubelet kills a pod whose grace is negative after its 2 s minimum, shorter
        // than the agent's reserve: the deadline lets the proxy go at once, as it must.
        (
            "annotation-negative",
            pod("annotation-negative", runtime_grace("-5")),
            "deadline",
        ),
        (
            "annotation-i64-min",
            pod("annotation-i64-min", runtime_grace(&i64::MIN.to_string())),
            "deadline",
        ),
    ];
    for (name, p, want) in &cases {
        let got = reason(&bed, name, p).await;
        assert_eq!(
            &got,
            want,
            "{name}: the proxy went for {got:?}\n{}",
            bed.agent.log_tail(30)
        );
    }
    // A pod like any other, after them: ordered by the same agent process.
    let got = reason(&bed, "normal", &pod("normal", |_| {})).await;
    assert_eq!(got, "ordered");
    assert_eq!(bed.agent.pid(), pid, "the agent was replaced");
    let addr = metrics_addr(&bed.agent).await;
    let (status, _) = http_get(&addr, "/healthz").await;
    assert_eq!(status, 200, "the agent stopped answering");
    assert!(
        bed.agent.find(|l| l.text.contains("panicked")).is_none(),
        "{}",
        bed.agent.log_tail(30)
    );
    bed.finish().await;
}
