//! The node agent's decision loop: exit files in, `allow` answers out.
//!
//! One task owns all state (the waits in the share, the node view, confirmations), so nothing
//! is locked and every decision sees a consistent picture. The loop never waits on the
//! runtime: reads go through the reader task and come back as changes to the node view, and
//! a decision reads only the view.
//!
//! Parts:
//! - `changes`: what the runtime tells the loop (events, the reader's replies) applied to
//!   the node view;
//! - `api`: the API server's pods, their changes, and the Events sink, when there is one;
//! - `decisions`: deciding the pending waits from the node view;
//! - `answers`: the answers carried out: `allow` written, logged, counted, told as Events;
//! - `endpoints`: the hold of a pod's apps for its endpoints, from its annotations and the
//!   follow of its EndpointSlices;
//! - `files`: a round of file changes, the pods polled past their budget, roots watched again;
//! - `farewell`: how the agent leaves the node: waits kept for the next agent on a restart,
//!   every wait let go on an uninstall;
//! - `why`: why each waiting container stops (the whole pod, or it alone), from the node's
//!   evidence and, as a hint, the kubelet's word;
//! - `hints`: the budget of reads of the kubelet's word, per attempt, pod and node;
//! - `gc`: directories of pods that are gone removed, the share rescanned;
//! - `jobs`: a completing pod's state handed to the Job task;
//! - `share`: the share and the kubelet's pod directories: opened, the entrypoint installed,
//!   opened again when replaced;
//! - `link`: the runtime's client, reader and exit source, and what is known of its health;
//! - `warned`: what was logged once, bounded.

mod answers;
mod api;
mod changes;
mod decisions;
mod endpoints;
mod farewell;
mod files;
mod gc;
mod hints;
mod jobs;
mod link;
mod share;
mod warned;
mod why;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn, Instrument};

use crate::cluster::Cluster;
use crate::decide::bounds::Later as _;
use crate::handshake::budget::PodBudgets;
use crate::handshake::fsqueue::FsQueue;
use crate::handshake::share::{Share, ShareError};
use crate::handshake::sync::ShareSync;
use crate::handshake::waits::Waits;
use crate::handshake::watch::{Root, ShareWatcher, WatchError};
use crate::pod::PodUid;
use crate::runtime::reader::Read;
use crate::runtime::source::{SourceKind, SourceSignal};
use crate::runtime::RuntimeError;
use crate::stats::{Kept, Stats};
use crate::view::{Change, NodeView};
use api::ApiLink;
use link::RuntimeLink;
use share::{install_entrypoint, open_local};
use warned::Warned;

pub use crate::cluster::owner::Farewell;

pub use crate::config::{Config, DEFAULT_POLL_INTERVAL};
pub use crate::kubelet::evidence::DEFAULT_WINDOW as EVIDENCE_WINDOW;
pub use crate::view::facts::DEFAULT_GRACE;

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

/// Signals, replies or API changes taken in one round besides the first.
const DRAIN_MAX: usize = 256;

