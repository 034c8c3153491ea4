//! Why a pending pod's containers stop: each wait judged from the node's own evidence (the
//! containers' marks, see [`crate::kubelet::evidence`]), and the kubelet's word (its Events)
//! asked for as a hint, within its budget (see [`super::hints`]), where the evidence has not
//! decided yet.

use std::collections::BTreeMap;
use std::time::Instant;

use tracing::{debug, info};

use crate::agent::{hints, Agent};
use crate::cluster::podevents::ConfirmRequest;
use crate::decide::bounds::{unix_of_instant, Later as _, WallClock};
use crate::decide::{self, Deletion, PodFacts, RunState};
use crate::kubelet::evidence::{self, Judgement, Peer};
use crate::kubelet::kills::{Kill, PodKill};
use crate::pod::PodUid;
use crate::runtime::kernel::KernelExits;
use crate::view::{ContainerEntry, Strain};

/// A silence judged while file events were still queued is judged again this soon after.
const UNREAD_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// A silence judged while an exec of a container the wait is held for was in progress is
/// judged again this soon after: a probe's exec ends in milliseconds, a hook's marks.
const EXEC_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// A silence judged while the pod watch was not current is judged again this soon after: the
/// watch says current again within a re-list, and a deletion it then shows decides.
const BEHIND_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

/// A wait the evidence has not decided, for which the kubelet's word may help.
struct Undecided {
    name: String,
    attempt: String,
    created_s: i64,
    since: Instant,
}

/// A wait whose containers' doubts are looked for (see [`doubts`]).
struct Held<'a> {
    /// The waiting container's newest attempt.
    me: &'a ContainerEntry,
    since: Instant,
    window: std::time::Duration,
    /// Its judgement is the others' silence: the counters are compared.
    silent: bool,
    now: Instant,
}

/// What the containers a wait is held for show of a hook that may be running, or have failed,
/// while its mark has not come.
#[derive(Default)]
struct Doubts {
    /// For good, which container and why: an exec of it failed since a window before the wait
    /// (a hook that failed before it marked; a failing exec probe too, which only costs a
    /// restart its early release), one added since then has run for longer than the window,
    /// or its limits held it back since (see [`crate::runtime::strain`]).
    doubt: Option<(String, &'static str)>,
    /// For now: an exec added since then is in progress (a hook the runtime or the
    /// container's CPU quota runs slowly; a probe ends in milliseconds).
    exec_running: bool,
    /// Counters first read now, with nothing to compare them with yet: the wait's baseline.
    bases: Vec<((String, String), Strain)>,
}

fn doubts<'a>(
    kernel: &KernelExits,
    strain_base: &BTreeMap<(String, String), Strain>,
    held: &Held<'_>,
    blocking: impl Iterator<Item = &'a ContainerEntry>,
) -> Doubts {
    let mut d = Doubts::default();
    let from = held.since.checked_sub(held.window).unwrap_or(held.since);
    for c in blocking {
        if c.execs.failed.is_some_and(|t| t >= from) {
            d.doubt.get_or_insert((c.info.name.clone(), "exec_failed"));
        }
        // An exec in progress for longer than the window is no probe: a hook stuck or slow
        // (or an exec that never started, whose end the runtime never tells).
        for (_, at) in c.execs.running.iter().filter(|(_, at)| *at >= from) {
            if held.now.saturating_duration_since(*at) >= held.window {
                d.doubt.get_or_insert((c.info.name.clone(), "exec_running"));
            } else {
                d.exec_running = true;
            }
        }
        // The counters are read when first needed, and when a silence is judged.
        let key = (held.me.info.id.clone(), c.info.id.clone());
        let base = strain_base.get(&key);
        if base.is_some() && !held.silent {
            continue;
        }
        let Some(now_strain) = kernel.strain(&c.info.id) else {
            continue;
        };
        match base {
            Some(base) => {
                if let Some(what) = now_strain.rose_since(base) {
                    d.doubt.get_or_insert((c.info.name.clone(), what));
                }
            }
            None => d.bases.push((key, now_strain)),
        }
    }
    d
}

