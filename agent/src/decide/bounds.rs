//! Numbers that come from pods and the runtime, bounded before they meet arithmetic.
//!
//! The API server puts no upper bound on `terminationGracePeriodSeconds` (nor on a deletion's
//! grace), and the kubelet copies it verbatim into the container annotation
//! `io.kubernetes.pod.terminationGracePeriod`. `Instant + Duration` panics when the sum does
//! not fit, so one tenant's pod spec could end the agent for every pod of its node, and again
//! after each restart. Every span a pod can influence is capped here at [`MAX_SPAN`], which no
//! clock reading plus a span can overflow, and every "later" instant is computed here.

use std::time::{Duration, Instant};

/// The longest span the agent ever adds to a clock reading: a year. A grace period beyond it
/// is, for a wait, "never": the entrypoint's own timeout and the kubelet's SIGKILL are what
/// end such a pod, as they would without the agent.
pub const MAX_SPAN: Duration = Duration::from_secs(365 * 24 * 3600);

/// A span capped at [`MAX_SPAN`].
pub fn span(d: Duration) -> Duration {
    d.min(MAX_SPAN)
}

/// A grace period given in whole seconds by a pod (the API's int64 fields): negative is 0
/// (the kubelet kills at once), anything above [`MAX_SPAN`] is [`MAX_SPAN`].
pub fn grace_seconds(secs: i64) -> Duration {
    span(Duration::from_secs(u64::try_from(secs).unwrap_or(0)))
}

/// What a text that should hold a number of seconds says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seconds {
    /// A number, bounded: negative as 0, huge as [`MAX_SPAN`].
    Bounded(Duration),
    /// Not a number at all.
    Junk,
}

/// Seconds as text (the kubelet's grace annotation): an optional sign and decimal digits,
/// of any length. Whitespace around it is ignored; anything else is [`Seconds::Junk`].
pub fn parse_seconds(text: &str) -> Seconds {
    let t = text.trim();
    let (negative, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Seconds::Junk;
    }
    if negative {
        return Seconds::Bounded(Duration::ZERO);
    }
    // Too many digits for a u64 is still a number: larger than any bound.
    let secs = digits.parse::<u64>().unwrap_or(u64::MAX);
    Seconds::Bounded(span(Duration::from_secs(secs)))
}

/// Adding a span to a monotonic clock reading, never panicking: the span is capped at
/// [`MAX_SPAN`], and a sum that still does not fit stays at the reading itself rather than
/// wrapping. (Not for wall-clock dates: a date is no span from now, and capping it would move
/// it.)
pub trait Later: Copy {
    fn later(self, d: Duration) -> Self;
}

impl Later for Instant {
    fn later(self, d: Duration) -> Self {
        self.checked_add(span(d)).unwrap_or(self)
    }
}

impl Later for tokio::time::Instant {
    fn later(self, d: Duration) -> Self {
        self.checked_add(span(d)).unwrap_or(self)
    }
}

/// The sum of two spans, capped at [`MAX_SPAN`]: `Duration + Duration` panics on overflow,
/// and so does tonic when asked for a call timeout past 99,999,999 hours.
pub fn sum(a: Duration, b: Duration) -> Duration {
    span(a.saturating_add(b))
}

/// The instant a Unix time (whole seconds, from the API server) was, on this process's
/// monotonic clock; `None` for a time in the future, before the epoch, or further back than
/// the monotonic clock reaches.
pub fn instant_of_unix(secs: i64, now: Instant) -> Option<Instant> {
    let at = std::time::UNIX_EPOCH.checked_add(Duration::from_secs(u64::try_from(secs).ok()?))?;
    let ago = std::time::SystemTime::now().duration_since(at).ok()?;
    now.checked_sub(ago)
}

/// The Unix second an instant of this process's monotonic clock was at (as `now` is now):
/// the converse of [`instant_of_unix`], for comparing with the API server's times. 0 for a
/// wall clock before 1970.
pub fn unix_of_instant(at: Instant, now: Instant) -> i64 {
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let ago = i64::try_from(now.saturating_duration_since(at).as_secs()).unwrap_or(i64::MAX);
    now_unix.saturating_sub(ago)
}

/// This process's monotonic clock against the wall clock, both read once: instants as Unix
/// nanoseconds and back, for comparing the agent's sightings with the runtime's times (the
/// same node's clock) within one decision.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    now: Instant,
    unix_ns: i64,
}

