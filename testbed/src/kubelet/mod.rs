//! The Pod runner: Kubernetes Pod specs run on the test bed's containerd the way the kubelet
//! runs them (KEP-753 native sidecars, KEP-5307 container restart rules and KEP-5532 in-place
//! restarts of the whole pod included), and deleted the way the kubelet deletes them.
//!
//! A [`RunningPod`] has one worker task (the kubelet's pod worker: start order, completion,
//! deletion) and one supervisor task per container (create, start, postStart, probes, exit,
//! restart with backoff). Everything is recorded in the pod's [`Timeline`].
//!
//! Parts:
//! - `fields`: which fields of a Pod the runner honours, accepts as no-ops, or refuses;
//! - `plan`: a Pod resolved as the kubelet resolves it (containers, actions, security,
//!   volumes apart), and whether a container starts again;
//! - `config`: the CRI requests, with the kubelet's labels and annotations;
//! - `volumes`: hostPath, emptyDir and subPath set up before a container starts;
//! - `run`: pods run on a node, one or many;
//! - `worker`: the pod worker: start order, completion, deletion;
//! - `container`: one container's life: attempts, postStart, probes, restarts;
//! - `actions`: hooks and probes run the kubelet's way;
//! - `termination`: a deletion the kubelet's way, attempts started over when the grace is
//!   shortened or a kill failed;
//! - `ordering`: the native sidecars' stop order;
//! - `prestop`: a preStop hook run as `executePreStopHook` runs it;
//! - `kills`: the kubelet's own kills (eviction, node shutdown, `activeDeadlineSeconds`,
//!   preemption, a silent one) with their grace;
//! - `update`: an in-place image update;
//! - `inplace`: in-place restarts of every container (`RestartAllContainers`);
//! - `api`: what the kubelet tells the API server: its Events' texts, the pod's status;
//! - `report`: the pod's tasks reporting through `api`, each report in the timeline;
//! - `timeline`: what happened to a pod, in order, on the wall clock.

pub mod actions;
pub mod api;
pub mod config;
mod container;
pub mod fields;
mod inplace;
pub mod kills;
pub mod ordering;
pub mod plan;
mod prestop;
mod report;
mod run;
mod termination;
pub mod timeline;
mod update;
pub mod volumes;
mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exitorder::cri::PodSandboxConfig;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

pub use crate::node::exits::ExitInfo;
pub use api::{ApiSink, ApiStatus, EventType, KubeletEvent, PodRef};
pub use kills::Kill;
pub use plan::{Kind, PodPlan, RestartPolicy, Restarts, Then};
pub use termination::{ContainerRecord, Deletion, HookRecord};
pub use timeline::{now_ns, Event, Phase, Timeline, What};
pub use volumes::PathMap;

use crate::node::{NodeShared, TestbedError};

/// How to run a pod.
#[derive(Clone)]
pub struct RunOptions {
    /// Run a pod that does not ask for `hostNetwork` on the node's network anyway (the test
    /// bed has no CNI); said in the pod's notes. Without it such a pod is refused.
    pub force_host_network: bool,
    /// The first crash-loop back-off (the kubelet's is 10 s, doubling to 5 min). The first
    /// restart is immediate, as with the kubelet.
    pub crash_backoff: Duration,
    /// Host paths the pod names that live elsewhere on the test bed, besides the share.
    pub path_maps: Vec<PathMap>,
    /// Where the kubelet's Events and the pod's status go, as the real kubelet sends them to
    /// the API server (see [`api`]); `None`: nowhere.
    pub api: Option<Arc<dyn ApiSink>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            force_host_network: false,
            crash_backoff: Duration::from_secs(10),
            path_maps: Vec::new(),
            api: None,
        }
    }
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("force_host_network", &self.force_host_network)
            .field("crash_backoff", &self.crash_backoff)
            .field("path_maps", &self.path_maps)
            .field("api", &self.api.as_ref().map(|_| "a sink"))
            .finish()
    }
}

