//! How `demo --kill` ends the pod: a deletion, or one of the kubelet's own kills.

use crate::kubelet::Kill;

/// The ways `demo` can end the pod ([`super::DemoArgs::kill`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoKill {
    /// `kubectl delete`.
    Deletion,
    /// Node-pressure eviction past a soft threshold.
    SoftEviction,
    /// Node-pressure eviction past a hard threshold (1 s).
    HardEviction,
    /// Graceful node shutdown.
    NodeShutdown,
    /// `activeDeadlineSeconds` passed.
    ActiveDeadline,
    /// Preempted by the kubelet to admit a critical pod.
    Preemption,
}

impl DemoKill {
    /// The test bed's kill, and the deletion's own grace period, for `--grace-period`.
    pub(super) fn with_grace(self, grace: Option<i64>) -> anyhow::Result<(Kill, Option<i64>)> {
        let none = |kill: Kill| match grace {
            Some(_) => anyhow::bail!(
                "--grace-period does not apply to --kill {}: it takes the pod's own",
                kill.name()
            ),
            None => Ok((kill, None)),
        };
        match self {
            DemoKill::Deletion => Ok((Kill::Deletion, grace)),
            DemoKill::SoftEviction => Ok((
                Kill::Eviction {
                    hard: false,
                    max_pod_grace_seconds: grace.unwrap_or(i64::MAX),
                },
                None,
            )),
            DemoKill::HardEviction => none(Kill::Eviction {
                hard: true,
                max_pod_grace_seconds: 0,
            }),
            DemoKill::NodeShutdown => Ok((
                Kill::NodeShutdown {
                    grace_seconds: grace.unwrap_or(i64::MAX),
                },
                None,
            )),
            DemoKill::ActiveDeadline => none(Kill::ActiveDeadline),
            DemoKill::Preemption => none(Kill::Preemption),
        }
    }
}
