//! Jobs that finish: once a Job pod's main containers are done, its sidecars are shut down,
//! lowest priority first, each level after the one before has exited. Without it a meshed
//! Job never completes, because its proxy never exits. Pure: the rules, tested by tables;
//! the calls are in [`jobs`](crate::jobs).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use exitorder_contract::annotation;

use crate::decide::restart::{Outcome, Policy, Restart};
use crate::decide::RunState;

/// The restart policies of pods that complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completes {
    /// restartPolicy Never: done when every main container has exited.
    Never,
    /// restartPolicy OnFailure: done when every main container has exited with status 0
    /// (the kubelet restarts one that failed).
    OnFailure,
}

impl Completes {
    /// The pod's restart policy it stands for.
    pub fn policy(self) -> Policy {
        match self {
            Completes::Never => Policy::Never,
            Completes::OnFailure => Policy::OnFailure,
        }
    }
}

/// Whether a pod's sidecars are shut down when its work is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Participation {
    /// Not a completing pod, or not opted in to exitorder.
    Off,
    /// A completing, opted-in pod that opted out of the shutdown.
    OptedOut(Completes),
    On(Completes),
}

/// Whether a pod takes part, from its restart policy and annotations: it must complete, have
/// opted in to exitorder (the webhook's annotation, or exit priorities of its own), and not
/// have opted out of the shutdown.
pub fn completes(
    restart_policy: Option<&str>,
    annotations: &BTreeMap<String, String>,
) -> Participation {
    let policy = match restart_policy {
        Some("Never") => Completes::Never,
        Some("OnFailure") => Completes::OnFailure,
        _ => return Participation::Off,
    };
    let has =
        |k: &str, v: Option<&str>| annotations.get(k).is_some_and(|x| v.is_none_or(|v| x == v));
    let opted_in = has(annotation::INJECT, Some("true"))
        || has(annotation::INJECT_KRUISE, Some("true"))
        || has(annotation::PRIORITY, None)
        || has(annotation::PRIORITY_KRUISE, None);
    if !opted_in {
        Participation::Off
    } else if has(annotation::TERMINATE_ON_COMPLETION, Some("false")) {
        Participation::OptedOut(policy)
    } else {
        Participation::On(policy)
    }
}

/// The shutdown URL of each sidecar that has one: the pod's annotation (a JSON object of
/// container to URL), else its preset's (see [`presets`](crate::presets)). A malformed annotation is reported and ignored:
/// those sidecars are stopped through the runtime instead.
pub fn shutdown_urls(
    annotations: &BTreeMap<String, String>,
) -> (BTreeMap<String, String>, Option<String>) {
    let mut urls: BTreeMap<String, String> = crate::presets::shutdown_urls(annotations)
        .map(|(c, u)| (c.to_owned(), u.to_owned()))
        .collect();
    let Some(value) = annotations.get(annotation::SIDECAR_SHUTDOWN) else {
        return (urls, None);
    };
    match serde_json::from_str::<BTreeMap<String, String>>(value) {
        Ok(named) if value.len() <= 64 * 1024 => {
            urls.extend(named);
            (urls, None)
        }
        Ok(_) => (
            urls,
            Some(format!(
                "annotation {} is too large",
                annotation::SIDECAR_SHUTDOWN
            )),
        ),
        Err(e) => (
            urls,
            Some(format!(
                "annotation {} must be a JSON object of container name to URL: {e}",
                annotation::SIDECAR_SHUTDOWN
            )),
        ),
    }
}

/// One container of the pod's spec (newest attempt), as the runtime shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub priority: u8,
    pub state: RunState,
    /// Known once it has exited and its status was read.
    pub exit_code: Option<i32>,
    /// Whether the kubelet starts it again after an exit (main containers: the pod's
    /// policy, or the container's own and its rules).
    pub restart: Restart,
}

