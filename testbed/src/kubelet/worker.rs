//! The pod worker: starts a pod's containers in the kubelet's order, completes it when its
//! main containers are done, and deletes it the kubelet's way (KEP-753 ordering included).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exitorder::cri::{
    ContainerFilter, ContainerState, ImageSpec, ImageStatusRequest, ListContainersRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StopContainerRequest, StopPodSandboxRequest,
};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::actions::{self, Target};
use super::container::{request, supervise, MIN_GRACE_SECONDS};
use super::exits::ExitInfo;
use super::plan::{self, Kind, PodPlan};
use super::{
    config, volumes, Command, ContainerStatus, DeleteOptions, PathMap, Phase, PodCtx, PodStatus,
    RunOptions, RunningPod, Timeline, What,
};
use crate::node::cleanup::{
    remove_cgroup, shim_alive, shim_pid, wait_shim_gone, SHIM_EXIT_TIMEOUT,
};
use crate::node::exitfiles::{ExitFileEvents, ExitFileProbe};
use crate::node::{NodeShared, TestbedError};

const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the containers' supervisors may take to stop when the pod is deleted.
const SUPERVISORS_STOP: Duration = Duration::from_secs(10);

/// A preStop hook as it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRecord {
    pub handler: String,
    pub started_ns: i64,
    pub returned_ns: i64,
    pub ok: bool,
    /// What it printed, or why it failed.
    pub detail: String,
}

impl HookRecord {
    pub fn took(&self) -> Duration {
        Duration::from_nanos(u64::try_from(self.returned_ns - self.started_ns).unwrap_or(0))
    }
}

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

/// Runs `pod` (as written) on the node: checks and plans it, checks its images, prepares its
/// volumes, runs its sandbox and starts its worker.
pub(crate) async fn start(
    node: Arc<NodeShared>,
    pod: &Value,
    opts: &RunOptions,
) -> Result<RunningPod, TestbedError> {
    let place = plan::Placement {
        uid: crate::node::random_uuid(),
        node_name: node.node_name.clone(),
        host_ip: node.host_ip.clone(),
        force_host_network: opts.force_host_network,
        name_suffix: crate::node::random_suffix(),
    };
    let plan = plan::plan(pod, &place).map_err(|e| TestbedError::BadSpec(e.to_string()))?;
    check_images(&node, &plan).await?;
    let pod_dir = node.dir.join("kubelet/pods").join(&plan.uid);
    let mut maps = opts.path_maps.clone();
    maps.push(PathMap {
        pod_path: crate::node::SHARE_PATH.to_owned(),
        host_path: node.share_dir.clone(),
    });
    let mount_sources = volumes::prepare(&plan, &pod_dir, &maps)
        .map_err(|e| TestbedError::BadSpec(format!("pod {}: {e}", plan.name)))?;
    let log_directory = node
        .log_dir
        .join(format!("{}_{}_{}", plan.namespace, plan.name, plan.uid));
    std::fs::create_dir_all(&log_directory)
        .map_err(|e| TestbedError::io("create", &log_directory, e))?;
    let sandbox_config = config::sandbox(
        &plan,
        &log_directory,
        &format!("/{}", cgroup_of(&node, &plan.uid)),
    );
    let mut client = node.client();
    let sandbox_id = client
        .run_pod_sandbox(request(
            RunPodSandboxRequest {
                config: Some(sandbox_config.clone()),
                runtime_handler: String::new(),
            },
            SETUP_TIMEOUT,
        ))
        .await
        .map_err(TestbedError::cri("RunPodSandbox"))?
        .into_inner()
        .pod_sandbox_id;
    let containers = plan
        .all()
        .map(|c| (c.name.clone(), ContainerStatus::new(c.kind)))
        .collect();
    let (changed, _) = watch::channel(0u64);
    let ctx = Arc::new(PodCtx {
        node: Arc::clone(&node),
        plan,
        sandbox_id,
        sandbox_config,
        mount_sources,
        pod_dir,
        crash_backoff: opts.crash_backoff,
        status: Mutex::new(PodStatus {
            phase: Phase::Pending,
            containers,
            message: None,
            timeline: Timeline::default(),
        }),
        changed,
    });
    ctx.record(None, What::SandboxReady);
    let (commands, rx) = mpsc::channel(4);
    let span = tracing::info_span!("testbed_pod", pod = %ctx.plan.name);
    tokio::spawn(work(Arc::clone(&ctx), rx).instrument(span));
    Ok(RunningPod { ctx, commands })
}

pub(crate) fn cgroup_of(node: &NodeShared, uid: &str) -> String {
    format!("{}/pod{uid}", node.cgroup_root)
}