/// How to delete a pod.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `kubectl delete --grace-period`: replaces the pod's terminationGracePeriodSeconds
    /// (0 means 1, as the API server makes it without `--force`).
    pub grace_period: Option<i64>,
    /// Watch the pod's exit files (one inotify instance per deletion; turn off when deleting
    /// hundreds of pods at once).
    pub probe_exit_files: bool,
    /// Why the pod goes: a deletion through the API (the default), or one of the kubelet's
    /// own kills, with their grace, Events and final status ([`Kill`]). Only a deletion takes
    /// `grace_period`.
    pub kill: Kill,
    /// A second deletion during this one with a shorter grace period (a deletion only).
    pub shorten: Option<Shorten>,
    /// How much later than the others the runtime starts these containers' preStop execs
    /// (a node busy with other pods' execs, as when a node's pods are killed at once).
    pub exec_lag: Vec<(String, Duration)>,
    /// These containers' preStop execs fail: the runtime cannot start the hook's program (an
    /// exec at a container's `pids.max`, a binary gone from the share). The kubelet records
    /// `FailedPreStopHook` and goes on to TERM; the hook's own program never runs.
    pub exec_fails: Vec<String>,
    /// These containers' preStop execs start and exit at once with the status given, their
    /// hook's program never run: an entrypoint that does not know the hook's verb (a share
    /// rolled back to a release without `mark`) answers 64. The kubelet records
    /// `FailedPreStopHook` and goes on to TERM.
    pub exec_exits: Vec<(String, i32)>,
    /// `kubectl delete --force` (with `grace_period: Some(0)`): the API server keeps the
    /// deletion's 0, which the kubelet makes 1 s from 1.31 and the pod's own grace before.
    pub force: bool,
    /// The kubelet whose grace rules the kill follows ([`kills::NEWEST_KUBELET`] when
    /// `None`; from [`kills::OLDEST_KUBELET`]).
    pub kubelet_version: Option<kills::KubeletVersion>,
}

/// A second `kubectl delete --grace-period` while the pod is being killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shorten {
    /// How long after the kill began.
    pub after: Duration,
    /// The new grace period (0 means 1, as the API server makes it without `--force`).
    pub grace_seconds: i64,
}

impl DeleteOptions {
    /// Exit files probed, the pod's own grace period.
    pub fn probed() -> Self {
        DeleteOptions {
            grace_period: None,
            probe_exit_files: true,
            kill: Kill::Deletion,
            shorten: None,
            exec_lag: Vec::new(),
            exec_fails: Vec::new(),
            exec_exits: Vec::new(),
            force: false,
            kubelet_version: None,
        }
    }

    /// The kubelet's own kill of kind `kill`, exit files probed.
    pub fn kubelet(kill: Kill) -> Self {
        DeleteOptions {
            kill,
            ..DeleteOptions::probed()
        }
    }
}

/// One container as the kubelet reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatus {
    pub kind: Kind,
    /// The image the pod's spec names now (changed by [`RunningPod::update_image`]); the
    /// running attempt's may be the one before until the kubelet restarted it.
    pub image: String,
    /// The current (or last) attempt; the kubelet's restartCount.
    pub attempt: u32,
    pub id: Option<String>,
    pub running: bool,
    /// postStart returned and the startup probe (if any) succeeded.
    pub started: bool,
    pub ready: bool,
    pub last_exit: Option<ExitInfo>,
    /// It will not run again (completed, or failed for good).
    pub finished: bool,
}

impl ContainerStatus {
    fn new(kind: Kind, image: &str) -> Self {
        ContainerStatus {
            kind,
            image: image.to_owned(),
            attempt: 0,
            id: None,
            running: false,
            started: false,
            ready: false,
            last_exit: None,
            finished: false,
        }
    }
}

