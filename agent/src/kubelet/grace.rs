//! The grace period the kubelet gives a kill's preStop hooks: what the agent's deadline
//! follows. Each rule is the kubelet's, per version (kubernetes/kubernetes `pkg/kubelet`; the
//! versions where a rule changed are said beside it). The kubelet's version comes from the
//! Node (`status.nodeInfo.kubeletVersion`, see [`crate::cluster::nodewatch`]); its
//! configuration, which no API shows, from the chart (flags mirroring it). Where the version is
//! not known, the longest budget any version gives is taken: a deadline later than the
//! kubelet's cut costs the sidecar its drain (the kubelet's TERM still comes, at least 2 s
//! before its KILL: `kuberuntime_container.go` `killContainer`, `minimumGracePeriodInSeconds`),
//! one earlier would break the order.
//!
//! How a kill's grace reaches the preStop: the kill's override (eviction, shutdown) goes through
//! `pod_workers.go` `calculateEffectiveGracePeriod`, then `killContainer` gives the preStop
//! what is left of it (`executePreStopHook`). Before 1.28 `killContainer` applied the override
//! only after the preStop (which ran with the pod's own grace, `setTerminationGracePeriod`):
//! there the preStop's budget is the pod's whatever the kill.
//!
//! A kill of one container (a probe's, a failed postStart, a changed spec) has its own grace
//! (a probe's `terminationGracePeriodSeconds`, on by default from 1.25, GA 1.28, where a
//! deletion's grace wins: `setTerminationGracePeriod`). It never decides a deadline here: a
//! container shown killed alone is let go at once ([`super::evidence`]), and one not shown so
//! is taken for a pod kill, whose grace is the pod's.

use std::time::Duration;

use crate::kubelet::kills::{Kill, PodKill};

/// `scheduling.SystemCriticalPriority` (`pkg/apis/scheduling/types.go`): the priority from
/// which graceful node shutdown counts a pod as critical.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// A kubelet's version, (major, minor).
pub type Version = (u32, u32);

/// What the agent knows of the kubelets' configuration (chart values mirror it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletConfig {
    /// `evictionMaxPodGracePeriod` (soft evictions; 0 is the kubelet's default); `None`: not
    /// told.
    pub eviction_max_pod_grace: Option<Duration>,
    /// The kubelet runs with the feature gate `AllowOverwriteTerminationGracePeriodSeconds`
    /// on (1.32–1.34 only: deprecated off in 1.32, locked off in 1.35).
    pub eviction_overwrites_pod_grace: bool,
    /// `shutdownGracePeriod` less `shutdownGracePeriodCriticalPods`: what regular pods get in
    /// a graceful node shutdown; `None`: not told.
    pub shutdown_regular_pods: Option<Duration>,
    /// `shutdownGracePeriodCriticalPods`: what critical pods get; `None`: not told.
    pub shutdown_critical_pods: Option<Duration>,
    /// `shutdownGracePeriodByPodPriority`, (priority, grace) per band; when given, it replaces
    /// the two above (`nodeshutdown` `newPodManager`).
    pub shutdown_by_priority: Vec<(i32, Duration)>,
}

/// The pod as a kill's grace needs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodGrace {
    /// The grace the kubelet gives the pod's containers by itself: its deletion's when set,
    /// else the spec's ([`of_pod`]).
    pub own: Option<Duration>,
    /// `spec.priority` (`None` reads as 0, as the kubelet reads it).
    pub priority: Option<i32>,
}

/// The grace period the kubelet gives a pod's containers, read from the object: the
/// deletion's own when set and not 0, else the spec's, and never under 1 s. A force delete
/// (grace 0) gets 1 s from 1.31 (`calculateEffectiveGracePeriod`'s `overridden` check,
/// kubernetes#124063), the spec's grace before: 0 here reads as the spec's, the longer of the
/// two, unless the kubelet is known ([`of_kill`] with [`PodKill::Deletion`]).
pub fn of_pod(deletion: Option<Duration>, spec: Option<Duration>) -> Option<Duration> {
    deletion
        .filter(|g| !g.is_zero())
        .or(spec)
        .map(|g| g.max(Duration::from_secs(1)))
}

