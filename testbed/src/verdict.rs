//! Whether a pod's exits were ordered: for each container, what held it and whether it left
//! after every container of lower exit priority, when the pod was deleted or, for a Job's
//! pod, when its work was done.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::kubelet::{ContainerRecord, Deletion, PodPlan, Timeline, What};

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
    /// When the runtime saw it exit, ms from the report's origin (the deletion, or the pod's
    /// start for a Job's pod that completed).
    pub finished_ms: f64,
    pub verdict: Verdict,
    /// Every run that ended, oldest first: the kubelet's restarts of a container show here.
    pub attempts: Vec<Attempt>,
    /// The verdict in words.
    #[serde(skip)]
    pub why: String,
}

/// One run of a container that ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    pub exit_code: i32,
    /// When the runtime saw it exit, ms from the report's origin.
    pub finished_ms: f64,
}

/// Milliseconds from `origin_ns` to `at_ns`, to a tenth.
fn ms(at_ns: i64, origin_ns: i64) -> f64 {
    ((at_ns - origin_ns) as f64 / 1e5).round() / 10.0
}

/// Each container's runs that ended, oldest first, in ms from `origin_ns`.
pub fn attempts(timeline: &Timeline, origin_ns: i64) -> BTreeMap<String, Vec<Attempt>> {
    let mut out: BTreeMap<String, Vec<Attempt>> = BTreeMap::new();
    for e in timeline.sorted() {
        if let (Some(name), What::Exited { exit_code, .. }) = (&e.container, &e.what) {
            out.entry(name.clone()).or_default().push(Attempt {
                exit_code: *exit_code,
                finished_ms: ms(e.at_ns, origin_ns),
            });
        }
    }
    out
}

/// When the pod started: its sandbox ran (else the first thing recorded).
pub fn pod_start(timeline: &Timeline) -> i64 {
    let sorted = timeline.sorted();
    sorted
        .iter()
        .find(|e| e.what == What::SandboxReady)
        .or(sorted.first())
        .map_or(0, |e| e.at_ns)
}

/// Judges each container of a Job's pod that completed before it was deleted: each sidecar
/// must have left after the last run of every container of lower priority. Times are from
/// the pod's start.
pub fn judge_completed(plan: &PodPlan, d: &Deletion) -> BTreeMap<String, ContainerVerdict> {
    let prio = priorities(plan);
    let origin = pod_start(&d.timeline);
    let mut runs = attempts(&d.timeline, origin);
    let mut out = BTreeMap::new();
    for c in &d.containers {
        let p = prio.get(&c.name).copied().unwrap_or(0);
        let (lower, still_ran) = below(d, &prio, c, p);
        let (verdict, why) = if p == 0 {
            (
                Verdict::Unheld,
                "priority 0: its work ends the Job".to_owned(),
            )
        } else {
            order_kept(c, &lower, &still_ran, "shut down once the work was done")
        };
        out.insert(
            c.name.clone(),
            ContainerVerdict {
                priority: p,
                exit_code: c.exit_code,
                finished_ms: ms(c.finished_at_ns, origin),
                verdict,
                attempts: runs.remove(&c.name).unwrap_or_default(),
                why,
            },
        );
    }
    out
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
    let mut runs = attempts(&d.timeline, d.started_ns);
    let mut out = BTreeMap::new();
    for c in &d.containers {
        let p = prio.get(&c.name).copied().unwrap_or(0);
        let held = d
            .exit_files
            .as_ref()
            .and_then(|f| f.get(&c.name))
            .is_some_and(|e| e.created.is_some())
            || allows.contains_key(&c.name);
        let (lower, still_ran) = below(d, &prio, c, p);
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
        } else {
            order_kept(c, &lower, &still_ran, "order kept")
        };
        out.insert(
            c.name.clone(),
            ContainerVerdict {
                priority: p,
                exit_code: c.exit_code,
                finished_ms: ms(c.finished_at_ns, d.started_ns),
                verdict,
                attempts: runs.remove(&c.name).unwrap_or_default(),
                why,
            },
        );
    }
    out
}

/// The containers of lower priority than `c` (priority `p`), and the names of those of them
/// that exited no earlier than it.
fn below<'a>(
    d: &'a Deletion,
    prio: &BTreeMap<String, u8>,
    c: &ContainerRecord,
    p: u8,
) -> (Vec<&'a ContainerRecord>, Vec<&'a str>) {
    let lower: Vec<&ContainerRecord> = d
        .containers
        .iter()
        .filter(|o| prio.get(&o.name).copied().unwrap_or(0) < p)
        .collect();
    let still_ran = lower
        .iter()
        .filter(|o| o.finished_at_ns >= c.finished_at_ns)
        .map(|o| o.name.as_str())
        .collect();
    (lower, still_ran)
}

/// Ordered (`kept`, and after which container) when nothing of lower priority outlived `c`.
fn order_kept(
    c: &ContainerRecord,
    lower: &[&ContainerRecord],
    still_ran: &[&str],
    kept: &str,
) -> (Verdict, String) {
    if !still_ran.is_empty() {
        return (
            Verdict::NotOrdered,
            format!("order NOT kept: exited before {}", still_ran.join(", ")),
        );
    }
    let why = match lower.iter().max_by_key(|o| o.finished_at_ns) {
        Some(o) => format!(
            "{kept}: exited {:.0} ms after {}",
            (c.finished_at_ns - o.finished_at_ns) as f64 / 1e6,
            o.name
        ),
        None => kept.to_owned(),
    };
    (Verdict::Ordered, why)
}
