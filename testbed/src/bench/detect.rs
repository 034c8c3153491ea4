//! Part 1: app exit -> `allow` written, over many pod deletions, for the agent (with the
//! runtime's events, or polling) and the Kruise-style daemon, each pod's trigger the app's own
//! stamp of its exit (else the kernel's, else the runtime's).

use anyhow::{bail, Context};
use tracing::Instrument;

use super::agent::{agent_allows, connected_source, start_agent, AgentSource};
use super::appclock::AppStamps;
use super::baseline::{KruiseDaemon, KRUISE_SCAN};
use super::floor::WakeProbe;
use super::kernelclock::KernelClock;
use super::measure::{self, assess, Allow, PreStop, Trial};
use super::report::DetectRow;
use super::{
    bench_pod, delete_all, random_fraction, start_pods, watch_apps, BenchArgs, APP, BATCH_JITTER,
    PROXY,
};
use crate::agentlog::AllowLog;
use crate::binaries::Binaries;
use crate::kubelet::Deletion;
use crate::node::{Node, TestbedError};
use exitorder::handshake::share::{ContainerName, ExitKey, Share};
use exitorder::pod::PodUid;

/// Whether the proxy's preStop waited, from the deletion's record of it.
pub(super) fn prestop_of(res: &Result<Deletion, TestbedError>) -> PreStop {
    let hook = res
        .as_ref()
        .ok()
        .and_then(|d| d.container(PROXY))
        .and_then(|c| c.prestop.as_ref())
        .map(|h| (h.ok, h.detail.as_str()));
    match measure::never_waited(hook) {
        None => PreStop::Waited,
        Some(why) => PreStop::NeverWaited(why),
    }
}

/// When the proxy's preStop returned, as the runtime ended its exec.
fn returned_ns(res: &Result<Deletion, TestbedError>) -> Option<i64> {
    let hook = res.as_ref().ok()?.container(PROXY)?.prestop.as_ref()?;
    hook.ok.then_some(hook.returned_ns)
}

/// When the app exited: what the proxy waits for, and whether the app stamped it. As the app
/// stamped it just before its exit; else as the kernel saw it (the test bed's own pidfd) or the
/// runtime stamped it (`finished_at`, after its bookkeeping), the earlier of the two, as either
/// can come late on a busy node.
pub(super) fn trigger_ns(
    d: &Deletion,
    clock: &KernelClock,
    stamps: &AppStamps,
) -> Option<(i64, bool)> {
    if let Some(own) = stamps.stamp(&d.pod_uid) {
        return Some((own, true));
    }
    let app = d.container(APP)?;
    Some(match clock.stamp(&app.id) {
        Some(kernel) => (kernel.min(app.finished_at_ns), false),
        None => (app.finished_at_ns, false),
    })
}

/// Where the bench pods' exit directories are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// The node's share (bench.yaml as written): a directory on the node's disk.
    Share,
    /// The pod's own `exitorder` volume, as the webhook injects it once the agents are
    /// rolled out: a 1 MiB tmpfs (`medium: Memory`) the kubelet mounts, the proxy's
    /// directory its `subPath`.
    PodLocal,
}

impl Layout {
    /// `pod` with its exit directory in this layout.
    fn apply(self, mut pod: serde_json::Value) -> serde_json::Value {
        use exitorder_contract::podlocal;
        if self == Layout::PodLocal {
            for v in pod["spec"]["volumes"].as_array_mut().into_iter().flatten() {
                if v["name"] == podlocal::VOLUME {
                    *v = serde_json::json!({"name": podlocal::VOLUME, "emptyDir": {
                        "medium": podlocal::VOLUME_MEDIUM,
                        "sizeLimit": podlocal::VOLUME_SIZE_LIMIT}});
                }
            }
            let proxy = pod["spec"]["containers"]
                .as_array_mut()
                .and_then(|cs| cs.iter_mut().find(|c| c["name"] == PROXY));
            for m in proxy
                .and_then(|c| c["volumeMounts"].as_array_mut())
                .into_iter()
                .flatten()
            {
                if m["name"] == podlocal::VOLUME {
                    *m = serde_json::json!({"name": podlocal::VOLUME,
                        "mountPath": exitorder_contract::mount::EXIT_DIR, "subPath": PROXY});
                }
            }
        }
        pod
    }

    /// The pod names' tag.
    fn tag(self) -> &'static str {
        match self {
            Layout::Share => "",
            Layout::PodLocal => "-local",
        }
    }
}

