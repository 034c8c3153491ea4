//! What happened to a pod, in order: every container's start, readiness, hooks, TERM and exit,
//! and the agent's allows when they are merged in. All on the wall clock (Unix ns), the clock
//! the runtime's `finished_at` and the agent's log timestamps are on.

use std::fmt;

use serde::Serialize;

pub use crate::clock::now_ns;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum What {
    /// The sandbox ran (the pod's network and namespaces exist).
    SandboxReady,
    Created {
        attempt: u32,
    },
    Started {
        attempt: u32,
    },
    PostStartStarted {
        handler: String,
    },
    PostStartEnded {
        ok: bool,
        detail: String,
    },
    /// The startup probe succeeded, or there is none and postStart returned.
    StartupDone,
    Ready,
    NotReady,
    ProbeFailed {
        probe: &'static str,
        detail: String,
    },
    /// The kubelet decided to kill the container (liveness, postStart failure).
    Killing {
        reason: String,
    },
    Restarting {
        attempt: u32,
        after_ms: u64,
    },
    /// A `RestartAllContainers` rule matched this container's exit (KEP-5532): every
    /// container is killed and removed, and the pod runs again in the same sandbox.
    RestartingAll {
        exit_code: i32,
    },
    /// Every container of the pod is gone from the runtime: the pod starts again.
    AllContainersRemoved,
    DeletionStarted {
        grace_seconds: i64,
    },
    PreStopStarted {
        handler: String,
    },
    PreStopEnded {
        ok: bool,
        detail: String,
    },
    /// Waiting for its turn to stop (native sidecars: main containers and later sidecars).
    TurnCame,
    /// StopContainer sent: TERM now, KILL after `grace_seconds`.
    Term {
        grace_seconds: i64,
    },
    Exited {
        attempt: u32,
        exit_code: i32,
        reason: String,
    },
    PhaseChanged {
        phase: Phase,
    },
    SandboxRemoved,
    /// The agent wrote `allow` (from its log).
    Allowed {
        reason: String,
    },
    /// Something went wrong for the runner itself.
    Error {
        detail: String,
    },
    /// The kubelet kills the whole pod, and why (a kind other than a deletion).
    KubeletKill {
        kill: &'static str,
    },
    /// A second deletion shortened the grace period: the kill starts over with it.
    GraceShortened {
        grace_seconds: i64,
    },
    /// An attempt at the pod's kill failed; the pod worker tries again after its back-off.
    KillFailed {
        detail: String,
    },
    /// The container's image was changed in the pod's spec (an in-place update).
    ImageUpdated {
        image: String,
    },
    /// An Event the kubelet recorded, as given to the API sink.
    ApiEvent {
        reason: String,
        message: String,
    },
    /// The pod's status as reported to the API sink, when its phase or reason changed.
    ApiStatus {
        phase: String,
        reason: Option<String>,
    },
}

