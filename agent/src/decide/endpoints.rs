//! Endpoints first (`exitorder.io/wait-for-endpoints`): an app's wait is held until no
//! EndpointSlice lists its pod as ready, then for a settle time in which the consumers of the
//! slices (kube-proxy, ingress controllers, mesh balancers) reprogram, at most a maximum from
//! the wait's start and never past the grace deadline. Where nothing can tell the withdrawal
//! (no API server, or one of the kubelet's own kills, which withdraws nothing until the pod is
//! terminal: kubernetes#116965), the settle time alone, as the sleep it replaces.
//!
//! Which waits it holds: those of the pod's priority-0 containers (its apps); sidecars wait
//! for the apps as before, so the chain is endpoints, then apps, then sidecars.

use std::time::{Duration, Instant};

use exitorder_contract::annotation::{ENDPOINTS_MAX_WAIT, ENDPOINTS_SETTLE, WAIT_FOR_ENDPOINTS};
use exitorder_contract::endpoints::{DEFAULT_MAX_WAIT_MS, DEFAULT_SETTLE_MS, LIMIT_MS};

use crate::decide::bounds::Later as _;
use crate::decide::Reason;

/// What a pod asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// After the withdrawal; the whole wait where nothing tells it.
    pub settle: Duration,
    /// The longest the withdrawal is waited for, from the wait's start.
    pub max_wait: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            settle: Duration::from_millis(DEFAULT_SETTLE_MS),
            max_wait: Duration::from_millis(DEFAULT_MAX_WAIT_MS),
        }
    }
}

/// A pod's endpoints annotations that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{WAIT_FOR_ENDPOINTS}: {0:?} is neither \"true\" nor \"false\"")]
    Switch(String),
    #[error("{annotation}: {value:?} is not a duration ({why}; examples: 500ms, 2s)")]
    Duration {
        annotation: &'static str,
        value: String,
        why: String,
    },
    #[error("{annotation}: {value:?} is more than the limit of {}s", LIMIT_MS / 1000)]
    TooLong {
        annotation: &'static str,
        value: String,
    },
}

/// The pod's policy from its annotations, each looked up by name with `get`; `None` when it
/// did not ask (no annotation, or `"false"`).
pub fn policy<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Option<Policy>, PolicyError> {
    match get(WAIT_FOR_ENDPOINTS).map(str::trim) {
        None | Some("false") => return Ok(None),
        Some("true") => {}
        Some(other) => return Err(PolicyError::Switch(other.to_owned())),
    }
    let mut p = Policy::default();
    if let Some(v) = get(ENDPOINTS_SETTLE) {
        p.settle = duration(ENDPOINTS_SETTLE, v)?;
    }
    if let Some(v) = get(ENDPOINTS_MAX_WAIT) {
        p.max_wait = duration(ENDPOINTS_MAX_WAIT, v)?;
    }
    Ok(Some(p))
}

fn duration(annotation: &'static str, value: &str) -> Result<Duration, PolicyError> {
    let d = humantime::parse_duration(value.trim()).map_err(|e| PolicyError::Duration {
        annotation,
        value: value.to_owned(),
        why: e.to_string(),
    })?;
    if d > Duration::from_millis(LIMIT_MS) {
        return Err(PolicyError::TooLong {
            annotation,
            value: value.to_owned(),
        });
    }
    Ok(d)
}

/// What is known of the pod's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// No EndpointSlice lists the pod (no Service selects it): nothing to wait for.
    NotListed,
    /// Some slice lists it as ready, or the slices are being read: the withdrawal is waited
    /// for, up to the maximum.
    Listed,
    /// Every slice that listed it as ready no longer does, since then (when the agent saw it).
    Withdrawn(Instant),
    /// Nothing can tell: the API server is away, or the kill is one of the kubelet's own.
    Untold(Untold),
}

