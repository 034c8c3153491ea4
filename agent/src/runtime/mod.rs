//! The container runtime, through the CRI: which pods and containers exist, their states,
//! annotations and env. Read-only calls, apart from the two a finished Job needs (`ExecSync`
//! of the entrypoint's shutdown in a sidecar, `StopContainer`): the agent never changes a
//! container's life for the exit handshake.
//!
//! Parts:
//! - [`kernel`]: exits as the kernel sees them (a pidfd per container);
//! - [`podcgroup`]: which containers a pod has started, from its cgroup;
//! - [`reader`]: the reads that keep the node view current, off the decision path;
//! - [`strain`]: whether a container was held back by its own limits (its cgroup's counters);
//! - [`source`]: how the agent learns of exits on this runtime: containerd's events or the CRI stream.

pub mod kernel;
pub mod podcgroup;
pub mod reader;
pub mod source;
pub mod strain;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use crate::cri::runtime_service_client::RuntimeServiceClient;
use crate::cri::{
    Container, ContainerFilter, ContainerState, ContainerStatusRequest, ContainerStatusResponse,
    ExecSyncRequest, ListContainersRequest, ListPodSandboxRequest, PodSandbox, PodSandboxFilter,
    StopContainerRequest, VersionRequest, VersionResponse,
};
use crate::decide::RunState;
use crate::pod::PodUid;
use crate::view::{Change, ContainerInfo, Listing, SandboxInfo};

/// Container annotation where the kubelet records the pod's terminationGracePeriodSeconds.
pub use exitorder_contract::kubelet::ANNOTATION_GRACE;
/// Container annotation where the kubelet records the container's preStop handler (JSON).
use exitorder_contract::kubelet::ANNOTATION_PRESTOP;
/// Label the kubelet puts on every container with its name in the pod spec.
pub use exitorder_contract::kubelet::LABEL_CONTAINER_NAME;
/// Label the kubelet puts on every sandbox and container with the pod's UID.
pub use exitorder_contract::kubelet::LABEL_POD_UID;