/// Every image the pod names must be in the node's store: nothing is pulled here.
async fn check_images(node: &NodeShared, plan: &PodPlan) -> Result<(), TestbedError> {
    let mut client =
        exitorder::cri::image_service_client::ImageServiceClient::new(node.channel.clone());
    for c in plan.all() {
        let found = client
            .image_status(request(
                ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: c.image.clone(),
                        ..Default::default()
                    }),
                    verbose: false,
                },
                SETUP_TIMEOUT,
            ))
            .await
            .map_err(TestbedError::cri("ImageStatus"))?
            .into_inner()
            .image;
        let Some(image) = found else {
            return Err(TestbedError::ImageMissing {
                pod: plan.name.clone(),
                container: c.name.clone(),
                image: c.image.clone(),
            });
        };
        // runAsNonRoot: the kubelet refuses to start a container that would run as root.
        if c.security.run_as_non_root {
            let uid = c.security.run_as_user.or(image.uid.map(|u| u.value));
            if uid.unwrap_or(0) == 0 {
                return Err(TestbedError::BadSpec(format!(
                    "pod {}: container {} has runAsNonRoot and would run as root (set runAsUser, \
                     or use an image with a non-root USER)",
                    plan.name, c.name
                )));
            }
        }
    }
    Ok(())
}

/// The pod worker.
async fn work(ctx: Arc<PodCtx>, mut commands: mpsc::Receiver<Command>) {
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let life = live(&ctx, &cancel, &tracker);
    tokio::pin!(life);
    let mut life_done = false;
    loop {
        tokio::select! {
            () = &mut life, if !life_done => life_done = true,
            cmd = commands.recv() => match cmd {
                Some(Command::Delete { opts, done }) => {
                    cancel.cancel();
                    tracker.close();
                    let _ = tokio::time::timeout(SUPERVISORS_STOP, tracker.wait()).await;
                    let res = delete(&ctx, &opts).await;
                    let _ = done.send(res);
                    return;
                }
                // The handle was dropped: the containers stay until the node goes.
                None => {
                    cancel.cancel();
                    return;
                }
            },
        }
    }
}

/// Start order, then completion: init containers one after the other (each to completion;
/// a native sidecar until it has started), then the main containers in order, each after the
/// previous one's postStart returned. When the main containers are done for good (Never /
/// OnFailure), the native sidecars are stopped and the phase says how it went.
async fn live(ctx: &Arc<PodCtx>, cancel: &CancellationToken, tracker: &TaskTracker) {
    let supervisors = Mutex::new(Vec::<CancellationToken>::new());
    let spawn = |c: &plan::ContainerPlan| {
        let span =
            tracing::info_span!("testbed_container", pod = %ctx.plan.name, container = %c.name);
        let token = cancel.child_token();
        if let Ok(mut all) = supervisors.lock() {
            all.push(token.clone());
        }
        tracker.spawn(supervise(Arc::clone(ctx), c.clone(), token).instrument(span));
    };
    // The supervisors stop before the pod's last containers are stopped: nothing restarts.
    let complete = |phase: Phase| {
        if let Ok(all) = supervisors.lock() {
            all.iter().for_each(CancellationToken::cancel);
        }
        async move {
            let _ = kill_all(ctx, ctx.plan.grace_seconds).await;
            ctx.set_phase(phase);
        }
    };
    for c in &ctx.plan.init {
        spawn(c);
        let name = c.name.clone();
        match c.kind {
            Kind::Init => {
                ctx.wait_until(|s| s.containers.get(&name).is_none_or(|c| c.finished))
                    .await;
                let code = ctx
                    .lock()
                    .containers
                    .get(&name)
                    .and_then(|c| c.last_exit.clone());
                if code.is_none_or(|e| e.exit_code != 0) {
                    ctx.update(|s| {
                        s.message
                            .get_or_insert(format!("init container {name} failed"));
                    });
                    complete(Phase::Failed).await;
                    return;
                }
            }
            _ => {
                ctx.wait_until(|s| {
                    s.containers
                        .get(&name)
                        .is_none_or(|c| c.started || c.finished)
                })
                .await;
            }
        }
    }
    ctx.set_phase(Phase::Running);
    for c in &ctx.plan.containers {
        spawn(c);
        let name = c.name.clone();
        ctx.wait_until(|s| {
            s.containers
                .get(&name)
                .is_none_or(|c| c.started || c.finished)
        })
        .await;
    }
    let mains: Vec<String> = ctx.plan.containers.iter().map(|c| c.name.clone()).collect();
    ctx.wait_until(|s| {
        mains
            .iter()
            .all(|m| s.containers.get(m).is_none_or(|c| c.finished))
    })
    .await;
    let all_ok = {
        let s = ctx.lock();
        mains.iter().all(|m| {
            s.containers
                .get(m)
                .and_then(|c| c.last_exit.as_ref())
                .is_some_and(|e| e.exit_code == 0)
        })
    };
    complete(if all_ok {
        Phase::Succeeded
    } else {
        Phase::Failed
    })
    .await;
}

