//! A default upgrade (`helm upgrade` with the install's values) on the real containerd: the
//! new webhook follows the agents' DaemonSet's rollout (here the fake API server's DaemonSet,
//! its status driven by the test) and, while it is not complete, injects no presence wait;
//! the previous release's agent, on a node the rollout has not reached, answers this release's
//! entrypoint as that webhook injected it, in the eight orders of the end-to-end suite,
//! waits longer than the presence delay included (an agent restart, a deadline, four levels).
//! Once the rollout is complete, a node without any agent lets a sidecar go within a second.
//!
//! Needs root, `containerd runc busybox-static`, the project's image (`scripts/image`) and
//! the repository's history; without them each test prints "SKIPPED: <reason>" and passes,
//! except in CI (`CI` set), where they are mandatory.

use std::time::Duration;

use exitorder::webhook::rollout::{self, Agents, AgentsView};
use exitorder::webhook::Settings;
use exitorder_e2e::fakeapi::FakeApi;
use exitorder_e2e::support::compat::previous;
use exitorder_e2e::support::{self, assert_exited_after, skip_or_fail, Bed};
use exitorder_testbed::{AgentOptions, Deletion};
use serde_json::{json, Value};

const NAMESPACE: &str = "exitorder";
const DAEMONSET: &str = "exitorder";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A container of the stand-in images: `drain` seconds of work on TERM (`None`: ignores TERM).
fn container(name: &str, drain: Option<&str>) -> Value {
    let trap = match drain {
        Some(d) => format!("trap 'sleep {d}; exit 0' TERM"),
        None => "trap '' TERM".to_owned(),
    };
    json!({
        "name": name,
        "image": "busybox:1.36",
        "command": ["sh", "-c", format!("{trap}; touch /tmp/serving; echo serving; while :; do sleep 3600 & wait $!; done")],
        "readinessProbe": {"exec": {"command": ["test", "-e", "/tmp/serving"]}, "periodSeconds": 1},
    })
}

/// An opted-in pod of `containers` with these annotations.
fn pod(name: &str, annotations: Value, containers: Vec<Value>) -> Value {
    let mut a = annotations;
    if a.get("container-exit-priority.kruise.io/auto-inject-prestop")
        .is_none()
    {
        a["exitorder.io/inject"] = "true".into();
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": a},
        "spec": {"terminationGracePeriodSeconds": 30, "containers": containers},
    })
}