/// Per-call deadline: a runtime that hangs must not hold decisions (the deadline rule still
/// runs, and the next tick retries).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// A listing's: on a node saturated by a burst of deletions containerd takes seconds to list
/// (up to 4.7 s measured), and a listing given up on would be asked again at once.
const LIST_TIMEOUT: Duration = Duration::from_secs(15);
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

    /// Whether the call was given up on for taking too long (the runtime may be busy, not
    /// gone).
    pub fn timed_out(&self) -> bool {
        match self {
            RuntimeError::Call { status, .. } => matches!(
                status.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            _ => false,
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

fn run_state(raw: i32) -> RunState {
    match ContainerState::try_from(raw) {
        Ok(ContainerState::ContainerCreated) => RunState::Created,
        Ok(ContainerState::ContainerRunning) => RunState::Running,
        Ok(ContainerState::ContainerExited) => RunState::Exited,
        Ok(ContainerState::ContainerUnknown) | Err(_) => RunState::Unknown,
    }
}

/// The pod's grace period as the kubelet wrote it on a container: the pod's int64 verbatim,
/// bounded. Text that is no number at all is no grace period (the default applies).
fn grace(annotations: &HashMap<String, String>) -> Option<Duration> {
    match crate::decide::bounds::parse_seconds(annotations.get(ANNOTATION_GRACE)?) {
        crate::decide::bounds::Seconds::Bounded(d) => Some(d),
        crate::decide::bounds::Seconds::Junk => None,
    }
}

/// A container the kubelet made: its pod's UID and its name are in its labels. Others
/// (made by something else on the node) are not the agent's business, and neither is one
/// whose pod-UID label is no UID: any CRI client can write one, and the kubelet does only for
/// a static pod whose manifest sets such a `metadata.uid` (the API server generates UUIDs,
/// the kubelet a hash for a static pod without one). Such a pod could have no exit
/// directory in the share either, whose pod directories are pod UIDs.
fn container_info(
    id: String,
    labels: &HashMap<String, String>,
    annotations: &HashMap<String, String>,
    attempt: u32,
    created_at: i64,
    state: i32,
) -> Option<ContainerInfo> {
    Some(ContainerInfo {
        pod_uid: PodUid::parse(labels.get(LABEL_POD_UID)?).ok()?,
        name: labels.get(LABEL_CONTAINER_NAME)?.clone(),
        id,
        attempt,
        created_at,
        state: run_state(state),
        grace: grace(annotations),
        marks: annotations
            .get(ANNOTATION_PRESTOP)
            .is_some_and(|h| crate::kubelet::evidence::prestop_marks(h)),
    })
}

/// A container as the verbose status describes it: who it is, and its env.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    pub info: ContainerInfo,
    pub env: Vec<(String, String)>,
    /// The host paths of its writable mounts, as the runtime mounted them.
    pub writable: Vec<String>,
    /// Its first process, while it is created or runs (as the runtime's verbose status says: a
    /// pid of the runtime's pid namespace).
    pub pid: Option<i32>,
}

/// What the runtime says of a container's exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exited, with this status.
    Exited(i32),
    /// Created or running (or exited, but the runtime's status does not say so yet).
    NotYet,
    /// The runtime has no such container (removed): its status will never be known.
    Gone,
}

/// Now, Unix ns: when a listing was asked for.
fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
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
        Self::request_within(msg, CALL_TIMEOUT)
    }

    fn request_within<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(timeout);
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

    /// Every sandbox and container of the node (`pod`: of one pod only). Two calls whatever
    /// the number of pods.
    pub async fn list(&self, pod: Option<&PodUid>) -> Result<Listing, RuntimeError> {
        let asked_at_ns = now_ns();
        let asked = std::time::Instant::now();
        let selector: HashMap<String, String> = pod
            .map(|uid| (LABEL_POD_UID.to_owned(), uid.to_string()))
            .into_iter()
            .collect();
        let mut client = self.client.clone();
        let sandboxes = client
            .list_pod_sandbox(Self::request_within(
                ListPodSandboxRequest {
                    filter: pod.map(|_| PodSandboxFilter {
                        label_selector: selector.clone(),
                        ..Default::default()
                    }),
                },
                LIST_TIMEOUT,
            ))
            .await
            .map_err(RuntimeError::call("ListPodSandbox"))?
            .into_inner()
            .items;
        let containers = client
            .list_containers(Self::request_within(
                ListContainersRequest {
                    filter: pod.map(|_| ContainerFilter {
                        label_selector: selector.clone(),
                        ..Default::default()
                    }),
                },
                LIST_TIMEOUT,
            ))
            .await
            .map_err(RuntimeError::call("ListContainers"))?
            .into_inner()
            .containers;
        Ok(Listing {
            asked: Some(asked),
            ..listing(asked_at_ns, sandboxes, containers)
        })
    }

    /// Whether a container has exited, and with which status.
    pub async fn exit_status(&self, id: &str) -> Result<ExitStatus, RuntimeError> {
        let resp = self
            .client
            .clone()
            .container_status(Self::request(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            }))
            .await;
        match resp {
            Ok(r) => Ok(r
                .into_inner()
                .status
                .filter(|s| s.state == ContainerState::ContainerExited as i32)
                .map_or(ExitStatus::NotYet, |s| ExitStatus::Exited(s.exit_code))),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(ExitStatus::Gone),
            Err(s) => Err(RuntimeError::call("ContainerStatus")(s)),
        }
    }

    /// Runs `cmd` in the container and waits up to `timeout` for it: its exit code and
    /// output (stderr, else stdout, cut short).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<(i32, String), RuntimeError> {
        let secs = i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut req = tonic::Request::new(ExecSyncRequest {
            container_id: id.to_owned(),
            cmd,
            timeout: secs,
        });
        // The runtime's own timeout, with time for it to answer.
        req.set_timeout(crate::decide::bounds::sum(timeout, CALL_TIMEOUT));
        let resp = self
            .client
            .clone()
            .exec_sync(req)
            .await
            .map_err(RuntimeError::call("ExecSync"))?
            .into_inner();
        let out = if resp.stderr.is_empty() {
            resp.stdout
        } else {
            resp.stderr
        };
        let mut text = String::from_utf8_lossy(out.get(..512).unwrap_or(&out)).into_owned();
        text.truncate(text.trim_end().len());
        Ok((resp.exit_code, text))
    }

    /// Stops the container: TERM, then KILL after `grace`; returns once it has stopped.
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        let mut req = tonic::Request::new(StopContainerRequest {
            container_id: id.to_owned(),
            timeout: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
        });
        req.set_timeout(crate::decide::bounds::sum(grace, Duration::from_secs(10)));
        self.client
            .clone()
            .stop_container(req)
            .await
            .map_err(RuntimeError::call("StopContainer"))?;
        Ok(())
    }

    /// One container, from its verbose status (the CRI has no other call that returns a
    /// container's env). `None` when the runtime has no CRI container by that id: a
    /// sandbox's pause container, or one already removed.
    pub async fn describe(&self, id: &str) -> Result<Option<Described>, RuntimeError> {
        let resp = self
            .client
            .clone()
            .container_status(Self::request(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: true,
            }))
            .await;
        let resp = match resp {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(None),
            Err(s) => return Err(RuntimeError::call("ContainerStatus")(s)),
        };
        described(id, resp)
    }
}