/// The pod's phase, as the kubelet reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    /// Being deleted.
    Terminating,
    /// Deleted: the sandbox is gone.
    Deleted,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Unix ns.
    pub at_ns: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(flatten)]
    pub what: What,
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            What::SandboxReady => write!(f, "sandbox ready"),
            What::Created { attempt } => write!(f, "created (attempt {attempt})"),
            What::Started { attempt } => write!(f, "started (attempt {attempt})"),
            What::PostStartStarted { handler } => write!(f, "postStart started: {handler}"),
            What::PostStartEnded { ok, detail } => {
                write!(f, "postStart {}", if *ok { "returned" } else { "failed" })?;
                if !detail.is_empty() {
                    write!(f, ": {detail}")?;
                }
                Ok(())
            }
            What::StartupDone => write!(f, "started up"),
            What::Ready => write!(f, "ready"),
            What::NotReady => write!(f, "not ready"),
            What::ProbeFailed { probe, detail } => write!(f, "{probe} probe failed: {detail}"),
            What::Killing { reason } => write!(f, "killing: {reason}"),
            What::Restarting { attempt, after_ms } => {
                write!(f, "restarting as attempt {attempt} after {after_ms} ms")
            }
            What::RestartingAll { exit_code } => write!(
                f,
                "exit {exit_code} matches a RestartAllContainers rule: every container restarts"
            ),
            What::AllContainersRemoved => {
                write!(f, "every container removed; the pod starts again")
            }
            What::DeletionStarted { grace_seconds } => {
                write!(f, "deletion started (grace period {grace_seconds} s)")
            }
            What::PreStopStarted { handler } => write!(f, "preStop started: {handler}"),
            What::PreStopEnded { ok, detail } => {
                write!(f, "preStop {}", if *ok { "returned" } else { "failed" })?;
                if !detail.is_empty() {
                    write!(f, ": {detail}")?;
                }
                Ok(())
            }
            What::TurnCame => write!(f, "its turn to stop came"),
            What::Term { grace_seconds } => {
                write!(f, "TERM sent (KILL after {grace_seconds} s)")
            }
            What::Exited {
                attempt,
                exit_code,
                reason,
            } => {
                write!(f, "exited with {exit_code}")?;
                if !reason.is_empty() {
                    write!(f, " ({reason})")?;
                }
                if *attempt > 0 {
                    write!(f, ", attempt {attempt}")?;
                }
                Ok(())
            }
            What::PhaseChanged { phase } => write!(f, "pod phase {phase}"),
            What::SandboxRemoved => write!(f, "sandbox removed"),
            What::Allowed { reason } => write!(f, "allow written by the agent (reason {reason})"),
            What::Error { detail } => write!(f, "error: {detail}"),
            What::KubeletKill { kill } => write!(f, "the kubelet kills the pod: {kill}"),
            What::GraceShortened { grace_seconds } => write!(
                f,
                "grace period shortened to {grace_seconds} s: the kill starts over"
            ),
            What::KillFailed { detail } => {
                write!(
                    f,
                    "the kill failed ({detail}); tried again after the back-off"
                )
            }
            What::ImageUpdated { image } => write!(f, "image updated in the spec to {image}"),
            What::ApiEvent { reason, message } => write!(f, "Event {reason}: {message}"),
            What::ApiStatus { phase, reason } => {
                write!(f, "API status {phase}")?;
                if let Some(r) = reason {
                    write!(f, " ({r})")?;
                }
                Ok(())
            }
        }
    }
}

/// A pod's events in the order they were recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Timeline {
    pub events: Vec<Event>,
}

impl Timeline {
    pub fn push(&mut self, at_ns: i64, container: Option<&str>, what: What) {
        self.events.push(Event {
            at_ns,
            container: container.map(str::to_owned),
            what,
        });
    }

    /// The events sorted by time (stable for equal times).
    pub fn sorted(&self) -> Vec<&Event> {
        let mut v: Vec<&Event> = self.events.iter().collect();
        v.sort_by_key(|e| e.at_ns);
        v
    }

    /// The first event about `container` that matches.
    pub fn first(&self, container: &str, pred: impl Fn(&What) -> bool) -> Option<&Event> {
        self.sorted()
            .into_iter()
            .find(|e| e.container.as_deref() == Some(container) && pred(&e.what))
    }

    /// The last event about `container` that matches.
    pub fn last(&self, container: &str, pred: impl Fn(&What) -> bool) -> Option<&Event> {
        self.sorted()
            .into_iter()
            .rev()
            .find(|e| e.container.as_deref() == Some(container) && pred(&e.what))
    }

    /// One line per event, in ms from `origin_ns`.
    pub fn render(&self, origin_ns: i64) -> String {
        let width = self
            .events
            .iter()
            .filter_map(|e| e.container.as_ref().map(String::len))
            .max()
            .unwrap_or(0);
        self.sorted()
            .into_iter()
            .map(|e| {
                let ms = (e.at_ns - origin_ns) as f64 / 1e6;
                format!(
                    "  {ms:>+9.0} ms  {:<width$}  {}",
                    e.container.as_deref().unwrap_or("(pod)"),
                    e.what
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_in_time_order_from_the_origin() {
        let mut t = Timeline::default();
        t.push(3_000_000, Some("proxy"), What::Term { grace_seconds: 2 });
        t.push(
            1_000_000,
            Some("app"),
            What::Exited {
                attempt: 0,
                exit_code: 0,
                reason: "Completed".into(),
            },
        );
        t.push(
            2_000_000,
            None,
            What::Allowed {
                reason: "ordered".into(),
            },
        );
        let text = t.render(0);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("+1 ms")
                && lines[0].contains("app")
                && lines[0].contains("exited with 0 (Completed)"),
            "{text}"
        );
        assert!(
            lines[1].contains("(pod)") && lines[1].contains("reason ordered"),
            "{text}"
        );
        assert!(lines[2].contains("TERM sent (KILL after 2 s)"), "{text}");
        assert_eq!(
            t.first("app", |w| matches!(w, What::Exited { .. }))
                .map(|e| e.at_ns),
            Some(1_000_000)
        );
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["events"][0]["event"], "term");
        assert_eq!(json["events"][0]["grace_seconds"], 2);
    }
}
