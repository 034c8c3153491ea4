//! The node agent's decision loop: exit files in, `allow` answers out.
//!
//! One task owns all state (the waits in the share, the node view, confirmations), so nothing
//! is locked and every decision sees a consistent picture. The loop never waits on the
//! runtime: reads go through the reader task and come back as changes to the node view, and
//! a decision reads only the view.
//!
//! Parts:
//! - `decisions`: deciding the pending waits and carrying the answers out;
//! - `gc`: directories of pods that are gone removed, the share rescanned;
//! - `jobs`: a completing pod's state handed to the Job task;
//! - `warned`: what was logged once, bounded.

mod decisions;
mod gc;
mod jobs;
mod warned;

use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tracing::{debug, error, info, warn, Instrument};

use crate::cluster::podwatch::{PodSignal, PodView};
use crate::cluster::recorder::EventSink;
use crate::cluster::Cluster;
use crate::decide::bounds::Later as _;
use crate::decide::RunState;
use crate::handshake::share::{Place, PodUid, Share, ShareError};
use crate::handshake::waits::{ShareSync, Waits};
use crate::handshake::watch::{FsEvent, Root, ShareWatcher, WatchError};
use crate::runtime::source::{self, SourceKind, SourceSignal};
use crate::runtime::{Runtime, RuntimeError};
use crate::stats::{Kept, Stats};
use crate::view::reader::{self, Read, Reader, Reply};
use crate::view::{Change, Need, NodeView};
use warned::Warned;

pub use crate::config::{Config, DEFAULT_POLL_INTERVAL};
pub use crate::decide::facts::DEFAULT_GRACE;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Share(#[from] ShareError),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The share's root was removed under the agent and cannot be made again from here: in
    /// a pod it is a hostPath mount of the removed directory. Exiting lets the kubelet start
    /// the agent again with the directory mounted anew (DirectoryOrCreate makes it).
    #[error("the share {path} was removed under the agent; exiting so that it is mounted again")]
    ShareRootRemoved { path: std::path::PathBuf },
    #[error("install entrypoint from {path}: {source}")]
    Install {
        path: std::path::PathBuf,
        #[source]
        source: ShareError,
    },
}

pub struct Agent {
    cfg: Config,
    share: Arc<Share>,
    /// The kubelet's directory of pods, where pod-local exit directories are; `None` when
    /// the kubelet's root has none.
    local: Option<Arc<Share>>,
    watcher: ShareWatcher,
    fs_events: mpsc::UnboundedReceiver<FsEvent>,
    waits: Waits,
    view: NodeView,
    runtime: Runtime,
    reader: Reader,
    replies: mpsc::UnboundedReceiver<Reply>,
    reader_task: Option<reader::ReaderTask>,
    signals: mpsc::UnboundedReceiver<SourceSignal>,
    signal_tx: mpsc::UnboundedSender<SourceSignal>,
    /// The event stream in use, while it is connected; `None` means polling.
    live_source: Option<SourceKind>,
    /// Whether the runtime answered its last call.
    runtime_ok: bool,
    /// What was logged once.
    warned: Warned,
    gc_suspects: HashSet<PodUid>,
    /// The removal round in flight, if any.
    gc_round: Option<crate::agent::gc::Round>,
    stats: Arc<Stats>,
    /// The API server's view of this node's pods, when there is an API server.
    api: Option<PodView>,
    pod_signals: Option<mpsc::UnboundedReceiver<PodSignal>>,
    pod_events: Option<EventSink>,
    /// Finished Jobs' sidecar shutdown (with an API server only).
    jobs: Option<crate::jobs::JobLink>,
    jobs_task: Option<crate::jobs::JobsTask>,
    /// A listing was asked after a reconnect: its answer is logged, as the proof that what
    /// happened while the runtime or its stream was gone was caught up on.
    relist_pending: bool,
    connected_once: bool,
    /// What ends the run with an error (the share's root removed).
    fatal: Option<AgentError>,
    /// Containers' mounts waiting to be checked for breaches, and the check in flight.
    audit: crate::handshake::breach::Audit,
    /// Running containers' exits, awaited from the kernel.
    kernel: crate::runtime::kernel::KernelExits,
}

