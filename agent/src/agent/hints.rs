//! The budget of the kubelet's word: when the agent may read a pod's Events, a hint for a wait
//! that the node's own evidence has not decided yet.
//!
//! Each read is a LIST of the pod's Events that the API server serves from etcd (Events have no
//! watch cache by default), multiplied by every node of the cluster. So a read is asked:
//! - only for the first wait of a container attempt (a hook run again, or a pod re-creating its
//!   `exit`, is the same attempt: the kubelet's word on it was read already; a wait made anew
//!   before any read was made takes the first one's place, or the attempt would get none), at most
//!   [`PER_ATTEMPT`] times, at [`FIRST_AFTER`] and [`SECOND_AFTER`] (a pod kill's marks come
//!   first and make the read unneeded; the kubelet's recorder sends its Event within that),
//!   and only at the second while other pods of the node are being killed (their marks and
//!   exits around the wait: the pod's own marks are then likely only behind theirs);
//! - within a pod's budget ([`POD_BURST`] reads, then one per [`POD_REFILL`]), whatever its
//!   containers do;
//! - within the node's ([`NODE_BURST`], then [`NODE_PER_SEC`] a second): a mass kill that the
//!   node cannot explain costs the API server a trickle, never a storm.
//!
//! What is remembered is bounded: [`MAX_PODS`] pods, each with its [`MAX_ATTEMPTS`] latest
//! attempts, forgotten after [`KEEP`] unused.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::decide::bounds::Later as _;
use crate::pod::PodUid;

/// The first read of a wait comes this long after it began.
pub const FIRST_AFTER: Duration = Duration::from_millis(250);
/// The second, when the first found no word.
pub const SECOND_AFTER: Duration = Duration::from_millis(1_250);
/// Reads per container attempt.
pub const PER_ATTEMPT: u8 = 2;
/// A pod's reads at once, then one per [`POD_REFILL`].
pub const POD_BURST: f64 = 3.0;
pub const POD_REFILL: Duration = Duration::from_secs(30);
/// The node's reads at once, then [`NODE_PER_SEC`] a second.
pub const NODE_BURST: f64 = 10.0;
pub const NODE_PER_SEC: f64 = 2.0;
/// Most pods remembered, and attempts per pod.
pub const MAX_PODS: usize = 4096;
pub const MAX_ATTEMPTS: usize = 16;
/// A pod unused this long is forgotten (its budget full again).
pub const KEEP: Duration = Duration::from_secs(600);

/// A token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
    burst: f64,
    per_sec: f64,
}

impl Bucket {
    fn new(burst: f64, per_sec: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            at: now,
            burst,
            per_sec,
        }
    }

    fn refill(&mut self, now: Instant) {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + secs * self.per_sec).min(self.burst);
        self.at = now;
    }

    fn has(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= 1.0
    }

    fn take(&mut self) {
        self.tokens -= 1.0;
    }
}

/// One attempt: when its first wait began, and the reads counted for it (a forfeited first
/// read counts, but is not a read made).
#[derive(Debug, Clone)]
struct Attempt {
    id: String,
    first_wait: Instant,
    reads: u8,
    made: bool,
}

#[derive(Debug, Clone)]
struct PodHints {
    bucket: Bucket,
    attempts: Vec<Attempt>,
    used: Instant,
}

/// The reads' budget, per attempt, pod and node.
#[derive(Debug)]
pub struct Hints {
    pods: HashMap<PodUid, PodHints>,
    node: Bucket,
}

impl Hints {
    pub fn new(now: Instant) -> Hints {
        Hints {
            pods: HashMap::new(),
            node: Bucket::new(NODE_BURST, NODE_PER_SEC, now),
        }
    }

    /// When a read for the wait of attempt `id` that began at `since` is due: `None` when none
    /// will be (not the attempt's first wait, or its reads made).
    pub fn due(&self, pod: &PodUid, id: &str, since: Instant) -> Option<Instant> {
        let a = self
            .pods
            .get(pod)
            .and_then(|p| p.attempts.iter().find(|a| a.id == id));
        match a {
            None => Some(since.later(FIRST_AFTER)),
            Some(a) if a.first_wait != since => None,
            Some(a) if a.reads >= PER_ATTEMPT => None,
            Some(a) if a.reads == 0 => Some(since.later(FIRST_AFTER)),
            Some(_) => Some(since.later(SECOND_AFTER)),
        }
    }

