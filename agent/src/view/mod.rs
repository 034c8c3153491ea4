//! The agent's picture of the node: its pods and their containers, built from one listing and
//! kept current by the runtime's events, so that a decision reads memory and no runtime call
//! stands between an exit event and `allow`.
//!
//! A plain data structure: changes go in ([`NodeView::apply`]), reads that must be made come
//! out ([`Need`]); nothing here does I/O. Its rules make the order of what arrives irrelevant:
//! - a container's state only moves forward (created, running, exited): an exit event that
//!   arrives before the listing that still shows the container running wins (containerd
//!   publishes the event before its CRI view changes), and a late start never revives it;
//! - a removed container leaves a tombstone, so a late start or exit does not bring it back;
//! - a listing replaces what it covers, but keeps what appeared after it was taken.
//!
//! Parts:
//! - `entry`: what the view holds of a pod and of a container;
//! - [`facts`]: what a decision knows about a pod, assembled from the view.

mod entry;
pub mod facts;

use entry::SandboxRead;
pub use entry::{
    ContainerEntry, ContainerInfo, EnvPriority, Execs, Listing, PodEntry, SandboxInfo, Strain,
};

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::decide::bounds::Later as _;
use crate::decide::priority::PriorityError;
use crate::decide::RunState;
use crate::pod::PodUid;

/// What the runtime said happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A full listing.
    Listed(Listing),
    /// One pod's containers and sandbox, listed for a pod the view did not know.
    PodListed { uid: PodUid, listing: Listing },
    /// A task started: a container is running (or a sandbox: the read will tell).
    Started { id: String },
    /// A container's own process exited.
    Exited { id: String },
    /// The kernel says a container's first process is gone (`at`: as its waiting thread
    /// woke): an exit, and one whose time the agent knows to the millisecond.
    ProcessGone { id: String, at: Instant },
    /// A container was removed from the runtime.
    Removed { id: String },
    /// The runtime added an exec process to a container (containerd's events): one of the
    /// kubelet's exec hooks or probes.
    ExecAdded { id: String, exec: String },
    /// An exec process of a container exited; `failed`: with a status other than 0.
    ExecExited {
        id: String,
        exec: String,
        failed: bool,
    },
    /// The runtime described a container, with the env priority it carries.
    Described {
        info: ContainerInfo,
        env: Result<Option<u8>, PriorityError>,
    },
    /// The runtime has no CRI container by this id (a sandbox's pause container, or gone).
    NotAContainer { id: String },
    /// Describing a container failed (`now`: when the answer came).
    DescribeFailed { id: String, now: Instant },
    /// Listing one pod for its sandbox failed.
    SandboxFailed { uid: PodUid, now: Instant },
}

/// A read the view needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Need {
    /// Describe a container: its pod, name, attempt and env.
    Describe(String),
    /// List one pod: its sandbox (the pod's annotations) and containers.
    Sandbox(PodUid),
}

/// How long a removed container's id is remembered, so late events cannot revive it.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(300);
/// At most this many tombstones, the oldest forgotten first: a node where pods come and go
/// by the thousand must not keep one per container for the whole TTL. A late event for a
/// container forgotten this way revives it only until the next listing, which has it no more.
const MAX_TOMBSTONES: usize = 4_096;
/// Back-off of failed reads: from this, doubling, up to [`RETRY_MAX`].
const RETRY_START: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

fn rank(s: RunState) -> u8 {
    match s {
        RunState::Created => 0,
        RunState::Running | RunState::Unknown => 1,
        RunState::Exited => 2,
    }
}

/// The later of two states of the same container.
fn forward(old: RunState, new: RunState) -> RunState {
    if rank(new) >= rank(old) {
        new
    } else {
        old
    }
}

/// A container known only from events so far.
#[derive(Debug, Clone, Copy)]
struct Undescribed {
    state: RunState,
    /// When its first event arrived.
    seen: Instant,
}

#[derive(Debug, Default)]
pub struct NodeView {
    pods: HashMap<PodUid, PodEntry>,
    /// Container id -> pod UID.
    pod_of: HashMap<String, PodUid>,
    /// Containers seen in events but not described yet, with the state events gave them.
    undescribed: HashMap<String, Undescribed>,
    /// Ids known not to be CRI containers (sandboxes' pause containers): their task events
    /// are ignored instead of described.
    not_containers: HashSet<String>,
    /// Undescribed ids whose description is in flight.
    describing: HashSet<String>,
    /// Removed container ids, and when.
    removed: HashMap<String, Instant>,
    /// Whether a listing has been applied since the view was made.
    listed: bool,
    /// How long a tombstone is kept, when not [`TOMBSTONE_TTL`].
    tombstone_ttl: Option<Duration>,
}

