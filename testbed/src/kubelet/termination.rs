//! How the kubelet stops a pod: every running container at once, each with its preStop hook,
//! native sidecars after the main containers in reverse order (KEP-753), StopContainer with
//! what is left of the grace period; then the sandbox goes. What happened is recorded.

use std::collections::BTreeMap;
use std::time::Duration;

use exitorder::cri::{
    Container, ContainerFilter, ContainerState, ListContainersRequest, RemovePodSandboxRequest,
    StopContainerRequest, StopPodSandboxRequest,
};

use super::actions::MAX_RUNTIME_SECONDS;
use super::api::{self, reasons, EventType};
use super::container::{request, MIN_GRACE_SECONDS};
use super::kills::Kill;
use super::ordering::Ordering;
use super::plan::Kind;
pub use super::prestop::HookRecord;
use super::{prestop, DeleteOptions, Phase, PodCtx, Timeline, What};
use crate::node::cleanup::{
    remove_cgroup, shim_alive, shim_pid, wait_shim_gone, SHIM_EXIT_TIMEOUT,
};
use crate::node::exitfiles::{ExitFileEvents, ExitFileProbe};
use crate::node::exits::{self, ExitInfo};
use crate::node::TestbedError;

pub(super) const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long after a graceful node shutdown's kills began its Node status write arrives: a
/// node status sync (a GET and a PATCH of the Node) racing the pods' kills.
const NODE_STATUS_LAG: Duration = Duration::from_millis(500);
/// `kubelet.go` `backOffPeriod`: how long the pod worker waits before it tries a failed
/// sync (here a kill) again (the worker adds up to half of it as jitter; the test bed does
/// not).
const KILL_RETRY_BACKOFF: Duration = Duration::from_secs(10);
/// The kubelet tries a pod's kill for as long as it takes; the test bed gives up after this
/// many attempts (a runtime gone for good), with an error naming each failure.
const MAX_KILL_ATTEMPTS: usize = 6;

/// What happened to one container while its pod was deleted.
#[derive(Debug, Clone)]
pub struct ContainerRecord {
    pub name: String,
    pub id: String,
    pub kind: Kind,
    pub prestop: Option<HookRecord>,
    /// When StopContainer was sent (the runtime sends TERM at once); `None` if the container
    /// was not running when the deletion began.
    pub term_ns: Option<i64>,
    /// The StopContainer timeout given: what was left of the grace period (at least 2 s).
    pub stop_timeout_secs: i64,
    pub stop_returned_ns: Option<i64>,
    pub stop_error: Option<String>,
    /// When the runtime saw it exit (Unix ns, the runtime's clock).
    pub finished_at_ns: i64,
    pub exit_code: i32,
    pub reason: String,
}

/// The record of one pod deletion.
#[derive(Debug, Clone)]
pub struct Deletion {
    pub pod_uid: String,
    pub pod_name: String,
    /// Why the pod went: a deletion, or one of the kubelet's own kills.
    pub kill: Kill,
    pub grace_seconds: i64,
    /// When the deletion began (Unix ns).
    pub started_ns: i64,
    /// Every container's last attempt, in the pod's declaration order.
    pub containers: Vec<ContainerRecord>,
    pub sandbox_removed_ns: i64,
    /// Exit-file events per container, when the deletion was probed.
    pub exit_files: Option<BTreeMap<String, ExitFileEvents>>,
    /// When the pod's share directory appeared during the deletion, if it did.
    pub pod_dir_created_ns: Option<i64>,
    /// The pod's last phase, as the kubelet's `getPhase` gives a terminal pod's once every
    /// container stopped (`kubelet_pods.go`: "all regular containers are terminated in
    /// success", `stopped == succeeded`): Succeeded when every main container ran and its
    /// last exit was 0, else Failed (a pod deleted during its initialisation too). Native
    /// sidecars do not count.
    pub phase: Phase,
    /// The pod's whole life.
    pub timeline: Timeline,
}

impl Deletion {
    pub fn container(&self, name: &str) -> Option<&ContainerRecord> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// Milliseconds from the start of the deletion to `at_ns`.
    pub fn ms(&self, at_ns: i64) -> f64 {
        (at_ns - self.started_ns) as f64 / 1e6
    }

    /// Milliseconds from the start of the deletion to when the runtime saw `name` exit.
    pub fn finished_ms(&self, name: &str) -> Option<f64> {
        self.container(name).map(|c| self.ms(c.finished_at_ns))
    }

