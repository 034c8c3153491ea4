//! The host share against its own tenants, on a real containerd: a container whose mounts
//! reach another pod's exit directories (or all of them) is reported by the agent from the
//! runtime's own view of its mounts, and the pods it could reach are still ordered; a node
//! whose share holds the entrypoint directory of an earlier agent upgrades cleanly.
//!
//! Needs root and `containerd runc busybox-static`; without them the test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use exitorder_e2e::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{example, http_get, metrics_addr, parse_metrics, until, Bed};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A pod that could harm others (as admission without exitorder's guard would let it in):
/// one container with a writable mount of each `(host path, read-only)` given.
fn nosy(mounts: &[(String, bool)]) -> Value {
    let mut p = example("two-level");
    p["metadata"]["name"] = "nosy".into();
    p["metadata"]["annotations"] = json!({});
    let mut app = support::container_mut(&mut p, "app").clone();
    app["name"] = "nosy".into();
    let volumes: Vec<Value> = mounts
        .iter()
        .enumerate()
        .map(|(i, (path, _))| json!({"name": format!("v{i}"), "hostPath": {"path": path}}))
        .collect();
    app["volumeMounts"] = mounts
        .iter()
        .enumerate()
        .map(|(i, (_, ro))| json!({"name": format!("v{i}"), "mountPath": format!("/m{i}"), "readOnly": ro}))
        .collect();
    p["spec"]["containers"] = json!([app]);
    p["spec"]["volumes"] = Value::Array(volumes);
    p
}

async fn breaches(addr: &str) -> f64 {
    let (_, text) = http_get(addr, "/metrics").await;
    parse_metrics(&text)
        .into_iter()
        .find(|(s, _)| s == "exitorder_share_breaches_total")
        .map_or(f64::NAN, |(_, v)| v)
}

#[tokio::test]
async fn mounts_reaching_other_pods_are_reported_and_those_pods_still_ordered() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let addr = metrics_addr(&bed.agent).await;
    let mut shared = example("two-level");
    shared["metadata"]["name"] = "victim".into();
    let victim = bed.run_ready(&shared).await;
    let local = bed.run_ready(&support::pod_local("victim-local")).await;
    let (vuid, luid) = (victim.uid().to_owned(), local.uid().to_owned());
    // The victims' own containers reach only their own directories: nothing reported.
    assert_eq!(breaches(&addr).await, 0.0, "{}", bed.agent.log_tail(20));
    // Host paths as the pod names them: the test bed's kubelet maps the share and its own
    // root where the chart's are.
    let intruder = bed
        .run_ready(&nosy(&[
            (format!("/var/lib/exitorder/pods/{vuid}/proxy"), false),
            ("/var/lib//exitorder/".to_owned(), false),
            (
                format!("/var/lib/kubelet/pods/{luid}/volumes/kubernetes.io~empty-dir/exitorder"),
                false,
            ),
            // Read-only reaches nothing it could change.
            ("/var/lib/exitorder".to_owned(), true),
        ]))
        .await;
    let iuid = intruder.uid().to_owned();
    until("three breaches reported", secs(20), || async {
        breaches(&addr).await >= 3.0
    })
    .await;
    // The metric counts first; each log line reaches the test through the agent's pipe.
    let reported = || -> Vec<String> {
        bed.agent
            .lines()
            .into_iter()
            .filter(|l| l.is("share_breach", &[("pod", &iuid), ("container", "nosy")]))
            .filter_map(|l| l.field("reached"))
            .collect()
    };
    until("three breaches logged", secs(10), || async {
        reported().len() >= 3
    })
    .await;
    let reported = reported();
    assert_eq!(reported.len(), 3, "{reported:?}");
    for want in [
        format!("container proxy of pod {vuid} in the share"),
        "every pod's exit directories in the share".to_owned(),
        format!("pod {luid} in the kubelet's pods"),
    ] {
        assert!(
            reported.iter().any(|r| r.contains(&want)),
            "{want:?} not in {reported:?}"
        );
    }
    // Reported, not acted on: both victims are still ordered.
    for (running, uid) in [(victim, &vuid), (local, &luid)] {
        let d = running.delete().await.expect("delete pod");
        bed.assert_ordered(&d, uid, "proxy", "app").await;
    }
    intruder.delete().await.expect("delete intruder");
    assert_eq!(breaches(&addr).await, 3.0, "{}", bed.agent.log_tail(20));
    bed.finish().await;
}

#[tokio::test]
async fn a_share_with_an_earlier_agents_bin_upgrades_cleanly() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    // What an earlier agent left: the entrypoint in the share's `bin/`, which pods injected
    // then still mount.
    let legacy = node.share_dir().join("bin");
    std::fs::create_dir_all(&legacy).expect("legacy bin");
    std::fs::copy(
        support::static_entrypoint(),
        legacy.join("exitorder-entrypoint"),
    )
    .expect("legacy entrypoint");
    let opts = exitorder_testbed::AgentOptions::new(
        support::agent_bin(),
        &node,
        support::static_entrypoint(),
    );
    let bed = Bed::with_agent(node, opts).await;
    bed.agent
        .wait_for("the legacy bin noticed", secs(10), |l| {
            l.is("legacy_bin", &[])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Left as it is for the pods that run from it, and not written any more.
    let before = std::fs::read(legacy.join("exitorder-entrypoint")).expect("legacy file");
    let installed = bed.node.bin_dir().join("exitorder-entrypoint");
    assert!(installed.is_file(), "{} not installed", installed.display());
    // A pod injected the old way (its entrypoint from the share's bin/) and one the new way
    // are both ordered.
    let mut old = example("two-level");
    old["metadata"]["name"] = "old".into();
    let proxy = support::container_mut(&mut old, "proxy");
    proxy["volumeMounts"][1] = json!({"name": "exitorder", "mountPath": "/var/run/exitorder-bin",
                                      "subPath": "bin", "readOnly": true});
    for pod in [old, example("two-level")] {
        let running = bed.run_ready(&pod).await;
        let uid = running.uid().to_owned();
        let d = running.delete().await.expect("delete pod");
        bed.assert_ordered(&d, &uid, "proxy", "app").await;
    }
    assert_eq!(
        std::fs::read(legacy.join("exitorder-entrypoint")).expect("legacy file"),
        before
    );
    assert!(bed.agent.find(|l| l.is("share_breach", &[])).is_none());
    bed.finish().await;
}
