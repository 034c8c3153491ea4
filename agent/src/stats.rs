//! Counters the agent keeps about its own work, shared with whatever reports them (logs,
//! metrics, tests). Plain atomics: the decision loop must never wait on a reader.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::decide::Reason;
use crate::handshake::share::Rejection;
use crate::kubelet::kills::Kill;

/// Upper bounds (seconds) of the allow latency histogram: from the exit file appearing to
/// `allow` written. Waits run from microseconds (nothing to wait for) to the grace period.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0,
];

/// Each observation lands in one bucket, the first whose bound it is within (above every
/// bound, in the count only): one increment on the decision loop, the cumulative view is the
/// encoder's to make.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some((bucket, _)) = self
            .buckets
            .iter()
            .zip(LATENCY_BUCKETS)
            .find(|(_, le)| secs <= *le)
        {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Each bucket's own count (not cumulative), the total count and the sum in seconds.
    pub fn read(&self) -> (Vec<u64>, u64, f64) {
        let b = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        (b, self.count.load(Ordering::Relaxed), sum)
    }
}

/// What the pod watch can be: off (runtime-only mode), syncing (first list), up, down.
pub const API_WATCH_STATES: [&str; 4] = ["off", "syncing", "up", "down"];

#[derive(Default)]
pub struct Stats {
    allows: [AtomicU64; Reason::ALL.len()],
    latency: [Histogram; Reason::ALL.len()],
    pending: AtomicU64,
    runtime_errors: Mutex<BTreeMap<&'static str, u64>>,
    share_errors: AtomicU64,
    share_breaches: AtomicU64,
    kernel_source: std::sync::atomic::AtomicBool,
    kernel_watches: AtomicU64,
    kernel_exits: AtomicU64,
    settled_by_cgroup: AtomicU64,
    event_source: Mutex<&'static str>,
    watching: AtomicBool,
    runtime_ok: AtomicBool,
    api_errors: Mutex<BTreeMap<&'static str, u64>>,
    api_reads: Mutex<BTreeMap<&'static str, u64>>,
    allows_by_kill: [AtomicU64; Kill::ALL.len()],
    api_watch: Mutex<&'static str>,
    pod_events: Mutex<BTreeMap<&'static str, u64>>,
    /// Why the entrypoint given could not be installed: the agent then stays not ready.
    entrypoint_refused: Mutex<Option<String>>,
    share_rejected: [AtomicU64; Rejection::ALL.len()],
    exit_churn: AtomicU64,
    waits_withdrawn: AtomicU64,
    view_containers: AtomicU64,
    view_pods: AtomicU64,
    /// The HTTP endpoint's connections.
    pub http: std::sync::Arc<ConnStats>,
    /// Completing pods the Jobs task keeps state for.
    job_pods: AtomicU64,
    job_restarts_in_place: AtomicU64,
    kept: [AtomicU64; Kept::ALL.len()],
    inotify_watches: AtomicU64,
    inotify_polling: AtomicBool,
    pods_polled: AtomicU64,
    pod_budget_spent: [AtomicU64; 2],
    /// When the decision loop last went round (ms since [`Stats::epoch`]; 0: not yet).
    loop_beat_ms: AtomicU64,
    epoch: std::sync::OnceLock<std::time::Instant>,
}

/// What the agent keeps per pod or container besides the node view's pods and containers and
/// the pending waits: each goes with its pod, or with time, and each has a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Removed containers' ids, so that late events do not bring them back.
    ViewTombstones,
    /// Pods the API server deleted, kept while their containers may still be stopping.
    ApiTombstones,
    /// What was logged once per pod or container, so it is not logged again.
    Warnings,
    /// When each exit file last appeared, to coalesce one that keeps coming back.
    ExitHistory,
    /// Directories watched for exit files (the places' roots, pods' and containers').
    Watches,
}

impl Kept {
    pub const ALL: [Kept; 5] = [
        Kept::ViewTombstones,
        Kept::ApiTombstones,
        Kept::Warnings,
        Kept::ExitHistory,
        Kept::Watches,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kept::ViewTombstones => "view_tombstones",
            Kept::ApiTombstones => "api_tombstones",
            Kept::Warnings => "warnings",
            Kept::ExitHistory => "exit_history",
            Kept::Watches => "watches",
        }
    }
}

