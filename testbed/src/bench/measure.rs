//! From one pod deletion's facts to one exit-to-allow delay, or to the anomaly that stops it
//! from being one.

use serde::Serialize;

/// The only reason that says an allow followed the exit of what the sidecar serves.
pub const ORDERED: &str = "ordered";

/// An allow, by whoever wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    /// When `allow` was written (Unix ns, wall clock).
    pub at_ns: i64,
    pub reason: String,
    /// Whether the writer saw the sidecar waiting while its app still ran. When it did not,
    /// the wait began after the app had exited, and the delay includes the preStop's start.
    pub held: bool,
}

/// What is known about one deleted pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trial {
    /// The runtime's `finished_at` of the last lower-priority container (Unix ns); `None`
    /// when the deletion failed or the runtime gave no time.
    pub trigger_ns: Option<i64>,
    pub allow: Option<Allow>,
    pub deletion_failed: bool,
}

/// Deletions that give no delay, by why. None of them is hidden in the percentiles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Anomalies {
    pub deletion_failed: usize,
    /// The runtime reported no exit time for the app.
    pub no_exit_time: usize,
    /// No allow was written for the sidecar.
    pub missing_allow: usize,
    /// Allowed for another reason than the order (deadline, unknown pod): not a detection.
    pub not_ordered: usize,
    /// `allow` was written before the app exited: the order was broken.
    pub allow_before_trigger: usize,
}

impl Anomalies {
    pub fn total(&self) -> usize {
        self.deletion_failed
            + self.no_exit_time
            + self.missing_allow
            + self.not_ordered
            + self.allow_before_trigger
    }
}

/// The delays of a set of deletions, and what was wrong with the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub delays_ms: Vec<f64>,
    pub anomalies: Anomalies,
    /// Allows counted in the delays whose wait began after the app had exited.
    pub late_waits: usize,
}

/// Sorts each trial into a delay or an anomaly.
pub fn assess(trials: &[Trial]) -> Outcome {
    let mut out = Outcome::default();
    for t in trials {
        if t.deletion_failed {
            out.anomalies.deletion_failed += 1;
            continue;
        }
        let Some(trigger) = t.trigger_ns.filter(|ns| *ns > 0) else {
            out.anomalies.no_exit_time += 1;
            continue;
        };
        let Some(allow) = &t.allow else {
            out.anomalies.missing_allow += 1;
            continue;
        };
        if allow.reason != ORDERED {
            out.anomalies.not_ordered += 1;
            continue;
        }
        if allow.at_ns < trigger {
            out.anomalies.allow_before_trigger += 1;
            continue;
        }
        if !allow.held {
            out.late_waits += 1;
        }
        out.delays_ms.push((allow.at_ns - trigger) as f64 / 1e6);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(trigger: Option<i64>, allow: Option<(i64, &str, bool)>) -> Trial {
        Trial {
            trigger_ns: trigger,
            allow: allow.map(|(at_ns, reason, held)| Allow {
                at_ns,
                reason: reason.to_owned(),
                held,
            }),
            deletion_failed: false,
        }
    }

    #[test]
    fn delays_and_anomalies() {
        let mut failed = trial(Some(1), None);
        failed.deletion_failed = true;
        let trials = [
            trial(Some(1_000_000_000), Some((1_002_500_000, ORDERED, true))),
            trial(Some(1_000_000_000), Some((1_000_000_000, ORDERED, false))),
            trial(Some(1_000_000_000), Some((999_000_000, ORDERED, true))),
            trial(Some(1_000_000_000), Some((1_000_000_500, "deadline", true))),
            trial(Some(1_000_000_000), None),
            trial(None, Some((5, ORDERED, true))),
            trial(Some(0), Some((5, ORDERED, true))),
            failed,
        ];
        let out = assess(&trials);
        assert_eq!(out.delays_ms, vec![2.5, 0.0]);
        assert_eq!(out.late_waits, 1);
        assert_eq!(
            out.anomalies,
            Anomalies {
                deletion_failed: 1,
                no_exit_time: 2,
                missing_allow: 1,
                not_ordered: 1,
                allow_before_trigger: 1,
            }
        );
        assert_eq!(out.anomalies.total(), 6);
        assert!(assess(&[]).delays_ms.is_empty());
    }
}
