//! What one pod's exit directories may cost the agent in file events, and the pods that
//! spent it.
//!
//! A pod's containers can change their own exit directories as fast as a CPU allows. Each pod
//! gets a token bucket of events ([`EVENTS_PER_SECOND`], burst [`EVENT_BURST`]: a deletion
//! makes a handful); past it (or past its share of watches) the pod is *polled*: the watches
//! of the levels it can change are removed, so the kernel stops queuing its events at the
//! source, and its exit files are read every [`POLL_EVERY`]: those of the names its containers
//! have in the runtime, and [`POLL_NAMES`] more of what it made, in turn. A polled pod is watched again after a while ([`FIRST_HOLD`], doubling up to
//! [`MAX_HOLD`] each time it floods again). Only that pod pays: its waits are answered up to
//! [`POLL_EVERY`] later.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::decide::bounds::Later as _;

/// Events a pod may cause per second, on average.
pub const EVENTS_PER_SECOND: f64 = 2_000.0;
/// Events a pod may cause at once.
pub const EVENT_BURST: f64 = 20_000.0;
/// How often a polled pod's exit files are read.
pub const POLL_EVERY: Duration = Duration::from_millis(500);
/// How long a pod is polled the first time.
pub const FIRST_HOLD: Duration = Duration::from_secs(30);
/// The longest a pod is polled at once.
pub const MAX_HOLD: Duration = Duration::from_secs(600);
/// Exit directories read per polled pod per round.
pub const POLL_NAMES: usize = 64;

/// Why a pod is polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    /// More file events than its budget.
    Events,
    /// More directories than its share of watches.
    Watches,
}

impl Spent {
    pub fn as_str(self) -> &'static str {
        match self {
            Spent::Events => "events",
            Spent::Watches => "watches",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Tokens {
    left: f64,
    at: Instant,
    /// How long the next hold lasts.
    next_hold: Duration,
}

/// A pod being polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polled {
    pub since: Instant,
    pub until: Instant,
    pub why: Spent,
    /// Where the next round's look at the names the pod made starts.
    pub cursor: usize,
}

#[derive(Debug, Default)]
pub struct PodBudgets {
    tokens: HashMap<PathBuf, Tokens>,
    polled: HashMap<PathBuf, Polled>,
}

impl PodBudgets {
    /// Charges `events` to the pod of `pod_dir`; `true` when that spent its budget.
    pub fn charge(&mut self, pod_dir: &Path, events: u64, now: Instant) -> bool {
        let t = self.tokens.entry(pod_dir.to_owned()).or_insert(Tokens {
            left: EVENT_BURST,
            at: now,
            next_hold: FIRST_HOLD,
        });
        let refill = now.saturating_duration_since(t.at).as_secs_f64() * EVENTS_PER_SECOND;
        t.left = (t.left + refill).min(EVENT_BURST);
        t.at = now;
        // Precision does not matter past the burst.
        let cost = events.min(1 << 40) as f64;
        t.left -= cost;
        t.left < 0.0
    }

    /// Polls the pod of `pod_dir` for `why`; `false` if it already was.
    pub fn poll(&mut self, pod_dir: &Path, why: Spent, now: Instant) -> bool {
        if self.polled.contains_key(pod_dir) {
            return false;
        }
        let t = self.tokens.entry(pod_dir.to_owned()).or_insert(Tokens {
            left: 0.0,
            at: now,
            next_hold: FIRST_HOLD,
        });
        let hold = t.next_hold;
        t.next_hold = hold.saturating_mul(2).min(MAX_HOLD);
        // Back in full when watched again: the hold itself is the penalty.
        t.left = EVENT_BURST;
        t.at = now.later(hold);
        self.polled.insert(
            pod_dir.to_owned(),
            Polled {
                since: now,
                until: now.later(hold),
                why,
                cursor: 0,
            },
        );
        true
    }

    pub fn polled_mut(&mut self, pod_dir: &Path) -> Option<&mut Polled> {
        self.polled.get_mut(pod_dir)
    }

    pub fn is_polled(&self, pod_dir: &Path) -> bool {
        self.polled.contains_key(pod_dir)
    }

    /// The pods whose hold ended by `now`: watched again.
    pub fn release_due(&mut self, now: Instant) -> Vec<PathBuf> {
        let due: Vec<PathBuf> = self
            .polled
            .iter()
            .filter(|(_, p)| p.until <= now)
            .map(|(d, _)| d.clone())
            .collect();
        for d in &due {
            self.polled.remove(d);
        }
        due
    }

    /// The pods being polled.
    pub fn polled(&self) -> impl Iterator<Item = (&PathBuf, &Polled)> {
        self.polled.iter()
    }

    pub fn polled_count(&self) -> usize {
        self.polled.len()
    }

    /// Forgets the pods `keep` says are gone.
    pub fn retain(&mut self, mut keep: impl FnMut(&Path) -> bool) {
        self.tokens.retain(|d, _| keep(d));
        self.polled.retain(|d, _| keep(d));
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deletions_events_never_spend_the_budget_and_a_flood_does() {
        let mut b = PodBudgets::default();
        let t0 = Instant::now();
        let pod = Path::new("/pods/a");
        // A busy pod: 1,000 events a second for a minute.
        for s in 0..60 {
            assert!(!b.charge(pod, 1_000, t0.later(Duration::from_secs(s))));
        }
        // A flood: a million events in a second.
        let t1 = t0.later(Duration::from_secs(61));
        assert!(b.charge(pod, 1_000_000, t1));
    }

    #[test]
    fn each_flood_holds_the_pod_longer_up_to_the_most() {
        let mut b = PodBudgets::default();
        let pod = Path::new("/pods/a");
        let mut now = Instant::now();
        let mut holds = Vec::new();
        for _ in 0..8 {
            assert!(b.poll(pod, Spent::Events, now));
            assert!(!b.poll(pod, Spent::Events, now), "already polled");
            let p = *b.polled().next().unwrap().1;
            holds.push(p.until - p.since);
            assert!(b.release_due(p.until - Duration::from_millis(1)).is_empty());
            assert_eq!(b.release_due(p.until), [pod.to_path_buf()]);
            now = p.until;
        }
        assert_eq!(holds[0], FIRST_HOLD);
        assert_eq!(holds[1], FIRST_HOLD * 2);
        assert_eq!(*holds.last().unwrap(), MAX_HOLD);
    }

    #[test]
    fn gone_pods_are_forgotten() {
        let mut b = PodBudgets::default();
        let now = Instant::now();
        b.charge(Path::new("/pods/a"), 1, now);
        b.poll(Path::new("/pods/b"), Spent::Watches, now);
        b.retain(|d| d == Path::new("/pods/a"));
        assert_eq!((b.len(), b.polled_count()), (1, 0));
    }
}
