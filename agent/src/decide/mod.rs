//! The exit decision: a pure function from what the runtime (and, when present, the API
//! server) says about a pod to whether one waiting container may exit now.
//!
//! Kept free of I/O so every rule is tested by tables, and so an allow never waits on anything
//! but the facts already in hand.
//!
//! Parts:
//! - [`bounds`]: numbers from pods, bounded before arithmetic;
//! - [`endpoints`]: an app's hold for its pod's endpoints to be withdrawn;
//! - [`priority`]: exit priorities: annotation, env, presets;
//! - [`restart`]: whether the kubelet starts a container again;
//! - [`stoporder`]: the kubelet's stop order for native sidecars.

pub mod bounds;
pub mod endpoints;
pub mod priority;
pub mod restart;
pub mod stoporder;

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use crate::decide::bounds::Later as _;
use crate::decide::stoporder::StopOrder;

/// A container attempt's state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// One container attempt of a pod. The kubelet creates a new attempt (same name, attempt + 1)
/// on every restart and keeps exited ones around, so a pod can list a name several times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub name: String,
    pub attempt: u32,
    /// Runtime creation time (ns since the epoch); breaks ties between equal attempt numbers.
    pub created_at: i64,
    pub state: RunState,
    pub priority: u8,
}

/// What is known about a pod when deciding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub attempts: Vec<Attempt>,
    /// Containers whose exit priority is not known yet (their env was not read, or reading
    /// it failed): until it is, no wait of the pod is released by order, only by the
    /// deadline, since any of them might be one a wait must wait for.
    pub unknown: Vec<String>,
    pub deletion: Deletion,
    /// When waiting must end regardless of order: the grace deadline minus the reserve the
    /// sidecar needs to drain before the kubelet's SIGKILL.
    pub deadline: Option<Instant>,
    /// The kubelet's own stop order (native sidecars): no container waits for one the
    /// kubelet stops only after it.
    pub stop_order: StopOrder,
    /// The pod asked that its apps (priority 0) wait for its endpoints' withdrawal: what is
    /// known of it.
    pub endpoints: Option<endpoints::Gate>,
}

/// Whether the pod is going away, which is what makes exit order matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// The whole pod is being killed, or nothing says otherwise: a deletion through the API,
    /// one of the kubelet's own kills (which keep the pod `Running` in the API), or no API
    /// server to ask. An exit file is only written by a preStop hook, and most preStops run
    /// because the pod is going away.
    Deleting,
    /// The API server does not show the pod going away, which alone proves nothing (the
    /// kubelet keeps a pod `Running` through its own kills, see [`crate::kubelet`]). A wait
    /// is allowed early only for a container in `restarting`: the kubelet's own word that it
    /// kills that one container while the pod stays (a liveness or startup probe failure, an
    /// in-place update), read with a read asked after the wait began (the value: when that
    /// read was asked), and once the wait is `settle` old (a deletion the watch has not
    /// delivered yet). Every other wait is ordered.
    NotDeleting {
        settle: Duration,
        restarting: BTreeMap<String, Instant>,
    },
}

/// Why an exit was allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Every lower-priority container has exited.
    Ordered,
    /// The kubelet restarts (or kills) this one container while the pod stays: a liveness
    /// or startup probe failure, an in-place update; its own word says so.
    NotTerminating,
    /// The grace deadline minus the reserve has come.
    Deadline,
    /// The runtime does not know the pod or the container: fail open.
    Unknown,
    /// An app whose pod waits for its endpoints: no EndpointSlice lists the pod as ready
    /// (or none ever did), and the settle time after the withdrawal passed.
    Withdrawn,
    /// An app whose pod waits for its endpoints, where nothing tells the withdrawal (no API
    /// server, the kubelet's own kill): the settle time passed.
    Settled,
    /// An app whose pod waits for its endpoints: the withdrawal was not seen within the
    /// pod's maximum wait.
    MaxWait,
}

