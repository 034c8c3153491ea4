//! The app's exit as the app itself stamped it, just before it exits: the benchmark's trigger.
//!
//! The test bed's own pidfd stamp ([`super::kernelclock`]) is a notification the benchmark's
//! thread must be scheduled to receive: on a busy node it comes late, and the delay measured
//! from it looks shorter than it was. The bench pod's app prints the wall clock with busybox's
//! `adjtimex` (microseconds, read-only) as its last act: the shell's child reaped, the shell
//! replaced by `adjtimex` (`exec`), whose exit is the container's. What is measured from it
//! includes the process's own teardown, never less than the real delay.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::kubelet::RunningPod;

/// Where each watched pod's app writes its stamp, by pod uid.
#[derive(Debug, Default)]
pub struct AppStamps {
    logs: HashMap<String, PathBuf>,
}

impl AppStamps {
    /// Reads `pod`'s `app` stamp once it has exited.
    pub fn watch(&mut self, pod: &RunningPod, app: &str) {
        self.logs
            .insert(pod.uid().to_owned(), pod.container_log_path(app, 0));
    }

    /// The stamp of the pod `uid`'s app (Unix ns), if it wrote one.
    pub fn stamp(&self, uid: &str) -> Option<i64> {
        let log = std::fs::read_to_string(self.logs.get(uid)?).ok()?;
        parse_stamp(&log)
    }
}

/// `STA_NANO` in `adjtimex`'s status: its `tv_usec` then holds nanoseconds (a clock kept by
/// an NTP daemon in nanosecond mode).
const STA_NANO: i64 = 0x2000;

/// The last `adjtimex` wall clock in a CRI log (`status:`, `time.tv_sec:` and `time.tv_usec:`
/// lines), in Unix ns.
pub fn parse_stamp(log: &str) -> Option<i64> {
    let value = |key: &str| -> Option<i64> {
        log.lines()
            .rev()
            .find_map(|l| {
                l.split_once(key)
                    .map(|(_, v)| v.split_whitespace().next()?.parse().ok())
            })
            .flatten()
    };
    let secs = value("time.tv_sec:")?;
    let fraction = value("time.tv_usec:")?;
    let status = value("status:")?;
    let nanos = if status & STA_NANO != 0 {
        fraction
    } else {
        fraction.checked_mul(1000)?
    };
    if !(0..1_000_000_000).contains(&nanos) {
        return None;
    }
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_wall_clock_in_the_log_is_the_stamp() {
        let log = "2026-11-29T17:00:00.000000001Z stdout F serving\n\
                   2026-11-29T17:00:01.000000001Z stdout F     status:       64 (UNSYNC)\n\
                   2026-11-29T17:00:01.000000001Z stdout F     time.tv_sec:  1795973009\n\
                   2026-11-29T17:00:01.000000002Z stdout F     time.tv_usec: 449626\n\
                   2026-11-29T17:00:01.000000003Z stdout F     return value: 5 (clock not synchronized)\n";
        assert_eq!(parse_stamp(log), Some(1_795_973_009_449_626_000));
        // A clock in nanosecond mode (STA_NANO | STA_PLL): tv_usec holds nanoseconds.
        let nano = "status: 8193 (PLL | NANO)\ntime.tv_sec: 12\ntime.tv_usec: 449626123\n";
        assert_eq!(parse_stamp(nano), Some(12_449_626_123));
        assert_eq!(parse_stamp("serving\n"), None);
        assert_eq!(
            parse_stamp("status: 64\ntime.tv_sec: 12\ntime.tv_usec: x\n"),
            None
        );
        // Out of range for its unit: not a stamp.
        assert_eq!(
            parse_stamp("status: 64\ntime.tv_sec: 12\ntime.tv_usec: 1000000\n"),
            None
        );
    }
}
