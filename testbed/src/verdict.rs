//! Whether a pod's exits were ordered: for each container, what held it and whether it left
//! after every container of lower exit priority, when the pod was deleted or, for a Job's
//! pod, when its work was done. Judged from what happened on the node (the runtime's exit
//! times), the priorities the pod asked for (read by [`crate::priorities`]) and the test bed
//! kubelet's own stop order; never from the agent's rules.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::kubelet::{ordering, ContainerRecord, Deletion, Kind, PodPlan, Timeline, What};

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
        let (lower, still_ran) = below(d, &prio, plan, c, p);
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

/// Each container's exit priority as the pod asks for it ([`crate::priorities`]); a
/// malformed annotation or env asks for no order at all (every container 0).
pub fn priorities(plan: &PodPlan) -> BTreeMap<String, u8> {
    use crate::priorities::{from_annotations, from_env, resolve};
    let unordered = || plan.all().map(|c| (c.name.clone(), 0)).collect();
    let Ok(named) = from_annotations(&plan.annotations) else {
        return unordered();
    };
    let mut out = BTreeMap::new();
    for c in plan.all() {
        let Ok(env) = from_env(c.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))) else {
            return unordered();
        };
        let native = c.kind == Kind::Sidecar;
        out.insert(
            c.name.clone(),
            resolve(&c.name, named.as_ref(), env, native),
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
        let (lower, still_ran) = below(d, &prio, plan, c, p);
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

/// The containers of lower priority than `c` (priority `p`) that it can leave after, and the
/// names of those of them that exited no earlier than it. A native sidecar the test bed's
/// kubelet stops only after `c` exited is not one: nothing can make `c` leave after it.
fn below<'a>(
    d: &'a Deletion,
    prio: &BTreeMap<String, u8>,
    plan: &PodPlan,
    c: &ContainerRecord,
    p: u8,
) -> (Vec<&'a ContainerRecord>, Vec<&'a str>) {
    let (init, mains) = ordering::shape(plan);
    let lower: Vec<&ContainerRecord> = d
        .containers
        .iter()
        .filter(|o| prio.get(&o.name).copied().unwrap_or(0) < p)
        .filter(|o| !ordering::stops_after(&init, &mains, &c.name, &o.name))
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kubelet::plan::{plan, Placement};

    fn record(name: &str, kind: Kind, finished_at_ns: i64) -> ContainerRecord {
        ContainerRecord {
            name: name.into(),
            id: format!("id-{name}"),
            kind,
            prestop: None,
            term_ns: None,
            stop_timeout_secs: 0,
            stop_returned_ns: None,
            stop_error: None,
            finished_at_ns,
            exit_code: 0,
            reason: String::new(),
        }
    }

    /// A Job whose proxy (priority 1, a regular container) is shut down after the app, while
    /// a native sidecar of priority 0 runs on: the kubelet stops that sidecar only after every
    /// regular container, so the proxy cannot leave after it, and is not judged by it. It is
    /// judged by the app.
    #[test]
    fn a_native_sidecar_the_kubelet_stops_later_does_not_count_against_a_container() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "job", "annotations": {
                "exitorder.io/container-exit-priority": "{\"proxy\": 1, \"watcher\": 0}"}},
            "spec": {"hostNetwork": true, "restartPolicy": "Never",
                "initContainers": [{"name": "watcher", "image": "x", "restartPolicy": "Always"}],
                "containers": [{"name": "app", "image": "x"}, {"name": "proxy", "image": "x"}]}});
        let place = Placement::example();
        let plan = plan(&pod, &place).expect("a plan");
        let mut d = Deletion {
            pod_uid: place.uid.clone(),
            pod_name: "job".into(),
            kill: crate::kubelet::Kill::Deletion,
            grace_seconds: 30,
            started_ns: 0,
            containers: vec![
                record("watcher", Kind::Sidecar, 3_000_000),
                record("app", Kind::Main, 1_000_000),
                record("proxy", Kind::Main, 2_000_000),
            ],
            sandbox_removed_ns: 4_000_000,
            exit_files: None,
            pod_dir_created_ns: None,
            phase: crate::kubelet::Phase::Succeeded,
            timeline: Timeline::default(),
        };
        let v = judge_completed(&plan, &d);
        assert_eq!(v["proxy"].verdict, Verdict::Ordered, "{}", v["proxy"].why);
        assert!(v["proxy"].why.contains("after app"), "{}", v["proxy"].why);
        // Before the app, it is not.
        d.containers[1].finished_at_ns = 2_500_000;
        let v = judge_completed(&plan, &d);
        assert_eq!(
            v["proxy"].verdict,
            Verdict::NotOrdered,
            "{}",
            v["proxy"].why
        );
    }
}
