//! The monotonic clock and sleeping on it.

use core::time::Duration;

pub(super) fn timespec(duration: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: libc::time_t::try_from(duration.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: duration.subsec_nanos().into(),
    }
}

/// Sleeps until the monotonic clock reads `until` (at once if it already
/// has), whatever signals interrupt it.
pub fn sleep_until(until: Instant) {
    let until = timespec(until.0);
    loop {
        // SAFETY: clock_nanosleep reads one timespec we own; with
        // TIMER_ABSTIME the remainder pointer may be null.
        let err = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &until,
                core::ptr::null_mut(),
            )
        };
        // 0 when the time came; EINTR: a signal, sleep on. Anything else
        // (EINVAL for a time the kernel cannot represent) would repeat
        // forever, so stop rather than spin.
        if err != libc::EINTR {
            return;
        }
    }
}

/// A reading of the monotonic clock, as `std::time::Instant` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(Duration);

impl Instant {
    pub fn now() -> Self {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec we own. Its result is
        // not checked: CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let secs = u64::try_from(now.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(now.tv_nsec).unwrap_or(0);
        Instant(Duration::from_secs(secs).saturating_add(Duration::from_nanos(nanos.into())))
    }

    pub fn checked_add(self, duration: Duration) -> Option<Self> {
        self.0.checked_add(duration).map(Instant)
    }

    /// `self + duration`, or the end of time when that does not fit: a
    /// deadline too far away to represent is as good as none.
    pub fn saturating_add(self, duration: Duration) -> Self {
        Instant(self.0.saturating_add(duration))
    }

    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    pub fn elapsed(self) -> Duration {
        Instant::now().saturating_duration_since(self)
    }
}
