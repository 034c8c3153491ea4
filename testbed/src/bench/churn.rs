//! The agent while pods come and go by the thousand: the benchmark's two-level pod is created
//! and deleted the kubelet's way, again and again, several at once, and the agent's resident
//! memory is read at the start, every so many pods, and at the end. What the agent keeps per
//! pod must go with the pod: its memory flattens once the oldest pods' traces (directories
//! that garbage collection removes a minute or two after their pod, tombstones kept five
//! minutes) are being dropped as fast as new ones come.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::Instrument;

use super::proc::{mib, Sample};
use super::summary::round3;
use super::{bench_pod, APP, PROXY, READY_TIMEOUT};
use crate::agentlog::AllowLog;
use crate::binaries::Binaries;
use crate::kubelet::{DeleteOptions, RunOptions};
use crate::node::{AgentProcess, Node, TestbedError};

/// How many pods, how many at once, how often the agent's memory is read.
#[derive(Debug, Clone, Copy)]
pub struct ChurnPlan {
    pub pods: usize,
    pub concurrency: usize,
    pub sample_every: usize,
}

/// One reading of the agent's memory during the churn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ChurnSample {
    /// Pods created and deleted so far.
    pub pods: usize,
    pub seconds: f64,
    pub rss_mib: f64,
}

/// The agent through a churn of pods.
#[derive(Debug, Clone, Serialize)]
pub struct ChurnRow {
    pub pods_asked: usize,
    /// Created, started and deleted without an error.
    pub pods_cycled: usize,
    /// Pods that did not start, or whose deletion failed; the first error.
    pub failures: usize,
    pub first_failure: Option<String>,
    pub concurrency: usize,
    pub seconds: f64,
    pub pods_per_second: f64,
    pub rss_start_mib: f64,
    /// The highest of the samples.
    pub rss_peak_mib: f64,
    pub rss_end_mib: f64,
    /// VmHWM at the end: the most ever resident, between samples included.
    pub rss_high_water_mib: f64,
    /// Least-squares slope of RSS over pods cycled, in KiB per 1,000 pods: over every
    /// sample, and over the second half of the run (once the oldest pods' traces are dropped
    /// as fast as new ones come).
    pub rss_slope_kib_per_1000_pods: Option<f64>,
    pub rss_slope_second_half_kib_per_1000_pods: Option<f64>,
    pub cpu_seconds: f64,
    /// The churned pods' proxies the agent allowed, by the reason it logged.
    pub allows: BTreeMap<String, usize>,
    /// What the agent reported holding at the end (its `/metrics`), besides memory.
    pub agent_state_at_end: BTreeMap<String, f64>,
    pub samples: Vec<ChurnSample>,
}

/// Least-squares slope of `y` over `x`; `None` with fewer than two distinct `x`.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// KiB per 1,000 pods from samples (MiB over pods).
fn kib_per_1000(samples: &[ChurnSample]) -> Option<f64> {
    let points: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| (s.pods as f64, s.rss_mib * 1024.0))
        .collect();
    slope(&points).map(|s| (s * 1000.0 * 10.0).round() / 10.0)
}

/// Samples taken by the workers as the count of pods done passes each mark.
struct Sampler {
    pid: u32,
    started: Instant,
    every: usize,
    done: AtomicUsize,
    samples: Mutex<Vec<ChurnSample>>,
}

impl Sampler {
    fn take(&self, pods: usize) -> Result<Sample, super::proc::ProcError> {
        let s = Sample::take(self.pid)?;
        if let Ok(mut v) = self.samples.lock() {
            v.push(ChurnSample {
                pods,
                seconds: round3(self.started.elapsed().as_secs_f64()),
                rss_mib: round3(mib(s.memory.rss_kib)),
            });
        }
        Ok(s)
    }

    /// One more pod done; a sample at each mark.
    fn pod_done(&self) {
        let n = self.done.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if n % self.every == 0 {
            // A process gone between two samples shows in the last one.
            if let Ok(s) = self.take(n) {
                eprintln!(
                    "bench: churn: {n} pods, agent RSS {:.2} MiB",
                    mib(s.memory.rss_kib)
                );
            }
        }
    }
}

/// One pod's life: created, started (both shells serving), deleted the kubelet's way.
async fn cycle(node: &Node, name: String) -> Result<String, TestbedError> {
    let spec = bench_pod(name, Duration::ZERO).map_err(|e| TestbedError::Task(e.to_string()))?;
    let pod = node.run_pod(&spec, &RunOptions::default()).await?;
    pod.wait_started(READY_TIMEOUT).await?;
    for c in [APP, PROXY] {
        pod.wait_output(c, "serving", READY_TIMEOUT).await?;
    }
    let uid = pod.uid().to_owned();
    pod.delete_with(DeleteOptions {
        grace_period: None,
        probe_exit_files: false,
        ..Default::default()
    })
    .await?;
    Ok(uid)
}