impl Member {
    /// Exited, and the kubelet will not start it again: its exit code is known where the
    /// answer depends on it, and no policy or rule restarts it for that code.
    pub fn ended_for_good(&self) -> bool {
        self.state == RunState::Exited
            && (self.exit_code.is_some() || !self.restart.needs_exit_code())
            && !self.restart.restarts(self.exit_code.unwrap_or(0))
    }
}

/// What to do next for a completing pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Not yet: a main container still runs (or exited and will be started again), or a
    /// level of sidecars asked to stop has not exited.
    Wait,
    /// These exit codes are needed first (main containers that exited, whose restart
    /// depends on the code).
    ReadExitCodes(Vec<String>),
    /// Shut these sidecars down now (one priority level).
    Shutdown(Vec<String>),
    /// Every sidecar has exited: nothing left to do.
    Done,
}

/// The next step. `members` are the spec's containers (main containers only: native
/// sidecars are stopped by the kubelet itself); `asked` the sidecars already shut down. A
/// main container is done when its newest attempt exited and the kubelet will not start it
/// again ([`Restart`]: an exit that will be retried is not the end of the work).
pub fn next_step(members: &[Member], asked: &BTreeSet<String>) -> Step {
    let (mains, sidecars): (Vec<&Member>, Vec<&Member>) =
        members.iter().partition(|m| m.priority == 0);
    if mains.is_empty() || sidecars.is_empty() {
        return Step::Done;
    }
    if mains.iter().any(|m| m.state != RunState::Exited) {
        return Step::Wait;
    }
    let unread: Vec<String> = mains
        .iter()
        .filter(|m| m.restart.needs_exit_code() && m.exit_code.is_none())
        .map(|m| m.name.clone())
        .collect();
    if !unread.is_empty() {
        return Step::ReadExitCodes(unread);
    }
    // Any code gives the same answer where none was needed.
    if !mains.iter().all(|m| m.ended_for_good()) {
        return Step::Wait;
    }
    let running: Vec<&&Member> = sidecars
        .iter()
        .filter(|m| m.state != RunState::Exited)
        .collect();
    let Some(level) = running.iter().map(|m| m.priority).min() else {
        return Step::Done;
    };
    let now: Vec<String> = running
        .iter()
        .filter(|m| m.priority == level && !asked.contains(&m.name))
        .map(|m| m.name.clone())
        .collect();
    if now.is_empty() {
        Step::Wait
    } else {
        Step::Shutdown(now)
    }
}

/// The exit codes a sidecar ends with when the Job shuts it down: 0 (its own endpoint, or TERM
/// handled), 143 (TERM) or 137 (KILL after the grace period).
const SHUTDOWN_EXITS: [i32; 3] = [0, 143, 137];

/// Whether shutting this sidecar down would restart the whole pod in place: one of its
/// `RestartAllContainers` rules matches an exit a shutdown brings. The kubelet would then run
/// the finished work again, and the next completion would shut it down again, for ever. Such
/// a sidecar is left running, as without exitorder.
pub fn shutdown_restarts_all(restart: &Restart) -> bool {
    SHUTDOWN_EXITS
        .iter()
        .any(|code| restart.on_exit(*code) == Outcome::RestartAll)
}

/// Whether every main container had ended for good before `at` (when a container whose
/// rules can restart the pod exited): then that exit is the kubelet stopping a native
/// sidecar at the pod's end, which restarts nothing. `mains`: each main container with when
/// the agent learnt of its exit.
pub fn ended_before(mains: &[(&Member, Option<Instant>)], at: Instant) -> bool {
    mains
        .iter()
        .all(|(m, seen)| m.ended_for_good() && seen.is_some_and(|seen| seen < at))
}

/// Whether the pod is being restarted in place (KEP-5532).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InPlace {
    /// No container's exit asks for it.
    No,
    /// These containers exited, and their exit codes tell.
    ReadExitCodes(Vec<String>),
    /// `by` exited with a code its `RestartAllContainers` rule matches: the kubelet kills
    /// every other container, whatever its own policy says, and runs the pod again. None of
    /// those exits is the end of the work.
    RestartingAll { by: String, exit_code: i32 },
}

