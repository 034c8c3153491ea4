//! From one pod deletion's facts to the one place it counts: a delay (allowed in order), or
//! the reason it gives none. Every deletion lands in exactly one place; none is hidden.
//!
//! The trigger of a wait is the later of the exit of the last lower-priority container (as
//! the app stamped it just before; else as the kernel told the test bed's own pidfd, or the
//! runtime's `finished_at`, which comes after the runtime's bookkeeping) and the appearance
//! of the sidecar's exit file: the agent cannot answer before both.

use std::collections::BTreeMap;

use serde::Serialize;

use super::stages::{stage_times, AllowTimes, StageSamples};

/// The only reason that says an allow followed the exit of what the sidecar serves.
pub const ORDERED: &str = "ordered";
/// The reason of an allow released by the grace deadline.
pub const DEADLINE: &str = "deadline";

/// An allow, by whoever wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    /// When `allow` was written (Unix ns, wall clock).
    pub at_ns: i64,
    pub reason: String,
    /// When the sidecar's exit file appeared (Unix ns), as the writer saw it.
    pub wait_since_ns: Option<i64>,
    /// How much of the delay was the writer's own (after it learnt of the trigger), when
    /// it says.
    pub decided_ns: Option<i64>,
    /// Of that, the write and rename of `allow` alone, when it says.
    pub write_ns: Option<i64>,
    /// From the kernel's word of the exit (its thread's wake) to `allow`, when it says.
    pub kernel_ns: Option<i64>,
    /// Which source told the writer of the exit, when it says (`kernel`, `runtime`).
    pub told_by: Option<String>,
}

/// What the sidecar's preStop hook did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreStop {
    /// It ran and waited (its exit file was made).
    Waited,
    /// It never waited: not run, the exec failed, or the entrypoint could not post its
    /// request; why.
    NeverWaited(String),
}

/// What is known about one deleted pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trial {
    /// The exit of the last lower-priority container (Unix ns): the app's own stamp, else the
    /// kernel's, else the runtime's `finished_at`; `None` when none gave a time.
    pub exit_ns: Option<i64>,
    /// Whether `exit_ns` is the app's own stamp, taken before its exit: no allow in order can
    /// precede it, by any slack.
    pub exit_by_app: bool,
    pub allow: Option<Allow>,
    pub prestop: PreStop,
    /// When the sidecar's preStop returned (Unix ns), as the runtime ended its exec.
    pub returned_ns: Option<i64>,
    pub deletion_failed: bool,
}

/// Where each deletion counted: every one in exactly one field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Allowed once every lower-priority container had exited: the delays.
    pub ordered: usize,
    /// Released by the grace deadline (the app ran past the grace period minus the reserve).
    pub deadline: usize,
    /// Allowed for another reason (the pod or container unknown to the agent): the agent
    /// failed open where it should have known the pod. An agent failure.
    pub other_reason: usize,
    /// The preStop never waited (see `never_waited`): nothing the agent could answer.
    pub prestop_never_waited: usize,
    /// The exit file was posted and no allow came. An agent failure.
    pub no_allow: usize,
    /// `allow` was written before the app exited: the order was broken. An agent failure.
    pub allow_before_exit: usize,
    /// The runtime gave no exit time for the app.
    pub no_exit_time: usize,
    /// The deletion itself failed.
    pub deletion_failed: usize,
    /// Why the preStops that never waited did not, with how many.
    pub never_waited: BTreeMap<String, usize>,
}

impl Tally {
    /// Deletions counted anywhere: equals the deletions made.
    pub fn total(&self) -> usize {
        self.ordered
            + self.deadline
            + self.other_reason
            + self.prestop_never_waited
            + self.no_allow
            + self.allow_before_exit
            + self.no_exit_time
            + self.deletion_failed
    }

    /// What only the agent can be blamed for; 0 in every healthy run.
    pub fn agent_failures(&self) -> usize {
        self.other_reason + self.no_allow + self.allow_before_exit
    }
}