/// When each native sidecar may be stopped: after every main container, and after the
/// sidecars declared after it (the kubelet's terminationOrdering).
struct Ordering {
    terminated: HashMap<String, watch::Sender<bool>>,
    prereqs: HashMap<String, Vec<watch::Receiver<bool>>>,
}

impl Ordering {
    fn new(plan: &PodPlan, running: &[String]) -> Ordering {
        let mut terminated = HashMap::new();
        let mut prereqs: HashMap<String, Vec<watch::Receiver<bool>>> = HashMap::new();
        let mut channel = |name: &str| {
            let (tx, rx) = watch::channel(!running.iter().any(|r| r == name));
            terminated.insert(name.to_owned(), tx);
            rx
        };
        let mains: Vec<watch::Receiver<bool>> =
            plan.containers.iter().map(|c| channel(&c.name)).collect();
        let mut later: Option<watch::Receiver<bool>> = None;
        for c in plan.init.iter().rev() {
            let rx = channel(&c.name);
            if c.kind == Kind::Sidecar {
                let mut wait = mains.clone();
                wait.extend(later.take());
                prereqs.insert(c.name.clone(), wait);
                later = Some(rx);
            }
        }
        Ordering {
            terminated,
            prereqs,
        }
    }

    /// Waits for `name`'s turn, at most `limit`; whether it had anything to wait for.
    async fn wait_for_turn(&self, name: &str, limit: Duration) -> bool {
        let Some(waits) = self.prereqs.get(name) else {
            return false;
        };
        let deadline = tokio::time::Instant::now() + limit;
        for rx in waits {
            let mut rx = rx.clone();
            if tokio::time::timeout_at(deadline, rx.wait_for(|done| *done))
                .await
                .is_err()
            {
                break;
            }
        }
        true
    }

    fn terminated(&self, name: &str) {
        if let Some(tx) = self.terminated.get(name) {
            let _ = tx.send(true);
        }
    }
}

/// The kubelet's killPod: every running container at once, each with its preStop hook, then
/// (native sidecars: once their turn came) StopContainer with what is left of the grace
/// period, at least 2 s. Returns what happened to each.
async fn kill_all(ctx: &PodCtx, grace: i64) -> Vec<ContainerRecord> {
    let mut client = ctx.node.client();
    let listed = client
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
        .unwrap_or_default();
    let mut running: Vec<(String, String)> = listed
        .iter()
        .filter(|c| {
            c.state == ContainerState::ContainerRunning as i32
                || c.state == ContainerState::ContainerCreated as i32
        })
        .filter_map(|c| Some((c.metadata.as_ref()?.name.clone(), c.id.clone())))
        .collect();
    running.sort();
    let names: Vec<String> = running.iter().map(|(n, _)| n.clone()).collect();
    let ordering = ctx
        .plan
        .has_sidecars()
        .then(|| Ordering::new(&ctx.plan, &names));
    let kills = running
        .iter()
        .map(|(name, id)| kill_one(ctx, name, id, grace, ordering.as_ref()));
    futures_util::future::join_all(kills).await
}