pub struct Agent {
    cfg: Config,
    share: Arc<Share>,
    /// The kubelet's directory of pods, where pod-local exit directories are; `None` when
    /// the kubelet's root has none.
    local: Option<Arc<Share>>,
    watcher: ShareWatcher,
    /// What the watcher saw, coalesced per pod.
    fs: Arc<FsQueue>,
    /// What each pod's exit directories may still cost, and the pods polled for now.
    budgets: PodBudgets,
    waits: Waits,
    view: NodeView,
    link: RuntimeLink,
    /// What was logged once.
    warned: Warned,
    /// Directories of pods that are gone, and their removal.
    removals: gc::Removals,
    stats: Arc<Stats>,
    /// The API server, when there is one.
    api: ApiLink,
    /// Finished Jobs' sidecar shutdown, and its task until the loop runs it.
    jobs: crate::jobs::JobLink,
    jobs_task: Option<crate::jobs::JobsTask>,
    /// What ends the run with an error (the share's root removed).
    fatal: Option<AgentError>,
    /// Containers' mounts waiting to be checked for breaches, and the check in flight.
    audit: crate::handshake::breach::Audit,
    /// Running containers' exits, awaited from the kernel.
    kernel: crate::runtime::kernel::KernelExits,
    /// The budget of the kubelet's word (its Events), per attempt, pod and node.
    hints: hints::Hints,
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
        let link = RuntimeLink::connect(&cfg.cri_socket)?;
        let fs = Arc::new(FsQueue::default());
        let local = open_local(&cfg.kubelet_root_dir);
        let roots = std::iter::once(&share)
            .chain(&local)
            .map(|s| Root {
                pods: s.pods_path(),
                container_depth: s.place().container_depth(),
            })
            .collect();
        let mut watcher = ShareWatcher::new(fs.clone(), roots)?;
        stats.set_inotify_polling(watcher.polling().is_some());
        // Watch before scanning: a file created in between is then both scanned and reported.
        watcher.watch(&share.pods_path())?;
        if let Some(local) = &local {
            watcher.watch(&local.pods_path())?;
        }
        let tombstone_ttl = cfg.tombstone_ttl;
        let own_pod_uid = cfg.own_pod_uid.clone();
        let kernel = if cfg.kernel_exit_source {
            crate::runtime::kernel::KernelExits::awaited(stats.clone())
        } else {
            crate::runtime::kernel::KernelExits::off(stats.clone())
        };
        // Without an API server, Jobs complete from the webhook's record on their sandboxes.
        let (jobs, jobs_task) =
            crate::jobs::start(link.runtime.clone(), &cfg.share_dir, None, stats.clone());
        let mut agent = Agent {
            cfg,
            share: Arc::new(share),
            local: local.map(Arc::new),
            watcher,
            fs,
            budgets: PodBudgets::default(),
            waits: Waits::default(),
            view: NodeView::with_tombstone_ttl(tombstone_ttl),
            link,
            warned: Warned::default(),
            removals: gc::Removals::default(),
            hints: hints::Hints::new(Instant::now()),
            stats,
            api: ApiLink::default(),
            jobs,
            jobs_task: Some(jobs_task),
            fatal: None,
            audit: crate::handshake::breach::Audit::new(own_pod_uid),
            kernel,
        };
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
        // The Job task again, posting Events; its predecessor, not run yet, is dropped.
        let (jobs, task) = crate::jobs::start(
            self.link.runtime.clone(),
            &self.cfg.share_dir,
            Some(cluster.events.clone()),
            self.stats.clone(),
        );
        self.jobs = jobs;
        self.jobs_task = Some(task);
        self.api.attach(cluster);
        self
    }

    /// [`job_check`](Self::job_check) of every pod the node view has.
    fn job_check_all(&mut self) {
        let uids: Vec<PodUid> = self.view.pods().map(|(uid, _)| uid.clone()).collect();
        for uid in uids {
            self.job_check(&uid);
        }
    }

    /// Drops what is kept about pods that are gone: what was logged once about them, the Jobs
    /// task's state and the API server's deleted pods.
    /// "Gone" is only believed of a listing of a runtime that answers.
    fn forget_gone_pods(&mut self) {
        let (view, pending) = (&self.view, &self.waits.pending);
        let live = |uid: &PodUid| view.pod(uid).is_some() || pending.contains_key(uid);
        self.warned.keep_pods(live);
        if view.is_listed() && self.link.ok() {
            // The Jobs task's records on disk say what it needs again, should such a pod
            // come back.
            self.jobs
                .keep_only(view.pods().map(|(uid, _)| uid.clone()).collect());
            if let Some(api) = &self.api.pods {
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
        self.stats.set_inotify_watches(self.watcher.len());
        self.stats
            .set_kept(Kept::ViewTombstones, self.view.tombstones());
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
            stats: &*self.stats,
        }
    }

    /// Runs until `shutdown` completes. Pending waits are left in place for the next agent
    /// (or the entrypoint's own timeout): answering them on the way out would break the order.
    ///
    /// `shutdown` says how the agent leaves: at an uninstall every wait is let go and every
    /// directory served is marked left (see [`Farewell`]).
    pub async fn run(mut self, shutdown: impl Future<Output = Farewell>) -> Result<(), AgentError> {
        let version = self.link.hello(&self.stats).await;
        info!(
            share = %self.cfg.share_dir.display(),
            pending = self.pending_count(),
            watches = self.watcher.len(),
            "agent ready"
        );
        let link_tasks = self.link.spawn(self.cfg.exit_source, version);
        let jobs_task = self
            .jobs_task
            .take()
            .map(|t| tokio::spawn(t.run().instrument(tracing::info_span!("jobs"))));
        self.link.ask(Read::List);
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
        let mut poll = tokio::time::interval(crate::handshake::budget::POLL_EVERY);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The loop goes round at least this often, idle or not: `/healthz` tells a wedged one.
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let farewell = loop {
            self.stats.loop_beat(Instant::now());
            #[cfg(feature = "fault-hooks")]
            crate::faults::wedge_point();
            let mut more_files = false;
            let wake = self.next_wake();
            let mut dirty = BTreeSet::new();
            tokio::select! {
                // Shutdown first, file changes last: a flood of one pod's file events, served
                // a few pods per round, can neither hold the loop nor starve the runtime's
                // signals, the API server's or the timers.
                biased;
                farewell = &mut shutdown => break farewell,
                // The kernel's word on an exit, the earliest there is, wakes the loop itself.
                exits = self.kernel.exits() => {
                    for (id, at) in exits {
                        self.on_signal(
                            SourceSignal::Change(Change::ProcessGone { id, at }),
                            &mut dirty,
                        );
                    }
                }
                // What is queued already is taken with it (a burst costs one round), up to
                // a bound: the round ends, and shutdown is looked at, in any case.
                Some(sig) = self.link.signals.recv() => {
                    self.on_signal(sig, &mut dirty);
                    for _ in 0..DRAIN_MAX {
                        let Ok(sig) = self.link.signals.try_recv() else { break };
                        self.on_signal(sig, &mut dirty);
                    }
                }
                Some(reply) = self.link.replies.recv() => {
                    self.on_reply(reply, &mut dirty);
                    for _ in 0..DRAIN_MAX {
                        let Ok(reply) = self.link.replies.try_recv() else { break };
                        self.on_reply(reply, &mut dirty);
                    }
                }
                sig = self.api.next() => match sig {
                    Some(sig) => {
                        self.on_pod_signal(sig, &mut dirty);
                        for _ in 0..DRAIN_MAX {
                            let Some(sig) = self.api.queued() else { break };
                            self.on_pod_signal(sig, &mut dirty);
                        }
                    }
                    None => self.api.watch_ended(),
                },
                () = sleep_until(wake), if wake.is_some() => {
                    dirty.extend(self.waits.pending.keys().cloned());
                    if self.link.polling() && !self.waits.pending.is_empty() {
                        // Polling: the decision comes with the listing's answer.
                        self.link.ask(Read::List);
                    }
                }
                _ = reconcile.tick() => {
                    self.check_share(&mut dirty);
                    self.link.ask(Read::List);
                }
                _ = gc.tick() => self.gc(),
                _ = beat.tick() => {}
                _ = poll.tick(), if self.polling_files() => self.poll_held(&mut dirty),
                breaches = finished(&mut self.audit.round) => {
                    self.audit.round = None;
                    match breaches {
                        Ok(found) => {
                            for b in &found {
                                share::report_breach(
                                    b,
                                    |uid| self.pod_ref(uid),
                                    self.api.events.as_ref(),
                                    &self.stats,
                                );
                            }
                        }
                        Err(e) => warn!(error = %e, "a mount check round failed"),
                    }
                    self.audit.start(self.places());
                }
                report = finished(&mut self.removals.round) => {
                    self.removals.round = None;
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
                () = self.fs.ready() => {
                    if self.on_files(&mut dirty) {
                        // More pods' changes wait: decide what this round found, then let
                        // the runtime run others before the next round.
                        more_files = true;
                    }
                }
            }
            for need in self.view.needs(Instant::now()) {
                self.link.ask(Read::Need(need));
            }
            if !dirty.is_empty() {
                self.evaluate(dirty);
            }
            // Waits also end outside a decision (a directory gone, a pod dropped): their
            // pods' follows end with them.
            if !self.api.followed.is_empty() {
                let pending = &self.waits.pending;
                self.api.stop_following(|uid| pending.contains_key(uid));
            }
            if self.fatal.is_some() {
                break Farewell::Restart;
            }
            if more_files {
                tokio::task::yield_now().await;
            }
        };
        link_tasks.abort();
        if farewell == Farewell::Uninstall {
            self.leave_node();
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

    /// When the waits must be decided again without an event: the earliest deadline, settle
    /// time or coalesced churn; a failed read's retry; while polling, the poll interval.
    fn next_wake(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut wake = self.view.next_retry();
        if !self.waits.pending.is_empty() {
            if self.link.polling() {
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