/// The view's listing from the runtime's answers to ListPodSandbox and ListContainers
/// (asked at `asked_at_ns`): the sandboxes and containers the kubelet made, the rest left out.
pub fn listing(
    asked_at_ns: i64,
    sandboxes: Vec<PodSandbox>,
    containers: Vec<Container>,
) -> Listing {
    Listing {
        asked_at_ns,
        asked: None,
        sandboxes: sandboxes
            .into_iter()
            .filter_map(|sb| {
                let uid = PodUid::parse(sb.labels.get(LABEL_POD_UID)?).ok()?;
                let (namespace, name) = sb
                    .metadata
                    .map(|m| (m.namespace, m.name))
                    .unwrap_or_default();
                Some(SandboxInfo {
                    id: sb.id,
                    pod_uid: uid,
                    namespace,
                    name,
                    annotations: sb.annotations,
                    created_at: sb.created_at,
                })
            })
            .collect(),
        containers: containers
            .into_iter()
            .filter_map(|c| {
                let attempt = c.metadata.as_ref().map_or(0, |m| m.attempt);
                container_info(
                    c.id,
                    &c.labels,
                    &c.annotations,
                    attempt,
                    c.created_at,
                    c.state,
                )
            })
            .collect(),
    }
}

/// Container `id` from the runtime's verbose ContainerStatus answer: `None` when it is no
/// container the kubelet made; an error when its verbose info is unreadable.
pub fn described(
    id: &str,
    resp: ContainerStatusResponse,
) -> Result<Option<Described>, RuntimeError> {
    let Some(st) = resp.status else {
        return Ok(None);
    };
    let attempt = st.metadata.as_ref().map_or(0, |m| m.attempt);
    let Some(info) = container_info(
        id.to_owned(),
        &st.labels,
        &st.annotations,
        attempt,
        st.created_at,
        st.state,
    ) else {
        return Ok(None);
    };
    let (env, pid) = match resp.info.get("info") {
        Some(text) => parse_info(text).map_err(|reason| RuntimeError::BadInfo {
            id: id.to_owned(),
            reason,
        })?,
        None => (Vec::new(), None),
    };
    // A created container's process is already there (runc's init, waiting to exec the
    // container's command under the same pid); an exited one's is gone.
    let pid = pid.filter(|_| {
        matches!(
            info.state,
            crate::decide::RunState::Running | crate::decide::RunState::Created
        )
    });
    let writable = st
        .mounts
        .iter()
        .filter(|m| !m.readonly)
        .take(crate::handshake::breach::MAX_MOUNTS)
        .map(|m| m.host_path.clone())
        .collect();
    Ok(Some(Described {
        info,
        env,
        writable,
        pid,
    }))
}

