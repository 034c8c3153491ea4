//! Why a container stops, from what the node itself holds: whether the kubelet kills the whole
//! pod or this one container, judged per wait from the containers' marks.
//!
//! The one difference the node sees between the two (kubernetes/kubernetes `pkg/kubelet`):
//! - a pod kill runs every running container's preStop hook at once:
//!   `kuberuntime/kuberuntime_container.go` `killContainersWithSyncResult` starts one
//!   goroutine per container, each `killContainer`, which runs the container's preStop
//!   (`executePreStopHook`) before its TERM; native sidecars' preStops start with the others
//!   (only their TERM waits, `kuberuntime_termination_order.go`);
//! - a restart runs only the restarted container's: `kuberuntime_manager.go` `SyncPod` kills
//!   `podContainerChanges.ContainersToKill` (a failed liveness or startup probe, a changed
//!   spec, a failed postStart in `startContainer`) one after the other, each `killContainer`
//!   returning only once its container stopped. And the pod worker runs a pod's kill only
//!   after the sync in progress returned (`pod_workers.go` `podWorkerLoop`: one update at a
//!   time per pod; `SyncPod` runs under `context.WithoutCancel`), so a pod kill never starts
//!   while a restart's preStop still runs.
//!
//! So while a container's kill is in progress, another container's kill can be in progress
//! only in a pod kill. Every container of an injected pod says on the node when its preStop
//! starts (`exitorder-entrypoint mark`, or its own `wait`): the agent sees each mark in the
//! container's exit directory. A wait is judged:
//! - a pod kill when another container, whose current attempt still runs, marked since that
//!   attempt began (it is being stopped now, and the two kills overlap), or another container
//!   marked within [`Rule::window`] of the wait (its kill began with this one's) and its kill
//!   had not ended (exited, or a new attempt created) before the wait began;
//! - undecided, whatever the others' silence, when such a kill had ended before: a restart
//!   just before this one in the same sync (`SyncPod` kills `ContainersToKill` one after the
//!   other), or a pod kill whose other hooks the runtime started late. The kubelet's word for
//!   this attempt decides then: two restarts in a row are two restarts;
//! - this container's kill alone when none of the containers it waits for marked within the
//!   window after the wait began, every one of them being one that marks (a pod kill would
//!   have run their hooks too), on a node quiet that long (no other pod's mark within the
//!   window either: see below), or when the kubelet's own word for this attempt says so (its
//!   `Killing` Event, read for the attempt's first wait only: see [`super::kills`]);
//! - otherwise undecided: ordered, the pod's kill being the safer reading.
//!
//! The window covers how far apart the runtime starts one pod kill's preStop execs on a node
//! otherwise quiet, under CPU load. While the node's pods are being stopped by the dozen, their
//! execs queue in the runtime (a hundred pods' 330 execs on 2 cores took 30 s), and one pod's
//! hooks come tens of seconds apart; but then other pods' marks keep coming, and the window
//! starts over from the node's last one (or the last exit of another pod's container, which
//! goes on while the runtime's execs stall): silence counts only once the node itself is quiet.
//! Measured in `docs/architecture.md` ("Why a container stops").
//!
//! The caller trusts a silence only where the marks could have come (`agent/why.rs`): not
//! while the pod watch is behind, nor when a container the wait is held for shows that its
//! hook may be running or may have failed: an exec of it that failed, or that is still in
//! progress, begun around the wait (containerd's events), or its cgroup's counters of being
//! held back by its limits rising meanwhile ([`crate::runtime::strain`]: held at its CPU
//! quota, OOM, `pids.max`). A pod kill whose other hooks start later than the window after the
//! node fell quiet with none of these to show, is still taken for a restart while the pod watch
//! is current and shows no deletion (an eviction, a node shutdown): the sidecar leaves early.
//! So is one whose other hooks fail before they mark on a runtime without exec events (CRI-O,
//! a CRI-only socket), their containers' limits untouched.

use std::time::Duration;

use crate::kubelet::kills::ContainerKill;

/// How long after a wait began the others' silence proves that the kubelet kills its container
/// alone, by default: above the widest spread of one pod kill's execs measured on a loaded
/// node, with its margin (see the module's doc).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(4);

/// The rule's one setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub window: Duration,
}

impl Default for Rule {
    fn default() -> Self {
        Rule {
            window: DEFAULT_WINDOW,
        }
    }
}

