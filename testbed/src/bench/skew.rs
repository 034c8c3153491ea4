//! How far apart the kubelet's preStop hooks of one pod kill reach the agent on a busy node:
//! the figure the agent's `--kill-evidence-window` must exceed (a restart is told from a pod
//! kill by the other containers' silence within it; see docs/architecture.md, "Why a container stops").
//!
//! Many pods of three containers, every one with exitorder's preStop as the webhook injects it
//! (the app's `mark`, the proxy's and the log shipper's `wait`), are killed at once the
//! kubelet's way (every preStop of a pod at once, every pod at once), with no API server: the
//! marks alone tell the agent that the pods are killed. Per pod, the spread between the first
//! and the last of its containers' marks as the agent saw them (its own log's stamps); and
//! every allow's reason: a `not_terminating` one would be a pod kill taken for a restart.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use super::agent::start_agent_with;
use super::summary::summarize;
use super::READY_TIMEOUT;
use crate::binaries::Binaries;
use crate::kubelet::{DeleteOptions, Kill, RunOptions, RunningPod};
use crate::node::Node;

/// The pod: app (mark), proxy (wait, priority 1), logs (wait, priority 2), as injected, in the
/// host share's layout.
const SKEW_POD: &str = include_str!("../../pods/skew.yaml");
const CONTAINERS: [&str; 3] = ["app", "proxy", "logs"];

/// What the run found.
#[derive(Debug, Clone, Serialize)]
pub struct SkewRow {
    /// The pods killed at once.
    pub pods: usize,
    /// Pods whose three marks the agent saw.
    pub pods_measured: usize,
    /// Per pod killed at once, from its first mark to its last, as the agent saw them (ms).
    pub spread_p50_ms: Option<f64>,
    pub spread_p99_ms: Option<f64>,
    pub spread_max_ms: Option<f64>,
    /// The longest the node went without any mark while a pod killed at once had marked but
    /// not all its containers had (ms): the agent's window starts over from the node's last
    /// mark, so this is what it must exceed.
    pub node_gap_max_ms: Option<f64>,
    /// The same from the kubelet's side: the longest no preStop exec of the node returned
    /// while a pod's had begun to (ms): how long the runtime itself stalled.
    pub exec_quiet_max_ms: Option<f64>,
    /// Allows by reason, every container of every pod killed at once.
    pub allows: BTreeMap<String, usize>,
    /// Pods killed one at a time afterwards, each alone on the node.
    pub alone_pods: usize,
    /// Per pod killed alone, its first mark to its last (ms).
    pub alone_spread_p50_ms: Option<f64>,
    pub alone_spread_p99_ms: Option<f64>,
    pub alone_spread_max_ms: Option<f64>,
    /// Allows by reason of the pods killed alone.
    pub alone_allows: BTreeMap<String, usize>,
    pub seconds: f64,
}

/// The pod specs, named `prefix-i`.
fn specs(prefix: &str, n: usize) -> anyhow::Result<Vec<serde_json::Value>> {
    (0..n)
        .map(|i| {
            let mut pod = crate::kubelet::pod_from_yaml(SKEW_POD)?;
            pod["metadata"]["name"] = serde_json::json!(format!("{prefix}-{i}"));
            Ok(pod)
        })
        .collect()
}

/// Starts the pods and waits until every container serves.
async fn start(
    node: &Node,
    specs: Vec<serde_json::Value>,
    concurrency: usize,
) -> anyhow::Result<Vec<RunningPod>> {
    let mut running = Vec::new();
    for res in node
        .run_pods(specs, &RunOptions::default(), concurrency, READY_TIMEOUT)
        .await
    {
        let p = res.context("starting a pod")?;
        for c in CONTAINERS {
            p.wait_output(c, "serving", READY_TIMEOUT)
                .await
                .with_context(|| format!("{c} of {} never served", p.name()))?;
        }
        running.push(p);
    }
    Ok(running)
}

/// Kills a pod the kubelet's way with no API server and no Event; when each of its preStop
/// execs returned (Unix ns), by its pod.
async fn kill(p: RunningPod) -> anyhow::Result<(String, Vec<i64>)> {
    let d = p
        .delete_with(DeleteOptions {
            kill: Kill::Silent,
            probe_exit_files: false,
            ..DeleteOptions::default()
        })
        .await
        .context("killing a pod")?;
    let returns = d
        .containers
        .iter()
        .filter_map(|c| c.prestop.as_ref().map(|h| h.returned_ns))
        .collect();
    Ok((d.pod_uid, returns))
}

/// Each pod's marks (Unix ns), and the allows by reason, of the pods `uids`, from the agent's
/// log.
fn marks_and_allows(
    lines: &[crate::node::LogLine],
    uids: &[String],
) -> (BTreeMap<String, Vec<i64>>, BTreeMap<String, usize>) {
    let mut marks: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut allows: BTreeMap<String, usize> = BTreeMap::new();
    for l in lines {
        let Some(pod) = l.field("pod").filter(|p| uids.contains(p)) else {
            continue;
        };
        if l.is("marked", &[]) || l.is("waiting", &[]) {
            if let Some(at) = l.at_ns() {
                marks.entry(pod).or_default().push(at);
            }
        } else if l.is("allow", &[]) {
            if let Some(reason) = l.field("reason") {
                *allows.entry(reason).or_default() += 1;
            }
        }
    }
    (marks, allows)
}