/// Whether the pod is being restarted in place, from the containers whose rules can ask for
/// it (`triggers`: each one's newest attempt).
pub fn restarting_all(triggers: &[Member]) -> InPlace {
    let exited: Vec<&Member> = triggers
        .iter()
        .filter(|t| t.state == RunState::Exited)
        .collect();
    let unread: Vec<String> = exited
        .iter()
        .filter(|t| t.exit_code.is_none())
        .map(|t| t.name.clone())
        .collect();
    if !unread.is_empty() {
        return InPlace::ReadExitCodes(unread);
    }
    exited
        .iter()
        .find_map(|t| {
            let code = t.exit_code?;
            (t.restart.on_exit(code) == Outcome::RestartAll).then(|| InPlace::RestartingAll {
                by: t.name.clone(),
                exit_code: code,
            })
        })
        .unwrap_or(InPlace::No)
}

#[cfg(test)]
mod tests {
    use super::RunState::{Created, Exited, Running};
    use super::*;
    use crate::decide::restart::{Action, ExitCodes, Rule};

    fn m(name: &str, priority: u8, state: RunState, exit_code: Option<i32>) -> Member {
        Member {
            name: name.into(),
            priority,
            state,
            exit_code,
            restart: Restart::pod(Policy::Never),
        }
    }

    /// The members under pod policy `policy`, `app` with its own rules where given.
    fn under(policy: Completes, members: Vec<Member>, app: Option<&Restart>) -> Vec<Member> {
        let pod = Restart::pod(policy.policy());
        members
            .into_iter()
            .map(|mut m| {
                m.restart = match app {
                    Some(own) if m.name == "app" => own.clone(),
                    _ => pod.clone(),
                };
                m
            })
            .collect()
    }

    fn asked(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn shut(names: &[&str]) -> Step {
        Step::Shutdown(names.iter().map(|s| (*s).to_owned()).collect())
    }

    /// What, the policy, the containers, the sidecars already asked, the step wanted.
    type Case = (
        &'static str,
        Completes,
        Vec<Member>,
        &'static [&'static str],
        Step,
    );