impl WallClock {
    /// The clocks as they are at `now` (an instant just taken).
    pub fn at(now: Instant) -> WallClock {
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        WallClock { now, unix_ns }
    }

    /// The Unix time (ns) of `at`.
    pub fn ns(&self, at: Instant) -> i64 {
        let after =
            i64::try_from(at.saturating_duration_since(self.now).as_nanos()).unwrap_or(i64::MAX);
        let before =
            i64::try_from(self.now.saturating_duration_since(at).as_nanos()).unwrap_or(i64::MAX);
        self.unix_ns.saturating_add(after).saturating_sub(before)
    }

    /// The instant of Unix time `ns`, on the monotonic clock (as near as it reaches).
    pub fn instant(&self, ns: i64) -> Instant {
        let d = |x: i64| Duration::from_nanos(u64::try_from(x).unwrap_or(0));
        if ns >= self.unix_ns {
            self.now.later(d(ns.saturating_sub(self.unix_ns)))
        } else {
            self.now
                .checked_sub(d(self.unix_ns.saturating_sub(ns)))
                .unwrap_or(self.now)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_times_become_instants_only_when_past() {
        let now = Instant::now();
        let unix_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let ten_ago = instant_of_unix(unix_now - 10, now).unwrap();
        let ago = now.duration_since(ten_ago);
        assert!(
            ago >= Duration::from_secs(9) && ago <= Duration::from_secs(11),
            "{ago:?}"
        );
        assert_eq!(instant_of_unix(unix_now + 3600, now), None);
        assert_eq!(instant_of_unix(-1, now), None);
        assert_eq!(instant_of_unix(i64::MAX, now), None);
        // And back, within the second either clock may have turned.
        let back = unix_of_instant(ten_ago, now);
        assert!((unix_now - 11..=unix_now - 9).contains(&back), "{back}");
        assert!((unix_now..=unix_now + 1).contains(&unix_of_instant(now, now)));
    }

    #[test]
    fn seconds_text_is_bounded_or_junk() {
        assert_eq!(
            parse_seconds("30"),
            Seconds::Bounded(Duration::from_secs(30))
        );
        assert_eq!(
            parse_seconds(" 30\n"),
            Seconds::Bounded(Duration::from_secs(30))
        );
        assert_eq!(
            parse_seconds("+7"),
            Seconds::Bounded(Duration::from_secs(7))
        );
        assert_eq!(parse_seconds("-5"), Seconds::Bounded(Duration::ZERO));
        assert_eq!(
            parse_seconds(&i64::MIN.to_string()),
            Seconds::Bounded(Duration::ZERO)
        );
        for huge in [i64::MAX.to_string(), u64::MAX.to_string(), "9".repeat(400)] {
            assert_eq!(parse_seconds(&huge), Seconds::Bounded(MAX_SPAN), "{huge}");
        }
        for junk in ["", " ", "-", "+", "1e9", "0x10", "30s", "3 0", "--1", "١٢"] {
            assert_eq!(parse_seconds(junk), Seconds::Junk, "{junk:?}");
        }
    }

    #[test]
    fn api_seconds_are_bounded() {
        assert_eq!(grace_seconds(i64::MIN), Duration::ZERO);
        assert_eq!(grace_seconds(-1), Duration::ZERO);
        assert_eq!(grace_seconds(45), Duration::from_secs(45));
        assert_eq!(grace_seconds(i64::MAX), MAX_SPAN);
    }

    #[test]
    fn later_never_panics() {
        let now = Instant::now();
        assert_eq!(
            now.later(Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert_eq!(now.later(Duration::MAX), now + MAX_SPAN);
        let t = tokio::time::Instant::now();
        assert_eq!(t.later(Duration::MAX), t + MAX_SPAN);
        assert_eq!(sum(Duration::MAX, Duration::from_secs(1)), MAX_SPAN);
    }

    #[test]
    fn instants_and_unix_nanoseconds_convert_both_ways() {
        let now = Instant::now();
        let c = WallClock::at(now);
        let ago = now.checked_sub(Duration::from_millis(1500)).unwrap_or(now);
        let ahead = now + Duration::from_millis(2500);
        assert_eq!(c.ns(ago) + 1_500_000_000, c.ns(now));
        assert_eq!(c.ns(ahead) - 2_500_000_000, c.ns(now));
        assert_eq!(c.instant(c.ns(ahead)), ahead);
        assert_eq!(c.instant(c.ns(ago)), ago);
    }
}
