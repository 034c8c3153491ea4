//! The waits in the share: which containers' preStop hooks wait for an answer, their churn
//! history, and what is known of each pod's kill (kept current by [`super::sync`]).
//!
//! A container rewriting its `exit` file in a loop must not make the agent re-decide (or read
//! the runtime) per write: a wait that is already known is not news, and a wait that keeps
//! coming back is coalesced (at most one decision per [`CHURN_WINDOW`]) and counted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::decide::Reason;
use crate::handshake::marks::Marks;
use crate::handshake::share::{ContainerName, ExitKey, FileId, Place};
use crate::kubelet::evidence::Alone;
use crate::kubelet::kills::{ContainerKill, Kill, PodKill};
use crate::pod::PodUid;
use crate::view::Strain;

/// A wait that reappears sooner than this after its last decision is decided at the end of
/// the window, not at once.
pub const CHURN_WINDOW: Duration = Duration::from_millis(100);
/// Most waits whose last appearance is remembered: a pod that makes up container directories
/// by the thousand between two prunings must not grow the history with them. Past it, what is
/// older than the window goes, and if that is not enough, all of it (a wait that comes back
/// then is decided at once rather than coalesced, once).
pub const HISTORY_MAX: usize = 4096;

pub struct Waiter {
    pub since: Instant,
    /// What the wait was held for when last logged (`None`: never held), so a long wait
    /// logs its hold once, and a change of what holds it once more (at debug).
    pub held_for: Option<Vec<String>>,
    /// Failed writes of `allow` in a row (a full disk, a read-only remount): the wait stays
    /// and is answered again, not before `retry_at`.
    pub write_failures: u32,
    pub retry_at: Option<Instant>,
    /// Where its exit directory is, and so where `allow` goes.
    pub place: Place,
    /// Which exit file asked (see [`FileId`]).
    pub file: Option<FileId>,
}

impl Waiter {
    pub fn new(since: Instant, place: Place) -> Self {
        Waiter {
            since,
            held_for: None,
            write_failures: 0,
            retry_at: None,
            place,
            file: None,
        }
    }

    /// The exit directory this waiter waits in.
    pub fn key(&self, pod: &PodUid, container: &ContainerName) -> ExitKey {
        ExitKey {
            pod: pod.clone(),
            container: container.clone(),
            place: self.place,
        }
    }
}

/// Why a pending pod's containers stop: what the node shows and the kubelet said (see
/// [`crate::kubelet::evidence`]), whether the whole pod is killed or some of its containers
/// alone.
#[derive(Default)]
pub struct Confirmation {
    /// The kubelet's word that it kills these containers alone, each for the attempt the read
    /// was for: when the read was asked, and why.
    pub restarting: BTreeMap<String, (Instant, ContainerKill)>,
    /// The whole pod is killed, and why (the API object, the Node, the containers' marks or
    /// the kubelet's Events): ordered from now on, whatever a later read says.
    pub pod_kill: Option<PodKill>,
    /// What showed the pod kill (`api`, `node`, `others_marked`, `kubelet_event`).
    pub pod_kill_by: &'static str,
    /// The other containers seen being stopped with the waits, when their marks showed it.
    pub stopping: Vec<String>,
    /// The containers the evidence shows stopped alone, and by what.
    pub alone: BTreeMap<String, Alone>,
    /// The waits the evidence has not decided yet (a hold of theirs is not worth telling yet).
    pub judging: BTreeSet<String>,
    /// The waits the others' silence would let go, held while the pod watch is not current
    /// (told once each).
    pub behind: BTreeSet<String>,
    /// The container attempts (their ids) whose wait saw another container's kill ended just
    /// before it: only the kubelet's word lets them go before their blockers exit (see
    /// [`crate::kubelet::evidence::Judgement::KillEnded`]), however often the wait is made
    /// again, and after the other's mark is forgotten.
    pub word_only: BTreeSet<String>,
    /// The counters of being held back by its limits (see [`crate::runtime::strain`]) of each
    /// container a wait waits for, as first read while that wait's attempt waited: keyed by
    /// the waiting attempt's id and the other container's attempt id.
    pub strain_base: BTreeMap<(String, String), Strain>,
    /// The waits the others' silence would let go, held because a container they wait for
    /// may be running its hook: an exec in it, or held back by its limits (told once each).
    pub doubted: BTreeSet<String>,
    /// The waits whose silence was judged again for an exec in progress in a container they
    /// wait for (told once each).
    pub deferred: BTreeSet<String>,
    /// The pod's waits were judged at least once (the view knew the pod).
    pub judged: bool,
    /// When the waits must be judged again (the others' marks may still come until then).
    pub next: Option<Instant>,
    /// A read is in flight.
    pub asked: bool,
    /// The read of what kind of pod kill this is was asked.
    pub kind_read: bool,
    /// Reads made for this pod.
    pub reads: u32,
}

impl Confirmation {
    /// The kind of kill a wait of `container` answered for `reason` belongs to.
    pub fn kill_of(&self, container: &str, reason: Reason) -> Kill {
        match reason {
            Reason::NotTerminating => match self.restarting.get(container) {
                Some((_, k)) => Kill::Container(*k),
                None => Kill::Container(ContainerKill::Unsaid),
            },
            _ => Kill::Pod(self.pod_kill.unwrap_or(PodKill::Unknown)),
        }
    }