impl Reason {
    pub const ALL: [Reason; 7] = [
        Reason::Ordered,
        Reason::NotTerminating,
        Reason::Deadline,
        Reason::Unknown,
        Reason::Withdrawn,
        Reason::Settled,
        Reason::MaxWait,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Ordered => "ordered",
            Reason::NotTerminating => "not_terminating",
            Reason::Deadline => "deadline",
            Reason::Unknown => "unknown",
            Reason::Withdrawn => "withdrawn",
            Reason::Settled => "settled",
            Reason::MaxWait => "max_wait",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow(Reason),
    /// Keep waiting: these lower-priority containers still run; decide again when one exits
    /// or at `until` (the deadline, or the end of the settle time of a pod not deleted).
    Wait {
        blocked_by: Vec<String>,
        until: Option<Instant>,
    },
}

/// The newest attempt of each container name, in first-seen order.
pub fn newest_attempts(attempts: &[Attempt]) -> Vec<&Attempt> {
    newest_by(attempts, |a| (a.name.as_str(), a.attempt, a.created_at))
}

/// The newest of each name among `items`, in first-seen order, by `key` = (name, attempt,
/// creation time): the same rule for the runtime's containers and for decided attempts.
pub fn newest_by<T>(items: &[T], key: impl Fn(&T) -> (&str, u32, i64)) -> Vec<&T> {
    let mut newest: Vec<&T> = Vec::new();
    for item in items {
        let (name, attempt, created_at) = key(item);
        match newest.iter_mut().find(|n| key(n).0 == name) {
            Some(n) => {
                let (_, n_attempt, n_created) = key(n);
                if (attempt, created_at) > (n_attempt, n_created) {
                    *n = item;
                }
            }
            None => newest.push(item),
        }
    }
    newest
}

/// The lower-priority containers (newest attempts) that may still run, apart from those the
/// kubelet stops only after `me` (see [`beyond_stop_order`]). Created-but-never-started
/// containers do not block: the kubelet starts nothing in a pod that is being deleted.
/// Unknown state may still be running, so it blocks until the deadline.
fn blockers(newest: &[&Attempt], me: &Attempt, order: &StopOrder) -> Vec<String> {
    lower_and_running(newest, me)
        .filter(|a| !order.stops_after(&me.name, &a.name))
        .map(|a| a.name.clone())
        .collect()
}

fn lower_and_running<'a>(
    newest: &'a [&'a Attempt],
    me: &'a Attempt,
) -> impl Iterator<Item = &'a Attempt> + 'a {
    newest
        .iter()
        .copied()
        .filter(move |a| a.priority < me.priority)
        .filter(|a| matches!(a.state, RunState::Running | RunState::Unknown))
}

/// The containers `waiting` would still be waiting for, ignoring deadlines: what a deadline
/// allow left running.
pub fn still_running(pod: &PodFacts, waiting: &str) -> Vec<String> {
    let newest = newest_attempts(&pod.attempts);
    match newest.iter().find(|a| a.name == waiting) {
        Some(me) => blockers(&newest, me, &pod.stop_order),
        None => Vec::new(),
    }
}

/// The lower-priority containers `waiting` does not wait for because the kubelet stops them
/// only after it (native sidecars): waiting for them would hold the pod to its deadline.
pub fn beyond_stop_order(pod: &PodFacts, waiting: &str) -> Vec<String> {
    let newest = newest_attempts(&pod.attempts);
    match newest.iter().find(|a| a.name == waiting) {
        Some(me) => lower_and_running(&newest, me)
            .filter(|a| pod.stop_order.stops_after(&me.name, &a.name))
            .map(|a| a.name.clone())
            .collect(),
        None => Vec::new(),
    }
}

