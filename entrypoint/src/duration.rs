//! Durations as the admission webhook writes them: `500ms`, `30s`, `2m`,
//! `1h`, or a bare integer meaning seconds.
//!
//! Deliberately narrower than Go's `time.ParseDuration` (no fractions, no
//! compound values): the value lands in pod specs, and a strict grammar makes
//! a typo fail loudly instead of silently meaning something else.

use alloc::format;
use alloc::string::String;
use core::fmt;
use core::time::Duration;

/// A value that is not one of the accepted duration forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidDuration(pub String);

impl fmt::Display for InvalidDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid duration {:?} (expected e.g. 500ms, 30s, 2m, 1h or plain seconds)",
            self.0
        )
    }
}

impl core::error::Error for InvalidDuration {}

/// Parses `<digits>[ms|s|m|h]`; no unit means seconds.
pub fn parse(text: &str) -> Result<Duration, InvalidDuration> {
    let invalid = || InvalidDuration(String::from(text));
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(invalid());
    }
    let value: u64 = digits.parse().map_err(|_| invalid())?;
    let seconds_per_unit = match unit {
        "ms" => return Ok(Duration::from_millis(value)),
        "" | "s" => 1,
        "m" => 60,
        "h" => 60 * 60,
        _ => return Err(invalid()),
    };
    value
        .checked_mul(seconds_per_unit)
        .map(Duration::from_secs)
        .ok_or_else(invalid)
}

/// Shows a duration in the same form it is configured in (`25s`, `300ms`),
/// so log lines can be matched against the pod spec.
pub fn show(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis % 1000 == 0 {
        format!("{}s", millis / 1000)
    } else {
        format!("{millis}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn accepts_each_unit() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn bare_integer_is_seconds() {
        assert_eq!(parse("25"), Ok(Duration::from_secs(25)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("007"), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "", "s", "ms", "-1", "+1", "1.5s", "1.5", " 1s", "1s ", "1 s", "1S", "1sec", "1d",
            "1us", "1ns", "1m30s", "1h2", "0x10", "ten", "１s",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn rejects_overflow_instead_of_wrapping() {
        assert!(parse("99999999999999999999").is_err());
        assert!(parse(&format!("{}h", u64::MAX / 60)).is_err());
        assert_eq!(
            parse(&format!("{}ms", u64::MAX)),
            Ok(Duration::from_millis(u64::MAX))
        );
    }

    #[test]
    fn error_names_the_value() {
        let message = parse("5x").unwrap_err().to_string();
        assert!(message.contains("\"5x\""), "{message}");
    }

    #[test]
    fn shows_whole_seconds_as_seconds() {
        assert_eq!(show(Duration::from_secs(25)), "25s");
        assert_eq!(show(Duration::from_millis(300)), "300ms");
        assert_eq!(show(Duration::from_millis(1500)), "1500ms");
        assert_eq!(show(Duration::ZERO), "0s");
    }
}