impl Agent {
    /// Opens the share, installs the entrypoint, starts watching and finds exit files already
    /// waiting (an agent restarted mid-drain must answer them).
    pub fn start(cfg: Config, stats: Arc<Stats>) -> Result<Self, AgentError> {
        let share = Share::open(&cfg.share_dir)?;
        if let Some(src) = &cfg.entrypoint_binary {
            install_entrypoint(&cfg.bin_dir, src, &stats)?;
        }
        if let Some(legacy) = crate::handshake::bindir::legacy_in_share(share.root()) {
            warn!(
                event = "legacy_bin",
                dir = %legacy.display(),
                bin_dir = %cfg.bin_dir.display(),
                "the share holds the entrypoint directory of an earlier exitorder; it is no longer written (pods injected before the upgrade may still run it): remove it once they are gone"
            );
        }
        let runtime = Runtime::connect(&cfg.cri_socket)?;
        let (reader, replies, reader_task) = reader::start(runtime.clone());
        let (tx, fs_events) = mpsc::unbounded_channel();
        let (signal_tx, signals) = mpsc::unbounded_channel();
        let local = open_local(&cfg.kubelet_root_dir);
        let roots = std::iter::once(&share)
            .chain(&local)
            .map(|s| Root {
                pods: s.pods_path(),
                container_depth: s.place().container_depth(),
            })
            .collect();
        let mut watcher = ShareWatcher::new(tx, roots)?;
        // Watch before scanning: a file created in between is then both scanned and reported.
        watcher.watch(&share.pods_path())?;
        if let Some(local) = &local {
            watcher.watch(&local.pods_path())?;
        }
        let tombstone_ttl = cfg.tombstone_ttl;
        let own_pod_uid = cfg.own_pod_uid.clone();
        let kernel = if cfg.kernel_exit_source {
            crate::runtime::kernel::KernelExits::new(signal_tx.clone(), stats.clone())
        } else {
            crate::runtime::kernel::KernelExits::off(stats.clone())
        };
        let mut agent = Agent {
            cfg,
            share: Arc::new(share),
            local: local.map(Arc::new),
            watcher,
            fs_events,
            waits: Waits::default(),
            view: NodeView::with_tombstone_ttl(tombstone_ttl),
            runtime,
            reader,
            replies,
            reader_task: Some(reader_task),
            signals,
            signal_tx,
            live_source: None,
            runtime_ok: true,
            warned: Warned::default(),
            gc_suspects: HashSet::new(),
            gc_round: None,
            stats,
            api: None,
            pod_signals: None,
            pod_events: None,
            jobs: None,
            jobs_task: None,
            relist_pending: false,
            connected_once: false,
            fatal: None,
            audit: crate::handshake::breach::Audit::new(own_pod_uid),
            kernel,
        };
        // Without an API server, Jobs complete from the webhook's record on their sandboxes.
        agent.start_jobs(None);
        let mut dirty = BTreeSet::new();
        agent.waits.starting = true;
        agent.sync().rescan(&mut dirty);
        agent.waits.starting = false;
        agent.report_kept();
        agent.stats.set_watching(true);
        agent.stats.set_event_source(SourceKind::Poll.as_str());
        Ok(agent)
    }

    /// Decides with the API server's view of the pods (deletion state, grace period,
    /// annotations) and posts Kubernetes Events about held exits.
    pub fn with_cluster(mut self, cluster: Cluster) -> Self {
        self.api = Some(cluster.view);
        self.pod_signals = Some(cluster.signals);
        self.start_jobs(Some(cluster.events.clone()));
        self.pod_events = Some(cluster.events);
        self
    }

    /// The Job task, posting Events through `events` when there is an API server; its
    /// predecessor, not run yet, is dropped.
    fn start_jobs(&mut self, events: Option<crate::cluster::recorder::EventSink>) {
        let (link, task) = crate::jobs::start(
            self.runtime.clone(),
            &self.cfg.share_dir,
            events,
            self.stats.clone(),
        );
        self.jobs = Some(link);
        self.jobs_task = Some(task);
    }

    /// [`job_check`](Self::job_check) of every pod the node view has.
    fn job_check_all(&mut self) {
        if self.jobs.is_none() {
            return;
        }
        let uids: Vec<String> = self.view.pods().map(|(uid, _)| uid.clone()).collect();
        for uid in uids {
            self.job_check(&uid);
        }
    }

