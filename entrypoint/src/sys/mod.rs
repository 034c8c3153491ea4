//! The little of the operating system the entrypoint needs, over the C
//! library.
//!
//! The binary is built without Rust's std to stay small (see main.rs), so
//! what std would provide lives here: owned descriptors, OS errors shown the
//! way std shows them, a monotonic clock and sleeping, poll, TCP sockets,
//! signals read from a signalfd, the process set-up std does before `main`,
//! and exec. Each call into the C library sits in a small function of its
//! own, next to the reason it is sound.
//!
//! Descriptors, files, inotify and poll are in this file, the rest in its parts.
//!
//! Parts:
//! - `time`: the monotonic clock, sleeping;
//! - `signal`: signals read from a signalfd;
//! - `net`: non-blocking TCP;
//! - `process`: arguments, environment, the set-up before `main`, exec, detached closes.

mod net;
mod process;
mod signal;
mod time;

pub use net::{connect_start, send, socket_error, tcp_socket, IpAddr};
pub use process::{abort, args, close_detached, execvp, getenv, init_process};
pub use signal::SignalFd;
use time::timespec;
pub use time::{sleep_until, Instant};

use core::ffi::{c_char, c_int, c_short, CStr};
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
                crate::lossy::Lossy(detail.to_bytes()),
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

/// openat(2), relative to an open directory.
pub fn openat(dir: &Fd, name: &CStr, flags: c_int, mode: libc::mode_t) -> Result<Fd, OsError> {
    // SAFETY: name is NUL-terminated and dir a descriptor we own; the returned
    // descriptor is new and so owned by nobody else.
    check(unsafe { libc::openat(dir.raw(), name.as_ptr(), flags, mode) }).map(Fd)
}

/// renameat(2) within one directory.
pub fn renameat(dir: &Fd, from: &CStr, to: &CStr) -> Result<(), OsError> {
    // SAFETY: both names are NUL-terminated; dir is a descriptor we own.
    check(unsafe { libc::renameat(dir.raw(), from.as_ptr(), dir.raw(), to.as_ptr()) }).map(drop)
}

/// unlinkat(2) of a file in an open directory.
pub fn unlinkat(dir: &Fd, name: &CStr) -> Result<(), OsError> {
    // SAFETY: name is NUL-terminated; dir is a descriptor we own.
    check(unsafe { libc::unlinkat(dir.raw(), name.as_ptr(), 0) }).map(drop)
}

/// flock(2) with `LOCK_EX`, waiting for it; held until `fd` is closed.
pub fn lock_exclusive(fd: &Fd) -> Result<(), OsError> {
    loop {
        // SAFETY: plain system call on a descriptor we own.
        match check(unsafe { libc::flock(fd.raw(), libc::LOCK_EX) }) {
            Err(OsError(libc::EINTR)) => {}
            other => return other.map(drop),
        }
    }
}

/// Whether `path` itself is a symbolic link: readlink(2) reads nothing else.
pub fn is_link(path: &CStr) -> bool {
    let mut buffer = [0u8; 1];
    // SAFETY: path is NUL-terminated; the kernel writes at most buffer.len()
    // bytes into the buffer.
    unsafe { libc::readlink(path.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) >= 0 }
}

/// fsync(2).
pub fn fsync(fd: &Fd) -> Result<(), OsError> {
    // SAFETY: plain system call on a descriptor we own.
    check(unsafe { libc::fsync(fd.raw()) }).map(drop)
}

/// fchmod(2).
pub fn fchmod(fd: &Fd, mode: libc::mode_t) -> Result<(), OsError> {
    // SAFETY: plain system call on a descriptor we own.
    check(unsafe { libc::fchmod(fd.raw(), mode) }).map(drop)
}

/// Which file a stat(2) result is: its device and inode, and when it was made or last
/// changed (a file system often gives a new file the inode of one just removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl FileId {
    fn of(st: &libc::stat) -> FileId {
        FileId {
            dev: st.st_dev,
            ino: st.st_ino,
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// Which file an open descriptor is, from fstat(2).
pub fn file_id(fd: &Fd) -> Result<FileId, OsError> {
    let mut st = core::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: the kernel fills the whole struct on success, and it is read only then.
    check(unsafe { libc::fstat(fd.raw(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so the struct is initialized.
    Ok(FileId::of(unsafe { &st.assume_init() }))
}

/// Which file `path` names, not following a link, from lstat(2).
pub fn path_id(path: &CStr) -> Result<FileId, OsError> {
    let mut st = core::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: path is NUL-terminated; the kernel fills the whole struct on success, and it
    // is read only then.
    check(unsafe { libc::lstat(path.as_ptr(), st.as_mut_ptr()) })?;
    // SAFETY: lstat succeeded, so the struct is initialized.
    Ok(FileId::of(unsafe { &st.assume_init() }))
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

/// `poll` interest: data to read, or the peer closed.
pub const READABLE: c_short = libc::POLLIN;
/// `poll` interest: room to write, or a non-blocking connect finished.
pub const WRITABLE: c_short = libc::POLLOUT;

/// Waits up to `timeout` until one of `fds` is ready for its interest
/// ([`READABLE`], [`WRITABLE`]); returns what happened to each (`revents`,
/// where errors and hang-ups show as `POLLERR`/`POLLHUP`), all zero when the
/// time ran out first.
pub fn poll<const N: usize>(
    fds: [(&Fd, c_short); N],
    timeout: Duration,
) -> Result<[c_short; N], OsError> {
    let mut pollfds = fds.map(|(fd, events)| libc::pollfd {
        fd: fd.raw(),
        events,
        revents: 0,
    });
    let timeout = timespec(timeout);
    let count = libc::nfds_t::try_from(N).map_err(|_| OsError(libc::EINVAL))?;
    // SAFETY: the pollfd array and the timespec live on the stack for the
    // whole call and count is the array's length; a null sigmask leaves the
    // signal mask alone.
    let ready = unsafe { libc::ppoll(pollfds.as_mut_ptr(), count, &timeout, core::ptr::null()) };
    check(ready)?;
    Ok(pollfds.map(|pollfd| pollfd.revents))
}

/// Waits up to `timeout` for `fd` to become readable: `Ok(false)` when the
/// time ran out first.
pub fn poll_readable(fd: &Fd, timeout: Duration) -> Result<bool, OsError> {
    poll([(fd, READABLE)], timeout).map(|[revents]| revents != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

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