/// Why nothing tells the withdrawal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untold {
    /// The API server cannot be asked (none configured, down, or the read failed).
    NoApi,
    /// The pod is not being deleted through the API: a kill of the kubelet's own (eviction,
    /// node shutdown, `activeDeadlineSeconds`, preemption) or a restart, which the
    /// EndpointSlice controller does not see until a container exits.
    NotDeleted,
}

impl Untold {
    pub fn as_str(self) -> &'static str {
        match self {
            Untold::NoApi => "no_api",
            Untold::NotDeleted => "not_deleted",
        }
    }
}

/// An app's hold for its pod's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    pub policy: Policy,
    pub withdrawal: Withdrawal,
    /// The earliest the app's hook can have started, when the agent did not see its wait
    /// begin (it started during the pod's kill): the deletion's request. The maximum counts
    /// from there, not from the agent's first sight.
    pub began_by: Option<Instant>,
}

impl Gate {
    /// When a wait that began at `since` may go, and why: the withdrawal and the settle time
    /// after it, the settle time alone where nothing tells, at most the maximum.
    pub fn opens(&self, since: Instant) -> (Instant, Reason) {
        let since = self.began_by.map_or(since, |b| b.min(since));
        let most = since.later(self.policy.max_wait);
        let (at, reason) = match self.withdrawal {
            Withdrawal::NotListed => (since, Reason::Withdrawn),
            // Withdrawn before the wait began (the controller saw the deletion first): the
            // consumers have been reprogramming since.
            Withdrawal::Withdrawn(at) => (at.later(self.policy.settle), Reason::Withdrawn),
            Withdrawal::Listed => (most, Reason::MaxWait),
            Withdrawal::Untold(_) => (since.later(self.policy.settle), Reason::Settled),
        };
        if at > most {
            (most, Reason::MaxWait)
        } else {
            (at, reason)
        }
    }

