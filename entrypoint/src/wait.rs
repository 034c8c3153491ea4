//! The exit-file handshake with the node agent.
//!
//! The container's directory is a host directory the agent watches. Creating
//! `exit` (content `wait`) asks for permission to exit; the agent answers by
//! putting a file containing `allow` in its place in one step (an exchange,
//! or a rename over it) once the containers this sidecar serves have stopped.
//!
//! Waiting is driven by inotify rather than polling the file: preStop time
//! comes out of the pod's grace period, and a poll interval would be added to
//! every pod's shutdown. inotify sees writes made on the host side of the
//! bind mount because watches are on the inode, not on the mount.
//!
//! inotify instances are limited per user across the whole node
//! (`fs.inotify.max_user_instances`, 128 by default), and every container
//! running as root shares root's: when a node drains hundreds of pods at once
//! the limit is reached. Failing open then would release sidecars out of
//! order exactly when it matters most, so the wait checks the file every
//! [`POLL_FALLBACK`] instead, and says so.
//!
//! Nobody but this process creates or removes `exit`, and the agent only
//! ever replaces it (exchange or rename: `exit` is never missing between). If it disappears while waiting, someone else
//! removed it, and the wait ends as [`Outcome::ExitFileGone`]: recreating
//! the request could lose an `allow` the agent wrote just before the
//! removal, and holding on would make the wait depend on the timeout alone,
//! so the caller proceeds. A file renamed over `exit` by anyone is read like
//! the agent's answer: `allow` ends the wait, anything else does not.

use alloc::ffi::CString;
use alloc::vec::Vec;
use core::ffi::{c_int, CStr};
use core::fmt;
use core::time::Duration;

use crate::lossy::Lossy;
use crate::sys::{self, Fd, Instant, OsError, SignalFd};
use exitorder_contract::handshake::{holds_endpoints, presence, Presence};

/// Name of the request/answer file inside the directory.
pub const EXIT_FILE: &str = exitorder_contract::handshake::EXIT_FILE;
/// Name of the file by which the agent says it serves the directory.
pub const AGENT_FILE: &str = exitorder_contract::handshake::AGENT_FILE;
/// More than the agent's presence file holds; a later agent's longer one reads as serving.
const MAX_PRESENCE: usize = 256;
/// What the request file holds until the agent answers.
pub const WAIT_CONTENT: &[u8] = b"wait\n";
/// The agent's answer, compared after trimming whitespace.
pub const ALLOW: &[u8] = exitorder_contract::handshake::ALLOW.as_bytes();
/// More than any answer needs; bounds what a stray large file costs us.
pub const MAX_ANSWER: usize = 64;
/// Creating `exit` exclusively loses only to a concurrent writer, such as a
/// late answer to an earlier request; a few retries settle that before
/// failing open.
const CREATE_ATTEMPTS: usize = 3;
/// Upper bound of one ppoll(2); the deadline is re-checked after each.
const MAX_POLL: Duration = Duration::from_secs(3600);
/// Room for many `struct inotify_event`s with a NAME_MAX name each.
const EVENT_BUFFER: usize = 4096;
/// How often `exit` is read when no inotify instance or watch can be had.
pub const POLL_FALLBACK: Duration = Duration::from_millis(50);

/// Name of the file by which a container says it is being stopped.
pub const MARK_FILE: &str = exitorder_contract::handshake::MARK_FILE;

/// Says in `dir` that this container is being stopped: `stopping` made anew (a file made
/// before, which the agent had not taken yet, is replaced, so the agent sees this one
/// appear). Nothing is waited for.
pub fn mark(dir: &CStr) -> Result<(), SetupError> {
    let fail = |action| {
        move |source: OsError| SetupError {
            action,
            dir: CString::from(dir),
            source,
        }
    };
    let path = file_in(dir, MARK_FILE).map_err(fail("mark"))?;
    remove_file(&path).map_err(fail("remove an earlier mark in"))?;
    match create_exit_file(&path) {
        // The agent may not have taken an earlier one, and another run of the same hook may
        // have made it between the removal and the creation: it is a mark all the same.
        Ok(_) | Err(OsError(libc::EEXIST)) => Ok(()),
        Err(err) => Err(fail("mark")(err)),
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The agent answered `allow`.
    Allowed,
    /// The timeout passed without an answer.
    TimedOut,
    /// The directory was removed, moved or unmounted, so no answer can
    /// arrive at the path the agent knows.
    DirectoryGone,
    /// `exit` was removed (or moved away) by someone else.
    ExitFileGone,
    /// This signal arrived (through the [`SignalFd`] given to the wait).
    Signalled(c_int),
    /// No agent said it serves the directory within the presence wait: nothing will answer.
    NoAgent,
    /// The agent said exitorder is uninstalled from the node: nothing will answer.
    Uninstalled,
}

/// Setting up the request failed; the caller proceeds without permission.
#[derive(Debug)]
pub struct SetupError {
    action: &'static str,
    dir: CString,
    source: OsError,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot {} {}: {}",
            self.action,
            Lossy(self.dir.to_bytes()),
            self.source
        )
    }
}

