//! What explain says about a pod, as data: the serde form is `-o json`.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::decide::priority::Source;
use crate::webhook::mutate::Settings;
use crate::webhook::pss::Profile;

/// Everything said about one pod.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `Kind namespace/name` of the object read.
    pub object: String,
    pub injection: Injection,
    pub exit: ExitPlan,
    pub grace: Grace,
    pub job: Job,
    pub pod_security: PodSecurity,
    pub warnings: Vec<Warning>,
}

/// What the webhook does with the pod.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Injection {
    /// The pod does not ask for it (`exitorder.io/inject: "true"`).
    NotRequested,
    /// Admitted with these changes (JSONPatch operations, `op path`).
    Injected {
        handshake: String,
        changes: Vec<String>,
    },
    /// Refused, saying why.
    Denied { reason: String },
}

/// One container in the exit order.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    pub name: String,
    /// An init container with `restartPolicy: Always`.
    pub native: bool,
    pub priority: u8,
    pub priority_from: Source,
    /// The preset it is known by (name, or image through the webhook).
    pub preset: Option<String>,
    /// Containers whose exit it waits for when the pod is deleted.
    pub waits_for: Vec<String>,
    /// Whether its preStop waits for the agent (a sidecar's exit is ordered only then).
    pub waits_in_prestop: bool,
    /// Whether its preStop says on the node when the kubelet stops it (`mark` or `wait`):
    /// what tells a sidecar's restart from the pod's kill.
    pub marks_when_stopped: bool,
}

/// The order of exits when the pod is deleted.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitPlan {
    /// Whether the agent orders this pod at all (it opted in).
    pub ordered: bool,
    pub members: Vec<Member>,
    /// Native sidecars in the order the kubelet stops them, after every main container.
    pub native_stop_order: Vec<String>,
    /// What tells a sidecar's restart (a probe's, a changed spec's) from the pod's kill, when
    /// a sidecar waits for anything: `others_silent` (every container it waits for marks: the
    /// node's own evidence) or `kubelet_event` (some do not: only the kubelet's Event).
    pub restart_evidence: Option<&'static str>,
    /// The apps' wait for the pod's endpoints, when it asks for one
    /// (`exitorder.io/wait-for-endpoints`).
    pub endpoints: Option<EndpointsWait>,
}

/// The apps' hold for the pod's endpoints on deletion, and its bounds.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointsWait {
    /// The containers held (priority 0).
    pub apps: Vec<String>,
    /// After no EndpointSlice lists the pod as ready; the whole wait where nothing tells.
    pub settle_ms: u64,
    /// The longest the withdrawal is waited for.
    pub max_wait_ms: u64,
}

/// The pod's time budget on deletion.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Grace {
    pub grace_period_seconds: u64,
    pub reserve_seconds: u64,
    /// When the agent releases every waiting sidecar, order or not, after the deletion.
    pub release_by_seconds: u64,
    /// The same for each of the kubelet's own kills, once the agent recognised it.
    pub kills: Vec<KillGrace>,
}

/// The budget of one kind of the kubelet's own kill of the pod.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KillGrace {
    /// As `exitorder_allows_by_kill_total{kill}` names it.
    pub kill: String,
    pub grace_period_seconds: u64,
    pub release_by_seconds: u64,
}

/// What happens when the pod's work is done (restartPolicy Never or OnFailure).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub shutdown: Shutdown,
    pub restart_policy: Option<String>,
    /// The sidecars shut down, lowest priority first, each level after the one before exited.
    pub steps: Vec<ShutdownStep>,
}

/// How one sidecar is shut down when the work is done.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownStep {
    pub container: String,
    pub priority: u8,
    pub how: How,
}

/// Whether the agent shuts a completing pod's sidecars down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shutdown {
    /// The pod never completes, did not opt in, or its priorities are malformed.
    Off,
    /// `exitorder.io/terminate-sidecars-on-completion: "false"`.
    OptedOut,
    On,
}

/// How one sidecar is ended; in JSON and text as `POST <url>`, `stop`, `left running` or
/// `kubelet`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    /// A POST to the URL, through the entrypoint in the sidecar.
    Post(String),
    /// SIGTERM through the runtime.
    Stop,
    /// Its shutdown would restart the pod (`RestartAllContainers`).
    LeftRunning,
    /// A native sidecar: the kubelet stops it once the main containers are done.
    Kubelet,
}

impl fmt::Display for How {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            How::Post(url) => write!(f, "POST {url}"),
            How::Stop => f.write_str("stop"),
            How::LeftRunning => f.write_str("left running"),
            How::Kubelet => f.write_str("kubelet"),
        }
    }
}

impl Serialize for How {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The strictest Pod Security profile the pod meets, as admitted.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSecurity {
    pub profile: Profile,
    /// What `restricted` refuses.
    pub restricted_refuses: Vec<String>,
}

/// Something the user should know, with a stable code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    pub code: &'static str,
    pub message: String,
}

/// What explain assumes of the cluster: the webhook's and agent's settings.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub settings: Settings,
    /// What the agents are told of the kubelet's configuration.
    pub kubelet: crate::kubelet::grace::KubeletConfig,
    /// The kubelet's version, when told (an agent reads it from its Node).
    pub kubelet_version: Option<crate::kubelet::grace::Version>,
}

/// Why an object cannot be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error(transparent)]
    Manifest(#[from] crate::cli::manifest::ManifestError),
    #[error("cannot write JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("{object}: not a valid Pod: {source}")]
    NotAPod {
        object: String,
        source: serde_json::Error,
    },
}

/// What `exitorder explain` prints.
#[derive(Debug, Clone)]
pub struct Report {
    pub text: String,
    /// The webhook would refuse one of the pods.
    pub denied: bool,
}