/// `calculateEffectiveGracePeriod` for an override `o` of a kill: 1.31+ give an override of 0
/// 1 s; earlier kubelets replace 0 by the pod's own grace.
fn effective(o: Duration, pod: Option<Duration>, version: Option<Version>) -> Option<Duration> {
    if !o.is_zero() {
        return Some(o);
    }
    match version {
        Some(v) if v >= (1, 31) => Some(Duration::from_secs(1)),
        _ => pod.or(Some(Duration::from_secs(1))),
    }
}

/// The grace of a kill of kind `kill`, for `pod`, on a kubelet of `version` (`None`: not
/// known) configured as `cfg`; `None` when nothing says (the runtime's record of the pod's
/// grace decides then).
pub fn of_kill(
    kill: Option<Kill>,
    pod: PodGrace,
    deletion: Option<Duration>,
    cfg: &KubeletConfig,
    version: Option<Version>,
) -> Option<Duration> {
    let own = pod.own;
    match kill {
        Some(Kill::Pod(PodKill::Deletion)) => match (deletion, version) {
            // A force delete: 1 s from 1.31, the pod's own grace before (and when unknown).
            (Some(d), Some(v)) if d.is_zero() && v >= (1, 31) => Some(Duration::from_secs(1)),
            _ => own,
        },
        Some(Kill::Pod(PodKill::Eviction)) => eviction(own, cfg, version),
        Some(Kill::Pod(PodKill::NodeShutdown)) => shutdown(pod, cfg, version),
        // `activeDeadlineSeconds`, preemption (its override is nil: the pod's own grace), a
        // kill the agent cannot name.
        _ => own,
    }
}

/// A node-pressure eviction (`eviction/eviction_manager.go` `synchronize`): a soft threshold's
/// override is `evictionMaxPodGracePeriod` (M), a hard one's 1 s from 1.31 (0 before, which
/// became the pod's own grace). Soft and hard cannot be told apart from the node, so the soft
/// budget is taken: the hard one is never longer.
/// - before 1.28: the preStop runs with the pod's own grace (the override came after it);
/// - 1.28–1.31: M, even above the pod's grace; M = 0 is the pod's (1.28–1.30) or 1 s (1.31);
/// - 1.32–1.34: min(M, pod's) unless `AllowOverwriteTerminationGracePeriodSeconds` is on;
/// - 1.35+: min(M, pod's).
///
/// Unknown version: the longest of these.
fn eviction(
    own: Option<Duration>,
    cfg: &KubeletConfig,
    version: Option<Version>,
) -> Option<Duration> {
    let Some(m) = cfg.eviction_max_pod_grace else {
        return own;
    };
    let min = |m: Duration| Some(own.map_or(m, |p| p.min(m)));
    match version {
        None => [Some(m), own].into_iter().flatten().max(),
        Some(v) if v < (1, 28) => own,
        Some(v) if v < (1, 32) => effective(m, own, version),
        Some(v) if v < (1, 35) && cfg.eviction_overwrites_pod_grace => effective(m, own, version),
        Some(_) if m.is_zero() => effective(m, own, version),
        Some(_) => min(m),
    }
}

