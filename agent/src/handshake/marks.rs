//! The containers' marks: when the agent last saw each container of a pod say that the kubelet
//! is stopping it (its `stopping` file, or its `exit` file: a wait is a mark too), and when the
//! container made it, on the agent's own clock. What a decision reads to tell a pod kill from
//! one container's restart ([`crate::kubelet::evidence`]).
//!
//! Bounded like everything a pod can drive: a pod's marks are one per container name it has
//! (at most [`PER_POD`], the newest kept), the node's at most [`MAX`] pods' worth, and a mark
//! is forgotten after [`KEEP`] (a judgement needs a mark only while its container's current
//! attempt still runs, or within the window of a wait).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::handshake::share::ContainerName;
use crate::pod::PodUid;

/// Most names remembered per pod: more than any pod's containers.
pub const PER_POD: usize = 64;
/// Most pods whose marks are remembered at once.
pub const MAX: usize = 4096;
/// How long a mark is remembered.
pub const KEEP: Duration = Duration::from_secs(600);

/// One mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mark {
    /// When the agent saw it.
    pub seen: Instant,
    /// When the container made it, no later than `seen`: a mark found by a sweep was made
    /// before the agent came by (see [`crate::handshake::share::Share::take_mark`]).
    pub made: Instant,
}

impl Mark {
    /// A mark seen as it was made.
    pub fn at(t: Instant) -> Mark {
        Mark { seen: t, made: t }
    }
}

#[derive(Default)]
pub struct Marks {
    by_pod: HashMap<PodUid, Vec<(ContainerName, Mark)>>,
}

impl Marks {
    /// `container` of `pod` marked.
    pub fn note(&mut self, pod: &PodUid, container: &ContainerName, at: Mark) {
        if !self.by_pod.contains_key(pod) && self.by_pod.len() >= MAX {
            self.prune(at.seen);
            if self.by_pod.len() >= MAX {
                // The pod marked longest ago goes: its kill is the one least likely to be
                // judged still.
                let oldest = self
                    .by_pod
                    .iter()
                    .min_by_key(|(_, v)| v.iter().map(|(_, t)| t.seen).max())
                    .map(|(p, _)| p.clone());
                if let Some(p) = oldest {
                    self.by_pod.remove(&p);
                }
            }
        }
        let marks = self.by_pod.entry(pod.clone()).or_default();
        match marks.iter_mut().find(|(c, _)| c == container) {
            Some((_, t)) => *t = (*t).max(at),
            None => {
                if marks.len() >= PER_POD {
                    if let Some(i) = marks
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, (_, t))| t.seen)
                        .map(|(i, _)| i)
                    {
                        marks.swap_remove(i);
                    }
                }
                marks.push((container.clone(), at));
            }
        }
    }

    /// Each container of `pod`'s last mark.
    pub fn of<'a>(&'a self, pod: &PodUid) -> impl Iterator<Item = (&'a str, Mark)> + 'a {
        self.by_pod
            .get(pod)
            .into_iter()
            .flatten()
            .map(|(c, t)| (c.as_str(), *t))
    }

    /// Forgets marks older than [`KEEP`].
    pub fn prune(&mut self, now: Instant) {
        self.by_pod.retain(|_, marks| {
            marks.retain(|(_, t)| now.saturating_duration_since(t.seen) < KEEP);
            !marks.is_empty()
        });
    }

    /// Pods with marks remembered.
    pub fn pods(&self) -> usize {
        self.by_pod.len()
    }

    /// When a container of another pod than `pod` last marked: while the node's pods are
    /// being stopped, their hooks queue behind one another in the runtime, and a pod's own
    /// marks may come late (see [`crate::kubelet::evidence`]).
    pub fn latest_other(&self, pod: &PodUid) -> Option<Instant> {
        self.by_pod
            .iter()
            .filter(|(p, _)| *p != pod)
            .flat_map(|(_, marks)| marks.iter().map(|(_, t)| t.seen))
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(i: usize) -> PodUid {
        PodUid::parse(&format!("00000000-0000-0000-0000-{i:012}")).unwrap()
    }

    fn name(i: usize) -> ContainerName {
        ContainerName::parse(&format!("c{i}")).unwrap()
    }

    #[test]
    fn the_newest_mark_per_container_is_kept() {
        let mut m = Marks::default();
        let t = Instant::now();
        m.note(&pod(1), &name(1), Mark::at(t));
        m.note(&pod(1), &name(1), Mark::at(t + Duration::from_secs(1)));
        m.note(&pod(1), &name(1), Mark::at(t));
        let seen: Vec<_> = m.of(&pod(1)).collect();
        assert_eq!(seen, vec![("c1", Mark::at(t + Duration::from_secs(1)))]);
        m.prune(t + KEEP + Duration::from_secs(2));
        assert_eq!(m.of(&pod(1)).count(), 0);
        assert_eq!(m.pods(), 0);
    }

    #[test]
    fn the_latest_mark_of_another_pod() {
        let mut m = Marks::default();
        let t = Instant::now();
        assert_eq!(m.latest_other(&pod(1)), None);
        m.note(&pod(1), &name(1), Mark::at(t + Duration::from_secs(5)));
        assert_eq!(m.latest_other(&pod(1)), None);
        m.note(&pod(2), &name(1), Mark::at(t + Duration::from_secs(1)));
        m.note(&pod(3), &name(1), Mark::at(t + Duration::from_secs(2)));
        assert_eq!(m.latest_other(&pod(1)), Some(t + Duration::from_secs(2)));
        assert_eq!(m.latest_other(&pod(3)), Some(t + Duration::from_secs(5)));
    }

    #[test]
    fn a_pod_making_up_names_and_a_node_of_pods_stay_bounded() {
        let mut m = Marks::default();
        let t = Instant::now();
        for i in 0..PER_POD * 3 {
            m.note(
                &pod(1),
                &name(i),
                Mark::at(t + Duration::from_millis(i as u64)),
            );
        }
        assert_eq!(m.of(&pod(1)).count(), PER_POD);
        // The newest names are the ones kept.
        assert!(m
            .of(&pod(1))
            .any(|(c, _)| c == format!("c{}", PER_POD * 3 - 1)));
        for i in 0..MAX + 10 {
            m.note(
                &pod(i + 2),
                &name(0),
                Mark::at(t + Duration::from_millis(i as u64)),
            );
        }
        assert_eq!(m.pods(), MAX);
    }
}