impl core::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A posted request for exit permission: `exit` exists and is being watched.
#[derive(Debug)]
pub struct ExitRequest {
    dir: CString,
    exit_file: CString,
    agent_file: CString,
    watch: Watch,
    /// The file this request created, to tell it from another request made in its place.
    id: Option<sys::FileId>,
}

/// How the answer is noticed.
#[derive(Debug)]
enum Watch {
    Inotify(Fd),
    /// No inotify instance or watch could be had (the error says why): `exit`
    /// is read every [`POLL_FALLBACK`].
    Polling(OsError),
}

/// Whether an inotify failure is the node running out of instances or
/// watches (worth waiting without them) rather than a problem of the
/// directory.
fn out_of_inotify(err: OsError) -> bool {
    matches!(
        err,
        OsError(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOSPC)
    )
}

impl ExitRequest {
    /// Starts watching `dir`, clears a stale `exit`, then creates `exit`.
    ///
    /// The watch comes before the file so that an agent answering at once
    /// cannot slip its answer in unseen. The stale file is removed first so
    /// an `allow` left over from an earlier run (a restarted container keeps
    /// its host directory) never counts as an answer to this request.
    ///
    /// No descriptor of the directory is kept open: it would pin the dentry,
    /// and the kernel then holds back IN_DELETE_SELF until it is closed, so a
    /// removed directory would go unnoticed until the timeout.
    pub fn post(dir: &CStr) -> Result<Self, SetupError> {
        let fail = |action| {
            move |source: OsError| SetupError {
                action,
                dir: CString::from(dir),
                source,
            }
        };
        let watch = match sys::inotify_init(libc::IN_NONBLOCK | libc::IN_CLOEXEC) {
            Ok(inotify) => {
                // ONLYDIR makes a missing mount that left a plain file behind
                // fail here, with a clear message, instead of at the first
                // file operation.
                match sys::inotify_add_watch(
                    &inotify,
                    dir,
                    libc::IN_CLOSE_WRITE
                        | libc::IN_MOVED_TO
                        | libc::IN_CREATE
                        | libc::IN_DELETE
                        | libc::IN_MOVED_FROM
                        | libc::IN_DELETE_SELF
                        | libc::IN_MOVE_SELF
                        | libc::IN_ONLYDIR,
                ) {
                    Ok(()) => Watch::Inotify(inotify),
                    Err(err) if out_of_inotify(err) => Watch::Polling(err),
                    Err(err) => return Err(fail("watch")(err)),
                }
            }
            Err(err) if out_of_inotify(err) => Watch::Polling(err),
            Err(err) => return Err(fail("set up inotify for")(err)),
        };

        let exit_file = file_in(dir, EXIT_FILE).map_err(fail("create exit file in"))?;
        let agent_file = file_in(dir, AGENT_FILE).map_err(fail("create exit file in"))?;
        // Under the directory's lock: another run of this hook withdrawing its own request
        // (see [`Self::withdraw`]) never sees this one half made.
        let file = with_dir_lock(dir, || {
            let mut attempts = 0;
            loop {
                attempts += 1;
                remove_file(&exit_file).map_err(fail("remove stale exit file in"))?;
                match create_exit_file(&exit_file) {
                    Err(OsError(libc::EEXIST)) if attempts < CREATE_ATTEMPTS => continue,
                    other => break other.map_err(fail("create exit file in")),
                }
            }
        })?;
        if let Err(err) = sys::write_all_fd(&file, WAIT_CONTENT) {
            let _ = remove_file(&exit_file);
            return Err(fail("write exit file in")(err));
        }
        // Once written: the write changes it (its change time).
        let id = sys::file_id(&file).ok();
        // Closing is what raises IN_CLOSE_WRITE for the agent; Fd's drop ignores close
        // errors, which carry nothing useful for a local file.
        drop(file);
        Ok(ExitRequest {
            dir: dir.into(),
            exit_file,
            agent_file,
            watch,
            id,
        })
    }

