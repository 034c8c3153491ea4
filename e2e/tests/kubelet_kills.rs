//! Every way the kubelet kills a pod keeps the order, on the real containerd, with the agent
//! watching a fake API server that the test bed's kubelet tells what the real one tells: the
//! kill's own Event, a `Killing` Event per container before its preStop hook, and the pod's
//! phase `Running` all through the kill (`status_manager.go` `mergePodStatus`), `Failed` only
//! at the end. No deletion reaches the API in any of them. And a container the kubelet
//! restarts alone (liveness, startup probe, an in-place update) is let go at once while the
//! app keeps running.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use std::time::Duration;

use exitorder_e2e::fakeapi;
use exitorder_e2e::support;
use exitorder_e2e::support::killbed::{free_port, secs, KillBed, NODE};
use exitorder_testbed::{DeleteOptions, Kill, PodStatus, RunningPod, Shorten, What};
use serde_json::{json, Value};

/// The two-level example (the app drains `drain` seconds on TERM, the proxy leaves at once),
/// named `name`.
fn two_level(name: &str, drain: &str) -> Value {
    let mut p = support::example("two-level");
    p["metadata"]["name"] = name.into();
    support::edit_script(&mut p, "app", "sleep 2;", &format!("sleep {drain};"));
    p
}

/// Soft and hard node-pressure eviction, graceful node shutdown, `activeDeadlineSeconds`,
/// preemption and a kill whose Events were all dropped: the pod stays `Running` in the API
/// with no deletion, and the proxy leaves after the app in each. A hard eviction gives 1 s
/// to the preStop (then the kubelet's TERM comes whatever the agent says): its app drains
/// within it.
#[tokio::test]
async fn every_kubelet_kill_keeps_the_order_while_the_api_says_running() {
    let Some(kb) = KillBed::start().await else {
        return;
    };
    let cases = [
        (
            "eviction-soft",
            "2",
            Kill::Eviction {
                hard: false,
                max_pod_grace_seconds: 20,
            },
        ),
        (
            "eviction-hard",
            "0.3",
            Kill::Eviction {
                hard: true,
                max_pod_grace_seconds: 20,
            },
        ),
        ("shutdown", "2", Kill::NodeShutdown { grace_seconds: 20 }),
        ("deadline", "2", Kill::ActiveDeadline),
        ("preempted", "2", Kill::Preemption),
        ("silent", "2", Kill::Silent),
    ];
    for (name, drain, kill) in cases {
        kb.kill_keeps_order(&two_level(name, drain), kill, name)
            .await;
    }
    let kills = support::metrics_addr(&kb.bed.agent).await;
    let (_, text) = support::http_get(&kills, "/metrics").await;
    let reads = support::parse_metrics(&text)
        .into_iter()
        .find(|(k, _)| k == "exitorder_api_reads_total{kind=\"events\"}")
        .map_or(0.0, |(_, v)| v);
    // The app's marks tell every kill a pod's: no read needed (at most two a pod, for an
    // attempt's first wait, where the node has not told yet).
    assert!(reads <= 12.0, "{reads} Event reads for 6 kills");
    kb.finish().await;
}

/// The proxy restarted alone: its preStop returns at once (the agent has the kubelet's word
/// for that one container), while the app keeps running throughout.
async fn restart_alone(kb: &KillBed, running: &RunningPod, restarted: impl Fn(&PodStatus) -> bool) {
    let s = running
        .wait_for("the proxy restarted", secs(60), |s| restarted(s))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", kb.bed.agent.log_tail(30)));
    let started = s
        .timeline
        .first("proxy", |w| matches!(w, What::PreStopStarted { .. }))
        .unwrap_or_else(|| panic!("no preStop:\n{}", s.timeline.render(0)))
        .at_ns;
    let ended = s
        .timeline
        .first("proxy", |w| matches!(w, What::PreStopEnded { .. }))
        .unwrap_or_else(|| panic!("no preStop end:\n{}", s.timeline.render(0)))
        .at_ns;
    assert!(
        ended - started < 1_000_000_000,
        "the proxy's preStop took {} ms:\n{}\n{}",
        (ended - started) / 1_000_000,
        s.timeline.render(0),
        kb.bed.agent.log_tail(30)
    );
    eprintln!(
        "{}: the proxy's preStop returned {} ms after it began",
        running.name(),
        (ended - started) / 1_000_000
    );
    let app = s.container("app").expect("app");
    assert!(app.running && app.attempt == 0, "{app:?}");
    let allow = kb.bed.allowed(running.uid(), "proxy").await;
    assert!(
        allow.is("allow", &[("reason", "not_terminating")]),
        "{allow:?}"
    );
}