    /// Container names in the order the runtime saw them exit.
    pub fn exit_order(&self) -> Vec<&str> {
        let mut cs: Vec<&ContainerRecord> = self.containers.iter().collect();
        cs.sort_by_key(|c| c.finished_at_ns);
        cs.into_iter().map(|c| c.name.as_str()).collect()
    }

    /// The pod's timeline in ms from the deletion.
    pub fn describe(&self) -> String {
        self.timeline.render(self.started_ns)
    }
}

/// Every container of the pod the runtime has, in any state.
pub(super) async fn pod_containers(ctx: &PodCtx) -> Result<Vec<Container>, tonic::Status> {
    ctx.node
        .client()
        .list_containers(request(
            ListContainersRequest {
                filter: Some(ContainerFilter {
                    pod_sandbox_id: ctx.sandbox_id.clone(),
                    ..Default::default()
                }),
            },
            SETUP_TIMEOUT,
        ))
        .await
        .map(|r| r.into_inner().containers)
}

/// How the containers are stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// The pod is deleted, killed by the kubelet or completed: preStop hooks, native
    /// sidecars' turns, this grace period (at least 2 s); `events`: each container's Killing
    /// Event is recorded (all but a kill whose Events the recorder dropped).
    Graceful { grace: i64, events: bool },
    /// A `RestartAllContainers` rule matched (KEP-5532, as Kubernetes 1.35/1.36 document it):
    /// no ordering, no preStop hook, no grace period (StopContainer with timeout 0: KILL).
    /// The containers run again.
    Immediate,
}

/// One attempt at killing a pod's containers.
pub(super) struct Killed {
    /// What happened to each container it killed.
    pub records: Vec<ContainerRecord>,
    /// Why the attempt failed, if it did: the pod's containers could not be listed, or a
    /// stop did not reach the runtime. The kubelet's pod worker tries the kill again.
    pub failure: Option<String>,
}

/// The kubelet's killPod: every running container at once, each with its preStop hook, then
/// (native sidecars: once their turn came) StopContainer with what is left of the grace
/// period, at least 2 s; or all of them killed at once ([`Stop::Immediate`]).
///
/// Only running containers are killed: `killPodWithSyncResult` is given
/// `kubecontainer.ConvertPodStatusToRunningPod`, which keeps the containers whose state is
/// `ContainerStateRunning`. A pod whose status cannot be read is not killed at all
/// (`SyncTerminatingPod` returns the error, and the worker tries again).
pub(super) async fn kill_all(ctx: &PodCtx, stop: Stop) -> Killed {
    let listed = match pod_containers(ctx).await {
        Ok(l) => l,
        Err(s) => {
            return Killed {
                records: Vec::new(),
                failure: Some(format!("ListContainers: {}", s.message())),
            }
        }
    };
    let mut running: Vec<(String, String)> = listed
        .iter()
        .filter(|c| c.state == ContainerState::ContainerRunning as i32)
        .filter_map(|c| Some((c.metadata.as_ref()?.name.clone(), c.id.clone())))
        .collect();
    running.sort();
    let names: Vec<String> = running.iter().map(|(n, _)| n.clone()).collect();
    let ordering = (ctx.plan.has_sidecars() && stop != Stop::Immediate)
        .then(|| Ordering::new(&ctx.plan, &names));
    let kills = running
        .iter()
        .map(|(name, id)| kill_one(ctx, name, id, stop, ordering.as_ref()));
    let records = futures_util::future::join_all(kills).await;
    // killContainersWithSyncResult: any container's failed kill fails the pod's.
    let failure = records
        .iter()
        .find_map(|r| r.stop_error.as_ref().map(|e| format!("{}: {e}", r.name)));
    Killed { records, failure }
}