    /// Notes that attempt `id`'s wait began at `since`: its first, if none was noted or no read
    /// was made for the one noted (that wait was replaced before its read came due, and its
    /// reads are this one's).
    pub fn waited(&mut self, pod: &PodUid, id: &str, since: Instant, now: Instant) {
        let p = self.pod(pod, now);
        if let Some(a) = p.attempts.iter_mut().find(|a| a.id == id) {
            if !a.made {
                a.first_wait = since;
            }
            return;
        }
        if p.attempts.len() >= MAX_ATTEMPTS {
            p.attempts.remove(0);
        }
        p.attempts.push(Attempt {
            id: id.to_owned(),
            first_wait: since,
            reads: 0,
            made: false,
        });
    }

    /// Gives up the first read of attempt `id` (noted by [`Self::waited`]) when it is not
    /// made yet: the next one is the second, at [`SECOND_AFTER`]. Whether it was given up now.
    pub fn forfeit_first(&mut self, pod: &PodUid, id: &str) -> bool {
        let attempt = self
            .pods
            .get_mut(pod)
            .and_then(|p| p.attempts.iter_mut().find(|a| a.id == id));
        match attempt.filter(|a| a.reads == 0) {
            Some(a) => {
                a.reads = 1;
                true
            }
            None => false,
        }
    }

    /// Spends one read for `ids` of `pod`, when the pod's and the node's budgets allow it.
    pub fn spend(&mut self, pod: &PodUid, ids: &[&str], now: Instant) -> bool {
        if !self.node.has(now) {
            return false;
        }
        let p = self.pod(pod, now);
        if !p.bucket.has(now) {
            return false;
        }
        p.bucket.take();
        for a in p
            .attempts
            .iter_mut()
            .filter(|a| ids.contains(&a.id.as_str()))
        {
            a.reads = a.reads.saturating_add(1);
            a.made = true;
        }
        self.node.take();
        true
    }

    /// Spends one read for `pod` alone (the kind of a pod kill), within the budgets.
    pub fn spend_for_pod(&mut self, pod: &PodUid, now: Instant) -> bool {
        self.spend(pod, &[], now)
    }