impl NodeView {
    pub fn new() -> Self {
        NodeView::default()
    }

    /// A view that keeps removed containers' ids for `ttl` (the agent's configuration).
    pub fn with_tombstone_ttl(ttl: Duration) -> Self {
        NodeView {
            tombstone_ttl: Some(ttl),
            ..NodeView::default()
        }
    }

    /// Removed containers' ids remembered now.
    pub fn tombstones(&self) -> usize {
        self.removed.len()
    }

    pub fn pod(&self, uid: &PodUid) -> Option<&PodEntry> {
        self.pods.get(uid)
    }

    pub fn pods(&self) -> impl Iterator<Item = (&PodUid, &PodEntry)> {
        self.pods.iter()
    }

    /// Whether a listing has been applied: before one, the view knows nothing.
    pub fn is_listed(&self) -> bool {
        self.listed
    }

    /// Containers seen in events whose pod is not known yet: a pod's view may miss them.
    pub fn undescribed(&self) -> usize {
        self.undescribed.len()
    }

    /// Whether a container whose first event arrived at or before `t` is still being read.
    /// The kubelet starts no container in a pod it is stopping, so only a container that
    /// appeared before a pod's exit file can be one that pod's view is missing; one that
    /// appeared later belongs to another pod.
    pub fn undescribed_seen_by(&self, t: Instant) -> bool {
        self.undescribed.values().any(|u| u.seen <= t)
    }

