//! The container runtime, through the CRI: which pods and containers exist, their states,
//! annotations and env. Read-only calls only here; the agent never changes a container's life
//! for the exit handshake.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use crate::cri::runtime_service_client::RuntimeServiceClient;
use crate::cri::{
    ContainerState, ContainerStatusRequest, ListContainersRequest, ListPodSandboxRequest,
    VersionRequest, VersionResponse,
};
use crate::decide::RunState;

/// Container annotation where the kubelet records the pod's terminationGracePeriodSeconds.
pub use exitorder_contract::kubelet::ANNOTATION_GRACE;
/// Label the kubelet puts on every container with its name in the pod spec.
pub use exitorder_contract::kubelet::LABEL_CONTAINER_NAME;
/// Label the kubelet puts on every sandbox and container with the pod's UID.
pub use exitorder_contract::kubelet::LABEL_POD_UID;

/// Per-call deadline: a runtime that hangs must not hold decisions (the deadline rule still
/// runs, and the next tick retries).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Verbose container status carries the whole OCI spec; larger answers are refused.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("runtime socket {path}: {reason}")]
    Endpoint { path: PathBuf, reason: String },
    #[error("CRI {call}: {status}")]
    Call {
        call: &'static str,
        #[source]
        status: Box<tonic::Status>,
    },
    #[error("CRI ContainerStatus of {id}: unreadable verbose info: {reason}")]
    BadInfo { id: String, reason: String },
}

impl RuntimeError {
    fn call(call: &'static str) -> impl FnOnce(tonic::Status) -> RuntimeError {
        move |status| RuntimeError::Call {
            call,
            status: Box::new(status),
        }
    }

    /// A short name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            RuntimeError::Endpoint { .. } => "endpoint",
            RuntimeError::Call { call, .. } => call,
            RuntimeError::BadInfo { .. } => "bad_info",
        }
    }
}

/// Accepts `/path`, `unix:///path` and `unix:/path`.
pub fn socket_path(s: &str) -> PathBuf {
    let p = s
        .strip_prefix("unix://")
        .or_else(|| s.strip_prefix("unix:"))
        .unwrap_or(s);
    PathBuf::from(p)
}

/// A channel to a unix socket. It connects lazily and reconnects on the next call after a
/// failure, so a runtime restart costs one failed call, not an agent restart.
pub fn unix_channel(path: &Path) -> Result<Channel, RuntimeError> {
    let path = path.to_owned();
    // The URI is required by tonic but unused: the connector below dials the socket.
    let endpoint = Endpoint::try_from("http://localhost").map_err(|e| RuntimeError::Endpoint {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    Ok(endpoint
        .connect_timeout(CALL_TIMEOUT)
        .connect_with_connector_lazy(connector))
}

/// One container attempt, as the runtime lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct RtContainer {
    pub id: String,
    pub name: String,
    pub attempt: u32,
    pub state: RunState,
    pub created_at: i64,
    pub annotations: HashMap<String, String>,
}

/// A pod as the runtime knows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RtPod {
    /// Annotations of the newest sandbox: the kubelet copies the pod's annotations there.
    pub annotations: HashMap<String, String>,
    /// The pod's namespace and name, from the newest sandbox's metadata: how the API server's
    /// view of the pod is found, and what Kubernetes Events are attached to.
    pub namespace: String,
    pub name: String,
    sandbox_created_at: i64,
    pub containers: Vec<RtContainer>,
}

impl RtPod {
    /// The pod's terminationGracePeriodSeconds as the kubelet recorded it on its containers.
    pub fn grace_period(&self) -> Option<Duration> {
        self.containers
            .iter()
            .filter_map(|c| c.annotations.get(ANNOTATION_GRACE))
            .find_map(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs)
    }
}

/// Every pod the runtime knows, by UID.
pub type Snapshot = HashMap<String, RtPod>;

fn run_state(raw: i32) -> RunState {
    match ContainerState::try_from(raw) {
        Ok(ContainerState::ContainerCreated) => RunState::Created,
        Ok(ContainerState::ContainerRunning) => RunState::Running,
        Ok(ContainerState::ContainerExited) => RunState::Exited,
        Ok(ContainerState::ContainerUnknown) | Err(_) => RunState::Unknown,
    }
}

#[derive(Clone)]
pub struct Runtime {
    channel: Channel,
    client: RuntimeServiceClient<Channel>,
}