    /// The whole pod is killed, of kind `kill`, as `by` showed: a kind the marks could not name
    /// (`Unrecognised`) gives way to one that names it.
    pub fn pod_kill_is(&mut self, kill: PodKill, by: &'static str) {
        if matches!(self.pod_kill, None | Some(PodKill::Unrecognised))
            && self.pod_kill != Some(kill)
        {
            self.pod_kill = Some(kill);
            self.pod_kill_by = by;
        }
    }

    /// What showed why `container` stops, for logs and Events.
    pub fn evidence_of(&self, container: &str, reason: Reason) -> &'static str {
        match (reason, self.alone.get(container)) {
            (Reason::NotTerminating, Some(by)) => by.as_str(),
            _ if self.pod_kill.is_some() && !self.pod_kill_by.is_empty() => self.pod_kill_by,
            _ => "none",
        }
    }
}

pub struct PendingPod {
    /// When the pod's first exit file appeared: the start of the grace period (the kubelet
    /// runs every preStop at once when it starts killing the pod).
    pub first_seen: Instant,
    pub waiting: BTreeMap<ContainerName, Waiter>,
    /// When the waits of this pod must be decided again without any event (a deadline, the
    /// end of a settle time, a coalesced churn), as of the last decision.
    pub wake: Option<Instant>,
    pub confirm: Confirmation,
    /// Asking the runtime about this pod, which the view did not know (or not whole).
    pub checking: bool,
    /// The runtime was asked about it: what the view has now is what the runtime has.
    pub checked: bool,
    /// Its first wait was found by the agent's start-up scan: the file may have appeared
    /// long before the agent saw it.
    pub found_at_start: bool,
    /// When a container already waiting asked again (its exit file removed and made anew):
    /// its preStop hook ran a second time, which the kubelet does only when it starts the
    /// pod's kill over, with a grace period counted from then. `pod_workers.go` `UpdatePod`
    /// cancels a running kill when the grace period is shortened (`wasGracePeriodShortened`,
    /// a second `kubectl delete --grace-period`), and the pod worker retries a kill that
    /// failed (the runtime restarting); each attempt is a new `killPodWithSyncResult`, whose
    /// `killContainer` runs the preStop hook again with the whole new grace period.
    pub rerun_at: Option<Instant>,
    /// Containers whose exit file went away while they waited, with others of the pod still
    /// waiting: asking again is a rerun.
    pub(super) removed: BTreeSet<ContainerName>,
}

#[derive(Default)]
pub struct Waits {
    pub pending: BTreeMap<PodUid, PendingPod>,
    /// When each container last said it is being stopped (a wait says so too).
    pub marks: Marks,
    /// When each container's wait last appeared, to coalesce churn.
    last_seen: HashMap<ExitKey, Instant>,
    /// The agent's start-up scan is running.
    pub starting: bool,
}

impl Waits {
    pub fn count(&self) -> usize {
        self.pending.values().map(|p| p.waiting.len()).sum()
    }

    pub fn get(&self, pod: &PodUid) -> Option<&PendingPod> {
        self.pending.get(pod)
    }

    /// Drops the wait of `key`'s container, when it waits in `key`'s place.
    pub fn drop_waiter(&mut self, key: &ExitKey) {
        if let Some(p) = self.pending.get_mut(&key.pod) {
            if p.waiting
                .get(&key.container)
                .is_some_and(|w| w.place == key.place)
            {
                p.waiting.remove(&key.container);
            }
            if p.waiting.is_empty() {
                self.pending.remove(&key.pod);
            }
        }
    }

    /// Drops a wait whose exit file went away: the pod's own doing, or its hook asking
    /// again (see [`PendingPod::rerun_at`]).
    pub(super) fn drop_removed(&mut self, key: &ExitKey) {
        if let Some(p) = self.pending.get_mut(&key.pod) {
            if p.waiting
                .get(&key.container)
                .is_some_and(|w| w.place == key.place)
                && p.waiting.len() > 1
                && p.removed.len() < p.waiting.len()
            {
                p.removed.insert(key.container.clone());
            }
        }
        self.drop_waiter(key);
    }

    /// Drops every wait of `pod` in `place`: the agent no longer serves that place.
    pub(super) fn drop_pod_at(&mut self, pod: &PodUid, place: Place) {
        if let Some(p) = self.pending.get_mut(pod) {
            p.waiting.retain(|_, w| w.place != place);
            if p.waiting.is_empty() {
                self.pending.remove(pod);
            }
        }
    }

    /// Forgets churn history older than the window, and old marks.
    pub fn prune(&mut self, now: Instant) {
        self.last_seen
            .retain(|_, at| now.saturating_duration_since(*at) < CHURN_WINDOW.saturating_mul(10));
        self.marks.prune(now);
    }

    /// Waits whose last appearance is remembered.
    pub fn history_len(&self) -> usize {
        self.last_seen.len()
    }

    /// Notes that `key`'s wait appeared `now`; whether it came back within the churn window.
    pub(super) fn seen(&mut self, key: &ExitKey, now: Instant) -> bool {
        if self.last_seen.len() >= HISTORY_MAX && !self.last_seen.contains_key(key) {
            self.prune(now);
            if self.last_seen.len() >= HISTORY_MAX {
                warn!(
                    limit = HISTORY_MAX,
                    "more exit files appearing at once than the agent remembers; forgetting when each last appeared"
                );
                self.last_seen.clear();
            }
        }
        self.last_seen
            .insert(key.clone(), now)
            .is_some_and(|at| now.saturating_duration_since(at) < CHURN_WINDOW)
    }
}
