//! Where an allow's time goes, stage by stage: the app's exit (its own stamp) → the agent's
//! notice of it (the kernel's or the runtime's word reaching the agent) → its decision → the
//! `allow` renamed in place → the preStop's return (the runtime's end of its exec). When the
//! kernel told the exit, the notice is split in two: the agent woken by the kernel (its
//! decision loop, which awaits the pidfds itself), then the exit taken in (applied to its
//! node view).

use serde::Serialize;

use super::summary::figures;

/// One allow's stages, in ms; a stage the writer does not say is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    pub exit_to_notice: Option<f64>,
    pub exit_to_kernel_wake: Option<f64>,
    pub kernel_wake_to_notice: Option<f64>,
    pub notice_to_decision: Option<f64>,
    pub decision_to_allow: Option<f64>,
    pub allow_to_return: Option<f64>,
}

/// What an allow's writer said of it (Unix ns, and durations in ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllowTimes {
    /// When `allow` was in place.
    pub at_ns: i64,
    /// From the writer's notice of the trigger to `at_ns`.
    pub decided_ns: Option<i64>,
    /// Of that, the write and rename alone.
    pub write_ns: Option<i64>,
    /// From the kernel's word (its thread's wake) to `at_ns`, when the kernel told.
    pub kernel_ns: Option<i64>,
}

/// The stages of one allow triggered at `trigger_ns`, its preStop back at `returned_ns`;
/// `None` when the writer says nothing of its own part (the baseline daemon).
pub fn stage_times(
    trigger_ns: i64,
    allow: AllowTimes,
    returned_ns: Option<i64>,
) -> Option<StageTimes> {
    let ms = |ns: i64| ns.max(0) as f64 / 1e6;
    let decided = allow.decided_ns?;
    let notice = allow.at_ns - decided;
    let woke = allow.kernel_ns.map(|k| allow.at_ns - k);
    Some(StageTimes {
        exit_to_notice: Some(ms(notice - trigger_ns)),
        exit_to_kernel_wake: woke.map(|w| ms(w - trigger_ns)),
        kernel_wake_to_notice: woke.map(|w| ms(notice - w)),
        notice_to_decision: allow.write_ns.map(|w| ms(decided - w)),
        decision_to_allow: allow.write_ns.map(ms),
        allow_to_return: returned_ns.map(|r| ms(r - allow.at_ns)),
    })
}

/// Every allow's stages, each stage's samples apart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageSamples {
    exit_to_notice: Vec<f64>,
    exit_to_kernel_wake: Vec<f64>,
    kernel_wake_to_notice: Vec<f64>,
    notice_to_decision: Vec<f64>,
    decision_to_allow: Vec<f64>,
    allow_to_return: Vec<f64>,
}

impl StageSamples {
    pub fn push(&mut self, t: StageTimes) {
        for (into, v) in [
            (&mut self.exit_to_notice, t.exit_to_notice),
            (&mut self.exit_to_kernel_wake, t.exit_to_kernel_wake),
            (&mut self.kernel_wake_to_notice, t.kernel_wake_to_notice),
            (&mut self.notice_to_decision, t.notice_to_decision),
            (&mut self.decision_to_allow, t.decision_to_allow),
            (&mut self.allow_to_return, t.allow_to_return),
        ] {
            into.extend(v);
        }
    }

    /// Each stage's figures; `None` when no allow said its stages.
    pub fn figures(&self) -> Option<Stages> {
        if self.exit_to_notice.is_empty() {
            return None;
        }
        Some(Stages {
            exit_to_notice: StageFigures::of(&self.exit_to_notice),
            exit_to_kernel_wake: StageFigures::of(&self.exit_to_kernel_wake),
            kernel_wake_to_notice: StageFigures::of(&self.kernel_wake_to_notice),
            notice_to_decision: StageFigures::of(&self.notice_to_decision),
            decision_to_allow: StageFigures::of(&self.decision_to_allow),
            allow_to_return: StageFigures::of(&self.allow_to_return),
        })
    }
}

/// One stage over every allow that says it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StageFigures {
    pub samples: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl StageFigures {
    fn of(samples_ms: &[f64]) -> StageFigures {
        let f = figures(samples_ms);
        StageFigures {
            samples: samples_ms.len(),
            p50_ms: f.p50,
            p99_ms: f.p99,
            max_ms: f.max,
        }
    }

    fn words(&self) -> String {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
        format!(
            "{}/{}/{}",
            ms(self.p50_ms),
            ms(self.p99_ms),
            ms(self.max_ms)
        )
    }
}

