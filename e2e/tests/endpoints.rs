//! Endpoints first (`exitorder.io/wait-for-endpoints`), on the real containerd with the real
//! static entrypoint: an app's preStop is held until no EndpointSlice lists its pod as ready,
//! then the settle time; the fake API server plays the EndpointSlice controller
//! (`podToEndpoint`'s conditions, a lag after each pod write). A pod no Service selects is not
//! held; with the API server down, or no agent, the settle time alone.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use std::time::{Duration, UNIX_EPOCH};

use exitorder_e2e::fakeapi::{self, RequestKind};
use exitorder_e2e::support::killbed::{secs, KillBed, NODE};
use exitorder_e2e::support::{self, Bed};
use exitorder_testbed::agentlog::{parse_allow, AgentAllow};
use exitorder_testbed::{DeleteOptions, Deletion, Kill, LogLine};
use serde_json::Value;

/// The settle time the test pods ask for.
const SETTLE: Duration = Duration::from_millis(1500);

/// The two-level example as the webhook injects it for a pod that waits for its endpoints:
/// labelled `app: NAME`, the app's preStop a wait with the settle time, the proxy's a wait
/// for the app.
fn web(name: &str) -> Value {
    let mut p = support::example("two-level");
    p["metadata"]["name"] = name.into();
    p["metadata"]["labels"] = serde_json::json!({"app": name});
    p["metadata"]["annotations"]["exitorder.io/wait-for-endpoints"] = "true".into();
    p["metadata"]["annotations"]["exitorder.io/endpoints-settle"] =
        format!("{}ms", SETTLE.as_millis()).into();
    support::injected(&support::bare(p))
}

fn allow_of(line: &LogLine) -> AgentAllow {
    line.json
        .as_ref()
        .and_then(|j| parse_allow(j).ok().flatten())
        .unwrap_or_else(|| panic!("not an allow: {line:?}"))
}