    /// Why the answer is polled for instead of watched, if it is.
    pub fn polling(&self) -> Option<OsError> {
        match self.watch {
            Watch::Inotify(_) => None,
            Watch::Polling(err) => Some(err),
        }
    }

    /// Blocks until the agent allows the exit, `timeout` passes, `exit` or
    /// the directory goes away, or one of `signals` arrives; or, with `presence`,
    /// until that long has passed with no agent saying it serves the directory.
    /// An agent that said so once (its presence file stays while it restarts or
    /// is upgraded) is waited for until `timeout`; one that says exitorder was
    /// uninstalled ends the wait at once.
    pub fn wait(
        &self,
        timeout: Duration,
        presence: Option<Duration>,
        signals: Option<&SignalFd>,
    ) -> Result<Outcome, OsError> {
        let deadline = Instant::now().checked_add(timeout);
        // The answer may already have landed between creating the file and
        // now; its event is queued too, but checking first costs nothing.
        if let Some(outcome) = self.check_answer() {
            return Ok(outcome);
        }
        // Until an agent is seen: when it must have shown itself.
        let mut unseen = presence
            .and_then(|wait| Instant::now().checked_add(wait))
            .filter(|at| deadline.is_none_or(|d| *at < d));
        if let Some(outcome) = self.check_presence(&mut unseen) {
            return Ok(outcome);
        }
        let inotify = match &self.watch {
            Watch::Inotify(inotify) => inotify,
            Watch::Polling(_) => return self.poll_answer(deadline, unseen, signals),
        };
        let mut buffer = [0u8; EVENT_BUFFER];
        loop {
            let Some(slice) = next_slice(deadline, MAX_POLL) else {
                return Ok(Outcome::TimedOut);
            };
            let slice = until(unseen, slice);
            let ready = match signals {
                Some(signals) => sys::poll(
                    [(inotify, sys::READABLE), (signals.fd(), sys::READABLE)],
                    slice,
                )
                .map(|[events, signal]| (events != 0, signal != 0)),
                None => sys::poll_readable(inotify, slice).map(|events| (events, false)),
            };
            let (events_ready, signal_ready) = match ready {
                Ok(ready) => ready,
                Err(OsError(libc::EINTR)) => continue,
                Err(err) => return Err(err),
            };
            if let (true, Some(signals)) = (signal_ready, signals) {
                if let Some(signal) = signals.take()? {
                    return Ok(Outcome::Signalled(signal));
                }
            }
            if !events_ready {
                if let Some(outcome) = self.check_presence(&mut unseen) {
                    return Ok(outcome);
                }
                continue;
            }

            let events = drain_events(inotify, &mut buffer)?;
            let answer = if events.recheck {
                self.check_answer()
            } else {
                None
            };
            // An `allow` that landed counts whatever else happened; a
            // directory that went away explains a missing `exit` better.
            match (answer, events.directory_gone) {
                (Some(Outcome::Allowed), _) => return Ok(Outcome::Allowed),
                (_, true) => return Ok(Outcome::DirectoryGone),
                (Some(outcome), false) => return Ok(outcome),
                (None, false) => {}
            }
            if events.presence || unseen.is_some() {
                if let Some(outcome) = self.check_presence(&mut unseen) {
                    return Ok(outcome);
                }
            }
        }
    }

    /// What the agent's presence file says, as far as the wait goes: `Uninstalled`
    /// when it says so; `NoAgent` when there is none and `unseen` has passed; else
    /// `None`, and an agent seen clears `unseen` (it is waited for from then on,
    /// however long it is away).
    fn check_presence(&self, unseen: &mut Option<Instant>) -> Option<Outcome> {
        match read_presence(&self.agent_file) {
            Some(Presence::Uninstalled) => Some(Outcome::Uninstalled),
            Some(Presence::Serving) => {
                *unseen = None;
                None
            }
            None => unseen
                .is_some_and(|at| Instant::now() >= at)
                .then_some(Outcome::NoAgent),
        }
    }

    /// Whether the agent serving the directory says it holds an app's wait until its pod's
    /// endpoints are withdrawn ([`holds_endpoints`]): asked once it answered.
    pub fn agent_holds_endpoints(&self) -> bool {
        read_agent_file(&self.agent_file)
            .is_some_and(|(content, len)| holds_endpoints(&content[..len]))
    }