impl Runtime {
    pub fn new(channel: Channel) -> Self {
        let client =
            RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES);
        Runtime { channel, client }
    }

    /// The connection, for other services on the same socket (containerd's events).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub fn connect(socket: &Path) -> Result<Self, RuntimeError> {
        Ok(Self::new(unix_channel(socket)?))
    }

    fn request<T>(msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(CALL_TIMEOUT);
        req
    }

    pub async fn version(&self) -> Result<VersionResponse, RuntimeError> {
        let req = Self::request(VersionRequest {
            version: "v1".to_owned(),
        });
        Ok(self
            .client
            .clone()
            .version(req)
            .await
            .map_err(RuntimeError::call("Version"))?
            .into_inner())
    }

    /// Lists every sandbox and container once and groups them by pod UID. Two calls whatever
    /// the number of pods, so deciding for many pods at once stays cheap.
    pub async fn snapshot(&self) -> Result<Snapshot, RuntimeError> {
        let mut client = self.client.clone();
        let sandboxes = client
            .list_pod_sandbox(Self::request(ListPodSandboxRequest { filter: None }))
            .await
            .map_err(RuntimeError::call("ListPodSandbox"))?
            .into_inner()
            .items;
        let containers = client
            .list_containers(Self::request(ListContainersRequest { filter: None }))
            .await
            .map_err(RuntimeError::call("ListContainers"))?
            .into_inner()
            .containers;
        let mut pods: Snapshot = HashMap::new();
        for sb in sandboxes {
            let Some(uid) = sb.labels.get(LABEL_POD_UID) else {
                continue;
            };
            let pod = pods.entry(uid.clone()).or_default();
            // A pod whose sandbox was recreated has several; the newest carries the current
            // annotations.
            if pod.annotations.is_empty() || sb.created_at >= pod.sandbox_created_at {
                pod.sandbox_created_at = sb.created_at;
                pod.annotations = sb.annotations;
                if let Some(m) = sb.metadata {
                    pod.namespace = m.namespace;
                    pod.name = m.name;
                }
            }
        }
        for c in containers {
            let (Some(uid), Some(name)) = (
                c.labels.get(LABEL_POD_UID).cloned(),
                c.labels.get(LABEL_CONTAINER_NAME).cloned(),
            ) else {
                continue;
            };
            // A container without a sandbox listed is still the pod's: keep it.
            pods.entry(uid).or_default().containers.push(RtContainer {
                attempt: c.metadata.as_ref().map_or(0, |m| m.attempt),
                state: run_state(c.state),
                created_at: c.created_at,
                annotations: c.annotations,
                id: c.id,
                name,
            });
        }
        Ok(pods)
    }

    /// The container's env as created (from the verbose status: the CRI has no other call
    /// that returns a container's env).
    pub async fn container_env(&self, id: &str) -> Result<Vec<(String, String)>, RuntimeError> {
        let resp = self
            .client
            .clone()
            .container_status(Self::request(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: true,
            }))
            .await
            .map_err(RuntimeError::call("ContainerStatus"))?
            .into_inner();
        let Some(info) = resp.info.get("info") else {
            return Ok(Vec::new());
        };
        env_from_info(info).map_err(|reason| RuntimeError::BadInfo {
            id: id.to_owned(),
            reason,
        })
    }
}

#[derive(serde::Deserialize)]
struct VerboseInfo {
    config: Option<InfoConfig>,
    #[serde(rename = "runtimeSpec")]
    runtime_spec: Option<InfoSpec>,
}

#[derive(serde::Deserialize)]
struct InfoConfig {
    #[serde(default)]
    envs: Vec<InfoEnv>,
}

#[derive(serde::Deserialize)]
struct InfoEnv {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(serde::Deserialize)]
struct InfoSpec {
    process: Option<InfoProcess>,
}

#[derive(serde::Deserialize)]
struct InfoProcess {
    #[serde(default)]
    env: Vec<String>,
}

/// Env from the verbose info JSON: containerd gives the original ContainerConfig's `envs`;
/// CRI-O gives only the OCI spec, whose `process.env` holds `KEY=VALUE` strings.
fn env_from_info(info: &str) -> Result<Vec<(String, String)>, String> {
    let info: VerboseInfo = serde_json::from_str(info).map_err(|e| e.to_string())?;
    if let Some(cfg) = info.config.filter(|c| !c.envs.is_empty()) {
        return Ok(cfg.envs.into_iter().map(|e| (e.key, e.value)).collect());
    }
    Ok(info
        .runtime_spec
        .and_then(|s| s.process)
        .map(|p| {
            p.env
                .into_iter()
                .filter_map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_forms() {
        let want = PathBuf::from("/run/containerd/containerd.sock");
        assert_eq!(socket_path("/run/containerd/containerd.sock"), want);
        assert_eq!(socket_path("unix:///run/containerd/containerd.sock"), want);
        assert_eq!(socket_path("unix:/run/containerd/containerd.sock"), want);
    }

    #[test]
    fn env_from_containerd_and_crio_info() {
        let containerd = r#"{"pid":1,"config":{"envs":[{"key":"EXITORDER_EXIT_PRIORITY","value":"2"}]},
            "runtimeSpec":{"process":{"env":["PATH=/bin","EXITORDER_EXIT_PRIORITY=2"]}}}"#;
        assert_eq!(
            env_from_info(containerd).unwrap(),
            vec![("EXITORDER_EXIT_PRIORITY".to_owned(), "2".to_owned())]
        );
        let crio = r#"{"runtimeSpec":{"process":{"env":["A=1=2","NOEQ"]}}}"#;
        assert_eq!(
            env_from_info(crio).unwrap(),
            vec![("A".to_owned(), "1=2".to_owned())]
        );
        assert!(env_from_info("{}").unwrap().is_empty());
        assert!(env_from_info("not json").is_err());
    }

    #[test]
    fn grace_from_container_annotation() {
        let mut pod = RtPod::default();
        assert_eq!(pod.grace_period(), None);
        pod.containers.push(RtContainer {
            id: "c".into(),
            name: "app".into(),
            attempt: 0,
            state: RunState::Running,
            created_at: 0,
            annotations: [(ANNOTATION_GRACE.to_owned(), "45".to_owned())].into(),
        });
        assert_eq!(pod.grace_period(), Some(Duration::from_secs(45)));
    }
}
