//! The little of the operating system the entrypoint needs, over the C
//! library.
//!
//! The binary is built without Rust's std to stay small (see main.rs), so
//! what std would provide lives here: owned descriptors, OS errors shown the
//! way std shows them, a monotonic clock, the process set-up std does before
//! `main`, and exec. Each call into the C library sits in a small function of
//! its own, next to the reason it is sound.

use alloc::ffi::CString;
use alloc::vec::Vec;
use core::ffi::{c_char, c_int, CStr};
use core::fmt;
use core::time::Duration;

/// Standard output.
pub const STDOUT: c_int = libc::STDOUT_FILENO;
/// Standard error.
pub const STDERR: c_int = libc::STDERR_FILENO;

/// An errno value. Shown as std shows OS errors,
/// `No such file or directory (os error 2)`, so log lines read as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OsError(pub c_int);

impl OsError {
    /// The calling thread's `errno`.
    fn last() -> Self {
        // SAFETY: __errno_location always returns a valid pointer to the
        // calling thread's errno.
        OsError(unsafe { *libc::__errno_location() })
    }
}

impl fmt::Display for OsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buffer = [0u8; 128];
        // SAFETY: strerror_r (the XSI one) writes at most buffer.len() bytes,
        // NUL terminator included, into the buffer we own.
        let failed =
            unsafe { libc::strerror_r(self.0, buffer.as_mut_ptr().cast::<c_char>(), buffer.len()) }
                != 0;
        let detail = CStr::from_bytes_until_nul(&buffer)
            .ok()
            .filter(|detail| !failed && !detail.is_empty());
        match detail {
            Some(detail) => write!(
                f,
                "{} (os error {})",
                crate::log::Lossy(detail.to_bytes()),
                self.0
            ),
            None => write!(f, "os error {}", self.0),
        }
    }
}

impl core::error::Error for OsError {}

/// `Ok(value)` unless a C call returned -1, then the `errno` it left.
fn check(result: c_int) -> Result<c_int, OsError> {
    if result == -1 {
        Err(OsError::last())
    } else {
        Ok(result)
    }
}

/// An open file descriptor, closed when dropped.
#[derive(Debug)]
pub struct Fd(c_int);

impl Fd {
    fn raw(&self) -> c_int {
        self.0
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is owned by this value and closed only here.
        // Errors are ignored, as std's File does: for a local file or an
        // inotify instance they carry nothing to act on.
        unsafe { libc::close(self.0) };
    }
}

/// open(2) with an explicit mode (used with `O_CREAT`).
pub fn open(path: &CStr, flags: c_int, mode: libc::mode_t) -> Result<Fd, OsError> {
    // SAFETY: path is NUL-terminated; the returned descriptor is new and so
    // owned by nobody else.
    check(unsafe { libc::open(path.as_ptr(), flags, mode) }).map(Fd)
}

/// fchmod(2).
pub fn fchmod(fd: &Fd, mode: libc::mode_t) -> Result<(), OsError> {
    // SAFETY: plain system call on a descriptor we own.
    check(unsafe { libc::fchmod(fd.raw(), mode) }).map(drop)
}

/// unlink(2).
pub fn unlink(path: &CStr) -> Result<(), OsError> {
    // SAFETY: path is NUL-terminated.
    check(unsafe { libc::unlink(path.as_ptr()) }).map(drop)
}

/// read(2) into `buffer`; `Ok(0)` is the end of the file.
pub fn read(fd: &Fd, buffer: &mut [u8]) -> Result<usize, OsError> {
    // SAFETY: the kernel writes at most buffer.len() bytes into the buffer.
    let read = unsafe { libc::read(fd.raw(), buffer.as_mut_ptr().cast(), buffer.len()) };
    usize::try_from(read).map_err(|_| OsError::last())
}

