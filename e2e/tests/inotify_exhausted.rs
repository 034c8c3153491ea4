//! Root's inotify instances used up when the agent starts (`fs.inotify.max_user_instances`,
//! 128, shared with every root process of the node: root sidecars, the kubelet, the runtime):
//! the agent runs, says so, and orders pods by polling, instead of failing at start and
//! crash-looping through a node's drain.
//!
//! Needs root and `containerd runc busybox-static`; without them the test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory. It holds
//! this user's inotify instances for a few seconds: alone in its test binary, and released
//! whatever happens.

use std::os::fd::OwnedFd;
use std::time::Duration;

use exitorder_e2e::support::{self, agent_bin, Bed};
use exitorder_testbed::AgentOptions;

/// Every inotify instance this user may still open, held until dropped.
struct Exhausted(Vec<OwnedFd>);

impl Exhausted {
    fn take() -> Exhausted {
        let mut held = Vec::new();
        // Bounded however high the limit is set.
        while held.len() < 65_536 {
            match rustix::fs::inotify::init(rustix::fs::inotify::CreateFlags::CLOEXEC) {
                Ok(fd) => held.push(fd),
                Err(_) => break,
            }
        }
        Exhausted(held)
    }
}

#[tokio::test]
async fn no_inotify_instance_at_start_polls_and_orders() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let mut opts = AgentOptions::new(agent_bin(), &node, support::static_entrypoint());
    opts.grace_reserve = Duration::from_secs(3);
    let exhausted = Exhausted::take();
    assert!(!exhausted.0.is_empty());
    let bed = Bed::with_agent(node, opts).await;
    bed.agent
        .wait_for("inotify unavailable", Duration::from_secs(10), |l| {
            l.is("inotify_unavailable", &[])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The rest of the node gets its instances back; the agent keeps polling.
    drop(exhausted);
    let addr = support::metrics_addr(&bed.agent).await;
    let (_, text) = support::http_get(&addr, "/metrics").await;
    assert!(
        support::parse_metrics(&text)
            .iter()
            .any(|(k, v)| k == "exitorder_inotify_unavailable" && *v == 1.0),
        "{text}"
    );
    for (i, mut p) in [support::example("two-level"), support::pod_local("local")]
        .into_iter()
        .enumerate()
    {
        p["metadata"]["name"] = format!("polled-{i}").into();
        let running = bed.run_ready(&p).await;
        let uid = running.uid().to_owned();
        let d = running.delete().await.expect("delete");
        bed.assert_ordered(&d, &uid, "proxy", "app").await;
    }
    bed.finish().await;
}