impl Agent {
    /// Judges the waits of `pod`, which nothing else shows going away (`facts.deletion` is
    /// [`Deletion::NotDeleting`]): a pod kill the marks show makes the pod's deletion
    /// [`Deletion::Deleting`]; a container stopped alone is named in `restarting`. Returns when
    /// to judge again, if the marks may still come.
    pub(super) fn judge(
        &mut self,
        pod: &PodUid,
        facts: &mut PodFacts,
        now: Instant,
    ) -> Option<Instant> {
        if !matches!(facts.deletion, Deletion::NotDeleting { .. }) {
            return None;
        }
        let (Some(p), Some(v)) = (self.waits.pending.get(pod), self.view.pod(pod)) else {
            return None;
        };
        let clock = WallClock::at(now);
        let now_ns = clock.ns(now);
        let newest = crate::view::facts::newest(v);
        let marked: BTreeMap<&str, (i64, i64)> = self
            .waits
            .marks
            .of(pod)
            .map(|(c, m)| (c, (clock.ns(m.seen), clock.ns(m.made))))
            .collect();
        let mut peers: Vec<Peer> = newest
            .values()
            .map(|c| Peer {
                name: c.info.name.clone(),
                running: c.info.state != RunState::Exited,
                created_ns: c.info.created_at,
                marks: c.info.marks,
                marked_ns: marked.get(c.info.name.as_str()).map(|m| m.0),
                made_ns: marked.get(c.info.name.as_str()).map(|m| m.1),
                exited_ns: c.exit_seen.map(|t| clock.ns(t)),
            })
            .collect();
        // A container that marked and that the view does not hold (yet): its mark still says
        // it is being stopped now.
        for (name, (seen, made)) in &marked {
            if !newest.contains_key(name) {
                peers.push(Peer {
                    name: (*name).to_owned(),
                    running: false,
                    created_ns: i64::MAX,
                    marks: true,
                    marked_ns: Some(*seen),
                    made_ns: Some(*made),
                    exited_ns: None,
                });
            }
        }
        let rule = self.cfg.evidence;
        // The node's other pods' kills in progress: their marks, and their containers' exits
        // (which go on while the runtime's execs stall).
        let other_exit = self
            .view
            .pods()
            .filter(|(uid, _)| *uid != pod)
            .flat_map(|(_, e)| e.containers.values().filter_map(|c| c.exit_seen))
            .max();
        let node_marked = [self.waits.marks.latest_other(pod), other_exit]
            .into_iter()
            .flatten()
            .max();
        let node_marked_ns = node_marked.map(|t| clock.ns(t));
        // File events of this pod the loop has not read yet may hold a mark: the others'
        // silence is only silence once they were read (the loop reads them next). Another
        // pod's events, however many, hold nothing of this one's.
        let unread = self.fs.holds_pod(pod.as_str());
        // The pod watch not current (after a watch error, until its re-list): a deletion the
        // API server holds may be what the view does not show, and a deletion's exits are
        // never let go by silence. The marks of a pod kill still decide, and the kubelet's
        // word for the attempt; silence waits for the watch.
        let behind = self.api.pods.as_ref().is_some_and(|w| !w.is_current());
        let mut stopping = Vec::new();
        let mut alone = BTreeMap::new();
        let mut judging = Vec::new();
        let mut undecided = Vec::new();
        let mut held_behind = Vec::new();
        let mut word_only = Vec::new();
        let mut strain_base = Vec::new();
        let mut held_doubted = Vec::new();
        let mut deferred = Vec::new();
        let mut next: Option<Instant> = None;
        let undecided_of = |name: &str, since: Instant| {
            newest.get(name).map(|c| Undecided {
                name: name.to_owned(),
                attempt: c.info.id.clone(),
                created_s: c.info.created_at.div_euclid(1_000_000_000),
                since,
            })
        };
        for (name, w) in &p.waiting {
            let name = name.as_str();
            let blockers = decide::still_running(facts, name);
            if blockers.is_empty() {
                // Ordered at once, whatever the kill is.
                continue;
            }
            let kubelet_says = p
                .confirm
                .restarting
                .get(name)
                .filter(|(at, _)| *at >= w.since)
                .map(|(_, k)| *k);
            let waiter = evidence::Waiter {
                name,
                since_ns: clock.ns(w.since),
                blockers: &blockers,
                kubelet_says,
                node_marked_ns,
                saw_kill_end: newest
                    .get(name)
                    .is_some_and(|c| p.confirm.word_only.contains(&c.info.id)),
            };
            let judgement = evidence::judge(rule, &waiter, &peers, now_ns);
            let silent = judgement == Judgement::Alone(evidence::Alone::Silence);
            let blocking = blockers
                .iter()
                .filter_map(|b| newest.get(b.as_str()).copied());
            let Doubts {
                doubt,
                exec_running,
                bases,
            } = newest.get(name).map_or_else(Doubts::default, |me| {
                let held = Held {
                    me,
                    since: w.since,
                    window: rule.window,
                    silent,
                    now,
                };
                doubts(&self.kernel, &p.confirm.strain_base, &held, blocking)
            });
            let fresh = !bases.is_empty();
            strain_base.extend(bases);
            match judgement {
                Judgement::PodKill { stopping: s } => stopping.extend(s),
                Judgement::Alone(evidence::Alone::Silence) if unread => {
                    judging.push(name.to_owned());
                    next = [next, Some(now.later(UNREAD_RETRY))]
                        .into_iter()
                        .flatten()
                        .min();
                }
                Judgement::Alone(evidence::Alone::Silence) if behind => {
                    if !p.confirm.behind.contains(name) {
                        info!(event = "silence_held", pod = %pod, container = %name, "the pod watch is not current: the others' silence does not let this wait go until it is");
                    }
                    held_behind.push(name.to_owned());
                    next = [next, Some(now.later(BEHIND_RETRY))]
                        .into_iter()
                        .flatten()
                        .min();
                }
                Judgement::Alone(evidence::Alone::Silence) if doubt.is_some() => {
                    if let Some((other, why)) = &doubt {
                        if !p.confirm.doubted.contains(name) {
                            info!(event = "silence_doubted", pod = %pod, container = %name, other = %other, why = %why, "a container this one waits for may have run its hook without marking (an exec in it failed or runs on, or its limits held it back): its silence does not let this wait go");
                        }
                    }
                    held_doubted.push(name.to_owned());
                    undecided.extend(undecided_of(name, w.since));
                }
                Judgement::Alone(evidence::Alone::Silence) if exec_running || fresh => {
                    // Judged again once the exec ended (it marks, or fails), or once the
                    // counters first read now had a window to show what the hooks met.
                    if exec_running {
                        if !p.confirm.deferred.contains(name) {
                            debug!(event = "silence_deferred", pod = %pod, container = %name, why = "exec_running", "an exec of a container this one waits for is in progress: its silence is judged again once it ended");
                        }
                        deferred.push(name.to_owned());
                    }
                    let again = if exec_running {
                        EXEC_RETRY
                    } else {
                        rule.window
                    };
                    judging.push(name.to_owned());
                    next = [next, Some(now.later(again))].into_iter().flatten().min();
                    undecided.extend(undecided_of(name, w.since));
                }
                Judgement::Alone(by) => {
                    alone.insert(name.to_owned(), by);
                }
                j @ (Judgement::Pending { .. } | Judgement::Unknown | Judgement::KillEnded) => {
                    if let (Judgement::KillEnded, Some(c)) = (&j, newest.get(name)) {
                        word_only.push(c.info.id.clone());
                    }
                    if let Judgement::Pending { until_ns } = j {
                        let at = clock.instant(until_ns);
                        next = [next, Some(at)].into_iter().flatten().min();
                        judging.push(name.to_owned());
                    }
                    undecided.extend(undecided_of(name, w.since));
                }
            }
        }
        let p = self.waits.pending.get_mut(pod)?;
        if !stopping.is_empty() {
            stopping.sort();
            stopping.dedup();
            if p.confirm.pod_kill.is_none() {
                info!(event = "pod_kill", pod = %pod, stopping = ?stopping, "other containers are being stopped with the waiting ones: the whole pod is killed; exits stay ordered");
                p.confirm
                    .pod_kill_is(PodKill::Unrecognised, "others_marked");
            }
            p.confirm.stopping = stopping;
            p.confirm.judging.clear();
            p.confirm.behind.clear();
            facts.deletion = Deletion::Deleting;
            self.ask_kind(pod, now);
            return None;
        }
        for (name, by) in alone {
            if p.confirm.alone.insert(name.clone(), by).is_none() {
                debug!(pod = %pod, container = %name, evidence = by.as_str(), "the kubelet stops this container alone");
            }
            if let Deletion::NotDeleting { restarting, .. } = &mut facts.deletion {
                restarting.insert(name, now);
            }
        }
        p.confirm.judging = judging.into_iter().collect();
        p.confirm.behind = held_behind.into_iter().collect();
        p.confirm.word_only.extend(word_only);
        p.confirm.strain_base.extend(strain_base);
        p.confirm.doubted.extend(held_doubted);
        p.confirm.deferred.extend(deferred);
        p.confirm.judged = true;
        let due = self.ask_word(pod, &undecided, node_marked, now);
        if let Some(p) = self.waits.pending.get_mut(pod) {
            // The kubelet's word may still come for these: not a hold worth telling yet.
            p.confirm.judging.extend(
                undecided
                    .iter()
                    .filter(|u| self.hints.due(pod, &u.attempt, u.since).is_some())
                    .map(|u| u.name.clone()),
            );
        }
        [next, due].into_iter().flatten().min()
    }

