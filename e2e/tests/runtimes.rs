//! The ordering end to end on every containerd the project is tested on: 1.6 (the machine's,
//! Debian bookworm's), 1.7 (Debian trixie's) and 2.1 (Debian sid's). On each, a private node
//! and the agent; the two-level and three-level examples run, are deleted the kubelet's way,
//! and every sidecar leaves after the containers it serves, let go by the order; the agent
//! detects exits from containerd's own events service on every version.
//!
//! 1.7 and 2.1 come from `EXITORDER_CONTAINERD_1_7` / `EXITORDER_CONTAINERD_2_1`, the
//! directories of their binaries, which `scripts/test` exports (by hand: `. scripts/tools.sh;
//! export EXITORDER_CONTAINERD_2_1=$(ensure_containerd 2.1)`). Without one, or without root
//! and containerd, a test prints "SKIPPED: <reason>" and passes, except in CI (`CI` set),
//! where it fails. One test per version, so a failure names it.
//!
//! And, on the in-process fake CRI, what `auto` does on a containerd 2.x socket that does not
//! serve containerd's events service: the CRI stream.

use exitorder_e2e::rig;
use exitorder_e2e::support;

use exitorder_testbed::{runtime_env_var, runtime_from_env, AgentOptions, NodeOptions};
use rig::source_becomes;
use support::{assert_exited_after, example, Bed};

#[tokio::test]
async fn ordered_on_containerd_1_6() {
    ordered_on("1.6").await;
}

#[tokio::test]
async fn ordered_on_containerd_1_7() {
    ordered_on("1.7").await;
}

#[tokio::test]
async fn ordered_on_containerd_2_1() {
    ordered_on("2.1").await;
}

/// A pod with `hostUsers: false` (its own user namespace, KEP-127), opted in through the
/// webhook with its handshake in its own `emptyDir` (what Pod Security `restricted` admits),
/// is ordered on containerd 2.1: its containers' root is an unprivileged host uid, and the
/// exit handshake goes through idmapped mounts of its volumes. containerd 2.x runs such a pod
/// only with a runc that makes idmapped mounts: `EXITORDER_RUNC_IDMAP` (scripts/test sets it).
#[tokio::test]
async fn a_pod_in_its_own_user_namespace_is_ordered_on_containerd_2_1() {
    let (Some(containerd_bin), Some(runc)) =
        (runtime_from_env("2.1"), exitorder_testbed::runc_from_env())
    else {
        support::skip_or_fail(&format!(
            "containerd 2.1 ({}) or a runc with idmapped mounts ({}) is not here (scripts/test \
             sets both)",
            runtime_env_var("2.1"),
            exitorder_testbed::RUNC_IDMAP_ENV
        ));
        return;
    };
    let opts = NodeOptions {
        containerd_bin: Some(containerd_bin),
        runc: Some(runc),
        ..NodeOptions::default()
    };
    let Some(node) = support::node_with_or_skip(opts).await else {
        return;
    };
    if support::project_image(&node).await.is_none() {
        let _ = node.shutdown().await;
        return;
    }
    let agent_opts = AgentOptions::new(support::agent_bin(), &node, support::static_entrypoint());
    let bed = Bed::with_agent(node, agent_opts).await;
    let mut pod = example("injected");
    pod["spec"]["hostUsers"] = false.into();
    support::edit_script(&mut pod, "app", "trap ", "cat /proc/self/uid_map; trap ");
    let pod = support::inject_with(&pod, &exitorder::webhook::Settings::default());
    let running = bed.run_ready(&pod).await;
    let uid = running.uid().to_owned();
    // "0 <host id> 65536": root in the container is a host uid above the node's own.
    let map = running.container_log("app");
    let mapped = map.lines().any(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        f.len() == 3 && f[0] == 0 && f[1] >= 65_536 && f[2] == 65_536
    });
    assert!(
        mapped,
        "the app is not in a user namespace of its own:\n{map}"
    );
    let d = running.delete().await.expect("delete pod");
    bed.show("hostUsers: false on containerd 2.1", &d);
    let order: Vec<&str> = d
        .exit_order()
        .into_iter()
        .filter(|n| *n != "exitorder-install")
        .collect();
    assert_eq!(order, ["app", "proxy"], "{}", bed.context(&d));
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.finish().await;
}

/// A runtime that does not say it supports user namespaces (the machine's containerd 1.6,
/// which would run the pod on the node's users without a word) gets no `hostUsers: false`
/// pod: the test bed refuses it, as the kubelet does.
#[tokio::test]
async fn a_runtime_without_user_namespaces_is_not_given_such_a_pod() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let mut pod = example("two-level");
    pod["spec"]["hostUsers"] = false.into();
    let opts = exitorder_testbed::kubelet::RunOptions {
        force_host_network: true,
        ..Default::default()
    };
    let err = match node.run_pod(&pod, &opts).await {
        Ok(running) => {
            let _ = running.delete().await;
            panic!(
                "containerd {} ran a hostUsers: false pod",
                node.version().runtime_version
            )
        }
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("hostUsers: false needs a runtime with user namespaces"),
        "{err}"
    );
    node.shutdown().await.expect("teardown");
}

