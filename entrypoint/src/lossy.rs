//! Bytes shown as text, for the diagnostics: apart from [`log`](crate::log), which writes
//! through [`sys`](crate::sys), so that `sys`'s errors can show theirs too.

use core::fmt::{self, Write};

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
