//! The host share: `pods/<pod-uid>/<container>/exit` files written by sidecars' preStop hooks
//! (and the same layout below the kubelet's own directory of pods, for pod-local handshakes).
//!
//! Every container can write into its own directory, and the agent runs as root, so nothing
//! here trusts the tree below `pods/<uid>/<name>/`: directories are opened one component at a
//! time with `O_NOFOLLOW | O_DIRECTORY`, the exit file is checked to be a regular file with no
//! other hard link before it is opened for reading (a FIFO must not block the agent, a device
//! must not be opened at all), reads are capped, and writes go to an `O_EXCL` temp file
//! renamed into place inside the same directory.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
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

#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{kind} name {name:?} is not valid")]
    BadName { kind: &'static str, name: String },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error(
        "{path} is a link (symbolic, or a file with other hard links): links are never followed"
    )]
    Link { path: PathBuf },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
}

/// Why a share entry was refused: what the agent counts, by kind. A closed set, never built
/// from what a pod wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rejection {
    /// A symbolic link where a directory or the exit file should be, or an exit file with
    /// other hard links.
    Link,
    /// An exit file that is no regular file: a FIFO, a socket, a device, a directory.
    NotAFile,
    /// A pod or container entry that is no directory.
    NotADirectory,
    /// A name that is no pod UID or DNS-1123 container name.
    BadName,
    /// An exit file that says neither `wait` nor `allow`.
    UnexpectedContent,
}

impl Rejection {
    pub const ALL: [Rejection; 5] = [
        Rejection::Link,
        Rejection::NotAFile,
        Rejection::NotADirectory,
        Rejection::BadName,
        Rejection::UnexpectedContent,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Link => "link",
            Rejection::NotAFile => "not_a_file",
            Rejection::NotADirectory => "not_a_directory",
            Rejection::BadName => "bad_name",
            Rejection::UnexpectedContent => "unexpected_content",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ShareError {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
        source: impl Into<io::Error>,
    ) -> Self {
        ShareError::Io {
            op,
            path: path.into(),
            source: source.into(),
        }
    }

    /// True when the file or directory named is simply not there (a pod gone, a file removed).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ShareError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// What kind of refusal this is, when the entry itself is at fault (a link, a FIFO, a bad
    /// name); `None` for an I/O error that says nothing about the entry.
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            ShareError::BadName { .. } => Some(Rejection::BadName),
            ShareError::NotAFile { .. } => Some(Rejection::NotAFile),
            ShareError::Link { .. } => Some(Rejection::Link),
            ShareError::NotADirectory { .. } => Some(Rejection::NotADirectory),
            ShareError::Io { .. } => None,
        }
    }
}

/// A pod UID as the kubelet names pod directories: an RFC 4122 UUID for API pods, a 32-digit
/// hex hash for static pods.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(String);

impl PodUid {
    pub fn parse(s: &str) -> Result<Self, ShareError> {
        let ok = (8..=64).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
            && !s.starts_with('-');
        if ok {
            Ok(PodUid(s.to_owned()))
        } else {
            Err(ShareError::BadName {
                kind: "pod uid",
                name: s.to_owned(),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A container name: a DNS-1123 label, as Kubernetes requires.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerName(String);

impl ContainerName {
    pub fn parse(s: &str) -> Result<Self, ShareError> {
        let b = s.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b.first() != Some(&b'-')
            && b.last() != Some(&b'-');
        if ok {
            Ok(ContainerName(s.to_owned()))
        } else {
            Err(ShareError::BadName {
                kind: "container",
                name: s.to_owned(),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ContainerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a pod's exit directories are: the two layouts the agent serves at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    /// The host share: `<share>/pods/<uid>/<container>/`, each mounted by its container
    /// through a hostPath volume.
    Share,
    /// The pod's own `emptyDir` volume, where the kubelet keeps it:
    /// `<kubelet root>/pods/<uid>/volumes/kubernetes.io~empty-dir/exitorder/<container>/`.
    /// No hostPath in the pod; the directory and everything in it are the pod's.
    PodLocal,
}

impl Place {
    /// The directories from a pod's directory to the one holding its containers' exit
    /// directories.
    fn between(self) -> &'static [&'static str] {
        const POD_LOCAL: [&str; 3] = [
            podlocal::VOLUME_PATH[0],
            podlocal::VOLUME_PATH[1],
            podlocal::VOLUME,
        ];
        match self {
            Place::Share => &[],
            Place::PodLocal => &POD_LOCAL,
        }
    }

    /// How many levels below `pods/` a container's exit directory is.
    pub fn container_depth(self) -> usize {
        self.between().len().saturating_add(2)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Place::Share => "share",
            Place::PodLocal => "pod_local",
        }
    }
}

/// One container's exit directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExitKey {
    pub pod: PodUid,
    pub container: ContainerName,
    pub place: Place,
}

impl fmt::Display for ExitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.pod, self.container)
    }
}

/// What a change under `pods/` was about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareEntry {
    Pod(PodUid),
    Container(ExitKey),
    ExitFile(ExitKey),
}

/// The state of one container's exit file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitState {
    Absent,
    Waiting,
    Allowed,
    /// Content that is neither `wait` nor `allow` (at most the first 64 bytes, lossy).
    Unexpected(String),
}

impl ExitState {
    /// What the first bytes of an existing exit file say. Anything a pod writes is accepted
    /// here: bytes that are not UTF-8 come back lossy, inside `Unexpected`.
    pub fn parse(content: &[u8]) -> ExitState {
        let text = String::from_utf8_lossy(content.get(..MAX_EXIT_BYTES).unwrap_or(content));
        // ASCII whitespace only, as the entrypoint trims its reading of the same file, so that
        // both take the same contents for `allow` (Unicode's wider set, with a vertical tab
        // or U+0085, would not).
        match text.trim_ascii() {
            "" | WAIT => ExitState::Waiting,
            ALLOW => ExitState::Allowed,
            other => ExitState::Unexpected(other.to_owned()),
        }
    }
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
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

fn temp_name(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        ".{prefix}.{}.{}.{nanos}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn open_dir_at<Fd: AsFd, N: rustix::path::Arg + Copy>(
    dir: Fd,
    name: N,
    path: &Path,
) -> Result<OwnedFd, ShareError> {
    match rfs::openat(&dir, name, dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(fd),
        // O_DIRECTORY refuses anything else before opening it (a FIFO or a device named like
        // a directory is never opened), and a symbolic link with O_NOFOLLOW too: ENOTDIR for
        // both (ELOOP on some kernels for the link), told apart by what the name is.
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                    Err(ShareError::Link { path: path.into() })
                }
                _ => Err(ShareError::NotADirectory { path: path.into() }),
            }
        }
        Err(e) => Err(ShareError::io("open directory", path, e)),
    }
}

