//! A node where pods come and go by the thousand: the agent's state per pod goes with the pod.
//!
//! On the real agent loop against the fake runtime, 1,000 pods (`EXITORDER_CHURN_PODS` for
//! more) are created, ordered or finished, and removed, 50 at a time. Afterwards everything the
//! agent keeps per pod, as its own `/metrics` reports it, is back where it was before the
//! churn: the node view holds only the pod that stayed, no wait is pending, no tombstone, log
//! key, exit-file history or directory watch of a gone pod is left, the Jobs task tracks no
//! pod, and garbage collection has removed every pod directory and Job record. Removed containers' tombstones are kept for
//! `tombstone_ttl` (5 minutes by default); the tests set it to a second so that their going
//! is seen, not assumed.

use exitorder_e2e::fakeapi;
use exitorder_e2e::fakecri;
use exitorder_e2e::rig;
use exitorder_e2e::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use exitorder::agent::Config;
use exitorder::cri::ContainerState;
use exitorder::decide::priority::ANNOTATION;
use exitorder::decide::Reason;
use exitorder::stats::Stats;
use exitorder::{cluster, serve::openmetrics};
use fakeapi::FakeApi;
use fakecri::pod_name;
use rig::*;
use serde_json::{json, Value};
use tokio::sync::watch;

/// Pods per run; `EXITORDER_CHURN_PODS` makes a longer run, which prints the test process's
/// memory every 1,000 pods.
const DEFAULT_PODS: usize = 1_000;
const AT_ONCE: usize = 50;
const NODE: &str = "node-a";

/// What the agent's share holds besides its metrics' per-pod series (pods' and jobs' entries),
/// which must come back down too.
const SHARE_ENTRIES: &str = "share_entries";

