//! The machine's own floor under every delay measured: how late a thread that asks to sleep
//! 1 ms is woken, sampled all through a run (as `cyclictest` measures a kernel's wake-up
//! latency). Every stage of an allow is a process or thread woken by another; a virtual
//! machine whose host takes its CPUs away (steal) or a kernel that wakes late puts a floor
//! under each of them that no agent can go below. Reported beside the delays so a tail can be
//! told apart from the machine's own.
//!
//! The probe is a thread of the benchmark, outside the pods' cgroups as system daemons are: it
//! weighs what a system daemon weighs, more than the agent's pod does, so its floor is the
//! machine's, not the agent's weight.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::summary::{percentile, round3};

/// How long the probe asks to sleep each time.
pub const PERIOD: Duration = Duration::from_millis(1);
/// A wake later than this is counted apart: the target's bound on a whole allow.
pub const LATE_MS: f64 = 2.0;
/// Samples kept at most (about 20 minutes of 1 ms sleeps): the run's length bounds the memory.
const MAX_SAMPLES: usize = 1_000_000;

/// Samples the machine's wake-up lateness until [`WakeProbe::finish`] (or drop).
pub struct WakeProbe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<f64>>>,
}

impl WakeProbe {
    pub fn start() -> WakeProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let theirs = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wake_probe".to_owned())
            .spawn(move || sample(&theirs))
            .ok();
        WakeProbe { stop, thread }
    }

    /// Stops sampling; the floor seen, `None` when the probe could not run.
    pub fn finish(mut self) -> Option<Floor> {
        self.stop.store(true, Ordering::Relaxed);
        let late = self.thread.take()?.join().ok()?;
        Floor::of(late)
    }
}

impl Drop for WakeProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Each wake's lateness past [`PERIOD`], in ms; one at least, however soon it is stopped.
fn sample(stop: &AtomicBool) -> Vec<f64> {
    let mut late = Vec::new();
    loop {
        let asked = Instant::now();
        std::thread::sleep(PERIOD);
        let slept = asked.elapsed().saturating_sub(PERIOD);
        late.push(slept.as_secs_f64() * 1e3);
        if stop.load(Ordering::Relaxed) || late.len() >= MAX_SAMPLES {
            return late;
        }
    }
}

/// How late the probe was woken, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Floor {
    pub wakes: usize,
    pub late_p50_ms: f64,
    pub late_p99_ms: f64,
    pub late_p999_ms: f64,
    pub late_max_ms: f64,
    /// Wakes later than [`LATE_MS`].
    pub late_over_2ms: usize,
}

impl Floor {
    /// The floor of these latenesses (ms, any order); `None` without any.
    pub fn of(mut late: Vec<f64>) -> Option<Floor> {
        late.retain(|v| !v.is_nan());
        late.sort_by(f64::total_cmp);
        Some(Floor {
            wakes: late.len(),
            late_p50_ms: round3(percentile(&late, 50.0)?),
            late_p99_ms: round3(percentile(&late, 99.0)?),
            late_p999_ms: round3(percentile(&late, 99.9)?),
            late_max_ms: round3(*late.last()?),
            late_over_2ms: late.iter().filter(|v| **v > LATE_MS).count(),
        })
    }

    /// The floor in words, for the table.
    pub fn line(&self) -> String {
        format!(
            "a 1 ms sleep woken late by {}/{}/{}/{} ms (p50/p99/p99.9/max), later than {} ms in {} of {} wakes",
            self.late_p50_ms,
            self.late_p99_ms,
            self.late_p999_ms,
            self.late_max_ms,
            LATE_MS,
            self.late_over_2ms,
            self.wakes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_counts_every_wake_and_the_late_ones_apart() {
        let mut late: Vec<f64> = (0..1000).map(|i| f64::from(i) / 1000.0).collect();
        late.push(f64::NAN);
        late.extend([2.5, 9.0]);
        let f = Floor::of(late).unwrap();
        assert_eq!(f.wakes, 1002);
        assert_eq!(f.late_over_2ms, 2);
        assert_eq!(f.late_max_ms, 9.0);
        assert_eq!(f.late_p50_ms, 0.5);
        assert!(f.late_p99_ms < 1.0 && f.late_p999_ms >= f.late_p99_ms);
        assert!(f.line().contains("in 2 of 1002 wakes"), "{}", f.line());
        assert_eq!(Floor::of(vec![f64::NAN]), None);
    }

    #[test]
    fn the_probe_samples_until_it_is_finished() {
        let probe = WakeProbe::start();
        let floor = probe.finish().expect("the probe ran");
        // Stopped at once, it still woke once: a floor is never made of nothing.
        assert!(floor.wakes >= 1, "{floor:?}");
        assert!(floor.late_p50_ms >= 0.0 && floor.late_max_ms >= floor.late_p50_ms);
    }
}
