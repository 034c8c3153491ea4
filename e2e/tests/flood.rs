//! A pod that floods its directory, on a real containerd: 200,000 entries in a running
//! sidecar's exit directory (where it may write what it likes) and 200,000 in the directory of
//! a pod the runtime no longer has (which the agent's garbage collection must take apart),
//! while other pods are deleted. Their exits stay ordered, the agent's memory stays bounded,
//! and the removal goes in bounded rounds rather than in one sweep.
//!
//! Needs root and `containerd runc busybox-static`; without them the test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use exitorder_e2e::support;

use std::path::PathBuf;
use std::time::Duration;

use exitorder_testbed::{random_uuid, AgentOptions};
use support::{example, until, Bed};

const FLOOD: usize = 200_000;
/// The deleted pods, deleted at once while the flood goes on.
const VICTIMS: usize = 3;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// `FLOOD` empty files in `dir`, made from a thread of their own.
fn flood(dir: PathBuf) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for i in 0..FLOOD {
            let p = dir.join(format!("junk-{i:06}"));
            std::fs::File::create(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_directory_costs_its_pod_only() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let mut agent_opts =
        AgentOptions::new(support::agent_bin(), &node, support::static_entrypoint());
    agent_opts.grace_reserve = secs(3);
    agent_opts
        .env
        .push(("EXITORDER_GC_INTERVAL".into(), "500ms".into()));
    agent_opts
        .env
        .push(("EXITORDER_GC_MIN_AGE".into(), "0s".into()));
    let bed = Bed::with_agent(node, agent_opts).await;
    let pid = bed.agent.pid().expect("agent pid");

    // The flooding pod keeps running: its proxy's directory fills while the others go.
    let flooder = bed.run_ready(&example("two-level")).await;
    let pods = bed.node.share_dir().join("pods");
    let live = pods.join(flooder.uid()).join("proxy");
    let mut victims = Vec::new();
    for i in 0..VICTIMS {
        let mut p = example("two-level");
        p["metadata"]["name"] = format!("victim-{i}").into();
        victims.push(bed.run_ready(&p).await);
    }
    // The gone pod's directory is filled aside and moved in whole: the agent would otherwise
    // start removing it while it fills.
    let stale_uid = random_uuid();
    let staging = bed.node.share_dir().join(".flood-staging");
    flood(staging.join(&stale_uid).join("proxy"))
        .join()
        .expect("flood thread");
    std::fs::rename(staging.join(&stale_uid), pods.join(&stale_uid)).expect("move into pods/");
    std::fs::remove_dir(&staging).expect("staging emptied");
    let live_flood = flood(live.clone());

    let uids: Vec<String> = victims.iter().map(|v| v.uid().to_owned()).collect();
    let deletions = futures_util::future::join_all(
        victims.into_iter().map(|v| async move { v.delete().await }),
    )
    .await;
    for (uid, d) in uids.iter().zip(&deletions) {
        let d = d.as_ref().expect("delete pod");
        bed.assert_ordered(d, uid, "proxy", "app").await;
    }
    live_flood.join().expect("flood thread");
    let decided: Vec<String> = uids
        .iter()
        .filter_map(|uid| {
            bed.agent
                .find(|l| l.is("allow", &[("pod", uid), ("container", "proxy")]))
                .and_then(|l| l.field("decided_us"))
        })
        .collect();
    eprintln!("flood: the agent's own part of each victim's allow, µs: {decided:?}");

    // The stale directory goes, in rounds: no round takes more than its share.
    until(
        "the flooded directory of the gone pod removed",
        secs(120),
        || {
            let gone = !pods.join(&stale_uid).exists();
            async move { gone }
        },
    )
    .await;
    let rounds = bed
        .agent
        .lines()
        .iter()
        .filter(|l| {
            l.field("pod").as_deref() == Some(stale_uid.as_str())
                && l.message()
                    .is_some_and(|m| m.contains("going on in the next"))
        })
        .count();
    assert!(
        rounds >= 3,
        "{FLOOD} entries removed in {rounds} unfinished rounds\n{}",
        bed.agent.log_tail(20)
    );
    // The running pod's own files are its own: the agent left them alone (and added only
    // its presence file, `agent`).
    let own = std::fs::read_dir(&live)
        .map(|d| d.flatten().filter(|e| e.file_name() != "agent").count())
        .unwrap_or(0);
    assert_eq!(own, FLOOD, "entries of the running pod were touched");
    let peak = exitorder_e2e::support::procfs::peak_rss_kib(pid);
    eprintln!("flood: agent peak RSS {} KiB", peak);
    assert!(peak < 64 * 1024, "agent peak RSS {peak} KiB");
    assert!(bed.agent.find(|l| l.text.contains("panicked")).is_none());

    // The flooding pod itself is still ordered when it goes.
    let uid = flooder.uid().to_owned();
    let d = flooder.delete().await.expect("delete flooding pod");
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.finish().await;
}
