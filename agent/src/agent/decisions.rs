//! Deciding the pending waits from the node view: each pod's facts gathered, decided, and
//! the answers it gives handed to [`super::answers`].

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::agent::Agent;
use crate::cluster::podwatch::ApiPod;
use crate::cluster::PodSignal;
use crate::decide::bounds::{unix_of_instant, Later as _};
use crate::decide::stoporder::StopOrder;
use crate::decide::{self, Deletion, PodFacts, Reason, RunState, Verdict};
use crate::kubelet::grace;
use crate::kubelet::kills::{Kill, PodKill};
use crate::pod::PodUid;
use crate::runtime::reader::Read;
use crate::view::facts::{self, Clock};

/// How far behind the clock a file's timestamp may be (a kernel tick is 1 to 10 ms).
const FILE_CLOCK_SLACK: Duration = Duration::from_millis(50);

impl Agent {
    /// Decides for every waiting container of the `dirty` pods, from memory.
    pub(super) fn evaluate(&mut self, dirty: BTreeSet<PodUid>) {
        let now = Instant::now();
        for pod in dirty {
            if !self.waits.pending.contains_key(&pod) {
                continue;
            }
            let facts = self.facts(&pod);
            self.apply(&pod, facts, now);
        }
        self.stats.set_pending(self.waits.count());
    }

    /// The pod's sandbox, when the runtime described it with its names.
    fn sandbox(&self, pod: &PodUid) -> Option<&crate::view::SandboxInfo> {
        self.view
            .pod(pod)
            .and_then(|p| p.sandbox.as_ref())
            .filter(|sb| !sb.name.is_empty())
    }

    /// The pod's namespace and name: from its sandbox, else from the API server.
    pub(super) fn names(&self, pod: &PodUid) -> Option<(String, String)> {
        match self.sandbox(pod) {
            Some(sb) => Some((sb.namespace.clone(), sb.name.clone())),
            None => self
                .api
                .pods
                .as_ref()?
                .get_by_uid(pod)
                .map(|a| (a.namespace, a.name)),
        }
    }

    /// The API server's current view of a pending pod.
    pub(super) fn api_pod(&self, pod: &PodUid) -> Option<ApiPod> {
        let api = self.api.pods.as_ref()?;
        match self.sandbox(pod) {
            Some(sb) => api.get(&sb.namespace, &sb.name, pod),
            None => api.get_by_uid(pod),
        }
    }

    /// Settles a stopping pod's exits without the runtime where its cgroup shows every
    /// container it has started to be one the view knows (see [`crate::runtime::podcgroup`]): what a
    /// listing asked now would tell, in microseconds instead of a call that a node busy with
    /// a burst of deletions answers in seconds.
    fn settle_by_cgroup(&mut self, pod: &PodUid, stopping: Instant) {
        let Some(v) = self.view.pod(pod) else {
            return;
        };
        if v.listed_at.is_some_and(|at| at >= stopping) {
            return;
        }
        let Some(dir) = &v.cgroup_dir else {
            tracing::debug!(pod = %pod, "the pod's cgroup is not known (none of its processes awaited); a listing settles it");
            return;
        };
        let looked = Instant::now();
        let known = |id: &str| {
            v.containers.contains_key(id) || v.sandbox.as_ref().is_some_and(|s| s.id == id)
        };
        match crate::runtime::podcgroup::strangers(dir, known) {
            Some(false) => {
                self.view.settled(pod, looked);
                self.stats.settled_by_cgroup();
            }
            found => {
                tracing::debug!(pod = %pod, dir = %dir.display(), unreadable = found.is_none(), "the pod's cgroup does not settle it; a listing will")
            }
        }
    }