    /// Drops what is kept about pods that are gone: what was logged once about them, the Jobs
    /// task's state and the API server's deleted pods.
    /// "Gone" is only believed of a listing of a runtime that answers.
    fn forget_gone_pods(&mut self) {
        let (view, pending) = (&self.view, &self.waits.pending);
        let live = |uid: &str| {
            view.pod(uid).is_some() || PodUid::parse(uid).is_ok_and(|p| pending.contains_key(&p))
        };
        self.warned.keep_pods(live);
        if view.is_listed() && self.runtime_ok {
            // The Jobs task's records on disk say what it needs again, should such a pod
            // come back.
            if let Some(jobs) = &self.jobs {
                jobs.keep_only(
                    view.pods()
                        .filter_map(|(uid, _)| PodUid::parse(uid).ok())
                        .collect(),
                );
            }
            if let Some(api) = &self.api {
                self.stats
                    .set_kept(Kept::ApiTombstones, api.keep_tombstones(live));
            }
        }
        self.report_kept();
    }

    /// Reports the sizes of what is kept per pod or container (at start-up and at each
    /// garbage collection; the node view's tombstones at each change too).
    fn report_kept(&self) {
        self.stats.set_kept(Kept::Warnings, self.warned.len());
        self.stats
            .set_kept(Kept::ExitHistory, self.waits.history_len());
        self.stats.set_kept(Kept::Watches, self.watcher.len());
        self.stats
            .set_kept(Kept::ViewTombstones, self.view.tombstones());
    }

    /// Where the exit directories of `place` are, when the agent serves it.
    fn place(&self, place: Place) -> Option<&Share> {
        match place {
            Place::Share => Some(&self.share),
            Place::PodLocal => self.local.as_deref(),
        }
    }

    pub fn pending_count(&self) -> usize {
        self.waits.count()
    }

    fn sync(&mut self) -> ShareSync<'_> {
        ShareSync {
            share: &self.share,
            local: self.local.as_deref(),
            watcher: &mut self.watcher,
            waits: &mut self.waits,
            stats: &self.stats,
        }
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
                self.runtime_ok = false;
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
        let reader_task = self
            .reader_task
            .take()
            .map(|t| tokio::spawn(t.run().instrument(tracing::info_span!("runtime_reader"))));
        let jobs_task = self
            .jobs_task
            .take()
            .map(|t| tokio::spawn(t.run().instrument(tracing::info_span!("jobs"))));
        let source_task = tokio::spawn(
            source::run(
                self.runtime.channel(),
                self.cfg.exit_source,
                version,
                self.signal_tx.clone(),
            )
            .instrument(tracing::info_span!("exit_source")),
        );
        self.reader.ask(Read::List);
        let all: BTreeSet<PodUid> = self.waits.pending.keys().cloned().collect();
        self.evaluate(all);

