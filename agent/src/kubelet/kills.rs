//! The kinds of kill the kubelet does, and how the agent tells them apart.
//!
//! Every kill runs the preStop hook the same way (`kuberuntime/kuberuntime_container.go`
//! `killContainer`), so a sidecar's exit file says nothing of why. What does:
//! - `killContainer` records a core/v1 Event, reason `Killing`, on the pod (field path
//!   `spec.containers{NAME}`), *before* it runs the hook. Its message is the caller's reason:
//!   empty for a whole-pod kill, which `killContainer` turns into "Stopping container NAME"
//!   (`killContainersWithSyncResult` passes none), and, for one container killed while the pod
//!   stays, what `kuberuntime_manager.go` `computePodActions` wrote: "Container NAME failed
//!   liveness probe", "... failed startup probe", "... definition changed" (an in-place
//!   update of its image), each followed by ", will be restarted" when the container's policy
//!   restarts it.
//! - The whole-pod kills record their own Event first: `eviction/eviction_manager.go`
//!   `evictPod` records `Evicted` before it calls the kill; `active_deadline.go` `ShouldEvict`
//!   `DeadlineExceeded`; `preemption/preemption.go` `Preempting`. Graceful node shutdown
//!   (`nodeshutdown`) records none per pod.
//! - A deletion through the API sets `deletionTimestamp`: the pod watch sees it, no Event
//!   needed.
//!
//! Events are best effort: the kubelet's recorder sends them asynchronously, within its QPS
//! and burst (`eventRecordQPS` 50, `eventBurst` 100 by default), and client-go's spam filter
//! drops an object's events past a burst of 25 (one per 5 minutes after that). So a missing
//! Event proves nothing, and the agent errs toward the order: only the kubelet's word that it
//! kills *this one container* releases a wait early (reason `not_terminating`); every other
//! case (a pod kill recognised, or no word at all) keeps the wait ordered. A restart whose
//! word was lost is held to its deadline, which is slow; a pod kill taken for a restart would
//! break the order, which is what exitorder exists to prevent.

use std::collections::BTreeMap;
use std::fmt;

/// Seconds of slack when comparing an Event's time with the agent's own clock: the API
/// server keeps `lastTimestamp` in whole seconds, and the kubelet takes it just before it
/// starts the hook that makes the exit file.
pub const EVENT_SLACK_SECS: i64 = 2;

/// The prefix of an Event the recorder aggregated.
const COMBINED: &str = "(combined from similar events): ";

/// Why the kubelet kills one container while the pod stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ContainerKill {
    /// "Container NAME failed liveness probe".
    Liveness,
    /// "Container NAME failed startup probe": the probe's own terminationGracePeriodSeconds.
    Startup,
    /// "Container NAME definition changed": an in-place update of the container's image.
    DefinitionChanged,
    /// "Container NAME resize requires restart": an in-place resize whose policy restarts.
    Resize,
    /// Its postStart hook failed (`startContainer` kills it with the message
    /// "FailedPostStartHook").
    PostStart,
    /// Killed alone, as the node shows (the others' silence), for a reason not said.
    Unsaid,
}

/// Why the kubelet kills a whole pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PodKill {
    /// Deleted through the API (`deletionTimestamp`), or gone from it.
    Deletion,
    /// Node-pressure eviction (`Evicted`).
    Eviction,
    /// Graceful node shutdown (the Node's Ready condition says "node is shutting down").
    NodeShutdown,
    /// `activeDeadlineSeconds` passed (`DeadlineExceeded`).
    ActiveDeadline,
    /// Admission preemption for a critical pod (`Preempting`).
    Preemption,
    /// The kubelet stops every container ("Stopping container NAME") and nothing says why.
    Unrecognised,
    /// No word from the kubelet at all (its Events were dropped or are late): ordered.
    Unknown,
}

/// What a wait's exit is, as the agent recognised it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kill {
    Pod(PodKill),
    Container(ContainerKill),
}