    pub fn container_count(&self) -> usize {
        self.pod_of.len()
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Applies a change; returns the pods it touched.
    pub fn apply(&mut self, change: Change, now: Instant) -> HashSet<PodUid> {
        let mut touched = HashSet::new();
        match change {
            Change::Listed(l) => self.listed(l, None, now, &mut touched),
            Change::PodListed { uid, listing } => {
                self.listed(listing, Some(uid), now, &mut touched)
            }
            Change::Started { id } => self.event(id, RunState::Running, now, &mut touched),
            Change::Exited { id } => self.event(id, RunState::Exited, now, &mut touched),
            Change::ProcessGone { id, at } => {
                let first = self.container_mut(&id).map(|c| {
                    c.kernel_exit.get_or_insert(at);
                    c.exit_seen.is_none()
                });
                self.event(id.clone(), RunState::Exited, now, &mut touched);
                if first == Some(true) {
                    if let Some(c) = self.container_mut(&id) {
                        c.exit_by_kernel = c.exit_seen.is_some();
                    }
                }
            }
            // Noted only: nothing is decided on them, but a silence is judged with them.
            Change::ExecAdded { id, exec } => {
                if let Some(c) = self.container_mut(&id) {
                    c.execs.added(exec, now);
                }
            }
            Change::ExecExited { id, exec, failed } => {
                if let Some(c) = self.container_mut(&id) {
                    c.execs.exited(&exec, failed, now);
                }
            }
            Change::Removed { id } => {
                self.remove(&id, &mut touched);
                self.not_containers.remove(&id);
                self.removed.insert(id, now);
            }
            Change::Described { info, env } => {
                let id = info.id.clone();
                self.describing.remove(&id);
                if self.removed.contains_key(&id) {
                    return touched;
                }
                let event_state = self.undescribed.remove(&id);
                let mut info = info;
                if let Some(u) = event_state {
                    info.state = forward(info.state, u.state);
                }
                self.upsert(info, now, &mut touched);
                if let Some(c) = self.container_mut(&id) {
                    c.env = EnvPriority::Known(env);
                }
            }
            Change::SandboxFailed { uid, now } => {
                if let Some(p) = self.pods.get_mut(&uid) {
                    let failures = match p.sandbox_read {
                        Some(SandboxRead::Failed { failures, .. }) => failures.saturating_add(1),
                        _ => 1,
                    };
                    p.sandbox_read = Some(SandboxRead::Failed {
                        failures,
                        retry_at: now.later(backoff(failures)),
                    });
                    touched.insert(uid);
                }
            }
            Change::NotAContainer { id } => {
                self.describing.remove(&id);
                if self.undescribed.remove(&id).is_some() && !self.removed.contains_key(&id) {
                    // A sandbox (or a container already gone, whose removal event follows).
                    self.not_containers.insert(id);
                }
            }
            Change::DescribeFailed { id, now } => {
                self.describing.remove(&id);
                if let Some(c) = self.container_mut(&id) {
                    let failures = match c.env {
                        EnvPriority::Failed { failures, .. }
                        | EnvPriority::Reading { failures } => failures.saturating_add(1),
                        _ => 1,
                    };
                    c.env = EnvPriority::Failed {
                        failures,
                        retry_at: now.later(backoff(failures)),
                    };
                    if let Some(uid) = self.pod_of.get(&id) {
                        touched.insert(uid.clone());
                    }
                }
                // An undescribed container is asked for again at the next `needs`.
            }
        }
        let ttl = self.tombstone_ttl.unwrap_or(TOMBSTONE_TTL);
        self.removed
            .retain(|_, at| now.saturating_duration_since(*at) < ttl);
        if let Some(excess) = self
            .removed
            .len()
            .checked_sub(MAX_TOMBSTONES)
            .filter(|n| *n > 0)
        {
            let mut times: Vec<Instant> = self.removed.values().copied().collect();
            let (_, cut, _) = times.select_nth_unstable(excess.saturating_sub(1));
            let cut = *cut;
            self.removed.retain(|_, at| *at > cut);
        }
        touched
    }

    /// The reads due now; each is marked in flight until its answer is applied.
    pub fn needs(&mut self, now: Instant) -> Vec<Need> {
        let mut out = Vec::new();
        for id in self.undescribed.keys() {
            if self.describing.insert(id.clone()) {
                out.push(Need::Describe(id.clone()));
            }
        }
        for (uid, pod) in &mut self.pods {
            let due = match pod.sandbox_read {
                _ if pod.sandbox.is_some() => false,
                None => true,
                Some(SandboxRead::Asked) => false,
                Some(SandboxRead::Failed { retry_at, .. }) => now >= retry_at,
            };
            if due {
                pod.sandbox_read = Some(SandboxRead::Asked);
                out.push(Need::Sandbox(uid.clone()));
            }
            for (id, c) in &mut pod.containers {
                let failures = match c.env {
                    EnvPriority::Unread => 0,
                    EnvPriority::Failed { failures, retry_at } if now >= retry_at => failures,
                    _ => continue,
                };
                if self.describing.insert(id.clone()) {
                    c.env = EnvPriority::Reading { failures };
                    out.push(Need::Describe(id.clone()));
                }
            }
        }
        out
    }

    /// When the earliest failed read is due again.
    pub fn next_retry(&self) -> Option<Instant> {
        let envs = self
            .pods
            .values()
            .flat_map(|p| p.containers.values())
            .filter_map(|c| match c.env {
                EnvPriority::Failed { retry_at, .. } => Some(retry_at),
                _ => None,
            });
        let sandboxes = self.pods.values().filter_map(|p| match p.sandbox_read {
            Some(SandboxRead::Failed { retry_at, .. }) if p.sandbox.is_none() => Some(retry_at),
            _ => None,
        });
        envs.chain(sandboxes).min()
    }

    /// Whether container `id` is known (listed or described), not only seen in an event.
    pub fn knows(&self, id: &str) -> bool {
        self.pod_of.contains_key(id)
    }

    /// A known container's state.
    pub fn state_of(&self, id: &str) -> Option<RunState> {
        let uid = self.pod_of.get(id)?;
        Some(self.pods.get(uid)?.containers.get(id)?.info.state)
    }

    /// Where container `id`'s pod has its cgroup (the kernel source read it).
    pub fn set_pod_cgroup(&mut self, id: &str, dir: std::path::PathBuf) {
        if let Some(p) = self.pod_of.get(id).and_then(|uid| self.pods.get_mut(uid)) {
            p.cgroup_dir = Some(dir);
        }
    }

    /// Pod `uid` is known, at `at`, to have started no container the view does not know.
    pub fn settled(&mut self, uid: &PodUid, at: Instant) {
        if let Some(p) = self.pods.get_mut(uid) {
            p.listed_at = p.listed_at.max(Some(at));
        }
    }

    fn container_mut(&mut self, id: &str) -> Option<&mut ContainerEntry> {
        let uid = self.pod_of.get(id)?;
        self.pods.get_mut(uid)?.containers.get_mut(id)
    }

    fn event(&mut self, id: String, state: RunState, now: Instant, touched: &mut HashSet<PodUid>) {
        if self.removed.contains_key(&id) || self.not_containers.contains(&id) {
            return;
        }
        if let Some(uid) = self.pod_of.get(&id).cloned() {
            if let Some(c) = self
                .pods
                .get_mut(&uid)
                .and_then(|p| p.containers.get_mut(&id))
            {
                c.info.state = forward(c.info.state, state);
                c.note_exit(now);
                touched.insert(uid);
            }
            return;
        }
        let u = self
            .undescribed
            .entry(id)
            .or_insert(Undescribed { state, seen: now });
        u.state = forward(u.state, state);
    }

    fn upsert(&mut self, info: ContainerInfo, now: Instant, touched: &mut HashSet<PodUid>) {
        touched.insert(info.pod_uid.clone());
        if let Some(old_uid) = self.pod_of.get(&info.id) {
            if *old_uid != info.pod_uid {
                let old_uid = old_uid.clone();
                self.remove(&info.id, touched);
                touched.insert(old_uid);
            }
        }
        self.pod_of.insert(info.id.clone(), info.pod_uid.clone());
        let pod = self.pods.entry(info.pod_uid.clone()).or_default();
        match pod.containers.get_mut(&info.id) {
            Some(c) => {
                let state = forward(c.info.state, info.state);
                c.info = info;
                c.info.state = state;
                c.note_exit(now);
            }
            None => {
                let mut c = ContainerEntry {
                    info,
                    env: EnvPriority::Unread,
                    exit_seen: None,
                    kernel_exit: None,
                    execs: Execs::default(),
                    exit_by_kernel: false,
                };
                c.note_exit(now);
                pod.containers.insert(c.info.id.clone(), c);
            }
        }
    }

    fn remove(&mut self, id: &str, touched: &mut HashSet<PodUid>) {
        self.undescribed.remove(id);
        if let Some(uid) = self.pod_of.remove(id) {
            if let Some(p) = self.pods.get_mut(&uid) {
                p.containers.remove(id);
                if p.containers.is_empty() && p.sandbox.is_none() {
                    self.pods.remove(&uid);
                }
            }
            touched.insert(uid);
        }
    }

    /// Applies a listing of the whole node (`only` = None) or of one pod.
    fn listed(
        &mut self,
        l: Listing,
        only: Option<PodUid>,
        now: Instant,
        touched: &mut HashSet<PodUid>,
    ) {
        if only.is_none() {
            self.listed = true;
            // What the runtime lists now replaces what was learnt before (sandboxes since
            // removed); an id learnt since is only described once more.
            self.not_containers.clear();
        }
        for sb in &l.sandboxes {
            self.undescribed.remove(&sb.id);
            self.not_containers.insert(sb.id.clone());
        }
        let listed_ids: HashSet<&str> = l.containers.iter().map(|c| c.id.as_str()).collect();
        let listed_pods: HashSet<&PodUid> = l
            .sandboxes
            .iter()
            .map(|s| &s.pod_uid)
            .chain(l.containers.iter().map(|c| &c.pod_uid))
            .collect();
        // Gone from the runtime: what the listing covers and does not show, unless it was
        // created after the listing was asked for.
        let in_scope = |uid: &PodUid| only.as_ref().is_none_or(|o| o == uid);
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(uid, _)| in_scope(uid))
            .flat_map(|(_, p)| p.containers.values())
            .filter(|c| !listed_ids.contains(c.info.id.as_str()))
            .filter(|c| c.info.created_at <= l.asked_at_ns)
            .map(|c| c.info.id.clone())
            .collect();
        for id in gone {
            self.remove(&id, touched);
        }
        let stale_pods: Vec<PodUid> = self
            .pods
            .keys()
            .filter(|uid| in_scope(uid) && !listed_pods.contains(uid))
            .filter(|uid| self.pods.get(*uid).is_some_and(|p| p.containers.is_empty()))
            .cloned()
            .collect();
        for uid in stale_pods {
            self.pods.remove(&uid);
            touched.insert(uid);
        }
        if let Some(uid) = &only {
            if let Some(p) = self.pods.get_mut(uid) {
                // Answered: a pod without a sandbox now is asked about again only by the
                // next full listing.
                p.sandbox_read = Some(SandboxRead::Asked);
            }
        }
        for sb in l.sandboxes {
            touched.insert(sb.pod_uid.clone());
            let pod = self.pods.entry(sb.pod_uid.clone()).or_default();
            // A pod whose sandbox was recreated has several; the newest carries the current
            // annotations.
            if pod
                .sandbox
                .as_ref()
                .is_none_or(|old| sb.created_at >= old.created_at)
            {
                pod.sandbox = Some(sb);
            }
        }
        for c in l.containers {
            if self.removed.contains_key(&c.id) {
                continue;
            }
            let mut c = c;
            if let Some(u) = self.undescribed.remove(&c.id) {
                c.state = forward(c.state, u.state);
            }
            self.upsert(c, now, touched);
        }
        if let Some(asked) = l.asked {
            for (_, p) in self.pods.iter_mut().filter(|(uid, _)| in_scope(uid)) {
                p.listed_at = p.listed_at.max(Some(asked));
            }
        }
    }
}

