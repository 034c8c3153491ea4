//! The node agent's decision loop: exit files in, `allow` answers out.
//!
//! One task owns all state (pending waits, caches, the file watcher), so nothing is locked and
//! every decision sees a consistent view. The runtime is read with one snapshot (two list
//! calls) per round, whatever the number of pods waiting.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn, Instrument};

use crate::cluster::Cluster;
use crate::decide::{self, Attempt, Deletion, PodFacts, Reason, Verdict};
use crate::podwatch::{ApiPod, ConfirmRequest, PodSignal, PodView};
use crate::priority::{self, PodPriorities, PriorityError};
use crate::recorder::{EventSink, ExitNotice, PodRef};
use crate::runtime::{RtContainer, RtPod, Runtime, RuntimeError, Snapshot};
use crate::share::{ContainerName, ExitKey, ExitState, PodUid, Share, ShareEntry, ShareError};
use crate::source::{self, SourceChoice, SourceKind, SourceSignal};
use crate::stats::Stats;
use crate::watch::{FsEvent, ShareWatcher, WatchError};

/// Kubernetes' default terminationGracePeriodSeconds, used when the kubelet's annotation is
/// missing.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct Config {
    pub share_dir: PathBuf,
    pub cri_socket: PathBuf,
    /// Taken off the grace deadline so a released sidecar still drains before SIGKILL.
    pub grace_reserve: Duration,
    /// How often the runtime is re-read while some exit is pending (nothing is read while
    /// none is).
    pub poll_interval: Duration,
    /// How exits are detected: from the runtime's Version answer, or forced.
    pub exit_source: SourceChoice,
    /// While an event stream is live, pending pods are still re-read this often: a safety net
    /// for an event the runtime never sent, not the way exits are found.
    pub event_resync: Duration,
    /// How often pod directories of pods gone from the runtime are removed, and the share is
    /// rescanned as a safety net for lost inotify events.
    pub gc_interval: Duration,
    /// A pod directory younger than this is never removed (the kubelet may be creating it).
    pub gc_min_age: Duration,
    /// Installed as `bin/exitorder-entrypoint` at start-up, when given.
    pub entrypoint_binary: Option<PathBuf>,
    /// How old a wait must be before the API server's "not being deleted" releases it: time
    /// for a deletion the kubelet already acts on to reach the agent's own watch.
    pub api_settle: Duration,
}

