//! What the view holds of a pod and of a container, as the runtime described them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::decide::priority::PriorityError;
use crate::decide::RunState;
use crate::pod::PodUid;

/// One container attempt as the runtime describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: String,
    pub pod_uid: PodUid,
    pub name: String,
    pub attempt: u32,
    /// Runtime creation time, Unix ns.
    pub created_at: i64,
    pub state: RunState,
    /// The pod's grace period as the kubelet recorded it on the container.
    pub grace: Option<Duration>,
    /// Its preStop says on the node when the kubelet stops it (it runs exitorder's
    /// entrypoint: see [`crate::kubelet::evidence::prestop_marks`]).
    pub marks: bool,
}

/// A pod's sandbox as the runtime describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    /// The sandbox's id: its pause container's, whose task events are not a container's.
    pub id: String,
    pub pod_uid: PodUid,
    pub namespace: String,
    pub name: String,
    /// The pod's annotations, as the kubelet copied them to the sandbox.
    pub annotations: HashMap<String, String>,
    pub created_at: i64,
}

/// Everything the runtime lists, and when the listing was asked for (Unix ns, the runtime's
/// clock): containers created after that are not expected in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    pub asked_at_ns: i64,
    /// When it was asked for, on the agent's own clock (`None`: not known): what a pod's
    /// listing shows includes every container created before then.
    pub asked: Option<Instant>,
    pub sandboxes: Vec<SandboxInfo>,
    pub containers: Vec<ContainerInfo>,
}

/// What is known of a container's own exit priority (its env).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvPriority {
    /// Not read yet (a read is due).
    Unread,
    /// A read is in flight; the earlier ones failed `failures` times.
    Reading { failures: u32 },
    /// Read: the priority its env gives, if any, or why the env is malformed.
    Known(Result<Option<u8>, PriorityError>),
    /// The read failed `failures` times; the next is due at `retry_at`.
    Failed { failures: u32, retry_at: Instant },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEntry {
    pub info: ContainerInfo,
    pub env: EnvPriority,
    /// When the view first learnt that the container had exited: what an allow waited on
    /// the runtime to tell, apart from what it waited on the agent.
    pub exit_seen: Option<Instant>,
    /// When the kernel told that the container's first process was gone (the kernel exit
    /// source), as its waiting thread woke.
    pub kernel_exit: Option<Instant>,
    /// The kernel source was the first to tell the view of the exit (else the runtime, by an
    /// event or a listing).
    pub exit_by_kernel: bool,
    /// The exec processes the runtime told of in the container (containerd's events only).
    pub execs: Execs,
}

/// A container's counters of being held back by its limits, at one moment (read by
/// [`crate::runtime::strain`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Strain {
    /// CPU periods the cgroup ran in (`nr_periods`).
    pub cpu_periods: u64,
    /// Of those, the ones in which it ran out of its quota (`nr_throttled`).
    pub cpu_throttled: u64,
    /// Out-of-memory events and kills: what a hook at the limit meets beyond reclaim, which a
    /// container at its limit goes through routinely (its page cache) and is not counted.
    pub memory: u64,
    /// Forks refused at `pids.max`.
    pub pids: u64,
}

impl Strain {
    /// What rose since `before` (`cpu`, `memory` or `pids`, the first that did), if anything.
    /// CPU counts when the cgroup was throttled in at least half the periods it ran in since:
    /// a container held at its quota, not one that met it in a burst.
    pub fn rose_since(&self, before: &Strain) -> Option<&'static str> {
        let periods = self.cpu_periods.saturating_sub(before.cpu_periods);
        let throttled = self.cpu_throttled.saturating_sub(before.cpu_throttled);
        if periods > 0 && throttled.saturating_mul(2) >= periods {
            Some("cpu")
        } else if self.memory > before.memory {
            Some("memory")
        } else if self.pids > before.pids {
            Some("pids")
        } else {
            None
        }
    }
}

/// More execs in progress at once than the kubelet runs in one container (a hook and a probe
/// of each kind): beyond it, the oldest is forgotten.
const MAX_RUNNING_EXECS: usize = 8;

/// The kubelet's exec hooks and probes in a container, as the runtime tells them: which are in
/// progress, and when one last failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Execs {
    /// Added and not exited yet, with when each was added (oldest first).
    pub running: Vec<(String, Instant)>,
    /// When one last exited with a status other than 0.
    pub failed: Option<Instant>,
}

impl Execs {
    pub fn added(&mut self, exec: String, now: Instant) {
        if self.running.iter().any(|(e, _)| *e == exec) {
            return;
        }
        if self.running.len() >= MAX_RUNNING_EXECS {
            self.running.remove(0);
        }
        self.running.push((exec, now));
    }

    pub fn exited(&mut self, exec: &str, failed: bool, now: Instant) {
        self.running.retain(|(e, _)| e != exec);
        if failed {
            self.failed = Some(now);
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodEntry {
    /// The sandbox (the pod's annotations): from a listing. A pod first seen through a
    /// container's start event has none until its own listing comes back.
    pub sandbox: Option<SandboxInfo>,
    pub containers: HashMap<String, ContainerEntry>,
    /// The pod's listing is asked for (`None`), or due again after a failure (`Some(at)`).
    pub(super) sandbox_read: Option<SandboxRead>,
    /// When the newest listing that covered the pod was asked for (the agent's clock), or a
    /// look at its cgroup found no container the view does not know (the same knowledge).
    pub listed_at: Option<Instant>,
    /// The pod's cgroup directory, learnt with a container's process (see
    /// [`crate::runtime::podcgroup`]).
    pub cgroup_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SandboxRead {
    Asked,
    Failed { failures: u32, retry_at: Instant },
}

impl ContainerEntry {
    pub(super) fn note_exit(&mut self, now: Instant) {
        if self.info.state == RunState::Exited && self.exit_seen.is_none() {
            self.exit_seen = Some(now);
        }
    }
}

impl PodEntry {
    pub fn new(sandbox: Option<SandboxInfo>, containers: Vec<ContainerEntry>) -> Self {
        PodEntry {
            sandbox,
            containers: containers
                .into_iter()
                .map(|c| (c.info.id.clone(), c))
                .collect(),
            sandbox_read: None,
            listed_at: None,
            cgroup_dir: None,
        }
    }

    /// The pod's grace period, from its containers' kubelet annotation.
    pub fn grace(&self) -> Option<Duration> {
        self.containers.values().find_map(|c| c.info.grace)
    }
}
