//! Exits as the kernel sees them: a pidfd on each running container's first process, which
//! becomes readable the moment that process is gone, before any runtime has done its own
//! bookkeeping (containerd 2.x's CRI event stream arrives 30-370 ms later).
//!
//! The process is found once per container, from the runtime's verbose status (its `pid`),
//! off the decision path; a pid is only trusted after the process it names is seen to be in
//! the container's own cgroup (its path carries the container's id), which rules out a pid
//! reused since the status was read, and a pid of another pid namespace (an agent pod without
//! `hostPID` sees other processes under those numbers, or none). The runtime stays the source
//! of truth for exit codes, attempts and restarts, and the fallback for every container the
//! kernel cannot be asked about: nothing here can lose an exit, only tell it sooner.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use rustix::buffer::spare_capacity;
use rustix::event::epoll;
use rustix::process::{pidfd_open, Pid, PidfdFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tracing::{debug, info, warn};

use crate::runtime::podcgroup::CgroupMounts;
use crate::runtime::strain;
use crate::stats::Stats;

/// How much of `/proc/<pid>/cgroup` is read: a few lines of paths.
const CGROUP_MAX: usize = 16 * 1024;
/// Containers watched at most: many times what a node runs.
const MAX_WATCHED: usize = 16_384;
/// Refusals with no process accepted before the log says the pids are not this agent's.
const REFUSED_BEFORE_WARNING: u32 = 20;
/// The token of the waker that ends the waiting thread.
const WAKE: u64 = 0;

/// Whether this process can ask the kernel, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Available,
    Unavailable(String),
}

/// What the waiting thread shares with the decision loop.
struct Shared {
    epoll: OwnedFd,
    /// An eventfd: written once, it ends the thread.
    wake: OwnedFd,
    /// Which container each token stands for, while it is watched.
    ids: Mutex<HashMap<u64, String>>,
}

/// The epoll set as the decision loop's reactor sees it.
struct SetFd(Arc<Shared>);

impl AsRawFd for SetFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.epoll.as_raw_fd()
    }
}