    #[test]
    fn steps_table() {
        use Completes::{Never, OnFailure};
        #[rustfmt::skip]
        let table: Vec<Case> = vec![
            ("main still runs", Never,
             vec![m("app", 0, Running, None), m("proxy", 1, Running, None)], &[], Step::Wait),
            ("main not started yet", Never,
             vec![m("app", 0, Created, None), m("proxy", 1, Running, None)], &[], Step::Wait),
            ("main done: the proxy goes", Never,
             vec![m("app", 0, Exited, Some(3)), m("proxy", 1, Running, None)], &[], shut(&["proxy"])),
            ("asked, not exited yet", Never,
             vec![m("app", 0, Exited, None), m("proxy", 1, Running, None)], &["proxy"], Step::Wait),
            ("levels: lowest first", Never,
             vec![m("app", 0, Exited, None), m("proxy", 1, Running, None), m("mesh", 1, Running, None), m("logs", 2, Running, None)],
             &[], shut(&["proxy", "mesh"])),
            ("levels: the next once the first exited", Never,
             vec![m("app", 0, Exited, None), m("proxy", 1, Exited, None), m("logs", 2, Running, None)],
             &["proxy"], shut(&["logs"])),
            ("levels: not while the first runs", Never,
             vec![m("app", 0, Exited, None), m("proxy", 1, Running, None), m("logs", 2, Running, None)],
             &["proxy"], Step::Wait),
            ("every sidecar exited", Never,
             vec![m("app", 0, Exited, None), m("proxy", 1, Exited, None)], &["proxy"], Step::Done),
            ("no sidecar at all", Never, vec![m("app", 0, Exited, None)], &[], Step::Done),
            ("OnFailure: the code is read first", OnFailure,
             vec![m("app", 0, Exited, None), m("proxy", 1, Running, None)], &[],
             Step::ReadExitCodes(vec!["app".into()])),
            ("OnFailure: a failure is restarted, not finished", OnFailure,
             vec![m("app", 0, Exited, Some(1)), m("proxy", 1, Running, None)], &[], Step::Wait),
            ("OnFailure: success", OnFailure,
             vec![m("app", 0, Exited, Some(0)), m("proxy", 1, Running, None)], &[], shut(&["proxy"])),
            ("two mains, one runs", Never,
             vec![m("a", 0, Exited, None), m("b", 0, Running, None), m("proxy", 1, Running, None)], &[], Step::Wait),
        ];
        for (what, policy, members, asked_now, want) in table {
            assert_eq!(
                next_step(&under(policy, members, None), &asked(asked_now)),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn no_exit_is_the_end_while_the_pod_restarts_in_place() {
        let watcher = |state: RunState, code: Option<i32>| Member {
            restart: Restart {
                policy: Policy::Always,
                rules: vec![Rule {
                    action: Action::RestartAllContainers,
                    codes: ExitCodes::In([88].into()),
                }],
            },
            ..m("watcher", 0, state, code)
        };
        let by_88 = InPlace::RestartingAll {
            by: "watcher".into(),
            exit_code: 88,
        };
        #[rustfmt::skip]
        let table: [(&str, Vec<Member>, InPlace); 6] = [
            ("no trigger in the pod", vec![], InPlace::No),
            ("the watcher runs", vec![watcher(Running, None)], InPlace::No),
            ("the watcher exited, its code unread", vec![watcher(Exited, None)],
             InPlace::ReadExitCodes(vec!["watcher".into()])),
            ("exit 88: every container restarts", vec![watcher(Exited, Some(88))], by_88),
            ("exit 1: only the watcher restarts", vec![watcher(Exited, Some(1))], InPlace::No),
            ("its next attempt has not started yet", vec![watcher(Created, None)], InPlace::No),
        ];
        for (what, triggers, want) in table {
            assert_eq!(restarting_all(&triggers), want, "{what}");
        }
    }

    #[test]
    fn a_trigger_that_exits_after_the_work_ended_restarts_nothing() {
        let t0 = Instant::now();
        let at = |ms: u64| Some(t0 + std::time::Duration::from_millis(ms));
        let done = m("app", 0, Exited, Some(0));
        let retried = Member {
            restart: Restart::pod(Policy::OnFailure),
            ..m("app", 0, Exited, Some(1))
        };
        let running = m("app", 0, Running, None);
        let trigger_at = t0 + std::time::Duration::from_millis(50);
        #[rustfmt::skip]
        let table: [(&str, &Member, Option<Instant>, bool); 5] = [
            ("the app ended for good before: the pod's end", &done, at(10), true),
            ("the app ended after the trigger: killed by the restart", &done, at(60), false),
            ("the app exited before, but is retried", &retried, at(10), false),
            ("the app still runs", &running, None, false),
            ("when the app exited is not known", &done, None, false),
        ];
        for (what, app, seen, want) in table {
            assert_eq!(ended_before(&[(app, seen)], trigger_at), want, "{what}");
        }
    }

    #[test]
    fn a_sidecar_whose_shutdown_would_restart_the_pod_is_told_apart() {
        let on = |codes: ExitCodes| Restart {
            policy: Policy::Never,
            rules: vec![Rule {
                action: Action::RestartAllContainers,
                codes,
            }],
        };
        assert!(shutdown_restarts_all(&on(ExitCodes::NotIn([0].into()))));
        assert!(shutdown_restarts_all(&on(ExitCodes::In([143].into()))));
        assert!(!shutdown_restarts_all(&on(ExitCodes::In([88].into()))));
        assert!(!shutdown_restarts_all(&Restart::pod(Policy::Always)));
    }

    #[test]
    fn a_main_container_the_kubelet_starts_again_is_not_done() {
        use Completes::Never;
        let on_failure = Restart::pod(Policy::OnFailure);
        let on_42 = Restart {
            policy: Policy::Never,
            rules: vec![Rule {
                action: Action::Restart,
                codes: ExitCodes::In([42].into()),
            }],
        };
        let always = Restart::pod(Policy::Always);
        let two = |code: Option<i32>| vec![m("app", 0, Exited, code), m("proxy", 1, Running, None)];
        #[rustfmt::skip]
        let table: [(&str, &Restart, Option<i32>, Step); 7] = [
            ("its own OnFailure in a Never pod: the code first", &on_failure, None,
             Step::ReadExitCodes(vec!["app".into()])),
            ("its own OnFailure, failed: retried", &on_failure, Some(1), Step::Wait),
            ("its own OnFailure, succeeded", &on_failure, Some(0), shut(&["proxy"])),
            ("a rule restarts 42", &on_42, Some(42), Step::Wait),
            ("no rule matches 1: its policy (Never) ends it", &on_42, Some(1), shut(&["proxy"])),
            ("its own Always: never done", &always, Some(0), Step::Wait),
            ("its own Always: no code needed", &always, None, Step::Wait),
        ];
        for (what, own, code, want) in table {
            assert_eq!(
                next_step(&under(Never, two(code), Some(own)), &asked(&[])),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn who_takes_part() {
        let ann = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        use Participation::{Off, On, OptedOut};
        let injected = ann(&[(annotation::INJECT, "true")]);
        assert_eq!(completes(Some("Never"), &injected), On(Completes::Never));
        assert_eq!(
            completes(Some("OnFailure"), &injected),
            On(Completes::OnFailure)
        );
        assert_eq!(completes(Some("Always"), &injected), Off);
        assert_eq!(completes(None, &injected), Off);
        assert_eq!(completes(Some("Never"), &ann(&[])), Off);
        assert_eq!(
            completes(Some("Never"), &ann(&[(annotation::PRIORITY, "{}")])),
            On(Completes::Never)
        );
        assert_eq!(
            completes(
                Some("Never"),
                &ann(&[
                    (annotation::INJECT_KRUISE, "true"),
                    (annotation::TERMINATE_ON_COMPLETION, "false")
                ])
            ),
            OptedOut(Completes::Never)
        );
    }

    #[test]
    fn shutdown_urls_from_presets_and_the_annotation() {
        let mut a = BTreeMap::new();
        let (urls, bad) = shutdown_urls(&a);
        // Linkerd's is off unless the pod turns it on.
        assert!(!urls.contains_key("linkerd-proxy"));
        assert_eq!(urls["istio-proxy"], "http://127.0.0.1:15020/quitquitquit");
        assert!(bad.is_none());
        let presets = urls.len();
        a.insert(
            "config.linkerd.io/proxy-admin-shutdown".to_owned(),
            "enabled".to_owned(),
        );
        let (urls, _) = shutdown_urls(&a);
        assert_eq!(urls["linkerd-proxy"], "http://127.0.0.1:4191/shutdown");
        a.insert(
            annotation::SIDECAR_SHUTDOWN.to_owned(),
            r#"{"envoy": "http://127.0.0.1:9901/quitquitquit"}"#.to_owned(),
        );
        let (urls, _) = shutdown_urls(&a);
        assert_eq!(urls["envoy"], "http://127.0.0.1:9901/quitquitquit");
        a.insert(annotation::SIDECAR_SHUTDOWN.to_owned(), "[1]".to_owned());
        let (urls, bad) = shutdown_urls(&a);
        assert!(bad.is_some_and(|b| b.contains(annotation::SIDECAR_SHUTDOWN)));
        assert_eq!(urls.len(), presets + 1, "the presets alone");
    }
}
