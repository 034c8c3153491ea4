//! One back-off rule for everything the agent retries: a stream to reconnect, a watch to
//! re-list, a read to ask again. Doubling from a start, up to a cap; reset by a success.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    start: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub const fn new(start: Duration, max: Duration) -> Self {
        Backoff {
            start,
            max,
            current: start,
        }
    }

    /// The wait before the next try; the one after it is twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = self.current.saturating_mul(2).min(self.max);
        d
    }

    /// The wait the next try would get, without taking it.
    pub fn peek(&self) -> Duration {
        self.current
    }

    /// After a success: the next failure waits `start` again.
    pub fn reset(&mut self) {
        self.current = self.start;
    }

    /// The wait after `failures` failures in a row (1: `start`).
    pub fn after(start: Duration, max: Duration, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        start.saturating_mul(factor).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        let got: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(got, [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        b.reset();
        assert_eq!(b.peek(), ms(100));
        assert_eq!(Backoff::after(ms(100), ms(500), 1), ms(100));
        assert_eq!(Backoff::after(ms(100), ms(500), 3), ms(400));
        assert_eq!(Backoff::after(ms(100), ms(500), 99), ms(500));
    }
}