/// Whether `reported` (a CRI Version's `runtime_version`, `1.7.24~ds1` or `v2.1.9`) is of
/// `version` (major.minor).
fn is_version(reported: &str, version: &str) -> bool {
    reported
        .trim_start_matches('v')
        .strip_prefix(version)
        .is_some_and(|rest| rest.starts_with('.'))
}

async fn ordered_on(version: &str) {
    // 1.6 is the machine's own containerd unless the variable names another directory.
    let containerd_bin = runtime_from_env(version);
    if containerd_bin.is_none() && version != "1.6" {
        let var = runtime_env_var(version);
        support::skip_or_fail(&format!(
            "containerd {version} is not here: {var} is not set (scripts/test sets it; by \
             hand: `. scripts/tools.sh; export {var}=$(ensure_containerd {version})`)"
        ));
        return;
    }
    let from_path = containerd_bin.is_none();
    let opts = NodeOptions {
        containerd_bin,
        ..NodeOptions::default()
    };
    let Some(node) = support::node_with_or_skip(opts).await else {
        return;
    };
    let reported = node.version().runtime_version.clone();
    if !is_version(&reported, version) {
        if from_path {
            // Another machine's package: the 1.6 of these tests is Debian bookworm's.
            support::skip_or_fail(&format!(
                "the machine's containerd is {reported}, not {version} (Debian bookworm's)"
            ));
            let _ = node.shutdown().await;
            return;
        }
        panic!(
            "{} names a containerd {reported}, not {version}",
            runtime_env_var(version)
        );
    }
    eprintln!("containerd {reported} ({})", node.dir().display());

    let agent_opts = AgentOptions::new(support::agent_bin(), &node, support::static_entrypoint());
    // Waits for "exit source connected" with source containerd_events.
    let bed = Bed::with_agent(node, agent_opts).await;
    assert!(
        bed.agent
            .find(|l| l.says("exit source connected", &[("source", "containerd_events")]))
            .is_some(),
        "containerd {reported}: the agent does not use containerd's events\n{}",
        bed.agent.log_tail(25)
    );

    two_level(&bed, version).await;
    three_level(&bed, version).await;

    // Nothing ever made the agent leave containerd's events on this version.
    let left = |l: &exitorder_testbed::LogLine| {
        l.message()
            .is_some_and(|m| m.starts_with("exit events not offered"))
            || l.says("exit source down", &[("source", "containerd_events")])
    };
    assert!(
        bed.agent.find(left).is_none(),
        "containerd {reported}: the agent left containerd's events\n{}",
        bed.agent.log_tail(25)
    );
    bed.finish().await;
}

async fn two_level(bed: &Bed, version: &str) {
    let running = bed.run_ready(&example("two-level")).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show(&format!("two-level on containerd {version}"), &d);
    assert_eq!(
        d.exit_order(),
        ["app", "proxy"],
        "containerd {version}: exit order{}",
        bed.context(&d)
    );
    for name in ["app", "proxy"] {
        assert_eq!(
            d.container(name).map(|c| c.exit_code),
            Some(0),
            "containerd {version}: {name}{}",
            bed.context(&d)
        );
    }
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
}

async fn three_level(bed: &Bed, version: &str) {
    let running = bed.run_ready(&example("three-level")).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show(&format!("three-level on containerd {version}"), &d);
    assert_eq!(
        d.exit_order(),
        ["app", "proxy", "log-shipper"],
        "containerd {version}: exit order{}",
        bed.context(&d)
    );
    for name in ["app", "proxy", "log-shipper"] {
        assert_eq!(
            d.container(name).map(|c| c.exit_code),
            Some(0),
            "containerd {version}: {name}{}",
            bed.context(&d)
        );
    }
    assert_exited_after(bed, &d, "log-shipper", "proxy");
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.assert_ordered(&d, &uid, "log-shipper", "proxy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_2_without_its_events_service_falls_back_to_the_cri_stream() {
    // The fake serves the CRI alone: Subscribe on containerd's events service is UNIMPLEMENTED.
    let mut rig = rig::Rig::new();
    rig.cri().with_events("containerd", "v2.1.9");
    rig.start_agent();
    source_becomes(&rig.stats, "cri_events").await;
    rig.stop_agent().await;
}

#[test]
fn versions_are_read_as_the_cri_reports_them() {
    assert!(is_version("1.6.20~ds1", "1.6"));
    assert!(is_version("1.7.24~ds1", "1.7"));
    assert!(is_version("v2.1.9+unknown", "2.1"));
    assert!(is_version("2.1.9", "2.1"));
    assert!(!is_version("2.10.1", "2.1"));
    assert!(!is_version("1.7.24", "1.6"));
}
