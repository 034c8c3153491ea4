//! Exits from the kernel, on a real containerd: the agent awaits a pidfd on each running
//! container's first process (found from the runtime's verbose status, checked against the
//! container's cgroup), and a container's exit reaches the decisions from there; the
//! runtime's events stay for everything else.
//!
//! Needs root and `containerd runc busybox-static`; without them the test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use exitorder_e2e::support;

use std::time::{Duration, Instant};

use exitorder_testbed::{AgentOptions, AgentProcess};
use support::{
    agent_bin, example, http_get, metrics_addr, node_or_skip, parse_metrics, static_entrypoint,
    until, Bed,
};

fn metric(text: &str, name: &str) -> f64 {
    parse_metrics(text)
        .into_iter()
        .find(|(s, _)| s == name)
        .map_or(f64::NAN, |(_, v)| v)
}

async fn metric_of(addr: &str, name: &str) -> f64 {
    let (_, text) = http_get(addr, "/metrics").await;
    metric(&text, name)
}

/// The agent's options on `node`, logging what it reads of each process.
fn options(node: &exitorder_testbed::Node) -> AgentOptions {
    let mut opts = AgentOptions::new(agent_bin(), node, static_entrypoint());
    opts.grace_reserve = Duration::from_secs(3);
    opts.env.push((
        "EXITORDER_LOG".to_owned(),
        "info,exitorder::runtime::kernel=debug".to_owned(),
    ));
    opts
}

async fn kernel_source_on(agent: &AgentProcess) -> String {
    agent
        .wait_for("the kernel source", Duration::from_secs(10), |l| {
            l.is("kernel_source", &[("source", "pidfd")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    metrics_addr(agent).await
}

/// Runs the three-level example until each of its containers is awaited by the kernel
/// source, deletes it, and checks the order; returns the agent's metrics address.
async fn three_levels_watched_and_ordered(bed: &Bed, addr: &str, within: Duration) {
    let running = bed.run_ready(&example("three-level")).await;
    let uid = running.uid().to_owned();
    let end = Instant::now() + within;
    loop {
        let watched = metric_of(addr, "exitorder_kernel_watched_containers").await;
        if watched >= 3.0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "three containers watched: {watched} after {within:?}; the agent said:\n{}",
            bed.agent.log_tail(60)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let d = running.delete().await.expect("delete pod");
    bed.show("kernel_source", &d);
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.assert_ordered(&d, &uid, "log-shipper", "proxy").await;
    assert_eq!(metric_of(addr, "exitorder_kernel_exit_source").await, 1.0);
    // The pod's cgroup, read with its containers' processes, showed no container the agent
    // did not know: its exits were settled with no listing of the runtime.
    assert!(
        metric_of(addr, "exitorder_pods_settled_by_cgroup_total").await >= 1.0,
        "the pod was not settled by its cgroup; the agent said:\n{}",
        bed.agent.log_tail(60)
    );
    // Exited (told by the kernel or by containerd, whichever came first): nothing is
    // awaited any more.
    until("no container watched", Duration::from_secs(10), || async {
        metric_of(addr, "exitorder_kernel_watched_containers").await == 0.0
    })
    .await;
}

#[tokio::test]
async fn each_running_container_is_awaited_alongside_the_runtimes_events() {
    let Some(node) = node_or_skip().await else {
        return;
    };
    let opts = options(&node);
    let bed = Bed::with_agent(node, opts).await;
    let addr = kernel_source_on(&bed.agent).await;
    three_levels_watched_and_ordered(&bed, &addr, Duration::from_secs(20)).await;
    bed.finish().await;
}

/// With the runtime silent (polling, read once a minute), the kernel alone tells every exit,
/// and the proxy and the log shipper are let out in order from it.
#[tokio::test]
async fn the_kernel_alone_tells_the_exits_and_the_pod_is_ordered() {
    let Some(node) = node_or_skip().await else {
        return;
    };
    let mut opts = options(&node);
    opts.poll_interval = Duration::from_secs(60);
    opts.env
        .push(("EXITORDER_EXIT_SOURCE".to_owned(), "poll".to_owned()));
    let agent = AgentProcess::start(&opts)
        .await
        .unwrap_or_else(|e| panic!("agent did not start: {e}"));
    let bed = Bed {
        agent,
        agent_opts: opts,
        node,
    };
    let addr = kernel_source_on(&bed.agent).await;
    // Containers started after the agent's first listing are found by its reconcile (every
    // 10 s) when nothing is pending.
    three_levels_watched_and_ordered(&bed, &addr, Duration::from_secs(30)).await;
    assert_eq!(
        metric_of(&addr, "exitorder_kernel_exits_total").await,
        3.0,
        "every exit came from the kernel"
    );
    bed.finish().await;
}