async fn kill_one(
    ctx: &PodCtx,
    name: &str,
    id: &str,
    stop: Stop,
    ordering: Option<&Ordering>,
) -> ContainerRecord {
    let spec = ctx.plan.container(name);
    let (mut grace, events) = match stop {
        Stop::Graceful { grace, events } => (grace, events),
        Stop::Immediate => (0, false),
    };
    if events {
        // kuberuntime_container.go killContainer: the Killing Event before the preStop hook,
        // "Stopping container NAME" as killContainersWithSyncResult gives no message.
        ctx.report_event(
            Some(name),
            reasons::KILLING,
            EventType::Normal,
            api::stopping_container(name),
        );
    }
    let mut prestop = None;
    let mut hook = None;
    if let (Some(h), true) = (spec.and_then(|c| c.pre_stop.as_ref()), grace > 0) {
        let h = prestop::as_played(ctx, name, h).await;
        let (record, took, still) = prestop::run(ctx, name, id, &h, grace, events).await;
        grace -= took;
        prestop = Some(record);
        hook = Some(still);
    }
    if let (Some(o), true) = (ordering, grace > 0) {
        let t0 = std::time::Instant::now();
        let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        if o.wait_for_turn(name, limit).await {
            ctx.record(Some(name), What::TurnCame);
        }
        grace -= i64::try_from(t0.elapsed().as_secs()).unwrap_or(0);
    }
    let grace = match stop {
        Stop::Graceful { .. } => grace.max(MIN_GRACE_SECONDS),
        Stop::Immediate => 0,
    };
    let term_ns = super::now_ns();
    ctx.record_at(
        term_ns,
        Some(name),
        What::Term {
            grace_seconds: grace,
        },
    );
    let mut client = ctx.node.client();
    let stopped = client
        .stop_container(request(
            StopContainerRequest {
                container_id: id.to_owned(),
                timeout: grace.min(MAX_RUNTIME_SECONDS),
            },
            Duration::from_secs(u64::try_from(grace.min(MAX_RUNTIME_SECONDS)).unwrap_or(0) + 30),
        ))
        .await;
    let stop_returned_ns = super::now_ns();
    // The kill went to its end: a hook the kubelet stopped waiting for runs on.
    if let Some(h) = hook {
        h.detach();
    }
    if let Some(o) = ordering {
        o.terminated(name);
    }
    let stop_error = stopped
        .err()
        // killContainer: "if err != nil && !crierror.IsNotFound(err)".
        .filter(|s| s.code() != tonic::Code::NotFound)
        .map(|s| s.message().to_owned());
    let exit = exits::status(&mut client, id).await;
    if stop_error.is_none() {
        // A stop that did not reach the runtime stopped nothing: the container runs on, for
        // the next attempt.
        let attempt = ctx.lock().containers.get(name).map_or(0, |c| c.attempt);
        ctx.exited(name, attempt, &exit, stop != Stop::Immediate);
    }
    ContainerRecord {
        name: name.to_owned(),
        id: id.to_owned(),
        kind: spec.map_or(Kind::Main, |c| c.kind),
        prestop,
        term_ns: Some(term_ns),
        stop_timeout_secs: grace,
        stop_returned_ns: Some(stop_returned_ns),
        stop_error,
        finished_at_ns: exit.finished_at_ns,
        exit_code: exit.exit_code,
        reason: exit.reason,
    }
}

/// Whether a CRI call failed because the runtime was not there (restarting): nothing was
/// done, and the kubelet's pod worker tries it again until the runtime answers.
fn runtime_away(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable
        || status.message().contains("transport error")
        || status.message().contains("not initialized")
}

/// Runs `call` again while the runtime is away, for up to [`SETUP_TIMEOUT`], as the kubelet
/// retries stopping and removing a sandbox after a runtime restart (a failed kill of the
/// containers is tried again whole: [`kill_until_done`]).
async fn while_runtime_away<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = tokio::time::Instant::now() + SETUP_TIMEOUT;
    loop {
        match call().await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s) if runtime_away(&s) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => return Err(s),
        }
    }
}

