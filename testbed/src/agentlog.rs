//! What the agent's JSON log says about its allows.
//!
//! The agent logs an allow (`event: "allow"`, with pod, container, reason) right after its
//! rename of `allow` over `exit` returned, and a hold (`event: "held"`) when a wait must wait; tracing-subscriber's JSON format stamps each line with the
//! wall clock as RFC 3339 with six fractional digits. Microseconds are enough for delays of
//! milliseconds, and the wall clock is the clock the runtime's `finished_at` is on; the time a
//! line is read from the pipe is neither.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

/// The fewest fractional digits of a second a timestamp may have to measure with.
pub const MIN_FRACTION_DIGITS: usize = 6;

/// The agent's stable `event` field for an allow and for a hold.
pub const ALLOWED: &str = "allow";
pub const HELD: &str = "held";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    #[error("timestamp {0:?} is not RFC 3339 UTC")]
    BadTimestamp(String),
    #[error(
        "timestamp {0:?} is not precise enough: at least {MIN_FRACTION_DIGITS} fractional \
         digits of a second are needed to measure milliseconds"
    )]
    Imprecise(String),
    #[error("{message:?} event without its {field} field: {line}")]
    MissingField {
        message: &'static str,
        field: &'static str,
        line: String,
    },
}

/// One allow as the agent logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentAllow {
    pub pod: String,
    pub container: String,
    pub reason: String,
    /// When the line was stamped, Unix ns (wall clock).
    pub at_ns: i64,
    /// When the agent saw the exit file appear (its `waited_us` before the stamp), Unix ns.
    pub wait_since_ns: Option<i64>,
    /// The agent's own part: from the later of the exit file and the pod's last exit as the
    /// runtime reported it, to the stamp (`decided_us`).
    pub decided_ns: Option<i64>,
    /// Of that, the write and rename of `allow` alone (`write_us`).
    pub write_ns: Option<i64>,
    /// When the kernel told the exit: from the agent's wake by it to the stamp (`kernel_us`).
    pub kernel_ns: Option<i64>,
    /// Which source first told the agent of the pod's last exit (`exit_told_by`: `kernel`,
    /// `runtime`, or `none` when no container had exited).
    pub exit_told_by: Option<String>,
}

/// Unix nanoseconds of an RFC 3339 UTC timestamp with at least microsecond precision.
pub fn timestamp_ns(s: &str) -> Result<i64, LogError> {
    let fraction = s
        .split_once('.')
        .map_or(0, |(_, f)| f.bytes().take_while(u8::is_ascii_digit).count());
    let at = humantime::parse_rfc3339(s).map_err(|_| LogError::BadTimestamp(s.to_owned()))?;
    if fraction < MIN_FRACTION_DIGITS {
        return Err(LogError::Imprecise(s.to_owned()));
    }
    at.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_nanos()).ok())
        .ok_or_else(|| LogError::BadTimestamp(s.to_owned()))
}

fn event(line: &serde_json::Value) -> Option<&str> {
    line.get("fields")?.get("event")?.as_str()
}

fn field(
    line: &serde_json::Value,
    message: &'static str,
    name: &'static str,
) -> Result<String, LogError> {
    line.get("fields")
        .and_then(|f| f.get(name))
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .ok_or_else(|| LogError::MissingField {
            message,
            field: name,
            line: line.to_string(),
        })
}

/// An optional field in microseconds, as nanoseconds.
fn micros_ns(line: &serde_json::Value, name: &str) -> Option<i64> {
    line.get("fields")?
        .get(name)?
        .as_i64()
        .map(|us| us.saturating_mul(1000))
}