impl Described {
    /// What the share's breach check needs of it.
    pub fn mount_check(&self) -> crate::handshake::breach::MountCheck {
        crate::handshake::breach::MountCheck {
            id: self.info.id.clone(),
            pod_uid: self.info.pod_uid.clone(),
            container: self.info.name.clone(),
            writable: self.writable.clone(),
        }
    }

    /// The view's change: the container, with the exit priority its env gives.
    pub fn change(self) -> Change {
        Change::Described {
            env: crate::decide::priority::from_env(
                self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            ),
            info: self.info,
        }
    }
}

#[derive(serde::Deserialize)]
struct VerboseInfo {
    /// Read as any JSON: a pid that is no integer is no process, not an unreadable status
    /// (the env beside it still counts).
    #[serde(default)]
    pid: Option<serde_json::Value>,
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
/// A container's env, as (name, value) pairs.
type Env = Vec<(String, String)>;

/// The env and the first process's pid from a verbose status's `info`.
fn parse_info(info: &str) -> Result<(Env, Option<i32>), String> {
    let info: VerboseInfo = serde_json::from_str(info).map_err(|e| e.to_string())?;
    // 0 (not running) and anything out of range are no process.
    let pid = info
        .pid
        .as_ref()
        .and_then(serde_json::Value::as_i64)
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 0);
    Ok((env_of(info.config, info.runtime_spec), pid))
}

/// The env the kubelet gave: the CRI config's, else the OCI spec's.
fn env_of(config: Option<InfoConfig>, spec: Option<InfoSpec>) -> Env {
    if let Some(cfg) = config.filter(|c| !c.envs.is_empty()) {
        return cfg.envs.into_iter().map(|e| (e.key, e.value)).collect();
    }
    spec.and_then(|s| s.process)
        .map(|p| {
            p.env
                .into_iter()
                .filter_map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
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
            parse_info(containerd).unwrap().0,
            vec![("EXITORDER_EXIT_PRIORITY".to_owned(), "2".to_owned())]
        );
        let crio = r#"{"runtimeSpec":{"process":{"env":["A=1=2","NOEQ"]}}}"#;
        assert_eq!(
            parse_info(crio).unwrap().0,
            vec![("A".to_owned(), "1=2".to_owned())]
        );
        assert!(parse_info("{}").unwrap().0.is_empty());
        assert_eq!(parse_info(r#"{"pid": 4242}"#).unwrap().1, Some(4242));
        for no_process in [
            r#"{"pid": 0}"#,
            r#"{"pid": -1}"#,
            r#"{"pid": 99999999999}"#,
            r#"{"pid": "12"}"#,
            r#"{"pid": 1.5}"#,
            r#"{"pid": null}"#,
            r#"{"pid": {"x": 1}}"#,
            "{}",
        ] {
            assert_eq!(parse_info(no_process).unwrap().1, None, "{no_process}");
        }
        assert!(parse_info("not json").is_err());
    }

    #[test]
    fn kubelet_containers_only_with_their_grace() {
        const UID: &str = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";
        let labelled = |uid: &str| -> HashMap<String, String> {
            [
                (LABEL_POD_UID.to_owned(), uid.to_owned()),
                (LABEL_CONTAINER_NAME.to_owned(), "app".to_owned()),
            ]
            .into()
        };
        let annotations: HashMap<String, String> =
            [(ANNOTATION_GRACE.to_owned(), "45".to_owned())].into();
        let c = container_info("c".into(), &labelled(UID), &annotations, 2, 7, 1).unwrap();
        assert_eq!(
            (c.pod_uid.as_str(), c.name.as_str(), c.attempt),
            (UID, "app", 2)
        );
        assert_eq!(c.state, RunState::Running);
        assert_eq!(c.grace, Some(Duration::from_secs(45)));
        assert!(container_info("c".into(), &HashMap::new(), &annotations, 0, 0, 1).is_none());
        // A pod-UID label no kubelet wrote: not a pod's container.
        for junk in ["u", "../../etc", "0F5C7A1E-8D2B-4C3E-9F00-123456789ABC"] {
            assert!(container_info("c".into(), &labelled(junk), &annotations, 0, 0, 1).is_none());
        }
    }
}
