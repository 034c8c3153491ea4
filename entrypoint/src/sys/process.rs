//! The process: its arguments and environment, what std does before `main`, exec, and a
//! descriptor closed off its path.

use alloc::ffi::CString;
use alloc::vec::Vec;
use core::ffi::{c_char, c_int, CStr};

use super::{open, read, Fd, OsError};

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