impl Config {
    pub fn new(share_dir: PathBuf, cri_socket: PathBuf) -> Self {
        Config {
            share_dir,
            cri_socket,
            grace_reserve: Duration::from_secs(5),
            poll_interval: Duration::from_millis(25),
            exit_source: SourceChoice::Auto,
            event_resync: Duration::from_secs(1),
            gc_interval: Duration::from_secs(60),
            gc_min_age: Duration::from_secs(60),
            entrypoint_binary: None,
            api_settle: Duration::from_millis(250),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Share(#[from] ShareError),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("install entrypoint from {path}: {source}")]
    Install {
        path: PathBuf,
        #[source]
        source: ShareError,
    },
}

struct Waiter {
    since: Instant,
    /// Whether "waiting for ..." was already logged, so a long wait logs once.
    announced: bool,
}

struct PendingPod {
    /// When the pod's first exit file appeared: in runtime-only mode, the start of the grace
    /// period (the kubelet runs every preStop at once when the pod is deleted).
    first_seen: Instant,
    waiting: BTreeMap<ContainerName, Waiter>,
    /// Last grace period learnt, for rounds where the runtime does not answer.
    grace: Option<Duration>,
    /// The pod's namespace and name as the runtime reported them: how the API server's view
    /// is found, and what Events are attached to.
    names: Option<(String, String)>,
    /// When the waits of this pod must be decided again without any event (a deadline, the
    /// end of a settle time), as of the last decision.
    wake: Option<Instant>,
    confirm: Confirmation,
}

/// The API server's own word on whether a pod the watch shows staying is staying.
#[derive(Default)]
struct Confirmation {
    /// When the latest read that said "staying" was asked.
    staying_at: Option<Instant>,
    /// A read said the pod is not staying: ordered from now on, whatever the watch says.
    denied: bool,
    /// A read is in flight.
    asked: bool,
    /// After a failed read, not before this.
    retry_at: Option<Instant>,
}

/// Env reads in flight at once while many pods are decided together.
const ENV_CONCURRENCY: usize = 16;

/// How long after a failed confirming read the next may be asked.
const CONFIRM_RETRY: Duration = Duration::from_secs(1);

/// Priority facts about a container id never change; they are read once per container.
type EnvPriority = Result<Option<u8>, PriorityError>;

pub struct Agent {
    cfg: Config,
    share: Share,
    runtime: Runtime,
    watcher: ShareWatcher,
    events: mpsc::UnboundedReceiver<FsEvent>,
    signals: mpsc::UnboundedReceiver<SourceSignal>,
    signal_tx: mpsc::UnboundedSender<SourceSignal>,
    /// The event stream in use, while it is connected; `None` means polling.
    live_source: Option<SourceKind>,
    /// Containers an exit event named, until the runtime's own listing agrees: the event can
    /// arrive before the runtime's CRI view changes.
    exited: HashMap<String, Instant>,
    pending: BTreeMap<PodUid, PendingPod>,
    env_cache: HashMap<String, EnvPriority>,
    warned: HashSet<(PodUid, String)>,
    gc_suspects: HashSet<PodUid>,
    stats: Arc<Stats>,
    /// The API server's view of this node's pods, when there is an API server.
    view: Option<PodView>,
    pod_signals: Option<mpsc::UnboundedReceiver<PodSignal>>,
    pod_events: Option<EventSink>,
}

impl Agent {
    /// Opens the share, installs the entrypoint, starts watching and finds exit files already
    /// waiting (an agent restarted mid-drain must answer them).
    pub fn start(cfg: Config, stats: Arc<Stats>) -> Result<Self, AgentError> {
        let share = Share::open(&cfg.share_dir)?;
        if let Some(src) = &cfg.entrypoint_binary {
            // Sidecar images (distroless, busybox, musl) run only a static binary for this
            // node's architecture; anything else would fail in every preStop hook, silently
            // leaving pods unordered. It is refused, and the agent stays not ready.
            match crate::elf::check_static_executable(src) {
                Ok(()) => {
                    let dst =
                        share
                            .install_entrypoint(src)
                            .map_err(|source| AgentError::Install {
                                path: src.clone(),
                                source,
                            })?;
                    info!(from = %src.display(), to = %dst.display(), "entrypoint installed");
                }
                Err(e) => {
                    let why = format!(
                        "entrypoint {} refused: {e}; sidecar images need a static build: \
                         `cargo rustc -p exitorder-entrypoint --release --bin \
                         exitorder-entrypoint -- -C target-feature=+crt-static` (as the \
                         exitorder image has it), given with --entrypoint-binary",
                        src.display()
                    );
                    error!(event = "entrypoint_refused", file = %src.display(), problem = %e, "{why}");
                    stats.refuse_entrypoint(why);
                }
            }
        }
        let runtime = Runtime::connect(&cfg.cri_socket)?;
        let (tx, events) = mpsc::unbounded_channel();
        let (signal_tx, signals) = mpsc::unbounded_channel();
        let mut watcher = ShareWatcher::new(tx)?;
        // Watch before scanning: a file created in between is then both scanned and reported.
        watcher.watch(&share.pods_path())?;
        let mut agent = Agent {
            cfg,
            share,
            runtime,
            watcher,
            events,
            signals,
            signal_tx,
            live_source: None,
            exited: HashMap::new(),
            pending: BTreeMap::new(),
            env_cache: HashMap::new(),
            warned: HashSet::new(),
            gc_suspects: HashSet::new(),
            stats,
            view: None,
            pod_signals: None,
            pod_events: None,
        };
        agent.rescan();
        agent.stats.set_watching(true);
        agent.stats.set_event_source(SourceKind::Poll.as_str());
        Ok(agent)
    }

    /// Decides with the API server's view of the pods (deletion state, grace period,
    /// annotations) and posts Kubernetes Events about held exits.
    pub fn with_cluster(mut self, cluster: Cluster) -> Self {
        self.view = Some(cluster.view);
        self.pod_signals = Some(cluster.signals);
        self.pod_events = Some(cluster.events);
        self
    }

    pub fn pending_count(&self) -> usize {
        self.pending.values().map(|p| p.waiting.len()).sum()
    }

    /// Runs until `shutdown` completes. Pending waits are left in place for the next agent
    /// (or the entrypoint's own timeout): answering them on the way out would break the order.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        let version = match self.runtime.version().await {
            Ok(v) => {
                self.stats.set_runtime_ok(true);
                info!(
                    runtime = %v.runtime_name,
                    version = %v.runtime_version,
                    api = %v.runtime_api_version,
                    "runtime connected"
                );
                Some(v)
            }
            Err(e) => {
                self.stats.runtime_error(e.kind());
                warn!(error = %e, "runtime not reachable yet; deciding from what the share shows until it is");
                None
            }
        };
        info!(
            share = %self.cfg.share_dir.display(),
            pending = self.pending_count(),
            watches = self.watcher.len(),
            "agent ready"
        );
        let all: BTreeSet<PodUid> = self.pending.keys().cloned().collect();
        self.evaluate(all).await;

        let source_task = tokio::spawn(
            source::run(
                self.runtime.channel(),
                self.cfg.exit_source,
                version,
                self.signal_tx.clone(),
            )
            .instrument(tracing::info_span!("exit_source")),
        );
        tokio::pin!(shutdown);
        let mut gc = tokio::time::interval_at(
            tokio::time::Instant::now() + self.cfg.gc_interval,
            self.cfg.gc_interval,
        );
        gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let wake = self.next_wake();
            let mut dirty = BTreeSet::new();
            tokio::select! {
                () = &mut shutdown => break,
                ev = self.events.recv() => {
                    let Some(ev) = ev else { break };
                    self.on_fs_event(ev, &mut dirty);
                    // Take everything already queued, so a burst costs one runtime round.
                    while let Ok(ev) = self.events.try_recv() {
                        self.on_fs_event(ev, &mut dirty);
                    }
                }
                Some(sig) = self.signals.recv() => {
                    self.on_signal(sig, &mut dirty);
                    while let Ok(sig) = self.signals.try_recv() {
                        self.on_signal(sig, &mut dirty);
                    }
                }
                sig = recv_some(&mut self.pod_signals) => match sig {
                    Some(sig) => {
                        self.on_pod_signal(sig, &mut dirty);
                        while let Some(Ok(sig)) = self.pod_signals.as_mut().map(|rx| rx.try_recv()) {
                            self.on_pod_signal(sig, &mut dirty);
                        }
                    }
                    // The watch ended (shutdown): decide by the runtime's rules from now on.
                    None => {
                        self.pod_signals = None;
                        self.view = None;
                    }
                },
                () = sleep_until(wake), if wake.is_some() => {
                    dirty.extend(self.pending.keys().cloned());
                }
                _ = gc.tick() => self.gc().await,
            }
            if !dirty.is_empty() {
                self.evaluate(dirty).await;
            }
        }
        source_task.abort();
        self.stats.set_watching(false);
        info!(pending = self.pending_count(), "agent stopped");
        Ok(())
    }