/// The longest the node went without any mark while some pod had marked but not all its
/// containers had (ms): how long a kill in progress saw the node quiet, which the agent's
/// window, starting over from the node's last mark, must exceed.
fn quiet_within_a_kill(marks: &BTreeMap<String, Vec<i64>>) -> Option<f64> {
    let mut all: Vec<i64> = marks.values().flatten().copied().collect();
    all.sort_unstable();
    let mut longest: Option<i64> = None;
    for m in marks.values().filter(|m| m.len() >= CONTAINERS.len()) {
        let (Some(first), Some(last)) = (m.iter().min(), m.iter().max()) else {
            continue;
        };
        let inside: Vec<i64> = all
            .iter()
            .copied()
            .filter(|t| t >= first && t <= last)
            .collect();
        for w in inside.windows(2) {
            let g = w[1] - w[0];
            longest = Some(longest.map_or(g, |l| l.max(g)));
        }
    }
    longest.map(|ns| ns as f64 / 1e6)
}

/// Per pod with all its marks, its first to its last (ms).
fn spreads(marks: &BTreeMap<String, Vec<i64>>) -> Vec<f64> {
    marks
        .values()
        .filter(|m| m.len() >= CONTAINERS.len())
        .filter_map(|m| Some((*m.iter().max()? - *m.iter().min()?) as f64 / 1e6))
        .collect()
}

/// Runs `pods` pods and kills them all at once, then `alone` pods one at a time.
pub async fn skew(
    node: &Node,
    bin: &Binaries,
    pods: usize,
    alone: usize,
    concurrency: usize,
) -> anyhow::Result<SkewRow> {
    let started = std::time::Instant::now();
    let mut agent = start_agent_with(node, bin, &[("EXITORDER_LOG", "exitorder=debug")]).await?;
    let running = start(node, specs("skew", pods)?, concurrency).await?;
    progress!(
        "skew: {} pods running; killing them all at once",
        running.len()
    );
    let uids: Vec<String> = running.iter().map(|p| p.uid().to_owned()).collect();
    let mut returns: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for res in futures_util::future::join_all(running.into_iter().map(kill)).await {
        let (uid, r) = res?;
        returns.insert(uid, r);
    }
    let exec_quiet = quiet_within_a_kill(&returns);
    let (marks, allows) = marks_and_allows(&agent.lines(), &uids);
    let gap = quiet_within_a_kill(&marks);
    let together = spreads(&marks);
    let s = summarize(&together);
    let running = start(node, specs("alone", alone)?, concurrency).await?;
    progress!("skew: {alone} pods killed one at a time, with a CPU hog per core");
    let alone_uids: Vec<String> = running.iter().map(|p| p.uid().to_owned()).collect();
    let hogs = super::busy::CpuHogs::start();
    for p in running {
        kill(p).await?;
    }
    drop(hogs);
    let (alone_marks, alone_allows) = marks_and_allows(&agent.lines(), &alone_uids);
    let a = summarize(&spreads(&alone_marks));
    let _ = agent.terminate(Duration::from_secs(10)).await;
    Ok(SkewRow {
        pods: uids.len(),
        pods_measured: together.len(),
        spread_p50_ms: s.map(|s| s.p50_ms),
        spread_p99_ms: s.map(|s| s.p99_ms),
        spread_max_ms: s.map(|s| s.max_ms),
        node_gap_max_ms: gap,
        exec_quiet_max_ms: exec_quiet,
        allows,
        alone_pods: alone_uids.len(),
        alone_spread_p50_ms: a.map(|s| s.p50_ms),
        alone_spread_p99_ms: a.map(|s| s.p99_ms),
        alone_spread_max_ms: a.map(|s| s.max_ms),
        alone_allows,
        seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    })
}

impl SkewRow {
    pub fn table(&self) -> String {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
        let reasons = |m: &BTreeMap<String, usize>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "\nKill skew: pods of three containers (app marking, proxy and logs waiting) killed \
             by the kubelet with no API server; per pod, its first mark to its last as the agent \
             saw them.\n  {} pods at once ({} measured): spread p50 {} ms, p99 {} ms, max {} \
             ms; the node's longest quiet inside a pod's kill {} ms as the agent saw it ({} ms as the \
             runtime returned the execs); allows: {}\n  {} pods one at a \
             time, a CPU hog per core: spread p50 {} ms, p99 {} ms, max {} ms; allows: {}\n",
            self.pods,
            self.pods_measured,
            ms(self.spread_p50_ms),
            ms(self.spread_p99_ms),
            ms(self.spread_max_ms),
            ms(self.node_gap_max_ms),
            ms(self.exec_quiet_max_ms),
            reasons(&self.allows),
            self.alone_pods,
            ms(self.alone_spread_p50_ms),
            ms(self.alone_spread_p99_ms),
            ms(self.alone_spread_max_ms),
            reasons(&self.alone_allows),
        )
    }
}