fn bump(counts: &Mutex<BTreeMap<&'static str, u64>>, key: &'static str) {
    if let Ok(mut m) = counts.lock() {
        let n = m.entry(key).or_default();
        *n = n.saturating_add(1);
    }
}

fn read_counts(counts: &Mutex<BTreeMap<&'static str, u64>>) -> BTreeMap<&'static str, u64> {
    counts.lock().map(|m| m.clone()).unwrap_or_default()
}

/// The entry of `key` in a table laid out as `all`. The table and `all` have the same length
/// by their types, so the position is always in range.
#[allow(clippy::indexing_slicing)]
fn slot<'a, K: PartialEq + Copy, T, const N: usize>(
    table: &'a [T; N],
    all: &[K; N],
    key: K,
) -> &'a T {
    &table[all.iter().position(|x| *x == key).unwrap_or(0)]
}

impl Stats {
    pub fn set_job_pods(&self, n: usize) {
        self.job_pods
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn job_pods(&self) -> u64 {
        self.job_pods.load(Ordering::Relaxed)
    }

    /// A completing pod's containers all restart in place (KEP-5532): not the Job's end.
    pub fn job_restarted_in_place(&self) {
        self.job_restarts_in_place.fetch_add(1, Ordering::Relaxed);
    }

    pub fn job_restarts_in_place(&self) -> u64 {
        self.job_restarts_in_place.load(Ordering::Relaxed)
    }

    pub fn set_kept(&self, what: Kept, n: usize) {
        slot(&self.kept, &Kept::ALL, what)
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn kept(&self, what: Kept) -> u64 {
        slot(&self.kept, &Kept::ALL, what).load(Ordering::Relaxed)
    }

    pub fn allowed(&self, reason: Reason, waited: Duration) {
        slot(&self.allows, &Reason::ALL, reason).fetch_add(1, Ordering::Relaxed);
        slot(&self.latency, &Reason::ALL, reason).observe(waited);
    }

    pub fn allows(&self, reason: Reason) -> u64 {
        slot(&self.allows, &Reason::ALL, reason).load(Ordering::Relaxed)
    }

    pub fn latency(&self, reason: Reason) -> &Histogram {
        slot(&self.latency, &Reason::ALL, reason)
    }

    pub fn set_pending(&self, n: usize) {
        self.pending.store(n as u64, Ordering::Relaxed);
    }

    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// Counts a failed call. Readiness follows the runtime's health as the reader judges it
    /// ([`Stats::set_runtime_ok`]): one call that failed or took too long on a busy node is
    /// not the runtime gone.
    pub fn runtime_error(&self, kind: &'static str) {
        bump(&self.runtime_errors, kind);
    }

    pub fn runtime_errors(&self) -> BTreeMap<&'static str, u64> {
        read_counts(&self.runtime_errors)
    }

    pub fn api_error(&self, kind: &'static str) {
        bump(&self.api_errors, kind);
    }

    pub fn api_errors(&self) -> BTreeMap<&'static str, u64> {
        read_counts(&self.api_errors)
    }

    /// One read of the API server on a decision's behalf (not the pod watch), by what it read.
    pub fn api_read(&self, kind: &'static str) {
        bump(&self.api_reads, kind);
    }

    /// A read of the kubelet's word that the budget did not allow (see `agent::hints`):
    /// counted as an API error of kind `events_budget`, the wait staying ordered.
    pub fn api_read_skipped(&self) {
        bump(&self.api_errors, "events_budget");
    }

