//! What the decision loop has logged once: a problem of a pod (a malformed priority, a Job
//! record it cannot read) is logged once while the pod lasts, a failed read of a container
//! once, so that a pod that keeps failing cannot flood the log. Bounded: past [`WARNED_MAX`]
//! entries all are forgotten, and each may then be logged once more.

use std::collections::HashSet;

use tracing::warn;

use crate::pod::PodUid;

/// Entries kept at most in each set.
pub(super) const WARNED_MAX: usize = 4096;

#[derive(Debug, Default)]
pub(super) struct Warned {
    /// Problems of pods, each with what it is about.
    pods: HashSet<(PodUid, String)>,
    /// Container ids whose failed reads were logged.
    reads: HashSet<String>,
}

impl Warned {
    /// Whether `what` about `pod` is news to log.
    pub(super) fn first(&mut self, pod: &PodUid, what: String) -> bool {
        let key = (pod.clone(), what);
        if self.pods.contains(&key) {
            return false;
        }
        if self.pods.len() >= WARNED_MAX {
            warn!(
                limit = WARNED_MAX,
                "more problems logged once than the agent remembers; forgetting them"
            );
            self.pods.clear();
        }
        self.pods.insert(key)
    }

    /// Whether a failed read of container `id` is news to log.
    pub(super) fn first_read(&mut self, id: &str) -> bool {
        if self.reads.len() >= WARNED_MAX {
            self.reads.clear();
        }
        self.reads.insert(id.to_owned())
    }

    /// Forgets what was logged about pods that are gone: it may be logged again, once, should
    /// a pod of that UID ever come back.
    pub(super) fn keep_pods(&mut self, live: impl Fn(&PodUid) -> bool) {
        self.pods.retain(|(p, _)| live(p));
    }

    pub(super) fn len(&self) -> usize {
        self.pods.len().saturating_add(self.reads.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_problem_is_news_once_until_its_pod_is_gone() {
        let pod = PodUid::parse("0f5c7a1e-8d2b-4c3e-9f00-123456789abc").unwrap();
        let mut w = Warned::default();
        assert!(w.first(&pod, "a".to_owned()));
        assert!(!w.first(&pod, "a".to_owned()));
        assert!(w.first(&pod, "b".to_owned()));
        assert!(w.first_read("c1"));
        assert!(!w.first_read("c1"));
        assert_eq!(w.len(), 3);
        w.keep_pods(|_| false);
        assert_eq!(w.len(), 1);
        assert!(w.first(&pod, "a".to_owned()));
    }

    #[test]
    fn the_sets_are_bounded() {
        let pod = PodUid::parse("0f5c7a1e-8d2b-4c3e-9f00-123456789abc").unwrap();
        let mut w = Warned::default();
        for i in 0..=WARNED_MAX {
            assert!(w.first(&pod, i.to_string()));
            assert!(w.first_read(&i.to_string()));
        }
        assert!(w.len() <= 2 * WARNED_MAX);
        // The first were forgotten with the rest: news again.
        assert!(w.first(&pod, "0".to_owned()));
    }
}