/// What the node shows of one other container of the pod (its newest attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    /// Its newest attempt has not exited (running, or its state unknown).
    pub running: bool,
    /// When that attempt was created (Unix ns, the node's clock).
    pub created_ns: i64,
    /// Its preStop says on the node whenever the kubelet stops it (it runs exitorder's
    /// entrypoint, `mark` or `wait`).
    pub marks: bool,
    /// When the agent last saw it mark (Unix ns, the node's clock), if it did.
    pub marked_ns: Option<i64>,
    /// When it made that mark (no later than `marked_ns`): a mark a sweep found (the agent
    /// restarted, an event lost) was made before the agent saw it, perhaps in an attempt
    /// before the current one. `None`: when it was seen.
    pub made_ns: Option<i64>,
    /// When the agent saw its newest attempt exit (Unix ns), if it did.
    pub exited_ns: Option<i64>,
}

impl Peer {
    /// When the kill its mark was made in ended, as the node shows it: a newer attempt was
    /// created since, or the attempt exited.
    fn kill_ended_ns(&self, marked_ns: i64) -> Option<i64> {
        if marked_ns < self.created_ns {
            Some(self.created_ns)
        } else if self.running {
            None
        } else {
            self.exited_ns
        }
    }
}

/// One waiting container, as the judgement needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter<'a> {
    pub name: &'a str,
    /// When the agent saw its wait appear (Unix ns).
    pub since_ns: i64,
    /// The lower-priority containers it waits for that still run.
    pub blockers: &'a [String],
    /// The kubelet's word that it kills this attempt of the container alone, read for this
    /// wait (see [`super::kills::read_word`]).
    pub kubelet_says: Option<ContainerKill>,
    /// When a container of another pod of the node last marked, or exited (Unix ns), if one
    /// did.
    pub node_marked_ns: Option<i64>,
    /// An earlier judgement of this attempt's wait was [`Judgement::KillEnded`]: it stays so,
    /// though that kill may no longer be in sight (its mark forgotten, the wait made again).
    pub saw_kill_end: bool,
}

/// What was found that the container is stopped alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Alone {
    /// The containers it waits for all mark, and none did.
    Silence,
    /// The kubelet's `Killing` Event for this attempt, with why.
    Kubelet(ContainerKill),
}

impl Alone {
    pub fn as_str(self) -> &'static str {
        match self {
            Alone::Silence => "others_silent",
            Alone::Kubelet(_) => "kubelet_event",
        }
    }
}

/// How a wait is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Other containers are being stopped with it: the whole pod is killed.
    PodKill { stopping: Vec<String> },
    /// The kubelet stops this container alone, while the pod stays.
    Alone(Alone),
    /// Not yet: the others' marks may still come until this instant (Unix ns).
    Pending { until_ns: i64 },
    /// The node cannot tell: some container it waits for never marks. Ordered, unless the
    /// kubelet's word comes.
    Unknown,
    /// Another container's kill, seen beside this wait, had ended before it began: a restart
    /// just before this one, or a pod kill whose other hooks come late. Ordered, unless the
    /// kubelet's word comes; and the others' silence decides nothing for this wait from then
    /// on (the caller remembers it: a later judgement may no longer see that kill, its mark
    /// forgotten or the wait made again).
    KillEnded,
}

/// Judges `waiter` at `now_ns` among `peers` (the pod's other containers).
pub fn judge(rule: Rule, waiter: &Waiter<'_>, peers: &[Peer], now_ns: i64) -> Judgement {
    let window = i64::try_from(rule.window.as_nanos()).unwrap_or(i64::MAX);
    let near = |at: i64| at.abs_diff(waiter.since_ns) <= window.unsigned_abs();
    let mut stopping = Vec::new();
    let mut ended = false;
    for p in peers.iter().filter(|p| p.name != waiter.name) {
        let Some(at) = p.marked_ns else { continue };
        let made = p.made_ns.map_or(at, |m| m.min(at));
        if p.running && made >= p.created_ns {
            stopping.push(p.name.clone());
        } else if near(at) {
            // A kill that began with this wait's overlaps it, unless it had ended before the
            // wait began: then it may be the restart before this one in the same sync
            // (`SyncPod` kills one container after another), or a pod kill whose other
            // hooks the runtime started late. The marks cannot tell which.
            match p.kill_ended_ns(made) {
                Some(end) if end <= waiter.since_ns => ended = true,
                _ => stopping.push(p.name.clone()),
            }
        }
    }
    if !stopping.is_empty() {
        stopping.sort();
        stopping.dedup();
        return Judgement::PodKill { stopping };
    }
    if let Some(kind) = waiter.kubelet_says {
        return Judgement::Alone(Alone::Kubelet(kind));
    }
    if ended || waiter.saw_kill_end {
        // Only the kubelet's word for this attempt tells a restart from a pod kill here;
        // never the others' silence.
        return Judgement::KillEnded;
    }
    let all_mark = waiter
        .blockers
        .iter()
        .all(|b| peers.iter().any(|p| &p.name == b && p.marks));
    if !all_mark {
        return Judgement::Unknown;
    }
    let quiet_from = waiter
        .node_marked_ns
        .map_or(waiter.since_ns, |n| n.max(waiter.since_ns));
    let until_ns = quiet_from.saturating_add(window);
    if now_ns >= until_ns {
        Judgement::Alone(Alone::Silence)
    } else {
        Judgement::Pending { until_ns }
    }
}