    /// The facts a decision takes; `None` when the runtime has no such pod (fail open).
    fn facts(&mut self, pod: &PodUid) -> Option<PodFacts> {
        let api = self.api_pod(pod);
        let now = Instant::now();
        // The API object says why (a deletion, a terminal phase, a passed deadline): no read
        // of the kubelet's word is needed.
        let api_kill = api
            .as_ref()
            .and_then(|a| a.pod_kill(unix_of_instant(now, now)));
        // A graceful node shutdown is every kill's while it lasts (its budget is the
        // shortest the kubelet gives); then what the API object says.
        let shutting_down = self.api.node().shutting_down;
        if shutting_down && !self.api.shutdown_applied {
            self.api.shutdown_applied = true;
            info!(event = "node_shutdown_applied", "the decisions take every kill for the node shutdown's from now on: no read of the kubelet's word is needed");
        }
        let node_kill = shutting_down.then_some(PodKill::NodeShutdown);
        let api_kill = node_kill.or(api_kill);
        if let (Some(kill), Some(p)) = (api_kill, self.waits.pending.get_mut(pod)) {
            let by = if node_kill.is_some() { "node" } else { "api" };
            p.confirm.pod_kill_is(kill, by);
        }
        let (deletion, clock) = self.deletion_and_clock(pod, api.as_ref(), api_kill)?;
        let p = self.waits.pending.get(pod)?;
        let (checking, checked) = (p.checking, p.checked);
        let stopping = p.first_seen;
        let latest_wait = p.waiting.values().map(|w| w.since).max();
        let waiting: Vec<String> = p.waiting.keys().map(|c| c.as_str().to_owned()).collect();
        let waiting: Vec<&str> = waiting.iter().map(String::as_str).collect();
        // Without the runtime, or before its first listing, nothing is known of container
        // states: only the deadline (or a confirmed "staying") releases.
        if !self.link.ok() || !self.view.is_listed() {
            return Some(facts::without_runtime(&waiting, deletion, &clock));
        }
        let known = self.view.pod(pod);
        let complete = known.is_some_and(|v| {
            waiting
                .iter()
                .all(|w| v.containers.values().any(|c| c.info.name == *w))
        });
        // A waiting container the view holds as exited: its exit file was made by an attempt
        // that runs (the kubelet runs a preStop only in a running container), which the view
        // may not know yet (a start whose event is late, or none while polling). The runtime
        // is asked before such a wait fails open.
        let stale = known.is_some_and(|v| {
            let newest = facts::newest(v);
            waiting.iter().any(|w| {
                newest
                    .get(w)
                    .is_some_and(|c| c.info.state == RunState::Exited)
            }) && v
                .listed_at
                .is_none_or(|at| latest_wait.is_some_and(|t| at < t))
        });
        if !complete || stale {
            // A pod (or a container) the view does not know yet: read it once, off the
            // decision path, and decide with its answer. Only a runtime that, asked, does
            // not know the pod makes the wait fail open.
            if checked {
                // Asked: the runtime does not have the pod (fail open), or has it without the
                // waiting container (the decision fails that one open).
                known?;
            } else {
                if !checking {
                    self.link.ask(Read::ListPod(pod.clone()));
                    if let Some(p) = self.waits.pending.get_mut(pod) {
                        p.checking = true;
                    }
                }
                return Some(facts::without_runtime(&waiting, deletion, &clock));
            }
        }
        self.settle_by_cgroup(pod, stopping);
        let v = self.view.pod(pod)?;
        let api_annotations = api.as_ref().map(|a| &a.annotations);
        let named = facts::pod_priorities(v, api_annotations);
        let endpoints_policy = facts::endpoints_policy(v, api_annotations);
        let stop_order = facts::stop_order(v, api.as_ref().map(|a| &a.native_sidecars[..]));
        let mut ordered = facts::order(
            v,
            named,
            stop_order.as_ref().unwrap_or(&StopOrder::default()),
        );
        let unsettled = facts::unsettled_exits(v, stopping, &waiting);
        // A running container the kernel does not watch will tell its exit through the
        // runtime, which cannot tell whether a newer attempt runs: the listing that settles
        // it is asked now, so it has answered by the time that exit comes.
        let ask_early = ordered.malformed.is_none()
            && v.listed_at.is_none_or(|at| at < stopping)
            && facts::newest(v).values().any(|c| {
                c.info.state != RunState::Exited
                    && !waiting.contains(&c.info.name.as_str())
                    && !self.kernel.watches(&c.info.id)
            });
        if api_annotations.is_none() && v.sandbox.is_none() && ordered.malformed.is_none() {
            // The pod's annotations (its sandbox) are being read: any priority may change.
            ordered.unknown.push("the pod's annotations".to_owned());
        }
        if let Some(e) = &ordered.malformed {
            let e = e.clone();
            self.warn_once(pod, &e, "bad exit priority; pod treated as unordered");
        }
        let stop_order = stop_order.unwrap_or_else(|e| {
            self.warn_once(
                pod,
                &e,
                "bad native sidecar list; the kubelet's stop order is not known",
            );
            StopOrder::default()
        });
        // An exit file's time comes from its timestamp, which the kernel takes from a coarse
        // clock (up to a tick behind): a container seen just after it may have started just
        // before it.
        let maybe_ours =
            latest_wait.is_some_and(|t| self.view.undescribed_seen_by(t.later(FILE_CLOCK_SLACK)));
        if maybe_ours && ordered.malformed.is_none() {
            // A container that started before this pod's exit file is being read: it may be
            // this pod's. One that started later cannot be (see `undescribed_seen_by`).
            ordered.unknown.push("a container being read".to_owned());
        }
        if !unsettled.is_empty() && ordered.malformed.is_none() {
            facts::hold_unsettled(&mut ordered, &unsettled);
        }
        if (!unsettled.is_empty() || ask_early) && !checking {
            self.link.ask(Read::ListPod(pod.clone()));
            if let Some(p) = self.waits.pending.get_mut(pod) {
                p.checking = true;
            }
        }
        // Only an app's wait is held for the endpoints: a pod's sidecars asking alone cost no
        // read of its slices.
        let app_waits = ordered
            .attempts
            .iter()
            .any(|a| a.priority == 0 && waiting.contains(&a.name.as_str()));
        let endpoints = if app_waits {
            self.endpoints_gate(pod, endpoints_policy, api.as_ref())
        } else {
            None
        };
        let mut facts = facts::assemble(ordered, deletion, &clock, stop_order);
        facts.endpoints = endpoints;
        self.explain_stop_order(pod, &facts, &waiting);
        let next = self.judge(pod, &mut facts, now);
        if let Some(p) = self.waits.pending.get_mut(pod) {
            p.confirm.next = next;
        }
        Some(facts)
    }