fn pods_to_churn() -> usize {
    std::env::var("EXITORDER_CHURN_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n: &usize| *n >= AT_ONCE)
        .unwrap_or(DEFAULT_PODS)
}

fn uid(i: usize) -> String {
    format!("0f5c7a1e-8d2b-4c3e-9f00-{i:012}")
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Quick rounds, so that the churn's end is seen within seconds.
fn tune(cfg: &mut Config, share: &std::path::Path) {
    cfg.poll_interval = Duration::from_millis(10);
    cfg.gc_interval = Duration::from_millis(200);
    cfg.gc_min_age = Duration::ZERO;
    cfg.reconcile_interval = Duration::from_millis(500);
    cfg.tombstone_ttl = Duration::from_secs(1);
    cfg.api_settle = Duration::from_millis(50);
    // No kubelet on this machine's path: the share alone.
    cfg.kubelet_root_dir = share.join("no-kubelet");
}

/// The per-pod series of the agent's `/metrics`, and the entries left in the share's `pods/`
/// and `jobs/` directories.
fn per_pod(rig: &Rig) -> BTreeMap<String, f64> {
    let all: BTreeMap<String, f64> = support::parse_metrics(&openmetrics::render(&rig.stats))
        .into_iter()
        .collect();
    let entries = |dir: &str| {
        std::fs::read_dir(rig.share.join(dir))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    exitorder::serve::metrics::per_pod_series()
        .into_iter()
        .map(|series| {
            let v = *all
                .get(&series)
                .unwrap_or_else(|| panic!("no {series} in /metrics"));
            (series, v)
        })
        .chain([(
            SHARE_ENTRIES.to_owned(),
            (entries("pods") + entries("jobs")) as f64,
        )])
        .collect()
}

/// A pod that stays, as a node always has some (the agent's own): a runtime that lists no pod
/// at all is never taken at its word by garbage collection. Returns the agent's per-pod state
/// once it has listed it: the baseline the churn must return to.
async fn resident(rig: &Rig, total: usize) -> BTreeMap<String, f64> {
    rig.cri().add_pod(&uid(total), &[]);
    rig.cri().add_container(&uid(total), "resident", 0, 30);
    support::until("the resident pod listed", Duration::from_secs(30), || {
        let listed = rig.stats.view_size() == (1, 1);
        async move { listed }
    })
    .await;
    per_pod(rig)
}

/// Waits until the agent's per-pod state is back at `baseline`.
async fn back_to(rig: &Rig, baseline: &BTreeMap<String, f64>) {
    let mut last = BTreeMap::new();
    let back = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            last = per_pod(rig);
            if last == *baseline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        back.is_ok(),
        "per-pod state not back to the baseline within 60 s:\n  baseline {baseline:?}\n  now      {last:?}"
    );
}

fn progress(done: usize, rig: &Rig) {
    if done % 1_000 == 0 {
        let (containers, pods) = rig.stats.view_size();
        eprintln!(
            "churn: {done} pods, RSS {} KiB, view {pods} pods {containers} containers",
            rss_kib()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churn_of_a_thousand_pods_leaves_nothing_behind() {
    let total = pods_to_churn();
    let mut rig = Rig::new();
    let share = rig.share.clone();
    rig.start_agent_with(|cfg| tune(cfg, &share));
    let baseline = resident(&rig, total).await;
    let start_rss = rss_kib();
    let mut peak_rss = start_rss;
    for batch in 0..total / AT_ONCE {
        let mut pods = Vec::new();
        for i in batch * AT_ONCE..(batch + 1) * AT_ONCE {
            let uid = uid(i);
            rig.cri().add_pod(&uid, &[(ANNOTATION, r#"{"proxy":1}"#)]);
            let app = rig.cri().add_container(&uid, "app", 0, 60);
            rig.cri().add_container(&uid, "proxy", 0, 60);
            let f = rig.request_exit(&uid, "proxy");
            pods.push((uid, app, f));
        }
        for (_, app, _) in &pods {
            rig.cri().set_state(app, ContainerState::ContainerExited);
        }
        for (uid, _, f) in &pods {
            assert!(
                allowed_within(f, Duration::from_secs(30)).await,
                "pod {uid} was not allowed"
            );
        }
        // The preStop took its answer away, the kubelet removed the pod.
        for (uid, _, f) in &pods {
            let _ = std::fs::remove_file(f);
            rig.cri().remove_pod(uid);
        }
        peak_rss = peak_rss.max(rss_kib());
        progress((batch + 1) * AT_ONCE, &rig);
    }
    allows_reach(&rig.stats, Reason::Ordered, total as u64).await;
    back_to(&rig, &baseline).await;
    eprintln!(
        "churn: {total} pods, test process RSS {start_rss} KiB at the start, {peak_rss} KiB at the peak, {} KiB at the end",
        rss_kib()
    );
    rig.stop_agent().await;
}

/// A Job's pod as the API server has it: an `app` and a `logs` sidecar (exit priority 1) that
/// never exits of itself; restartPolicy Never.
fn job_pod(uid: &str) -> Value {
    let mut pod = fakeapi::pod(uid, &pod_name(uid), NODE, None);
    pod["spec"]["restartPolicy"] = json!("Never");
    pod["spec"]["containers"] =
        json!([{"name": "app", "image": "app"}, {"name": "logs", "image": "logs"}]);
    pod["metadata"]["annotations"][ANNOTATION] = json!(r#"{"logs":1}"#);
    pod
}

/// One pod of the churn, and what becomes of it.
enum Fate {
    /// Deleted the way the kubelet deletes it: its proxy waits for its app.
    Deleted {
        app: String,
        exit: std::path::PathBuf,
    },
    /// A Job whose app finishes: the agent stops its sidecar.
    Finished { app: String, logs: String },
    /// A Job deleted while its app still runs.
    Abandoned,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churn_of_jobs_and_deleted_pods_with_an_api_server_leaves_nothing_behind() {
    let total = pods_to_churn();
    let mut rig = Rig::new();
    let api = FakeApi::default().serve();
    rig.stats = Arc::new(Stats::default());
    let (stop, stopped) = watch::channel(false);
    let (link, tasks) = cluster::start(support::api_client(&api), NODE, rig.stats.clone());
    let tasks = tokio::spawn(tasks.run(stopped));
    let share = rig.share.clone();
    rig.start_agent_linked(|cfg| tune(cfg, &share), Some(link));
    support::until("the pod watch current", Duration::from_secs(10), || {
        let up = rig.stats.api_watch() == "up";
        async move { up }
    })
    .await;
    let baseline = resident(&rig, total).await;
    let (mut deleted, mut finished) = (0, Vec::new());
    for batch in 0..total / AT_ONCE {
        let mut pods = Vec::new();
        for i in batch * AT_ONCE..(batch + 1) * AT_ONCE {
            let uid = uid(i);
            let (fate, api_pod) = if i % 2 == 0 {
                rig.cri().add_pod(&uid, &[(ANNOTATION, r#"{"proxy":1}"#)]);
                let app = rig.cri().add_container(&uid, "app", 0, 60);
                rig.cri().add_container(&uid, "proxy", 0, 60);
                let exit = rig.request_exit(&uid, "proxy");
                let api_pod = fakeapi::pod(&uid, &pod_name(&uid), NODE, Some((60, 60)));
                (Fate::Deleted { app, exit }, api_pod)
            } else {
                rig.cri().add_pod(&uid, &[(ANNOTATION, r#"{"logs":1}"#)]);
                let app = rig.cri().add_container(&uid, "app", 0, 30);
                let logs = rig.cri().add_container(&uid, "logs", 0, 30);
                let fate = if i % 4 == 1 {
                    Fate::Finished { app, logs }
                } else {
                    Fate::Abandoned
                };
                (fate, job_pod(&uid))
            };
            api.api.apply(api_pod.clone());
            pods.push((uid, fate, api_pod));
        }
        // Every Job pod of the batch tracked by the Jobs task before any finishes or goes
        // (pods of earlier batches not yet forgotten only make the count come sooner): the
        // abandoned ones leave state behind unless the agent forgets it.
        let jobs = pods
            .iter()
            .filter(|(_, f, _)| !matches!(f, Fate::Deleted { .. }))
            .count() as u64;
        support::until("the batch's Jobs tracked", Duration::from_secs(30), || {
            let tracked = rig.stats.job_pods() >= jobs;
            async move { tracked }
        })
        .await;
        for (_, fate, _) in &pods {
            match fate {
                Fate::Deleted { app, .. } | Fate::Finished { app, .. } => {
                    rig.cri().set_state(app, ContainerState::ContainerExited)
                }
                Fate::Abandoned => {}
            }
        }
        for (uid, fate, _) in &pods {
            match fate {
                Fate::Deleted { exit, .. } => {
                    assert!(
                        allowed_within(exit, Duration::from_secs(30)).await,
                        "pod {uid} was not allowed"
                    );
                    deleted += 1;
                }
                Fate::Finished { logs, .. } => {
                    support::until("the Job's sidecar stopped", Duration::from_secs(30), || {
                        let stopped = rig.cri().stopped().contains(logs);
                        async move { stopped }
                    })
                    .await;
                    finished.push(logs.clone());
                }
                Fate::Abandoned => {}
            }
        }
        // The kubelet removes them; the API server forgets them.
        for (uid, fate, api_pod) in pods {
            if let Fate::Deleted { exit, .. } = fate {
                let _ = std::fs::remove_file(exit);
            }
            rig.cri().remove_pod(&uid);
            api.api.delete(api_pod);
        }
        progress((batch + 1) * AT_ONCE, &rig);
    }
    allows_reach(&rig.stats, Reason::Ordered, deleted).await;
    back_to(&rig, &baseline).await;
    // Each finished Job's sidecar was stopped once: forgetting a pod that is gone never made
    // the agent forget what it did for a pod that is still there.
    let mut stopped = rig.cri().stopped();
    stopped.sort();
    finished.sort();
    assert_eq!(stopped, finished);
    rig.stop_agent().await;
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), tasks)
        .await
        .expect("cluster tasks stop within their bound")
        .expect("cluster tasks");
}
