//! What the agent derives from one pod of its node view, checked the same way whatever the
//! pod came from (the runtime's answers, the API server's object): its priorities, its
//! deadline, every decision of its waits, and its Job shutdown.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use exitorder::cluster::podwatch::ApiPod;
use exitorder::decide::bounds::{Later as _, MAX_SPAN};
use exitorder::decide::restart::{Policy, Restart};
use exitorder::decide::{self, Deletion, Reason, RunState, Verdict};
use exitorder::jobs::completion::{self, Member, Participation, Step};
use exitorder::view::facts::{self, Clock};
use exitorder::view::PodEntry;

/// The agent's default grace reserve.
const RESERVE: Duration = Duration::from_secs(5);
/// The agent's default settle time for a pod that is staying.
const SETTLE: Duration = Duration::from_millis(250);

/// Checks pod `v`, with the API server's view of it when there is one.
///
/// Oracle: a malformed priority leaves every container at 0 and nothing unknown; the
/// deadline is at or after the first exit file and at most [`MAX_SPAN`] after it; a wait
/// ends no later than the deadline, nothing is held at it, a malformed pod is never held,
/// and a container the pod does not have fails open; a Job's sidecars are shut down only
/// once its main containers are done, the lowest running level only.
pub fn check(v: &PodEntry, api: Option<&ApiPod>) {
    let first_seen = Instant::now();
    let named = facts::pod_priorities(v, api.map(|a| &a.annotations));
    let stop = facts::stop_order(v, api.map(|a| &a.native_sidecars[..])).unwrap_or_default();
    let ordered = facts::order(v, named, &stop);
    let malformed = ordered.malformed.is_some();
    if malformed {
        assert!(
            ordered.attempts.iter().all(|a| a.priority == 0),
            "{ordered:?}"
        );
        assert!(ordered.unknown.is_empty(), "{ordered:?}");
    }
    assert_eq!(ordered.attempts.len(), v.containers.len());

    let clock = Clock {
        first_seen,
        api_grace: api.and_then(ApiPod::grace),
        runtime_grace: v.grace(),
        reserve: RESERVE,
    };
    if let Some(g) = clock.api_grace {
        assert!(g >= Duration::from_secs(1) && g <= MAX_SPAN, "{g:?}");
    }
    assert!(clock.runtime_grace.is_none_or(|g| g <= MAX_SPAN));
    let deadline = clock.deadline();
    let year = first_seen.later(MAX_SPAN);
    assert!(deadline >= first_seen && deadline <= year, "{clock:?}");

    // A pod the API does not show going away, with the kubelet's word that it restarts
    // every container alone: the widest release a decision can be given.
    let deletion = match api {
        Some(a) if a.pod_kill(0).is_none() => Deletion::NotDeleting {
            settle: SETTLE,
            restarting: v
                .containers
                .values()
                .map(|c| (c.info.name.clone(), first_seen))
                .collect(),
        },
        _ => Deletion::Deleting,
    };
    let pod = facts::assemble(ordered.clone(), deletion, &clock, stop);
    let mut names: Vec<&str> = v
        .containers
        .values()
        .map(|c| c.info.name.as_str())
        .collect();
    names.push("not-in-the-pod\u{0}");
    for name in names {
        for now in [first_seen, deadline, year] {
            let verdict = decide::decide(Some(&pod), name, first_seen, now);
            match &verdict {
                Verdict::Allow(_) => {}
                Verdict::Wait { blocked_by, until } => {
                    assert!(!malformed, "a malformed pod is held: {verdict:?}");
                    assert!(now < deadline, "held at the deadline: {verdict:?}");
                    assert!(!blocked_by.is_empty());
                    let until = until.expect("a wait has an end");
                    assert!(until >= first_seen && until <= deadline, "{verdict:?}");
                }
            }
            if !v.containers.values().any(|c| c.info.name == name) {
                assert_eq!(verdict, Verdict::Allow(Reason::Unknown));
            }
        }
        let _ = decide::still_running(&pod, name);
        let _ = decide::beyond_stop_order(&pod, name);
    }

    let Some(api) = api else { return };
    if let Participation::Off =
        completion::completes(api.restart_policy.as_deref(), &api.annotations)
    {
        return;
    }
    let _ = completion::shutdown_urls(&api.annotations);
    let newest = decide::newest_attempts(&ordered.attempts);
    let members: Vec<Member> = api
        .containers
        .iter()
        .map(|name| {
            let a = newest.iter().find(|a| &a.name == name);
            Member {
                name: name.clone(),
                priority: a.map_or(0, |a| a.priority),
                state: a.map_or(RunState::Created, |a| a.state),
                exit_code: a.map(|a| i32::from(a.priority)),
                // Rules that cannot be read: the kubelet may restart it, never done.
                restart: api
                    .restart_of(name)
                    .unwrap_or_else(|_| Restart::pod(Policy::Always)),
            }
        })
        .collect();
    if let Step::Shutdown(names) = completion::next_step(&members, &BTreeSet::new()) {
        assert!(!names.is_empty());
        assert!(
            members
                .iter()
                .filter(|m| m.priority == 0)
                .all(|m| !m.restart.restarts(m.exit_code.unwrap_or(0))),
            "never while the kubelet starts a main container again"
        );
        assert!(members
            .iter()
            .filter(|m| m.priority == 0)
            .all(|m| m.state == RunState::Exited));
        let level = members
            .iter()
            .filter(|m| m.priority > 0 && m.state != RunState::Exited)
            .map(|m| m.priority)
            .min();
        for n in &names {
            assert!(members
                .iter()
                .any(|m| &m.name == n && Some(m.priority) == level));
        }
    }
}
