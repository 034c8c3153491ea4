//! The traffic benchmark's harness, on the real containerd with a real proxy (haproxy) and log
//! shipper (rsyslog): with the proxy and the shipper stopped first (the kubelet's default, no
//! exitorder) it counts failed requests both ways and lost log lines, so the zero it counts
//! with exitorder is never a broken counter.
//!
//! The withdrawal rows' harness likewise: requests fail when the app stops before its endpoints
//! are withdrawn, and none when exitorder holds it until they are.
//!
//! Needs root and `containerd runc busybox-static haproxy rsyslog`; without them the test
//! prints "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use exitorder_e2e::support::{self, agent_bin, skip_or_fail};
use exitorder_testbed::bench::traffic::{self, Strategy, TrafficSettings};
use exitorder_testbed::binaries::Binaries;
use exitorder_testbed::node::Node;

/// A node with the traffic image, and the binaries as the image ships them; `None` when the
/// machine cannot run one (a failure in CI).
async fn traffic_node() -> Option<(Node, Binaries)> {
    if let Err(e) = exitorder_testbed::node::traffic_image_available() {
        skip_or_fail(&format!("the traffic image cannot be built here: {e}"));
        return None;
    }
    let node = support::node_or_skip().await?;
    let bin = Binaries {
        agent: agent_bin().to_owned(),
        entrypoint: support::static_entrypoint().to_owned(),
    };
    traffic::prepare(&node).expect("the traffic image");
    Some((node, bin))
}

#[tokio::test]
async fn requests_and_lines_are_lost_without_exitorder_and_kept_with_it() {
    let Some((node, bin)) = traffic_node().await else {
        return;
    };
    let settings = TrafficSettings {
        deletions: 1,
        ..TrafficSettings::default()
    };

    // The proxy and the shipper get TERM with the app: the counters must see it.
    let none = traffic::run_strategy(&node, &bin, Strategy::None, &settings)
        .await
        .expect("a deletion without exitorder");
    let c = none.counts;
    assert!(c.inbound > 0 && c.outbound > 0 && c.lines > 0, "{c:?}");
    assert!(c.inbound_failed > 0, "inbound failures not counted: {c:?}");
    assert!(
        c.outbound_failed > 0,
        "outbound failures not counted: {c:?}"
    );
    assert!(c.lines_lost > 0, "lost lines not counted: {c:?}");
    assert_eq!(none.deletions_with_loss, 1);

    // The same pod and load, ordered: nothing lost.
    let ordered = traffic::run_strategy(&node, &bin, Strategy::Exitorder, &settings)
        .await
        .expect("a deletion with exitorder");
    let c = ordered.counts;
    assert!(c.inbound > 0 && c.outbound > 0 && c.lines > 0, "{c:?}");
    assert_eq!(
        (c.inbound_failed, c.outbound_failed, c.lines_lost),
        (0, 0, 0),
        "{}",
        c.sentence()
    );
    // The app drains for at least its 20 calls' pauses (2 s): the pod cannot be gone sooner.
    assert!(ordered.pod_gone_p50_ms >= 2000.0, "{ordered:?}");
    node.shutdown().await.expect("teardown");
}

/// One replica of two behind a Service deleted under load, the EndpointSlice controller and
/// haproxy following it with their lags: an app that stops on TERM fails requests when nothing
/// holds it, and none when exitorder holds it until its endpoints are withdrawn and settled.
// Two workers: the consumer's reprogramming, the load and the test bed's kubelet run beside
// each other, as they would in their own processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_fail_unless_the_app_waits_for_its_endpoints_withdrawn() {
    use traffic::withdrawal::{self, App, Wait, WithdrawalCase, WithdrawalSettings};
    let Some((node, bin)) = traffic_node().await else {
        return;
    };
    let settings = WithdrawalSettings {
        deletions: 1,
        ..WithdrawalSettings::default()
    };
    let lag = withdrawal::CONTROLLER_LAG_MS;
    let cases = [
        WithdrawalCase::new(Wait::Nothing, App::StopsOnTerm, lag),
        WithdrawalCase::new(Wait::Endpoints, App::StopsOnTerm, lag),
    ];
    let section = withdrawal::measure(&node, &bin, &cases, &settings, &mut |_| {})
        .await
        .expect("the withdrawal rows");
    eprintln!("{}", section.table());
    let [none, ours] = &section.rows[..] else {
        panic!("{section:?}");
    };
    // The consumer routes to the replica for about a second after TERM: half the requests
    // of that second go there and fail.
    assert!(none.requests > 0, "{none:?}");
    assert!(none.requests_failed > 0, "failures not counted: {none:?}");
    assert_eq!(none.deletions_with_failures, 1);
    assert!(ours.requests > 0, "{ours:?}");
    assert_eq!(ours.requests_failed, 0, "{ours:?}");
    // Held the settle time after the withdrawal: the pod cannot be gone sooner.
    let settle = settings.settle_ms as f64;
    assert!(ours.pod_gone_p50_ms >= settle, "{ours:?}");
    node.shutdown().await.expect("teardown");
}