/// The delays of a set of deletions, and where the others went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub delays_ms: Vec<f64>,
    /// Of the ordered allows, the writer's own part of each delay (the rest is the runtime
    /// telling of the exit).
    pub decided_ms: Vec<f64>,
    pub tally: Tally,
    /// Ordered allows whose wait began after the app had exited (their trigger is the exit
    /// file's appearance).
    pub late_waits: usize,
    /// Ordered allows written up to [`CLOCK_SLACK_NS`] before the app's exit as the test bed
    /// stamped it (an app that stamped none): the agent heard the kernel first (both hear it;
    /// the test bed's stamp comes when its thread runs). Counted as 0 ms.
    pub ahead_of_clock: usize,
    /// Of the ordered allows, how many were answered on each source's word of the exit.
    pub told_by: BTreeMap<String, usize>,
    /// Of the ordered allows, where the time went.
    pub stages: StageSamples,
    /// Trials timed from the app's own stamp of its exit.
    pub stamped_by_app: usize,
}

/// How far an allow may precede the test bed's stamp of the exit and still be the agent
/// hearing the kernel first: beyond it, the order was broken. Well under an app's drain
/// (500 ms unless `--app-drain` says otherwise): an allow out of order comes at TERM, a whole
/// drain before the exit. Well over how late the test bed's stamping thread runs on a
/// saturated node: in a burst of pods deleted at once on 2 busy cores it came up to 8 ms
/// after the agent had heard the same exit.
pub const CLOCK_SLACK_NS: i64 = 100_000_000;

/// Sorts each trial into a delay or the reason it gives none.
pub fn assess(trials: &[Trial]) -> Outcome {
    let mut out = Outcome::default();
    for t in trials {
        if t.exit_by_app {
            out.stamped_by_app += 1;
        }
        let tally = &mut out.tally;
        if t.deletion_failed {
            tally.deletion_failed += 1;
            continue;
        }
        let Some(allow) = &t.allow else {
            match &t.prestop {
                PreStop::NeverWaited(why) => {
                    tally.prestop_never_waited += 1;
                    *tally.never_waited.entry(why.clone()).or_default() += 1;
                }
                PreStop::Waited => tally.no_allow += 1,
            }
            continue;
        };
        let Some(exit) = t.exit_ns.filter(|ns| *ns > 0) else {
            tally.no_exit_time += 1;
            continue;
        };
        match allow.reason.as_str() {
            ORDERED => {}
            DEADLINE => {
                tally.deadline += 1;
                continue;
            }
            _ => {
                tally.other_reason += 1;
                continue;
            }
        }
        if allow.at_ns < exit {
            let slack = if t.exit_by_app { 0 } else { CLOCK_SLACK_NS };
            if exit.saturating_sub(allow.at_ns) > slack {
                tally.allow_before_exit += 1;
                continue;
            }
            out.ahead_of_clock += 1;
        }
        let trigger = match allow.wait_since_ns {
            Some(since) if since > exit => {
                out.late_waits += 1;
                since
            }
            _ => exit,
        };
        tally.ordered += 1;
        out.delays_ms
            .push(allow.at_ns.saturating_sub(trigger).max(0) as f64 / 1e6);
        if let Some(d) = allow.decided_ns {
            out.decided_ms.push(d as f64 / 1e6);
        }
        let times = AllowTimes {
            at_ns: allow.at_ns,
            decided_ns: allow.decided_ns,
            write_ns: allow.write_ns,
            kernel_ns: allow.kernel_ns,
        };
        if let Some(s) = stage_times(trigger, times, t.returned_ns) {
            out.stages.push(s);
        }
        if let Some(by) = &allow.told_by {
            *out.told_by.entry(by.clone()).or_default() += 1;
        }
    }
    out
}

/// What a preStop's record says about its wait: `None` when it did wait, else why not.
/// `output` is what the hook printed (the entrypoint says "waiting up to ..." once its
/// request is posted).
pub fn never_waited(hook: Option<(bool, &str)>) -> Option<String> {
    match hook {
        None => Some("the preStop did not run (the container was not running)".to_owned()),
        Some((_, output)) if output.contains("waiting up to") => None,
        Some((false, output)) if output.contains("ExecSync") => {
            Some(format!("the preStop exec failed: {}", first_words(output)))
        }
        Some((_, output)) => Some(format!("the preStop did not wait: {}", first_words(output))),
    }
}

