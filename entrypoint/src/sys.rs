//! The little of the operating system the entrypoint needs, over the C
//! library.
//!
//! The binary is built without Rust's std to stay small (see main.rs), so
//! what std would provide lives here: owned descriptors, OS errors shown the
//! way std shows them, a monotonic clock and sleeping, poll, TCP sockets,
//! signals read from a signalfd, the process set-up std does before `main`,
//! and exec. Each call into the C library sits in a small function of its
//! own, next to the reason it is sound.

use alloc::ffi::CString;
use alloc::vec::Vec;
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

fn timespec(duration: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: libc::time_t::try_from(duration.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: duration.subsec_nanos().into(),
    }
}

/// Sleeps until the monotonic clock reads `until` (at once if it already
/// has), whatever signals interrupt it.
pub fn sleep_until(until: Instant) {
    let until = timespec(until.0);
    loop {
        // SAFETY: clock_nanosleep reads one timespec we own; with
        // TIMER_ABSTIME the remainder pointer may be null.
        let err = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &until,
                core::ptr::null_mut(),
            )
        };
        // 0 when the time came; EINTR: a signal, sleep on. Anything else
        // (EINVAL for a time the kernel cannot represent) would repeat
        // forever, so stop rather than spin.
        if err != libc::EINTR {
            return;
        }
    }
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

    /// `self + duration`, or the end of time when that does not fit: a
    /// deadline too far away to represent is as good as none.
    pub fn saturating_add(self, duration: Duration) -> Self {
        Instant(self.0.saturating_add(duration))
    }

    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    pub fn elapsed(self) -> Duration {
        Instant::now().saturating_duration_since(self)
    }
}

/// Signals taken over from their default action (which ends the process)
/// while they are blocked and read from a signalfd instead, so the process
/// can clean up before it exits. Dropping it unblocks them again: one that
/// arrived and was not read then takes its default action at once.
#[derive(Debug)]
pub struct SignalFd {
    fd: Fd,
    previous: libc::sigset_t,
}

impl SignalFd {
    /// Blocks `signals` and opens a signalfd that reports them.
    pub fn open(signals: &[c_int]) -> Result<Self, OsError> {
        let mut set = empty_sigset();
        for &signal in signals {
            // SAFETY: set was initialised by sigemptyset.
            check(unsafe { libc::sigaddset(&mut set, signal) })?;
        }
        let mut previous = empty_sigset();
        // SAFETY: both sets are initialised and live on the stack; the
        // process has one thread, so the process and thread masks are one.
        check(unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, &mut previous) })?;
        // SAFETY: set is initialised; -1 asks for a new descriptor, owned by
        // nobody else.
        match check(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) }) {
            Ok(fd) => Ok(SignalFd {
                fd: Fd(fd),
                previous,
            }),
            Err(err) => {
                restore_sigmask(&previous);
                Err(err)
            }
        }
    }

    /// The descriptor to poll for [`READABLE`].
    pub fn fd(&self) -> &Fd {
        &self.fd
    }

    /// The next signal that arrived, if any.
    pub fn take(&self) -> Result<Option<c_int>, OsError> {
        // sizeof(struct signalfd_siginfo); ssi_signo (u32) comes first.
        let mut info = [0u8; 128];
        loop {
            return match read(&self.fd, &mut info) {
                Ok(len) if len >= 4 => {
                    let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
                    Ok(c_int::try_from(signo).ok())
                }
                Ok(_) | Err(OsError(libc::EAGAIN)) => Ok(None),
                Err(OsError(libc::EINTR)) => continue,
                Err(err) => Err(err),
            };
        }
    }
}

impl Drop for SignalFd {
    fn drop(&mut self) {
        restore_sigmask(&self.previous);
    }
}

fn empty_sigset() -> libc::sigset_t {
    let mut set = core::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the whole set and cannot fail for a
    // valid pointer, which this is.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        set.assume_init()
    }
}

fn restore_sigmask(previous: &libc::sigset_t) {
    // SAFETY: previous is an initialised set; the old mask is not wanted.
    // It cannot fail with a valid `how` and pointers.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, previous, core::ptr::null_mut()) };
}

/// An IP address to connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpAddr {
    V4([u8; 4]),
    V6([u8; 16]),
}

/// A new non-blocking TCP socket for `addr`'s family.
pub fn tcp_socket(addr: IpAddr) -> Result<Fd, OsError> {
    let family = match addr {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    };
    let kind = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: plain system call; the new descriptor is owned by nobody else.
    check(unsafe { libc::socket(family, kind, 0) }).map(Fd)
}