    /// Without inotify: reads `exit` every [`POLL_FALLBACK`]. A removed
    /// directory shows as a missing `exit`.
    fn poll_answer(
        &self,
        deadline: Option<Instant>,
        mut unseen: Option<Instant>,
        signals: Option<&SignalFd>,
    ) -> Result<Outcome, OsError> {
        loop {
            let Some(slice) = next_slice(deadline, POLL_FALLBACK) else {
                return Ok(Outcome::TimedOut);
            };
            let slice = until(unseen, slice);
            match signals {
                Some(signals) => match sys::poll_readable(signals.fd(), slice) {
                    Ok(true) => {
                        if let Some(signal) = signals.take()? {
                            return Ok(Outcome::Signalled(signal));
                        }
                    }
                    Ok(false) | Err(OsError(libc::EINTR)) => {}
                    Err(err) => return Err(err),
                },
                None => sys::sleep_until(Instant::now().saturating_add(slice)),
            }
            if let Some(outcome) = self.check_answer() {
                return Ok(outcome);
            }
            if let Some(outcome) = self.check_presence(&mut unseen) {
                return Ok(outcome);
            }
        }
    }

    /// Stops watching, without the kernel's slow teardown of the inotify instance on this
    /// process's path (see [`sys::close_detached`]).
    pub fn finish(self) {
        if let Watch::Inotify(inotify) = self.watch {
            sys::close_detached(inotify);
        }
    }

    /// Removes `exit` (a missing file is fine), unless another request took this one's
    /// place: the same hook run again, which the kubelet does when it starts a pod's kill
    /// over (a shortened grace period, a retried kill) while this run still waits. That
    /// request is its hook's to withdraw; removing it would let its container go unanswered.
    /// The agent's answer in this request's place is this request's, and goes.
    pub fn withdraw(&self) -> Result<(), OsError> {
        // Under the directory's lock, as another run posts its request: what is looked at is
        // what is removed.
        with_dir_lock(&self.dir, || self.withdraw_locked())
    }

    fn withdraw_locked(&self) -> Result<(), OsError> {
        match sys::path_id(&self.exit_file) {
            // Nothing there: nothing to withdraw (a request made just after is not ours).
            Err(OsError(libc::ENOENT)) => return Ok(()),
            Ok(now)
                if self.id.is_some_and(|ours| ours != now)
                    && read_answer(&self.exit_file).is_ok_and(|a| is_request(&a)) =>
            {
                return Ok(());
            }
            _ => {}
        }
        remove_file(&self.exit_file)
    }

    /// What `exit` says now: `Allowed` for the agent's `allow`,
    /// `ExitFileGone` when there is no `exit` any more, `None` to keep
    /// waiting. Any other failure to read it (mid-rename, odd file type)
    /// just means "not yet".
    fn check_answer(&self) -> Option<Outcome> {
        match read_answer(&self.exit_file) {
            Ok(answer) if is_allow(&answer) => Some(Outcome::Allowed),
            Err(OsError(libc::ENOENT)) => Some(Outcome::ExitFileGone),
            Ok(_) | Err(_) => None,
        }
    }
}

/// Whether `exit`'s first [`MAX_ANSWER`] bytes are the agent's `allow`. Kept apart from the
/// reading so it can be checked against the agent's own reading of the same bytes.
pub fn is_allow(answer: &[u8]) -> bool {
    answer.trim_ascii() == ALLOW
}

/// Whether `content` is a request still waiting (`wait`, or nothing yet), as the agent reads it.
fn is_request(content: &[u8]) -> bool {
    let c = content.trim_ascii();
    c.is_empty() || c == WAIT_CONTENT.trim_ascii()
}

/// `slice`, cut short to end when `unseen` comes.
fn until(unseen: Option<Instant>, slice: Duration) -> Duration {
    unseen.map_or(slice, |at| {
        slice.min(at.saturating_duration_since(Instant::now()))
    })
}

/// What the agent's presence file in the directory says; `None` when there is none. A file
/// that cannot be read (a directory or a link the container put there) reads as an agent
/// serving: it errs toward the order, and only the container's own preStop pays.
fn read_presence(path: &CStr) -> Option<Presence> {
    read_agent_file(path).map(|(content, len)| presence(&content[..len]))
}