/// Decides whether container `waiting`, whose exit file appeared at `since`, may exit at `now`.
/// `pod` is `None` when the runtime has no such pod.
pub fn decide(pod: Option<&PodFacts>, waiting: &str, since: Instant, now: Instant) -> Verdict {
    let Some(pod) = pod else {
        return Verdict::Allow(Reason::Unknown);
    };
    let newest = newest_attempts(&pod.attempts);
    let Some(me) = newest.iter().find(|a| a.name == waiting) else {
        return Verdict::Allow(Reason::Unknown);
    };
    // An exit file left by an attempt that is gone has nobody behind it to hold.
    if me.state == RunState::Exited {
        return Verdict::Allow(Reason::Unknown);
    }
    let mut settled_at = None;
    if let Deletion::NotDeleting { settle, restarting } = &pod.deletion {
        let at = since.later(*settle);
        if now >= at && restarting.get(waiting).is_some_and(|c| *c >= since) {
            return Verdict::Allow(Reason::NotTerminating);
        }
        // Without the confirmation the agent is asking for, the next decision comes with
        // its answer.
        settled_at = (now < at).then_some(at);
    }
    let mut blocked_by = blockers(&newest, me, &pod.stop_order);
    blocked_by.extend(
        pod.unknown
            .iter()
            .map(|name| format!("{name} (exit priority not known yet)")),
    );
    // An app of a pod that waits for its endpoints: once nothing else holds it, the
    // withdrawal does.
    let gate = pod
        .endpoints
        .filter(|_| me.priority == 0 && blocked_by.is_empty())
        .map(|g| (g, g.opens(since)));
    if let Some((g, (opens, _))) = gate {
        if now < opens {
            blocked_by.push(g.holding());
            settled_at = Some(settled_at.map_or(opens, |s: Instant| s.min(opens)));
        }
    }
    if blocked_by.is_empty() {
        return Verdict::Allow(gate.map_or(Reason::Ordered, |(_, (_, why))| why));
    }
    match pod.deadline {
        Some(d) if now >= d => Verdict::Allow(Reason::Deadline),
        deadline => Verdict::Wait {
            blocked_by,
            until: [deadline, settled_at].into_iter().flatten().min(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::RunState::{Created, Exited, Running, Unknown};
    use super::*;
    use std::time::Duration;

    fn c(name: &str, attempt: u32, state: RunState, priority: u8) -> Attempt {
        Attempt {
            name: name.to_owned(),
            attempt,
            created_at: i64::from(attempt) * 1000,
            state,
            priority,
        }
    }

    fn pod(attempts: Vec<Attempt>, deadline: Option<Instant>) -> PodFacts {
        PodFacts {
            attempts,
            unknown: Vec::new(),
            deletion: Deletion::Deleting,
            deadline,
            stop_order: StopOrder::default(),
            endpoints: None,
        }
    }

    fn restarting(name: &str, at: Instant) -> BTreeMap<String, Instant> {
        BTreeMap::from([(name.to_owned(), at)])
    }

    fn allow(r: Reason) -> Verdict {
        Verdict::Allow(r)
    }

    fn wait(blocked: &[&str], until: Option<Instant>) -> Verdict {
        Verdict::Wait {
            blocked_by: blocked.iter().map(|s| s.to_string()).collect(),
            until,
        }
    }

    #[test]
    fn an_app_of_a_pod_waiting_for_its_endpoints_is_held_by_them() {
        use endpoints::{Gate, Policy, Withdrawal};
        let now = Instant::now();
        let policy = Policy {
            settle: Duration::from_secs(2),
            max_wait: Duration::from_secs(10),
        };
        let mut p = pod(
            vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1)],
            Some(now + Duration::from_secs(25)),
        );
        p.endpoints = Some(Gate {
            policy,
            withdrawal: Withdrawal::Listed,
            began_by: None,
        });
        match decide(Some(&p), "app", now, now) {
            Verdict::Wait { blocked_by, until } => {
                assert_eq!(until, Some(now + Duration::from_secs(10)));
                assert!(blocked_by[0].contains("endpoints"), "{blocked_by:?}");
            }
            v => panic!("{v:?}"),
        }
        // The sidecar still waits for the app, not for the endpoints.
        assert!(
            matches!(decide(Some(&p), "proxy", now, now), Verdict::Wait { blocked_by, .. } if blocked_by == ["app"])
        );
        let withdrawn = now + Duration::from_millis(300);
        p.endpoints = Some(Gate {
            policy,
            withdrawal: Withdrawal::Withdrawn(withdrawn),
            began_by: None,
        });
        let open = withdrawn + Duration::from_secs(2);
        assert!(
            matches!(decide(Some(&p), "app", now, now), Verdict::Wait { until: Some(u), .. } if u == open)
        );
        assert_eq!(decide(Some(&p), "app", now, open), allow(Reason::Withdrawn));
        // The grace deadline bounds it whatever the pod asked.
        p.deadline = Some(now + Duration::from_secs(1));
        p.endpoints = Some(Gate {
            policy,
            withdrawal: Withdrawal::Listed,
            began_by: None,
        });
        assert_eq!(
            decide(Some(&p), "app", now, now + Duration::from_secs(1)),
            allow(Reason::Deadline)
        );
        // Without the pod's ask, an app goes at once.
        p.endpoints = None;
        assert_eq!(decide(Some(&p), "app", now, now), allow(Reason::Ordered));
    }

    #[test]
    fn ordering_table() {
        let now = Instant::now();
        let later = now + Duration::from_secs(20);
        let d = Some(later);
        #[rustfmt::skip]
        let table: Vec<(&str, Vec<Attempt>, &str, Verdict)> = vec![
            ("two levels, main running",
             vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1)], "proxy", wait(&["app"], d)),
            ("two levels, main exited",
             vec![c("app", 0, Exited, 0), c("proxy", 0, Running, 1)], "proxy", allow(Reason::Ordered)),
            ("main itself never waits",
             vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1)], "app", allow(Reason::Ordered)),
            ("three levels, middle waits for bottom",
             vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1), c("logs", 0, Running, 2)], "proxy", wait(&["app"], d)),
            ("three levels, top waits for both",
             vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1), c("logs", 0, Running, 2)], "logs", wait(&["app", "proxy"], d)),
            ("three levels, top waits for middle",
             vec![c("app", 0, Exited, 0), c("proxy", 0, Running, 1), c("logs", 0, Running, 2)], "logs", wait(&["proxy"], d)),
            ("three levels, all below exited",
             vec![c("app", 0, Exited, 0), c("proxy", 0, Exited, 1), c("logs", 0, Running, 2)], "logs", allow(Reason::Ordered)),
            ("equal priorities do not wait for each other",
             vec![c("a", 0, Exited, 0), c("p1", 0, Running, 1), c("p2", 0, Running, 1)], "p1", allow(Reason::Ordered)),
            ("unlisted containers are priority 0",
             vec![c("app", 0, Running, 0), c("extra", 0, Running, 0), c("proxy", 0, Running, 1)], "proxy", wait(&["app", "extra"], d)),
            ("restarted main: the newest attempt runs",
             vec![c("app", 0, Exited, 0), c("app", 1, Running, 0), c("proxy", 0, Running, 1)], "proxy", wait(&["app"], d)),
            ("restarted main: the newest attempt exited",
             vec![c("app", 1, Exited, 0), c("app", 0, Exited, 0), c("proxy", 0, Running, 1)], "proxy", allow(Reason::Ordered)),
            ("restarted sidecar: the newest attempt decides",
             vec![c("app", 0, Running, 0), c("proxy", 0, Exited, 1), c("proxy", 1, Running, 1)], "proxy", wait(&["app"], d)),
            ("created but never started does not block",
             vec![c("app", 0, Created, 0), c("proxy", 0, Running, 1)], "proxy", allow(Reason::Ordered)),
            ("unknown state blocks",
             vec![c("app", 0, Unknown, 0), c("proxy", 0, Running, 1)], "proxy", wait(&["app"], d)),
            ("waiting container unknown to the runtime",
             vec![c("app", 0, Running, 0)], "proxy", allow(Reason::Unknown)),
            ("waiting container already exited",
             vec![c("app", 0, Running, 0), c("proxy", 0, Exited, 1)], "proxy", allow(Reason::Unknown)),
        ];
        for (name, attempts, waiting, want) in table {
            let p = pod(attempts, d);
            assert_eq!(decide(Some(&p), waiting, now, now), want, "{name}");
        }
    }

    #[test]
    fn no_wait_for_a_container_the_kubelet_stops_later() {
        let now = Instant::now();
        let d = Some(now + Duration::from_secs(20));
        // Declared: istio-proxy, then logs. The kubelet stops app, then logs, then
        // istio-proxy. Priorities that contradict it: logs 2 above istio-proxy 1, and a main
        // container above both.
        let mut p = pod(
            vec![
                c("app", 0, Running, 0),
                c("batch", 0, Running, 3),
                c("istio-proxy", 0, Running, 1),
                c("logs", 0, Running, 2),
            ],
            d,
        );
        p.stop_order = StopOrder::new(vec!["istio-proxy".into(), "logs".into()]);
        assert_eq!(decide(Some(&p), "logs", now, now), wait(&["app"], d));
        assert_eq!(beyond_stop_order(&p, "logs"), vec!["istio-proxy"]);
        assert_eq!(decide(Some(&p), "batch", now, now), wait(&["app"], d));
        assert_eq!(beyond_stop_order(&p, "batch"), vec!["istio-proxy", "logs"]);
        // What the order allows is still waited for.
        assert_eq!(decide(Some(&p), "istio-proxy", now, now), wait(&["app"], d));
        assert!(beyond_stop_order(&p, "istio-proxy").is_empty());
        p.attempts[0].state = Exited;
        assert_eq!(decide(Some(&p), "logs", now, now), allow(Reason::Ordered));
        // Without the order, the same priorities wait for the sidecar.
        p.stop_order = StopOrder::default();
        assert_eq!(
            decide(Some(&p), "logs", now, now),
            wait(&["istio-proxy"], d)
        );
    }

    #[test]
    fn deadline_releases_exactly_when_reached() {
        let now = Instant::now();
        let p = pod(
            vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1)],
            Some(now + Duration::from_secs(5)),
        );
        assert!(matches!(
            decide(Some(&p), "proxy", now, now),
            Verdict::Wait { .. }
        ));
        let at = now + Duration::from_secs(5);
        assert_eq!(decide(Some(&p), "proxy", now, at), allow(Reason::Deadline));
        assert_eq!(
            decide(Some(&p), "proxy", now, at + Duration::from_secs(1)),
            allow(Reason::Deadline)
        );
    }

    #[test]
    fn no_deadline_waits_without_bound() {
        let now = Instant::now();
        let p = pod(
            vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1)],
            None,
        );
        assert_eq!(decide(Some(&p), "proxy", now, now), wait(&["app"], None));
    }

    #[test]
    fn ordered_wins_over_deadline() {
        let now = Instant::now();
        let p = pod(
            vec![c("app", 0, Exited, 0), c("proxy", 0, Running, 1)],
            Some(now),
        );
        assert_eq!(decide(Some(&p), "proxy", now, now), allow(Reason::Ordered));
    }

    #[test]
    fn an_unknown_priority_holds_the_wait_until_known_or_the_deadline() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(5);
        // Everything else exited: by order alone the proxy would go, but the priority of
        // `shipper` (from an env that could not be read) might be lower than the proxy's.
        let mut p = pod(
            vec![
                c("app", 0, Exited, 0),
                c("proxy", 0, Running, 1),
                c("shipper", 0, Running, 0),
            ],
            Some(deadline),
        );
        p.attempts[2].state = Running;
        p.unknown = vec!["shipper".into()];
        assert_eq!(
            decide(Some(&p), "proxy", now, now),
            Verdict::Wait {
                blocked_by: vec![
                    "shipper".into(),
                    "shipper (exit priority not known yet)".into()
                ],
                until: Some(deadline)
            }
        );
        assert_eq!(
            decide(Some(&p), "proxy", now, deadline),
            allow(Reason::Deadline)
        );
        // Its own priority unknown: held just the same.
        p.attempts[2].state = Exited;
        p.unknown = vec!["proxy".into()];
        assert!(matches!(
            decide(Some(&p), "proxy", now, now),
            Verdict::Wait { .. }
        ));
        p.unknown.clear();
        assert_eq!(decide(Some(&p), "proxy", now, now), allow(Reason::Ordered));
    }

    #[test]
    fn unknown_pod_fails_open() {
        assert_eq!(
            decide(None, "proxy", Instant::now(), Instant::now()),
            allow(Reason::Unknown)
        );
    }

    #[test]
    fn a_restart_the_kubelet_named_allows_once_settled() {
        let since = Instant::now();
        let settle = Duration::from_millis(250);
        let mut p = pod(
            vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1)],
            Some(since + Duration::from_secs(20)),
        );
        p.deletion = Deletion::NotDeleting {
            settle,
            restarting: restarting("proxy", since),
        };
        // Inside the settle time the wait is ordered, and decided again when it ends.
        assert_eq!(
            decide(Some(&p), "proxy", since, since + Duration::from_millis(100)),
            wait(&["app"], Some(since + settle))
        );
        assert_eq!(
            decide(Some(&p), "proxy", since, since + settle),
            allow(Reason::NotTerminating)
        );
        p.deletion = Deletion::NotDeleting {
            settle: Duration::ZERO,
            restarting: restarting("proxy", since + Duration::from_millis(3)),
        };
        assert_eq!(
            decide(Some(&p), "proxy", since, since + Duration::from_millis(5)),
            allow(Reason::NotTerminating)
        );
    }

    #[test]
    fn a_restart_needs_the_kubelets_word_for_that_container_read_after_the_wait_began() {
        let since = Instant::now() + Duration::from_secs(1);
        let mut p = pod(
            vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1)],
            Some(since + Duration::from_secs(20)),
        );
        for confirmed in [
            BTreeMap::new(),
            restarting("proxy", since - Duration::from_millis(1)),
            restarting("other", since),
        ] {
            p.deletion = Deletion::NotDeleting {
                settle: Duration::ZERO,
                restarting: confirmed.clone(),
            };
            assert_eq!(
                decide(Some(&p), "proxy", since, since + Duration::from_secs(1)),
                wait(&["app"], Some(since + Duration::from_secs(20))),
                "{confirmed:?}"
            );
        }
    }

    #[test]
    fn pod_not_deleted_with_nothing_to_wait_for_is_ordered() {
        let since = Instant::now();
        let mut p = pod(
            vec![c("app", 0, Exited, 0), c("proxy", 0, Running, 1)],
            None,
        );
        p.deletion = Deletion::NotDeleting {
            settle: Duration::from_secs(1),
            restarting: BTreeMap::new(),
        };
        assert_eq!(
            decide(Some(&p), "proxy", since, since),
            allow(Reason::Ordered)
        );
    }

    #[test]
    fn earlier_deadline_than_settle_is_the_wake_time() {
        let since = Instant::now();
        let mut p = pod(
            vec![c("app", 0, Running, 0), c("proxy", 0, Running, 1)],
            Some(since + Duration::from_millis(50)),
        );
        p.deletion = Deletion::NotDeleting {
            settle: Duration::from_secs(1),
            restarting: restarting("proxy", since),
        };
        assert_eq!(
            decide(Some(&p), "proxy", since, since),
            wait(&["app"], Some(since + Duration::from_millis(50)))
        );
    }

    #[test]
    fn newest_attempt_ties_broken_by_creation_time() {
        let mut old = c("app", 2, Running, 0);
        old.created_at = 10;
        let mut new = c("app", 2, Exited, 0);
        new.created_at = 20;
        let attempts = [old, new];
        let n = newest_attempts(&attempts);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].state, Exited);
    }
}