/// The allow a log line reports; `Ok(None)` for any other line.
pub fn parse_allow(line: &serde_json::Value) -> Result<Option<AgentAllow>, LogError> {
    if event(line) != Some(ALLOWED) {
        return Ok(None);
    }
    let stamp = line
        .get("timestamp")
        .and_then(|v| v.as_str())
        .ok_or_else(|| LogError::MissingField {
            message: ALLOWED,
            field: "timestamp",
            line: line.to_string(),
        })?;
    let at_ns = timestamp_ns(stamp)?;
    Ok(Some(AgentAllow {
        pod: field(line, ALLOWED, "pod")?,
        container: field(line, ALLOWED, "container")?,
        reason: field(line, ALLOWED, "reason")?,
        at_ns,
        wait_since_ns: micros_ns(line, "waited_us").map(|ns| at_ns - ns),
        decided_ns: micros_ns(line, "decided_us"),
        write_ns: micros_ns(line, "write_us"),
        kernel_ns: micros_ns(line, "kernel_us"),
        exit_told_by: line
            .get("fields")
            .and_then(|f| f.get("exit_told_by"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
    }))
}

/// What a run of the agent logged about exits: the allows by (pod, container), and the
/// (pod, container) pairs it held before allowing.
#[derive(Debug, Default)]
pub struct AllowLog {
    pub allows: HashMap<(String, String), AgentAllow>,
    pub held: HashSet<(String, String)>,
}

impl AllowLog {
    /// Reads the lines in order; the first allow of a container counts.
    pub fn from_lines<'a>(
        lines: impl IntoIterator<Item = &'a serde_json::Value>,
    ) -> Result<AllowLog, LogError> {
        let mut log = AllowLog::default();
        for line in lines {
            if event(line) == Some(HELD) {
                log.held
                    .insert((field(line, HELD, "pod")?, field(line, HELD, "container")?));
            } else if let Some(a) = parse_allow(line)? {
                log.allows
                    .entry((a.pod.clone(), a.container.clone()))
                    .or_insert(a);
            }
        }
        Ok(log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> serde_json::Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn timestamps_to_unix_ns() {
        assert_eq!(
            timestamp_ns("2026-11-21T12:00:00.123456Z"),
            Ok(1_795_262_400_123_456_000)
        );
        assert_eq!(
            timestamp_ns("1970-01-01T00:00:01.000000001Z"),
            Ok(1_000_000_001)
        );
        assert_eq!(
            timestamp_ns("2026-11-21T12:00:00.123Z"),
            Err(LogError::Imprecise("2026-11-21T12:00:00.123Z".into()))
        );
        assert!(matches!(
            timestamp_ns("2026-11-21T12:00:00Z"),
            Err(LogError::Imprecise(_))
        ));
        assert!(matches!(
            timestamp_ns("yesterday"),
            Err(LogError::BadTimestamp(_))
        ));
    }

    #[test]
    fn tracing_subscriber_json_stamps_are_precise_enough() {
        // The format the agent's logger writes, checked against the real formatter so a
        // change of tracing-subscriber's timer cannot silently cost precision.
        use tracing_subscriber::fmt::time::{FormatTime, SystemTime as Timer};
        let mut out = String::new();
        Timer
            .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut out))
            .unwrap();
        let ns = timestamp_ns(&out).unwrap_or_else(|e| panic!("{e}"));
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        assert!((now - ns).abs() < 60_000_000_000, "{out}");
    }

    #[test]
    fn allows_and_holds_from_lines() {
        let lines = [
            json(
                r#"{"timestamp":"2026-11-21T12:00:00.000100Z","level":"INFO","fields":{"message":"exit held","event":"held","pod":"p1","container":"proxy","waiting_for":"[\"app\"]"}}"#,
            ),
            json(
                r#"{"timestamp":"2026-11-21T12:00:00.250500Z","level":"INFO","fields":{"message":"exit allowed","event":"allow","pod":"p1","container":"proxy","reason":"ordered","waited_ms":250,"waited_us":250400,"decided_us":1200,"write_us":300,"kernel_us":1500}}"#,
            ),
            json(
                r#"{"timestamp":"2026-11-21T12:00:01.000000Z","level":"INFO","fields":{"message":"exit allowed","event":"allow","pod":"p1","container":"proxy","reason":"deadline","waited_ms":1}}"#,
            ),
            json(r#"{"timestamp":"x","level":"INFO","fields":{"message":"agent ready"}}"#),
        ];
        let log = AllowLog::from_lines(&lines).unwrap();
        let key = ("p1".to_owned(), "proxy".to_owned());
        assert!(log.held.contains(&key));
        let a = &log.allows[&key];
        assert_eq!(a.reason, "ordered");
        assert_eq!(a.at_ns, 1_795_262_400_250_500_000);
        assert_eq!(a.wait_since_ns, Some(1_795_262_400_000_100_000));
        assert_eq!(a.decided_ns, Some(1_200_000));
        assert_eq!(a.write_ns, Some(300_000));
        assert_eq!(a.kernel_ns, Some(1_500_000));
        assert_eq!(log.allows.len(), 1);

        let bad = json(
            r#"{"timestamp":"2026-11-21T12:00:00.000100Z","fields":{"message":"exit allowed","event":"allow","pod":"p1"}}"#,
        );
        assert!(matches!(
            parse_allow(&bad),
            Err(LogError::MissingField {
                field: "container",
                ..
            })
        ));
        let other = json(r#"{"fields":{"message":"exit held","event":"held"}}"#);
        assert_eq!(parse_allow(&other), Ok(None));
    }
}