/// The deletion (or the kubelet's own kill, `opts.kill`): kill every container, then remove
/// the sandbox, the shim, the cgroups and the pod's emptyDirs. A kubelet's kill records its
/// Event first and reports its final status once every container stopped.
pub(super) async fn delete(ctx: &PodCtx, opts: &DeleteOptions) -> Result<Deletion, TestbedError> {
    let kill = opts.kill;
    let grace = kill.grace(
        ctx.plan.grace_seconds,
        opts.grace_period,
        opts.force,
        opts.kubelet_version.unwrap_or(super::kills::NEWEST_KUBELET),
    )?;
    let names: Vec<String> = ctx.plan.all().map(|c| c.name.clone()).collect();
    // A probe that cannot start (inotify instances used up) only costs the exit-file
    // timeline, not the deletion.
    let probe = if opts.probe_exit_files {
        ExitFileProbe::start(&ctx.node.share_dir.join("pods"), &ctx.plan.uid, &names).ok()
    } else {
        None
    };
    if let Ok(mut execs) = ctx.execs.lock() {
        execs.lag.clone_from(&opts.exec_lag);
        execs.fails.clone_from(&opts.exec_fails);
        execs.exits.clone_from(&opts.exec_exits);
    }
    if let Kill::NodeShutdown { .. } = kill {
        // nodeshutdown_manager_linux.go: `go m.syncNodeStatus()` just before the pods are
        // killed, not awaited: the Node's Ready condition reaches the API server beside the
        // kills, after their preStop hooks began.
        ctx.report_node_shutting_down_after(NODE_STATUS_LAG);
    }
    if let Some((reason, kind, message)) = kill.pod_event() {
        ctx.report_event(None, reason, kind, message);
    }
    if kill != Kill::Deletion {
        ctx.record(None, What::KubeletKill { kill: kill.name() });
    }
    let started_ns = super::now_ns();
    ctx.set_phase(Phase::Terminating);
    ctx.record_at(
        started_ns,
        None,
        What::DeletionStarted {
            grace_seconds: grace,
        },
    );
    let killed = kill_until_done(ctx, kill, grace, opts).await?;
    // Every container stopped: mergePodStatus lets the terminal phase (and DisruptionTarget)
    // through now, not before.
    if let Some(status) = kill.terminal_status() {
        ctx.set_api_status(status);
    }
    let (exit_files, pod_dir_created_ns) = match probe {
        Some(p) => {
            let (files, dir) = p.finish();
            (Some(files), dir)
        }
        None => (None, None),
    };
    let removed = remove_sandbox(ctx).await;
    let sandbox_removed_ns = super::now_ns();
    ctx.record_at(sandbox_removed_ns, None, What::SandboxRemoved);
    ctx.set_phase(Phase::Deleted);
    // The kubelet's TearDownAt: a tmpfs volume is unmounted before its directory goes.
    if let Err(e) = crate::node::dirs::remove_tree(&ctx.pod_dir) {
        eprintln!("exitorder testbed: {e}");
    }
    removed?;
    let status = ctx.snapshot();
    let containers = names
        .iter()
        .filter_map(|n| {
            if let Some(k) = killed.iter().find(|k| &k.name == n) {
                return Some(k.clone());
            }
            // Not running when the deletion began: its last exit, as the runtime told it.
            let c = status.containers.get(n)?;
            let exit: ExitInfo = c.last_exit.clone()?;
            Some(ContainerRecord {
                name: n.clone(),
                id: c.id.clone().unwrap_or_default(),
                kind: c.kind,
                prestop: None,
                term_ns: None,
                stop_timeout_secs: 0,
                stop_returned_ns: None,
                stop_error: None,
                finished_at_ns: exit.finished_at_ns,
                exit_code: exit.exit_code,
                reason: exit.reason,
            })
        })
        .collect::<Vec<ContainerRecord>>();
    let mains_ok = ctx.plan.containers.iter().all(|m| {
        containers
            .iter()
            .any(|c| c.name == m.name && c.exit_code == 0)
    });
    let phase = if mains_ok {
        Phase::Succeeded
    } else {
        Phase::Failed
    };
    Ok(Deletion {
        pod_uid: ctx.plan.uid.clone(),
        pod_name: ctx.plan.name.clone(),
        kill,
        grace_seconds: grace,
        started_ns,
        containers,
        sandbox_removed_ns,
        exit_files,
        pod_dir_created_ns,
        phase,
        timeline: status.timeline,
    })
}