/// Writes all of `bytes` to `fd`, retrying interrupted and partial writes.
pub fn write_all(fd: c_int, mut bytes: &[u8]) -> Result<(), OsError> {
    while !bytes.is_empty() {
        // SAFETY: the kernel reads at most bytes.len() bytes from the slice.
        let written = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        match usize::try_from(written) {
            // A write of 0 makes no progress; like std, do not spin on it.
            Ok(0) => return Err(OsError(libc::EIO)),
            Ok(written) => bytes = bytes.get(written..).unwrap_or_default(),
            Err(_) => match OsError::last() {
                OsError(libc::EINTR) => {}
                err => return Err(err),
            },
        }
    }
    Ok(())
}

/// Writes to an `Fd` we own.
pub fn write_all_fd(fd: &Fd, bytes: &[u8]) -> Result<(), OsError> {
    write_all(fd.raw(), bytes)
}

/// inotify_init1(2).
pub fn inotify_init(flags: c_int) -> Result<Fd, OsError> {
    // SAFETY: plain system call; the new descriptor is owned by nobody else.
    check(unsafe { libc::inotify_init1(flags) }).map(Fd)
}

/// inotify_add_watch(2); the watch lives as long as the inotify descriptor.
pub fn inotify_add_watch(inotify: &Fd, path: &CStr, mask: u32) -> Result<(), OsError> {
    // SAFETY: path is NUL-terminated; inotify is a descriptor we own.
    check(unsafe { libc::inotify_add_watch(inotify.raw(), path.as_ptr(), mask) }).map(drop)
}

/// One event out of a buffer filled by reading an inotify descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InotifyEvent<'a> {
    /// `IN_*` bits.
    pub mask: u32,
    /// Name of the file in the watched directory, empty for the directory
    /// itself.
    pub name: &'a [u8],
}

/// The events in `bytes`, as read(2) returned them from an inotify
/// descriptor: each a `struct inotify_event` followed by its NUL-padded name.
pub fn inotify_events(mut bytes: &[u8]) -> impl Iterator<Item = InotifyEvent<'_>> {
    // wd (i32), mask, cookie, len (u32 each).
    const HEADER: usize = 16;
    let field = |header: &[u8], at: usize| -> Option<u32> {
        let raw = header.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_ne_bytes(raw))
    };
    core::iter::from_fn(move || {
        let mask = field(bytes, 4)?;
        let len = usize::try_from(field(bytes, 12)?).ok()?;
        let end = HEADER.checked_add(len)?;
        let padded = bytes.get(HEADER..end)?;
        let name = padded.split(|&b| b == 0).next().unwrap_or_default();
        bytes = bytes.get(end..)?;
        Some(InotifyEvent { mask, name })
    })
}