        tokio::pin!(shutdown);
        let start = tokio::time::Instant::now();
        let mut gc =
            tokio::time::interval_at(start.later(self.cfg.gc_interval), self.cfg.gc_interval);
        gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reconcile = tokio::time::interval_at(
            start.later(self.cfg.reconcile_interval),
            self.cfg.reconcile_interval,
        );
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let wake = self.next_wake();
            let mut dirty = BTreeSet::new();
            tokio::select! {
                () = &mut shutdown => break,
                ev = self.fs_events.recv() => {
                    let Some(ev) = ev else { break };
                    // Take everything already queued, so a burst costs one round, and a
                    // flood that overflows the kernel's queue again and again one rescan.
                    let mut rescan = false;
                    let mut next = Some(ev);
                    while let Some(ev) = next.take() {
                        match ev {
                            FsEvent::Rescan => rescan = true,
                            ev => self.sync().on_event(ev, &mut dirty),
                        }
                        next = self.fs_events.try_recv().ok();
                    }
                    if rescan {
                        self.sync().on_event(FsEvent::Rescan, &mut dirty);
                    }
                    self.check_share(&mut dirty);
                }
                Some(sig) = self.signals.recv() => {
                    self.on_signal(sig, &mut dirty);
                    while let Ok(sig) = self.signals.try_recv() {
                        self.on_signal(sig, &mut dirty);
                    }
                }
                Some(reply) = self.replies.recv() => {
                    self.on_reply(reply, &mut dirty);
                    while let Ok(reply) = self.replies.try_recv() {
                        self.on_reply(reply, &mut dirty);
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
                        self.api = None;
                    }
                },
                () = sleep_until(wake), if wake.is_some() => {
                    dirty.extend(self.waits.pending.keys().cloned());
                    if self.live_source.is_none() && !self.waits.pending.is_empty() {
                        // Polling: the decision comes with the listing's answer.
                        self.reader.ask(Read::List);
                    }
                }
                _ = reconcile.tick() => {
                    self.check_share(&mut dirty);
                    self.reader.ask(Read::List);
                }
                _ = gc.tick() => self.gc(),
                breaches = finished(&mut self.audit.round) => {
                    self.audit.round = None;
                    match breaches {
                        Ok(found) => {
                            for b in &found {
                                crate::handshake::breach::report(
                                    b,
                                    |uid| self.pod_ref(uid),
                                    self.pod_events.as_ref(),
                                    &self.stats,
                                );
                            }
                        }
                        Err(e) => warn!(error = %e, "a mount check round failed"),
                    }
                    self.audit.start(self.places());
                }
                report = finished(&mut self.gc_round) => {
                    self.gc_round = None;
                    match report {
                        Ok(report) => {
                            if !report.unfinished.is_empty() {
                                gc.reset_after(crate::agent::gc::AGAIN_AFTER);
                            }
                            self.gc_done(report);
                        }
                        Err(e) => warn!(error = %e, "a removal round failed"),
                    }
                }
            }
            for need in self.view.needs(Instant::now()) {
                self.reader.ask(Read::Need(need));
            }
            if !dirty.is_empty() {
                self.evaluate(dirty);
            }
            if self.fatal.is_some() {
                break;
            }
        }
        source_task.abort();
        if let Some(t) = reader_task {
            t.abort();
        }
        if let Some(t) = jobs_task {
            t.abort();
        }
        self.stats.set_watching(false);
        info!(pending = self.pending_count(), "agent stopped");
        match self.fatal.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Opens the share again when its directories were replaced under the agent (removed
    /// and created again by an operator or a node cleanup): the kubelet creates new pods'
    /// directories in the new one, which the old watches and handles never see. The
    /// entrypoint is installed again, as `bin/` went with it.
    fn check_share(&mut self, dirty: &mut BTreeSet<PodUid>) {
        if self.share.is_current() {
            return;
        }
        let share = match Share::open(&self.cfg.share_dir) {
            Ok(s) => s,
            Err(e) => {
                self.stats.share_error();
                self.stats.set_watching(false);
                if crate::handshake::share::is_removed(&self.cfg.share_dir) {
                    error!(event = "share_lost", error = %e, "the share's root was removed under the agent");
                    self.fatal = Some(AgentError::ShareRootRemoved {
                        path: self.cfg.share_dir.clone(),
                    });
                    return;
                }
                warn!(event = "share_lost", error = %e, "the share was replaced and cannot be opened again; trying on the next change or reconcile");
                return;
            }
        };
        self.watcher.forget(self.share.root());
        if let Err(e) = self.watcher.watch(&share.pods_path()) {
            self.stats.share_error();
            self.stats.set_watching(false);
            warn!(event = "share_lost", error = %e, "cannot watch the new share; trying on the next change or reconcile");
            return;
        }
        self.share = Arc::new(share);
        self.sync().rescan(dirty);
        dirty.extend(self.waits.pending.keys().cloned());
        self.stats.set_watching(true);
        warn!(
            event = "share_reopened",
            share = %self.cfg.share_dir.display(),
            pending = self.pending_count(),
            "the share was replaced under the agent; watching the new one"
        );
    }

    /// When the waits must be decided again without an event: the earliest deadline, settle
    /// time or coalesced churn; a failed read's retry; while polling, the poll interval.
    fn next_wake(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut wake = self.view.next_retry();
        if !self.waits.pending.is_empty() {
            if self.live_source.is_none() {
                let poll = now.later(self.cfg.poll_interval);
                wake = Some(wake.map_or(poll, |w| w.min(poll)));
            }
            for p in self.waits.pending.values() {
                if let Some(w) = p.wake {
                    wake = Some(wake.map_or(w, |x| x.min(w)));
                }
            }
        }
        wake
    }

    fn on_signal(&mut self, sig: SourceSignal, dirty: &mut BTreeSet<PodUid>) {
        match sig {
            SourceSignal::Change(change) => self.apply_change(change, dirty),
            SourceSignal::Connected(kind) => {
                info!(source = kind.as_str(), "exit source connected");
                self.live_source = Some(kind);
                self.stats.set_event_source(kind.as_str());
                // What happened while the stream was not there.
                self.reader.ask(Read::List);
                // The first connection is no reconnect: the start's own listing is not news.
                self.relist_pending |= self.connected_once;
                self.connected_once = true;
            }
            SourceSignal::Down(kind) => {
                if self.live_source.take().is_some() {
                    info!(
                        source = kind.as_str(),
                        "exit source down; polling while exits are pending"
                    );
                }
                self.stats.set_event_source(SourceKind::Poll.as_str());
                self.reader.ask(Read::List);
            }
        }
    }

    /// Gives the view container `id`'s pod cgroup, once the kernel source found it and the
    /// view knows the container (either may come first).
    fn learn_pod_cgroup(&mut self, id: &str) {
        if let Some(dir) = self.kernel.pod_dir(id) {
            self.view.set_pod_cgroup(id, dir.to_path_buf());
        }
    }

    fn on_reply(&mut self, reply: Reply, dirty: &mut BTreeSet<PodUid>) {
        match reply {
            Reply::Change(change) => self.apply_change(change, dirty),
            Reply::PodChecked(uid) => {
                if let Ok(pod) = PodUid::parse(&uid) {
                    if let Some(p) = self.waits.pending.get_mut(&pod) {
                        p.checking = false;
                        p.checked = true;
                        dirty.insert(pod);
                    }
                }
            }
            Reply::Failed { read, error } => {
                self.stats.runtime_error(error.kind());
                match &read {
                    Read::Need(Need::Describe(id)) => {
                        if self.warned.first_read(id) {
                            warn!(container_id = %id, error = %error, "cannot read container; its exit priority stays unknown and its pod's waits ordered, retrying");
                        }
                    }
                    Read::ListPod(uid) => {
                        // Asked again as the pod is decided again, now: while the runtime
                        // answers (a busy one timed out), nothing else may come to decide it.
                        if let Ok(pod) = PodUid::parse(uid) {
                            if let Some(p) = self.waits.pending.get_mut(&pod) {
                                p.checking = false;
                                dirty.insert(pod);
                            }
                        }
                        warn!(pod = %uid, error = %error, "cannot list pod");
                    }
                    Read::List => warn!(error = %error, "cannot list the runtime's containers"),
                    // The runtime's events still tell this container's exit.
                    Read::Pid(id) => {
                        debug!(container_id = %id, error = %error, "cannot read the container's process")
                    }
                    Read::Need(Need::Sandbox(uid)) => {
                        warn!(pod = %uid, error = %error, "cannot read the pod's sandbox; its waits stay ordered, retrying");
                    }
                }
            }
            Reply::Process { id, pid } => {
                self.kernel.watch(&id, pid);
                self.learn_pod_cgroup(&id);
            }
            Reply::Mounts(check) => {
                self.audit.push(check);
                self.audit.start(self.places());
            }
            Reply::Health(ok) => {
                if ok != self.runtime_ok {
                    if ok {
                        info!("runtime answers again");
                        self.reader.ask(Read::List);
                        self.relist_pending = true;
                    } else {
                        error!("runtime not answering; only deadlines release waits until it does");
                    }
                }
                self.runtime_ok = ok;
                self.stats.set_runtime_ok(ok);
                dirty.extend(self.waits.pending.keys().cloned());
            }
        }
    }

    /// Applies a change to the node view; the pending pods it touched are decided again.
    fn apply_change(&mut self, change: Change, dirty: &mut BTreeSet<PodUid>) {
        match &change {
            Change::Exited { id } | Change::Removed { id } | Change::ProcessGone { id, .. } => {
                self.kernel.forget(id)
            }
            // Described while only created, it had no process: read it now that it runs
            // (a container the view does not know yet is described with its process).
            Change::Started { id } if self.kernel.wants(id) && self.view.knows(id) => {
                self.reader.ask(Read::Pid(id.clone()));
            }
            _ => {}
        }
        // Described before it was started (no process yet), while its start event came
        // meanwhile: that event found it not known yet, so its process is read now.
        let pid_due = match &change {
            Change::Described { info, .. }
                if info.state == RunState::Created && self.kernel.wants(&info.id) =>
            {
                Some(info.id.clone())
            }
            _ => None,
        };
        let listing = matches!(change, Change::Listed(_));
        // Its process may have been awaited (and its pod's cgroup found) before the view
        // knew the container: the description brings the two together.
        let described = match &change {
            Change::Described { info, .. } => Some(info.id.clone()),
            _ => None,
        };
        let undescribed = self.view.undescribed();
        let touched = self.view.apply(change, Instant::now());
        if let Some(id) = described {
            self.learn_pod_cgroup(&id);
        }
        if let Some(id) = pid_due {
            if self.view.state_of(&id) == Some(RunState::Running) {
                self.reader.ask(Read::Pid(id));
            }
        }
        self.stats
            .set_view_size(self.view.container_count(), self.view.pod_count());
        self.stats
            .set_kept(Kept::ViewTombstones, self.view.tombstones());
        if listing {
            if std::mem::take(&mut self.relist_pending) {
                info!(
                    event = "relisted",
                    containers = self.view.container_count(),
                    pods = self.view.pod_count(),
                    pending = self.pending_count(),
                    "runtime listed again after a reconnect"
                );
            }
            self.runtime_ok = true;
            self.stats.set_runtime_ok(true);
            dirty.extend(self.waits.pending.keys().cloned());
            self.job_check_all();
            return;
        }
        for uid in &touched {
            self.job_check(uid);
        }
        for uid in touched {
            if let Ok(pod) = PodUid::parse(&uid) {
                if self.waits.pending.contains_key(&pod) {
                    dirty.insert(pod);
                }
            }
        }
        // A container read (or gone) may have been what any pending pod was held for: the
        // answer touches no pod when it was a sandbox, and those pods must be decided again.
        if self.view.undescribed() < undescribed {
            dirty.extend(self.waits.pending.keys().cloned());
        }
    }
}