/// The pod as the kubelet reports it, with its timeline.
#[derive(Debug, Clone)]
pub struct PodStatus {
    pub phase: Phase,
    pub containers: BTreeMap<String, ContainerStatus>,
    /// Why the pod failed or could not run, when it did.
    pub message: Option<String>,
    /// The container whose exit restarts every container in place, while that goes on (the
    /// kubelet's `AllContainersRestarting` condition, KEP-5532).
    pub restarting_all: Option<String>,
    /// In-place restarts of the whole pod so far.
    pub restarts_all: u32,
    pub timeline: Timeline,
}

impl PodStatus {
    /// Whether every main container and native sidecar is ready.
    pub fn ready(&self) -> bool {
        self.containers
            .values()
            .filter(|c| c.kind != Kind::Init)
            .all(|c| c.ready)
    }

    pub fn container(&self, name: &str) -> Option<&ContainerStatus> {
        self.containers.get(name)
    }
}

/// What a pod's tasks share.
pub(crate) struct PodCtx {
    node: Arc<NodeShared>,
    plan: PodPlan,
    sandbox_id: String,
    sandbox_config: PodSandboxConfig,
    /// Each container's mount sources, in the order of its mounts.
    mount_sources: std::collections::HashMap<String, Vec<String>>,
    /// Where the pod's emptyDirs live; removed with the pod.
    pod_dir: PathBuf,
    crash_backoff: Duration,
    status: Mutex<PodStatus>,
    changed: watch::Sender<u64>,
    /// Where the kubelet's Events and status go, if anywhere.
    api: Option<Arc<dyn ApiSink>>,
    /// The status last reported there.
    api_status: Mutex<ApiStatus>,
    /// The pod worker's sync: one container's kill (a probe's, a changed spec's) is done
    /// inside `SyncPod` (`kuberuntime_manager.go`, step 3: `m.killContainer(...)` in a plain
    /// loop), so the pod's other containers start and restart only once it ended.
    sync: tokio::sync::Mutex<()>,
    /// How the runtime plays the preStop execs of the pod's kill (see
    /// [`DeleteOptions::exec_lag`], [`DeleteOptions::exec_fails`] and
    /// [`DeleteOptions::exec_exits`]).
    execs: Mutex<ExecPlay>,
}

/// The preStop execs of a pod's kill as the runtime plays them.
#[derive(Debug, Default)]
struct ExecPlay {
    lag: Vec<(String, Duration)>,
    fails: Vec<String>,
    exits: Vec<(String, i32)>,
}

impl PodCtx {
    fn lock(&self) -> std::sync::MutexGuard<'_, PodStatus> {
        match self.status.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Changes the status and wakes whoever waits on it.
    fn update(&self, f: impl FnOnce(&mut PodStatus)) {
        self.update_with(f);
    }

    /// [`update`](Self::update), with what `f` returns.
    fn update_with<R>(&self, f: impl FnOnce(&mut PodStatus) -> R) -> R {
        let r = f(&mut self.lock());
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        r
    }

    fn record_at(&self, at_ns: i64, container: Option<&str>, what: What) {
        self.update(|s| s.timeline.push(at_ns, container, what));
    }

    fn record(&self, container: Option<&str>, what: What) {
        self.record_at(now_ns(), container, what);
    }

    fn set_phase(&self, phase: Phase) {
        let changed = {
            let mut s = self.lock();
            let changed = s.phase != phase;
            s.phase = phase;
            changed
        };
        if changed {
            self.record(None, What::PhaseChanged { phase });
            self.phase_reported(phase);
        }
    }

    /// A container attempt ended: recorded at the runtime's exit time, and the status says
    /// whether it runs again.
    fn exited(&self, name: &str, attempt: u32, exit: &ExitInfo, finished: bool) {
        self.record_at(
            exit.finished_at_ns,
            Some(name),
            What::Exited {
                attempt,
                exit_code: exit.exit_code,
                reason: exit.reason.clone(),
            },
        );
        let last = exit.clone();
        self.container(name, |s| {
            s.running = false;
            s.ready = false;
            s.last_exit = Some(last);
            s.finished = finished;
        });
        // The status manager writes every container's new state.
        self.report_status();
    }