    /// When the runtime must be read again without an event. Nothing pending: never. With a
    /// live event stream: the earliest deadline, or the safety resync. Polling: the poll
    /// interval.
    fn next_wake(&self) -> Option<Instant> {
        if self.pending.is_empty() {
            return None;
        }
        let now = Instant::now();
        if self.live_source.is_none() {
            return Some(now + self.cfg.poll_interval);
        }
        let resync = now + self.cfg.event_resync;
        Some(
            self.pending
                .values()
                .filter_map(|p| p.wake)
                .fold(resync, Instant::min),
        )
    }

    fn on_pod_signal(&mut self, sig: PodSignal, dirty: &mut BTreeSet<PodUid>) {
        match sig {
            PodSignal::Changed(uid) => {
                if let Ok(pod) = PodUid::parse(&uid) {
                    if self.pending.contains_key(&pod) {
                        dirty.insert(pod);
                    }
                }
            }
            PodSignal::Resync => dirty.extend(self.pending.keys().cloned()),
            PodSignal::Confirmed {
                uid,
                asked_at,
                staying,
            } => {
                let Ok(pod) = PodUid::parse(&uid) else {
                    return;
                };
                let Some(p) = self.pending.get_mut(&pod) else {
                    return;
                };
                p.confirm.asked = false;
                match staying {
                    Some(true) => {
                        p.confirm.staying_at = p.confirm.staying_at.max(Some(asked_at));
                    }
                    Some(false) => {
                        info!(pod = %pod, "the API server says the pod is going away; exits stay ordered");
                        p.confirm.denied = true;
                    }
                    None => p.confirm.retry_at = Some(Instant::now() + CONFIRM_RETRY),
                }
                dirty.insert(pod);
            }
        }
    }