fn unix_ns(t: std::time::SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Deletes `pod` through the API server, then has the kubelet kill it.
async fn delete(kb: &KillBed, pod: &Value, running: exitorder_testbed::RunningPod) -> Deletion {
    let api = support::api_pod_of(pod, &running, NODE);
    kb.served.api.apply(fakeapi::deleting(api, 30));
    running
        .delete_with(DeleteOptions::probed())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn app_hook_took(bed: &Bed, d: &Deletion) -> Duration {
    d.container("app")
        .and_then(|c| c.prestop.clone())
        .unwrap_or_else(|| panic!("the app's preStop ran{}", bed.context(d)))
        .took()
}

#[tokio::test]
async fn a_pod_no_service_selects_is_not_held() {
    let Some(kb) = KillBed::start().await else {
        return;
    };
    let p = web("unserved");
    let running = kb.run(&p).await;
    let uid = running.uid().to_owned();
    let d = delete(&kb, &p, running).await;
    kb.bed.show("unserved", &d);
    let allow = allow_of(&kb.bed.allowed(&uid, "app").await);
    assert_eq!(allow.reason, "withdrawn", "{}", kb.bed.context(&d));
    let waited = allow.at_ns - allow.wait_since_ns.unwrap_or(allow.at_ns);
    assert!(
        waited < i64::try_from(SETTLE.as_nanos()).unwrap_or(i64::MAX),
        "held {waited} ns, not even the settle time was owed{}",
        kb.bed.context(&d)
    );
    support::assert_exited_after(&kb.bed, &d, "proxy", "app");
    // What it cost the API server: one list of the namespace's slices, no watch.
    assert_eq!(
        kb.served.api.request_count(RequestKind::SliceList),
        1,
        "{:?}",
        kb.served.api.requests()
    );
    assert_eq!(kb.served.api.request_count(RequestKind::SliceWatch), 0);
    kb.finish().await;
}

/// The controller withdraws the pod 2 s after its deletion (a busy controller-manager), later
/// than the settle time alone would have let the app go: the app goes the settle time after
/// the slice's change, within 100 ms of it.
#[tokio::test]
async fn the_apps_wait_ends_the_settle_time_after_its_slice_changed() {
    let Some(kb) = KillBed::start().await else {
        return;
    };
    let p = web("served");
    kb.served
        .api
        .add_service("default", "served", &[("app", "served")], false);
    let running = kb.run(&p).await;
    let uid = running.uid().to_owned();
    kb.served.api.set_slice_lag(secs(2));
    let d = delete(&kb, &p, running).await;
    kb.bed.show("served", &d);
    let allow = allow_of(&kb.bed.allowed(&uid, "app").await);
    assert_eq!(allow.reason, "withdrawn", "{}", kb.bed.context(&d));
    let withdrawn = kb
        .served
        .api
        .slice_changes()
        .into_iter()
        .find(|c| c.pod_uid == uid && c.terminating == Some(true))
        .unwrap_or_else(|| {
            panic!(
                "the controller never withdrew the pod{}",
                kb.bed.context(&d)
            )
        });
    assert_eq!(withdrawn.ready, Some(false));
    let after = allow.at_ns - unix_ns(withdrawn.at);
    let settle = i64::try_from(SETTLE.as_nanos()).unwrap_or(i64::MAX);
    eprintln!(
        "the app went {:.1} ms after its slice changed ({} ms settle time), {:.1} ms into its wait",
        after as f64 / 1e6,
        SETTLE.as_millis(),
        (allow.at_ns - allow.wait_since_ns.unwrap_or(allow.at_ns)) as f64 / 1e6
    );
    assert!(
        (settle..=settle + 100_000_000).contains(&after),
        "the app went {after} ns after its slice changed; the settle time is {settle} ns{}",
        kb.bed.context(&d)
    );
    support::assert_exited_after(&kb.bed, &d, "proxy", "app");
    kb.bed.allowed_ordered(&uid, "proxy", "").await;
    // No watch outlives the pod's waits.
    let api = kb.served.api.clone();
    support::until("the slices' watch closed", secs(10), || {
        let api = api.clone();
        async move { api.open_slice_watches() == 0 }
    })
    .await;
    // One list of the namespace's slices, then a watch of the Service's.
    assert_eq!(
        kb.served.api.request_count(RequestKind::SliceList),
        2,
        "{:?}",
        kb.served.api.requests()
    );
    assert!(kb.served.api.request_count(RequestKind::SliceWatch) >= 1);
    kb.finish().await;
}

#[tokio::test]
async fn with_the_api_server_down_the_wait_is_the_settle_time() {
    let Some(kb) = KillBed::start().await else {
        return;
    };
    let p = web("unreachable");
    kb.served
        .api
        .add_service("default", "unreachable", &[("app", "unreachable")], false);
    let running = kb.run(&p).await;
    let uid = running.uid().to_owned();
    // Its deletion is the API server's last word; then it is away: whether the agent's pod
    // watch or its read of the slices finds it so, nothing tells the withdrawal.
    let api = support::api_pod_of(&p, &running, NODE);
    kb.served.api.apply(fakeapi::deleting(api, 30));
    kb.served.api.set_down(true);
    let d = running
        .delete_with(DeleteOptions::probed())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    kb.bed.show("unreachable", &d);
    let allow = allow_of(&kb.bed.allowed(&uid, "app").await);
    assert_eq!(allow.reason, "settled", "{}", kb.bed.context(&d));
    let waited = allow.at_ns - allow.wait_since_ns.unwrap_or(allow.at_ns);
    let settle = i64::try_from(SETTLE.as_nanos()).unwrap_or(i64::MAX);
    assert!(
        waited >= settle,
        "held {waited} ns, less than the settle time{}",
        kb.bed.context(&d)
    );
    support::assert_exited_after(&kb.bed, &d, "proxy", "app");
    kb.served.api.set_down(false);
    kb.finish().await;
}

/// A soft eviction, one of the kubelet's own kills: nothing withdraws the pod's endpoints
/// until it is terminal (kubernetes#116965), so the app is held for the settle time alone, and
/// an Event on the pod says so.
#[tokio::test]
async fn an_eviction_holds_the_app_for_the_settle_time_and_says_so() {
    let Some(kb) = KillBed::start().await else {
        return;
    };
    let p = web("evicted");
    kb.served
        .api
        .add_service("default", "evicted", &[("app", "evicted")], false);
    let running = kb.run(&p).await;
    let uid = running.uid().to_owned();
    let d = running
        .delete_with(DeleteOptions::kubelet(Kill::Eviction {
            hard: false,
            max_pod_grace_seconds: 20,
        }))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    kb.bed.show("evicted", &d);
    let allow = allow_of(&kb.bed.allowed(&uid, "app").await);
    assert_eq!(allow.reason, "settled", "{}", kb.bed.context(&d));
    let waited = allow.at_ns - allow.wait_since_ns.unwrap_or(allow.at_ns);
    assert!(
        waited >= i64::try_from(SETTLE.as_nanos()).unwrap_or(i64::MAX),
        "held {waited} ns{}",
        kb.bed.context(&d)
    );
    // The slices still list it as ready: the controller saw no deletion.
    assert!(
        kb.served
            .api
            .slice_changes()
            .iter()
            .all(|c| c.pod_uid != uid || c.terminating != Some(true)),
        "{:?}",
        kb.served.api.slice_changes()
    );
    let events = kb.served.api.wait_events(1, secs(10)).await;
    assert!(
        events.iter().any(|e| {
            let note = e["note"].as_str().unwrap_or_default();
            note.contains("container app") && note.contains("reason settled")
        }),
        "{events:?}"
    );
    support::assert_exited_after(&kb.bed, &d, "proxy", "app");
    kb.finish().await;
}

/// No agent on the node: the entrypoint's presence wait (1 s), then the settle time, then the
/// app's own hook; the exec's start and end by the runtime take up to half a second more on a
/// busy machine.
#[tokio::test]
async fn with_no_agent_the_apps_prestop_returns_within_a_second_and_the_settle_time() {
    let Some(mut bed) = Bed::start(secs(1)).await else {
        return;
    };
    bed.terminate_agent().await;
    let running = bed.run_ready(&web("no-agent")).await;
    let d = running.delete().await.expect("delete pod");
    bed.show("no-agent", &d);
    let hook = d
        .container("app")
        .and_then(|c| c.prestop.clone())
        .unwrap_or_else(|| panic!("the app's preStop ran{}", bed.context(&d)));
    assert!(
        hook.detail.contains("no agent held this exit"),
        "{hook:?}{}",
        bed.context(&d)
    );
    let took = app_hook_took(&bed, &d);
    assert!(
        took >= SETTLE && took <= secs(1) + SETTLE + Duration::from_millis(500),
        "the app's preStop took {took:?}{}",
        bed.context(&d)
    );
    bed.finish().await;
}