async fn kill_one(
    ctx: &PodCtx,
    name: &str,
    id: &str,
    grace_seconds: i64,
    ordering: Option<&Ordering>,
) -> ContainerRecord {
    let spec = ctx.plan.container(name);
    let mut grace = grace_seconds;
    let mut prestop = None;
    if let (Some(h), true) = (spec.and_then(|c| c.pre_stop.as_ref()), grace > 0) {
        let handler = config::describe(h);
        let started_ns = super::now_ns();
        ctx.record_at(
            started_ns,
            Some(name),
            What::PreStopStarted {
                handler: handler.clone(),
            },
        );
        let t0 = std::time::Instant::now();
        let target = Target {
            client: ctx.node.client(),
            container_id: id,
            pod_ip: &ctx.plan.host_ip,
        };
        let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        let res = actions::run(h, &target, Some(limit)).await;
        let returned_ns = super::now_ns();
        let (ok, detail) = match res {
            Ok(d) => (true, d),
            Err(e) => (false, e),
        };
        ctx.record_at(
            returned_ns,
            Some(name),
            What::PreStopEnded {
                ok,
                detail: detail.clone(),
            },
        );
        // The kubelet takes the hook's whole seconds off the grace period.
        grace -= i64::try_from(t0.elapsed().as_secs()).unwrap_or(0);
        prestop = Some(HookRecord {
            handler,
            started_ns,
            returned_ns,
            ok,
            detail,
        });
    }
    if let (Some(o), true) = (ordering, grace > 0) {
        let t0 = std::time::Instant::now();
        let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        if o.wait_for_turn(name, limit).await {
            ctx.record(Some(name), What::TurnCame);
        }
        grace -= i64::try_from(t0.elapsed().as_secs()).unwrap_or(0);
    }
    let grace = grace.max(MIN_GRACE_SECONDS);
    let term_ns = super::now_ns();
    ctx.record_at(
        term_ns,
        Some(name),
        What::Term {
            grace_seconds: grace,
        },
    );
    let mut client = ctx.node.client();
    let stop = client
        .stop_container(request(
            StopContainerRequest {
                container_id: id.to_owned(),
                timeout: grace,
            },
            Duration::from_secs(u64::try_from(grace).unwrap_or(0) + 30),
        ))
        .await;
    let stop_returned_ns = super::now_ns();
    if let Some(o) = ordering {
        o.terminated(name);
    }
    let exit = super::exits::status(&mut client, id).await;
    let attempt = ctx.lock().containers.get(name).map_or(0, |c| c.attempt);
    ctx.record_at(
        exit.finished_at_ns,
        Some(name),
        What::Exited {
            attempt,
            exit_code: exit.exit_code,
            reason: exit.reason.clone(),
        },
    );
    let last = exit.clone();
    ctx.container(name, |s| {
        s.running = false;
        s.ready = false;
        s.last_exit = Some(last);
        s.finished = true;
    });
    ContainerRecord {
        name: name.to_owned(),
        id: id.to_owned(),
        kind: spec.map_or(Kind::Main, |c| c.kind),
        prestop,
        term_ns: Some(term_ns),
        stop_timeout_secs: grace,
        stop_returned_ns: Some(stop_returned_ns),
        stop_error: stop.err().map(|s| s.message().to_owned()),
        finished_at_ns: exit.finished_at_ns,
        exit_code: exit.exit_code,
        reason: exit.reason,
    }
}

/// The deletion: kill every container, then remove the sandbox, the shim, the cgroups and
/// the pod's emptyDirs.
async fn delete(ctx: &PodCtx, opts: &DeleteOptions) -> Result<Deletion, TestbedError> {
    let grace = match opts.grace_period {
        Some(g) => g.max(1),
        None => ctx.plan.grace_seconds,
    };
    let names: Vec<String> = ctx.plan.all().map(|c| c.name.clone()).collect();
    // A probe that cannot start (inotify instances used up) only costs the exit-file
    // timeline, not the deletion.
    let probe = if opts.probe_exit_files {
        ExitFileProbe::start(&ctx.node.share_dir.join("pods"), &ctx.plan.uid, &names).ok()
    } else {
        None
    };
    let started_ns = super::now_ns();
    ctx.set_phase(Phase::Terminating);
    ctx.record_at(
        started_ns,
        None,
        What::DeletionStarted {
            grace_seconds: grace,
        },
    );
    let killed = kill_all(ctx, grace).await;
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
    let _ = std::fs::remove_dir_all(&ctx.pod_dir);
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
        .collect();
    Ok(Deletion {
        pod_uid: ctx.plan.uid.clone(),
        pod_name: ctx.plan.name.clone(),
        grace_seconds: grace,
        started_ns,
        containers,
        sandbox_removed_ns,
        exit_files,
        pod_dir_created_ns,
        timeline: status.timeline,
    })
}

/// StopPodSandbox + RemovePodSandbox, then the shim must be gone and the pod's cgroups are
/// removed.
async fn remove_sandbox(ctx: &PodCtx) -> Result<(), TestbedError> {
    let mut client = ctx.node.client();
    let shim = shim_pid(&ctx.node.state_dir, &ctx.sandbox_id);
    let stop = client
        .stop_pod_sandbox(request(
            StopPodSandboxRequest {
                pod_sandbox_id: ctx.sandbox_id.clone(),
            },
            SETUP_TIMEOUT,
        ))
        .await
        .map_err(TestbedError::cri("StopPodSandbox"));
    let remove = client
        .remove_pod_sandbox(request(
            RemovePodSandboxRequest {
                pod_sandbox_id: ctx.sandbox_id.clone(),
            },
            SETUP_TIMEOUT,
        ))
        .await
        .map_err(TestbedError::cri("RemovePodSandbox"));
    let shim_gone = match shim {
        Some(pid) => wait_shim_gone(pid, SHIM_EXIT_TIMEOUT).await,
        None => true,
    };
    let cgroup_problems = remove_cgroup(&cgroup_of(&ctx.node, &ctx.plan.uid)).await;
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