/// The presence file's first [`MAX_PRESENCE`] bytes and how many there are; `None` when
/// there is no file. One that cannot be opened reads as empty (an agent's, erring toward
/// the order).
fn read_agent_file(path: &CStr) -> Option<([u8; MAX_PRESENCE], usize)> {
    let mut content = [0u8; MAX_PRESENCE];
    let fd = match sys::open(
        path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        0,
    ) {
        Ok(fd) => fd,
        Err(OsError(libc::ENOENT)) => return None,
        Err(_) => return Some((content, 0)),
    };
    let mut len = 0;
    while len < MAX_PRESENCE {
        match sys::read(&fd, &mut content[len..]) {
            Ok(0) => break,
            Ok(read) => len += read,
            Err(OsError(libc::EINTR)) => {}
            Err(_) => break,
        }
    }
    Some((content, len))
}

/// How long to wait next: at most `most`, and no later than `deadline`; `None` once the
/// deadline has passed. No deadline (a timeout too large for the clock) is as good as none.
fn next_slice(deadline: Option<Instant>, most: Duration) -> Option<Duration> {
    match deadline {
        Some(deadline) => {
            let left = deadline.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(most))
        }
        None => Some(most),
    }
}

fn drain_events(inotify: &Fd, buffer: &mut [u8]) -> Result<Events, OsError> {
    let mut events = Events::default();
    loop {
        let len = match sys::read(inotify, buffer) {
            Ok(0) | Err(OsError(libc::EAGAIN)) => return Ok(events),
            Ok(len) => len,
            Err(OsError(libc::EINTR)) => continue,
            Err(err) => return Err(err),
        };
        for event in sys::inotify_events(&buffer[..len]) {
            // MOVE_SELF counts as gone too: the agent answers at the
            // path, which no longer leads to this directory.
            let gone =
                libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_UNMOUNT | libc::IN_IGNORED;
            if event.mask & gone != 0 {
                events.directory_gone = true;
            }
            // After an overflow, events for `exit` may have been lost.
            let about_exit = event.name == EXIT_FILE.as_bytes();
            let overflow = event.mask & libc::IN_Q_OVERFLOW != 0;
            if about_exit || overflow {
                events.recheck = true;
            }
            if event.name == AGENT_FILE.as_bytes() || overflow {
                events.presence = true;
            }
        }
    }
}

#[derive(Debug, Default)]
struct Events {
    recheck: bool,
    directory_gone: bool,
    /// The agent's presence file changed.
    presence: bool,
}

/// `dir/name`. Fails only if the result is not a C string, which cannot
/// happen for a directory that came in as one.
fn file_in(dir: &CStr, name: &str) -> Result<CString, OsError> {
    let mut path = Vec::from(dir.to_bytes());
    if path.last() != Some(&b'/') {
        path.push(b'/');
    }
    path.extend_from_slice(name.as_bytes());
    CString::new(path).map_err(|_| OsError(libc::EINVAL))
}

fn remove_file(path: &CStr) -> Result<(), OsError> {
    match sys::unlink(path) {
        Ok(()) | Err(OsError(libc::ENOENT)) => Ok(()),
        Err(err) => Err(err),
    }
}

fn create_exit_file(path: &CStr) -> Result<Fd, OsError> {
    let mode = 0o644;
    let fd = sys::open(
        path,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        mode,
    )?;
    // The container's umask (often 077 in hardened images) must not decide
    // whether the agent can read the request.
    sys::fchmod(&fd, mode)?;
    Ok(fd)
}

/// Runs `f` holding an exclusive flock(2) on `dir` (without one if the directory cannot be
/// opened or locked: `f` then runs as it did before runs of a hook could overlap). Held for
/// a few system calls, never across a wait; the descriptor is closed at once, so it pins
/// nothing (see [`ExitRequest::post`]).
fn with_dir_lock<T>(dir: &CStr, f: impl FnOnce() -> T) -> T {
    let fd = sys::open(dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0);
    if let Ok(fd) = &fd {
        let _ = sys::lock_exclusive(fd);
    }
    let out = f();
    drop(fd);
    out
}

fn read_answer(path: &CStr) -> Result<Vec<u8>, OsError> {
    // O_NOFOLLOW so a symlink planted in the shared directory cannot point us
    // at another file; O_NONBLOCK so a FIFO named `exit` cannot hang the hook.
    let fd = sys::open(
        path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        0,
    )?;
    let mut answer = [0u8; MAX_ANSWER];
    let mut len = 0;
    while len < MAX_ANSWER {
        match sys::read(&fd, &mut answer[len..]) {
            Ok(0) => break,
            Ok(read) => len += read,
            Err(OsError(libc::EINTR)) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(Vec::from(&answer[..len]))
}