#[tokio::test]
async fn a_sidecar_restarted_alone_is_let_go_at_once() {
    let Some(kb) = KillBed::start().await else {
        return;
    };
    let dead = free_port();
    // The apps drain nothing: only the proxy's restarts are asserted here, and each pod's
    // deletion after them needs no drain to stay ordered.
    // Liveness: the probe fails from the start (nothing listens on `dead`).
    let mut p = two_level("liveness", "0");
    support::container_mut(&mut p, "proxy")["livenessProbe"] = json!({
        "tcpSocket": {"port": dead}, "initialDelaySeconds": 1, "periodSeconds": 1,
        "failureThreshold": 2,
    });
    let running = kb.run(&p).await;
    restart_alone(&kb, &running, |s| {
        s.container("proxy").is_some_and(|c| c.attempt >= 1)
    })
    .await;
    running.delete().await.unwrap_or_else(|e| panic!("{e}"));

    // Startup probe: it never passes, so the proxy is restarted before it ever started.
    let mut p = two_level("startup", "0");
    support::container_mut(&mut p, "proxy")["startupProbe"] = json!({
        "tcpSocket": {"port": dead}, "periodSeconds": 1, "failureThreshold": 2,
    });
    let running = kb.run_unready(&p).await;
    restart_alone(&kb, &running, |s| {
        s.container("proxy").is_some_and(|c| c.attempt >= 1)
    })
    .await;
    running.delete().await.unwrap_or_else(|e| panic!("{e}"));

    // In-place update of the proxy's image (the same layers under another name), a second
    // after the proxy's attempt began at the latest: the kubelet's word on a kill counts for
    // an attempt made in an earlier second (the API server's times are whole seconds).
    let p = two_level("update", "0");
    let running = kb.run(&p).await;
    let created = running
        .status()
        .timeline
        .first("proxy", |w| matches!(w, What::Created { .. }))
        .map_or(0, |e| e.at_ns);
    let next_second = (created / 1_000_000_000 + 1) * 1_000_000_000;
    let wait = next_second - exitorder_testbed::kubelet::now_ns();
    tokio::time::sleep(Duration::from_nanos(u64::try_from(wait).unwrap_or(0))).await;
    running
        .update_image("proxy", exitorder_testbed::PRESET_STAND_IN_IMAGE)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    restart_alone(&kb, &running, |s| {
        s.container("proxy").is_some_and(|c| c.attempt >= 1)
    })
    .await;
    running.delete().await.unwrap_or_else(|e| panic!("{e}"));
    kb.finish().await;
}

