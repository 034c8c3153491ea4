//! The host share: `pods/<pod-uid>/<container>/exit` files written by sidecars' preStop hooks
//! (and the same layout below the kubelet's own directory of pods, for pod-local handshakes).
//!
//! Every container can write into its own directory, and the agent runs as root, so nothing
//! here trusts the tree below `pods/<uid>/<name>/`: directories are opened one component at a
//! time with `O_NOFOLLOW | O_DIRECTORY`, the exit file is checked to be a regular file with no
//! other hard link before it is opened for reading (a FIFO must not block the agent, a device
//! must not be opened at all), reads are capped, and writes go to an `O_EXCL` temp file
//! renamed into place inside the same directory.
//!
//! Parts:
//! - `at`: the file operations, each relative to an open directory, none following a link;
//! - `names`: container names, trees and exit states, checked before they become paths;
//! - `presence`: the agent's presence and the containers' marks in their directories;
//! - `retire`: replaced exit files removed off the decision path, one thread per share;
//! - `error`: what can go wrong in the share, and what the agent refused to touch there.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};

/// Content the agent writes to let a container exit.
pub use exitorder_contract::handshake::ALLOW;
/// Name of the file a waiting container creates and the agent answers.
pub use exitorder_contract::handshake::EXIT_FILE;
/// What the entrypoint writes while it waits (an empty file is also taken as waiting: the
/// agent may see the file between its creation and its first write).
pub use exitorder_contract::handshake::WAIT;
use exitorder_contract::podlocal;
/// File name of the installed entrypoint in the bin directory.
pub use exitorder_contract::share::ENTRYPOINT as ENTRYPOINT_NAME;

/// The agent's presence file in a container's directory.
pub use exitorder_contract::handshake::AGENT_FILE;
/// The file by which a container says it is being stopped, and the agent's note of one.
pub use exitorder_contract::handshake::{MARK_FILE, MARK_SEEN_FILE};

/// More than any valid content; the rest of a larger file is never read.
const MAX_EXIT_BYTES: usize = 64;
/// Deepest directory level the removal of a pod's tree descends to; a container could nest
/// directories without end, and a deeper tree is left for an operator rather than recursed.
/// Directories open at once while a pod's tree is removed.
const MAX_REMOVE_DEPTH: usize = 8;
/// Most entries read from one listing of `pods/` or of a pod's directory. The kubelet makes
/// one per pod and one per container; a directory holding more was filled by something else,
/// and reading all of it would let that something hold the decision loop and its memory.
const MAX_LISTED: usize = 16_384;

/// How many directory entries a removal may still take apart. Removal streams each directory
/// and stops when this is spent, so a pod that filled its directory with millions of entries
/// costs a bounded amount of work per round and no memory per entry; the next round goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget(u64);

impl Budget {
    pub fn new(entries: u64) -> Self {
        Budget(entries)
    }

    pub fn left(&self) -> u64 {
        self.0
    }

    /// Takes one entry's worth; `false` once nothing is left.
    fn spend(&mut self) -> bool {
        match self.0.checked_sub(1) {
            Some(n) => {
                self.0 = n;
                true
            }
            None => false,
        }
    }
}

/// How a pod directory's removal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Gone (or was already).
    Removed,
    /// The budget ran out: taken apart in part, to be gone on next round.
    Unfinished,
    /// A container in it still waits: left as it is.
    Waiting,
}

mod at;
mod error;
mod names;
mod presence;
mod retire;

pub(crate) use at::write_replace;
use at::{
    mkdir_at, open_checked, open_dir_at, open_exit_file, read_capped, remove_tree_at, subdirs,
    swap_in, utf8,
};
pub use error::{Rejection, ShareError};
pub use names::{ContainerName, ExitKey, ExitState, Place, ShareEntry};
pub use presence::PresenceState;

use crate::pod::PodUid;

/// Which exit file a request is: its inode and its modification time (a file system may
/// give a new file the inode of one just removed; not within the same clock tick and the
/// same write, which a request made again never is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    ino: u64,
    mtime_ns: i128,
}

/// Whether `root` is a directory that was removed while something (a bind mount, as a
/// hostPath volume is) still holds it: nothing can be created in it any more.
pub fn is_removed(root: &Path) -> bool {
    rfs::stat(root).is_ok_and(|st| st.st_nlink == 0)
}