    /// What the wait is held for, as said in the log and by `explain`.
    pub fn holding(&self) -> String {
        match self.withdrawal {
            Withdrawal::NotListed => "nothing (no EndpointSlice lists the pod)".to_owned(),
            Withdrawal::Listed => {
                "the pod's endpoints (an EndpointSlice lists it as ready)".to_owned()
            }
            Withdrawal::Withdrawn(_) => format!(
                "the settle time ({}) after the pod's endpoints were withdrawn",
                humantime::format_duration(self.policy.settle)
            ),
            Withdrawal::Untold(why) => format!(
                "the settle time ({}): the withdrawal cannot be told ({})",
                humantime::format_duration(self.policy.settle),
                why.as_str()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn pairs<'a>(v: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> + 'a {
        move |name| v.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    #[test]
    fn a_pod_asks_with_the_switch_and_may_tune_both_times() {
        assert_eq!(policy(pairs(&[])), Ok(None));
        assert_eq!(policy(pairs(&[(WAIT_FOR_ENDPOINTS, "false")])), Ok(None));
        assert_eq!(
            policy(pairs(&[(WAIT_FOR_ENDPOINTS, "true")])),
            Ok(Some(Policy::default()))
        );
        assert_eq!(
            policy(pairs(&[
                (WAIT_FOR_ENDPOINTS, "true"),
                (ENDPOINTS_SETTLE, "1500ms"),
                (ENDPOINTS_MAX_WAIT, "1m")
            ])),
            Ok(Some(Policy {
                settle: ms(1500),
                max_wait: ms(60_000)
            }))
        );
        // Times without the switch ask for nothing.
        assert_eq!(policy(pairs(&[(ENDPOINTS_SETTLE, "soon")])), Ok(None));
    }

    #[test]
    fn bad_annotations_are_named() {
        let e = policy(pairs(&[(WAIT_FOR_ENDPOINTS, "yes")])).unwrap_err();
        assert!(e.to_string().contains(WAIT_FOR_ENDPOINTS), "{e}");
        let e = policy(pairs(&[
            (WAIT_FOR_ENDPOINTS, "true"),
            (ENDPOINTS_SETTLE, "soon"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains(ENDPOINTS_SETTLE), "{e}");
        let e = policy(pairs(&[
            (WAIT_FOR_ENDPOINTS, "true"),
            (ENDPOINTS_MAX_WAIT, "1h"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("limit of 300s"), "{e}");
    }

    fn withdrawal(since: Instant) -> impl proptest::strategy::Strategy<Value = Withdrawal> {
        use proptest::prelude::*;
        prop_oneof![
            Just(Withdrawal::NotListed),
            Just(Withdrawal::Listed),
            (0u64..20_000).prop_map(move |ms_| Withdrawal::Withdrawn(since + ms(ms_) - ms(5_000))),
            Just(Withdrawal::Untold(Untold::NoApi)),
            Just(Withdrawal::Untold(Untold::NotDeleted)),
        ]
    }

    proptest::proptest! {
        /// Whatever the slices say and the pod asked: the gate opens by its own rule (at once
        /// for a pod no slice lists, the settle time after a withdrawal, the settle time from
        /// the wait's start where nothing tells) unless the maximum from the wait's start
        /// comes first, and then at the maximum, said as `max_wait`.
        #[test]
        fn the_gate_opens_within_its_bounds(
            settle in 0u64..60_000,
            max_wait in 0u64..120_000,
            w in withdrawal(Instant::now() + ms(10_000)),
        ) {
            let since = Instant::now() + ms(10_000);
            let policy = Policy { settle: ms(settle), max_wait: ms(max_wait) };
            let (at, why) = Gate { policy, withdrawal: w, began_by: None }.opens(since);
            let most = since + ms(max_wait);
            // When the gate would open by its own rule, the maximum aside.
            let own = match w {
                Withdrawal::NotListed => Some(since),
                Withdrawal::Withdrawn(t) => Some(t + ms(settle)),
                Withdrawal::Untold(_) => Some(since + ms(settle)),
                Withdrawal::Listed => None,
            };
            match own {
                Some(o) if o <= most => {
                    proptest::prop_assert_eq!(at, o);
                    proptest::prop_assert_ne!(why, Reason::MaxWait);
                }
                _ => proptest::prop_assert_eq!((at, why), (most, Reason::MaxWait)),
            }
        }
    }

    #[test]
    fn when_the_gate_opens() {
        // Some seconds after the clock's start, however freshly the machine booted.
        let since = Instant::now() + ms(10_000);
        let policy = Policy {
            settle: ms(2000),
            max_wait: ms(10_000),
        };
        let gate = |withdrawal| Gate {
            policy,
            withdrawal,
            began_by: None,
        };
        #[rustfmt::skip]
        let table = [
            ("no Service selects the pod", Withdrawal::NotListed, since, Reason::Withdrawn),
            ("withdrawn during the wait", Withdrawal::Withdrawn(since + ms(300)), since + ms(2300), Reason::Withdrawn),
            ("withdrawn before the wait", Withdrawal::Withdrawn(since - ms(500)), since + ms(1500), Reason::Withdrawn),
            ("withdrawn long before", Withdrawal::Withdrawn(since - ms(5000)), since - ms(3000), Reason::Withdrawn),
            ("still listed", Withdrawal::Listed, since + ms(10_000), Reason::MaxWait),
            ("withdrawn late", Withdrawal::Withdrawn(since + ms(9000)), since + ms(10_000), Reason::MaxWait),
            ("no API server", Withdrawal::Untold(Untold::NoApi), since + ms(2000), Reason::Settled),
            ("the kubelet's own kill", Withdrawal::Untold(Untold::NotDeleted), since + ms(2000), Reason::Settled),
        ];
        for (what, w, at, reason) in table {
            assert_eq!(gate(w).opens(since), (at, reason), "{what}");
        }
        // An agent started during the kill counts the maximum from the deletion's request.
        let late = Gate {
            policy,
            withdrawal: Withdrawal::Listed,
            began_by: Some(since - ms(4000)),
        };
        assert_eq!(late.opens(since), (since + ms(6000), Reason::MaxWait));
    }
}