/// The pod worker's kill, to its end: attempts of [`kill_all`] until one succeeds.
///
/// - A grace period shortened during the kill (`DeleteOptions::shorten`) cancels the running
///   attempt and starts another with the new grace: `pod_workers.go` `UpdatePod`, "once a pod
///   is terminating, all updates are kills and the grace period can only decrease", then
///   `if (becameTerminating || wasGracePeriodShortened) && status.cancelFn != nil {
///   status.cancelFn() }`. Cancelled, the running hooks' calls are cancelled with it.
/// - An attempt that failed (the runtime away) is made again after the worker's back-off
///   (`kubelet.go` `backOffPeriod`, 10 s: "the period to back off when pod syncing results
///   in an error"), with a fresh grace period and every preStop hook run again for the
///   containers still running.
///
/// Returns the last record of every container killed.
async fn kill_until_done(
    ctx: &PodCtx,
    kill: Kill,
    grace: i64,
    opts: &DeleteOptions,
) -> Result<Vec<ContainerRecord>, TestbedError> {
    let mut grace = grace;
    // UpdatePod: a longer (or equal) grace changes nothing.
    let mut shorten = opts
        .shorten
        .filter(|s| kill == Kill::Deletion && s.grace_seconds.max(1) < grace)
        .map(|s| {
            (
                tokio::time::Instant::now() + s.after,
                s.grace_seconds.max(1),
            )
        });
    let mut records: BTreeMap<String, ContainerRecord> = BTreeMap::new();
    let mut failures = Vec::new();
    loop {
        let attempt = kill_all(
            ctx,
            Stop::Graceful {
                grace,
                events: kill.records_killing(),
            },
        );
        let killed = match shorten {
            Some((at, shorter)) => {
                tokio::pin!(attempt);
                tokio::select! {
                    k = &mut attempt => k,
                    () = tokio::time::sleep_until(at) => {
                        shorten = None;
                        grace = shorter;
                        ctx.record(None, What::GraceShortened { grace_seconds: grace });
                        continue;
                    }
                }
            }
            None => attempt.await,
        };
        for r in killed.records {
            records.insert(r.name.clone(), r);
        }
        let Some(why) = killed.failure else {
            return Ok(settle_failed_stops(ctx, records).await);
        };
        failures.push(why.clone());
        if failures.len() >= MAX_KILL_ATTEMPTS {
            return Err(TestbedError::Task(format!(
                "pod {}: {} attempts at killing it failed: {}",
                ctx.plan.name,
                failures.len(),
                failures.join("; ")
            )));
        }
        ctx.record(None, What::KillFailed { detail: why });
        tokio::time::sleep(KILL_RETRY_BACKOFF).await;
        if shorten.is_some_and(|(at, _)| at <= tokio::time::Instant::now()) {
            grace = shorten.take().map_or(grace, |(_, g)| g);
            ctx.record(
                None,
                What::GraceShortened {
                    grace_seconds: grace,
                },
            );
        }
    }
}

/// A container whose stop failed in an earlier attempt and that was not running at a later
/// one ended meanwhile (on its own, or the runtime's restart): its exit as the runtime tells
/// it now, in the record and the pod's status.
async fn settle_failed_stops(
    ctx: &PodCtx,
    records: BTreeMap<String, ContainerRecord>,
) -> Vec<ContainerRecord> {
    let mut out = Vec::with_capacity(records.len());
    for (name, mut r) in records {
        if r.stop_error.is_some() {
            let exit = exits::status(&mut ctx.node.client(), &r.id).await;
            let attempt = ctx.lock().containers.get(&name).map_or(0, |c| c.attempt);
            ctx.exited(&name, attempt, &exit, true);
            r.finished_at_ns = exit.finished_at_ns;
            r.exit_code = exit.exit_code;
            r.reason = exit.reason;
        }
        out.push(r);
    }
    out
}

/// StopPodSandbox + RemovePodSandbox, then the shim must be gone and the pod's cgroups are
/// removed.
async fn remove_sandbox(ctx: &PodCtx) -> Result<(), TestbedError> {
    let client = ctx.node.client();
    let shim = shim_pid(&ctx.node.state_dir, &ctx.sandbox_id);
    let stop = while_runtime_away(|| {
        let mut client = client.clone();
        async move {
            client
                .stop_pod_sandbox(request(
                    StopPodSandboxRequest {
                        pod_sandbox_id: ctx.sandbox_id.clone(),
                    },
                    SETUP_TIMEOUT,
                ))
                .await
        }
    })
    .await
    .map_err(TestbedError::cri("StopPodSandbox"));
    let remove = while_runtime_away(|| {
        let mut client = client.clone();
        async move {
            client
                .remove_pod_sandbox(request(
                    RemovePodSandboxRequest {
                        pod_sandbox_id: ctx.sandbox_id.clone(),
                    },
                    SETUP_TIMEOUT,
                ))
                .await
        }
    })
    .await
    .map_err(TestbedError::cri("RemovePodSandbox"));
    let shim_gone = match shim {
        Some(pid) => wait_shim_gone(pid, SHIM_EXIT_TIMEOUT).await,
        None => true,
    };
    let cgroup = ctx.plan.cgroup(&ctx.node.cgroup_root);
    let cgroup_problems = remove_cgroup(&cgroup).await;
    if let Some(cpu) = &ctx.node.cpu {
        cpu.remove_pod(&cgroup);
    }
    stop?;
    remove?;
    if !shim_gone {
        if let Some(pid) = shim.filter(|p| shim_alive(*p)) {
            return Err(TestbedError::ShimLeft {
                pod: ctx.plan.uid.clone(),
                pid,
                waited: SHIM_EXIT_TIMEOUT,
            });
        }
    }
    if !cgroup_problems.is_empty() {
        return Err(TestbedError::Teardown(cgroup_problems));
    }
    Ok(())
}