/// A second `kubectl delete --grace-period=7` 3 s into a 30 s deletion: the kubelet cancels
/// the kill and starts it over (`pod_workers.go` `UpdatePod`, `wasGracePeriodShortened`),
/// every preStop hook again, with 7 s from then. The app's own preStop drains 4 s, so it
/// exits 7 s after the first deletion: after 7 s less the reserve counted from the first
/// exit files (which would let both sidecars go 1 s early), within the kill started over.
/// Two sidecars, so the pod's waits never all go while the hooks ask again.
#[tokio::test]
async fn a_shortened_grace_period_starts_the_kill_over_in_order() {
    let Some(kb) = KillBed::start().await else {
        return;
    };
    let mut p = support::example("three-level");
    p["metadata"]["name"] = "shortened".into();
    support::edit_script(&mut p, "app", "sleep 2;", "sleep 0;");
    support::container_mut(&mut p, "app")["lifecycle"] =
        json!({"preStop": {"exec": {"command": ["sleep", "4"]}}});
    let running = kb.run(&p).await;
    let uid = running.uid().to_owned();
    let api = support::api_pod_of(&p, &running, NODE);
    kb.served.api.apply(fakeapi::deleting(api.clone(), 30));
    let after = secs(3);
    let shortened = {
        let served = kb.served.api.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            served.apply(fakeapi::deleting(api, 7));
        })
    };
    let d = running
        .delete_with(DeleteOptions {
            shorten: Some(Shorten {
                after,
                grace_seconds: 7,
            }),
            ..DeleteOptions::probed()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    shortened.await.expect("the second deletion");
    kb.bed.show("shortened", &d);
    assert!(
        d.timeline
            .events
            .iter()
            .any(|e| matches!(e.what, What::GraceShortened { grace_seconds: 7 })),
        "{}",
        kb.bed.context(&d)
    );
    let prestops = d
        .timeline
        .events
        .iter()
        .filter(|e| {
            e.container.as_deref() == Some("proxy") && matches!(e.what, What::PreStopStarted { .. })
        })
        .count();
    assert_eq!(
        prestops,
        2,
        "the proxy's hook ran again{}",
        kb.bed.context(&d)
    );
    support::assert_exited_after(&kb.bed, &d, "proxy", "app");
    support::assert_exited_after(&kb.bed, &d, "log-shipper", "proxy");
    for c in ["proxy", "log-shipper"] {
        kb.bed
            .allowed_ordered(&uid, c, " after the kill started over")
            .await;
    }
    kb.finish().await;
}

/// `kubectl delete --grace-period=0 --force`: the API server writes the deletion with grace 0
/// and removes the pod at once; current kubelets give the containers 1 s
/// (`calculateEffectiveGracePeriod`: "we always supply a grace period of 1"). The agent
/// reads grace 0 as the spec's (older kubelets do), so its deadline never lets the proxy go
/// before an app that finishes within that second.
#[tokio::test]
async fn a_force_delete_keeps_the_order_within_its_second() {
    let Some(kb) = KillBed::start().await else {
        return;
    };
    let p = two_level("forced", "0.3");
    let running = kb.run(&p).await;
    let uid = running.uid().to_owned();
    let api = support::api_pod_of(&p, &running, NODE);
    kb.served.api.apply(fakeapi::deleting(api.clone(), 0));
    kb.served.api.delete(api);
    let d = running
        .delete_with(DeleteOptions {
            grace_period: Some(0),
            ..DeleteOptions::probed()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    kb.bed.show("forced", &d);
    assert_eq!(d.grace_seconds, 1, "{}", kb.bed.context(&d));
    support::assert_exited_after(&kb.bed, &d, "proxy", "app");
    kb.bed
        .allowed_ordered(&uid, "proxy", " in a force delete")
        .await;
    kb.finish().await;
}

/// The chart's `agent.kubelet.evictionMaxPodGracePeriod` (`--kubelet-eviction-max-pod-grace`):
/// a soft eviction gives the pod 6 s, not its 30. Its app drains for 20 s, so the kubelet's
/// KILL ends it at 6 s; the agent, knowing the kill's budget, lets the proxy go at its
/// deadline (6 s less the 1 s reserve) to drain before its TERM, instead of holding it until
/// the kubelet gives up on its hook.
#[tokio::test]
async fn a_soft_evictions_deadline_follows_the_kubelets_configuration() {
    let Some(kb) = KillBed::start_with(&[("EXITORDER_KUBELET_EVICTION_MAX_POD_GRACE", "6s")]).await
    else {
        return;
    };
    let p = two_level("evicted-soon", "20");
    let running = kb.run(&p).await;
    let uid = running.uid().to_owned();
    let d = running
        .delete_with(DeleteOptions::kubelet(Kill::Eviction {
            hard: false,
            max_pod_grace_seconds: 6,
        }))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    kb.bed.show("evicted-soon", &d);
    let allow = kb.bed.allowed(&uid, "proxy").await;
    let waited = allow
        .field("waited_ms")
        .and_then(|w| w.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        allow.is("allow", &[("reason", "deadline"), ("kill", "eviction")])
            && (4_000..5_900).contains(&waited),
        "{allow:?}{}",
        kb.bed.context(&d)
    );
    kb.finish().await;
}