impl Kill {
    /// Every kind, for metrics.
    pub const ALL: [Kill; 13] = [
        Kill::Pod(PodKill::Deletion),
        Kill::Pod(PodKill::Eviction),
        Kill::Pod(PodKill::NodeShutdown),
        Kill::Pod(PodKill::ActiveDeadline),
        Kill::Pod(PodKill::Preemption),
        Kill::Pod(PodKill::Unrecognised),
        Kill::Pod(PodKill::Unknown),
        Kill::Container(ContainerKill::Liveness),
        Kill::Container(ContainerKill::Startup),
        Kill::Container(ContainerKill::DefinitionChanged),
        Kill::Container(ContainerKill::Resize),
        Kill::Container(ContainerKill::PostStart),
        Kill::Container(ContainerKill::Unsaid),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kill::Pod(PodKill::Deletion) => "deletion",
            Kill::Pod(PodKill::Eviction) => "eviction",
            Kill::Pod(PodKill::NodeShutdown) => "node_shutdown",
            Kill::Pod(PodKill::ActiveDeadline) => "active_deadline",
            Kill::Pod(PodKill::Preemption) => "preemption",
            Kill::Pod(PodKill::Unrecognised) => "pod_kill",
            Kill::Pod(PodKill::Unknown) => "unknown",
            Kill::Container(ContainerKill::Liveness) => "liveness_restart",
            Kill::Container(ContainerKill::Startup) => "startup_restart",
            Kill::Container(ContainerKill::DefinitionChanged) => "definition_changed",
            Kill::Container(ContainerKill::Resize) => "resize_restart",
            Kill::Container(ContainerKill::PostStart) => "post_start_failed",
            Kill::Container(ContainerKill::Unsaid) => "container_alone",
        }
    }
}

impl fmt::Display for Kill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Event about a pod, reduced to what the agent reads of it. Everything in it is as the
/// API server returned it: any client with `events create` in the namespace can write one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SeenEvent {
    pub reason: String,
    pub message: String,
    /// `involvedObject.fieldPath`, e.g. `spec.containers{proxy}`.
    pub field_path: String,
    /// `source.component` (or `reportingComponent`).
    pub component: String,
    /// `source.host` (or `reportingInstance`): the node that recorded it.
    pub host: String,
    /// When it last happened (Unix seconds): `lastTimestamp`, the series' last observation or
    /// `eventTime`, whichever is latest.
    pub last_unix: Option<i64>,
}

/// What the kubelet of a node has said about a pod since a moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Word {
    /// The whole pod is being killed, and why.
    pub pod_kill: Option<PodKill>,
    /// The containers the kubelet kills alone, each with why.
    pub containers: BTreeMap<String, ContainerKill>,
}

impl Word {
    /// What the kubelet said of container `name`'s kill: a pod kill wins over anything said
    /// of one container (fail toward the order).
    pub fn of(&self, name: &str) -> Option<Kill> {
        if let Some(k) = self.pod_kill {
            return Some(Kill::Pod(k));
        }
        self.containers.get(name).map(|c| Kill::Container(*c))
    }
}

/// The pod-level Events a whole-pod kill records before it kills.
fn pod_kill_of(reason: &str) -> Option<PodKill> {
    match reason {
        // eviction/eviction_manager.go evictPod: `Reason = "Evicted"`.
        "Evicted" => Some(PodKill::Eviction),
        // active_deadline.go: `reason = "DeadlineExceeded"`.
        "DeadlineExceeded" => Some(PodKill::ActiveDeadline),
        // preemption/preemption.go: `events.PreemptContainer` = "Preempting".
        "Preempting" => Some(PodKill::Preemption),
        _ => None,
    }
}

/// The container a `Killing` message names and why it is killed, from the kubelet's texts.
/// `None` for a text this version does not know: such a kill is ordered.
pub fn killing_message(message: &str) -> Option<(&str, Option<ContainerKill>)> {
    // kuberuntime_container.go startContainer: a failed postStart hook kills the container
    // with the hook's reason as the message; the container is the field path's.
    if message == "FailedPostStartHook" {
        return Some(("", Some(ContainerKill::PostStart)));
    }
    // kuberuntime_container.go killContainer: `fmt.Sprintf("Stopping container %s", ...)`
    // when the caller gave no message: a whole-pod kill.
    if let Some(name) = message.strip_prefix("Stopping container ") {
        return Some((name, None));
    }
    // computePodActions: "Container %s ..." for regular containers, "Init container %s ..."
    // for native sidecars (restartable init containers).
    let rest = message
        .strip_prefix("Container ")
        .or_else(|| message.strip_prefix("Init container "))?;
    // computePodActions appends this when the container's policy restarts it; without it
    // the container is killed for good, and the pod still stays.
    let rest = rest.strip_suffix(", will be restarted").unwrap_or(rest);
    for (suffix, kind) in [
        (" failed liveness probe", ContainerKill::Liveness),
        (" failed startup probe", ContainerKill::Startup),
        (" definition changed", ContainerKill::DefinitionChanged),
        (" resize requires restart", ContainerKill::Resize),
    ] {
        if let Some(name) = rest.strip_suffix(suffix) {
            return Some((name, Some(kind)));
        }
    }
    None
}

/// The container a field path names: `spec.containers{NAME}` or `spec.initContainers{NAME}`.
fn field_path_container(path: &str) -> Option<&str> {
    let inner = path
        .strip_prefix("spec.containers{")
        .or_else(|| path.strip_prefix("spec.initContainers{"))?;
    inner.strip_suffix('}')
}