    fn container(&self, name: &str, f: impl FnOnce(&mut ContainerStatus)) {
        self.update(|s| {
            if let Some(c) = s.containers.get_mut(name) {
                f(c);
            }
        });
    }

    fn snapshot(&self) -> PodStatus {
        self.lock().clone()
    }

    /// Waits until `pred` holds for the status (checked at once, then on every change).
    async fn wait_until(&self, pred: impl Fn(&PodStatus) -> bool) {
        let mut rx = self.changed.subscribe();
        loop {
            if pred(&self.lock()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

pub(crate) enum Command {
    Delete {
        opts: DeleteOptions,
        done: oneshot::Sender<Result<Deletion, TestbedError>>,
    },
    /// The pod's spec changed one container's image (see [`RunningPod::update_image`]).
    UpdateImage {
        container: String,
        image: String,
        done: oneshot::Sender<()>,
    },
}

/// A pod running on the test bed. Dropping it without [`RunningPod::delete`] leaves its
/// containers running until the node is torn down.
pub struct RunningPod {
    ctx: Arc<PodCtx>,
    commands: mpsc::Sender<Command>,
}

impl RunningPod {
    pub fn uid(&self) -> &str {
        &self.ctx.plan.uid
    }

    pub fn name(&self) -> &str {
        &self.ctx.plan.name
    }

    pub fn namespace(&self) -> &str {
        &self.ctx.plan.namespace
    }

    pub fn plan(&self) -> &PodPlan {
        &self.ctx.plan
    }

    pub fn sandbox_id(&self) -> &str {
        &self.ctx.sandbox_id
    }

    /// Fields the runner accepted without effect, with why (`field: why`).
    pub fn notes(&self) -> Vec<String> {
        self.ctx
            .plan
            .notes
            .iter()
            .map(|n| format!("{}: {}", n.field, n.why))
            .collect()
    }

    /// The pod's status and timeline now.
    pub fn status(&self) -> PodStatus {
        self.ctx.snapshot()
    }

    /// The current container id of `name`.
    pub fn container_id(&self, name: &str) -> Option<String> {
        self.ctx
            .lock()
            .containers
            .get(name)
            .and_then(|c| c.id.clone())
    }

    /// The container's directory in the share (its `/var/run/exitorder`).
    pub fn container_dir(&self, name: &str) -> PathBuf {
        self.ctx
            .node
            .share_dir
            .join("pods")
            .join(&self.ctx.plan.uid)
            .join(name)
    }

    /// What the container's current attempt wrote to stdout and stderr (the CRI log, raw).
    pub fn container_log(&self, name: &str) -> String {
        let attempt = self
            .ctx
            .lock()
            .containers
            .get(name)
            .map_or(0, |c| c.attempt);
        self.container_log_of(name, attempt)
    }

    /// What one attempt of the container wrote.
    pub fn container_log_of(&self, name: &str, attempt: u32) -> String {
        std::fs::read_to_string(self.container_log_path(name, attempt)).unwrap_or_default()
    }

    /// Where one attempt of the container writes (the CRI log): kept after the pod's
    /// deletion, until the node is torn down.
    pub fn container_log_path(&self, name: &str, attempt: u32) -> PathBuf {
        PathBuf::from(&self.ctx.sandbox_config.log_directory)
            .join(name)
            .join(format!("{attempt}.log"))
    }

    /// Waits until `pred` holds, failing after `timeout` with the pod's timeline.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&PodStatus) -> bool,
    ) -> Result<PodStatus, TestbedError> {
        let ctx = Arc::clone(&self.ctx);
        match tokio::time::timeout(timeout, ctx.wait_until(|s| pred(s) || failed(s))).await {
            Ok(()) => {
                let s = self.status();
                if pred(&s) {
                    Ok(s)
                } else {
                    Err(self.not_happened(what, timeout, &s))
                }
            }
            Err(_) => Err(self.not_happened(what, timeout, &self.status())),
        }
    }

    fn not_happened(&self, what: &str, waited: Duration, s: &PodStatus) -> TestbedError {
        TestbedError::Timeout {
            what: format!("{what} (pod {})", self.name()),
            waited,
            context: format!(
                "; pod phase {}{}; its timeline:\n{}",
                s.phase,
                s.message
                    .as_ref()
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default(),
                s.timeline
                    .render(s.timeline.events.first().map_or(0, |e| e.at_ns))
            ),
        }
    }

    /// Waits until every main container has started (its postStart returned).
    pub async fn wait_started(&self, timeout: Duration) -> Result<PodStatus, TestbedError> {
        self.wait_for("every container started", timeout, |s| {
            s.containers
                .values()
                .filter(|c| c.kind == Kind::Main)
                .all(|c| c.started || c.finished)
        })
        .await
    }

    /// Waits until the pod is ready (every container ready).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<PodStatus, TestbedError> {
        self.wait_for("the pod ready", timeout, PodStatus::ready)
            .await
    }

    /// Waits until the pod has completed (phase Succeeded or Failed).
    pub async fn wait_completed(&self, timeout: Duration) -> Result<PodStatus, TestbedError> {
        self.wait_for("the pod completed", timeout, |s| {
            matches!(s.phase, Phase::Succeeded | Phase::Failed)
        })
        .await
    }

    /// Waits until `container` has written `needle` to its output.
    pub async fn wait_output(
        &self,
        container: &str,
        needle: &str,
        timeout: Duration,
    ) -> Result<(), TestbedError> {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.container_log(container).contains(needle) {
            if tokio::time::Instant::now() >= deadline {
                return Err(TestbedError::Timeout {
                    what: format!("output {needle:?} from container {container}"),
                    waited: timeout,
                    context: format!("; its output so far: {:?}", self.container_log(container)),
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Deletes the pod the kubelet's way with its own grace period, exit files probed.
    pub async fn delete(self) -> Result<Deletion, TestbedError> {
        self.delete_with(DeleteOptions::probed()).await
    }

    /// Deletes the pod the kubelet's way: every preStop hook at once, then TERM (native
    /// sidecars after the main containers, in reverse order), KILL at the end of the grace
    /// period; then the sandbox is removed.
    pub async fn delete_with(self, opts: DeleteOptions) -> Result<Deletion, TestbedError> {
        // A kill that cannot be is refused before anything is killed.
        opts.kill.grace(
            self.ctx.plan.grace_seconds,
            opts.grace_period,
            opts.force,
            opts.kubelet_version.unwrap_or(kills::NEWEST_KUBELET),
        )?;
        let (done, rx) = oneshot::channel();
        self.commands
            .send(Command::Delete { opts, done })
            .await
            .map_err(|_| TestbedError::Task("the pod's worker is gone".into()))?;
        rx.await
            .map_err(|_| TestbedError::Task("the pod's worker ended during the deletion".into()))?
    }
}

fn failed(s: &PodStatus) -> bool {
    s.message.is_some() && matches!(s.phase, Phase::Failed | Phase::Pending)
}

/// Reads a Pod (or the first Pod among several documents) from YAML or JSON text.
pub fn pod_from_yaml(text: &str) -> Result<Value, TestbedError> {
    let docs = crate::manifest::documents(text)?;
    docs.into_iter()
        .find(|d| d.get("kind").and_then(Value::as_str) == Some("Pod"))
        .ok_or_else(|| TestbedError::BadSpec("no Pod in the given YAML".into()))
}
