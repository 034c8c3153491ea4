//! The test bed's one clock for stamps: Unix ns, comparable with the runtime's times and the
//! agent's log.

use std::time::SystemTime;

/// Now, Unix ns.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}