fn backoff(failures: u32) -> Duration {
    crate::backoff::Backoff::after(RETRY_START, RETRY_MAX, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";

    fn uid() -> PodUid {
        crate::pod::test_uid(UID)
    }

    fn c(id: &str, name: &str, state: RunState, created_at: i64) -> ContainerInfo {
        ContainerInfo {
            id: id.into(),
            pod_uid: uid(),
            name: name.into(),
            attempt: 0,
            created_at,
            state,
            grace: Some(Duration::from_secs(30)),
            marks: false,
        }
    }

    fn sandbox() -> SandboxInfo {
        SandboxInfo {
            id: "sandbox".into(),
            pod_uid: uid(),
            namespace: "default".into(),
            name: "web".into(),
            annotations: HashMap::new(),
            created_at: 1,
        }
    }

    fn listing(asked_at_ns: i64, containers: Vec<ContainerInfo>) -> Change {
        Change::Listed(Listing {
            asked_at_ns,
            asked: None,
            sandboxes: vec![sandbox()],
            containers,
        })
    }

    /// A view that has listed these running containers (id, name, created at) of one pod.
    fn running(containers: &[(&str, &str, i64)], now: Instant) -> NodeView {
        let mut v = NodeView::new();
        let listed = containers
            .iter()
            .map(|(id, name, at)| c(id, name, RunState::Running, *at))
            .collect();
        v.apply(listing(10, listed), now);
        v
    }

    fn state(v: &NodeView, id: &str) -> Option<RunState> {
        v.pod(&uid())?.containers.get(id).map(|c| c.info.state)
    }

    #[test]
    fn tombstones_are_bounded_and_the_newest_kept() {
        let mut v = NodeView::new();
        let t0 = Instant::now();
        for i in 0..(MAX_TOMBSTONES + 1_000) {
            let at = t0 + Duration::from_millis(u64::try_from(i).unwrap());
            v.apply(
                Change::Removed {
                    id: format!("c{i}"),
                },
                at,
            );
        }
        assert!(v.removed.len() <= MAX_TOMBSTONES, "{}", v.removed.len());
        assert!(v
            .removed
            .contains_key(&format!("c{}", MAX_TOMBSTONES + 999)));
        assert!(!v.removed.contains_key("c0"));
    }

    /// A container's execs are noted as the runtime tells them (in progress, and when one
    /// last failed), touch no pod, and end nothing.
    #[test]
    fn execs_are_noted_without_touching_the_pod() {
        let now = Instant::now();
        let mut v = running(&[("app", "app", 5)], now);
        let execs = |v: &NodeView| v.pod(&uid()).map(|p| p.containers["app"].execs.clone());
        let add = |exec: &str| Change::ExecAdded {
            id: "app".into(),
            exec: exec.into(),
        };
        let exit = |exec: &str, failed| Change::ExecExited {
            id: "app".into(),
            exec: exec.into(),
            failed,
        };
        assert!(v.apply(add("probe"), now).is_empty());
        assert!(v.apply(add("hook"), now).is_empty());
        let later = now + Duration::from_millis(5);
        assert!(v.apply(exit("probe", false), later).is_empty());
        let e = execs(&v).expect("the app");
        assert_eq!(e.running, vec![("hook".to_owned(), now)]);
        assert_eq!(e.failed, None);
        v.apply(exit("hook", true), later);
        let e = execs(&v).expect("the app");
        assert!(e.running.is_empty());
        assert_eq!(e.failed, Some(later));
        assert_eq!(v.state_of("app"), Some(RunState::Running));
        // An exec of a container the view does not know is nobody's.
        v.apply(
            Change::ExecAdded {
                id: "stranger".into(),
                exec: "x".into(),
            },
            now,
        );
        assert!(!v.knows("stranger"));
        // However many are left behind (exits never told), a few are kept.
        for i in 0..100 {
            v.apply(add(&format!("lost-{i}")), now);
        }
        assert!(execs(&v).expect("the app").running.len() <= 8);
    }

    /// The view remembers which source told it of an exit first: what the benchmark
    /// reports for each allow.
    #[test]
    fn the_first_teller_of_an_exit_is_remembered() {
        let now = Instant::now();
        let mut v = running(&[("app", "app", 5), ("logs", "logs", 5)], now);
        let by_kernel =
            |v: &NodeView, id: &str| v.pod(&uid()).map(|p| p.containers[id].exit_by_kernel);
        // The kernel first, the runtime after: the kernel told.
        v.apply(
            Change::ProcessGone {
                id: "app".into(),
                at: now,
            },
            now,
        );
        v.apply(Change::Exited { id: "app".into() }, now);
        assert_eq!(by_kernel(&v, "app"), Some(true));
        // The runtime first, the kernel after: the runtime told.
        v.apply(Change::Exited { id: "logs".into() }, now);
        v.apply(
            Change::ProcessGone {
                id: "logs".into(),
                at: now,
            },
            now,
        );
        assert_eq!(by_kernel(&v, "logs"), Some(false));
    }

    #[test]
    fn an_exit_event_beats_a_stale_listing() {
        let now = Instant::now();
        let mut v = NodeView::new();
        v.apply(
            listing(10, vec![c("app", "app", RunState::Running, 5)]),
            now,
        );
        v.apply(Change::Exited { id: "app".into() }, now);
        // A listing taken before containerd's CRI side caught up still says running.
        v.apply(
            listing(20, vec![c("app", "app", RunState::Running, 5)]),
            now,
        );
        assert_eq!(state(&v, "app"), Some(RunState::Exited));
    }

    #[test]
    fn an_unknown_container_is_described_once_and_keeps_its_event_state() {
        let now = Instant::now();
        let mut v = NodeView::new();
        v.apply(listing(10, vec![]), now);
        v.apply(Change::Started { id: "new".into() }, now);
        v.apply(Change::Exited { id: "new".into() }, now);
        assert_eq!(v.undescribed(), 1);
        assert_eq!(v.needs(now), vec![Need::Describe("new".into())]);
        assert_eq!(v.needs(now), vec![], "asked once while in flight");
        v.apply(
            Change::Described {
                info: c("new", "app", RunState::Running, 50),
                env: Ok(None),
            },
            now,
        );
        assert_eq!(state(&v, "new"), Some(RunState::Exited));
        assert_eq!(v.undescribed(), 0);
        assert_eq!(
            v.pod(&uid()).unwrap().containers["new"].env,
            EnvPriority::Known(Ok(None))
        );
    }

    #[test]
    fn sandbox_events_are_never_described() {
        let now = Instant::now();
        let mut v = NodeView::new();
        v.apply(listing(10, vec![]), now);
        // The listing named the sandbox: its pause container's task events are not read.
        v.apply(
            Change::Started {
                id: "sandbox".into(),
            },
            now,
        );
        v.apply(
            Change::Exited {
                id: "sandbox".into(),
            },
            now,
        );
        assert_eq!(v.undescribed(), 0);
        assert_eq!(v.needs(now), vec![]);
        // One learnt by asking is read once, not at each of its events.
        v.apply(Change::Started { id: "pause".into() }, now);
        assert_eq!(v.needs(now), vec![Need::Describe("pause".into())]);
        v.apply(Change::NotAContainer { id: "pause".into() }, now);
        v.apply(Change::Exited { id: "pause".into() }, now);
        assert_eq!(v.undescribed(), 0);
        assert_eq!(v.needs(now), vec![]);
        // Removed, its id is forgotten (and tombstoned).
        v.apply(Change::Removed { id: "pause".into() }, now);
        assert!(!v.not_containers.contains("pause"));
    }

    #[test]
    fn a_container_read_is_dated_by_its_first_event() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(5);
        let mut v = NodeView::new();
        v.apply(listing(10, vec![]), t0);
        assert!(!v.undescribed_seen_by(t1));
        v.apply(Change::Started { id: "new".into() }, t1);
        v.apply(
            Change::Exited { id: "new".into() },
            t1 + Duration::from_secs(1),
        );
        assert!(!v.undescribed_seen_by(t0), "appeared after t0");
        assert!(v.undescribed_seen_by(t1));
        v.apply(Change::NotAContainer { id: "new".into() }, t1);
        assert!(!v.undescribed_seen_by(t1 + Duration::from_secs(9)));
    }

    #[test]
    fn failed_reads_back_off_and_are_asked_again() {
        let now = Instant::now();
        let mut v = NodeView::new();
        v.apply(
            listing(10, vec![c("p", "proxy", RunState::Running, 5)]),
            now,
        );
        assert_eq!(v.needs(now), vec![Need::Describe("p".into())]);
        let touched = v.apply(
            Change::DescribeFailed {
                id: "p".into(),
                now,
            },
            now,
        );
        assert!(touched.contains(&uid()));
        assert_eq!(v.needs(now), vec![], "not before the back-off");
        let retry = v.next_retry().expect("a retry is due");
        assert_eq!(retry, now + RETRY_START);
        assert_eq!(v.needs(retry), vec![Need::Describe("p".into())]);
        v.apply(
            Change::DescribeFailed {
                id: "p".into(),
                now: retry,
            },
            retry,
        );
        assert_eq!(v.next_retry(), Some(retry + RETRY_START * 2));
    }

    #[test]
    fn removed_containers_stay_removed_and_listings_drop_the_gone() {
        let now = Instant::now();
        let mut v = running(&[("a", "app", 5), ("b", "proxy", 6)], now);
        v.apply(Change::Removed { id: "a".into() }, now);
        v.apply(Change::Exited { id: "a".into() }, now);
        assert_eq!(state(&v, "a"), None);
        assert_eq!(v.undescribed(), 0, "a tombstone, not an unknown container");
        // A later listing without b drops it, but keeps what was created after it was asked.
        v.apply(Change::Started { id: "late".into() }, now);
        v.apply(
            Change::Described {
                info: c("late", "app", RunState::Running, 30),
                env: Ok(None),
            },
            now,
        );
        v.apply(listing(20, vec![]), now);
        assert_eq!(state(&v, "b"), None);
        assert_eq!(state(&v, "late"), Some(RunState::Running));
    }

    mod property {
        use super::*;
        use proptest::prelude::*;

        /// One container's life: how far it got (1 started, 2 exited, 3 removed), and at
        /// which step of it the runtime described it.
        fn lives() -> impl Strategy<Value = Vec<(u8, u8, u8)>> {
            prop::collection::vec((0u8..3, 1u8..=3, 0u8..3), 1..10)
        }

        fn state_at(step: u8) -> RunState {
            match step {
                0 => RunState::Created,
                1 => RunState::Running,
                _ => RunState::Exited,
            }
        }

        type Flat = Vec<(PodUid, String, String, RunState)>;

        /// Every container of a view, sorted by id.
        fn flat(v: &NodeView) -> Flat {
            let mut all: Flat = v
                .pods()
                .flat_map(|(uid, p)| {
                    p.containers.values().map(|c| {
                        (
                            uid.clone(),
                            c.info.id.clone(),
                            c.info.name.clone(),
                            c.info.state,
                        )
                    })
                })
                .collect();
            all.sort_by(|a, b| a.1.cmp(&b.1));
            all
        }

        /// The view the events of `lives` give when applied in the order `order` picks, the
        /// view a listing of the same node gives, and what the first left undescribed.
        fn by_events_and_by_listing(lives: &[(u8, u8, u8)], order: &[u32]) -> (Flat, Flat, usize) {
            let now = Instant::now();
            let info = |i: usize, pod: u8, state: RunState| ContainerInfo {
                id: format!("c{i}"),
                pod_uid: crate::pod::test_uid(&format!("0f5c7a1e-8d2b-4c3e-9f00-{pod:012}")),
                name: format!("n{i}"),
                attempt: 0,
                created_at: 1,
                state,
                grace: None,
                marks: false,
            };
            let mut events = Vec::new();
            let mut truth = Vec::new();
            for (i, (pod, reached, described)) in lives.iter().copied().enumerate() {
                let id = format!("c{i}");
                events.push(Change::Started { id: id.clone() });
                if reached >= 2 {
                    events.push(Change::Exited { id: id.clone() });
                }
                if reached >= 3 {
                    events.push(Change::Removed { id: id.clone() });
                } else {
                    truth.push(info(i, pod, state_at(reached)));
                }
                // The description tells the state at some point of its life.
                events.push(Change::Described {
                    info: info(i, pod, state_at(described.min(reached.min(2)))),
                    env: Ok(None),
                });
            }
            // Any interleaving.
            let mut keyed: Vec<(u32, Change)> = events
                .into_iter()
                .enumerate()
                .map(|(i, e)| (order[i % order.len()].wrapping_add(i as u32), e))
                .collect();
            keyed.sort_by_key(|(k, _)| *k);
            let mut by_events = NodeView::new();
            by_events.apply(Change::Listed(Listing::default()), now);
            for (_, e) in keyed {
                by_events.apply(e, now);
            }
            let mut by_listing = NodeView::new();
            by_listing.apply(
                Change::Listed(Listing {
                    asked_at_ns: 2,
                    asked: None,
                    sandboxes: vec![],
                    containers: truth,
                }),
                now,
            );
            (flat(&by_events), flat(&by_listing), by_events.undescribed())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            #[test]
            fn events_in_any_order_give_the_view_a_listing_gives(
                lives in lives(),
                order in prop::collection::vec(any::<u32>(), 40),
            ) {
                let (by_events, by_listing, undescribed) = by_events_and_by_listing(&lives, &order);
                prop_assert_eq!(by_events, by_listing);
                prop_assert_eq!(undescribed, 0);
            }
        }

        /// A node's worth: 3,000 containers in 250 pods, their events shuffled.
        #[test]
        fn thousands_of_containers_by_events_give_the_listing_view() {
            // A fixed linear congruential sequence: the same shuffle on every run.
            let mut x: u32 = 12345;
            let mut next = move || {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                x >> 8
            };
            let lives: Vec<(u8, u8, u8)> = (0..3000)
                .map(|i| ((i % 250) as u8, (next() % 3 + 1) as u8, (next() % 3) as u8))
                .collect();
            let order: Vec<u32> = (0..997).map(|_| next()).collect();
            let (by_events, by_listing, undescribed) = by_events_and_by_listing(&lives, &order);
            assert_eq!(by_listing.len(), lives.iter().filter(|l| l.1 < 3).count());
            assert_eq!(by_events, by_listing);
            assert_eq!(undescribed, 0);
        }
    }

    #[test]
    fn a_pod_seen_through_events_has_its_sandbox_listed() {
        let now = Instant::now();
        let mut v = NodeView::new();
        v.apply(Change::Listed(Listing::default()), now);
        v.apply(
            Change::Described {
                info: c("app", "app", RunState::Running, 5),
                env: Ok(None),
            },
            now,
        );
        assert!(v.pod(&uid()).unwrap().sandbox.is_none());
        assert_eq!(v.needs(now), vec![Need::Sandbox(uid())]);
        assert_eq!(v.needs(now), vec![]);
        v.apply(Change::SandboxFailed { uid: uid(), now }, now);
        let retry = v.next_retry().unwrap();
        assert_eq!(v.needs(retry), vec![Need::Sandbox(uid())]);
        v.apply(
            Change::PodListed {
                uid: uid(),
                listing: Listing {
                    asked_at_ns: 1,
                    asked: None,
                    sandboxes: vec![sandbox()],
                    containers: vec![c("app", "app", RunState::Running, 5)],
                },
            },
            retry,
        );
        assert_eq!(v.pod(&uid()).unwrap().sandbox.as_ref().unwrap().name, "web");
        assert_eq!(v.needs(retry), vec![]);
    }

    #[test]
    fn backoff_grows_to_its_cap() {
        assert_eq!(backoff(1), RETRY_START);
        assert_eq!(backoff(2), RETRY_START * 2);
        assert_eq!(backoff(40), RETRY_MAX);
    }
}