/// Starts connecting a socket from [`tcp_socket`] to `addr:port`: `true`
/// when it is connected already; if not, it is once [`poll`] reports it
/// [`WRITABLE`] and [`socket_error`] says `None`.
pub fn connect_start(socket: &Fd, addr: IpAddr, port: u16) -> Result<bool, OsError> {
    let result = match addr {
        IpAddr::V4(octets) => {
            let sockaddr = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(octets),
                },
                sin_zero: [0; 8],
            };
            connect(socket, &sockaddr)
        }
        IpAddr::V6(octets) => {
            let sockaddr = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: octets },
                sin6_scope_id: 0,
            };
            connect(socket, &sockaddr)
        }
    };
    match result {
        Ok(()) => Ok(true),
        // EINTR: the connection goes on in the background, as EINPROGRESS.
        Err(OsError(libc::EINPROGRESS | libc::EINTR)) => Ok(false),
        Err(err) => Err(err),
    }
}

/// connect(2) to a `sockaddr_in` or `sockaddr_in6`.
fn connect<T: SockAddr>(socket: &Fd, sockaddr: &T) -> Result<(), OsError> {
    let len =
        libc::socklen_t::try_from(core::mem::size_of::<T>()).map_err(|_| OsError(libc::EINVAL))?;
    // SAFETY: sockaddr is a complete sockaddr_in/sockaddr_in6 (SockAddr is
    // implemented for those only), whose family field matches its type, and
    // len is its size.
    check(unsafe { libc::connect(socket.raw(), (sockaddr as *const T).cast(), len) }).map(drop)
}

/// The socket address structures [`connect`] may be given.
trait SockAddr {}
impl SockAddr for libc::sockaddr_in {}
impl SockAddr for libc::sockaddr_in6 {}

/// The pending error of a socket (`SO_ERROR`), which also clears it: for a
/// non-blocking connect, `None` once it succeeded.
pub fn socket_error(socket: &Fd) -> Result<Option<OsError>, OsError> {
    let mut error: c_int = 0;
    let mut len = libc::socklen_t::try_from(core::mem::size_of::<c_int>())
        .map_err(|_| OsError(libc::EINVAL))?;
    // SAFETY: getsockopt writes at most len bytes into error, an int we own,
    // and updates len.
    check(unsafe {
        libc::getsockopt(
            socket.raw(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut error as *mut c_int).cast(),
            &mut len,
        )
    })?;
    Ok((error != 0).then_some(OsError(error)))
}

/// send(2) without SIGPIPE; returns how much was sent.
pub fn send(socket: &Fd, bytes: &[u8]) -> Result<usize, OsError> {
    // SAFETY: the kernel reads at most bytes.len() bytes from the slice.
    let sent = unsafe {
        libc::send(
            socket.raw(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(sent).map_err(|_| OsError::last())
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

/// Closes `fd` off this process's path: a detached process (a grandchild, so that neither
/// this process nor the command it may exec has it as a child) takes a reference to it and
/// drops it only once this process has exited or exec'd, and this process's own close then
/// never is the last one.
///
/// For an inotify instance the last close waits for a kernel RCU grace period (10 to 20 ms
/// on a busy node), which would otherwise sit between the agent's `allow` and the wrapped
/// command's start, or the hook's end. The detached process holds nothing else: its
/// standard descriptors go to /dev/null, so a runtime waiting for the hook's output (CRI
/// ExecSync) does not wait for it. When no process can be made, `fd` is closed here.
pub fn close_detached(fd: Fd) {
    let mut ends = [0 as c_int; 2];
    // SAFETY: ends has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let (read_end, write_end) = (Fd(ends[0]), Fd(ends[1]));
    // SAFETY: this process is single-threaded; the child only calls async-signal-safe
    // functions before it exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: as above; the grandchild, if made, goes on alone.
        let grandchild = unsafe { libc::fork() };
        if grandchild != 0 {
            // SAFETY: _exit ends this process without running anything else.
            unsafe { libc::_exit(0) };
        }
        hold_until_eof(&read_end, write_end);
        drop(fd);
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    drop(read_end);
    if child > 0 {
        let mut status = 0;
        // SAFETY: child is this process's own child; status is a valid out pointer.
        unsafe { libc::waitpid(child, &mut status, 0) };
    }
    // Open until this process exits or execs (O_CLOEXEC): what the holder waits for.
    core::mem::forget(write_end);
    drop(fd);
}

/// In the detached holder: stdin, stdout and stderr to /dev/null, then blocks until every
/// write end of the pipe is gone.
fn hold_until_eof(read_end: &Fd, write_end: Fd) {
    drop(write_end);
    // SAFETY: opening /dev/null makes a new descriptor owned by nobody else.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    for target in 0..3 {
        // SAFETY: dup2 and close only change this process's descriptor table.
        unsafe {
            if null >= 0 {
                libc::dup2(null, target);
            } else {
                libc::close(target);
            }
        }
    }
    let mut byte = [0u8; 1];
    // Until EOF (or an error): the waiting process is gone.
    while let Err(OsError(libc::EINTR)) = read(read_end, &mut byte) {}
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
