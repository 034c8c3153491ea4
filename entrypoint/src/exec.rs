//! Handing the process over to the wrapped command.
//!
//! exec(2) rather than spawn-and-wait: the hook's exit status must be the
//! command's own, and kubelet kills the hook's process, not a child of it,
//! when the grace period runs out.

use crate::cli::Exec;
use crate::lossy::Lossy;
use crate::sys::{self, OsError};

/// Shell convention: the command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Shell convention: the command was found but could not be run.
pub const EXIT_CANNOT_RUN: u8 = 126;

/// Replaces this process with the command, looked up in PATH when its name
/// has no slash. Returns only if that fails, with the exit status to use.
pub fn replace_process(exec: &Exec) -> u8 {
    let err = sys::execvp(&exec.program, &exec.args);
    crate::log!("cannot run {}: {err}", Lossy(exec.program.to_bytes()));
    if err == OsError(libc::ENOENT) {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_RUN
    }
}