    fn on_signal(&mut self, sig: SourceSignal, dirty: &mut BTreeSet<PodUid>) {
        match sig {
            SourceSignal::Exit(Some(id)) => {
                self.exited.insert(id, Instant::now());
            }
            SourceSignal::Exit(None) => {}
            SourceSignal::Connected(kind) => {
                info!(source = kind.as_str(), "exit source connected");
                self.live_source = Some(kind);
                self.stats.set_event_source(kind.as_str());
            }
            SourceSignal::Down(kind) => {
                if self.live_source.take().is_some() {
                    info!(
                        source = kind.as_str(),
                        "exit source down; polling while exits are pending"
                    );
                }
                self.stats.set_event_source(SourceKind::Poll.as_str());
            }
        }
        // Every signal means the runtime may have changed under a pending pod; (re)connects
        // also cover exits missed while the stream was down.
        dirty.extend(self.pending.keys().cloned());
    }

    fn on_fs_event(&mut self, ev: FsEvent, dirty: &mut BTreeSet<PodUid>) {
        match ev {
            FsEvent::Changed(paths) => {
                for path in paths {
                    match self.share.classify(&path) {
                        Ok(Some(ShareEntry::Pod(pod))) => self.sync_pod(&pod, dirty),
                        Ok(Some(ShareEntry::Container(key))) => self.sync_container(&key, dirty),
                        Ok(Some(ShareEntry::ExitFile(key))) => self.sync_exit(&key, dirty),
                        Ok(None) => {}
                        Err(e) => debug!(error = %e, "ignoring share entry"),
                    }
                }
            }
            FsEvent::Rescan => {
                warn!("file events were lost; rescanning the share");
                self.rescan();
                dirty.extend(self.pending.keys().cloned());
            }
            FsEvent::Error(e) => {
                self.stats.share_error();
                warn!(error = %e, "share watch error");
            }
        }
    }

    /// Walks the whole share: watches every pod and container directory and picks up every
    /// exit file waiting.
    fn rescan(&mut self) {
        let mut dirty = BTreeSet::new();
        match self.share.pods() {
            Ok(pods) => {
                for pod in pods {
                    self.sync_pod(&pod, &mut dirty);
                }
            }
            Err(e) => {
                self.stats.share_error();
                warn!(error = %e, "cannot list the share");
            }
        }
        // Waits whose pod directory vanished.
        let gone: Vec<PodUid> = self
            .pending
            .keys()
            .filter(|p| !self.share.pod_path(p).exists())
            .cloned()
            .collect();
        for pod in gone {
            self.sync_pod(&pod, &mut dirty);
        }
    }