    pub fn api_reads(&self) -> BTreeMap<&'static str, u64> {
        read_counts(&self.api_reads)
    }

    /// An exit allowed during a kill of kind `kill`, as the agent recognised it.
    pub fn allowed_in(&self, kill: Kill) {
        slot(&self.allows_by_kill, &Kill::ALL, kill).fetch_add(1, Ordering::Relaxed);
    }

    pub fn allows_in(&self, kill: Kill) -> u64 {
        slot(&self.allows_by_kill, &Kill::ALL, kill).load(Ordering::Relaxed)
    }

    /// State of the pod watch, one of [`API_WATCH_STATES`].
    pub fn set_api_watch(&self, state: &'static str) {
        if let Ok(mut s) = self.api_watch.lock() {
            *s = state;
        }
    }

    pub fn api_watch(&self) -> &'static str {
        match self.api_watch.lock().map(|s| *s) {
            Ok("") | Err(_) => "off",
            Ok(s) => s,
        }
    }

    /// A Kubernetes Event about a pod: "posted", "failed" or "dropped" (queue full).
    pub fn pod_event(&self, outcome: &'static str) {
        bump(&self.pod_events, outcome);
    }

    pub fn pod_events(&self) -> BTreeMap<&'static str, u64> {
        read_counts(&self.pod_events)
    }

    pub fn share_error(&self) {
        self.share_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_kernel_source(&self, available: bool) {
        self.kernel_source.store(available, Ordering::Relaxed);
    }

    pub fn kernel_source(&self) -> bool {
        self.kernel_source.load(Ordering::Relaxed)
    }

    pub fn set_kernel_watches(&self, n: usize) {
        self.kernel_watches
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn kernel_watches(&self) -> u64 {
        self.kernel_watches.load(Ordering::Relaxed)
    }

    pub fn kernel_exit(&self) {
        self.kernel_exits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn kernel_exits(&self) -> u64 {
        self.kernel_exits.load(Ordering::Relaxed)
    }

    /// A pod's exits settled by a look at its cgroup, with no listing.
    pub fn settled_by_cgroup(&self) {
        self.settled_by_cgroup.fetch_add(1, Ordering::Relaxed);
    }

    pub fn settlements_by_cgroup(&self) -> u64 {
        self.settled_by_cgroup.load(Ordering::Relaxed)
    }

    fn epoch(&self) -> std::time::Instant {
        *self.epoch.get_or_init(std::time::Instant::now)
    }

    /// The decision loop goes round at `now`.
    pub fn loop_beat(&self, now: std::time::Instant) {
        let ms = now.saturating_duration_since(self.epoch()).as_millis();
        // 1 ms at least: 0 says "not yet".
        let ms = u64::try_from(ms).unwrap_or(u64::MAX).max(1);
        self.loop_beat_ms.store(ms, Ordering::Relaxed);
    }

    /// How long the decision loop has not gone round at `now`; `None` before its first round.
    pub fn loop_silent(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        let ms = self.loop_beat_ms.load(Ordering::Relaxed);
        if ms == 0 {
            return None;
        }
        let since = now.saturating_duration_since(self.epoch());
        Some(since.saturating_sub(std::time::Duration::from_millis(ms)))
    }

    /// The inotify watches the agent holds.
    pub fn set_inotify_watches(&self, n: usize) {
        self.inotify_watches.store(n as u64, Ordering::Relaxed);
    }

    pub fn inotify_watches(&self) -> u64 {
        self.inotify_watches.load(Ordering::Relaxed)
    }

    /// Whether exit directories are polled for want of an inotify instance.
    pub fn set_inotify_polling(&self, on: bool) {
        self.inotify_polling.store(on, Ordering::Relaxed);
    }

    pub fn inotify_polling(&self) -> bool {
        self.inotify_polling.load(Ordering::Relaxed)
    }

    /// Pods polled for having spent their budget of file events or watches.
    pub fn set_pods_polled(&self, n: usize) {
        self.pods_polled.store(n as u64, Ordering::Relaxed);
    }

    pub fn pods_polled(&self) -> u64 {
        self.pods_polled.load(Ordering::Relaxed)
    }

    /// A pod spent its budget (`events` or `watches`).
    pub fn pod_budget_spent(&self, what: crate::handshake::budget::Spent) {
        if let Some(n) = self.pod_budget_spent.get(what as usize) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn pod_budgets_spent(&self) -> [(&'static str, u64); 2] {
        use crate::handshake::budget::Spent;
        [Spent::Events, Spent::Watches].map(|s| {
            (
                s.as_str(),
                self.pod_budget_spent
                    .get(s as usize)
                    .map_or(0, |n| n.load(Ordering::Relaxed)),
            )
        })
    }

    pub fn share_breach(&self) {
        self.share_breaches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn share_breaches(&self) -> u64 {
        self.share_breaches.load(Ordering::Relaxed)
    }

    pub fn share_errors(&self) -> u64 {
        self.share_errors.load(Ordering::Relaxed)
    }

    pub fn set_event_source(&self, name: &'static str) {
        if let Ok(mut s) = self.event_source.lock() {
            *s = name;
        }
    }

    /// The exit-detection source in use ("" before the first decision about it).
    pub fn event_source(&self) -> &'static str {
        self.event_source.lock().map(|s| *s).unwrap_or("")
    }

    pub fn set_watching(&self, on: bool) {
        self.watching.store(on, Ordering::Relaxed);
    }

    pub fn watching(&self) -> bool {
        self.watching.load(Ordering::Relaxed)
    }

    /// A share entry refused: a link, a name that is no pod UID or container name, a file
    /// that is not a regular file, unexpected content.
    pub fn share_rejected(&self, why: Rejection) {
        slot(&self.share_rejected, &Rejection::ALL, why).fetch_add(1, Ordering::Relaxed);
    }

    pub fn share_rejections(&self, why: Rejection) -> u64 {
        slot(&self.share_rejected, &Rejection::ALL, why).load(Ordering::Relaxed)
    }

    /// How many containers and pods the node view holds.
    pub fn set_view_size(&self, containers: usize, pods: usize) {
        self.view_containers
            .store(containers as u64, Ordering::Relaxed);
        self.view_pods.store(pods as u64, Ordering::Relaxed);
    }

    pub fn view_size(&self) -> (u64, u64) {
        (
            self.view_containers.load(Ordering::Relaxed),
            self.view_pods.load(Ordering::Relaxed),
        )
    }

    /// A wait that came back within the churn window (its decision was coalesced).
    pub fn exit_churn(&self) {
        self.exit_churn.fetch_add(1, Ordering::Relaxed);
    }

    pub fn exit_churns(&self) -> u64 {
        self.exit_churn.load(Ordering::Relaxed)
    }

    /// A pending wait whose request went before the agent answered it: the entrypoint's own
    /// timeout, its presence wait, a signal, or the container gone.
    pub fn wait_withdrawn(&self) {
        self.waits_withdrawn.fetch_add(1, Ordering::Relaxed);
    }

    pub fn waits_withdrawn(&self) -> u64 {
        self.waits_withdrawn.load(Ordering::Relaxed)
    }

    /// The entrypoint given cannot serve sidecars; readiness says so until a restart.
    pub fn refuse_entrypoint(&self, why: String) {
        if let Ok(mut r) = self.entrypoint_refused.lock() {
            *r = Some(why);
        }
    }

    pub fn entrypoint_refused(&self) -> Option<String> {
        self.entrypoint_refused.lock().ok().and_then(|r| r.clone())
    }

    pub fn set_runtime_ok(&self, ok: bool) {
        self.runtime_ok.store(ok, Ordering::Relaxed);
    }

    pub fn runtime_ok(&self) -> bool {
        self.runtime_ok.load(Ordering::Relaxed)
    }
}

impl crate::handshake::ShareTally for Stats {
    fn share_error(&self) {
        Stats::share_error(self);
    }
    fn share_rejected(&self, why: Rejection) {
        Stats::share_rejected(self, why);
    }
    fn exit_churn(&self) {
        Stats::exit_churn(self);
    }
    fn wait_withdrawn(&self) {
        Stats::wait_withdrawn(self);
    }
    fn set_pending(&self, n: usize) {
        Stats::set_pending(self, n);
    }
}

/// What an HTTP server's accept loop counts (`serve`).
#[derive(Debug, Default)]
pub struct ConnStats {
    pub open: AtomicU64,
    pub evicted: AtomicU64,
}
