//! The pod worker: starts a pod's containers in the kubelet's order, completes it when its
//! main containers are done, and deletes it when asked (see `termination`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use exitorder::cri::{ImageSpec, ImageStatusRequest, RunPodSandboxRequest, StatusRequest};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::container::{request, supervise};
use super::inplace::restart_all;
use super::plan::{self, Kind, PodPlan};
use super::termination::{delete, kill_all, Stop};
use super::{
    config, volumes, ApiStatus, Command, ContainerStatus, PathMap, Phase, PodCtx, PodStatus,
    RunOptions, RunningPod, Timeline, What,
};
use crate::node::{NodeShared, TestbedError, Tier};

const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Refuses a `hostUsers: false` pod unless the runtime's default handler says it supports user
/// namespaces (CRI `Status`), as the kubelet does: containerd 1.6 would run it on the node's
/// users without a word, and containerd 2.x runs it only with a runc that makes idmapped
/// mounts.
async fn check_user_namespaces(node: &NodeShared) -> Result<(), TestbedError> {
    const NEEDS: &str = "hostUsers: false needs a runtime with user namespaces (containerd \
                         2.0+ with runc 1.2+, whose idmapped mounts the pod's volumes use; \
                         scripts/test gives the containerd 2.1 tests one)";
    let status = node
        .client()
        .status(request(StatusRequest { verbose: false }, SETUP_TIMEOUT))
        .await;
    let supported = match status {
        Ok(s) => s
            .into_inner()
            .runtime_handlers
            .iter()
            .find(|h| h.name.is_empty())
            .and_then(|h| h.features.as_ref())
            .is_some_and(|f| f.user_namespaces),
        Err(e) if e.code() == tonic::Code::Unimplemented => false,
        Err(e) => return Err(TestbedError::cri("Status")(e)),
    };
    if !supported {
        return Err(TestbedError::BadSpec(format!(
            "{NEEDS}; this runtime's Status says it has none"
        )));
    }
    if !crate::node::has_pod_network(&node.dir) {
        return Err(TestbedError::BadSpec(
            "hostUsers: false needs the pod's own network namespace, and this node has no pod \
             network: install Debian's containernetworking-plugins (ptp, host-local)"
                .to_owned(),
        ));
    }
    Ok(())
}

/// A range of host IDs for a user-namespaced pod: 65536 of them from a multiple of 65536 above
/// the node's own (the kubelet's default layout). Tests run nodes side by side in one
/// process, so the ranges follow one counter, offset by the process id.
fn userns_host_id() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // 2^32 / 65536 slots, less the node's own first one.
    const SLOTS: u32 = u32::MAX / config::USERNS_LENGTH - 1;
    let slot = std::process::id()
        .wrapping_mul(97)
        .wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
        % SLOTS;
    (slot + 1) * config::USERNS_LENGTH
}
/// How long the containers' supervisors may take to stop when the pod is deleted.
const SUPERVISORS_STOP: Duration = Duration::from_secs(10);

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
    let mut plan = plan::plan(pod, &place).map_err(|e| TestbedError::BadSpec(e.to_string()))?;
    if !plan.host_users {
        check_user_namespaces(&node).await?;
        plan.userns_host_id = Some(userns_host_id());
    }
    check_images(&node, &plan).await?;
    let pod_dir = node
        .dir
        .join(crate::node::KUBELET_ROOT)
        .join("pods")
        .join(&plan.uid);
    let mut maps = opts.path_maps.clone();
    maps.push(PathMap {
        pod_path: crate::node::SHARE_PATH.to_owned(),
        host_path: node.share_dir.clone(),
    });
    maps.push(PathMap {
        pod_path: crate::node::BIN_PATH.to_owned(),
        host_path: node.bin_dir(),
    });
    // The chart's DaemonSet mounts the kubelet's root: this node's is its own.
    maps.push(PathMap {
        pod_path: exitorder_contract::podlocal::DEFAULT_KUBELET_ROOT.to_owned(),
        host_path: node.dir.join(crate::node::KUBELET_ROOT),
    });
    let mount_sources = volumes::prepare(&plan, &pod_dir, &maps)
        .map_err(|e| TestbedError::BadSpec(format!("pod {}: {e}", plan.name)))?;
    let log_directory = node
        .log_dir
        .join(format!("{}_{}_{}", plan.namespace, plan.name, plan.uid));
    std::fs::create_dir_all(&log_directory)
        .map_err(|e| TestbedError::io("create", &log_directory, e))?;
    // The kubelet makes the pod's cgroup, weighted by its CPU request, before the sandbox.
    let cgroup = plan.cgroup(&node.cgroup_root);
    if let Some(cpu) = &node.cpu {
        cpu.add_pod(Tier::of(plan.cpu_request_milli), &cgroup)
            .map_err(|e| TestbedError::io("create the cgroup of", &pod_dir, e))?;
    }
    let sandbox_config = config::sandbox(&plan, &log_directory, &format!("/{cgroup}"));
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
        .map(|c| (c.name.clone(), ContainerStatus::new(c.kind, &c.image)))
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
            restarting_all: None,
            restarts_all: 0,
            timeline: Timeline::default(),
        }),
        changed,
        api: opts.api.clone(),
        api_status: Mutex::new(ApiStatus::phase("Pending")),
        sync: tokio::sync::Mutex::new(()),
        execs: std::sync::Mutex::new(super::ExecPlay::default()),
    });
    ctx.record(None, What::SandboxReady);
    let (commands, rx) = mpsc::channel(4);
    let span = tracing::info_span!("testbed_pod", pod = %ctx.plan.name);
    tokio::spawn(work(Arc::clone(&ctx), rx).instrument(span));
    Ok(RunningPod { ctx, commands })
}

