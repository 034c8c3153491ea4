//! Why the kubelet kills a whole pod, and what each kind of kill changes: its grace period,
//! the Event it records first, and the status it reports once every container stopped. The
//! kill itself is the same for all of them (`termination`: every running container at once,
//! each with its Killing Event and preStop hook), as it is in the kubelet: every kind ends in
//! `killPodFunc` (`pod_workers.go` `UpdatePod` with `SyncPodKill`), which runs
//! `kuberuntime_manager.go` `KillPod` with the kind's grace override.

use serde::Serialize;

use super::api::{self, reasons, ApiStatus, DisruptionTarget, EventType};
use super::plan::{ContainerPlan, Kind};
use crate::node::TestbedError;

/// A kubelet's version, (major, minor): which of its grace rules a kill follows.
pub type KubeletVersion = (u32, u32);
/// The newest kubelet whose rules the test bed plays, the default.
pub const NEWEST_KUBELET: KubeletVersion = (1, 36);
/// The oldest.
pub const OLDEST_KUBELET: KubeletVersion = (1, 28);

/// The kind of whole-pod kill ([`DeleteOptions::kill`](super::DeleteOptions)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Kill {
    /// A deletion through the API (`deletionTimestamp`): the test writes the API object
    /// itself; the kubelet only records its Killing Events. Its grace is the deletion's
    /// (`DeleteOptions::grace_period`) or the pod's.
    #[default]
    Deletion,
    /// Node-pressure eviction (`eviction/eviction_manager.go` `evictPod`): `Evicted` (Warning)
    /// first; a hard threshold's grace is 1 s (`immediateEvictionGracePeriodSeconds`), a soft
    /// one's `evictionMaxPodGracePeriod` capped by the pod's own.
    Eviction {
        hard: bool,
        max_pod_grace_seconds: i64,
    },
    /// Graceful node shutdown (`nodeshutdown`): the Node's Ready condition goes False first,
    /// no Event of the pod's; `grace_seconds` is its priority group's (for regular pods
    /// `shutdownGracePeriod` less `shutdownGracePeriodCriticalPods`), capped by the pod's.
    NodeShutdown { grace_seconds: i64 },
    /// `activeDeadlineSeconds` passed (`active_deadline.go`): `DeadlineExceeded` (Normal)
    /// first; the pod's own grace.
    ActiveDeadline,
    /// Admission preemption for a critical pod (`preemption/preemption.go`): `Preempting`
    /// (Warning) first; the pod's own grace (no override).
    Preemption,
    /// A whole-pod kill with the pod's own grace whose Events the recorder all dropped (its
    /// QPS, the spam filter): no Event at all, not even Killing. Its status ends `Failed`
    /// without a reason: the status manager, unlike the recorder, drops nothing.
    Silent,
}