/// Whether a container's preStop, as the kubelet recorded it on the container (its
/// `io.kubernetes.container.preStopHandler` annotation, the JSON of the spec's handler:
/// `kuberuntime/labels.go` `newContainerAnnotations`), runs exitorder's entrypoint in a way
/// that marks the container's directory: `mark`, `wait`, or the OpenKruise form.
pub fn prestop_marks(handler_json: &str) -> bool {
    /// A handler far larger than any exec line is nobody's wrapped hook; not parsed.
    const MAX: usize = 64 * 1024;
    #[derive(serde::Deserialize)]
    struct Handler {
        exec: Option<Exec>,
    }
    #[derive(serde::Deserialize)]
    struct Exec {
        command: Option<Vec<String>>,
    }
    if handler_json.len() > MAX {
        return false;
    }
    let Ok(h) = serde_json::from_str::<Handler>(handler_json) else {
        return false;
    };
    let Some(command) = h.exec.and_then(|e| e.command) else {
        return false;
    };
    let (Some(program), Some(first)) = (command.first(), command.get(1)) else {
        return false;
    };
    let base = program.rsplit('/').next().unwrap_or(program);
    exitorder_contract::share::ENTRYPOINT_NAMES.contains(&base)
        && matches!(
            first.as_str(),
            "wait"
                | "mark"
                | "-wait-container-exit"
                | "--wait-container-exit"
                | "-entrypoint"
                | "--entrypoint"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn peer(name: &str, running: bool, marks: bool, marked: Option<i64>) -> Peer {
        Peer {
            name: name.into(),
            running,
            created_ns: 100 * S,
            marks,
            marked_ns: marked,
            made_ns: None,
            exited_ns: None,
        }
    }

    /// `name` marked at `marked` and its kill ended at `ended`: it exited (`running` false),
    /// or its next attempt was created then.
    fn ended(name: &str, running: bool, marked: i64, ended: i64) -> Peer {
        let mut p = peer(name, running, true, Some(marked));
        if running {
            p.created_ns = ended;
        } else {
            p.exited_ns = Some(ended);
        }
        p
    }

    fn waiter<'a>(blockers: &'a [String], says: Option<ContainerKill>) -> Waiter<'a> {
        Waiter {
            name: "proxy",
            since_ns: 200 * S,
            blockers,
            kubelet_says: says,
            node_marked_ns: None,
            saw_kill_end: false,
        }
    }

    #[test]
    fn the_judgement_table() {
        let rule = Rule {
            window: Duration::from_secs(3),
        };
        let app = vec!["app".to_owned()];
        let since = 200 * S;
        #[rustfmt::skip]
        type Row = (&'static str, Vec<Peer>, Option<ContainerKill>, i64, Judgement);
        let table: Vec<Row> = vec![
            (
                "the app marked with it: a pod kill",
                vec![peer("app", true, true, Some(since + S / 10))],
                None,
                since,
                Judgement::PodKill {
                    stopping: vec!["app".into()],
                },
            ),
            (
                "the app marked first and still drains: a pod kill, however long ago",
                vec![peer("app", true, true, Some(150 * S))],
                None,
                since,
                Judgement::PodKill {
                    stopping: vec!["app".into()],
                },
            ),
            (
                "a mark of the app's attempt before this one says nothing",
                vec![peer("app", true, true, Some(99 * S))],
                None,
                since + 4 * S,
                Judgement::Alone(Alone::Silence),
            ),
            (
                "the app marked just before and already exited: a pod kill",
                vec![peer("app", false, true, Some(since - 2 * S))],
                None,
                since,
                Judgement::PodKill {
                    stopping: vec!["app".into()],
                },
            ),
            (
                "the app marked and exited before the wait began: only the kubelet tells",
                vec![ended("app", false, since - S, since - S / 2)],
                None,
                since + 10 * S,
                Judgement::KillEnded,
            ),
            (
                "the app marked and restarted before the wait began: only the kubelet tells",
                vec![ended("app", true, since - S, since - S / 2)],
                None,
                since + 10 * S,
                Judgement::KillEnded,
            ),
            (
                "a kill that ended before the wait, and the kubelet's word for this attempt",
                vec![ended("app", true, since - S, since - S / 2)],
                Some(ContainerKill::Liveness),
                since,
                Judgement::Alone(Alone::Kubelet(ContainerKill::Liveness)),
            ),
            (
                "a kill that ended after the wait began overlaps it: a pod kill",
                vec![ended("app", false, since - S, since + S / 2)],
                Some(ContainerKill::Liveness),
                since + S,
                Judgement::PodKill {
                    stopping: vec!["app".into()],
                },
            ),
            (
                "a kill that ended before the wait, another container marking now: a pod kill",
                vec![
                    ended("app", false, since - S, since - S / 2),
                    peer("app2", true, true, Some(since + S / 10)),
                ],
                Some(ContainerKill::Liveness),
                since + S,
                Judgement::PodKill {
                    stopping: vec!["app2".into()],
                },
            ),
            (
                "a mark seen now, made before the app's current attempt: no kill of this one",
                vec![Peer {
                    made_ns: Some(99 * S),
                    ..peer("app", true, true, Some(since - S))
                }],
                None,
                since + 10 * S,
                Judgement::KillEnded,
            ),
            (
                "an old mark a sweep found, far from the wait: silence decides",
                vec![Peer {
                    made_ns: Some(99 * S),
                    ..peer("app", true, true, Some(since - 10 * S))
                }],
                None,
                since + 4 * S,
                Judgement::Alone(Alone::Silence),
            ),
            (
                "an exited container's old mark says nothing",
                vec![
                    peer("app", true, true, None),
                    peer("old", false, true, Some(since - 4 * S)),
                ],
                None,
                since + 3 * S,
                Judgement::Alone(Alone::Silence),
            ),
            (
                "silence inside the window: not yet",
                vec![peer("app", true, true, None)],
                None,
                since + S,
                Judgement::Pending {
                    until_ns: since + 3 * S,
                },
            ),
            (
                "silence through the window: alone",
                vec![peer("app", true, true, None)],
                None,
                since + 3 * S,
                Judgement::Alone(Alone::Silence),
            ),
            (
                "a blocker that never marks: the node cannot tell",
                vec![peer("app", true, false, None)],
                None,
                since + 10 * S,
                Judgement::Unknown,
            ),
            (
                "the kubelet's word for this attempt, the others silent",
                vec![peer("app", true, false, None)],
                Some(ContainerKill::Liveness),
                since,
                Judgement::Alone(Alone::Kubelet(ContainerKill::Liveness)),
            ),
            (
                "the kubelet's word loses to a mark of the others",
                vec![peer("app", true, true, Some(since + S))],
                Some(ContainerKill::Liveness),
                since + S,
                Judgement::PodKill {
                    stopping: vec!["app".into()],
                },
            ),
            (
                "its own mark is no other's",
                vec![
                    peer("proxy", true, true, Some(since)),
                    peer("app", true, true, None),
                ],
                None,
                since + 3 * S,
                Judgement::Alone(Alone::Silence),
            ),
        ];
        for (what, peers, says, now, want) in table {
            let w = waiter(&app, says);
            assert_eq!(judge(rule, &w, &peers, now), want, "{what}");
        }
    }

    #[test]
    fn a_wait_that_saw_a_kill_end_is_never_let_go_by_silence() {
        // The app's kill that ended before the wait is no longer in sight (its mark
        // forgotten, or the wait made again since): silent through the window, still only
        // the kubelet's word, or a kill beside it, decides.
        let rule = Rule {
            window: Duration::from_secs(3),
        };
        let app = vec!["app".to_owned()];
        let since = 200 * S;
        let silent = vec![peer("app", true, true, None)];
        let mut w = waiter(&app, None);
        assert_eq!(
            judge(rule, &w, &silent, since + 10 * S),
            Judgement::Alone(Alone::Silence)
        );
        w.saw_kill_end = true;
        assert_eq!(
            judge(rule, &w, &silent, since + 10 * S),
            Judgement::KillEnded
        );
        let marking = vec![peer("app", true, true, Some(since + S))];
        assert_eq!(
            judge(rule, &w, &marking, since + S),
            Judgement::PodKill {
                stopping: vec!["app".into()]
            }
        );
        w.kubelet_says = Some(ContainerKill::Liveness);
        assert_eq!(
            judge(rule, &w, &silent, since),
            Judgement::Alone(Alone::Kubelet(ContainerKill::Liveness))
        );
    }

    #[test]
    fn a_mark_late_by_the_window_is_still_a_pod_kill_until_judged() {
        // The app's mark arrives 2.9 s after the wait, the window 3 s: at 2.9 s the judgement
        // turns from pending to a pod kill; it was never alone.
        let rule = Rule::default();
        let app = vec!["app".to_owned()];
        let w = waiter(&app, None);
        let since = w.since_ns;
        let mut peers = vec![peer("app", true, true, None)];
        for t in (0..29).map(|d| since + d * S / 10) {
            assert!(matches!(
                judge(rule, &w, &peers, t),
                Judgement::Pending { .. }
            ));
        }
        peers[0].marked_ns = Some(since + 29 * S / 10);
        assert_eq!(
            judge(rule, &w, &peers, since + 29 * S / 10),
            Judgement::PodKill {
                stopping: vec!["app".into()]
            }
        );
    }

    #[test]
    fn silence_counts_only_once_the_node_fell_quiet() {
        let rule = Rule {
            window: Duration::from_secs(3),
        };
        let app = vec!["app".to_owned()];
        let peers = vec![peer("app", true, true, None)];
        let mut w = waiter(&app, None);
        let since = w.since_ns;
        // Other pods' hooks still coming (a node's pods stopped by the dozen): the window
        // starts over from the last of them.
        w.node_marked_ns = Some(since + 10 * S);
        assert_eq!(
            judge(rule, &w, &peers, since + 5 * S),
            Judgement::Pending {
                until_ns: since + 13 * S
            }
        );
        assert_eq!(
            judge(rule, &w, &peers, since + 13 * S),
            Judgement::Alone(Alone::Silence)
        );
        // One long before changes nothing.
        w.node_marked_ns = Some(since - 60 * S);
        assert_eq!(
            judge(rule, &w, &peers, since + 3 * S),
            Judgement::Alone(Alone::Silence)
        );
    }

    #[test]
    fn which_prestops_mark() {
        let yes = [
            r#"{"exec":{"command":["/var/run/exitorder-bin/exitorder-entrypoint","wait","--timeout","25s"]}}"#,
            r#"{"exec":{"command":["/var/run/exitorder-bin/exitorder-entrypoint","mark","--","/bin/sh","-c","sleep 1"]}}"#,
            r#"{"exec":{"command":["/var/run/exitorder-bin/exitorder-entrypoint-v2","mark"]}}"#,
            r#"{"exec":{"command":["exitorder-entrypoint","-wait-container-exit","-entrypoint","/stop"]}}"#,
        ];
        let no = [
            r#"{"exec":{"command":["/bin/sh","-c","exitorder-entrypoint wait"]}}"#,
            r#"{"exec":{"command":["/var/run/exitorder-bin/exitorder-entrypoint","shutdown","--post","http://127.0.0.1/"]}}"#,
            r#"{"exec":{"command":["/var/run/exitorder-bin/exitorder-entrypoint"]}}"#,
            r#"{"httpGet":{"path":"/stop","port":80}}"#,
            r#"{"sleep":{"seconds":5}}"#,
            "not json",
            "",
        ];
        for h in yes {
            assert!(prestop_marks(h), "{h}");
        }
        for h in no {
            assert!(!prestop_marks(h), "{h}");
        }
        let huge = format!(
            r#"{{"exec":{{"command":["exitorder-entrypoint","wait","{}"]}}}}"#,
            "x".repeat(70_000)
        );
        assert!(!prestop_marks(&huge));
    }
}