/// Graceful node shutdown (`nodeshutdown` `groupByPriority`, `killPods`): the pod's priority
/// band (the highest whose priority is at or below the pod's; below every band, the lowest),
/// capped by the pod's own grace. Without bands, `shutdownGracePeriod` is split in two
/// (`migrateConfig`): critical pods (priority at least [`SYSTEM_CRITICAL_PRIORITY`]) and the
/// rest.
fn shutdown(pod: PodGrace, cfg: &KubeletConfig, version: Option<Version>) -> Option<Duration> {
    let priority = pod.priority.unwrap_or(0);
    let band = if cfg.shutdown_by_priority.is_empty() {
        if priority >= SYSTEM_CRITICAL_PRIORITY {
            cfg.shutdown_critical_pods
        } else {
            cfg.shutdown_regular_pods
        }
    } else {
        let mut bands = cfg.shutdown_by_priority.clone();
        bands.sort_by_key(|(p, _)| *p);
        bands
            .iter()
            .rev()
            .find(|(p, _)| *p <= priority)
            .or(bands.first())
            .map(|(_, g)| *g)
    };
    let Some(band) = band else {
        return pod.own;
    };
    let capped = match pod.own {
        Some(own) if own <= band => own,
        _ => band,
    };
    effective(capped, pod.own, version)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn pod(secs: u64) -> PodGrace {
        PodGrace {
            own: Some(S(secs)),
            priority: None,
        }
    }

    /// Every row of `kubelet-rules/grace.tsv`, taken from the kubelet's source (the test
    /// bed's kubelet is checked against it too): the same grace where the agent can tell the
    /// kill, no less where it cannot.
    #[test]
    fn every_row_of_the_upstream_table_holds() {
        for row in exitorder_kubelet_rules::GRACE.rows(6) {
            let line = row.line;
            let version = row.version(1);
            let [kill, _, pod, value, want, agent, ..] = row.fields[..] else {
                unreachable!("rows(6)");
            };
            let spec = S(pod.parse().expect("the pod's grace"));
            let n = || S(value.parse().expect("seconds"));
            let mut cfg = KubeletConfig::default();
            // The object's deletionGracePeriodSeconds: the API server makes 0 a 1 unless
            // the deletion is forced.
            let mut deletion = None;
            let kind = match kill {
                "deletion" => {
                    deletion = match value {
                        "-" => None,
                        "force" => Some(S(0)),
                        _ => Some(n().max(S(1))),
                    };
                    PodKill::Deletion
                }
                "soft-eviction" => {
                    cfg.eviction_max_pod_grace = Some(n());
                    PodKill::Eviction
                }
                "hard-eviction" => PodKill::Eviction,
                "node-shutdown" => {
                    cfg.shutdown_regular_pods = Some(n());
                    PodKill::NodeShutdown
                }
                "active-deadline" => PodKill::ActiveDeadline,
                "preemption" => PodKill::Preemption,
                other => panic!("kill {other:?} in {line:?}"),
            };
            let pod = PodGrace {
                own: of_pod(deletion, Some(spec)),
                priority: None,
            };
            let got = of_kill(Some(Kill::Pod(kind)), pod, deletion, &cfg, Some(version))
                .expect("a grace");
            let want = S(want.parse().expect("seconds"));
            match agent {
                "same" => assert_eq!(got, want, "row {line:?}"),
                "at-least" => assert!(got >= want, "{got:?} for row {line:?}"),
                other => panic!("agent column {other:?} in {line:?}"),
            }
        }
    }

    #[test]
    fn the_deletions_grace_then_the_specs_never_under_a_second() {
        assert_eq!(of_pod(Some(S(10)), Some(S(30))), Some(S(10)));
        assert_eq!(of_pod(Some(S(0)), Some(S(30))), Some(S(30)));
        assert_eq!(of_pod(None, Some(S(0))), Some(S(1)));
        assert_eq!(of_pod(None, None), None);
    }

    /// One table, a row per kubelet version range and configuration: the grace a soft
    /// eviction's preStop gets, pod grace 30 s (see `eviction`'s doc for the upstream code).
    #[test]
    fn a_soft_eviction_per_kubelet_version() {
        let ev = Some(Kill::Pod(PodKill::Eviction));
        let cfg = |m: u64, gate: bool| KubeletConfig {
            eviction_max_pod_grace: Some(S(m)),
            eviction_overwrites_pod_grace: gate,
            ..KubeletConfig::default()
        };
        #[rustfmt::skip]
        let table: Vec<(Option<Version>, u64, bool, u64)> = vec![
            // (version, M, gate, grace)
            (Some((1, 27)), 10, false, 30), (Some((1, 27)), 60, false, 30),
            (Some((1, 28)), 10, false, 10), (Some((1, 28)), 60, false, 60), (Some((1, 30)), 0, false, 30),
            (Some((1, 31)), 60, false, 60), (Some((1, 31)), 0, false, 1),
            (Some((1, 32)), 60, false, 30), (Some((1, 32)), 60, true, 60), (Some((1, 34)), 10, false, 10),
            (Some((1, 33)), 0, false, 1),
            (Some((1, 35)), 60, true, 30), (Some((1, 36)), 10, false, 10), (Some((1, 35)), 0, false, 1),
            (None, 10, false, 30), (None, 60, false, 60), (None, 0, false, 30),
        ];
        for (version, m, gate, want) in table {
            assert_eq!(
                of_kill(ev, pod(30), None, &cfg(m, gate), version),
                Some(S(want)),
                "{version:?} M={m} gate={gate}"
            );
        }
        assert_eq!(
            of_kill(ev, pod(30), None, &KubeletConfig::default(), Some((1, 35))),
            Some(S(30))
        );
    }

    #[test]
    fn node_shutdown_by_priority_band() {
        let sd = Some(Kill::Pod(PodKill::NodeShutdown));
        let cfg = KubeletConfig {
            shutdown_regular_pods: Some(S(20)),
            shutdown_critical_pods: Some(S(10)),
            ..KubeletConfig::default()
        };
        let v = Some((1, 33));
        assert_eq!(of_kill(sd, pod(30), None, &cfg, v), Some(S(20)));
        assert_eq!(of_kill(sd, pod(5), None, &cfg, v), Some(S(5)));
        let critical = PodGrace {
            own: Some(S(30)),
            priority: Some(SYSTEM_CRITICAL_PRIORITY),
        };
        assert_eq!(of_kill(sd, critical, None, &cfg, v), Some(S(10)));
        let bands = KubeletConfig {
            shutdown_by_priority: vec![(100_000, S(60)), (0, S(10)), (10_000, S(20))],
            ..KubeletConfig::default()
        };
        for (priority, want) in [
            (None, 10),
            (Some(-5), 10),
            (Some(10_000), 20),
            (Some(99_999), 20),
            (Some(1_000_000), 30),
        ] {
            let p = PodGrace {
                own: Some(S(30)),
                priority,
            };
            assert_eq!(
                of_kill(sd, p, None, &bands, v),
                Some(S(want)),
                "{priority:?}"
            );
        }
        // A band of 0: 1 s from 1.31, the pod's own before.
        let zero = KubeletConfig {
            shutdown_regular_pods: Some(S(0)),
            ..KubeletConfig::default()
        };
        assert_eq!(of_kill(sd, pod(30), None, &zero, Some((1, 31))), Some(S(1)));
        assert_eq!(
            of_kill(sd, pod(30), None, &zero, Some((1, 30))),
            Some(S(30))
        );
        // Not told: the pod's own.
        assert_eq!(
            of_kill(sd, pod(30), None, &KubeletConfig::default(), v),
            Some(S(30))
        );
    }

    #[test]
    fn a_force_delete_gets_a_second_from_1_31() {
        let del = Some(Kill::Pod(PodKill::Deletion));
        let cfg = KubeletConfig::default();
        let forced = Some(S(0));
        assert_eq!(
            of_kill(del, pod(30), forced, &cfg, Some((1, 31))),
            Some(S(1))
        );
        assert_eq!(
            of_kill(del, pod(30), forced, &cfg, Some((1, 30))),
            Some(S(30))
        );
        assert_eq!(of_kill(del, pod(30), forced, &cfg, None), Some(S(30)));
        assert_eq!(
            of_kill(del, pod(7), Some(S(7)), &cfg, Some((1, 35))),
            Some(S(7))
        );
        // Other kills: the pod's own.
        for k in [
            PodKill::ActiveDeadline,
            PodKill::Preemption,
            PodKill::Unrecognised,
        ] {
            assert_eq!(
                of_kill(Some(Kill::Pod(k)), pod(30), None, &cfg, None),
                Some(S(30))
            );
        }
    }
}
