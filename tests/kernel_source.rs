//! Exits from the kernel, on a real containerd: the agent awaits a pidfd on each running
//! container's first process (found from the runtime's verbose status, checked against the
//! container's cgroup), and the app's exit lets the proxy go from there, ahead of the runtime's
//! own event; the runtime's events stay for everything else.
//!
//! Needs root and `containerd runc busybox-static`; without them the test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

mod support;

use std::time::Duration;

use support::{example, http_get, metrics_addr, parse_metrics, until, Bed};

fn metric(text: &str, name: &str) -> f64 {
    parse_metrics(text)
        .into_iter()
        .find(|(s, _)| s == name)
        .map_or(f64::NAN, |(_, v)| v)
}

#[tokio::test]
async fn the_kernel_tells_the_apps_exit_and_the_proxy_is_ordered() {
    let Some(bed) = Bed::start(Duration::from_secs(3)).await else {
        return;
    };
    bed.agent
        .wait_for("the kernel source", Duration::from_secs(10), |l| {
            l.is("kernel_source", &[("source", "pidfd")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = metrics_addr(&bed.agent).await;
    let running = bed.run_ready(&example("three-level")).await;
    let uid = running.uid().to_owned();
    // Each of the pod's three containers is awaited once it runs.
    until(
        "three containers watched",
        Duration::from_secs(20),
        || async {
            let (_, text) = http_get(&addr, "/metrics").await;
            metric(&text, "exitorder_kernel_watched_containers") >= 3.0
        },
    )
    .await;
    let d = running.delete().await.expect("delete pod");
    bed.show("kernel_source", &d);
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.assert_ordered(&d, &uid, "log-shipper", "proxy").await;
    let (_, text) = http_get(&addr, "/metrics").await;
    assert_eq!(metric(&text, "exitorder_kernel_exit_source"), 1.0);
    // The app's exit came from the kernel before its allow; the last container's may still be
    // on its way from the waiting thread when the deletion returns.
    until("three kernel exits", Duration::from_secs(10), || async {
        let (_, text) = http_get(&addr, "/metrics").await;
        metric(&text, "exitorder_kernel_exits_total") >= 3.0
    })
    .await;
    // Exited and removed: nothing is awaited any more.
    until("no container watched", Duration::from_secs(10), || async {
        let (_, text) = http_get(&addr, "/metrics").await;
        metric(&text, "exitorder_kernel_watched_containers") == 0.0
    })
    .await;
    bed.finish().await;
}
