//! What a decision knows about a pod, assembled from the node view, the API server's view
//! (when current) and the pod's pending waits. Pure: tested by tables, like the decision.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{ContainerEntry, EnvPriority, PodEntry};
use crate::decide::bounds::Later as _;
use crate::decide::endpoints::{self, Policy, PolicyError};
use crate::decide::priority::{self, PodPriorities, PriorityError};
use crate::decide::stoporder::{StopOrder, StopOrderError};
use crate::decide::{self, Attempt, Deletion, PodFacts};

/// Kubernetes' default terminationGracePeriodSeconds, used when nothing says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// A pod's containers with their priorities resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordered {
    pub attempts: Vec<Attempt>,
    /// Newest attempts whose priority is not known yet.
    pub unknown: Vec<String>,
    /// Why the pod is unordered, when its priorities are malformed.
    pub malformed: Option<PriorityError>,
}

/// The pod's priority annotation: the API server's copy when there is one (the pod's current
/// annotations), else the sandbox's (those it was created with).
pub fn pod_priorities(
    pod: &PodEntry,
    api_annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<Option<PodPriorities>, PriorityError> {
    match api_annotations {
        Some(a) => priority::from_annotations(a.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        None => priority::from_annotations(
            pod.sandbox
                .iter()
                .flat_map(|s| s.annotations.iter())
                .map(|(k, v)| (k.as_str(), v.as_str())),
        ),
    }
}

/// Whether the pod asked its apps to wait for its endpoints' withdrawal, and how: from the
/// same annotations as [`pod_priorities`], each looked up by name.
pub fn endpoints_policy(
    pod: &PodEntry,
    api_annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<Option<Policy>, PolicyError> {
    endpoints::policy(|name| match api_annotations {
        Some(a) => a.get(name).map(String::as_str),
        None => pod
            .sandbox
            .as_ref()
            .and_then(|s| s.annotations.get(name))
            .map(String::as_str),
    })
}

/// The kubelet's stop order: from the API server's pod spec when there is one (its init
/// containers with `restartPolicy: Always`), else from the webhook's annotation on the
/// sandbox. A malformed annotation gives no order (the priorities alone decide) and says why.
pub fn stop_order(
    pod: &PodEntry,
    api_native: Option<&[String]>,
) -> Result<StopOrder, StopOrderError> {
    if let Some(native) = api_native {
        return Ok(StopOrder::new(native.to_vec()));
    }
    pod.sandbox
        .iter()
        .flat_map(|s| {
            s.annotations
                .get(exitorder_contract::annotation::NATIVE_SIDECARS)
        })
        .next()
        .map_or(Ok(StopOrder::default()), |v| StopOrder::from_annotation(v))
}

/// The newest attempt of each container name.
pub(crate) fn newest(pod: &PodEntry) -> HashMap<&str, &ContainerEntry> {
    let mut out: HashMap<&str, &ContainerEntry> = HashMap::new();
    for c in pod.containers.values() {
        let key = (c.info.attempt, c.info.created_at);
        match out.get(c.info.name.as_str()) {
            Some(n) if (n.info.attempt, n.info.created_at) >= key => {}
            _ => {
                out.insert(c.info.name.as_str(), c);
            }
        }
    }
    out
}

/// Each container's priority: the annotation names it, else its env, else a preset. A
/// malformed annotation or env makes the whole pod unordered (every container 0): bad input
/// never holds a pod. A newest attempt whose env is not known yet, and that the annotation
/// does not name, has an unknown priority.
/// Native sidecars (`stop`) default to priority 1.
pub fn order(
    pod: &PodEntry,
    named: Result<Option<PodPriorities>, PriorityError>,
    stop: &StopOrder,
) -> Ordered {
    let (named, mut malformed) = match named {
        Ok(n) => (n, None),
        Err(e) => (None, Some(e)),
    };
    let newest = newest(pod);
    let mut unknown = Vec::new();
    let mut attempts = Vec::with_capacity(pod.containers.len());
    for c in pod.containers.values() {
        let is_newest = newest
            .get(c.info.name.as_str())
            .is_some_and(|n| n.info.id == c.info.id);
        let is_named = named.as_ref().is_some_and(|n| n.contains_key(&c.info.name));
        let env = if is_newest && !is_named {
            match &c.env {
                EnvPriority::Known(Ok(v)) => *v,
                EnvPriority::Known(Err(e)) => {
                    malformed.get_or_insert_with(|| e.clone());
                    None
                }
                EnvPriority::Unread | EnvPriority::Reading { .. } | EnvPriority::Failed { .. } => {
                    unknown.push(c.info.name.clone());
                    None
                }
            }
        } else {
            None
        };
        attempts.push(Attempt {
            name: c.info.name.clone(),
            attempt: c.info.attempt,
            created_at: c.info.created_at,
            state: c.info.state,
            priority: priority::resolve_as(
                &c.info.name,
                named.as_ref(),
                env,
                stop.is_native(&c.info.name),
            ),
        });
    }
    if malformed.is_some() {
        for a in &mut attempts {
            a.priority = 0;
        }
        unknown.clear();
    }
    // A stable order, whatever the map's: decisions and logs must not depend on it.
    attempts.sort_by(|a, b| {
        (&a.name, a.attempt, a.created_at).cmp(&(&b.name, b.attempt, b.created_at))
    });
    unknown.sort();
    Ordered {
        attempts,
        unknown,
        malformed,
    }
}

/// The containers whose newest attempt the view holds as exited although a newer attempt
/// may already run, apart from `waiting`'s. The kubelet may have restarted such a container
/// before it began stopping the pod (at `stopping`, no later than when the agent saw the
/// pod's first exit file), and the new attempt's events may be late (containerd 2.x's CRI
/// stream) or missing (polling). The kubelet starts nothing in a pod it is stopping, and no
/// attempt before the one before it ended, so an exit is its container's last when:
/// - the kernel told it after `stopping` (the attempt ran when the stopping began), or
/// - a listing of the pod asked after `stopping` shows no newer attempt (it would have).
pub fn unsettled_exits(pod: &PodEntry, stopping: Instant, waiting: &[&str]) -> Vec<String> {
    if pod.listed_at.is_some_and(|at| at >= stopping) {
        return Vec::new();
    }
    let mut out: Vec<String> = newest(pod)
        .into_values()
        .filter(|c| c.info.state == decide::RunState::Exited)
        .filter(|c| c.kernel_exit.is_none_or(|at| at < stopping))
        .filter(|c| !waiting.contains(&c.info.name.as_str()))
        .map(|c| c.info.name.clone())
        .collect();
    out.sort();
    out
}

/// Takes the newest attempts of `names` as possibly running (state unknown) until a listing
/// settles them: a wait on them is held, by order or to the deadline, never released early.
pub fn hold_unsettled(ordered: &mut Ordered, names: &[String]) {
    for name in names {
        let newest = ordered
            .attempts
            .iter_mut()
            .filter(|a| &a.name == name)
            .max_by_key(|a| (a.attempt, a.created_at));
        if let Some(a) = newest {
            a.state = decide::RunState::Unknown;
        }
    }
}

/// What decides whether a pod is going away and when its waits end regardless of order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// When the pod's first exit file appeared: the kubelet starts its grace clock when it
    /// starts killing the pod, which is when it runs the preStop hooks.
    pub first_seen: Instant,
    /// The grace period the API server gives (the deletion's own, else the spec's).
    pub api_grace: Option<Duration>,
    /// The grace period the kubelet wrote on the pod's containers.
    pub runtime_grace: Option<Duration>,
    pub reserve: Duration,
}

impl Clock {
    /// The grace deadline minus the reserve the sidecar needs to drain before SIGKILL. A
    /// grace no longer than the reserve leaves no time to drain before the kubelet cuts the
    /// hook: the wait is then held to the cut itself (the order kept while the kubelet lets
    /// anything run), and the sidecar drains within the 2 s the kubelet always gives a
    /// container after its preStop (`killContainer`, `minimumGracePeriodInSeconds`).
    pub fn deadline(&self) -> Instant {
        let grace = self
            .api_grace
            .or(self.runtime_grace)
            .unwrap_or(DEFAULT_GRACE);
        let held = if grace > self.reserve {
            grace.saturating_sub(self.reserve)
        } else {
            grace
        };
        self.first_seen.later(held)
    }
}

/// The facts a decision takes.
pub fn assemble(
    ordered: Ordered,
    deletion: Deletion,
    clock: &Clock,
    stop_order: StopOrder,
) -> PodFacts {
    PodFacts {
        attempts: ordered.attempts,
        unknown: ordered.unknown,
        deletion,
        deadline: Some(clock.deadline()),
        stop_order,
        endpoints: None,
    }
}

/// Facts when the runtime does not answer: nothing is known of container states, so only the
/// deadline (or a confirmed "staying") can release a wait; a runtime outage never holds a
/// pod past its grace period, and never releases it out of order.
pub fn without_runtime(waiting: &[&str], deletion: Deletion, clock: &Clock) -> PodFacts {
    let attempts = waiting
        .iter()
        .map(|name| Attempt {
            name: (*name).to_owned(),
            attempt: 0,
            created_at: 0,
            state: decide::RunState::Running,
            priority: 1,
        })
        .chain(std::iter::once(Attempt {
            // Stands for "containers we cannot see", so waits are held until the deadline.
            name: String::new(),
            attempt: 0,
            created_at: 0,
            state: decide::RunState::Unknown,
            priority: 0,
        }))
        .collect();
    PodFacts {
        attempts,
        unknown: Vec::new(),
        deletion,
        deadline: Some(clock.deadline()),
        stop_order: StopOrder::default(),
        endpoints: None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::decide::RunState::{Exited, Running};
    use crate::view::{ContainerInfo, SandboxInfo};

    /// One container attempt of pod `u`, as the view holds it.
    pub(crate) fn entry(
        id: &str,
        name: &str,
        attempt: u32,
        state: decide::RunState,
        env: EnvPriority,
    ) -> ContainerEntry {
        ContainerEntry {
            exit_seen: None,
            kernel_exit: None,
            execs: Default::default(),
            exit_by_kernel: false,
            info: ContainerInfo {
                id: id.into(),
                pod_uid: crate::pod::test_uid(UID),
                name: name.into(),
                attempt,
                created_at: i64::from(attempt),
                state,
                grace: None,
                marks: false,
            },
            env,
        }
    }

    const UID: &str = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";

    /// The sandbox of the tests' pod, with these annotations.
    pub(crate) fn sandbox(annotations: HashMap<String, String>) -> SandboxInfo {
        SandboxInfo {
            id: "sandbox".into(),
            pod_uid: crate::pod::test_uid(UID),
            namespace: String::new(),
            name: String::new(),
            annotations,
            created_at: 0,
        }
    }

    fn pod(annotation: Option<&str>, containers: Vec<ContainerEntry>) -> PodEntry {
        let annotations = annotation
            .map(|a| [(priority::ANNOTATION.to_owned(), a.to_owned())].into())
            .unwrap_or_default();
        PodEntry::new(Some(sandbox(annotations)), containers)
    }

    fn prios(o: &Ordered) -> Vec<(String, u32, u8)> {
        o.attempts
            .iter()
            .map(|a| (a.name.clone(), a.attempt, a.priority))
            .collect()
    }

    fn known(v: Option<u8>) -> EnvPriority {
        EnvPriority::Known(Ok(v))
    }

    /// What, the annotation, the containers, the priorities wanted, the unknown wanted.
    type Case = (
        &'static str,
        Option<&'static str>,
        Vec<ContainerEntry>,
        Vec<(&'static str, u32, u8)>,
        Vec<&'static str>,
    );

    #[test]
    fn priorities_table() {
        let now = Instant::now();
        let failed = EnvPriority::Failed {
            failures: 1,
            retry_at: now,
        };
        #[rustfmt::skip]
        let table: Vec<Case> = vec![
            ("annotation names the proxy; the app's env is not needed... but read",
             Some(r#"{"proxy": 1}"#),
             vec![entry("a", "app", 0, Running, known(None)), entry("p", "proxy", 0, Running, EnvPriority::Unread)],
             vec![("app", 0, 0), ("proxy", 0, 1)], vec![]),
            ("an unread env of an unnamed container is unknown",
             Some(r#"{"proxy": 1}"#),
             vec![entry("a", "app", 0, Running, EnvPriority::Unread), entry("p", "proxy", 0, Running, known(None))],
             vec![("app", 0, 0), ("proxy", 0, 1)], vec!["app"]),
            ("a failed env read is unknown, never priority 0",
             None,
             vec![entry("a", "app", 0, Exited, known(None)), entry("s", "shipper", 0, Running, failed.clone()), entry("p", "proxy", 0, Running, known(Some(1)))],
             vec![("app", 0, 0), ("proxy", 0, 1), ("shipper", 0, 0)], vec!["shipper"]),
            ("env priorities without an annotation",
             None,
             vec![entry("a", "app", 0, Running, known(None)), entry("l", "logs", 0, Running, known(Some(2)))],
             vec![("app", 0, 0), ("logs", 0, 2)], vec![]),
            ("presets without anything",
             None,
             vec![entry("a", "app", 0, Running, known(None)), entry("l", "linkerd-proxy", 0, Running, known(None))],
             vec![("app", 0, 0), ("linkerd-proxy", 0, 1)], vec![]),
            ("older attempts need no env",
             None,
             vec![entry("a0", "app", 0, Exited, EnvPriority::Unread), entry("a1", "app", 1, Running, known(None))],
             vec![("app", 0, 0), ("app", 1, 0)], vec![]),
            ("a malformed annotation makes the pod unordered, nothing unknown",
             Some("not json"),
             vec![entry("a", "app", 0, Running, EnvPriority::Unread), entry("p", "proxy", 0, Running, known(Some(3)))],
             vec![("app", 0, 0), ("proxy", 0, 0)], vec![]),
            ("a malformed env makes the pod unordered",
             None,
             vec![entry("a", "app", 0, Running, known(None)), entry("p", "proxy", 0, Running, EnvPriority::Known(Err(PriorityError::BadEnv { name: "X".into(), value: "y".into() })))],
             vec![("app", 0, 0), ("proxy", 0, 0)], vec![]),
        ];
        for (what, annotation, containers, want, unknown) in table {
            let p = pod(annotation, containers);
            let o = order(&p, pod_priorities(&p, None), &StopOrder::default());
            let want: Vec<(String, u32, u8)> = want
                .into_iter()
                .map(|(n, a, p)| (n.to_owned(), a, p))
                .collect();
            assert_eq!(prios(&o), want, "{what}");
            assert_eq!(o.unknown, unknown, "{what}");
        }
    }

    #[test]
    fn the_api_servers_annotations_win_over_the_sandboxs() {
        let p = pod(
            Some(r#"{"proxy": 1}"#),
            vec![entry("p", "proxy", 0, Running, EnvPriority::Unread)],
        );
        let api: std::collections::BTreeMap<String, String> = [(
            priority::ANNOTATION.to_owned(),
            r#"{"proxy": 4}"#.to_owned(),
        )]
        .into();
        let o = order(&p, pod_priorities(&p, Some(&api)), &StopOrder::default());
        assert_eq!(prios(&o), vec![("proxy".to_owned(), 0, 4)]);
    }

    #[test]
    fn native_sidecars_from_the_api_or_the_sandbox_default_to_one() {
        let mut p = pod(
            None,
            vec![
                entry("a", "app", 0, Running, known(None)),
                entry("l", "logs", 0, Running, known(None)),
                entry("e", "envoy", 0, Running, known(Some(2))),
            ],
        );
        assert_eq!(stop_order(&p, None), Ok(StopOrder::default()));
        if let Some(s) = p.sandbox.as_mut() {
            s.annotations.insert(
                exitorder_contract::annotation::NATIVE_SIDECARS.to_owned(),
                r#"["envoy","logs"]"#.to_owned(),
            );
        }
        let from_sandbox = stop_order(&p, None).unwrap();
        assert_eq!(from_sandbox.native(), ["envoy", "logs"]);
        let o = order(&p, pod_priorities(&p, None), &from_sandbox);
        assert_eq!(
            prios(&o),
            vec![
                ("app".to_owned(), 0, 0),
                ("envoy".to_owned(), 0, 2),
                ("logs".to_owned(), 0, 1)
            ]
        );
        // The API server's spec wins over the annotation.
        let api = ["logs".to_owned()];
        assert_eq!(stop_order(&p, Some(&api)).unwrap().native(), ["logs"]);
        if let Some(s) = p.sandbox.as_mut() {
            s.annotations.insert(
                exitorder_contract::annotation::NATIVE_SIDECARS.to_owned(),
                "not json".to_owned(),
            );
        }
        assert!(stop_order(&p, None).is_err());
    }

    #[test]
    fn deadline_from_the_best_grace_known() {
        let t = Instant::now();
        let mut c = Clock {
            first_seen: t,
            api_grace: None,
            runtime_grace: None,
            reserve: Duration::from_secs(5),
        };
        assert_eq!(c.deadline(), t + Duration::from_secs(25));
        c.runtime_grace = Some(Duration::from_secs(60));
        assert_eq!(c.deadline(), t + Duration::from_secs(55));
        c.api_grace = Some(Duration::from_secs(10));
        assert_eq!(c.deadline(), t + Duration::from_secs(5));
        // Within the reserve: held to the kubelet's cut.
        c.api_grace = Some(Duration::from_secs(2));
        assert_eq!(c.deadline(), t + Duration::from_secs(2));
        c.api_grace = Some(Duration::from_secs(5));
        assert_eq!(c.deadline(), t + Duration::from_secs(5));
        c.api_grace = Some(Duration::from_secs(6));
        assert_eq!(c.deadline(), t + Duration::from_secs(1));
    }

    #[test]
    fn an_exit_counts_as_the_last_only_once_nothing_newer_can_run() {
        let stopping = Instant::now();
        let before = stopping.checked_sub(Duration::from_millis(5)).unwrap();
        let after = stopping + Duration::from_millis(5);
        let ok = EnvPriority::Known(Ok(None));
        let gone = |kernel: Option<Instant>| {
            let mut app = entry("a0", "app", 0, Exited, ok.clone());
            app.kernel_exit = kernel;
            pod(
                Some(r#"{"proxy":1}"#),
                vec![app, entry("p0", "proxy", 0, Running, ok.clone())],
            )
        };
        let table: [(&str, PodEntry, Option<Instant>, &[&str]); 6] = [
            (
                "told by the runtime, never listed since",
                gone(None),
                None,
                &["app"],
            ),
            (
                "told by the runtime, listed before",
                gone(None),
                Some(before),
                &["app"],
            ),
            (
                "told by the runtime, listed after",
                gone(None),
                Some(after),
                &[],
            ),
            (
                "told by the kernel before the stopping",
                gone(Some(before)),
                None,
                &["app"],
            ),
            (
                "told by the kernel after the stopping",
                gone(Some(after)),
                None,
                &[],
            ),
            (
                "listed at the stopping itself",
                gone(None),
                Some(stopping),
                &[],
            ),
        ];
        for (name, mut p, listed_at, want) in table {
            p.listed_at = listed_at;
            assert_eq!(unsettled_exits(&p, stopping, &["proxy"]), want, "{name}");
        }
        // Running containers and the waiting ones are never unsettled; an older attempt
        // that exited is not the newest.
        let p = pod(
            None,
            vec![
                entry("a0", "app", 0, Exited, ok.clone()),
                entry("a1", "app", 1, Running, ok.clone()),
                entry("p0", "proxy", 0, Exited, ok.clone()),
            ],
        );
        assert!(unsettled_exits(&p, stopping, &["proxy"]).is_empty());
    }

    #[test]
    fn an_unsettled_exit_holds_the_waits_above_it() {
        let ok = EnvPriority::Known(Ok(None));
        let p = pod(
            Some(r#"{"proxy":1}"#),
            vec![
                entry("a0", "app", 0, Exited, ok.clone()),
                entry("a1", "app", 1, Exited, ok.clone()),
                entry("p0", "proxy", 0, Running, ok.clone()),
            ],
        );
        let mut o = order(&p, pod_priorities(&p, None), &StopOrder::default());
        hold_unsettled(&mut o, &["app".to_owned()]);
        let states: Vec<_> = o.attempts.iter().map(|a| (a.attempt, a.state)).collect();
        assert_eq!(
            states,
            [(0, Exited), (1, decide::RunState::Unknown), (0, Running)]
        );
        let facts = PodFacts {
            attempts: o.attempts,
            unknown: Vec::new(),
            deletion: Deletion::Deleting,
            deadline: None,
            stop_order: StopOrder::default(),
            endpoints: None,
        };
        let now = Instant::now();
        assert!(matches!(
            decide::decide(Some(&facts), "proxy", now, now),
            decide::Verdict::Wait { .. }
        ));
    }
}