/// The image as the node's store has it, if it has it (CRI `ImageStatus`).
pub(super) async fn image_status(
    node: &NodeShared,
    image: &str,
) -> Result<Option<exitorder::cri::Image>, TestbedError> {
    let mut client =
        exitorder::cri::image_service_client::ImageServiceClient::new(node.channel.clone());
    Ok(client
        .image_status(request(
            ImageStatusRequest {
                image: Some(ImageSpec {
                    image: image.to_owned(),
                    ..Default::default()
                }),
                verbose: false,
            },
            SETUP_TIMEOUT,
        ))
        .await
        .map_err(TestbedError::cri("ImageStatus"))?
        .into_inner()
        .image)
}

/// Every image the pod names must be in the node's store: nothing is pulled here.
async fn check_images(node: &NodeShared, plan: &PodPlan) -> Result<(), TestbedError> {
    for c in plan.all() {
        let found = image_status(node, &c.image).await?;
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
                    // pod_workers.go: the kill waits in `pendingUpdate` until the sync in
                    // progress returned (a container's kill and its next attempt's start,
                    // which `SyncPod` runs under `context.WithoutCancel`).
                    let sync = ctx.sync.lock().await;
                    cancel.cancel();
                    drop(sync);
                    tracker.close();
                    let _ = tokio::time::timeout(SUPERVISORS_STOP, tracker.wait()).await;
                    let res = delete(&ctx, &opts).await;
                    let _ = done.send(res);
                    return;
                }
                // The pod's spec changed: its container's supervisor sees the new image and
                // restarts the container with it (`container::supervise`), as the kubelet's
                // next sync finds the container's hash changed (`computePodActions`).
                Some(Command::UpdateImage { container, image, done }) => {
                    ctx.container(&container, |s| s.image = image.clone());
                    ctx.record(Some(&container), What::ImageUpdated { image });
                    let _ = done.send(());
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

/// The pod's runs: each until it completes, or until a container's exit restarts every
/// container in place (KEP-5532), after which the pod runs again in the same sandbox.
async fn live(ctx: &Arc<PodCtx>, cancel: &CancellationToken, tracker: &TaskTracker) {
    loop {
        let this_run = cancel.child_token();
        let supervisors = TaskTracker::new();
        tokio::select! {
            () = run(ctx, &this_run, tracker, &supervisors) => return,
            () = ctx.wait_until(|s| s.restarting_all.is_some()) => {
                // This run's supervisors are gone before anything is killed: none sees its
                // container's exit and restarts it alone.
                this_run.cancel();
                supervisors.close();
                let _ = tokio::time::timeout(SUPERVISORS_STOP, supervisors.wait()).await;
                restart_all(ctx).await;
            }
        }
    }
}

/// Start order, then completion: init containers one after the other (each to completion;
/// a native sidecar until it has started), then the main containers in order, each after the
/// previous one's postStart returned. When the main containers are done for good (Never /
/// OnFailure), the native sidecars are stopped and the phase says how it went.
async fn run(
    ctx: &Arc<PodCtx>,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
    supervisors: &TaskTracker,
) {
    let spawn = |c: &plan::ContainerPlan| {
        let span =
            tracing::info_span!("testbed_container", pod = %ctx.plan.name, container = %c.name);
        let task = supervise(Arc::clone(ctx), c.clone(), cancel.child_token()).instrument(span);
        tracker.spawn(supervisors.track_future(task));
    };
    // The supervisors stop before the pod's last containers are stopped: nothing restarts.
    let complete = |phase: Phase| {
        cancel.cancel();
        async move {
            let stop = Stop::Graceful {
                grace: ctx.plan.grace_seconds,
                events: true,
            };
            let _ = kill_all(ctx, stop).await;
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
    let mains: Vec<String> = ctx.plan.containers.iter().map(|c| c.name.clone()).collect();
    let start_mains = async {
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
    };
    // `kubelet_pods.go` `getPhase`: Pending while a main container is still waiting (not
    // created and run yet), Running once none is; a container whose startup probe has not
    // passed yet is running.
    let running = async {
        ctx.wait_until(|s| {
            mains
                .iter()
                .all(|m| s.containers.get(m).is_none_or(|c| c.running || c.finished))
        })
        .await;
        ctx.set_phase(Phase::Running);
    };
    tokio::join!(start_mains, running);
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
