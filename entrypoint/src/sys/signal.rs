//! Signals taken over and read from a signalfd.

use core::ffi::c_int;

use super::{check, read, Fd, OsError};

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