    fn sync_pod(&mut self, pod: &PodUid, dirty: &mut BTreeSet<PodUid>) {
        let path = self.share.pod_path(pod);
        if !path.is_dir() {
            self.watcher.forget(&path);
        } else {
            // Watch before listing: the kubelet creates container directories right after
            // the pod's, and one created between a listing and the watch would go unseen.
            if let Err(e) = self.watcher.watch(&path) {
                self.stats.share_error();
                warn!(error = %e, "cannot watch pod directory");
            }
            match self.share.containers_in(pod) {
                Ok(keys) => {
                    for key in keys {
                        self.sync_container(&key, dirty);
                    }
                }
                Err(e) => {
                    self.stats.share_error();
                    warn!(pod = %pod, error = %e, "cannot list pod directory");
                }
            }
        }
        // Waits recorded for containers whose directory is gone are re-read (and dropped).
        let known: Vec<ExitKey> = self
            .pending
            .get(pod)
            .map(|p| {
                p.waiting
                    .keys()
                    .map(|c| ExitKey {
                        pod: pod.clone(),
                        container: c.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        for key in known {
            self.sync_exit(&key, dirty);
        }
    }

    fn sync_container(&mut self, key: &ExitKey, dirty: &mut BTreeSet<PodUid>) {
        match self.share.prepare_container_dir(key) {
            Ok(()) => {
                if let Err(e) = self.watcher.watch(&self.share.container_path(key)) {
                    self.stats.share_error();
                    warn!(container = %key, error = %e, "cannot watch container directory");
                }
            }
            Err(e) if e.is_not_found() => self.watcher.forget(&self.share.container_path(key)),
            Err(e) => {
                self.stats.share_error();
                warn!(container = %key, error = %e, "skipping container directory");
            }
        }
        self.sync_exit(key, dirty);
    }

    fn sync_exit(&mut self, key: &ExitKey, dirty: &mut BTreeSet<PodUid>) {
        let state = match self.share.read_exit(key) {
            Ok(s) => s,
            Err(e) => {
                self.stats.share_error();
                warn!(container = %key, error = %e, "skipping unreadable exit file");
                ExitState::Absent
            }
        };
        match state {
            ExitState::Waiting => {
                if self
                    .pending
                    .get(&key.pod)
                    .is_some_and(|p| p.waiting.contains_key(&key.container))
                {
                    return;
                }
                let now = Instant::now();
                let since = self
                    .share
                    .exit_age(key)
                    .and_then(|age| now.checked_sub(age))
                    .unwrap_or(now);
                let pod = self
                    .pending
                    .entry(key.pod.clone())
                    .or_insert_with(|| PendingPod {
                        first_seen: since,
                        waiting: BTreeMap::new(),
                        grace: None,
                        names: None,
                        wake: None,
                        confirm: Confirmation::default(),
                    });
                pod.first_seen = pod.first_seen.min(since);
                pod.waiting.insert(
                    key.container.clone(),
                    Waiter {
                        since,
                        announced: false,
                    },
                );
                debug!(container = %key, "exit file waiting");
                dirty.insert(key.pod.clone());
            }
            ExitState::Unexpected(text) => {
                warn!(container = %key, content = %text, "exit file has unexpected content; ignored");
                self.drop_waiter(key);
            }
            ExitState::Allowed | ExitState::Absent => self.drop_waiter(key),
        }
        self.stats.set_pending(self.pending_count());
    }

    fn drop_waiter(&mut self, key: &ExitKey) {
        if let Some(p) = self.pending.get_mut(&key.pod) {
            p.waiting.remove(&key.container);
            if p.waiting.is_empty() {
                self.pending.remove(&key.pod);
            }
        }
    }

    /// Decides for every waiting container of the `dirty` pods.
    async fn evaluate(&mut self, dirty: BTreeSet<PodUid>) {
        let dirty: Vec<PodUid> = dirty
            .into_iter()
            .filter(|p| self.pending.contains_key(p))
            .collect();
        if dirty.is_empty() {
            return;
        }
        let snapshot = match self.runtime.snapshot().await {
            Ok(s) => {
                self.stats.set_runtime_ok(true);
                self.forget_confirmed_exits(&s);
                Some(s)
            }
            Err(e) => {
                self.stats.runtime_error(e.kind());
                warn!(error = %e, "runtime not answering; only deadlines release waits");
                None
            }
        };
        if let Some(s) = &snapshot {
            self.prefetch_env(&dirty, s).await;
        }
        let now = Instant::now();
        for pod in dirty {
            let facts = match &snapshot {
                Some(s) => self.facts(&pod, s).await,
                None => self.facts_without_runtime(&pod),
            };
            self.apply(&pod, facts, now);
        }
        self.stats.set_pending(self.pending_count());
    }

    /// Drops event-reported exits the runtime's listing now shows (or no longer lists), and
    /// any older than a minute.
    fn forget_confirmed_exits(&mut self, snapshot: &Snapshot) {
        if self.exited.is_empty() {
            return;
        }
        let states: HashMap<&str, decide::RunState> = snapshot
            .values()
            .flat_map(|p| p.containers.iter().map(|c| (c.id.as_str(), c.state)))
            .collect();
        self.exited.retain(|id, at| {
            at.elapsed() < Duration::from_secs(60)
                && states
                    .get(id.as_str())
                    .is_some_and(|s| *s != decide::RunState::Exited)
        });
    }

    /// Facts for a pod from the runtime's snapshot and, when current, the API server's view;
    /// `None` when the runtime has no such pod.
    async fn facts(&mut self, pod: &PodUid, snapshot: &Snapshot) -> Option<PodFacts> {
        let rt = snapshot.get(pod.as_str())?;
        {
            let p = self.pending.get_mut(pod)?;
            if let Some(g) = rt.grace_period() {
                p.grace = Some(g);
            }
            if !rt.name.is_empty() {
                p.names = Some((rt.namespace.clone(), rt.name.clone()));
            }
        }
        let api = self.api_pod(pod);
        let attempts = self
            .attempts(pod, pod_priorities(rt, api.as_ref()), &rt.containers)
            .await;
        let (deletion, deadline) = self.deletion_and_deadline(pod, api.as_ref())?;
        Some(PodFacts {
            attempts,
            deletion,
            deadline: Some(deadline),
        })
    }

    /// The API server's current view of a pending pod, found by the names the runtime gave.
    fn api_pod(&self, pod: &PodUid) -> Option<ApiPod> {
        let (namespace, name) = self.pending.get(pod)?.names.as_ref()?;
        self.view.as_ref()?.get(namespace, name, pod.as_str())
    }

    /// Whether the pod is going away, and when its waits end regardless of order: the grace
    /// period (the deletion's own when the API server gave one, else the kubelet's container
    /// annotation) counted from the pod's first exit file, less the reserve. The kubelet
    /// starts its grace clock when it starts killing the pod, which is when it runs the
    /// preStop hooks, not at the API server's deletionTimestamp: a kubelet that sees the
    /// deletion late (a node back from NotReady) still gives the full grace period.
    fn deletion_and_deadline(
        &self,
        pod: &PodUid,
        api: Option<&ApiPod>,
    ) -> Option<(Deletion, Instant)> {
        let p = self.pending.get(pod)?;
        let deletion = match api {
            Some(a) if a.is_staying() && !p.confirm.denied => Deletion::NotDeleting {
                settle: self.cfg.api_settle,
                confirmed: p.confirm.staying_at,
            },
            // Going away, or not known to the view: ordered, as in runtime-only mode.
            _ => Deletion::Deleting,
        };
        let grace = api
            .and_then(ApiPod::grace)
            .or(p.grace)
            .unwrap_or(DEFAULT_GRACE);
        let deadline = p.first_seen + grace.saturating_sub(self.cfg.grace_reserve);
        Some((deletion, deadline))
    }

    /// Without the runtime nothing is known of container states; only the deadline (or a
    /// confirmed "staying") can release a wait, so a runtime outage never holds a pod past
    /// its grace period.
    fn facts_without_runtime(&self, pod: &PodUid) -> Option<PodFacts> {
        let p = self.pending.get(pod)?;
        let api = self.api_pod(pod);
        let (deletion, deadline) = self.deletion_and_deadline(pod, api.as_ref())?;
        let attempts = p
            .waiting
            .keys()
            .map(|c| Attempt {
                name: c.as_str().to_owned(),
                attempt: 0,
                created_at: 0,
                state: decide::RunState::Running,
                priority: 1,
            })
            .chain(std::iter::once(Attempt {
                // Stands for "containers we cannot see", so waits are held until the deadline.
                name: String::new(),
                attempt: 0,
                created_at: 0,
                state: decide::RunState::Unknown,
                priority: 0,
            }))
            .collect();
        Some(PodFacts {
            attempts,
            deletion,
            deadline: Some(deadline),
        })
    }

    /// The pod's containers with their priorities resolved. A malformed priority anywhere
    /// makes the whole pod unordered (every container 0): bad input never holds a pod.
    async fn attempts(
        &mut self,
        pod: &PodUid,
        pod_prios: Result<Option<PodPriorities>, PriorityError>,
        containers: &[RtContainer],
    ) -> Vec<Attempt> {
        let mut unordered = false;
        let pod_prios = match pod_prios {
            Ok(p) => p,
            Err(e) => {
                self.warn_once(pod, &e);
                unordered = true;
                None
            }
        };
        // Env is read only for newest attempts: older ones decide nothing.
        let newest: HashSet<&str> = newest_containers(containers)
            .into_iter()
            .map(|c| c.id.as_str())
            .collect();
        let mut out = Vec::with_capacity(containers.len());
        for c in containers {
            let is_newest = newest.contains(c.id.as_str());
            let named = pod_prios.as_ref().is_some_and(|p| p.contains_key(&c.name));
            let env = if unordered || !is_newest || named {
                None
            } else {
                match self.env_priority(&c.id).await {
                    Ok(v) => v,
                    Err(e) => {
                        self.warn_once(pod, &e);
                        unordered = true;
                        None
                    }
                }
            };
            let mut attempt = to_attempt(c, priority::resolve(&c.name, pod_prios.as_ref(), env));
            if self.exited.contains_key(&c.id) {
                attempt.state = decide::RunState::Exited;
            }
            out.push(attempt);
        }
        if unordered {
            for a in &mut out {
                a.priority = 0;
            }
        }
        out
    }

    /// Reads, all at once, the env of every container of `pods` whose priority may come from
    /// it and is not known yet. One verbose status call per container, the first time a pod
    /// is decided: one after another, a node draining 250 pods would wait seconds on them.
    async fn prefetch_env(&mut self, pods: &[PodUid], snapshot: &Snapshot) {
        let mut ids = Vec::new();
        for pod in pods {
            let Some(rt) = snapshot.get(pod.as_str()) else {
                continue;
            };
            // A malformed annotation makes the pod unordered: no env needed.
            let Ok(named) = pod_priorities(rt, self.api_pod(pod).as_ref()) else {
                continue;
            };
            for c in newest_containers(&rt.containers) {
                let is_named = named.as_ref().is_some_and(|n| n.contains_key(&c.name));
                if !is_named && !self.env_cache.contains_key(&c.id) {
                    ids.push(c.id.clone());
                }
            }
        }
        if ids.is_empty() {
            return;
        }
        let runtime = &self.runtime;
        let results: Vec<_> = futures_util::stream::iter(ids)
            .map(|id| async move {
                let env = runtime.container_env(&id).await;
                (id, env)
            })
            .buffer_unordered(ENV_CONCURRENCY)
            .collect()
            .await;
        for (id, env) in results {
            match env {
                Ok(envs) => {
                    let v = priority::from_env(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                    self.env_cache.insert(id, v);
                }
                // Asked again, one by one, when the pod is decided.
                Err(e) => self.stats.runtime_error(e.kind()),
            }
        }
    }

    async fn env_priority(&mut self, id: &str) -> EnvPriority {
        if let Some(v) = self.env_cache.get(id) {
            return v.clone();
        }
        match self.runtime.container_env(id).await {
            Ok(envs) => {
                let v = priority::from_env(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                self.env_cache.insert(id.to_owned(), v.clone());
                v
            }
            Err(e) => {
                // Not cached: the next round asks again. Meanwhile the annotation and presets
                // still order the pod.
                self.stats.runtime_error(e.kind());
                warn!(container_id = %id, error = %e, "cannot read container env");
                Ok(None)
            }
        }
    }

    fn warn_once(&mut self, pod: &PodUid, e: &PriorityError) {
        if self.warned.insert((pod.clone(), e.to_string())) {
            warn!(pod = %pod, error = %e, "bad exit priority; pod treated as unordered");
        }
    }

    fn apply(&mut self, pod: &PodUid, facts: Option<PodFacts>, now: Instant) {
        let Some(p) = self.pending.get_mut(pod) else {
            return;
        };
        let staying = facts
            .as_ref()
            .is_some_and(|f| matches!(f.deletion, Deletion::NotDeleting { .. }));
        let mut wake: Option<Instant> = None;
        let mut allowed = Vec::new();
        let mut unconfirmed = false;
        for (name, waiter) in p.waiting.iter_mut() {
            match decide::decide(facts.as_ref(), name.as_str(), waiter.since, now) {
                Verdict::Allow(reason) => allowed.push((name.clone(), reason, waiter.announced)),
                Verdict::Wait { blocked_by, until } => {
                    wake = [wake, until].into_iter().flatten().min();
                    if staying {
                        // Not held for order: waiting for the settle time or the API
                        // server's confirmation, a restart's short pause.
                        unconfirmed |= p.confirm.staying_at.is_none_or(|c| c < waiter.since);
                    } else if !waiter.announced {
                        waiter.announced = true;
                        info!(event = "held", pod = %pod, container = %name, waiting_for = ?blocked_by, "exit held");
                    }
                }
            }
        }
        p.wake = wake;
        let ask = unconfirmed && !p.confirm.asked && p.confirm.retry_at.is_none_or(|t| now >= t);
        if ask {
            if let (Some(view), Some((namespace, name))) = (&self.view, &p.names) {
                p.confirm.asked = true;
                view.confirm(ConfirmRequest {
                    uid: pod.as_str().to_owned(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                    asked_at: now,
                });
            }
        }
        for (container, reason, held) in allowed {
            // A deadline allow always tells; any other only when the exit was held.
            let still_running = match (&facts, reason) {
                (Some(f), Reason::Deadline) => decide::still_running(f, container.as_str())
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .collect(),
                _ => Vec::new(),
            };
            let key = ExitKey {
                pod: pod.clone(),
                container,
            };
            let tell = (held || reason == Reason::Deadline).then_some(still_running);
            self.allow(&key, reason, tell);
        }
    }

    /// Writes `allow`; `tell` (what still ran) asks for a Kubernetes Event about it.
    fn allow(&mut self, key: &ExitKey, reason: Reason, tell: Option<Vec<String>>) {
        let Some(since) = self
            .pending
            .get(&key.pod)
            .and_then(|p| p.waiting.get(&key.container))
            .map(|w| w.since)
        else {
            return;
        };
        let waited = since.elapsed();
        match self.share.write_allow(key) {
            Ok(()) => {
                self.stats.allowed(reason, waited);
                info!(
                    event = "allow",
                    pod = %key.pod,
                    container = %key.container,
                    reason = %reason,
                    waited_ms = waited.as_millis() as u64,
                    "exit allowed"
                );
                if let Some(still_running) = tell {
                    self.tell(key, reason, waited, still_running);
                }
            }
            Err(e) if e.is_not_found() => debug!(container = %key, "container directory gone"),
            Err(e) => {
                self.stats.share_error();
                warn!(container = %key, error = %e, "cannot write allow");
            }
        }
        self.drop_waiter(key);
    }

    /// Queues a Kubernetes Event about an allow, when there is an API server and the pod's
    /// names are known.
    fn tell(&self, key: &ExitKey, reason: Reason, waited: Duration, still_running: Vec<String>) {
        let Some(sink) = &self.pod_events else {
            return;
        };
        let Some((namespace, name)) = self.pending.get(&key.pod).and_then(|p| p.names.clone())
        else {
            debug!(container = %key, "no pod name known; no event");
            return;
        };
        sink.emit(ExitNotice {
            pod: PodRef {
                namespace,
                name,
                uid: key.pod.as_str().to_owned(),
            },
            container: key.container.as_str().to_owned(),
            reason,
            waited,
            still_running,
            at: SystemTime::now(),
        });
    }

    /// Removes directories of pods the runtime no longer has, and rescans the share. A pod is
    /// removed only when two rounds in a row did not find it, its directory is older than
    /// `gc_min_age`, and no container of it waits; nothing is removed when the runtime does
    /// not answer or answers with no pods at all (a wrong socket must not empty the share).
    async fn gc(&mut self) {
        self.rescan();
        let snapshot = match self.runtime.snapshot().await {
            Ok(s) if !s.is_empty() => s,
            Ok(_) => return,
            Err(e) => {
                self.stats.runtime_error(e.kind());
                return;
            }
        };
        let live_ids: HashSet<&str> = snapshot
            .values()
            .flat_map(|p| p.containers.iter().map(|c| c.id.as_str()))
            .collect();
        self.env_cache
            .retain(|id, _| live_ids.contains(id.as_str()));
        let pods = match self.share.pods() {
            Ok(p) => p,
            Err(e) => {
                self.stats.share_error();
                warn!(error = %e, "cannot list the share");
                return;
            }
        };
        let mut suspects = HashSet::new();
        for pod in pods {
            if snapshot.contains_key(pod.as_str()) || self.pending.contains_key(&pod) {
                continue;
            }
            if !self.gc_suspects.contains(&pod) {
                suspects.insert(pod);
                continue;
            }
            let old_enough = self
                .share
                .pod_mtime(&pod)
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age >= self.cfg.gc_min_age);
            if !old_enough {
                suspects.insert(pod);
                continue;
            }
            match self.share.remove_pod(&pod) {
                Ok(true) => {
                    self.watcher.forget(&self.share.pod_path(&pod));
                    self.warned.retain(|(p, _)| *p != pod);
                    info!(pod = %pod, "removed directory of a pod the runtime no longer has");
                }
                Ok(false) => {}
                Err(e) => {
                    self.stats.share_error();
                    warn!(pod = %pod, error = %e, "cannot remove pod directory");
                }
            }
        }
        self.gc_suspects = suspects;
    }
}

/// The pod's priority annotation: from the API server's copy when the view has the pod (the
/// pod's current annotations), else from the sandbox (those it was created with).
fn pod_priorities(
    rt: &RtPod,
    api: Option<&ApiPod>,
) -> Result<Option<PodPriorities>, PriorityError> {
    match api {
        Some(a) => {
            priority::from_annotations(a.annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        }
        None => {
            priority::from_annotations(rt.annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        }
    }
}

/// The newest attempt of each container name, by the decision's own rule.
fn newest_containers(containers: &[RtContainer]) -> Vec<&RtContainer> {
    decide::newest_by(containers, |c| (c.name.as_str(), c.attempt, c.created_at))
}

fn to_attempt(c: &RtContainer, priority: u8) -> Attempt {
    Attempt {
        name: c.name.clone(),
        attempt: c.attempt,
        created_at: c.created_at,
        state: c.state,
        priority,
    }
}

/// The next item of an optional channel; never, without one.
async fn recv_some<T>(rx: &mut Option<mpsc::UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(t: Option<Instant>) {
    if let Some(t) = t {
        tokio::time::sleep_until(t.into()).await;
    }
}