/// The start of a message, enough to group like failures.
fn first_words(s: &str) -> String {
    let s = s.trim();
    let cut = s.char_indices().nth(80).map_or(s.len(), |(i, _)| i);
    s[..cut].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(exit: Option<i64>, allow: Option<(i64, &str, Option<i64>)>) -> Trial {
        Trial {
            exit_ns: exit,
            exit_by_app: false,
            allow: allow.map(|(at_ns, reason, wait_since_ns)| Allow {
                at_ns,
                reason: reason.to_owned(),
                wait_since_ns,
                decided_ns: None,
                write_ns: None,
                kernel_ns: None,
                told_by: Some("kernel".to_owned()),
            }),
            prestop: PreStop::Waited,
            returned_ns: None,
            deletion_failed: false,
        }
    }

    #[test]
    fn an_allow_just_ahead_of_the_stamp_is_ordered_one_far_ahead_broke_the_order() {
        let s = 1_000_000_000;
        let out = assess(&[
            trial(Some(s), Some((s - 1_000_000, ORDERED, Some(s - 9_000_000)))),
            trial(
                Some(s),
                Some((s - 300_000_000, ORDERED, Some(s - 900_000_000))),
            ),
        ]);
        assert_eq!((out.tally.ordered, out.ahead_of_clock), (1, 1));
        assert_eq!(out.delays_ms, vec![0.0]);
        assert_eq!(out.tally.allow_before_exit, 1);
    }

    #[test]
    fn every_deletion_counts_in_exactly_one_place() {
        let mut failed = trial(Some(1), None);
        failed.deletion_failed = true;
        let mut skipped = trial(Some(1), None);
        skipped.prestop = PreStop::NeverWaited("the preStop exec failed: timeout".into());
        let s = 1_000_000_000;
        let trials = [
            // Held, allowed 2.5 ms after the app's exit.
            trial(Some(s), Some((s + 2_500_000, ORDERED, Some(s - 5)))),
            // The wait began 1 ms after the exit: the trigger is the exit file.
            trial(Some(s), Some((s + 1_500_000, ORDERED, Some(s + 1_000_000)))),
            // Far (300 ms) ahead of the app's exit: the order was broken.
            trial(Some(s), Some((s - 300_000_000, ORDERED, None))),
            trial(Some(s), Some((s + 500, DEADLINE, None))),
            trial(Some(s), Some((s + 500, "unknown", None))),
            trial(Some(s), None),
            trial(None, Some((5, ORDERED, None))),
            failed,
            skipped,
        ];
        let out = assess(&trials);
        assert_eq!(out.delays_ms, vec![2.5, 0.5]);
        assert_eq!(out.late_waits, 1);
        let t = &out.tally;
        assert_eq!(
            (
                t.ordered,
                t.deadline,
                t.other_reason,
                t.prestop_never_waited,
                t.no_allow
            ),
            (2, 1, 1, 1, 1)
        );
        assert_eq!(
            (t.allow_before_exit, t.no_exit_time, t.deletion_failed),
            (1, 1, 1)
        );
        assert_eq!(t.total(), trials.len());
        assert_eq!(t.agent_failures(), 3);
        assert_eq!(t.never_waited["the preStop exec failed: timeout"], 1);
        assert!(assess(&[]).delays_ms.is_empty());
    }

    #[test]
    fn what_a_prestop_record_says() {
        assert_eq!(
            never_waited(Some((
                true,
                "exitorder-entrypoint: waiting up to 30s for exit permission"
            ))),
            None
        );
        assert!(never_waited(None).unwrap().contains("did not run"));
        assert!(never_waited(Some((false, "ExecSync: deadline exceeded")))
            .unwrap()
            .starts_with("the preStop exec failed"));
        assert!(never_waited(Some((true, "cannot create exit file")))
            .unwrap()
            .starts_with("the preStop did not wait"));
    }
}
