//! `install DIR`: the binary copies itself into DIR, where the pod's other containers run it
//! from (a read-only mount of the same `emptyDir`). What the init container `exitorder-install`
//! runs, from the project's image, which holds nothing else: no shell, no `cp`.
//!
//! The copy is written to a temporary name created exclusively (never through a link that a
//! container of the pod could have put there), synced, given mode 0555 (any user may run it,
//! none may change it) and renamed over `exitorder-entrypoint`, so a container starting at
//! the same moment runs the old file or the new one, never a part. An init container runs
//! again when its pod restarts: an earlier copy, or the debris of an interrupted one, is
//! replaced.

use alloc::ffi::CString;
use alloc::vec::Vec;
use core::ffi::CStr;
use core::fmt;

use exitorder_contract::share;

use crate::cli::{InstallArgs, EX_FAILED};
use crate::log;
use crate::sys::{self, OsError};

/// The name the pods' hooks run, in DIR.
pub const NAME: &CStr = share::ENTRYPOINT_C;
const TEMP: &CStr = c".exitorder-entrypoint.new";
/// The running binary, whatever path it was started by.
const SELF: &CStr = c"/proc/self/exe";
/// Far more than the binary (under 1 MiB); a file larger than this is not it.
const MAX_SIZE: usize = 16 * 1024 * 1024;

/// Why an install failed.
#[derive(Debug)]
pub enum Failure {
    /// A step failed.
    Step(&'static str, OsError),
    /// DIR is a symbolic link: it could point anywhere, so it is not followed.
    Link,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Step(step, error) => write!(f, "{step}: {error}"),
            Failure::Link => f.write_str("a symbolic link, not followed"),
        }
    }
}

fn at(step: &'static str) -> impl FnOnce(OsError) -> Failure {
    move |error| Failure::Step(step, error)
}

/// Runs `install`; the process's exit status.
pub fn run(args: &InstallArgs) -> u8 {
    let dir = without_trailing_slashes(&args.dir);
    let shown = crate::lossy::Lossy(dir.to_bytes());
    match install(&dir) {
        Ok(size) => {
            let name = crate::lossy::Lossy(NAME.to_bytes());
            log!("installed {shown}/{name} ({size} bytes, mode 0555)");
            0
        }
        Err(e) => {
            log!("cannot install into {shown}: {e}");
            EX_FAILED
        }
    }
}

/// `dir` without trailing slashes: open(2) follows a link named `link/` even with
/// `O_NOFOLLOW`, and refuses one named `link`.
fn without_trailing_slashes(dir: &CStr) -> CString {
    let bytes = dir.to_bytes();
    let end = bytes
        .iter()
        .rposition(|&b| b != b'/')
        .map_or(bytes.len().min(1), |last| last + 1);
    // A C string's bytes hold no NUL, so the fallback is never taken.
    CString::new(bytes.get(..end).unwrap_or(bytes)).unwrap_or_else(|_| CString::from(dir))
}

/// Copies the running binary into `path`, a directory given without trailing slashes;
/// its size.
pub fn install(path: &CStr) -> Result<usize, Failure> {
    // The directory itself, never a link in its place.
    let dir = sys::open(
        path,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0,
    )
    .map_err(|e| match e {
        // What the kernel says of a link refused here ("Not a directory", or "Too many
        // levels of symbolic links" without O_DIRECTORY) would mislead.
        OsError(libc::ENOTDIR | libc::ELOOP) if sys::is_link(path) => Failure::Link,
        e => at("open the directory")(e),
    })?;
    // The temporary name is one for all: a second install into the same directory at
    // the same time would remove this one's file and have its part renamed into place.
    sys::lock_exclusive(&dir).map_err(at("lock the directory"))?;
    let bytes = read_self()?;
    let create = || {
        sys::openat(
            &dir,
            TEMP,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    let file = match create() {
        // Debris of an interrupted install (none runs now: the lock), or a link someone
        // put there: removed, never written through.
        Err(OsError(libc::EEXIST)) => sys::unlinkat(&dir, TEMP).and_then(|()| create()),
        other => other,
    }
    .map_err(at("create the temporary file"))?;
    let written = sys::write_all_fd(&file, &bytes)
        .map_err(at("write"))
        .and_then(|()| sys::fsync(&file).map_err(at("sync")))
        .and_then(|()| sys::fchmod(&file, 0o555).map_err(at("chmod")))
        .and_then(|()| sys::renameat(&dir, TEMP, NAME).map_err(at("rename into place")));
    drop(file);
    if let Err(e) = written {
        let _ = sys::unlinkat(&dir, TEMP);
        return Err(e);
    }
    Ok(bytes.len())
}

fn read_self() -> Result<Vec<u8>, Failure> {
    let file = sys::open(SELF, libc::O_RDONLY | libc::O_CLOEXEC, 0).map_err(at("open itself"))?;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        match sys::read(&file, &mut chunk) {
            Ok(0) => return Ok(bytes),
            Ok(n) => {
                bytes.extend_from_slice(chunk.get(..n).unwrap_or_default());
                if bytes.len() > MAX_SIZE {
                    return Err(at("read itself")(OsError(libc::EFBIG)));
                }
            }
            Err(OsError(libc::EINTR)) => {}
            Err(e) => return Err(at("read itself")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_slashes_go_and_the_root_stays() {
        for (given, meant) in [
            (c"/var/run/exitorder-bin/", c"/var/run/exitorder-bin"),
            (c"link//", c"link"),
            (c"dir", c"dir"),
            (c"/", c"/"),
            (c"///", c"/"),
        ] {
            assert_eq!(without_trailing_slashes(given).as_c_str(), meant);
        }
    }
}
