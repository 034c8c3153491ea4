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

/// Shows bytes from the command line or the file system (paths, command
/// names) as text, with U+FFFD for what is not UTF-8, as std's
/// `Path::display` does.
#[derive(Debug, Clone, Copy)]
pub struct Lossy<'a>(pub &'a [u8]);

impl fmt::Display for Lossy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_char(char::REPLACEMENT_CHARACTER)?;
            }
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    #[test]
    fn lossy_replaces_what_is_not_utf8() {
        assert_eq!(
            format!("{}", Lossy(b"/var/run/exitorder")),
            "/var/run/exitorder"
        );
        assert_eq!(format!("{}", Lossy(b"/d\xff/x")), "/d\u{fffd}/x");
    }
}