/// Waits up to `timeout` for `fd` to become readable: `Ok(false)` when the
/// time ran out first.
pub fn poll_readable(fd: &Fd, timeout: Duration) -> Result<bool, OsError> {
    let mut pollfd = libc::pollfd {
        fd: fd.raw(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: timeout.subsec_nanos().into(),
    };
    // SAFETY: one pollfd and the timespec live on the stack for the whole
    // call; a null sigmask leaves the signal mask alone.
    let ready = unsafe { libc::ppoll(&mut pollfd, 1, &timeout, core::ptr::null()) };
    check(ready).map(|ready| ready > 0)
}

/// A reading of the monotonic clock, as `std::time::Instant` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(Duration);

impl Instant {
    pub fn now() -> Self {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec we own. Its result is
        // not checked: CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let secs = u64::try_from(now.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(now.tv_nsec).unwrap_or(0);
        Instant(Duration::from_secs(secs).saturating_add(Duration::from_nanos(nanos.into())))
    }

    pub fn checked_add(self, duration: Duration) -> Option<Self> {
        self.0.checked_add(duration).map(Instant)
    }

    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    pub fn elapsed(self) -> Duration {
        Instant::now().saturating_duration_since(self)
    }
}

/// The arguments the C runtime passed to `main`, program name included.
///
/// # Safety
///
/// `argv` must point to `argc` valid NUL-terminated strings, as the C
/// runtime's `argv` does.
pub unsafe fn args(argc: c_int, argv: *const *const c_char) -> Vec<CString> {
    let count = usize::try_from(argc).unwrap_or(0);
    (0..count)
        // SAFETY: the caller guarantees argc readable entries.
        .map(|index| unsafe { *argv.add(index) })
        .filter(|arg| !arg.is_null())
        // SAFETY: each non-null entry is a NUL-terminated string (caller).
        .map(|arg| CString::from(unsafe { CStr::from_ptr(arg) }))
        .collect()
}

/// An environment variable's value, copied.
pub fn getenv(name: &str) -> Option<CString> {
    let name = CString::new(name).ok()?;
    // SAFETY: name is NUL-terminated. The process is single-threaded and
    // never changes its environment, so the returned string stays valid
    // while it is copied.
    let value = unsafe { libc::getenv(name.as_ptr()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: a non-null getenv result is a NUL-terminated string.
    Some(CString::from(unsafe { CStr::from_ptr(value) }))
}

/// What Rust's std runtime does before `main`, which this binary has to do
/// itself:
/// - descriptors 0, 1 and 2 that are closed are opened on /dev/null, so no
///   file this process opens (the exit file, inotify) ends up as stdout or
///   stderr of this process and of the command it runs;
/// - SIGPIPE is ignored, so a closed stderr pipe makes a log write fail
///   instead of killing the hook before the wrapped command runs.
///
/// As std does, it aborts when a closed descriptor cannot be filled.
pub fn init_process() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only inspects the descriptor table.
        let closed = unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1
            && OsError::last() == OsError(libc::EBADF);
        if closed {
            match open(c"/dev/null", libc::O_RDWR, 0) {
                // Kept open for good: it now is the standard descriptor.
                Ok(null) => core::mem::forget(null),
                Err(_) => abort(),
            }
        }
    }
    set_sigpipe(libc::SIG_IGN);
}

fn set_sigpipe(handler: libc::sighandler_t) {
    // SAFETY: SIG_IGN and SIG_DFL are not handler functions, so no code of
    // ours can run in signal context.
    unsafe { libc::signal(libc::SIGPIPE, handler) };
}

/// Replaces this process with `program`, looked up in PATH as execvp(3)
/// does, with `args` after it. Returns only on failure.
///
/// As std's `Command::exec` does, SIGPIPE goes back to its default first:
/// the command must not inherit the ignoring this process set up for itself.
/// The signal mask is passed on unchanged, as std does too.
pub fn execvp(program: &CStr, args: &[CString]) -> OsError {
    let mut argv: Vec<*const c_char> = Vec::with_capacity(args.len() + 2);
    argv.push(program.as_ptr());
    argv.extend(args.iter().map(|arg| arg.as_ptr()));
    argv.push(core::ptr::null());
    set_sigpipe(libc::SIG_DFL);
    // SAFETY: program and every argv entry are NUL-terminated strings that
    // outlive the call, and argv ends with a null pointer.
    unsafe { libc::execvp(program.as_ptr(), argv.as_ptr()) };
    OsError::last()
}

/// Ends the process at once, as a failed assertion in C would.
pub fn abort() -> ! {
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_read_like_std() {
        assert_eq!(
            alloc::format!("{}", OsError(libc::ENOENT)),
            "No such file or directory (os error 2)"
        );
    }

    #[test]
    fn inotify_events_are_split_with_their_names() {
        let mut bytes = Vec::new();
        for (mask, name) in [
            (libc::IN_CREATE, &b"exit\0\0\0\0"[..]),
            (libc::IN_IGNORED, b""),
        ] {
            bytes.extend_from_slice(&1i32.to_ne_bytes());
            bytes.extend_from_slice(&mask.to_ne_bytes());
            bytes.extend_from_slice(&0u32.to_ne_bytes());
            bytes.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            bytes.extend_from_slice(name);
        }
        let events: Vec<_> = inotify_events(&bytes).collect();
        assert_eq!(
            events,
            [
                InotifyEvent {
                    mask: libc::IN_CREATE,
                    name: b"exit"
                },
                InotifyEvent {
                    mask: libc::IN_IGNORED,
                    name: b""
                },
            ]
        );
        // A truncated event is dropped rather than misread.
        assert_eq!(inotify_events(&bytes[..20]).count(), 0);
    }
}
