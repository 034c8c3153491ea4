//! The grace period the kubelet gives a kill: what the agent's deadline follows.
//!
//! - A deletion: `metadata.deletionGracePeriodSeconds`, else the spec's
//!   `terminationGracePeriodSeconds` (`pod_workers.go` `calculateEffectiveGracePeriod`), and
//!   never under 1 s ("no matter what, we always supply a grace period of 1"); after a preStop
//!   the stop itself gets at least 2 s (`kuberuntime_container.go` `killContainer`,
//!   `minimumGracePeriodInSeconds`). A force delete (grace 0) gets that 1 s on current
//!   kubelets; older ones (no `overridden` flag there) fall back to the spec's. The agent
//!   reads 0 as the spec's ([`of_pod`]): on a current kubelet the TERM comes after 1 s + 2 s
//!   whatever the agent's deadline says, so the longer bound never holds the pod.
//! - Node-pressure eviction: the kubelet's `evictionMaxPodGracePeriod` for a soft threshold,
//!   1 s for a hard one (`eviction_manager.go`, `immediateEvictionGracePeriodSeconds`).
//! - Graceful node shutdown: `shutdownGracePeriod` less `shutdownGracePeriodCriticalPods` for
//!   regular pods (or the `shutdownGracePeriodByPodPriority` band), capped by the pod's own.
//! - `activeDeadlineSeconds` and preemption: the pod's own grace.
//! - A liveness or startup probe kill: the probe's `terminationGracePeriodSeconds` when set
//!   (a deletion's grace wins over it: `setTerminationGracePeriod`).
//!
//! What the agent cannot read on the node (the kubelet's configuration) it is told by flags
//! that mirror it; where nothing says, the spec's grace is the bound. Either way the kubelet
//! sends TERM when its own grace ends: the agent's deadline decides only whether the sidecar
//! hears `allow` (and drains) before that.

use std::time::Duration;

use crate::kubelet::kills::{Kill, PodKill};

/// What the agent knows of the kubelet's configuration (chart values mirror it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KubeletConfig {
    /// `evictionMaxPodGracePeriod` (soft evictions); `None`: not told.
    pub eviction_max_pod_grace: Option<Duration>,
    /// `shutdownGracePeriod` less `shutdownGracePeriodCriticalPods`: what regular pods get
    /// in a graceful node shutdown; `None`: not told.
    pub shutdown_regular_pods: Option<Duration>,
}

/// The grace period the kubelet gives a pod's containers, read from the object: the
/// deletion's own when set and not 0, else the spec's, and never under 1 s.
pub fn of_pod(deletion: Option<Duration>, spec: Option<Duration>) -> Option<Duration> {
    deletion
        .filter(|g| !g.is_zero())
        .or(spec)
        .map(|g| g.max(Duration::from_secs(1)))
}

/// The grace of a kill of kind `kill` for a pod whose own is `pod`: never longer than the
/// pod's, shorter where the kubelet is known to cut it.
pub fn of_kill(kill: Option<Kill>, pod: Option<Duration>, cfg: &KubeletConfig) -> Option<Duration> {
    let cut = match kill {
        Some(Kill::Pod(PodKill::Eviction)) => cfg.eviction_max_pod_grace,
        Some(Kill::Pod(PodKill::NodeShutdown)) => cfg.shutdown_regular_pods,
        _ => None,
    };
    match (pod, cut) {
        (Some(p), Some(c)) => Some(p.min(c.max(Duration::from_secs(1)))),
        (None, Some(c)) => Some(c.max(Duration::from_secs(1))),
        (p, None) => p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_deletions_grace_then_the_specs_never_under_a_second() {
        assert_eq!(of_pod(Some(S(10)), Some(S(30))), Some(S(10)));
        assert_eq!(of_pod(Some(S(0)), Some(S(30))), Some(S(30)));
        assert_eq!(of_pod(None, Some(S(0))), Some(S(1)));
        assert_eq!(of_pod(None, None), None);
    }

    #[test]
    fn a_kubelet_kill_is_cut_where_its_configuration_says() {
        let cfg = KubeletConfig {
            eviction_max_pod_grace: Some(S(10)),
            shutdown_regular_pods: Some(S(20)),
        };
        let ev = Some(Kill::Pod(PodKill::Eviction));
        let sd = Some(Kill::Pod(PodKill::NodeShutdown));
        assert_eq!(of_kill(ev, Some(S(30)), &cfg), Some(S(10)));
        assert_eq!(of_kill(ev, Some(S(5)), &cfg), Some(S(5)));
        assert_eq!(of_kill(sd, Some(S(30)), &cfg), Some(S(20)));
        assert_eq!(of_kill(None, Some(S(30)), &cfg), Some(S(30)));
        assert_eq!(
            of_kill(Some(Kill::Pod(PodKill::Unknown)), Some(S(30)), &cfg),
            Some(S(30))
        );
        assert_eq!(
            of_kill(ev, Some(S(30)), &KubeletConfig::default()),
            Some(S(30))
        );
    }
}
