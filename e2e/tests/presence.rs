//! What exitorder's own absence costs a pod, on the real containerd with the real static
//! entrypoint: a pod on a node where no agent ever served it proceeds after the
//! entrypoint's one-second presence wait (not its 25 s timeout); an uninstall lets every
//! waiting sidecar go at once; an agent killed and started again seconds later keeps every
//! order, its waits never released because it was away.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use std::time::Duration;

use exitorder_e2e::fakeapi::FakeApi;
use exitorder_e2e::support::{self, agent_bin, assert_exited_after, draining_two_level, Bed};
use exitorder_testbed::kubelet::HookRecord;
use exitorder_testbed::{AgentProcess, Deletion};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn proxy_hook(bed: &Bed, d: &Deletion) -> HookRecord {
    d.container("proxy")
        .and_then(|c| c.prestop.clone())
        .unwrap_or_else(|| panic!("the proxy's preStop ran{}", bed.context(d)))
}

fn finished(d: &Deletion, name: &str) -> i64 {
    d.container(name).map_or(0, |c| c.finished_at_ns)
}

#[tokio::test]
async fn a_pod_no_agent_ever_served_leaves_after_the_presence_wait() {
    let Some(mut bed) = Bed::start(secs(1)).await else {
        return;
    };
    // The agent installed the entrypoint and is gone before the pod starts: the node of a
    // DaemonSet not scheduled there, crash-looping, or refused.
    bed.terminate_agent().await;
    let running = bed.run_ready(&draining_two_level(8)).await;
    let d = running.delete().await.expect("delete pod");
    bed.show(
        "a_pod_no_agent_ever_served_leaves_after_the_presence_wait",
        &d,
    );
    let hook = proxy_hook(&bed, &d);
    assert!(
        hook.detail.contains("no exitorder agent serves"),
        "{hook:?}{}",
        bed.context(&d)
    );
    // The presence wait is 1 s; the hook's timeout 25 s.
    assert!(
        hook.took() < secs(10),
        "the hook took {:?}{}",
        hook.took(),
        bed.context(&d)
    );
    // With nothing to hold it, the proxy leaves before the draining app, as without exitorder.
    assert!(
        finished(&d, "proxy") < finished(&d, "app"),
        "{}",
        bed.context(&d)
    );
    bed.finish().await;
}

#[tokio::test]
async fn a_rolling_update_keeps_the_wait_and_an_uninstall_lets_it_go_at_once() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    const NODE: &str = "presence-node";
    let served = FakeApi::for_node(NODE).serve();
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = support::agent_with_daemonset(
        agent_bin(),
        &node,
        support::static_entrypoint(),
        &served,
        NODE,
        dir.path(),
    );
    let mut bed = Bed::with_agent(node, opts).await;
    // The app drains for 20 s: only the uninstall can let the proxy go before it.
    let running = bed.run_ready(&draining_two_level(20)).await;
    let uid = running.uid().to_owned();
    let exit = bed
        .node
        .share_dir()
        .join("pods")
        .join(&uid)
        .join("proxy")
        .join("exit");
    let deletion = tokio::spawn(running.delete());
    bed.held(&uid, "proxy").await;

    // A rolling update: the DaemonSet stays; the wait stays for the next agent.
    bed.terminate_agent().await;
    assert_eq!(
        std::fs::read_to_string(&exit).unwrap_or_default().trim(),
        "wait"
    );
    assert!(!bed.agent.lines().iter().any(|l| l.is("uninstalled", &[])));
    bed.agent = AgentProcess::start(&bed.agent_opts)
        .await
        .unwrap_or_else(|e| panic!("successor: {e}"));
    bed.held(&uid, "proxy").await;
    bed.agent
        .wait_for("the DaemonSet watched", secs(10), |l| {
            l.says(
                "watching the agent's DaemonSet: a stop while it is deleted is an uninstall",
                &[],
            )
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // `helm uninstall`: the DaemonSet goes (background deletion), then at once the agent's
    // RBAC, and only later, by the garbage collector, its pods.
    served.api.remove_daemonset("exitorder", "exitorder");
    bed.agent
        .wait_for("the DaemonSet's deletion seen", secs(10), |l| {
            l.says("the agent's DaemonSet is being deleted: at its stop the agent lets every wait on the node go", &[])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    served.api.forbid_daemonsets(true);
    let uninstalled_at = exitorder_testbed::clock::now_ns();
    bed.terminate_agent().await;
    bed.agent
        .wait_for("the agent's uninstall", secs(10), |l| {
            l.is("uninstalled", &[("released", "1")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Every directory the agent served says so to a sidecar that asks later.
    let presence = std::fs::read_to_string(exit.with_file_name("agent")).unwrap_or_default();
    assert!(presence.contains("state=uninstalled"), "{presence:?}");
    let d = deletion.await.expect("delete task").expect("delete pod");
    bed.show(
        "a_rolling_update_keeps_the_wait_and_an_uninstall_lets_it_go_at_once",
        &d,
    );
    let hook = proxy_hook(&bed, &d);
    let after = Duration::from_nanos(u64::try_from(hook.returned_ns - uninstalled_at).unwrap_or(0));
    eprintln!("proxy's preStop returned {after:?} after the uninstall");
    // Within the second the issue asks for, with room for a busy machine; the app's 20 s
    // drain is what it would have waited otherwise.
    assert!(after < secs(5), "{after:?}{}", bed.context(&d));
    assert!(
        hook.returned_ns < finished(&d, "app"),
        "the proxy was held until the app left{}",
        bed.context(&d)
    );
    bed.finish().await;
}

#[tokio::test]
async fn an_agent_away_for_seconds_keeps_every_order() {
    let Some(mut bed) = Bed::start(secs(1)).await else {
        return;
    };
    let mut deletions = Vec::new();
    let mut uids = Vec::new();
    for _ in 0..3 {
        let running = bed.run_ready(&draining_two_level(10)).await;
        uids.push(running.uid().to_owned());
        deletions.push(tokio::spawn(running.delete()));
    }
    for uid in &uids {
        bed.held(uid, "proxy").await;
    }
    bed.agent.kill();
    // The gap itself is the case: a crash-looping agent's back-off, an image pull of the
    // next version. The sidecars' presence wait (1 s) passes long before it ends.
    tokio::time::sleep(secs(5)).await;
    for uid in &uids {
        let exit = bed
            .node
            .share_dir()
            .join("pods")
            .join(uid)
            .join("proxy")
            .join("exit");
        let content = std::fs::read_to_string(&exit).unwrap_or_default();
        assert_eq!(
            content.trim(),
            "wait",
            "{uid}: the wait outlived the agent's absence"
        );
    }
    bed.agent = AgentProcess::start(&bed.agent_opts)
        .await
        .unwrap_or_else(|e| panic!("successor: {e}"));
    for (uid, deletion) in uids.iter().zip(deletions) {
        let d = deletion.await.expect("delete task").expect("delete pod");
        bed.show("an_agent_away_for_seconds_keeps_every_order", &d);
        assert_exited_after(&bed, &d, "proxy", "app");
        bed.allowed_ordered(uid, "proxy", &bed.context(&d)).await;
    }
    bed.finish().await;
}
