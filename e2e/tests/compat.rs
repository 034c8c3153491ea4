//! One release apart, either way, on the real containerd: the previous release's entrypoint
//! under this agent (pods admitted before an upgrade), and this entrypoint under the previous
//! release's agent (pods admitted by the new webhook on a node the DaemonSet has not reached
//! yet: the webhook injects `EXITORDER_PRESENCE=0ms` while the DaemonSet rolls out; the eight
//! orders of a default upgrade are `upgrade.rs`'s), and the agents rolled back to the previous
//! release under pods admitted before. The previous release is built from its commit
//! (`e2e/compat/previous`).
//!
//! Needs root, `containerd runc busybox-static` and the repository's history; without them
//! each test prints "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are
//! mandatory.

use std::time::Duration;

use exitorder_e2e::fakeapi::FakeApi;
use exitorder_e2e::support::compat::{previous, Previous};
use exitorder_e2e::support::{
    self, agent_bin, assert_exited_after, container_mut, draining_two_level, skip_or_fail, Bed,
};
use exitorder_testbed::AgentOptions;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn previous_or_skip() -> Option<&'static Previous> {
    match previous() {
        Ok(p) => Some(p),
        Err(e) => {
            skip_or_fail(&format!(
                "the compatibility tests need the previous release: {e}"
            ));
            None
        }
    }
}

/// `pod` as written before this release: its app says nothing when stopped (`mark` is this
/// release's, which an earlier entrypoint does not know).
fn as_before(mut pod: serde_json::Value) -> serde_json::Value {
    if let Some(app) = container_mut(&mut pod, "app").as_object_mut() {
        app.remove("lifecycle");
    }
    pod
}

/// `pod` with what the webhook injects into an ordered sidecar while the agents roll out.
fn with_presence_off(mut pod: serde_json::Value) -> serde_json::Value {
    let proxy = container_mut(&mut pod, "proxy");
    proxy["env"]
        .as_array_mut()
        .expect("the proxy's env")
        .push(serde_json::json!({"name": "EXITORDER_PRESENCE", "value": "0ms"}));
    pod
}

#[tokio::test]
async fn an_earlier_entrypoint_is_ordered_and_let_go_at_an_uninstall_by_this_agent() {
    let Some(prev) = previous_or_skip() else {
        return;
    };
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    const NODE: &str = "compat-node";
    let served = FakeApi::for_node(NODE).serve();
    let dir = tempfile::tempdir().expect("tempdir");
    // This agent installs the earlier entrypoint: what pods admitted before see.
    let opts = support::agent_with_daemonset(
        agent_bin(),
        &node,
        &prev.entrypoint,
        &served,
        NODE,
        dir.path(),
    );
    let mut bed = Bed::with_agent(node, opts).await;

    // The env an upgraded webhook may add: an earlier entrypoint ignores it.
    let running = bed
        .run_ready(&with_presence_off(as_before(draining_two_level(3))))
        .await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show("an_earlier_entrypoint_is_ordered (ordered)", &d);
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    let hook = d
        .container("proxy")
        .and_then(|c| c.prestop.clone())
        .expect("the proxy's preStop");
    // The earlier entrypoint knows nothing of presence.
    assert!(!hook.detail.contains("no exitorder agent"), "{hook:?}");

    // Uninstalled while it waits: this agent answers it, as the earlier entrypoint reads
    // only `exit`.
    let running = bed.run_ready(&as_before(draining_two_level(20))).await;
    let uid = running.uid().to_owned();
    let deletion = tokio::spawn(running.delete());
    bed.held(&uid, "proxy").await;
    served.api.remove_daemonset("exitorder", "exitorder");
    bed.terminate_agent().await;
    let d = deletion.await.expect("delete task").expect("delete pod");
    bed.show("an_earlier_entrypoint_is_let_go_at_an_uninstall", &d);
    let hook = d
        .container("proxy")
        .and_then(|c| c.prestop.clone())
        .expect("the proxy's preStop");
    let app_exit = d.container("app").map_or(0, |c| c.finished_at_ns);
    assert!(
        hook.returned_ns < app_exit,
        "the earlier entrypoint was held until the app left{}",
        bed.context(&d)
    );
    bed.finish().await;
}

#[tokio::test]
async fn this_entrypoint_waits_for_an_earlier_agent_with_presence_off() {
    let Some(prev) = previous_or_skip() else {
        return;
    };
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    // The earlier agent installs this entrypoint (a pod-local pod takes it from the image).
    let mut opts = AgentOptions::new(&prev.agent, &node, support::static_entrypoint());
    opts.grace_reserve = secs(1);
    let bed = Bed::with_agent(node, opts).await;
    // While the agents roll out, the webhook gives the app no `mark`.
    let running = bed
        .run_ready(&with_presence_off(as_before(draining_two_level(4))))
        .await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show(
        "this_entrypoint_waits_for_an_earlier_agent_with_presence_off",
        &d,
    );
    assert_exited_after(&bed, &d, "proxy", "app");
    bed.allowed_ordered(&uid, "proxy", &bed.context(&d)).await;
    bed.finish().await;
}

/// The agents rolled back to the previous release, in the host share's layout, under a pod
/// admitted before: its app's hook (`exitorder-entrypoint-v2 mark -- CMD`) still runs its own
/// command. The earlier agent writes its entrypoint, which knows no `mark` (it answers 64, and
/// the app's own command would never run), over `exitorder-entrypoint` only.
#[tokio::test]
async fn a_rollback_of_the_agents_keeps_the_apps_own_hook() {
    let Some(prev) = previous_or_skip() else {
        return;
    };
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let mut opts = AgentOptions::new(agent_bin(), &node, support::static_entrypoint());
    opts.grace_reserve = secs(1);
    let mut bed = Bed::with_agent(node, opts).await;
    let mut pod = draining_two_level(3);
    let own = "own-prestop-ran";
    container_mut(&mut pod, "app")["lifecycle"]["preStop"]["exec"]["command"] =
        serde_json::json!([
            exitorder_contract::mount::ENTRYPOINT_V2,
            "mark",
            "--",
            "sh",
            "-c",
            format!("echo {own}")
        ]);
    let running = bed.run_ready(&pod).await;
    let uid = running.uid().to_owned();

    // The rollback: the earlier agent in this one's place, installing its own entrypoint.
    bed.terminate_agent().await;
    bed.agent_opts = AgentOptions::new(&prev.agent, &bed.node, &prev.entrypoint);
    bed.agent_opts.grace_reserve = secs(1);
    bed.restart_agent()
        .await
        .unwrap_or_else(|e| panic!("the earlier agent: {e}"));
    let bin = bed.node.bin_dir();
    let read = |name: &str| std::fs::read(bin.join(name)).expect("an installed entrypoint");
    assert_eq!(
        read(exitorder_contract::share::ENTRYPOINT),
        std::fs::read(&prev.entrypoint).expect("the earlier entrypoint"),
        "the earlier agent installed its entrypoint"
    );
    assert_eq!(
        read(exitorder_contract::share::ENTRYPOINT_V2),
        std::fs::read(support::static_entrypoint()).expect("this entrypoint"),
        "the second name kept this release's entrypoint"
    );

    let d = running.delete().await.expect("delete pod");
    bed.show("a_rollback_of_the_agents_keeps_the_apps_own_hook", &d);
    let hook = d
        .container("app")
        .and_then(|c| c.prestop.clone())
        .expect("the app's preStop");
    assert!(
        hook.ok && hook.detail.contains(own),
        "the app's hook: {hook:?}{}",
        bed.context(&d)
    );
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.finish().await;
}