    /// Whether the pod is going away, and its grace clock: the grace period (the deletion's
    /// own when the API server gave one, else the kubelet's container annotation) counted
    /// from the pod's first exit file. The kubelet starts its grace clock when it starts
    /// killing the pod, which is when it runs the preStop hooks, not at the API server's
    /// deletionTimestamp: a kubelet that sees the deletion late (a node back from NotReady)
    /// still gives the full grace period.
    fn deletion_and_clock(
        &self,
        pod: &PodUid,
        api: Option<&ApiPod>,
        api_kill: Option<PodKill>,
    ) -> Option<(Deletion, Clock)> {
        let p = self.waits.pending.get(pod)?;
        // What the Node and the API object say now wins over what was recognised before (a
        // deletion's grace over an eviction's).
        let pod_kill = api_kill.or(p.confirm.pod_kill);
        let deletion = match pod_kill {
            // Nothing shows the pod going away, which alone proves nothing (the kubelet keeps
            // a pod `Running` through its own kills): each wait is judged from the node's
            // evidence (`why`), and only a container shown stopped alone is let go early.
            None => Deletion::NotDeleting {
                settle: self.cfg.api_settle,
                restarting: std::collections::BTreeMap::new(),
            },
            Some(_) => Deletion::Deleting,
        };
        let mut first_seen = p.first_seen;
        if p.found_at_start {
            // An agent (re)started mid-drain did not see when the file appeared. The API
            // server's record of when the deletion was asked is the earliest the kubelet can
            // have started: the wait is dated no later, so a restart never holds a sidecar
            // past the pod's grace period.
            let asked = api
                .and_then(|a| a.deletion_requested)
                .and_then(|s| crate::decide::bounds::instant_of_unix(s, Instant::now()));
            if let Some(at) = asked {
                first_seen = first_seen.min(at);
            }
        }
        if let Some(rerun) = p.rerun_at {
            // The kubelet started the kill over (a shortened grace period, a retried kill):
            // the whole grace period again, from then.
            first_seen = first_seen.max(rerun);
        }
        let clock = Clock {
            first_seen,
            api_grace: grace::of_kill(
                pod_kill.map(Kill::Pod),
                grace::PodGrace {
                    own: api.and_then(ApiPod::grace),
                    priority: api.and_then(|a| a.priority),
                },
                api.and_then(|a| a.deletion_grace),
                &self.cfg.kubelet,
                self.api.node().kubelet,
            ),
            runtime_grace: self.view.pod(pod).and_then(|v| v.grace()),
            reserve: self.cfg.grace_reserve,
        };
        Some((deletion, clock))
    }

    pub(super) fn warn_once(&mut self, pod: &PodUid, e: &dyn std::error::Error, consequence: &str) {
        if self.warned.first(pod, e.to_string()) {
            warn!(pod = %pod, error = %e, "{consequence}");
        }
    }