impl Kill {
    /// Its name in the timeline.
    pub fn name(self) -> &'static str {
        match self {
            Kill::Deletion => "deletion",
            Kill::Eviction { hard: true, .. } => "hard eviction",
            Kill::Eviction { hard: false, .. } => "soft eviction",
            Kill::NodeShutdown { .. } => "node shutdown",
            Kill::ActiveDeadline => "activeDeadlineSeconds",
            Kill::Preemption => "preemption",
            Kill::Silent => "silent kill",
        }
    }

    /// The grace period the containers get, for a pod whose own is `pod_grace`, on a kubelet
    /// of `version`; `deletion` is `kubectl delete --grace-period` (with `--force` when
    /// `force`), which only a deletion takes. Each kind's override, then
    /// `calculateEffectiveGracePeriod` (`pod_workers.go`), as the test bed's own reading of
    /// the kubelet; checked against `kubelet-rules/grace.tsv`.
    pub(crate) fn grace(
        self,
        pod_grace: i64,
        deletion: Option<i64>,
        force: bool,
        version: KubeletVersion,
    ) -> Result<i64, TestbedError> {
        if (deletion.is_some() || force) && self != Kill::Deletion {
            return Err(TestbedError::BadSpec(format!(
                "DeleteOptions::grace_period and force are a deletion's (kubectl delete \
                 --grace-period, --force); a {} sets its own grace",
                self.name()
            )));
        }
        if force && deletion != Some(0) {
            return Err(TestbedError::BadSpec(format!(
                "force is `kubectl delete --force --grace-period=0`: grace_period must be \
                 Some(0), not {deletion:?}"
            )));
        }
        if version > NEWEST_KUBELET {
            return Err(TestbedError::BadSpec(format!(
                "kubelet {}.{}: the test bed plays the kubelet's grace up to {}.{}",
                version.0, version.1, NEWEST_KUBELET.0, NEWEST_KUBELET.1
            )));
        }
        if version < OLDEST_KUBELET {
            return Err(TestbedError::BadSpec(format!(
                "kubelet {}.{}: the test bed plays the kubelet's grace from {}.{} on (before \
                 1.28 a kill's override came only after the preStop hook)",
                version.0, version.1, OLDEST_KUBELET.0, OLDEST_KUBELET.1
            )));
        }
        let overridden = match self {
            // The API server sets deletionGracePeriodSeconds: the deletion's, its 0 made 1
            // unless forced, else the spec's.
            Kill::Deletion if force => Some(0),
            Kill::Deletion => Some(deletion.map_or(pod_grace, |g| g.max(1))),
            // eviction_manager.go `synchronize`: `immediateEvictionGracePeriodSeconds` (1)
            // from 1.31 (kubernetes#124063), 0 before.
            Kill::Eviction { hard: true, .. } => Some(i64::from(version >= (1, 31))),
            // `synchronize`: `evictionMaxPodGracePeriod` (1.28-1.31, even above the pod's);
            // from 1.32 no more than the pod's own (AllowOverwriteTerminationGracePeriodSeconds
            // off, as by default).
            Kill::Eviction {
                hard: false,
                max_pod_grace_seconds,
            } if version < (1, 32) => Some(max_pod_grace_seconds),
            Kill::Eviction {
                hard: false,
                max_pod_grace_seconds,
            } => Some(max_pod_grace_seconds.min(pod_grace)),
            // nodeshutdown `killPods`: the group's seconds, or the pod's when it is not longer.
            Kill::NodeShutdown { grace_seconds } => Some(grace_seconds.min(pod_grace)),
            // No override: the pod's own.
            Kill::ActiveDeadline | Kill::Preemption | Kill::Silent => None,
        };
        // `calculateEffectiveGracePeriod`: an override of 0 stays 0 from 1.31 (its
        // `overridden` check), and became the spec's grace before; "no matter what, we
        // always supply a grace period of 1".
        let grace = match overridden {
            Some(0) if version < (1, 31) => pod_grace,
            Some(g) => g,
            None => pod_grace,
        };
        Ok(grace.max(1))
    }

    /// The Event the kill records about the pod before it kills anything: (reason, type,
    /// message).
    pub fn pod_event(self) -> Option<(&'static str, EventType, String)> {
        match self {
            // evictPod: `m.recorder.AnnotatedEventf(pod, annotations, v1.EventTypeWarning,
            // Reason, evictMsg)` before `m.killPodFunc`.
            Kill::Eviction { .. } => Some((
                reasons::EVICTED,
                EventType::Warning,
                api::memory_pressure_message(),
            )),
            // active_deadline.go `ShouldEvict`: `m.recorder.Eventf(pod, v1.EventTypeNormal,
            // reason, message)`.
            Kill::ActiveDeadline => Some((
                reasons::DEADLINE_EXCEEDED,
                EventType::Normal,
                api::DEADLINE_EXCEEDED_MESSAGE.to_owned(),
            )),
            // preemption.go: `c.recorder.Eventf(pod, v1.EventTypeWarning,
            // events.PreemptContainer, message)` before `c.killPodFunc`.
            Kill::Preemption => Some((
                reasons::PREEMPTING,
                EventType::Warning,
                api::PREEMPTION_MESSAGE.to_owned(),
            )),
            // nodeshutdown records no Event per pod; a deletion's comes from whoever deleted.
            Kill::Deletion | Kill::NodeShutdown { .. } | Kill::Silent => None,
        }
    }

    /// Whether each container's Killing Event is recorded (`killContainer` always records
    /// it; only [`Kill::Silent`] plays a recorder that dropped them).
    pub fn records_killing(self) -> bool {
        self != Kill::Silent
    }

    /// The status the kubelet reports once every container stopped (`mergePodStatus`
    /// withholds it until then); `None` for a deletion, whose API object the test writes.
    pub fn terminal_status(self) -> Option<ApiStatus> {
        let by_kubelet = |message: &str| {
            Some(DisruptionTarget {
                reason: reasons::TERMINATION_BY_KUBELET.to_owned(),
                message: message.to_owned(),
            })
        };
        let failed = |reason: &str, message: &str, disruption_target| ApiStatus {
            phase: "Failed".to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            disruption_target,
        };
        match self {
            Kill::Deletion => None,
            // evictPod's status func: Failed, `Reason`, evictMsg, and the DisruptionTarget
            // condition `synchronize` built (reason TerminationByKubelet, message evictMsg).
            Kill::Eviction { .. } => {
                let message = api::memory_pressure_message();
                Some(failed(reasons::EVICTED, &message, by_kubelet(&message)))
            }
            // nodeshutdown's status func: Failed, nodeShutdownReason, nodeShutdownMessage and
            // DisruptionTarget (TerminationByKubelet, nodeShutdownMessage).
            Kill::NodeShutdown { .. } => Some(failed(
                reasons::NODE_SHUTDOWN,
                api::NODE_SHUTDOWN_MESSAGE,
                by_kubelet(api::NODE_SHUTDOWN_MESSAGE),
            )),
            // kubelet.go `generateAPIPodStatus`: a PodSyncHandler's ShouldEvict sets Failed,
            // its reason and message; no DisruptionTarget.
            Kill::ActiveDeadline => Some(failed(
                reasons::DEADLINE_EXCEEDED,
                api::DEADLINE_EXCEEDED_MESSAGE,
                None,
            )),
            // preemption.go's status func.
            Kill::Preemption => Some(failed(
                reasons::PREEMPTING,
                api::PREEMPTION_MESSAGE,
                by_kubelet(api::PREEMPTION_CONDITION_MESSAGE),
            )),
            Kill::Silent => Some(ApiStatus::phase("Failed")),
        }
    }
}