    fn pod(&mut self, pod: &PodUid, now: Instant) -> &mut PodHints {
        if !self.pods.contains_key(pod) && self.pods.len() >= MAX_PODS {
            self.prune(now);
            if self.pods.len() >= MAX_PODS {
                let oldest = self
                    .pods
                    .iter()
                    .min_by_key(|(_, p)| p.used)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.pods.remove(&k);
                }
            }
        }
        let p = self.pods.entry(pod.clone()).or_insert_with(|| PodHints {
            bucket: Bucket::new(POD_BURST, 1.0 / POD_REFILL.as_secs_f64(), now),
            attempts: Vec::new(),
            used: now,
        });
        p.used = now;
        p
    }

    /// Forgets pods unused for [`KEEP`].
    pub fn prune(&mut self, now: Instant) {
        self.pods
            .retain(|_, p| now.saturating_duration_since(p.used) < KEEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(i: usize) -> PodUid {
        PodUid::parse(&format!("00000000-0000-0000-0000-{i:012}")).unwrap()
    }

    #[test]
    fn an_attempts_first_wait_gets_two_reads_and_no_later_wait_any() {
        let t = Instant::now();
        let mut h = Hints::new(t);
        let p = pod(1);
        assert_eq!(h.due(&p, "a", t), Some(t + FIRST_AFTER));
        h.waited(&p, "a", t, t);
        assert!(h.spend(&p, &["a"], t + FIRST_AFTER));
        assert_eq!(h.due(&p, "a", t), Some(t + SECOND_AFTER));
        assert!(h.spend(&p, &["a"], t + SECOND_AFTER));
        assert_eq!(h.due(&p, "a", t), None);
        // The same attempt waiting again (a hook run again, an `exit` made anew): none.
        let again = t + Duration::from_secs(3);
        h.waited(&p, "a", again, again);
        assert_eq!(h.due(&p, "a", again), None);
        // A new attempt of the container: its own first wait.
        assert_eq!(h.due(&p, "b", again), Some(again + FIRST_AFTER));
    }

    /// While other pods are being killed, an attempt's first read is given up: the second
    /// is the only one, and no read follows it.
    #[test]
    fn a_forfeited_first_read_leaves_only_the_second() {
        let t = Instant::now();
        let mut h = Hints::new(t);
        let p = pod(1);
        h.waited(&p, "a", t, t);
        h.forfeit_first(&p, "a");
        assert_eq!(h.due(&p, "a", t), Some(t + SECOND_AFTER));
        assert!(h.spend(&p, &["a"], t + SECOND_AFTER));
        assert_eq!(h.due(&p, "a", t), None);
        // Once the first read was made, nothing is given up.
        h.waited(&p, "b", t, t);
        assert!(h.spend(&p, &["b"], t + FIRST_AFTER));
        h.forfeit_first(&p, "b");
        assert_eq!(h.due(&p, "b", t), Some(t + SECOND_AFTER));
    }

    /// A wait made anew (its `exit` seen again as the hook began) before the first wait's read
    /// came due: the new wait gets the attempt's reads, or none would be made at all.
    #[test]
    fn a_wait_made_anew_before_its_first_read_keeps_its_reads() {
        let t = Instant::now();
        let mut h = Hints::new(t);
        let p = pod(1);
        h.waited(&p, "a", t, t);
        let anew = t + Duration::from_millis(5);
        h.waited(&p, "a", anew, anew);
        assert_eq!(h.due(&p, "a", t), None);
        assert_eq!(h.due(&p, "a", anew), Some(anew + FIRST_AFTER));
        // A forfeited first read is not a read made: a later wait still takes its place.
        h.forfeit_first(&p, "a");
        let again = anew + Duration::from_millis(5);
        h.waited(&p, "a", again, again);
        assert_eq!(h.due(&p, "a", again), Some(again + SECOND_AFTER));
        // Once a read was made, a later wait of the attempt gets none.
        assert!(h.spend(&p, &["a"], again + SECOND_AFTER));
        let late = again + Duration::from_secs(2);
        h.waited(&p, "a", late, late);
        assert_eq!(h.due(&p, "a", late), None);
        assert_eq!(h.due(&p, "a", again), None);
    }

    #[test]
    fn a_pod_and_a_node_have_budgets() {
        let t = Instant::now();
        let mut h = Hints::new(t);
        let p = pod(1);
        let spent = (0..10).filter(|_| h.spend_for_pod(&p, t)).count();
        assert_eq!(spent, POD_BURST as usize);
        // One more after a refill period.
        assert!(h.spend_for_pod(&p, t + POD_REFILL));
        assert!(!h.spend_for_pod(&p, t + POD_REFILL));
        // The node's budget across pods.
        let mut h = Hints::new(t);
        let spent = (0..100).filter(|i| h.spend_for_pod(&pod(*i), t)).count();
        assert_eq!(spent, NODE_BURST as usize);
        let later = t + Duration::from_secs(5);
        let more = (100..200)
            .filter(|i| h.spend_for_pod(&pod(*i), later))
            .count();
        assert_eq!(more, (NODE_PER_SEC * 5.0) as usize);
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let t = Instant::now();
        let mut h = Hints::new(t);
        for i in 0..MAX_PODS + 20 {
            h.waited(&pod(i), "a", t, t + Duration::from_millis(i as u64));
        }
        assert_eq!(h.pods.len(), MAX_PODS);
        for i in 0..MAX_ATTEMPTS * 2 {
            h.waited(&pod(0), &format!("x{i}"), t, t);
        }
        assert!(h.pods[&pod(0)].attempts.len() <= MAX_ATTEMPTS);
        h.prune(t + KEEP + Duration::from_secs(10));
        assert!(h.pods.is_empty());
    }
}