/// An opened directory of pods' exit directories: the host share, or the kubelet's own
/// directory of pods for pod-local handshakes.
#[derive(Debug)]
pub struct Share {
    root: PathBuf,
    place: Place,
    pods: OwnedFd,
    /// Removes the exit files that `allow` replaced.
    retirer: retire::Retirer,
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Share {
    /// Opens (creating if needed) the share at `root` with its `pods/`.
    pub fn open(root: &Path) -> Result<Self, ShareError> {
        // The root itself is the operator's choice (it may sit behind a symlink such as
        // /var/lib -> /data); only what is below it is guarded.
        std::fs::create_dir_all(root).map_err(|e| ShareError::io("create directory", root, e))?;
        let root_fd = rfs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ShareError::io("open directory", root, e))?;
        let pods_path = root.join("pods");
        mkdir_at(&root_fd, "pods", &pods_path, 0o755)?;
        Ok(Share {
            pods: open_dir_at(&root_fd, "pods", &pods_path)?,
            root: root.to_owned(),
            place: Place::Share,
            retirer: retire::Retirer::start(),
        })
    }

    /// Opens the kubelet's directory of pods under `kubelet_root`, creating nothing: it is
    /// the kubelet's, and its absence means the agent was given the wrong root.
    pub fn open_kubelet(kubelet_root: &Path) -> Result<Self, ShareError> {
        let pods_path = kubelet_root.join(podlocal::PODS_DIR);
        // The root is the operator's choice (microk8s keeps it below /var/snap); only what
        // is below `pods/` is the pods' and guarded.
        let pods = rfs::open(
            &pods_path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ShareError::io("open directory", &pods_path, e))?;
        Ok(Share {
            pods,
            root: kubelet_root.to_owned(),
            place: Place::PodLocal,
            retirer: retire::Retirer::start(),
        })
    }

    pub fn place(&self) -> Place {
        self.place
    }