/// Reads the kubelet's word from a pod's Events: only those the kubelet of `node` recorded.
/// A sign of a whole-pod kill counts at or after `since_unix` (less [`EVENT_SLACK_SECS`]) and
/// makes the word a pod kill. A `Killing` Event counts for one container only when its message
/// and its field path name the same container, and only for the attempt `attempts` gives that
/// container (its creation, Unix seconds), when the Event's last second is after that
/// attempt's: the API server keeps an Event's time in whole seconds, and an Event of the same
/// second may be the kill of the attempt before (the recorder counts identical Events into one
/// and moves its `lastTimestamp`, so an older kill's Event never looks newer than it was).
pub fn read_word(
    events: &[SeenEvent],
    node: &str,
    since_unix: i64,
    attempts: &BTreeMap<String, i64>,
) -> Word {
    let from = since_unix.saturating_sub(EVENT_SLACK_SECS);
    let mut word = Word::default();
    let mut stopping = false;
    for e in events {
        if e.component != "kubelet" || e.host != node {
            continue;
        }
        let Some(at) = e.last_unix else { continue };
        if let Some(kind) = pod_kill_of(&e.reason) {
            if at >= from {
                word.pod_kill = Some(kind);
            }
            continue;
        }
        if e.reason != "Killing" {
            continue;
        }
        // client-go's `EventAggregate` (`tools/record/events_cache.go`): past 10 messages of
        // one reason about an object within 10 minutes, the recorder writes one Event
        // "(combined from similar events): <message>" and then only patches its count, time
        // and message, never its field path (the first aggregate's). Its message and field
        // path may name different containers: it is a sign of nothing.
        if e.message.starts_with(COMBINED) {
            continue;
        }
        let named = field_path_container(&e.field_path);
        match killing_message(&e.message) {
            Some((name, Some(k)))
                if named == Some(name) || (name.is_empty() && named.is_some()) =>
            {
                // Another attempt's (or another container's) kill alone: no word for this
                // one, and no sign of a pod kill either.
                let name = named.unwrap_or(name);
                if attempts.get(name).is_some_and(|created| at > *created) {
                    word.containers.insert(name.to_owned(), k);
                }
            }
            _ if at < from => {}
            // "Stopping container", or a Killing the agent cannot read: not a word for one
            // container.
            _ => stopping = true,
        }
    }
    if stopping && word.pod_kill.is_none() {
        word.pod_kill = Some(PodKill::Unrecognised);
    }
    if word.pod_kill.is_some() {
        word.containers.clear();
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attempts a read is for: `proxy` and `app` created at second 98.
    fn attempts() -> BTreeMap<String, i64> {
        BTreeMap::from([("proxy".to_owned(), 98), ("app".to_owned(), 98)])
    }

    fn ev(reason: &str, message: &str, container: &str, at: i64) -> SeenEvent {
        SeenEvent {
            reason: reason.into(),
            message: message.into(),
            field_path: if container.is_empty() {
                String::new()
            } else {
                format!("spec.containers{{{container}}}")
            },
            component: "kubelet".into(),
            host: "node-a".into(),
            last_unix: Some(at),
        }
    }

    #[test]
    fn the_kubelets_messages_are_read() {
        assert_eq!(
            killing_message("Stopping container proxy"),
            Some(("proxy", None))
        );
        assert_eq!(
            killing_message("Container proxy failed liveness probe, will be restarted"),
            Some(("proxy", Some(ContainerKill::Liveness)))
        );
        assert_eq!(
            killing_message("Container proxy failed liveness probe"),
            Some(("proxy", Some(ContainerKill::Liveness)))
        );
        assert_eq!(
            killing_message("Container proxy failed startup probe, will be restarted"),
            Some(("proxy", Some(ContainerKill::Startup)))
        );
        assert_eq!(
            killing_message("Container proxy definition changed, will be restarted"),
            Some(("proxy", Some(ContainerKill::DefinitionChanged)))
        );
        assert_eq!(
            killing_message("Init container proxy failed startup probe, will be restarted"),
            Some(("proxy", Some(ContainerKill::Startup)))
        );
        assert_eq!(
            killing_message("Container proxy resize requires restart"),
            Some(("proxy", Some(ContainerKill::Resize)))
        );

        assert_eq!(
            killing_message("Container is in \"unknown\" state, try killing it before restart"),
            None
        );
        assert_eq!(
            killing_message("FailedPostStartHook"),
            Some(("", Some(ContainerKill::PostStart)))
        );
        assert_eq!(killing_message("Container proxy is being killed"), None);
        assert_eq!(killing_message(""), None);
    }

    #[test]
    fn a_restart_is_only_the_kubelets_word_for_that_container() {
        let restart = ev(
            "Killing",
            "Container proxy failed liveness probe, will be restarted",
            "proxy",
            100,
        );
        let w = read_word(std::slice::from_ref(&restart), "node-a", 100, &attempts());
        assert_eq!(
            w.of("proxy"),
            Some(Kill::Container(ContainerKill::Liveness))
        );
        assert_eq!(w.of("app"), None);

        // Another node's kubelet, another component, an old event, a field path naming
        // another container: none of them is this kubelet's word for this kill.
        let mut other_node = restart.clone();
        other_node.host = "node-b".into();
        let mut other_component = restart.clone();
        other_component.component = "exitorder".into();
        let mut old = restart.clone();
        old.last_unix = Some(98);
        let mut undated = restart.clone();
        undated.last_unix = None;
        let mut elsewhere = restart.clone();
        elsewhere.field_path = "spec.containers{app}".into();
        for e in [other_node, other_component, old, undated] {
            assert_eq!(
                read_word(std::slice::from_ref(&e), "node-a", 100, &attempts()),
                Word::default(),
                "{e:?}"
            );
        }
        // A Killing whose message and field path disagree is not read as a restart: ordered.
        let w = read_word(std::slice::from_ref(&elsewhere), "node-a", 100, &attempts());
        assert_eq!(w.of("proxy"), Some(Kill::Pod(PodKill::Unrecognised)));
    }

    #[test]
    fn any_sign_of_a_pod_kill_wins() {
        let restart = ev(
            "Killing",
            "Container proxy failed liveness probe, will be restarted",
            "proxy",
            100,
        );
        for (sign, kind) in [
            (
                ev("Evicted", "The node was low on resource: memory.", "", 100),
                PodKill::Eviction,
            ),
            (
                ev(
                    "DeadlineExceeded",
                    "Pod was active on the node longer than the specified deadline",
                    "",
                    100,
                ),
                PodKill::ActiveDeadline,
            ),
            (
                ev(
                    "Preempting",
                    "Preempted in order to admit critical pod",
                    "",
                    100,
                ),
                PodKill::Preemption,
            ),
            (
                ev("Killing", "Stopping container app", "app", 101),
                PodKill::Unrecognised,
            ),
            (
                ev(
                    "Killing",
                    "Container app was killed for reasons unknown",
                    "app",
                    101,
                ),
                PodKill::Unrecognised,
            ),
        ] {
            let w = read_word(&[restart.clone(), sign.clone()], "node-a", 100, &attempts());
            assert_eq!(w.of("proxy"), Some(Kill::Pod(kind)), "{sign:?}");
            assert!(w.containers.is_empty());
        }
    }

    #[test]
    fn a_kill_alone_counts_only_for_the_attempt_it_killed() {
        // The liveness kill of the attempt before (second 97, or the very second this one was
        // created): no word for this attempt, and no sign of a pod kill either.
        for at in [97, 98] {
            let before = ev(
                "Killing",
                "Container proxy failed liveness probe, will be restarted",
                "proxy",
                at,
            );
            assert_eq!(
                read_word(std::slice::from_ref(&before), "node-a", 99, &attempts()),
                Word::default(),
                "{at}"
            );
        }
        // A container the read is not for: nothing.
        let other = ev(
            "Killing",
            "Container logs failed liveness probe, will be restarted",
            "logs",
            100,
        );
        assert_eq!(
            read_word(std::slice::from_ref(&other), "node-a", 100, &attempts()),
            Word::default()
        );
        // A failed postStart names its container by the field path only.
        let post = ev("Killing", "FailedPostStartHook", "proxy", 99);
        assert_eq!(
            read_word(std::slice::from_ref(&post), "node-a", 99, &attempts()).of("proxy"),
            Some(Kill::Container(ContainerKill::PostStart))
        );
        let nameless = SeenEvent {
            field_path: String::new(),
            ..post
        };
        assert_eq!(
            read_word(std::slice::from_ref(&nameless), "node-a", 99, &attempts()).of("proxy"),
            Some(Kill::Pod(PodKill::Unrecognised))
        );
    }

    #[test]
    fn an_aggregated_event_is_a_sign_of_nothing() {
        // The recorder's aggregate keeps the first aggregate's field path (`app`) while its
        // message follows the latest Killing (`proxy`'s).
        let combined = SeenEvent {
            field_path: "spec.containers{app}".into(),
            ..ev(
                "Killing",
                "(combined from similar events): Container proxy failed liveness probe, will be restarted",
                "proxy",
                100,
            )
        };
        assert_eq!(
            read_word(std::slice::from_ref(&combined), "node-a", 100, &attempts()),
            Word::default()
        );
    }
}
