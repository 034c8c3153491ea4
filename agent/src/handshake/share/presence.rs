//! What is said in a container's directory besides its wait: the agent's presence file
//! (the entrypoint waits only while an agent serves it) and the container's mark (`stopping`,
//! its preStop began), with the agent's note of the mark it took (`stopping.seen`).

use std::os::fd::OwnedFd;

use rustix::fs::{self as rfs, AtFlags, FileType};

use super::{
    open_checked, read_capped, write_replace, ExitKey, Share, ShareError, AGENT_FILE, MARK_FILE,
    MARK_SEEN_FILE, MAX_EXIT_BYTES,
};

/// What the agent's presence file says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresenceState {
    /// The agent serves the directory: a waiting sidecar waits for its answer, however long
    /// the agent is away.
    Serving,
    /// exitorder was uninstalled from the node: a waiting sidecar proceeds at once.
    Uninstalled,
}

impl PresenceState {
    /// The file's content: the format's version, then the state; a serving agent says it
    /// holds an app's wait for its pod's endpoints (`HOLDS_ENDPOINTS`).
    ///
    /// Spelt out (`version=AGENT_VERSION`, `state=STATE_*` of the contract), so that marking
    /// every directory of a node allocates nothing; a unit test holds it to the contract.
    pub fn content(self) -> &'static str {
        match self {
            PresenceState::Serving => "version=1\nstate=serving\nendpoints=1\n",
            PresenceState::Uninstalled => "version=1\nstate=uninstalled\n",
        }
    }
}

impl Share {
    /// Makes the agent's presence known in a container's directory (`dir`, as opened by
    /// [`Self::prepare_container_dir`]), in `state`; `true` when the file was written, `false`
    /// when one of the same size was there already. The size is all that is checked: a
    /// container that rewrites its own presence file can only mislead its own preStop.
    pub fn mark_presence(
        &self,
        dir: &OwnedFd,
        key: &ExitKey,
        state: PresenceState,
    ) -> Result<bool, ShareError> {
        let want = state.content();
        if let Ok(st) = rfs::statat(dir, AGENT_FILE, AtFlags::SYMLINK_NOFOLLOW) {
            if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                && usize::try_from(st.st_size).ok() == Some(want.len())
            {
                return Ok(false);
            }
        }
        write_replace(
            dir,
            &self.container_path(key),
            AGENT_FILE,
            want.as_bytes(),
            0o644,
            false,
        )?;
        Ok(true)
    }

    /// [`Self::mark_presence`] by the container's key.
    pub fn mark_presence_of(
        &self,
        key: &ExitKey,
        state: PresenceState,
    ) -> Result<bool, ShareError> {
        let dir = self.open_container(key)?;
        self.mark_presence(&dir, key, state)
    }

    /// Takes a container's mark (`stopping`): when it was made (Unix ns) when there was one,
    /// which is removed, so that the next one is seen anew and a rescan never takes an old one
    /// for a new one. A directory or anything else by that name is no mark (only the
    /// container's own preStop pays for what it puts there); nothing is followed or opened.
    ///
    /// A mark is made when its file is created: its inode's change time, which the kernel sets
    /// and no one in the container can set back (`utimensat` moves it to now), and which a
    /// later change only moves later, toward `seen_ns` (when the agent found it), its bound:
    /// a mark found by a sweep (the agent restarted, or its event lost) is dated by when the
    /// container made it, not when the agent came by.
    /// In its place the agent leaves `stopping.seen`, saying when it saw it (`seen_ns`: a later
    /// agent measures the window from there, as this one does), for a later agent
    /// ([`Share::mark_seen`]); a failure to write it is the caller's to say. A recalled mark is
    /// dated by that sight: later than made, which errs toward a pod kill.
    pub fn take_mark(&self, key: &ExitKey, seen_ns: i64) -> Result<Option<i64>, ShareError> {
        let dir = match self.open_container(key) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let made_ns = rfs::statat(&dir, MARK_FILE, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .filter(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
            .and_then(|st| {
                let secs = u64::try_from(st.st_ctime).ok()?;
                let nanos = u32::try_from(st.st_ctime_nsec).unwrap_or(0);
                i64::try_from(std::time::Duration::new(secs, nanos).as_nanos()).ok()
            })
            .map_or(seen_ns, |made| made.min(seen_ns));
        match rfs::unlinkat(&dir, MARK_FILE, AtFlags::empty()) {
            Ok(()) => {
                let path = self.container_path(key);
                let note = format!("seen={seen_ns}\n");
                // Not durable: a node that loses it in a crash lost the pod's kill with it. One
                // that cannot be written (the container's own doing: a directory by its name)
                // costs only a later agent's memory of this pod's kill.
                if let Err(e) =
                    write_replace(&dir, &path, MARK_SEEN_FILE, note.as_bytes(), 0o644, false)
                {
                    tracing::debug!(container = %key, error = %e, "cannot note the container's mark");
                }
                Ok(Some(made_ns))
            }
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::ISDIR) => Ok(None),
            Err(e) => Err(ShareError::io(
                "remove",
                self.container_path(key).join(MARK_FILE),
                e,
            )),
        }
    }

    /// When an agent last took a mark of the container (Unix ns, its `stopping.seen`), if
    /// one did. The file is the container's to change, as everything in
    /// its directory: what it says decides only its own pod's waits.
    pub fn mark_seen(&self, key: &ExitKey) -> Result<Option<i64>, ShareError> {
        let dir = match self.open_container(key) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let path = self.container_path(key).join(MARK_SEEN_FILE);
        let Some(fd) = open_checked(&dir, MARK_SEEN_FILE, &path)? else {
            return Ok(None);
        };
        let mut buf = [0u8; MAX_EXIT_BYTES];
        let len = read_capped(&fd, &path, &mut buf)?;
        let text = std::str::from_utf8(buf.get(..len).unwrap_or_default()).unwrap_or("");
        Ok(text
            .trim()
            .strip_prefix("seen=")
            .and_then(|n| n.parse::<i64>().ok()))
    }
}