    /// Whether `pods/` under the root is still the directory opened: an
    /// operator who removes (or moves) the share and creates it again leaves this share
    /// holding deleted directories that no pod writes to any more.
    pub fn is_current(&self) -> bool {
        let same = |fd: &OwnedFd, name: &str| {
            let (Ok(open), Ok(now)) = (
                rfs::fstat(fd),
                rfs::lstat(self.root.join(name)).map_err(|_| ()),
            ) else {
                return false;
            };
            open.st_dev == now.st_dev && open.st_ino == now.st_ino && open.st_nlink > 0
        };
        same(&self.pods, "pods")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn pods_path(&self) -> PathBuf {
        self.root.join("pods")
    }

    pub fn pod_path(&self, pod: &PodUid) -> PathBuf {
        self.pods_path().join(pod.as_str())
    }

    /// The directory that holds a pod's exit directories.
    pub fn exits_path(&self, pod: &PodUid) -> PathBuf {
        let mut p = self.pod_path(pod);
        p.extend(self.place.between());
        p
    }

    pub fn container_path(&self, key: &ExitKey) -> PathBuf {
        self.exits_path(&key.pod).join(key.container.as_str())
    }

    fn key(&self, pod: PodUid, container: ContainerName) -> ExitKey {
        ExitKey {
            pod,
            container,
            place: self.place,
        }
    }

    /// Walks from the pod's own directory down to the one that holds its exit directories,
    /// each opened as a real directory, calling `at` on each before looking for the next:
    /// the kubelet makes them one after the other as it sets the pod's volumes up, and a
    /// watch placed on a level before the next is looked for misses none. `Ok(true)` when
    /// the walk reached the exit directories' parent.
    pub fn walk_pod<E>(
        &self,
        pod: &PodUid,
        mut at: impl FnMut(&Path, std::os::fd::BorrowedFd<'_>) -> Result<(), E>,
    ) -> Result<Result<bool, E>, ShareError> {
        use std::os::fd::AsFd as _;
        let mut path = self.pod_path(pod);
        let mut dir = open_dir_at(&self.pods, pod.as_str(), &path)?;
        if let Err(e) = at(&path, dir.as_fd()) {
            return Ok(Err(e));
        }
        for name in self.place.between() {
            path = path.join(name);
            dir = match open_dir_at(&dir, *name, &path) {
                Ok(d) => d,
                Err(e) if e.is_not_found() => return Ok(Ok(false)),
                Err(e) => return Err(e),
            };
            if let Err(e) = at(&path, dir.as_fd()) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(true))
    }

    /// Classifies a path reported by the file watcher. `Ok(None)` for paths that are not ours
    /// to look at (temp files, other names); `Err` for names that cannot be a pod or container.
    pub fn classify(&self, path: &Path) -> Result<Option<ShareEntry>, ShareError> {
        let pods = self.pods_path();
        let Ok(rel) = path.strip_prefix(&pods) else {
            return Ok(None);
        };
        let parts: Vec<&OsStr> = rel
            .components()
            .map(|c| match c {
                Component::Normal(s) => Ok(s),
                _ => Err(ShareError::BadName {
                    kind: "path",
                    name: path.display().to_string(),
                }),
            })
            .collect::<Result<_, _>>()?;
        let Some((uid, rest)) = parts.split_first() else {
            return Ok(None);
        };
        let between = self.place.between();
        let on_the_way = |names: &[&OsStr]| {
            names.len() <= between.len()
                && names
                    .iter()
                    .zip(between)
                    .all(|(n, b)| n.as_bytes() == b.as_bytes())
        };
        let pod = || -> Result<PodUid, ShareError> { Ok(PodUid::parse(utf8(uid, "pod uid")?)?) };
        let container = |name: &OsStr| -> Result<ContainerName, ShareError> {
            ContainerName::parse(utf8(name, "container")?)
        };
        // A directory on the way to the exit directories: the pod's chain to look at again.
        if on_the_way(rest) {
            return Ok(Some(ShareEntry::Pod(pod()?)));
        }
        let (Some(head), tail) = (rest.get(..between.len()), rest.get(between.len()..)) else {
            return Ok(None);
        };
        if !on_the_way(head) {
            return Ok(None);
        }
        match tail.unwrap_or_default() {
            [name] => Ok(Some(ShareEntry::Container(
                self.key(pod()?, container(name)?),
            ))),
            [name, file] if file.as_bytes() == EXIT_FILE.as_bytes() => Ok(Some(
                ShareEntry::ExitFile(self.key(pod()?, container(name)?)),
            )),
            [name, file] if file.as_bytes() == MARK_FILE.as_bytes() => Ok(Some(
                ShareEntry::MarkFile(self.key(pod()?, container(name)?)),
            )),
            _ => Ok(None),
        }
    }

    /// Opens the directory that holds the pod's exit directories, one component at a time,
    /// never through a link.
    fn open_pod(&self, pod: &PodUid) -> Result<OwnedFd, ShareError> {
        let mut path = self.pod_path(pod);
        let mut dir = open_dir_at(&self.pods, pod.as_str(), &path)?;
        for name in self.place.between() {
            path = path.join(name);
            dir = open_dir_at(&dir, *name, &path)?;
        }
        Ok(dir)
    }

    fn open_container(&self, key: &ExitKey) -> Result<OwnedFd, ShareError> {
        let pod = self.open_pod(&key.pod)?;
        open_dir_at(&pod, key.container.as_str(), &self.container_path(key))
    }

    /// Makes a container's directory writable by the container's user. The kubelet creates
    /// `subPathExpr` directories as root, and proxies such as linkerd-proxy run as non-root,
    /// so without this their preStop could not create `exit`. The directory is that one
    /// container's own, so opening it up gives nothing to anyone else.
    ///
    /// Returns the directory as opened (and checked): what a watch of it must be added on.
    pub fn prepare_container_dir(&self, key: &ExitKey) -> Result<OwnedFd, ShareError> {
        let dir = self.open_container(key)?;
        let path = self.container_path(key);
        let st = rfs::fstat(&dir).map_err(|e| ShareError::io("stat", &path, e))?;
        if st.st_mode & 0o7777 != 0o777 {
            rfs::fchmod(&dir, Mode::from_raw_mode(0o777))
                .map_err(|e| ShareError::io("chmod", &path, e))?;
        }
        Ok(dir)
    }

    /// Reads a container's exit file.
    pub fn read_exit(&self, key: &ExitKey) -> Result<ExitState, ShareError> {
        self.read_request(key).map(|(state, _)| state)
    }

    /// Reads a container's exit file, and which file it is: a request made again (the
    /// entrypoint removes the old file and creates a new one) is another file, even when the
    /// events that said so were coalesced before the agent read it.
    pub fn read_request(&self, key: &ExitKey) -> Result<(ExitState, Option<FileId>), ShareError> {
        let dir = match self.open_container(key) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok((ExitState::Absent, None)),
            Err(e) => return Err(e),
        };
        let path = self.container_path(key).join(EXIT_FILE);
        let Some(fd) = open_exit_file(&dir, &path)? else {
            return Ok((ExitState::Absent, None));
        };
        let id = rfs::fstat(&fd).ok().map(|st| FileId {
            ino: st.st_ino,
            mtime_ns: i128::from(st.st_mtime)
                .saturating_mul(1_000_000_000)
                .saturating_add(i128::from(st.st_mtime_nsec)),
        });
        let mut buf = [0u8; MAX_EXIT_BYTES];
        let len = read_capped(&fd, &path, &mut buf)?;
        Ok((ExitState::parse(buf.get(..len).unwrap_or_default()), id))
    }

    /// How long ago the exit file was written, by its own modification time: for
    /// measurements of the test bed only. The agent never dates a wait from it (the pod sets
    /// its files' times).
    pub fn exit_age(&self, key: &ExitKey) -> Option<std::time::Duration> {
        let dir = self.open_container(key).ok()?;
        let st = rfs::statat(&dir, EXIT_FILE, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let secs = u64::try_from(st.st_mtime).ok()?;
        let nanos = u32::try_from(st.st_mtime_nsec).unwrap_or(0);
        let mtime = SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::new(secs, nanos))?;
        SystemTime::now().duration_since(mtime).ok()
    }

    /// Lets a container exit: `allow` goes to a temp file that takes the place of `exit` in
    /// one step, so the waiting entrypoint never reads a half-written answer; the replaced
    /// `exit` is removed off this path (see [`retire`]).
    pub fn write_allow(&self, key: &ExitKey) -> Result<(), ShareError> {
        let dir = self.open_container(key)?;
        let path = self.container_path(key);
        let replaced = swap_in(
            &dir,
            &path,
            EXIT_FILE,
            format!("{ALLOW}\n").as_bytes(),
            0o644,
        )?;
        if let Some(name) = replaced {
            self.retirer.retire(dir, name);
        }
        Ok(())
    }

    /// Every valid container directory in the share.
    pub fn containers(&self) -> Result<Vec<ExitKey>, ShareError> {
        let mut out = Vec::new();
        for pod in self.pods()? {
            out.extend(self.containers_in(&pod)?);
        }
        Ok(out)
    }

    /// Pod directories with valid names (others are ignored: they cannot come from the kubelet).
    pub fn pods(&self) -> Result<Vec<PodUid>, ShareError> {
        Ok(subdirs(&self.pods, &self.pods_path())?
            .into_iter()
            .filter_map(|n| PodUid::parse(&n.to_string_lossy()).ok())
            .collect())
    }

    /// The valid container directories of one pod (none when the pod directory is gone).
    pub fn containers_in(&self, pod: &PodUid) -> Result<Vec<ExitKey>, ShareError> {
        let pod_fd = match self.open_pod(pod) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(subdirs(&pod_fd, &self.exits_path(pod))?
            .into_iter()
            .filter_map(|name| ContainerName::parse(&name.to_string_lossy()).ok())
            .map(|container| self.key(pod.clone(), container))
            .collect())
    }

    /// Containers of a pod with a live (waiting) exit file. An exit file that is refused (a
    /// link, a FIFO, a device) is no wait: the entrypoint only ever creates a regular file.
    pub fn waiting_in(&self, pod: &PodUid) -> Result<Vec<ExitKey>, ShareError> {
        let mut out = Vec::new();
        for key in self.containers_in(pod)? {
            match self.read_exit(&key) {
                Ok(ExitState::Waiting) => out.push(key),
                Ok(_) => {}
                Err(e) if e.rejection().is_some() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Whether the pod's exit directories are in a real directory (opened as the agent opens
    /// it, without following a link).
    pub fn check_pod_dir(&self, pod: &PodUid) -> Result<(), ShareError> {
        self.open_pod(pod).map(drop)
    }

    /// When the pod directory last changed.
    pub fn pod_mtime(&self, pod: &PodUid) -> Result<SystemTime, ShareError> {
        let st = rfs::statat(&self.pods, pod.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| ShareError::io("stat", self.pod_path(pod), e))?;
        let secs = u64::try_from(st.st_mtime).unwrap_or(0);
        // A time past the clock's range is no age at all: the directory counts as new.
        Ok(SystemTime::UNIX_EPOCH
            .checked_add(std::time::Duration::from_secs(secs))
            .unwrap_or_else(SystemTime::now))
    }

    /// Removes a pod's directory unless a container in it still waits, taking apart at most
    /// `budget` entries.
    pub fn remove_pod(&self, pod: &PodUid, budget: &mut Budget) -> Result<Removal, ShareError> {
        // The kubelet's pod directories are the kubelet's to remove.
        if self.place != Place::Share {
            return Ok(Removal::Waiting);
        }
        if !self.waiting_in(pod)?.is_empty() {
            return Ok(Removal::Waiting);
        }
        let path = self.pod_path(pod);
        match rfs::statat(&self.pods, pod.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
            Ok(_) => return Err(ShareError::NotAFile { path }),
            Err(rustix::io::Errno::NOENT) => return Ok(Removal::Removed),
            Err(e) => return Err(ShareError::io("stat", path, e)),
        }
        remove_tree_at(&self.pods, pod.as_str(), &path, budget)
    }
}

#[cfg(test)]
mod tests;