/// Why the kubelet kills one container while the pod stays, and the Killing Event's message
/// (`kuberuntime_manager.go` `computePodActions` for main containers,
/// `computeInitContainerActions` for native sidecars).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContainerKill {
    Liveness,
    Startup,
    DefinitionChanged,
}

impl ContainerKill {
    pub(crate) fn message(self, c: &ContainerPlan, restarted: bool) -> String {
        let name = c.name.as_str();
        match (c.kind, self) {
            (Kind::Main, ContainerKill::Liveness) => api::liveness_failed(name, restarted),
            (Kind::Main, ContainerKill::Startup) => api::startup_failed(name, restarted),
            (Kind::Main, ContainerKill::DefinitionChanged) => api::definition_changed(name),
            (_, ContainerKill::Liveness) => api::init_liveness_failed(name),
            (_, ContainerKill::Startup) => api::init_startup_failed(name),
            (_, ContainerKill::DefinitionChanged) => api::init_definition_changed(name),
        }
    }

    /// `kuberuntime_container.go` `setTerminationGracePeriod`: a probe's own
    /// terminationGracePeriodSeconds for the kill it caused; else the pod's.
    pub(crate) fn grace(self, c: &ContainerPlan) -> Option<i64> {
        let probe = match self {
            ContainerKill::Liveness => c.liveness.as_ref(),
            ContainerKill::Startup => c.startup.as_ref(),
            ContainerKill::DefinitionChanged => None,
        };
        probe.and_then(|p| p.termination_grace_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row of `kubelet-rules/grace.tsv`, taken from the kubelet's source (the agent
    /// is checked against it too).
    #[test]
    fn every_row_of_the_upstream_table_holds() {
        for row in exitorder_kubelet_rules::GRACE.rows(5) {
            let line = row.line;
            let version = row.version(1);
            let [kill, _, pod, value, want, ..] = row.fields[..] else {
                unreachable!("rows(5)");
            };
            let pod: i64 = pod.parse().expect("the pod's grace");
            let n = || value.parse::<i64>().expect("a number of seconds");
            let (kill, deletion, force) = match kill {
                "deletion" if value == "force" => (Kill::Deletion, Some(0), true),
                "deletion" if value == "-" => (Kill::Deletion, None, false),
                "deletion" => (Kill::Deletion, Some(n()), false),
                "soft-eviction" => (
                    Kill::Eviction {
                        hard: false,
                        max_pod_grace_seconds: n(),
                    },
                    None,
                    false,
                ),
                "hard-eviction" => (
                    Kill::Eviction {
                        hard: true,
                        max_pod_grace_seconds: 0,
                    },
                    None,
                    false,
                ),
                "node-shutdown" => (Kill::NodeShutdown { grace_seconds: n() }, None, false),
                "active-deadline" => (Kill::ActiveDeadline, None, false),
                "preemption" => (Kill::Preemption, None, false),
                other => panic!("kill {other:?} in {line:?}"),
            };
            let got = kill.grace(pod, deletion, force, version).expect("a grace");
            assert_eq!(got, want.parse::<i64>().expect("seconds"), "row {line:?}");
        }
    }

    #[test]
    fn what_the_test_bed_does_not_play_is_refused() {
        let hard = Kill::Eviction {
            hard: true,
            max_pod_grace_seconds: 60,
        };
        assert!(hard.grace(30, Some(3), false, NEWEST_KUBELET).is_err());
        assert!(hard.grace(30, None, true, NEWEST_KUBELET).is_err());
        assert!(Kill::Deletion.grace(30, None, false, (1, 27)).is_err());
        assert!(Kill::Deletion.grace(30, None, false, (1, 37)).is_err());
        assert!(Kill::Deletion
            .grace(30, Some(5), true, NEWEST_KUBELET)
            .is_err());
        assert_eq!(
            Kill::Deletion
                .grace(30, Some(0), false, NEWEST_KUBELET)
                .ok(),
            Some(1)
        );
    }

    #[test]
    fn the_terminal_status_says_why() {
        let evicted = Kill::Eviction {
            hard: true,
            max_pod_grace_seconds: 0,
        }
        .terminal_status()
        .expect("a status");
        assert_eq!(evicted.phase, "Failed");
        assert_eq!(evicted.reason.as_deref(), Some("Evicted"));
        assert_eq!(
            evicted.disruption_target.map(|d| d.reason).as_deref(),
            Some("TerminationByKubelet")
        );
        let deadline = Kill::ActiveDeadline.terminal_status().expect("a status");
        assert!(deadline.disruption_target.is_none());
        assert_eq!(Kill::Deletion.terminal_status(), None);
        assert!(Kill::NodeShutdown { grace_seconds: 1 }
            .pod_event()
            .is_none());
        assert!(!Kill::Silent.records_killing() && Kill::Silent.pod_event().is_none());
    }
}