fn mkdir_at<Fd: AsFd>(dir: Fd, name: &str, path: &Path, mode: u32) -> Result<(), ShareError> {
    match rfs::mkdirat(dir, name, Mode::from_raw_mode(mode)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(ShareError::io("create directory", path, e)),
    }
}

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
        mut at: impl FnMut(&Path) -> Result<(), E>,
    ) -> Result<Result<bool, E>, ShareError> {
        let mut path = self.pod_path(pod);
        let mut dir = open_dir_at(&self.pods, pod.as_str(), &path)?;
        if let Err(e) = at(&path) {
            return Ok(Err(e));
        }
        for name in self.place.between() {
            path = path.join(name);
            dir = match open_dir_at(&dir, *name, &path) {
                Ok(d) => d,
                Err(e) if e.is_not_found() => return Ok(Ok(false)),
                Err(e) => return Err(e),
            };
            if let Err(e) = at(&path) {
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
        let pod = || -> Result<PodUid, ShareError> { PodUid::parse(utf8(uid, "pod uid")?) };
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
    pub fn prepare_container_dir(&self, key: &ExitKey) -> Result<(), ShareError> {
        let dir = self.open_container(key)?;
        let path = self.container_path(key);
        let st = rfs::fstat(&dir).map_err(|e| ShareError::io("stat", &path, e))?;
        if st.st_mode & 0o7777 != 0o777 {
            rfs::fchmod(&dir, Mode::from_raw_mode(0o777))
                .map_err(|e| ShareError::io("chmod", &path, e))?;
        }
        Ok(())
    }

    /// Reads a container's exit file.
    pub fn read_exit(&self, key: &ExitKey) -> Result<ExitState, ShareError> {
        let dir = match self.open_container(key) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(ExitState::Absent),
            Err(e) => return Err(e),
        };
        let path = self.container_path(key).join(EXIT_FILE);
        let Some(fd) = open_exit_file(&dir, &path)? else {
            return Ok(ExitState::Absent);
        };
        let mut buf = [0u8; MAX_EXIT_BYTES];
        let mut len = 0usize;
        while let Some(rest) = buf.get_mut(len..).filter(|r| !r.is_empty()) {
            match rustix::io::read(&fd, rest) {
                Ok(0) => break,
                Ok(n) => len = len.saturating_add(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(ShareError::io("read", path, e)),
            }
        }
        Ok(ExitState::parse(buf.get(..len).unwrap_or(&buf)))
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

    /// Lets a container exit: `allow` goes to a temp file that is renamed over `exit`, so the
    /// waiting entrypoint never reads a half-written answer.
    pub fn write_allow(&self, key: &ExitKey) -> Result<(), ShareError> {
        let dir = self.open_container(key)?;
        let path = self.container_path(key);
        write_replace(
            &dir,
            &path,
            EXIT_FILE,
            format!("{ALLOW}\n").as_bytes(),
            0o644,
            false,
        )
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

/// Writes `bytes` to a new temp file in `dir` and renames it to `name`.
pub(crate) fn write_replace(
    dir: &OwnedFd,
    dir_path: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
    durable: bool,
) -> Result<(), ShareError> {
    let tmp = temp_name(name);
    let tmp_path = dir_path.join(&tmp);
    let fd = rfs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(|e| ShareError::io("create", &tmp_path, e))?;
    let result = (|| {
        let mut done = 0usize;
        while let Some(rest) = bytes.get(done..).filter(|r| !r.is_empty()) {
            match rustix::io::write(&fd, rest) {
                Ok(n) => done = done.saturating_add(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(ShareError::io("write", &tmp_path, e)),
            }
        }
        // The umask may have narrowed the mode given to openat.
        rfs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(|e| ShareError::io("chmod", &tmp_path, e))?;
        if durable {
            rfs::fsync(&fd).map_err(|e| ShareError::io("fsync", &tmp_path, e))?;
        }
        rfs::renameat(dir, tmp.as_str(), dir, name)
            .map_err(|e| ShareError::io("rename", dir_path.join(name), e))
    })();
    if result.is_err() {
        let _ = rfs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    } else if durable {
        rfs::fsync(dir).map_err(|e| ShareError::io("fsync", dir_path, e))?;
    }
    result
}

/// Opens the exit file in `dir` for reading, and nothing else: the name is first opened as a
/// path only (`O_PATH` runs no driver's open, so a FIFO cannot block and a device cannot
/// act), checked to be a regular file with no other hard link, and only then reopened for
/// reading through `/proc/self/fd`, which reopens that very inode: a file swapped in between
/// the check and the read is never opened. `None` when there is no exit file.
fn open_exit_file(dir: &OwnedFd, path: &Path) -> Result<Option<OwnedFd>, ShareError> {
    let handle = match rfs::openat(
        dir,
        EXIT_FILE,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(ShareError::io("open", path, e)),
    };
    let checked = rfs::fstat(&handle).map_err(|e| ShareError::io("stat", path, e))?;
    check_exit_file(&checked, path)?;
    // O_NOCTTY: a terminal must never become the agent's; O_NONBLOCK: nothing may wait.
    let read = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let proc_path = format!("/proc/self/fd/{}", handle.as_raw_fd());
    match rfs::open(proc_path.as_str(), read, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        // Without /proc (a chroot), by name again; what was opened is checked once more.
        Err(rustix::io::Errno::NOENT) => {
            let fd = match rfs::openat(dir, EXIT_FILE, read | OFlags::NOFOLLOW, Mode::empty()) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(rustix::io::Errno::LOOP) => return Err(ShareError::Link { path: path.into() }),
                Err(e) => return Err(ShareError::io("open", path, e)),
            };
            let opened = rfs::fstat(&fd).map_err(|e| ShareError::io("stat", path, e))?;
            check_exit_file(&opened, path)?;
            Ok(Some(fd))
        }
        Err(e) => Err(ShareError::io("reopen", path, e)),
    }
}

/// An exit file the agent may read: a regular file that no other name shares. The entrypoint
/// creates it with `O_EXCL` and the agent replaces it by a rename, so it never has a second
/// hard link; one that does may be any file of the node's, and its content would be read
/// and logged.
fn check_exit_file(st: &rfs::Stat, path: &Path) -> Result<(), ShareError> {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile if st.st_nlink > 1 => Err(ShareError::Link { path: path.into() }),
        FileType::RegularFile => Ok(()),
        FileType::Symlink => Err(ShareError::Link { path: path.into() }),
        _ => Err(ShareError::NotAFile { path: path.into() }),
    }
}

/// Names of the real (not symlinked) subdirectories of `dir`.
fn subdirs(dir: &OwnedFd, path: &Path) -> Result<Vec<OsString>, ShareError> {
    let mut out = Vec::new();
    for name in entries(dir, path)? {
        let st = match rfs::statat(dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(ShareError::io("stat", path.join(&name), e)),
        };
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            out.push(name);
        }
    }
    Ok(out)
}

/// The first [`MAX_LISTED`] names in `dir`, read in the kernel's batches.
fn entries(dir: &OwnedFd, path: &Path) -> Result<Vec<OsString>, ShareError> {
    let mut out = Vec::new();
    for entry in listing(dir, path)? {
        let entry = entry.map_err(|e| ShareError::io("list", path, e))?;
        if out.len() >= MAX_LISTED {
            tracing::warn!(dir = %path.display(), limit = MAX_LISTED, "directory holds more entries than any pod makes; the rest is not read");
            break;
        }
        if let Some(name) = real_name(&entry) {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// A directory's entries as the kernel hands them out, a buffer at a time: nothing is read
/// ahead of what the caller takes.
fn listing(dir: &OwnedFd, path: &Path) -> Result<rfs::Dir, ShareError> {
    // Dir::read_from reopens "." from the fd, so the listing stays on the opened directory.
    rfs::Dir::read_from(dir).map_err(|e| ShareError::io("list", path, e))
}

/// An entry's name, `.` and `..` left out.
fn real_name(entry: &rfs::DirEntry) -> Option<&OsStr> {
    let name = entry.file_name().to_bytes();
    (name != b"." && name != b"..").then(|| OsStr::from_bytes(name))
}

/// Removes directory `name` under `parent` and everything in it, whatever it holds: names
/// that are not UTF-8, and trees of any depth. Below [`MAX_REMOVE_DEPTH`] levels a directory
/// is moved up to the top of the tree being removed (a rename within it) and taken apart
/// from there on a later pass, so at most that many directories are open at once however
/// deep a container nested its own. Links are removed, never followed.
fn remove_tree_at(
    parent: &OwnedFd,
    name: &str,
    path: &Path,
    budget: &mut Budget,
) -> Result<Removal, ShareError> {
    let top = open_dir_at(parent, name, path)?;
    loop {
        let mut deferred = false;
        if !clear_dir(&top, &top, path, 0, &mut deferred, budget)? {
            return Ok(Removal::Unfinished);
        }
        if !deferred {
            break;
        }
    }
    match rfs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(Removal::Removed),
        Err(e) => Err(ShareError::io("remove directory", path, e)),
    }
}

/// Removes what `dir` holds, streaming its listing; directories deeper than the limit are
/// moved to `top` and `deferred` is set. `false` when the budget ran out first.
fn clear_dir(
    dir: &OwnedFd,
    top: &OwnedFd,
    path: &Path,
    depth: usize,
    deferred: &mut bool,
    budget: &mut Budget,
) -> Result<bool, ShareError> {
    for entry in listing(dir, path)? {
        let entry = entry.map_err(|e| ShareError::io("list", path, e))?;
        let Some(child) = real_name(&entry) else {
            continue;
        };
        if !budget.spend() {
            return Ok(false);
        }
        let child_path = path.join(child);
        let st = match rfs::statat(dir, child, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(ShareError::io("stat", child_path, e)),
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            match rfs::unlinkat(dir, child, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(ShareError::io("remove", child_path, e)),
            }
            continue;
        }
        if depth.saturating_add(1) >= MAX_REMOVE_DEPTH {
            move_up(dir, child, top, &child_path)?;
            *deferred = true;
            continue;
        }
        let sub = open_dir_at(dir, child, &child_path)?;
        if !clear_dir(
            &sub,
            top,
            &child_path,
            depth.saturating_add(1),
            deferred,
            budget,
        )? {
            return Ok(false);
        }
        match rfs::unlinkat(dir, child, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            // Something was moved up into it meanwhile (only the top receives moves, so
            // this is the top's own child): a later pass takes it.
            Err(rustix::io::Errno::NOTEMPTY) => *deferred = true,
            Err(e) => return Err(ShareError::io("remove directory", child_path, e)),
        }
    }
    Ok(true)
}

/// Moves a too-deep directory to the top of the tree under a name nothing there has (an
/// earlier round's moves may still be there: never replace one).
fn move_up(dir: &OwnedFd, child: &OsStr, top: &OwnedFd, path: &Path) -> Result<(), ShareError> {
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for n in 0..64u32 {
        let up = format!(".exitorder-removing-{seed}-{n}");
        match rfs::renameat_with(dir, child, top, up.as_str(), rfs::RenameFlags::NOREPLACE) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(ShareError::io("move up", path, e)),
        }
    }
    Err(ShareError::io("move up", path, rustix::io::Errno::EXIST))
}

fn utf8<'a>(s: &'a OsStr, kind: &'static str) -> Result<&'a str, ShareError> {
    s.to_str().ok_or_else(|| ShareError::BadName {
        kind,
        name: s.to_string_lossy().into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    const UID: &str = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";

    fn key(uid: &str, name: &str) -> ExitKey {
        ExitKey {
            pod: PodUid::parse(uid).unwrap(),
            container: ContainerName::parse(name).unwrap(),
            place: Place::Share,
        }
    }

    fn setup() -> (tempfile::TempDir, Share) {
        let t = tempfile::tempdir().unwrap();
        let s = Share::open(t.path()).unwrap();
        (t, s)
    }

    #[test]
    fn names() {
        assert!(PodUid::parse(UID).is_ok());
        assert!(PodUid::parse("6c4b0a8a2b3d4e5f60718293a4b5c6d7").is_ok()); // static pod
        for bad in [
            "",
            "..",
            "abc",
            "UPPERCASE-0000",
            "0f5c/..",
            "-0f5c7a1e8d2b",
        ] {
            assert!(PodUid::parse(bad).is_err(), "{bad}");
        }
        assert!(ContainerName::parse("linkerd-proxy").is_ok());
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "..", &"a".repeat(64)] {
            assert!(ContainerName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn classify_paths() {
        let (_t, s) = setup();
        let p = s.pods_path();
        assert_eq!(
            s.classify(&p.join(UID).join("proxy").join("exit")).unwrap(),
            Some(ShareEntry::ExitFile(key(UID, "proxy")))
        );
        assert_eq!(
            s.classify(&p.join(UID).join("proxy")).unwrap(),
            Some(ShareEntry::Container(key(UID, "proxy")))
        );
        assert_eq!(
            s.classify(&p.join(UID)).unwrap(),
            Some(ShareEntry::Pod(PodUid::parse(UID).unwrap()))
        );
        assert_eq!(
            s.classify(&p.join(UID).join("proxy").join(".tmp")).unwrap(),
            None
        );
        assert_eq!(s.classify(Path::new("/elsewhere/exit")).unwrap(), None);
        assert!(s
            .classify(&p.join("not-a-uid!").join("proxy").join("exit"))
            .is_err());
        assert!(s
            .classify(&p.join(UID).join("Bad_Name").join("exit"))
            .is_err());
    }

    #[test]
    fn exit_file_round_trip() {
        let (_t, s) = setup();
        let k = key(UID, "proxy");
        let dir = s.container_path(&k);
        assert_eq!(s.read_exit(&k).unwrap(), ExitState::Absent);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(s.read_exit(&k).unwrap(), ExitState::Absent);
        std::fs::write(dir.join("exit"), "").unwrap();
        assert_eq!(s.read_exit(&k).unwrap(), ExitState::Waiting);
        std::fs::write(dir.join("exit"), "wait\n").unwrap();
        assert_eq!(s.read_exit(&k).unwrap(), ExitState::Waiting);
        assert_eq!(s.waiting_in(&k.pod).unwrap(), vec![k.clone()]);
        s.write_allow(&k).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("exit")).unwrap(),
            "allow\n"
        );
        assert_eq!(s.read_exit(&k).unwrap(), ExitState::Allowed);
        // Only `exit` is left: the temp file was renamed, not copied.
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1);
        std::fs::write(dir.join("exit"), "x".repeat(1000)).unwrap();
        match s.read_exit(&k).unwrap() {
            ExitState::Unexpected(text) => assert_eq!(text.len(), MAX_EXIT_BYTES),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exit_content_is_trimmed_as_the_entrypoint_trims_it() {
        assert_eq!(ExitState::parse(b" allow\r\n"), ExitState::Allowed);
        assert_eq!(ExitState::parse(b"\twait\x0c"), ExitState::Waiting);
        assert_eq!(ExitState::parse(b"\n\n"), ExitState::Waiting);
        for (content, shown) in [
            (&b"\x0ballow"[..], "\u{b}allow"),
            (b"allow\xc2\x85", "allow\u{85}"),
            (b"\xc2\xa0wait", "\u{a0}wait"),
        ] {
            assert_eq!(
                ExitState::parse(content),
                ExitState::Unexpected(shown.to_owned()),
                "{content:?}"
            );
        }
    }

    #[test]
    fn links_are_never_followed() {
        let (t, s) = setup();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("exit"), "wait").unwrap();
        // A symlinked exit file is refused, and the allow replaces the link, not its target.
        let k = key(UID, "proxy");
        let dir = s.container_path(&k);
        std::fs::create_dir_all(&dir).unwrap();
        symlink(outside.join("exit"), dir.join("exit")).unwrap();
        assert!(s.read_exit(&k).is_err());
        s.write_allow(&k).unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.join("exit")).unwrap(),
            "wait"
        );
        // A symlinked container or pod directory is refused.
        let k2 = key(UID, "other");
        symlink(&outside, s.container_path(&k2)).unwrap();
        assert!(s.read_exit(&k2).is_err());
        assert!(s.write_allow(&k2).is_err());
        assert!(s.prepare_container_dir(&k2).is_err());
        let uid2 = "11111111-2222-3333-4444-555555555555";
        symlink(&outside, s.pods_path().join(uid2)).unwrap();
        assert!(s.write_allow(&key(uid2, "proxy")).is_err());
        assert!(!s.pods().unwrap().iter().any(|p| p.as_str() == uid2));
        // Removing the pod removes links, never what they point to.
        assert_eq!(
            s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
            Removal::Removed
        );
        assert!(outside.join("exit").exists());
        assert!(!s.pod_path(&k.pod).exists());
    }

    #[test]
    fn fifo_exit_file_does_not_block() {
        let (_t, s) = setup();
        let k = key(UID, "proxy");
        let dir = s.container_path(&k);
        std::fs::create_dir_all(&dir).unwrap();
        rfs::mknodat(
            rfs::CWD,
            dir.join("exit").as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert!(matches!(s.read_exit(&k), Err(ShareError::NotAFile { .. })));
    }

    /// The kernel state of this process's thread named `name` (`S` while it sleeps).
    fn thread_state(name: &str) -> Option<char> {
        for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim_end() == name {
                let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
                return stat.rsplit_once(") ")?.1.chars().next();
            }
        }
        None
    }

    /// A thread opening `fifo` for writing, returned once it sleeps in that open: it stays
    /// there until something opens the FIFO for reading, even for an instant.
    fn blocked_fifo_writer(fifo: &Path, name: &str) -> std::thread::JoinHandle<()> {
        let f = fifo.to_owned();
        let writer = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let _ = std::fs::OpenOptions::new().write(true).open(&f);
            })
            .unwrap();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while thread_state(name) != Some('S') {
            assert!(std::time::Instant::now() < end, "the writer never blocked");
            std::thread::yield_now();
        }
        writer
    }

    #[test]
    fn a_fifo_exit_file_is_never_opened() {
        let (_t, s) = setup();
        let k = key(UID, "proxy");
        let dir = s.container_path(&k);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("exit");
        rfs::mknodat(
            rfs::CWD,
            fifo.as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let writer = blocked_fifo_writer(&fifo, "eo-fifo-probe");
        for _ in 0..3 {
            let e = s.read_exit(&k).unwrap_err();
            assert_eq!(e.rejection(), Some(Rejection::NotAFile), "{e}");
        }
        // Opening it to read, even without blocking, would have woken the writer at once.
        assert_eq!(thread_state("eo-fifo-probe"), Some('S'));
        assert!(!writer.is_finished());
        assert!(s.waiting_in(&k.pod).unwrap().is_empty());
        // Released by a reader of our own.
        let _reader = rfs::open(
            fifo.as_path(),
            OFlags::RDONLY | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .unwrap();
        writer.join().unwrap();
    }

    #[test]
    fn sockets_devices_and_hard_links_are_refused_unread() {
        let (t, s) = setup();
        let outside = t.path().join("outside-secret");
        std::fs::write(&outside, "wait\n").unwrap();
        let hard = key(UID, "hard");
        std::fs::create_dir_all(s.container_path(&hard)).unwrap();
        std::fs::hard_link(&outside, s.container_path(&hard).join("exit")).unwrap();
        let e = s.read_exit(&hard).unwrap_err();
        assert_eq!(e.rejection(), Some(Rejection::Link), "{e}");
        // Not a live wait: the pod's directory can go, the other name of the file stays.
        assert!(s.waiting_in(&hard.pod).unwrap().is_empty());

        let sock = key(UID, "sock");
        std::fs::create_dir_all(s.container_path(&sock)).unwrap();
        let _listener =
            std::os::unix::net::UnixListener::bind(s.container_path(&sock).join("exit")).unwrap();
        let e = s.read_exit(&sock).unwrap_err();
        assert_eq!(e.rejection(), Some(Rejection::NotAFile), "{e}");

        let dir_exit = key(UID, "direxit");
        std::fs::create_dir_all(s.container_path(&dir_exit).join("exit")).unwrap();
        let e = s.read_exit(&dir_exit).unwrap_err();
        assert_eq!(e.rejection(), Some(Rejection::NotAFile), "{e}");

        // /dev/zero's numbers: reading it would never end. Creating a device needs root.
        let dev = key(UID, "dev");
        std::fs::create_dir_all(s.container_path(&dev)).unwrap();
        match rfs::mknodat(
            rfs::CWD,
            s.container_path(&dev).join("exit").as_path(),
            FileType::CharacterDevice,
            Mode::from_raw_mode(0o666),
            rfs::makedev(1, 5),
        ) {
            Ok(()) => {
                let e = s.read_exit(&dev).unwrap_err();
                assert_eq!(e.rejection(), Some(Rejection::NotAFile), "{e}");
            }
            Err(rustix::io::Errno::PERM) => {}
            Err(e) => panic!("mknod: {e}"),
        }

        assert_eq!(
            s.remove_pod(&hard.pod, &mut Budget::new(u64::MAX)).unwrap(),
            Removal::Removed
        );
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "wait\n");
    }

    #[test]
    fn refusals_say_what_they_are() {
        let (t, s) = setup();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("proxy")).unwrap();
        std::fs::write(outside.join("proxy/exit"), "wait").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
        // A pod entry that is a link, or a file.
        let linked = PodUid::parse("11111111-2222-3333-4444-555555555555").unwrap();
        symlink(&outside, s.pod_path(&linked)).unwrap();
        let e = s.check_pod_dir(&linked).unwrap_err();
        assert_eq!(e.rejection(), Some(Rejection::Link), "{e}");
        let k = ExitKey {
            pod: linked.clone(),
            container: ContainerName::parse("proxy").unwrap(),
            place: Place::Share,
        };
        assert_eq!(
            s.read_exit(&k).unwrap_err().rejection(),
            Some(Rejection::Link)
        );
        assert_eq!(
            s.prepare_container_dir(&k).unwrap_err().rejection(),
            Some(Rejection::Link)
        );
        let file = PodUid::parse("22222222-2222-3333-4444-555555555555").unwrap();
        std::fs::write(s.pod_path(&file), "x").unwrap();
        let e = s.check_pod_dir(&file).unwrap_err();
        assert_eq!(e.rejection(), Some(Rejection::NotADirectory), "{e}");
        // A container entry that is a link to another pod's directory, or a FIFO.
        let victim = key(UID, "proxy");
        std::fs::create_dir_all(s.container_path(&victim)).unwrap();
        std::fs::write(s.container_path(&victim).join("exit"), "wait").unwrap();
        let thief = key("33333333-2222-3333-4444-555555555555", "proxy");
        std::fs::create_dir_all(s.pod_path(&thief.pod)).unwrap();
        symlink(s.container_path(&victim), s.container_path(&thief)).unwrap();
        assert_eq!(
            s.read_exit(&thief).unwrap_err().rejection(),
            Some(Rejection::Link)
        );
        assert_eq!(
            s.write_allow(&thief).unwrap_err().rejection(),
            Some(Rejection::Link)
        );
        let fifo = key(UID, "fifo");
        rfs::mknodat(
            rfs::CWD,
            s.container_path(&fifo).as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert_eq!(
            s.prepare_container_dir(&fifo).unwrap_err().rejection(),
            Some(Rejection::NotADirectory)
        );
        assert_eq!(
            s.read_exit(&fifo).unwrap_err().rejection(),
            Some(Rejection::NotADirectory)
        );
        // Nothing outside or in the other pod changed; an I/O error is no refusal.
        assert_eq!(
            std::fs::read_to_string(s.container_path(&victim).join("exit")).unwrap(),
            "wait"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("proxy/exit")).unwrap(),
            "wait"
        );
        let mode = std::fs::metadata(&outside).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        assert_eq!(
            ShareError::io("read", "/x", io::Error::other("eio")).rejection(),
            None
        );
        assert!(
            ShareError::BadName {
                kind: "pod uid",
                name: "x".into()
            }
            .rejection()
                == Some(Rejection::BadName)
        );
    }

    #[test]
    fn remove_pod_never_follows_links_out() {
        let (t, s) = setup();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("sub/file"), "keep").unwrap();
        std::fs::write(outside.join("exit"), "wait").unwrap();
        let k = key(UID, "proxy");
        let dir = s.container_path(&k);
        std::fs::create_dir_all(dir.join("nested")).unwrap();
        symlink(&outside, dir.join("escape")).unwrap();
        symlink(&outside, dir.join("nested/escape")).unwrap();
        // A linked exit file that says `wait` is no live wait: the directory still goes.
        symlink(outside.join("exit"), dir.join("exit")).unwrap();
        let fifo = key(UID, "fifo");
        std::fs::create_dir_all(s.container_path(&fifo)).unwrap();
        rfs::mknodat(
            rfs::CWD,
            s.container_path(&fifo).join("exit").as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert_eq!(
            s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
            Removal::Removed
        );
        assert!(!s.pod_path(&k.pod).exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("sub/file")).unwrap(),
            "keep"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("exit")).unwrap(),
            "wait"
        );
    }

    #[test]
    fn remove_pod_takes_any_name_and_any_depth() {
        use std::os::unix::ffi::OsStrExt;
        let (_t, s) = setup();
        let k = key(UID, "proxy");
        let dir = s.container_path(&k);
        // What a container may plant in its own directory.
        let mut deep = dir.clone();
        for i in 0..200 {
            deep = deep.join(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("leaf"), "x").unwrap();
        let odd = dir.join(std::ffi::OsStr::from_bytes(b"not-utf8-\xff\xfe"));
        std::fs::create_dir_all(odd.join(std::ffi::OsStr::from_bytes(b"\xc3"))).unwrap();
        std::fs::write(odd.join("f"), "x").unwrap();
        symlink("/etc", dir.join("link-to-etc")).unwrap();
        assert_eq!(
            s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
            Removal::Removed
        );
        assert!(!s.pod_path(&k.pod).exists());
        assert!(
            std::path::Path::new("/etc/passwd").exists(),
            "a link is removed, not followed"
        );
    }

    #[test]
    fn remove_pod_keeps_live_waits() {
        let (_t, s) = setup();
        let k = key(UID, "proxy");
        let dir = s.container_path(&k);
        std::fs::create_dir_all(dir.join("nested/deeper")).unwrap();
        std::fs::write(dir.join("exit"), "wait").unwrap();
        assert_ne!(
            s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
            Removal::Removed
        );
        assert!(dir.exists());
        s.write_allow(&k).unwrap();
        assert_eq!(
            s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
            Removal::Removed
        );
        assert!(!s.pod_path(&k.pod).exists());
        // Already gone: nothing to do, and nothing to refuse.
        assert_eq!(
            s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
            Removal::Removed
        );
    }

    /// A kubelet root with one pod's `exitorder` emptyDir holding `proxy/`.
    fn kubelet() -> (tempfile::TempDir, Share, ExitKey) {
        let t = tempfile::tempdir().unwrap();
        let dir = t
            .path()
            .join("pods")
            .join(UID)
            .join("volumes/kubernetes.io~empty-dir/exitorder/proxy");
        std::fs::create_dir_all(&dir).unwrap();
        let s = Share::open_kubelet(t.path()).unwrap();
        let k = ExitKey {
            pod: PodUid::parse(UID).unwrap(),
            container: ContainerName::parse("proxy").unwrap(),
            place: Place::PodLocal,
        };
        (t, s, k)
    }

    #[test]
    fn pod_local_exit_directories_are_where_the_kubelet_keeps_emptydirs() {
        let (t, s, k) = kubelet();
        let pod = t.path().join("pods").join(UID);
        let volume = pod.join("volumes/kubernetes.io~empty-dir/exitorder");
        assert_eq!(s.container_path(&k), volume.join("proxy"));
        let pod_entry = Some(ShareEntry::Pod(k.pod.clone()));
        for on_the_way in [
            pod.clone(),
            pod.join("volumes"),
            pod.join("volumes/kubernetes.io~empty-dir"),
            volume.clone(),
        ] {
            assert_eq!(
                s.classify(&on_the_way).unwrap(),
                pod_entry,
                "{}",
                on_the_way.display()
            );
        }
        assert_eq!(
            s.classify(&volume.join("proxy")).unwrap(),
            Some(ShareEntry::Container(k.clone()))
        );
        assert_eq!(
            s.classify(&volume.join("proxy/exit")).unwrap(),
            Some(ShareEntry::ExitFile(k.clone()))
        );
        // The kubelet's other files and the pod's other volumes are none of the agent's.
        for other in [
            pod.join("etc-hosts"),
            pod.join("volumes/kubernetes.io~secret"),
            pod.join("volumes/kubernetes.io~empty-dir/cache"),
            pod.join("volumes/kubernetes.io~empty-dir/cache/proxy/exit"),
            volume.join("proxy/junk"),
        ] {
            assert_eq!(s.classify(&other).unwrap(), None, "{}", other.display());
        }
        assert!(s.classify(&volume.join("Bad_Name")).is_err());
        let mut walked = Vec::new();
        let complete = s
            .walk_pod(&k.pod, |p| {
                walked.push(p.to_owned());
                Ok::<(), ()>(())
            })
            .unwrap()
            .unwrap();
        assert!(complete);
        assert_eq!(walked.last(), Some(&volume));
        assert_eq!(walked.len(), Place::PodLocal.container_depth() - 1);
        assert_eq!(s.containers_in(&k.pod).unwrap(), std::slice::from_ref(&k));
        std::fs::write(volume.join("proxy/exit"), "wait").unwrap();
        assert_eq!(s.read_exit(&k).unwrap(), ExitState::Waiting);
        assert_eq!(s.waiting_in(&k.pod).unwrap(), std::slice::from_ref(&k));
        s.write_allow(&k).unwrap();
        assert_eq!(s.read_exit(&k).unwrap(), ExitState::Allowed);
        // The kubelet removes its pods' directories, never the agent.
        assert_eq!(
            s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
            Removal::Waiting
        );
        assert!(volume.is_dir());
    }

    #[test]
    fn a_pod_local_walk_stops_where_the_kubelet_has_not_made_the_rest() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("pods").join(UID).join("volumes")).unwrap();
        let s = Share::open_kubelet(t.path()).unwrap();
        let pod = PodUid::parse(UID).unwrap();
        let mut walked = 0;
        let complete = s
            .walk_pod(&pod, |_| {
                walked += 1;
                Ok::<(), ()>(())
            })
            .unwrap()
            .unwrap();
        assert!(!complete);
        assert_eq!(walked, 2);
        assert_eq!(s.containers_in(&pod).unwrap(), []);
    }

    #[test]
    fn links_on_the_way_to_pod_local_directories_are_refused() {
        for level in ["volumes", "volumes/kubernetes.io~empty-dir/exitorder"] {
            let (t, s, k) = kubelet();
            let outside = t.path().join("outside");
            std::fs::create_dir_all(outside.join("kubernetes.io~empty-dir/exitorder/proxy"))
                .unwrap();
            std::fs::create_dir_all(outside.join("proxy")).unwrap();
            std::fs::write(outside.join("proxy/exit"), "wait").unwrap();
            let at = t.path().join("pods").join(UID).join(level);
            std::fs::remove_dir_all(&at).unwrap();
            symlink(&outside, &at).unwrap();
            let e = s.read_exit(&k).unwrap_err();
            assert_eq!(e.rejection(), Some(Rejection::Link), "{level}: {e}");
            assert!(s.write_allow(&k).is_err(), "{level}");
            assert!(s
                .walk_pod(&k.pod, |_| Ok::<(), ()>(()))
                .is_err_and(|e| e.rejection() == Some(Rejection::Link)));
            assert_eq!(
                std::fs::read_to_string(outside.join("proxy/exit")).unwrap(),
                "wait"
            );
        }
    }

    #[test]
    fn the_kubelets_root_is_opened_never_made() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("kubelet");
        assert!(Share::open_kubelet(&root).is_err());
        assert!(!root.exists());
    }

    #[test]
    fn removal_streams_a_flooded_directory_within_its_budget() {
        let (_t, s) = setup();
        let k = key(UID, "proxy");
        let dir = s.container_path(&k);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..3_000 {
            std::fs::write(dir.join(format!("junk-{i}")), "").unwrap();
        }
        // Deeper than the removal descends, so moved-up directories outlive a round.
        let mut deep = dir.clone();
        for i in 0..(MAX_REMOVE_DEPTH * 3) {
            deep = deep.join(format!("d{i}"));
            std::fs::create_dir(&deep).unwrap();
            std::fs::write(deep.join("f"), "").unwrap();
        }
        let count = |p: &Path| walk(p);
        let mut rounds = 0;
        loop {
            let before = count(&s.pod_path(&k.pod));
            let mut budget = Budget::new(500);
            let r = s.remove_pod(&k.pod, &mut budget).unwrap();
            rounds += 1;
            if r == Removal::Removed {
                break;
            }
            assert_eq!(r, Removal::Unfinished);
            assert_eq!(budget.left(), 0);
            let after = count(&s.pod_path(&k.pod));
            assert!(after < before, "round {rounds}: {before} -> {after}");
            assert!(rounds < 50, "no end in sight");
        }
        assert!(!s.pod_path(&k.pod).exists());
        assert!(
            rounds >= 6,
            "3,000+ entries at 500 a round took {rounds} rounds"
        );
    }

    /// Entries below `p`, every level.
    fn walk(p: &Path) -> usize {
        std::fs::read_dir(p)
            .map(|d| {
                d.map(|e| {
                    let e = e.unwrap();
                    1 + if e.file_type().unwrap().is_dir() {
                        walk(&e.path())
                    } else {
                        0
                    }
                })
                .sum()
            })
            .unwrap_or(0)
    }

    #[test]
    fn prepare_opens_container_dir_to_its_user() {
        let (_t, s) = setup();
        let k = key(UID, "proxy");
        let dir = s.container_path(&k);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        s.prepare_container_dir(&k).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o777);
        assert_eq!(s.containers().unwrap(), vec![k]);
    }

    #[test]
    fn a_share_replaced_under_it_is_no_longer_current() {
        let (t, s) = setup();
        assert!(s.is_current());
        // Moved away and made again: same names, other directories.
        std::fs::rename(t.path().join("pods"), t.path().join("pods.old")).unwrap();
        assert!(!s.is_current());
        std::fs::create_dir(t.path().join("pods")).unwrap();
        assert!(!s.is_current());
        let again = Share::open(t.path()).unwrap();
        assert!(again.is_current());
        // A link where `pods/` was is not the directory opened either.
        std::fs::remove_dir(t.path().join("pods")).unwrap();
        std::os::unix::fs::symlink(t.path().join("pods.old"), t.path().join("pods")).unwrap();
        assert!(!again.is_current());
    }
}
