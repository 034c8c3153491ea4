//! The exit-file handshake with the node agent.
//!
//! The container's directory is a host directory the agent watches. Creating
//! `exit` (content `wait`) asks for permission to exit; the agent answers by
//! renaming a file containing `allow` over it once the containers this
//! sidecar serves have stopped.
//!
//! Waiting is driven by inotify rather than polling the file: preStop time
//! comes out of the pod's grace period, and a poll interval would be added to
//! every pod's shutdown. inotify sees writes made on the host side of the
//! bind mount because watches are on the inode, not on the mount.

use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::OwnedFd;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{fchmod, open, unlink, Mode, OFlags};
use rustix::io::Errno;

/// Name of the request/answer file inside the directory.
pub const EXIT_FILE: &str = "exit";
/// What the request file holds until the agent answers.
pub const WAIT_CONTENT: &[u8] = b"wait\n";
/// The agent's answer, compared after trimming whitespace.
pub const ALLOW: &[u8] = b"allow";
/// More than any answer needs; bounds what a stray large file costs us.
const MAX_ANSWER: u64 = 64;
/// Creating `exit` exclusively loses only to a concurrent writer, such as a
/// late answer to an earlier request; a few retries settle that before
/// failing open.
const CREATE_ATTEMPTS: usize = 3;
/// Upper bound of one poll(2); the deadline is re-checked after each.
const MAX_POLL: Duration = Duration::from_secs(3600);
/// Room for many `struct inotify_event`s with a NAME_MAX name each.
const EVENT_BUFFER: usize = 4096;

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
}

/// Setting up the request failed; the caller proceeds without permission.
#[derive(Debug)]
pub struct SetupError {
    action: &'static str,
    dir: PathBuf,
    source: io::Error,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot {} {}: {}",
            self.action,
            self.dir.display(),
            self.source
        )
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A posted request for exit permission: `exit` exists and is being watched.
#[derive(Debug)]
pub struct ExitRequest {
    exit_file: PathBuf,
    inotify: OwnedFd,
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
    pub fn post(dir: &Path) -> Result<Self, SetupError> {
        let fail = |action| {
            move |errno: Errno| SetupError {
                action,
                dir: dir.to_owned(),
                source: errno.into(),
            }
        };
        let inotify = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)
            .map_err(fail("set up inotify for"))?;
        // ONLYDIR makes a missing mount that left a plain file behind fail
        // here, with a clear message, instead of at the first file operation.
        inotify::add_watch(
            &inotify,
            dir,
            WatchFlags::CLOSE_WRITE
                | WatchFlags::MOVED_TO
                | WatchFlags::CREATE
                | WatchFlags::DELETE_SELF
                | WatchFlags::MOVE_SELF
                | WatchFlags::ONLYDIR,
        )
        .map_err(fail("watch"))?;

        let exit_file = dir.join(EXIT_FILE);
        let mut attempts = 0;
        let file = loop {
            attempts += 1;
            remove_file(&exit_file).map_err(fail("remove stale exit file in"))?;
            match create_exit_file(&exit_file) {
                Err(Errno::EXIST) if attempts < CREATE_ATTEMPTS => continue,
                other => break other.map_err(fail("create exit file in"))?,
            }
        };
        if let Err(err) = write_request(file) {
            let _ = remove_file(&exit_file);
            return Err(SetupError {
                action: "write exit file in",
                dir: dir.to_owned(),
                source: err,
            });
        }
        Ok(ExitRequest { exit_file, inotify })
    }

    /// Blocks until the agent allows the exit, `timeout` passes, or the
    /// directory goes away.
    pub fn wait(&self, timeout: Duration) -> io::Result<Outcome> {
        let deadline = Instant::now().checked_add(timeout);
        // The answer may already have landed between creating the file and
        // now; its event is queued too, but checking first costs nothing.
        if self.allowed() {
            return Ok(Outcome::Allowed);
        }
        let mut buffer = [MaybeUninit::<u8>::uninit(); EVENT_BUFFER];
        loop {
            let slice = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Outcome::TimedOut);
                    }
                    left.min(MAX_POLL)
                }
                // A timeout too large for the clock is as good as none.
                None => MAX_POLL,
            };
            let slice = Timespec::try_from(slice).unwrap_or(Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
            let mut fds = [PollFd::new(&self.inotify, PollFlags::IN)];
            match poll(&mut fds, Some(&slice)) {
                Ok(0) | Err(Errno::INTR) => continue,
                Ok(_) => {}
                Err(errno) => return Err(errno.into()),
            }

            let events = self.drain_events(&mut buffer)?;
            if events.recheck && self.allowed() {
                return Ok(Outcome::Allowed);
            }
            if events.directory_gone {
                return Ok(Outcome::DirectoryGone);
            }
        }
    }

    /// Removes `exit`, whatever it holds; a missing file is fine.
    pub fn withdraw(&self) -> io::Result<()> {
        remove_file(&self.exit_file).map_err(io::Error::from)
    }

    fn drain_events(&self, buffer: &mut [MaybeUninit<u8>]) -> io::Result<Events> {
        let mut events = Events::default();
        let mut reader = inotify::Reader::new(&self.inotify, buffer);
        loop {
            match reader.next() {
                Ok(event) => {
                    let flags = event.events();
                    // MOVE_SELF counts as gone too: the agent answers at the
                    // path, which no longer leads to this directory.
                    if flags.intersects(
                        ReadFlags::DELETE_SELF
                            | ReadFlags::MOVE_SELF
                            | ReadFlags::UNMOUNT
                            | ReadFlags::IGNORED,
                    ) {
                        events.directory_gone = true;
                    }
                    // After an overflow, events for `exit` may have been lost.
                    let about_exit = event
                        .file_name()
                        .is_some_and(|name| name.to_bytes() == EXIT_FILE.as_bytes());
                    if about_exit || flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                        events.recheck = true;
                    }
                }
                Err(Errno::AGAIN) => return Ok(events),
                Err(Errno::INTR) => continue,
                Err(errno) => return Err(errno.into()),
            }
        }
    }

    /// Whether `exit` currently holds the agent's `allow`. Any failure to
    /// read it (mid-rename, odd file type) just means "not yet".
    fn allowed(&self) -> bool {
        read_answer(&self.exit_file).is_ok_and(|answer| answer.trim_ascii() == ALLOW)
    }
}

#[derive(Debug, Default)]
struct Events {
    recheck: bool,
    directory_gone: bool,
}

fn remove_file(path: &Path) -> Result<(), Errno> {
    match unlink(path) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(errno) => Err(errno),
    }
}

fn create_exit_file(path: &Path) -> Result<File, Errno> {
    let mode = Mode::from_raw_mode(0o644);
    let fd = open(
        path,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )?;
    // The container's umask (often 077 in hardened images) must not decide
    // whether the agent can read the request.
    fchmod(&fd, mode)?;
    Ok(File::from(fd))
}

fn write_request(mut file: File) -> io::Result<()> {
    file.write_all(WAIT_CONTENT)?;
    // Closing is what raises IN_CLOSE_WRITE for the agent; File's drop
    // ignores close errors, which carry nothing useful for a local file.
    drop(file);
    Ok(())
}

fn read_answer(path: &Path) -> io::Result<Vec<u8>> {
    // O_NOFOLLOW so a symlink planted in the shared directory cannot point us
    // at another file; O_NONBLOCK so a FIFO named `exit` cannot hang the hook.
    let fd = open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut answer = Vec::with_capacity(MAX_ANSWER as usize);
    File::from(fd).take(MAX_ANSWER).read_to_end(&mut answer)?;
    Ok(answer)
}
