//! Diagnostics on stderr.
//!
//! kubelet keeps a preStop hook's output only when the hook fails, so the
//! lines are few and short. Write errors are ignored on purpose: a closed or
//! broken stderr must not stop the hook before the wrapped command runs.

use core::fmt::{self, Write};

use crate::sys;

/// Prefix of every line, so the lines can be told apart from the wrapped
/// command's own output.
pub const PREFIX: &str = "exitorder-entrypoint:";

/// Writes one `exitorder-entrypoint: ...` line to stderr.
///
/// The line is gathered in a stack buffer and written with one write(2)
/// where it fits, so it is not interleaved with the wrapped command's or
/// other containers' output, and so logging needs no memory allocation (the
/// panic handler logs too, possibly after an allocation failed).
pub fn line(args: fmt::Arguments<'_>) {
    let mut out = LineWriter {
        buffer: [0; LINE_BUFFER],
        len: 0,
    };
    let _ = writeln!(out, "{PREFIX} {args}");
    out.flush();
}

/// `log!("...", args)`: one prefixed line on stderr.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log::line(format_args!($($arg)*))
    };
}

/// Longer than any line we write but the usage text, which bypasses it.
const LINE_BUFFER: usize = 512;

struct LineWriter {
    buffer: [u8; LINE_BUFFER],
    len: usize,
}

impl LineWriter {
    fn flush(&mut self) {
        let _ = sys::write_all(sys::STDERR, &self.buffer[..self.len]);
        self.len = 0;
    }
}

impl Write for LineWriter {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut bytes = text.as_bytes();
        while !bytes.is_empty() {
            if self.len == LINE_BUFFER {
                self.flush();
            }
            let free = &mut self.buffer[self.len..];
            let take = bytes.len().min(free.len());
            free[..take].copy_from_slice(&bytes[..take]);
            self.len += take;
            bytes = &bytes[take..];
        }
        Ok(())
    }
}