/// Registers the set with the current tokio reactor (its epoll), readable only.
#[allow(unsafe_code)]
fn on_reactor(set: SetFd) -> std::io::Result<AsyncFd<SetFd>> {
    // SAFETY: the descriptor `SetFd` gives is its `Shared`'s `OwnedFd`, which the `Arc` it
    // holds keeps open, and the same, for as long as the `AsyncFd` owns it; nothing closes
    // or replaces it meanwhile (`Shared` is never mutated).
    unsafe { AsyncFd::register_with_interest(set, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// The pidfds of the running containers, in one epoll set: no task per container, nothing
/// polled. The agent's decision loop awaits the set itself ([`KernelExits::awaited`],
/// [`KernelExits::exits`]), so an exit wakes the loop directly; the test bed's clock has a
/// thread wait on it instead ([`KernelExits::with`]).
pub struct KernelExits {
    available: Availability,
    shared: Option<Arc<Shared>>,
    /// The set, registered with the loop's reactor (the awaited form).
    awaited: Option<AsyncFd<SetFd>>,
    /// Each watched container's pidfd and token.
    watches: HashMap<String, (OwnedFd, u64)>,
    next_token: u64,
    /// Processes refused for not being their container's, while none was accepted.
    refused: u32,
    /// Where pods' cgroups can be looked at (see [`crate::runtime::podcgroup`]).
    mounts: CgroupMounts,
    /// Each watched container's pod cgroup, where it can be looked at.
    pod_dirs: HashMap<String, PathBuf>,
    /// Each watched container's own cgroups, where their counters can be read.
    strain_dirs: HashMap<String, strain::Dirs>,
    stats: Arc<Stats>,
}

impl KernelExits {
    /// Exits are awaited by the caller's task ([`Self::exits`]), on its runtime's reactor: the
    /// kernel's word wakes that task itself, with no thread to hand it over.
    pub fn awaited(stats: Arc<Stats>) -> Self {
        let started = probe().and_then(|()| set()).and_then(|shared| {
            tokio::runtime::Handle::try_current()
                .map_err(|e| format!("no tokio runtime to await exits on: {e}"))?;
            let fd = on_reactor(SetFd(shared.clone()))
                .map_err(|e| format!("epoll on the reactor: {e}"))?;
            Ok((shared, Some(fd)))
        });
        Self::started(started, stats)
    }

    /// Exits found are handed to `on_exit`, on a waiting thread (`kernel_exit`), the moment
    /// the kernel tells them, with when it woke (the test bed stamps them there); it returns
    /// false once nobody listens.
    pub fn with(
        on_exit: impl Fn(String, Instant) -> bool + Send + 'static,
        stats: Arc<Stats>,
    ) -> Self {
        let started = probe()
            .and_then(|()| start(Box::new(on_exit), stats.clone()))
            .map(|shared| (shared, None));
        Self::started(started, stats)
    }

    fn started(
        started: Result<(Arc<Shared>, Option<AsyncFd<SetFd>>), String>,
        stats: Arc<Stats>,
    ) -> Self {
        let (available, shared, awaited) = match started {
            Ok((shared, awaited)) => {
                info!(
                    event = "kernel_source",
                    source = "pidfd",
                    "kernel exit source available: container exits are seen as their first process ends"
                );
                (Availability::Available, Some(shared), awaited)
            }
            Err(why) => {
                info!(event = "kernel_source", source = "none", reason = %why, "kernel exit source unavailable: exits come from the runtime alone");
                (Availability::Unavailable(why), None, None)
            }
        };
        stats.set_kernel_source(shared.is_some());
        let mounts = if shared.is_some() {
            CgroupMounts::read()
        } else {
            CgroupMounts::default()
        };
        KernelExits {
            available,
            shared,
            awaited,
            watches: HashMap::new(),
            next_token: WAKE.saturating_add(1),
            refused: 0,
            mounts,
            pod_dirs: HashMap::new(),
            strain_dirs: HashMap::new(),
            stats,
        }
    }

    /// The next exits the kernel tells, each with when the caller was woken for it (the
    /// awaited form; never, in the other forms or when the kernel cannot be asked).
    /// Cancel-safe: nothing is taken from the set before the last await.
    pub async fn exits(&self) -> Vec<(String, Instant)> {
        let (Some(fd), Some(shared)) = (&self.awaited, &self.shared) else {
            return std::future::pending().await;
        };
        loop {
            let Ok(mut ready) = fd.readable().await else {
                // The reactor is gone: the runtime is shutting down.
                return std::future::pending().await;
            };
            let woke = Instant::now();
            let tokens = match ready_now(&shared.epoll) {
                Ok(t) => t,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    warn!(error = %e, "the kernel exit source stopped; exits come from the runtime alone");
                    self.stats.set_kernel_source(false);
                    return std::future::pending().await;
                }
            };
            if tokens.is_empty() {
                // Nothing left: the reactor says when there is again.
                ready.clear_ready();
                continue;
            }
            let mut ids = lock(&shared.ids);
            let told: Vec<(String, Instant)> = tokens
                .iter()
                .filter_map(|token| ids.remove(token))
                .map(|id| (id, woke))
                .collect();
            for _ in &told {
                self.stats.kernel_exit();
            }
            if !told.is_empty() {
                return told;
            }
        }
    }

    /// Not asked for (`--kernel-exit-source false`).
    pub fn off(stats: Arc<Stats>) -> Self {
        let why = "turned off (--kernel-exit-source false)".to_owned();
        info!(event = "kernel_source", source = "none", reason = %why, "kernel exit source unavailable: exits come from the runtime alone");
        stats.set_kernel_source(false);
        KernelExits {
            available: Availability::Unavailable(why),
            shared: None,
            awaited: None,
            watches: HashMap::new(),
            next_token: WAKE.saturating_add(1),
            refused: 0,
            mounts: CgroupMounts::default(),
            pod_dirs: HashMap::new(),
            strain_dirs: HashMap::new(),
            stats,
        }
    }

    pub fn available(&self) -> &Availability {
        &self.available
    }

    /// Watches container `id`, running as `pid` (the runtime's word): its exit is sent as
    /// [`Change::ProcessGone`]. Does nothing when the kernel cannot be asked, or the process is
    /// not (or no longer) the container's. Where this process can look at the container's pod
    /// cgroup, [`KernelExits::pod_dir`] says so from then on.
    pub fn watch(&mut self, id: &str, pid: i32) {
        if self.shared.is_none() || self.watches.contains_key(id) {
            return;
        }
        match open(id, pid) {
            Ok((fd, cgroup)) => {
                self.refused = u32::MAX;
                self.register(id, fd);
                if self.watches.contains_key(id) {
                    if let Some(dir) = self.mounts.pod_dir(&cgroup, id) {
                        self.pod_dirs.insert(id.to_owned(), dir);
                    }
                    let dirs = strain::Dirs::of(&self.mounts, &cgroup, id);
                    if !dirs.is_empty() {
                        self.strain_dirs.insert(id.to_owned(), dirs);
                    }
                }
            }
            Err(why) => {
                debug!(container = %id, pid, reason = %why, "not watched by the kernel source");
                // Refused again and again, and never a process of its own container: the
                // runtime's pids are of another pid namespace than this process's (a
                // container that exits between its status and the check is refused too,
                // but rarely many before one is accepted).
                self.refused = self.refused.saturating_add(1);
                if self.refused == REFUSED_BEFORE_WARNING {
                    warn!(
                        event = "kernel_source",
                        source = "none",
                        "the processes the runtime names are not this agent's to see (is it in the host's pid namespace? the chart's agent.kernelExitSource gives hostPID); exits come from the runtime alone"
                    );
                }
            }
        }
    }

    /// Awaits `fd`, a pidfd of container `id`'s first process.
    fn register(&mut self, id: &str, fd: OwnedFd) {
        let Some(shared) = &self.shared else { return };
        if self.watches.len() >= MAX_WATCHED {
            return;
        }
        let token = self.next_token;
        self.next_token = self.next_token.saturating_add(1);
        lock(&shared.ids).insert(token, id.to_owned());
        // One-shot: an exited process's pidfd stays readable; it is told once.
        if let Err(e) = epoll::add(
            &shared.epoll,
            &fd,
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN | epoll::EventFlags::ONESHOT,
        ) {
            lock(&shared.ids).remove(&token);
            debug!(container = %id, error = %e, "pidfd cannot be awaited");
            return;
        }
        self.watches.insert(id.to_owned(), (fd, token));
        self.stats.set_kernel_watches(self.watches.len());
    }

    /// Whether container `id`'s process is worth reading: the kernel can be asked, and it is
    /// not watched yet.
    pub fn wants(&self, id: &str) -> bool {
        self.shared.is_some() && !self.watches.contains_key(id)
    }

    /// Whether container `id`'s exit will come from the kernel.
    pub fn watches(&self, id: &str) -> bool {
        self.watches.contains_key(id)
    }

    /// The pod cgroup of watched container `id`, where it can be looked at.
    pub fn pod_dir(&self, id: &str) -> Option<&std::path::Path> {
        self.pod_dirs.get(id).map(PathBuf::as_path)
    }

    /// Watched container `id`'s counters of being held back by its limits, read now, where
    /// its cgroups can be looked at.
    pub fn strain(&self, id: &str) -> Option<strain::Strain> {
        self.strain_dirs.get(id).map(strain::Dirs::read)
    }

    /// Stops watching a container (removed, or its exit told).
    pub fn forget(&mut self, id: &str) {
        self.pod_dirs.remove(id);
        self.strain_dirs.remove(id);
        let Some((fd, token)) = self.watches.remove(id) else {
            return;
        };
        if let Some(shared) = &self.shared {
            lock(&shared.ids).remove(&token);
            // Closing the pidfd takes it out of the set as well; said here for clarity.
            let _ = epoll::delete(&shared.epoll, &fd);
        }
        self.stats.set_kernel_watches(self.watches.len());
    }

    pub fn watched(&self) -> usize {
        self.watches.len()
    }
}

impl Drop for KernelExits {
    fn drop(&mut self) {
        // The waiting thread, where there is one, is told to end.
        if let (Some(shared), None) = (&self.shared, &self.awaited) {
            let _ = rustix::io::write(&shared.wake, &1u64.to_ne_bytes());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the waiting thread does with an exit.
type OnExit = Box<dyn Fn(String, Instant) -> bool + Send>;

/// The epoll set, its waker in it.
fn set() -> Result<Arc<Shared>, String> {
    let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| format!("epoll: {e}"))?;
    let wake = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
        .map_err(|e| format!("eventfd: {e}"))?;
    epoll::add(
        &epoll,
        &wake,
        epoll::EventData::new_u64(WAKE),
        epoll::EventFlags::IN,
    )
    .map_err(|e| format!("epoll: {e}"))?;
    Ok(Arc::new(Shared {
        epoll,
        wake,
        ids: Mutex::new(HashMap::new()),
    }))
}

/// The set, and the thread that waits on it.
fn start(on_exit: OnExit, stats: Arc<Stats>) -> Result<Arc<Shared>, String> {
    let shared = set()?;
    let theirs = shared.clone();
    std::thread::Builder::new()
        .name("kernel_exit".to_owned())
        .spawn(move || {
            let _span = tracing::info_span!("kernel_exit").entered();
            wait_for_exits(&theirs, &on_exit, &stats);
        })
        .map_err(|e| format!("thread: {e}"))?;
    Ok(shared)
}

/// Until woken to end (or the loop is gone): each exit, as its container's change.
fn wait_for_exits(shared: &Shared, on_exit: &OnExit, stats: &Stats) {
    let mut events = Vec::with_capacity(64);
    loop {
        events.clear();
        match epoll::wait(&shared.epoll, spare_capacity(&mut events), None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                warn!(error = %e, "the kernel exit source stopped; exits come from the runtime alone");
                stats.set_kernel_source(false);
                return;
            }
        }
        // Stamped as the thread wakes: the decision loop may be busy, and what a decision
        // concludes from this time (see `facts::unsettled_exits`) must not be delayed by it.
        let woke = Instant::now();
        for ev in &events {
            let data = ev.data;
            let token = data.u64();
            if token == WAKE {
                return;
            }
            let Some(id) = lock(&shared.ids).remove(&token) else {
                continue;
            };
            stats.kernel_exit();
            if !on_exit(id, woke) {
                return;
            }
        }
    }
}

/// The tokens of the set's ready pidfds, without waiting (each is one-shot: told once).
fn ready_now(epoll: &OwnedFd) -> Result<Vec<u64>, rustix::io::Errno> {
    let mut events = Vec::with_capacity(64);
    let now = rustix::event::Timespec::default();
    epoll::wait(epoll, spare_capacity(&mut events), Some(&now))?;
    Ok(events.iter().map(|ev| ev.data.u64()).collect())
}

/// Whether pidfds can be opened here (Linux 5.3+, not refused by a seccomp profile).
fn probe() -> Result<(), String> {
    pidfd_open(rustix::process::getpid(), PidfdFlags::empty())
        .map(drop)
        .map_err(|e| format!("pidfd_open: {e}"))
}

/// A pidfd on `pid`, once the process is seen in container `id`'s cgroup. Opened first and
/// checked after: the pidfd pins the process, so what is checked is what is watched.
fn open(id: &str, pid: i32) -> Result<(OwnedFd, String), String> {
    let p = Pid::from_raw(pid).ok_or_else(|| format!("not a process id: {pid}"))?;
    let fd = pidfd_open(p, PidfdFlags::empty()).map_err(|e| format!("pidfd_open: {e}"))?;
    let cgroup = read_cgroup(pid).map_err(|e| format!("/proc/{pid}/cgroup: {e}"))?;
    // The same process still: its pidfd is not yet readable (it has not exited, so its pid
    // cannot have been given to another since the cgroup was read).
    if !in_container(&cgroup, id) {
        return Err("the process is not in the container's cgroup".to_owned());
    }
    if is_readable(&fd) {
        return Err("the process has already exited".to_owned());
    }
    Ok((fd, cgroup))
}

fn read_cgroup(pid: i32) -> std::io::Result<String> {
    crate::runtime::podcgroup::read_head(
        std::path::Path::new(&format!("/proc/{pid}/cgroup")),
        u64::try_from(CGROUP_MAX).unwrap_or(u64::MAX),
    )
}

/// Whether a `/proc/<pid>/cgroup` text places the process in container `id`: runc names the
/// container's cgroup after its id (`.../<id>`, or `cri-containerd-<id>.scope` with systemd).
pub fn in_container(cgroup: &str, id: &str) -> bool {
    // An id is 64 hex digits; anything shorter could match by chance.
    if id.len() < 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    cgroup.lines().any(|l| {
        l.rsplit(':').next().is_some_and(|path| {
            path.split('/')
                .any(|part| part == id || part.trim_end_matches(".scope").ends_with(id))
        })
    })
}

fn is_readable(fd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    matches!(rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c2b3a4f1c2b3a4f1c2b3a4f1c2b3a4f1c2b3a4f1c2b3a4f1c2b3a4f1c2b3a";

    #[test]
    fn the_cgroup_must_carry_the_containers_id() {
        let v1 = format!("12:pids:/exitorder-test/pod1/{ID}\n1:name=systemd:/x\n");
        assert!(in_container(&v1, ID));
        let systemd = format!("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope\n");
        assert!(in_container(&systemd, ID));
        assert!(!in_container("0::/user.slice/session-1.scope\n", ID));
        // A prefix of the id, or an id that is no id, never matches.
        assert!(!in_container(&v1, &ID[..16]));
        assert!(!in_container("0::/a/b\n", "b"));
        assert!(!in_container(&format!("0::/{ID}x\n"), ID));
    }

    #[tokio::test]
    async fn an_exit_is_told_as_soon_as_the_process_ends() {
        let stats = Arc::new(Stats::default());
        let mut k = KernelExits::awaited(stats.clone());
        if k.available() != &Availability::Available {
            return;
        }
        assert!(stats.kernel_source());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        // Not in a cgroup named after the id: refused, nothing watched.
        k.watch(ID, pid);
        assert_eq!(k.watched(), 0);
        // As if it were (the cgroup check passed): its end is told once, as an exit.
        let fd = pidfd_open(Pid::from_raw(pid).unwrap(), PidfdFlags::empty()).unwrap();
        assert!(!is_readable(&fd));
        k.register(ID, fd);
        assert_eq!(k.watched(), 1);
        let early = tokio::time::timeout(std::time::Duration::from_millis(50), k.exits()).await;
        assert!(early.is_err(), "{early:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        let told = tokio::time::timeout(std::time::Duration::from_secs(10), k.exits())
            .await
            .unwrap();
        assert_eq!(
            told.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
            [ID]
        );
        // Told once: the set has nothing more to say.
        let again = tokio::time::timeout(std::time::Duration::from_millis(50), k.exits()).await;
        assert!(again.is_err(), "{again:?}");
        assert_eq!(stats.kernel_exits(), 1);
        k.forget(ID);
        assert_eq!(k.watched(), 0);
        assert_eq!(stats.kernel_watches(), 0);
    }
}
