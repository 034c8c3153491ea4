//! Whether a deleted pod's exits were ordered: for each container, what held it and whether
//! it left after every container of lower exit priority.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::kubelet::{Deletion, PodPlan};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Held, then allowed; it left after every lower-priority container.
    Ordered,
    /// Released by the grace deadline while some lower-priority container still ran.
    Deadline,
    /// It left before a lower-priority container.
    NotOrdered,
    /// Nothing held its exit (priority 0, or no exitorder preStop wait).
    Unheld,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerVerdict {
    pub priority: u8,
    pub exit_code: i32,
    /// When the runtime saw it exit, ms from the deletion.
    pub finished_ms: f64,
    pub verdict: Verdict,
    /// The verdict in words.
    #[serde(skip)]
    pub why: String,
}

/// An allow the agent logged: its reason and when (Unix ns).
#[derive(Debug, Clone)]
pub struct Allowed {
    pub reason: String,
    pub at_ns: i64,
}

/// Each container's exit priority, as the agent resolves it from the pod's annotation (or
/// its Kruise alias), the container's env and the presets; a malformed annotation or env makes
/// the whole pod unordered, as it does for the agent.
pub fn priorities(plan: &PodPlan) -> BTreeMap<String, u8> {
    use exitorder::priority;
    let pod = priority::from_annotations(
        plan.annotations
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    let mut out = BTreeMap::new();
    let Ok(pod) = pod else {
        return plan.all().map(|c| (c.name.clone(), 0)).collect();
    };
    for c in plan.all() {
        let env = priority::from_env(c.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let Ok(env) = env else {
            return plan.all().map(|c| (c.name.clone(), 0)).collect();
        };
        out.insert(
            c.name.clone(),
            priority::resolve(&c.name, pod.as_ref(), env),
        );
    }
    out
}

/// Judges each container of a deleted pod.
pub fn judge(
    plan: &PodPlan,
    d: &Deletion,
    allows: &HashMap<String, Allowed>,
) -> BTreeMap<String, ContainerVerdict> {
    let prio = priorities(plan);
    let mut out = BTreeMap::new();
    for c in &d.containers {
        let p = prio.get(&c.name).copied().unwrap_or(0);
        let finished_ms = d.ms(c.finished_at_ns);
        let held = d
            .exit_files
            .as_ref()
            .and_then(|f| f.get(&c.name))
            .is_some_and(|e| e.created.is_some())
            || allows.contains_key(&c.name);
        let lower: Vec<_> = d
            .containers
            .iter()
            .filter(|o| prio.get(&o.name).copied().unwrap_or(0) < p)
            .collect();
        let still_ran: Vec<&str> = lower
            .iter()
            .filter(|o| o.finished_at_ns >= c.finished_at_ns)
            .map(|o| o.name.as_str())
            .collect();
        let (verdict, why) = if p == 0 {
            (
                Verdict::Unheld,
                "priority 0: nothing holds its exit".to_owned(),
            )
        } else if !held {
            (
                Verdict::Unheld,
                "its exit was not held: no exitorder preStop wait ran (opt the pod in, or add the preStop)".to_owned(),
            )
        } else if allows.get(&c.name).is_some_and(|a| a.reason == "deadline") {
            (
                Verdict::Deadline,
                if still_ran.is_empty() {
                    "released by the grace deadline".to_owned()
                } else {
                    format!(
                        "released by the grace deadline while {} still ran",
                        still_ran.join(", ")
                    )
                },
            )
        } else if still_ran.is_empty() {
            let last = lower.iter().max_by_key(|o| o.finished_at_ns);
            (
                Verdict::Ordered,
                match last {
                    Some(o) => format!(
                        "order kept: exited {:.0} ms after {}",
                        (c.finished_at_ns - o.finished_at_ns) as f64 / 1e6,
                        o.name
                    ),
                    None => "order kept".to_owned(),
                },
            )
        } else {
            (
                Verdict::NotOrdered,
                format!("order NOT kept: exited before {}", still_ran.join(", ")),
            )
        };
        out.insert(
            c.name.clone(),
            ContainerVerdict {
                priority: p,
                exit_code: c.exit_code,
                finished_ms: (finished_ms * 10.0).round() / 10.0,
                verdict,
                why,
            },
        );
    }
    out
}