    /// Says, once per wait, which lower-priority containers a wait does not wait for because
    /// the kubelet stops them only after it (native sidecars): priorities asked for a wait
    /// that would hold the pod to its deadline.
    fn explain_stop_order(&mut self, pod: &PodUid, facts: &PodFacts, waiting: &[&str]) {
        if facts.stop_order.native().is_empty() {
            // Most pods: nothing to explain, and nothing to compute on the decision path.
            return;
        }
        for w in waiting {
            let skipped = decide::beyond_stop_order(facts, w);
            if skipped.is_empty() {
                continue;
            }
            let key = format!("stop order: {w} <- {}", skipped.join(","));
            if self.warned.first(pod, key) {
                warn!(
                    event = "stop_order",
                    pod = %pod,
                    container = %w,
                    not_waiting_for = %skipped.join(","),
                    "the kubelet stops these native sidecars only after this container: it does not wait for them, although its exit priority is higher"
                );
            }
        }
    }

    pub(super) fn on_pod_signal(&mut self, sig: PodSignal, dirty: &mut BTreeSet<PodUid>) {
        match sig {
            PodSignal::Changed(pod) => {
                self.job_check(&pod);
                if self.waits.pending.contains_key(&pod) {
                    dirty.insert(pod);
                }
            }
            PodSignal::Resync => {
                self.job_check_all();
                dirty.extend(self.waits.pending.keys().cloned());
            }
            PodSignal::Node => dirty.extend(self.waits.pending.keys().cloned()),
            PodSignal::Endpoints { uid, withdrawal } => {
                if self.api.endpoints_told(&uid, withdrawal) {
                    debug!(event = "endpoints", pod = %uid, withdrawal = ?withdrawal, "the pod's endpoints");
                    dirty.insert(uid);
                }
            }
            PodSignal::Confirmed {
                uid: pod,
                asked_at,
                word,
            } => {
                if self.on_word(&pod, asked_at, word) {
                    dirty.insert(pod);
                }
            }
        }
    }

    fn apply(&mut self, pod: &PodUid, facts: Option<PodFacts>, now: Instant) {
        let names = self.names(pod);
        let Some(p) = self.waits.pending.get_mut(pod) else {
            return;
        };
        let staying = facts
            .as_ref()
            .is_some_and(|f| matches!(f.deletion, Deletion::NotDeleting { .. }));
        let mut wake: Option<Instant> = p.confirm.next;
        let mut allowed = Vec::new();
        for (name, waiter) in p.waiting.iter_mut() {
            match decide::decide(facts.as_ref(), name.as_str(), waiter.since, now) {
                Verdict::Allow(_) if waiter.retry_at.is_some_and(|t| now < t) => {
                    wake = [wake, waiter.retry_at].into_iter().flatten().min();
                }
                Verdict::Allow(reason) => {
                    allowed.push((name.clone(), reason, waiter.held_for.is_some()))
                }
                Verdict::Wait { blocked_by, until } => {
                    wake = [wake, until].into_iter().flatten().min();
                    // Being judged, or not judged yet (the view still reading the pod): a
                    // restart's short pause is not a hold worth telling.
                    let young = now < waiter.since.later(self.cfg.evidence.window);
                    if staying
                        && (p.confirm.judging.contains(name.as_str())
                            || (young && !p.confirm.judged))
                    {
                        // Not known yet whether the kubelet stops this container alone: a
                        // restart's short pause is not a hold worth telling.
                    } else if waiter.held_for.is_none() {
                        info!(event = "held", pod = %pod, container = %name, waiting_for = ?blocked_by, "exit held");
                        waiter.held_for = Some(blocked_by);
                    } else if waiter.held_for.as_ref() != Some(&blocked_by) {
                        debug!(event = "still_held", pod = %pod, container = %name, waiting_for = ?blocked_by, "exit still held");
                        waiter.held_for = Some(blocked_by);
                    }
                }
            }
        }
        p.wake = wake;
        for (container, reason, held) in allowed {
            // A deadline allow always tells; any other only when the exit was held.
            let still_running = match (&facts, reason) {
                (Some(f), Reason::Deadline) => decide::still_running(f, container.as_str())
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .collect(),
                _ => Vec::new(),
            };
            let Some(key) = self
                .waits
                .pending
                .get(pod)
                .and_then(|p| p.waiting.get(&container))
                .map(|w| w.key(pod, &container))
            else {
                continue;
            };
            // A deadline, and an app held for the settle time alone (no word of its
            // endpoints: the kubelet's own kill, no API server), always tell.
            let told = held || matches!(reason, Reason::Deadline | Reason::Settled);
            let tell = told.then_some(still_running);
            self.allow(&key, reason, tell, names.clone());
        }
    }
}
