//! Diagnostics on stderr.
//!
//! kubelet keeps a preStop hook's output only when the hook fails, so the
//! lines are few and short. Write errors are ignored on purpose: a closed or
//! broken stderr must not turn into a panic (an abort, in release builds) that
//! skips the wrapped command.

use std::fmt;
use std::io::Write;

/// Prefix of every line, so the lines can be told apart from the wrapped
/// command's own output.
pub const PREFIX: &str = "exitorder-entrypoint:";

/// Writes one `exitorder-entrypoint: ...` line to stderr.
pub fn line(args: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{PREFIX} {args}");
}

/// `log!("...", args)`: one prefixed line on stderr.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log::line(format_args!($($arg)*))
    };
}