/// The eight orders of the end-to-end suite, as opted-in pods: (name, pod, the exit order
/// expected, restart the agent while it waits).
fn eight() -> Vec<(&'static str, Value, Vec<&'static str>, bool)> {
    let mut env_priorities = pod(
        "env-priorities",
        json!({}),
        vec![
            container("app", Some("2")),
            container("proxy", Some("0")),
            container("logs", Some("0")),
        ],
    );
    env_priorities["spec"]["containers"][1]["env"] =
        json!([{"name": "EXITORDER_EXIT_PRIORITY", "value": "1"}]);
    env_priorities["spec"]["containers"][2]["env"] =
        json!([{"name": "KRUISE_EXIT_PRIORITY", "value": "2"}]);
    let mut deadline = pod(
        "deadline",
        json!({"exitorder.io/container-exit-priority": r#"{"proxy": 1}"#}),
        vec![container("app", None), container("proxy", Some("0"))],
    );
    deadline["spec"]["terminationGracePeriodSeconds"] = json!(8);
    vec![
        (
            "two-level",
            pod(
                "two-level",
                json!({"exitorder.io/container-exit-priority": r#"{"proxy": 1}"#}),
                vec![container("app", Some("2")), container("proxy", Some("0"))],
            ),
            vec!["app", "proxy"],
            false,
        ),
        (
            "three-level",
            pod(
                "three-level",
                json!({"exitorder.io/container-exit-priority": r#"{"proxy": 1, "logs": 2}"#}),
                vec![
                    container("app", Some("2")),
                    container("proxy", Some("0")),
                    container("logs", Some("0")),
                ],
            ),
            vec!["app", "proxy", "logs"],
            false,
        ),
        (
            "no-annotation",
            pod(
                "no-annotation",
                json!({}),
                vec![
                    container("app", Some("2")),
                    container("linkerd-proxy", Some("0")),
                ],
            ),
            vec!["app", "linkerd-proxy"],
            false,
        ),
        (
            "agent-restart",
            pod(
                "agent-restart",
                json!({"exitorder.io/container-exit-priority": r#"{"proxy": 1}"#}),
                vec![container("app", Some("6")), container("proxy", Some("0"))],
            ),
            vec!["app", "proxy"],
            true,
        ),
        (
            "kruise-names",
            pod(
                "kruise-names",
                json!({
                    "container-exit-priority.kruise.io/auto-inject-prestop": "true",
                    "kruise.io/container-exit-priority": r#"{"proxy": 1}"#,
                }),
                vec![container("app", Some("2")), container("proxy", Some("0"))],
            ),
            vec!["app", "proxy"],
            false,
        ),
        (
            "env-priorities",
            env_priorities,
            vec!["app", "proxy", "logs"],
            false,
        ),
        (
            "four-levels",
            pod(
                "four-levels",
                json!({"exitorder.io/container-exit-priority": r#"{"p1": 1, "p2": 2, "p3": 3}"#}),
                vec![
                    container("app", Some("2")),
                    container("p1", Some("1")),
                    container("p2", Some("1")),
                    container("p3", Some("0")),
                ],
            ),
            vec!["app", "p1", "p2", "p3"],
            false,
        ),
        ("deadline", deadline, vec!["proxy", "app"], false),
    ]
}

/// The agents' DaemonSet on the fake API server, rolled out `updated` of `desired` nodes of
/// its generation 2; and the webhook's view of it, through its real watch, once it says `want`.
async fn agents_view(
    api: &FakeApi,
    served: &exitorder_e2e::fakeapi::ServedApi,
    updated: i32,
    want: Agents,
) -> AgentsView {
    api.roll_daemonset(NAMESPACE, DAEMONSET, 2, 2, 3, updated, updated);
    let (view, watch) = rollout::rollout_watch(support::api_client(served), NAMESPACE, DAEMONSET);
    tokio::spawn(watch.run(std::future::pending()));
    support::until("the webhook's view of the rollout", secs(10), || {
        let v = view.clone();
        async move { v.get() == want }
    })
    .await;
    view
}

/// `pod` as the webhook injects it now, with the image the node has.
fn injected(pod: &Value, view: &AgentsView, image: &str) -> Value {
    let settings = Settings {
        install_image: image.to_owned(),
        // Under the agent's (2 s): the entrypoint's own timeout comes after the agent's
        // deadline, so the deadline case shows the agent's.
        grace_reserve: secs(1),
        ..Settings::default()
    };
    support::inject_with(pod, &rollout::following(&settings, view.get()))
}

/// The pod's containers in the order they exited, the install init container (done before
/// the deletion) apart.
fn order(d: &Deletion) -> Vec<String> {
    d.exit_order()
        .into_iter()
        .filter(|c| *c != exitorder_contract::podlocal::INSTALL_CONTAINER)
        .map(str::to_owned)
        .collect()
}

/// The previous release's agent on the node, the rollout not there yet: each of the eight
/// orders holds with this entrypoint as the webhook injects it meanwhile.
#[tokio::test]
async fn a_default_upgrade_keeps_every_order_on_a_node_the_rollout_has_not_reached() {
    let prev = match previous() {
        Ok(p) => p,
        Err(e) => {
            skip_or_fail(&format!("the upgrade test needs the previous release: {e}"));
            return;
        }
    };
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let Some(image) = support::project_image(&node).await else {
        let _ = node.shutdown().await;
        return;
    };
    let api = FakeApi::default();
    let served = api.clone().serve();
    let view = agents_view(&api, &served, 1, Agents::RollingOut).await;
    // The earlier agent, as the node still runs it (it installs nothing pod-local pods use:
    // they take this entrypoint from the image).
    let mut opts = AgentOptions::new(&prev.agent, &node, support::static_entrypoint());
    opts.grace_reserve = secs(2);
    let mut bed = Bed::with_agent(node, opts).await;
    for (name, spec, want, restart) in eight() {
        let pod = injected(&spec, &view, &image);
        let env = pod.to_string();
        assert!(
            env.contains(r#"{"name":"EXITORDER_PRESENCE","value":"0ms"}"#),
            "{name}: no presence wait off mid-rollout: {pod}"
        );
        // The exit directories on the node's disk: the earlier agent watches the directory
        // the kubelet makes, not a tmpfs mounted over it.
        assert!(
            env.contains(r#"{"emptyDir":{},"name":"exitorder"}"#),
            "{name}: a tmpfs exit volume mid-rollout: {pod}"
        );
        let running = bed.run_ready(&pod).await;
        let deletion = tokio::spawn(running.delete());
        if restart {
            // The agent away for longer than the presence delay, mid-wait.
            tokio::time::sleep(secs(1)).await;
            bed.agent.kill();
            tokio::time::sleep(secs(2)).await;
            bed.restart_agent()
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let d = deletion.await.expect("delete task").expect("delete pod");
        bed.show(name, &d);
        assert_eq!(order(&d), want, "{name}{}", bed.context(&d));
        for pair in want.windows(2) {
            assert_exited_after(&bed, &d, pair[1], pair[0]);
        }
        if name == "deadline" {
            // The deadline (8 s less the reserve), not the presence delay, let the proxy go.
            let hook = d
                .container("proxy")
                .and_then(|c| c.prestop.clone())
                .expect("the proxy's preStop");
            assert!(
                hook.took() >= secs(5),
                "the proxy's preStop returned after {:?}{}",
                hook.took(),
                bed.context(&d)
            );
        }
    }
    bed.finish().await;
}

/// Once every node runs the current agent, the webhook injects nothing, and a node without any
/// agent lets a sidecar go within the entrypoint's 1 s presence wait; mid-rollout the same
/// pod's sidecar would wait for an agent.
#[tokio::test]
async fn once_rolled_out_a_node_without_an_agent_costs_a_second() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let Some(image) = support::project_image(&node).await else {
        let _ = node.shutdown().await;
        return;
    };
    let api = FakeApi::default();
    let served = api.clone().serve();
    let view = agents_view(&api, &served, 3, Agents::Settled).await;
    let spec = pod(
        "no-agent",
        json!({"exitorder.io/container-exit-priority": r#"{"proxy": 1}"#}),
        vec![container("app", Some("4")), container("proxy", Some("0"))],
    );
    let p = injected(&spec, &view, &image);
    assert!(!p.to_string().contains("EXITORDER_PRESENCE"), "{p}");
    let running = support::run_ready(&node, &p).await;
    let d = running.delete().await.expect("delete pod");
    let hook = d
        .container("proxy")
        .and_then(|c| c.prestop.clone())
        .expect("the proxy's preStop");
    assert!(
        hook.took() < secs(2) && hook.detail.contains("no exitorder agent"),
        "{hook:?}\n{}",
        d.describe()
    );
    // The rollout starts again (the next upgrade): the webhook injects the wait again.
    api.roll_daemonset(NAMESPACE, DAEMONSET, 3, 3, 3, 1, 1);
    support::until("the webhook sees the next rollout", secs(10), || {
        let v = view.clone();
        async move { v.get() == Agents::RollingOut }
    })
    .await;
    assert!(injected(&spec, &view, &image)
        .to_string()
        .contains(r#"{"name":"EXITORDER_PRESENCE","value":"0ms"}"#));
    let _ = node.shutdown().await;
}