    /// Asks for the kubelet's word on the undecided waits when a read is due and the budget
    /// allows it; when the next read is due otherwise. `node_marked`: when another pod of the
    /// node last marked or lost a container.
    fn ask_word(
        &mut self,
        pod: &PodUid,
        undecided: &[Undecided],
        node_marked: Option<Instant>,
        now: Instant,
    ) -> Option<Instant> {
        if undecided.is_empty() || self.api.pods.is_none() {
            return None;
        }
        for u in undecided {
            self.hints.waited(pod, &u.attempt, u.since, now);
            // Other pods are being killed around this wait: a kill of many pods is on its
            // way, whose hooks the runtime starts late on a busy node, so this pod's own
            // marks are likely only behind. The quick first read would mostly ask the API
            // server what the marks tell a moment later: only the later one is kept.
            if node_marked.is_some_and(|t| t.later(hints::FIRST_AFTER) >= u.since)
                && self.hints.forfeit_first(pod, &u.attempt)
            {
                debug!(pod = %pod, container = %u.name, "other pods are being killed: the first read of the kubelet's word is given up");
            }
        }
        let due: Vec<(&Undecided, Instant)> = undecided
            .iter()
            .filter_map(|u| Some((u, self.hints.due(pod, &u.attempt, u.since)?)))
            .collect();
        let asked = self.waits.pending.get(pod).is_some_and(|p| p.confirm.asked);
        let ready: Vec<&Undecided> = due
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(u, _)| *u)
            .collect();
        if !ready.is_empty() && !asked {
            let ids: Vec<&str> = ready.iter().map(|u| u.attempt.as_str()).collect();
            if self.hints.spend(pod, &ids, now) {
                let attempts = ready
                    .iter()
                    .map(|u| (u.name.clone(), u.created_s))
                    .collect();
                let since = ready.iter().map(|u| u.since).min().unwrap_or(now);
                self.confirm(pod, since, attempts, now);
            } else {
                debug!(pod = %pod, "no read of the kubelet's word left in the budget");
                self.stats.api_read_skipped();
            }
        }
        due.iter().map(|(_, at)| *at).filter(|at| *at > now).min()
    }

    /// Asks once per pod kill what kind it is, where the kind changes its budget (a soft
    /// eviction's, when the kubelet's `evictionMaxPodGracePeriod` is known).
    fn ask_kind(&mut self, pod: &PodUid, now: Instant) {
        if self.cfg.kubelet.eviction_max_pod_grace.is_none() || self.api.pods.is_none() {
            return;
        }
        let Some(p) = self.waits.pending.get(pod) else {
            return;
        };
        if p.confirm.kind_read
            || p.confirm.asked
            || p.confirm.pod_kill != Some(PodKill::Unrecognised)
        {
            return;
        }
        let since = p.first_seen;
        if self.hints.spend_for_pod(pod, now) {
            if let Some(p) = self.waits.pending.get_mut(pod) {
                p.confirm.kind_read = true;
            }
            self.confirm(pod, since, BTreeMap::new(), now);
        } else {
            self.stats.api_read_skipped();
        }
    }

    fn confirm(
        &mut self,
        pod: &PodUid,
        since: Instant,
        attempts: BTreeMap<String, i64>,
        now: Instant,
    ) {
        let Some((namespace, name)) = self.names(pod) else {
            return;
        };
        let Some(api) = &self.api.pods else {
            return;
        };
        if let Some(p) = self.waits.pending.get_mut(pod) {
            p.confirm.asked = true;
        }
        info!(event = "word_asked", pod = %pod, containers = ?attempts.keys().collect::<Vec<_>>(), "the node has not shown why this pod's containers stop: the kubelet's Events are read");
        api.confirm(ConfirmRequest {
            uid: pod.clone(),
            namespace,
            name,
            asked_at: now,
            since_unix: unix_of_instant(since, now),
            attempts,
        });
    }

    /// What the kubelet's Events said: a pod kill's kind (which refines what the marks showed),
    /// or containers it kills alone, each for the attempt the read was for.
    pub(super) fn on_word(
        &mut self,
        pod: &PodUid,
        asked_at: Instant,
        word: Option<crate::kubelet::kills::Word>,
    ) -> bool {
        let Some(p) = self.waits.pending.get_mut(pod) else {
            return false;
        };
        p.confirm.asked = false;
        p.confirm.reads = p.confirm.reads.saturating_add(1);
        let Some(word) = word else {
            return true;
        };
        if let Some(kill) = word.pod_kill {
            if matches!(p.confirm.pod_kill, None | Some(PodKill::Unrecognised))
                && p.confirm.pod_kill != Some(kill)
            {
                info!(pod = %pod, kill = %Kill::Pod(kill), "the kubelet says it kills the whole pod; exits stay ordered");
            }
            p.confirm.pod_kill_is(kill, "kubelet_event");
        }
        for (name, kind) in word.containers {
            debug!(pod = %pod, container = %name, kill = %Kill::Container(kind), "the kubelet says it kills this container alone");
            p.confirm.restarting.insert(name, (asked_at, kind));
        }
        true
    }
}