/// The agent's allows, stage by stage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stages {
    /// The app's exit (its own stamp, just before it exits) → the agent told of it.
    pub exit_to_notice: StageFigures,
    /// Of the exits the kernel told: the exit → the agent woken by the kernel.
    pub exit_to_kernel_wake: StageFigures,
    /// Of those: that wake → the exit taken in (the node view told).
    pub kernel_wake_to_notice: StageFigures,
    /// Told → its decision made (the allow's write begins).
    pub notice_to_decision: StageFigures,
    /// The allow written and renamed in place.
    pub decision_to_allow: StageFigures,
    /// `allow` in place → the preStop returned, as the runtime ended its exec.
    pub allow_to_return: StageFigures,
}

impl Stages {
    /// One line: each stage's p50/p99/max.
    pub fn line(&self) -> String {
        format!(
            "exit → notice {} (exit → agent woken by the kernel {}, → taken in {}), notice → decision {}, decision → allow renamed {}, allow → preStop returned {} ms (p50/p99/max)",
            self.exit_to_notice.words(),
            self.exit_to_kernel_wake.words(),
            self.kernel_wake_to_notice.words(),
            self.notice_to_decision.words(),
            self.decision_to_allow.words(),
            self.allow_to_return.words()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(at_ns: i64, decided_ns: Option<i64>, write_ns: Option<i64>) -> AllowTimes {
        AllowTimes {
            at_ns,
            decided_ns,
            write_ns,
            kernel_ns: None,
        }
    }

    #[test]
    fn the_stages_add_up_to_the_delay_and_the_return() {
        // Exit at 1 s; told 3 ms later; decided 0.5 ms after; the rename took 0.25 ms; the
        // preStop returned 1 ms after the allow.
        let exit = 1_000_000_000;
        let at = exit + 3_750_000;
        let a = allow(at, Some(750_000), Some(250_000));
        let t = stage_times(exit, a, Some(at + 1_000_000)).expect("stages");
        assert_eq!(t.exit_to_notice, Some(3.0));
        assert_eq!(t.notice_to_decision, Some(0.5));
        assert_eq!(t.decision_to_allow, Some(0.25));
        assert_eq!(t.allow_to_return, Some(1.0));
        // Told by the runtime: the notice is not split.
        assert_eq!(
            (t.exit_to_kernel_wake, t.kernel_wake_to_notice),
            (None, None)
        );
        // Told by the kernel, whose thread woke 1 ms after the exit: the notice came 2 ms later.
        let k = AllowTimes {
            kernel_ns: Some(2_750_000),
            ..a
        };
        let t = stage_times(exit, k, None).expect("stages");
        assert_eq!(t.exit_to_kernel_wake, Some(1.0));
        assert_eq!(t.kernel_wake_to_notice, Some(2.0));
        assert_eq!(t.exit_to_notice, Some(3.0));
        // A writer that says nothing of its own part has no stages.
        assert_eq!(stage_times(exit, allow(at, None, None), None), None);
        // An older agent without the write's time: the notice alone.
        let old = stage_times(exit, allow(at, Some(750_000), None), None).expect("stages");
        assert_eq!(
            (old.exit_to_notice, old.notice_to_decision),
            (Some(3.0), None)
        );
    }

    #[test]
    fn each_stage_keeps_its_own_samples() {
        let mut s = StageSamples::default();
        assert_eq!(s.figures(), None);
        for i in 1..=100 {
            s.push(StageTimes {
                exit_to_notice: Some(f64::from(i)),
                exit_to_kernel_wake: Some(0.5),
                kernel_wake_to_notice: None,
                notice_to_decision: None,
                decision_to_allow: Some(0.1),
                allow_to_return: Some(1.0),
            });
        }
        let f = s.figures().expect("figures");
        assert_eq!(f.exit_to_notice.samples, 100);
        assert_eq!(f.exit_to_notice.max_ms, Some(100.0));
        assert_eq!(f.notice_to_decision.samples, 0);
        assert_eq!(f.notice_to_decision.p99_ms, None);
        assert_eq!(f.exit_to_kernel_wake.samples, 100);
        assert_eq!(f.kernel_wake_to_notice.samples, 0);
        assert!(f.line().contains("exit → notice 50"), "{}", f.line());
    }
}
