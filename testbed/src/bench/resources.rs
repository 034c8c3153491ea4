//! Part 3: the agent's memory and CPU, idle with many pods and while all of them are deleted
//! at once, with the runtime's own listing time beside it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use tracing::Instrument;

use super::agent::{agent_allows, connected_source, start_agent};
use super::detect::{agent_trials, forget_pods};
use super::kernelclock::KernelClock;
use super::measure::assess;
use super::proc::{mib, Sample};
use super::report::{BurstRow, IdleRow, Usage};
use super::{bench_pod, delete_all, start_pods, watch_apps, BenchArgs, PROBE_PERIOD};
use crate::binaries::Binaries;
use crate::node::Node;
use exitorder::handshake::share::Share;

/// How long the runtime takes to list every container (what the agent does on each decision
/// round), every [`PROBE_PERIOD`] until `stop`: tells a slow agent from a saturated runtime.
pub(super) async fn list_latencies(
    client: exitorder::cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<f64> {
    let mut out = Vec::new();
    loop {
        let mut c = client.clone();
        let t0 = Instant::now();
        let mut req = tonic::Request::new(exitorder::cri::ListContainersRequest { filter: None });
        req.set_timeout(Duration::from_secs(120));
        let call = c.list_containers(req);
        tokio::select! {
            res = call => {
                if res.is_ok() {
                    out.push(t0.elapsed().as_secs_f64() * 1e3);
                }
            }
            _ = stop.changed() => return out,
        }
        tokio::select! {
            () = tokio::time::sleep(PROBE_PERIOD) => {}
            _ = stop.changed() => return out,
        }
    }
}

pub(super) fn usage(before: &Sample, after: &Sample) -> Usage {
    Usage {
        rss_mib: mib(after.memory.rss_kib),
        peak_rss_mib: mib(after.memory.peak_kib),
        cpu_seconds: (after.cpu_seconds - before.cpu_seconds).max(0.0),
        cpu_wait_seconds: (after.cpu_wait_seconds - before.cpu_wait_seconds).max(0.0),
    }
}

pub(super) async fn resources(
    node: &Node,
    args: &BenchArgs,
    bin: &Binaries,
) -> anyhow::Result<(IdleRow, BurstRow)> {
    let mut agent = start_agent(node, bin, None).await?;
    let pid = agent.pid().ok_or_else(|| anyhow!("the agent has no pid"))?;
    let source = connected_source(&agent).await;
    progress!(
        "resources: agent pid {pid}, exit source {}; starting {} pods, {} at once",
        source.as_deref().unwrap_or("poll"),
        args.idle_pods,
        args.start_concurrency
    );
    let specs = (0..args.idle_pods)
        .map(|i| bench_pod(format!("idle-{i}"), args.app_drain))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (mut pods, errors) = start_pods(node, specs, args.start_concurrency).await;
    if let Some(e) = errors.first() {
        progress!(
            "{} of {} idle pods did not start: {e}",
            errors.len(),
            args.idle_pods
        );
    }
    progress!(
        "resources: idle for {:?} with {} pods",
        args.idle,
        pods.len()
    );
    let before = Sample::take(pid)?;
    let t0 = Instant::now();
    tokio::time::sleep(args.idle).await;
    let after = Sample::take(pid)?;
    let u = usage(&before, &after);
    let idle = IdleRow::new(pods.len(), t0.elapsed().as_secs_f64(), u);

    let extra = args.burst_pods.saturating_sub(pods.len());
    if extra > 0 {
        progress!("resources: starting {extra} more pods for the burst");
        let specs = (0..extra)
            .map(|i| bench_pod(format!("burst-{i}"), args.app_drain))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (more, errors) = start_pods(node, specs, args.start_concurrency).await;
        if let Some(e) = errors.first() {
            progress!(
                "{} of {extra} burst pods did not start (carrying on with the {} that did): {e}",
                errors.len(),
                pods.len() + more.len()
            );
        }
        pods.extend(more);
    }
    let started = pods.len();
    let mut clock = KernelClock::start();
    let mut stamps = super::appclock::AppStamps::default();
    watch_apps(node, &mut clock, &mut stamps, &pods).await;
    progress!("resources: deleting {started} pods at once");
    let before = Sample::take(pid)?;
    let t0 = Instant::now();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut probe = tokio::task::JoinSet::new();
    probe.spawn(
        list_latencies(node.client(), stopped).instrument(tracing::info_span!("runtime_probe")),
    );
    let deleted = delete_all(pods, Duration::ZERO).await;
    let seconds = t0.elapsed().as_secs_f64();
    let _ = stop.send(true);
    let list_ms = probe
        .join_next()
        .await
        .and_then(Result::ok)
        .unwrap_or_default();
    let uids: Vec<String> = deleted.iter().map(|(u, _)| u.clone()).collect();
    let log = agent_allows(&agent, &uids).await?;
    let after = Sample::take(pid)?;
    let ok = deleted.iter().filter(|(_, r)| r.is_ok()).count();
    let failed: HashSet<&str> = deleted
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(u, _)| u.as_str())
        .collect();
    if let Some((_, Err(e))) = deleted.iter().find(|(_, r)| r.is_err()) {
        progress!("{} deletions failed, the first: {e}", failed.len());
    }
    agent.kill();
    if let Ok(share) = Share::open(node.share_dir()) {
        forget_pods(&share, uids.iter().map(String::as_str));
    }
    let mut burst = BurstRow::new(
        (args.burst_pods, started, ok),
        seconds,
        usage(&before, &after),
        &assess(&agent_trials(&deleted, &log, &clock, &stamps)),
    );
    burst.set_runtime_list(&list_ms);
    Ok((idle, burst))
}
