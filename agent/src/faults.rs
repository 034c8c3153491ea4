//! Faults the end-to-end tests inject into the real agent binary, compiled in only with the
//! `fault-hooks` feature (the tests' build; never a release build), each driven by an
//! environment variable the test sets.

use std::time::Duration;

/// `EXITORDER_FAULT_WEDGE_FILE=PATH`: while PATH exists, the decision loop blocks where it
/// stands at the top of a round, as a loop stuck in a system call on a hung file system
/// would: the HTTP endpoint goes on answering, and only the loop's heartbeat tells.
pub const WEDGE_FILE: &str = "EXITORDER_FAULT_WEDGE_FILE";

/// Blocks the calling thread while the wedge file exists.
pub fn wedge_point() {
    let Some(path) = std::env::var_os(WEDGE_FILE) else {
        return;
    };
    let path = std::path::PathBuf::from(path);
    let mut said = false;
    while path.exists() {
        if !said {
            tracing::warn!(file = %path.display(), "fault hook: the decision loop is wedged while this file exists");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