impl Agent {
    /// The places of exit directories the agent serves.
    fn places(&self) -> Vec<Arc<Share>> {
        std::iter::once(self.share.clone())
            .chain(self.local.clone())
            .collect()
    }

    /// A pod's namespace and name, as its sandbox tells them.
    fn pod_ref(&self, uid: &str) -> Option<crate::cluster::recorder::PodRef> {
        let s = self.view.pod(uid)?.sandbox.as_ref()?;
        Some(crate::cluster::recorder::PodRef {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            uid: uid.to_owned(),
        })
    }
}

/// Installs the entrypoint after checking it can run in sidecar images: only a static
/// binary for this node's architecture does; anything else would fail in every preStop hook,
/// silently leaving pods unordered. It is refused, and the agent stays not ready.
fn install_entrypoint(
    bin_dir: &std::path::Path,
    src: &std::path::Path,
    stats: &Stats,
) -> Result<(), AgentError> {
    match crate::handshake::elf::check_static_executable(src) {
        Ok(()) => {
            let dst = crate::handshake::bindir::install(bin_dir, src).map_err(|source| {
                AgentError::Install {
                    path: src.to_owned(),
                    source,
                }
            })?;
            info!(from = %src.display(), to = %dst.display(), "entrypoint installed");
        }
        Err(e) => {
            let why = format!(
                "entrypoint {} refused: {e}; sidecar images need a static build: \
                 scripts/static entrypoint (`cargo rustc -p exitorder-entrypoint --release \
                 --bin exitorder-entrypoint -- -C target-feature=+crt-static -C \
                 panic=abort`), as the exitorder image has it, given with --entrypoint-binary",
                src.display()
            );
            error!(event = "entrypoint_refused", file = %src.display(), problem = %e, "{why}");
            stats.refuse_entrypoint(why);
        }
    }
    Ok(())
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

/// The end of a task in flight; never, when there is none.
async fn finished<T>(
    task: &mut Option<tokio::task::JoinHandle<T>>,
) -> Result<T, tokio::task::JoinError> {
    match task {
        Some(t) => t.await,
        None => std::future::pending().await,
    }
}

/// The kubelet's directory of pods under `root`, for pod-local handshakes. Without one (a
/// wrong `--kubelet-root-dir`, or a host that runs no kubelet) only the share is served,
/// and the log says why.
fn open_local(root: &std::path::Path) -> Option<Share> {
    match Share::open_kubelet(root) {
        Ok(s) => {
            info!(dir = %s.pods_path().display(), "serving pod-local exit directories");
            Some(s)
        }
        Err(e) => {
            warn!(error = %e, "pod-local exit directories are not served: the kubelet's directory of pods cannot be opened (set --kubelet-root-dir to the kubelet's --root-dir)");
            None
        }
    }
}