/// Removes deleted pods' share directories (the kubelet would, with the pod's volumes) so
/// later phases start from a share that holds only live pods.
pub(super) fn forget_pods<'a>(share: &Share, uids: impl IntoIterator<Item = &'a str>) {
    for uid in uids {
        if let Ok(pod) = PodUid::parse(uid) {
            let _ = share.remove_pod(
                &pod,
                &mut exitorder::handshake::share::Budget::new(u64::MAX),
            );
        }
    }
}

/// Deletes `args.deletions` fresh pods in batches of `args.batch`; the pods of each batch are
/// started just before it. Any pod that does not start is an error: every deletion asked
/// for is measured.
pub(super) async fn delete_in_batches(
    node: &Node,
    args: &BenchArgs,
    tag: &str,
    layout: Layout,
    clock: &mut KernelClock,
    stamps: &mut AppStamps,
) -> anyhow::Result<Vec<(String, Result<Deletion, TestbedError>)>> {
    let share = Share::open(node.share_dir()).context("opening the share")?;
    let mut out = Vec::with_capacity(args.deletions);
    let mut batch_no = 0;
    while out.len() < args.deletions {
        let n = args.batch.min(args.deletions - out.len());
        let specs = (0..n)
            .map(|i| {
                let name = format!("{tag}{}-{batch_no}-{i}", layout.tag());
                bench_pod(name, args.app_drain).map(|p| layout.apply(p))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (pods, errors) = start_pods(node, specs, args.start_concurrency).await;
        if let Some(e) = errors.into_iter().next() {
            bail!("a pod of {tag} batch {batch_no} did not start: {e}");
        }
        watch_apps(node, clock, stamps, &pods).await;
        // A random pause, so that periodic work (a poll, the baseline's 1 s scan) meets each
        // batch at a random phase rather than locked to the rhythm of the batches.
        tokio::time::sleep(BATCH_JITTER.mul_f64(random_fraction())).await;
        let done = delete_all(pods, args.stagger).await;
        forget_pods(&share, done.iter().map(|(uid, _)| uid.as_str()));
        out.extend(done);
        batch_no += 1;
        if batch_no % 5 == 0 || out.len() == args.deletions {
            progress!("{tag}: {}/{} pods deleted", out.len(), args.deletions);
        }
    }
    Ok(out)
}

/// Trials from deletions and the agent's log.
pub(super) fn agent_trials(
    deleted: &[(String, Result<Deletion, TestbedError>)],
    log: &AllowLog,
    clock: &KernelClock,
    stamps: &AppStamps,
) -> Vec<Trial> {
    deleted
        .iter()
        .map(|(uid, res)| {
            let key = (uid.clone(), PROXY.to_owned());
            let exit = res.as_ref().ok().and_then(|d| trigger_ns(d, clock, stamps));
            Trial {
                exit_ns: exit.map(|(at, _)| at),
                exit_by_app: exit.is_some_and(|(_, own)| own),
                allow: log.allows.get(&key).map(|a| Allow {
                    at_ns: a.at_ns,
                    reason: a.reason.clone(),
                    wait_since_ns: a.wait_since_ns,
                    decided_ns: a.decided_ns,
                    write_ns: a.write_ns,
                    kernel_ns: a.kernel_ns,
                    told_by: a.exit_told_by.clone(),
                }),
                prestop: prestop_of(res),
                returned_ns: returned_ns(res),
                deletion_failed: res.is_err(),
            }
        })
        .collect()
}

pub(super) async fn detect_with_agent(
    node: &Node,
    args: &BenchArgs,
    bin: &Binaries,
    source: AgentSource,
    layout: Layout,
) -> anyhow::Result<DetectRow> {
    progress!(
        "{}: the agent with EXITORDER_EXIT_SOURCE={}, exit directories {}; {} deletions, {} at once",
        source.name(),
        source.env_value(),
        match layout {
            Layout::Share => "in the node's share",
            Layout::PodLocal => "in each pod's tmpfs",
        },
        args.deletions,
        args.batch
    );
    let mut agent = start_agent(node, bin, Some(source)).await?;
    let connected = connected_source(&agent).await;
    let expected = match source {
        AgentSource::Events => Some(source.name()),
        AgentSource::Poll => None,
    };
    if connected.as_deref() != expected {
        bail!(
            "the agent asked for {} connected {:?}; its log ends with:\n{}",
            source.name(),
            connected,
            agent.log_tail(20)
        );
    }
    let mut clock = KernelClock::start();
    let mut stamps = AppStamps::default();
    let probe = WakeProbe::start();
    let deleted =
        delete_in_batches(node, args, source.name(), layout, &mut clock, &mut stamps).await?;
    let floor = probe.finish();
    let uids: Vec<String> = deleted.iter().map(|(u, _)| u.clone()).collect();
    let log = agent_allows(&agent, &uids).await?;
    // A stream that dropped mid-run would make this a mix of sources.
    let reconnects = agent
        .lines()
        .iter()
        .filter(|l| l.message() == Some("exit source connected"))
        .count();
    if reconnects > usize::from(expected.is_some()) {
        bail!(
            "the agent's exit source reconnected during the {} run",
            source.name()
        );
    }
    agent.kill();
    let mut row = DetectRow::new(
        source.name(),
        deleted.len(),
        &assess(&agent_trials(&deleted, &log, &clock, &stamps)),
    );
    row.floor = floor;
    Ok(row)
}

pub(super) async fn detect_with_kruise(
    node: &Node,
    args: &BenchArgs,
    bin: &Binaries,
) -> anyhow::Result<DetectRow> {
    const NAME: &str = "kruise_daemon";
    progress!(
        "{NAME}: the Kruise proposal's daemon (scan every {} ms); {} deletions, {} at once",
        KRUISE_SCAN.as_millis(),
        args.deletions,
        args.batch
    );
    // Without the agent, nobody else installs the entrypoint the preStop runs.
    Share::open(node.share_dir())
        .and_then(|_| exitorder::handshake::bindir::install(&node.bin_dir(), &bin.entrypoint))
        .context("installing the entrypoint")?;
    let daemon = KruiseDaemon::new(node.share_dir(), node.client(), KRUISE_SCAN)
        .context("starting the Kruise-style daemon")?;
    let allows = daemon.allows();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Owned here: dropped (on an error or an interrupt), the set aborts the daemon.
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(
        daemon
            .run(stopped)
            .instrument(tracing::info_span!("kruise_daemon")),
    );
    let mut clock = KernelClock::start();
    let mut stamps = AppStamps::default();
    let deleted = delete_in_batches(node, args, NAME, Layout::Share, &mut clock, &mut stamps).await;
    let _ = stop.send(true);
    while tasks.join_next().await.is_some() {}
    let deleted = deleted?;
    let allows = match allows.lock() {
        Ok(g) => g.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    let proxy = ContainerName::parse(PROXY)?;
    let trials: Vec<Trial> = deleted
        .iter()
        .map(|(uid, res)| {
            let allow = PodUid::parse(uid).ok().and_then(|pod| {
                allows.get(&ExitKey {
                    pod,
                    container: proxy.clone(),
                    place: exitorder::handshake::share::Place::Share,
                })
            });
            let exit = res
                .as_ref()
                .ok()
                .and_then(|d| trigger_ns(d, &clock, &stamps));
            Trial {
                exit_ns: exit.map(|(at, _)| at),
                exit_by_app: exit.is_some_and(|(_, own)| own),
                allow: allow.map(|a| Allow {
                    at_ns: a.at_ns,
                    reason: a.reason.to_owned(),
                    // The daemon only looks once a second; when the wait began is read from
                    // the exit file's mtime.
                    wait_since_ns: a.wait_since_ns,
                    decided_ns: None,
                    write_ns: None,
                    kernel_ns: None,
                    told_by: None,
                }),
                prestop: prestop_of(res),
                returned_ns: returned_ns(res),
                deletion_failed: res.is_err(),
            }
        })
        .collect();
    Ok(DetectRow::new(NAME, deleted.len(), &assess(&trials)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::plan::{plan, Placement, Volume};

    #[test]
    fn the_pod_local_layout_puts_the_proxys_directory_in_the_pods_tmpfs() {
        let share = bench_pod("p".into(), std::time::Duration::ZERO).unwrap();
        let local = plan(
            &Layout::PodLocal.apply(share.clone()),
            &Placement::example(),
        )
        .unwrap();
        assert_eq!(
            local.volumes.get("exitorder"),
            Some(&Volume::Tmpfs {
                size: Some(1 << 20)
            })
        );
        let proxy = local.containers.iter().find(|c| c.name == PROXY).unwrap();
        let own = proxy
            .mounts
            .iter()
            .find(|m| m.volume == "exitorder")
            .unwrap();
        assert_eq!(own.sub_path.as_deref(), Some(PROXY));
        // The share's layout is bench.yaml as written.
        assert_eq!(Layout::Share.apply(share.clone()), share);
    }
}
