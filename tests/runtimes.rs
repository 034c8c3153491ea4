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

mod fakecri;
mod rig;
mod support;

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

    let agent_opts = AgentOptions::new(support::AGENT_BIN, &node, support::static_entrypoint());
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
