//! The agent's settings, with the defaults the CLI documents.

use std::path::PathBuf;
use std::time::Duration;

use crate::runtime::source::SourceChoice;

/// How often the runtime is read while an exit is pending and no event stream is live.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(25);

#[derive(Debug, Clone)]
pub struct Config {
    pub share_dir: PathBuf,
    /// The kubelet's root directory, whose `pods/` holds each pod's `emptyDir` volumes: where
    /// pod-local exit directories are.
    pub kubelet_root_dir: PathBuf,
    pub cri_socket: PathBuf,
    /// Taken off the grace deadline so a released sidecar still drains before SIGKILL.
    pub grace_reserve: Duration,
    /// How often the runtime is re-listed while some exit is pending and no event stream is
    /// live (nothing is read while none is).
    pub poll_interval: Duration,
    /// How exits are detected: from the runtime's Version answer, or forced.
    pub exit_source: SourceChoice,
    /// How often the node view is reconciled with a full listing while an event stream is
    /// live: a safety net for an event the runtime never sent, not the way exits are found.
    pub reconcile_interval: Duration,
    /// How often pod directories of pods gone from the runtime are removed, and the share is
    /// rescanned as a safety net for lost inotify events.
    pub gc_interval: Duration,
    /// A pod directory younger than this is never removed (the kubelet may be creating it).
    pub gc_min_age: Duration,
    /// Installed as `exitorder-entrypoint` and `exitorder-entrypoint-v2` in `bin_dir` at
    /// start-up, when given.
    pub entrypoint_binary: Option<PathBuf>,
    /// The host directory the entrypoint is installed in, apart from the share.
    pub bin_dir: PathBuf,
    /// The agent's own pod, whose mounts are not checked for breaches.
    pub own_pod_uid: Option<crate::pod::PodUid>,
    /// Whether container exits are also awaited from the kernel (pidfds).
    pub kernel_exit_source: bool,
    /// How old a wait must be before the API server's "not being deleted" releases it: time
    /// for a deletion the kubelet already acts on to reach the agent's own watch.
    pub api_settle: Duration,
    /// What the agent is told of the kubelet's configuration: the grace of its own kills.
    pub kubelet: crate::kubelet::grace::KubeletConfig,
    /// How a pod kill is told from one container's (see [`crate::kubelet::evidence`]).
    pub evidence: crate::kubelet::evidence::Rule,
    /// How long the node view remembers a removed container's id, so that a late event does
    /// not bring it back.
    pub tombstone_ttl: Duration,
}

impl Config {
    pub fn new(share_dir: PathBuf, cri_socket: PathBuf) -> Self {
        Config {
            share_dir,
            kubelet_root_dir: PathBuf::from(exitorder_contract::podlocal::DEFAULT_KUBELET_ROOT),
            cri_socket,
            grace_reserve: Duration::from_secs(5),
            poll_interval: DEFAULT_POLL_INTERVAL,
            exit_source: SourceChoice::Auto,
            reconcile_interval: Duration::from_secs(10),
            gc_interval: Duration::from_secs(60),
            gc_min_age: Duration::from_secs(60),
            entrypoint_binary: None,
            bin_dir: PathBuf::from(exitorder_contract::bin::DEFAULT_DIR),
            own_pod_uid: None,
            kernel_exit_source: true,
            api_settle: Duration::from_millis(250),
            kubelet: crate::kubelet::grace::KubeletConfig::default(),
            evidence: crate::kubelet::evidence::Rule::default(),
            tombstone_ttl: crate::view::TOMBSTONE_TTL,
        }
    }
}
