//! Shell scripts for test containers (busybox `sh -c`), behaving the ways that matter on
//! shutdown.
//!
//! A shell as PID 1 only leaves on TERM if it traps it, and only runs the trap between
//! commands, so the idle loop sleeps in the background and `wait`s, which TERM interrupts.

use std::time::Duration;

fn secs(d: Duration) -> String {
    let s = format!("{:.3}", d.as_secs_f64());
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// What every script prints once its TERM trap is set: from then on it is ready to be stopped.
pub const READY: &str = "serving";

const IDLE: &str = "while :; do sleep 3600 & wait $!; done";

/// Exits 0 as soon as TERM comes (a typical proxy or log shipper).
pub fn exits_on_term() -> String {
    format!("trap 'echo TERM: exiting; exit 0' TERM; echo serving; {IDLE}")
}

/// Takes `drain` after TERM to finish its work, then exits 0 (a server finishing its requests).
pub fn drains_for(drain: Duration) -> String {
    format!(
        "trap 'echo TERM: finishing requests; sleep {}; echo done; exit 0' TERM; echo serving; {IDLE}",
        secs(drain)
    )
}

/// Ignores TERM; only the runtime's SIGKILL at the end of the grace period ends it (137).
pub fn ignores_term() -> String {
    "trap '' TERM; echo serving, deaf to TERM; while :; do sleep 3600; done".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_seconds() {
        assert_eq!(secs(Duration::from_millis(1500)), "1.5");
        assert_eq!(secs(Duration::from_secs(3)), "3");
        assert_eq!(secs(Duration::from_secs(10)), "10");
        assert_eq!(secs(Duration::from_millis(20)), "0.02");
        assert!(drains_for(Duration::from_secs(2)).contains("sleep 2;"));
    }
}