/// GET `/metrics` of the agent at `addr` (one HTTP/1.0 request); the per-pod series.
async fn agent_state(addr: &str) -> BTreeMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n")
            .await?;
        let mut text = String::new();
        s.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    let text = match tokio::time::timeout(Duration::from_secs(5), ask).await {
        Ok(Ok(t)) => t,
        _ => return BTreeMap::new(),
    };
    let per_pod = exitorder::serve::metrics::per_pod_series();
    text.lines()
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            per_pod
                .iter()
                .any(|s| s == series)
                .then(|| Some((series.to_owned(), value.parse().ok()?)))?
        })
        .collect()
}

/// Creates and deletes `plan.pods` pods, `plan.concurrency` at a time, with a fresh agent
/// (the containerd events source, its default settings) watching.
pub(super) async fn churn(
    node: &Node,
    bin: &Binaries,
    plan: ChurnPlan,
) -> anyhow::Result<ChurnRow> {
    use futures_util::StreamExt;
    let mut agent = super::agent::start_agent(node, bin, None).await?;
    let pid = agent
        .pid()
        .ok_or_else(|| anyhow::anyhow!("the agent has no pid"))?;
    let metrics = metrics_addr(&agent).await;
    let sampler = Sampler {
        pid,
        started: Instant::now(),
        every: plan.sample_every.max(1),
        done: AtomicUsize::new(0),
        samples: Mutex::new(Vec::new()),
    };
    let before = sampler.take(0)?;
    let t0 = Instant::now();
    // Every pod's life runs in its own kubelet worker task; these futures only drive them.
    let results: Vec<Result<String, TestbedError>> = futures_util::stream::iter(0..plan.pods)
        .map(|i| {
            let sampler = &sampler;
            async move {
                let res = cycle(node, format!("churn-{i}"))
                    .instrument(tracing::info_span!("churn_pod", pod = i))
                    .await;
                sampler.pod_done();
                res
            }
        })
        .buffer_unordered(plan.concurrency.max(1))
        .collect()
        .await;
    let seconds = t0.elapsed().as_secs_f64();
    let done = sampler.done.load(Ordering::Relaxed);
    if done % sampler.every != 0 {
        sampler.take(done)?;
    }
    let after = Sample::take(pid)?;
    let state = match &metrics {
        Some(addr) => agent_state(addr).await,
        None => BTreeMap::new(),
    };
    let uids: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().cloned())
        .collect();
    let allows = allows_of(&agent, &uids).await?;
    agent.kill();
    let failures: Vec<&TestbedError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let samples = sampler
        .samples
        .lock()
        .map(|s| s.clone())
        .unwrap_or_default();
    let half = samples.len() / 2;
    Ok(ChurnRow {
        pods_asked: plan.pods,
        pods_cycled: uids.len(),
        failures: failures.len(),
        first_failure: failures.first().map(|e| e.to_string()),
        concurrency: plan.concurrency,
        seconds: round3(seconds),
        pods_per_second: round3(uids.len() as f64 / seconds.max(1e-9)),
        rss_start_mib: round3(mib(before.memory.rss_kib)),
        rss_peak_mib: samples.iter().map(|s| s.rss_mib).fold(0.0, f64::max),
        rss_end_mib: round3(mib(after.memory.rss_kib)),
        rss_high_water_mib: round3(mib(after.memory.peak_kib)),
        rss_slope_kib_per_1000_pods: kib_per_1000(&samples),
        rss_slope_second_half_kib_per_1000_pods: samples.get(half..).and_then(kib_per_1000),
        cpu_seconds: round3((after.cpu_seconds - before.cpu_seconds).max(0.0)),
        allows,
        agent_state_at_end: state,
        samples,
    })
}

/// The agent's metrics address, from its "metrics listening" line.
async fn metrics_addr(agent: &AgentProcess) -> Option<String> {
    agent
        .wait_for("\"metrics listening\"", Duration::from_secs(10), |l| {
            l.says("metrics listening", &[])
        })
        .await
        .ok()
        .and_then(|l| l.field("addr"))
}

/// How many of the pods' proxies the agent allowed, by reason (waiting a few seconds at most
/// for its log to catch up).
async fn allows_of(
    agent: &AgentProcess,
    uids: &[String],
) -> anyhow::Result<BTreeMap<String, usize>> {
    let log: AllowLog = super::agent::agent_allows(agent, uids).await?;
    let mut by_reason = BTreeMap::new();
    for uid in uids {
        let reason = log
            .allows
            .get(&(uid.clone(), PROXY.to_owned()))
            .map_or("none", |a| a.reason.as_str());
        *by_reason.entry(reason.to_owned()).or_insert(0) += 1;
    }
    Ok(by_reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes_are_least_squares() {
        assert_eq!(slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]), Some(2.0));
        assert_eq!(slope(&[(0.0, 4.0), (10.0, 4.0)]), Some(0.0));
        assert_eq!(slope(&[(1.0, 4.0)]), None);
        assert_eq!(slope(&[(1.0, 4.0), (1.0, 5.0)]), None);
        let flat = [
            ChurnSample {
                pods: 0,
                seconds: 0.0,
                rss_mib: 10.0,
            },
            ChurnSample {
                pods: 1000,
                seconds: 1.0,
                rss_mib: 10.5,
            },
            ChurnSample {
                pods: 2000,
                seconds: 2.0,
                rss_mib: 11.0,
            },
        ];
        assert_eq!(kib_per_1000(&flat), Some(512.0));
    }
}
