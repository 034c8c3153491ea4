//! Pods run and deleted the way the kubelet does it, through the CRI.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tonic::transport::Channel;

use exitorder::cri::runtime_service_client::RuntimeServiceClient;
use exitorder::cri::{
    ContainerConfig, ContainerMetadata, ContainerStatusRequest, CreateContainerRequest,
    ExecSyncRequest, ImageSpec, KeyValue, LinuxContainerConfig, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use exitorder::runtime::{ANNOTATION_GRACE, LABEL_CONTAINER_NAME, LABEL_POD_UID};
use exitorder::share::{ContainerName, PodUid, ENTRYPOINT_NAME};

use super::cleanup::{remove_cgroup, shim_alive, wait_shim_gone, SHIM_EXIT_TIMEOUT};
use super::image::{mkdir, BUSYBOX_IMAGE};
use super::probe::{ExitFileEvents, ExitFileProbe};
use super::{NodeShared, TestbedError};

/// Where a container's own share directory is mounted (the webhook's choice too).
pub const EXIT_DIR: &str = "/var/run/exitorder";
/// Where the share's `bin/` is mounted, read-only.
pub const ENTRYPOINT_BIN_DIR: &str = "/var/run/exitorder-bin";

const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// The kubelet's minimum for what is left of the grace period after a preStop hook.
const MIN_STOP_GRACE_SECS: i64 = 2;
/// Sandbox and container set-up calls; image pulls never happen here, so these are quick.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// One container of a pod.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    pub name: String,
    /// Run as `sh -c SCRIPT` in the busybox image.
    pub script: String,
    pub env: Vec<(String, String)>,
    /// Whether it gets the injected preStop `exitorder-entrypoint wait` hook.
    pub injected: bool,
}

impl ContainerSpec {
    pub fn new(name: impl Into<String>, script: impl Into<String>) -> Self {
        ContainerSpec {
            name: name.into(),
            script: script.into(),
            env: Vec::new(),
            injected: false,
        }
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Gives the container the preStop hook the webhook injects into sidecars.
    pub fn injected(mut self) -> Self {
        self.injected = true;
        self
    }
}

/// A pod as the kubelet receives it from the API server (only what matters here).
#[derive(Debug, Clone)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub grace_seconds: u64,
    pub containers: Vec<ContainerSpec>,
}

impl PodSpec {
    /// A pod in namespace `default` with a fresh UID and Kubernetes' default grace (30 s).
    pub fn new(name: impl Into<String>) -> Self {
        PodSpec {
            name: name.into(),
            namespace: "default".to_owned(),
            uid: super::random_uuid(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            grace_seconds: 30,
            containers: Vec::new(),
        }
    }

    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Sets `exitorder.io/container-exit-priority` to these priorities.
    pub fn exit_priorities(self, priorities: &[(&str, u8)]) -> Self {
        let map: serde_json::Map<String, serde_json::Value> = priorities
            .iter()
            .map(|(n, p)| ((*n).to_owned(), serde_json::Value::from(*p)))
            .collect();
        self.annotation(
            exitorder::priority::ANNOTATION,
            serde_json::Value::Object(map).to_string(),
        )
    }

    pub fn grace(mut self, seconds: u64) -> Self {
        self.grace_seconds = seconds;
        self
    }

    pub fn container(mut self, c: ContainerSpec) -> Self {
        self.containers.push(c);
        self
    }

    /// Whether the webhook would have touched this pod: it mounts the share into every
    /// container of a pod with at least one injected container, and into none otherwise.
    pub fn opted_in(&self) -> bool {
        self.containers.iter().any(|c| c.injected)
    }

    fn validate(&self) -> Result<(), TestbedError> {
        PodUid::parse(&self.uid).map_err(|e| TestbedError::BadSpec(e.to_string()))?;
        if self.containers.is_empty() {
            return Err(TestbedError::BadSpec(format!(
                "pod {} has no containers",
                self.name
            )));
        }
        let mut seen = BTreeSet::new();
        for c in &self.containers {
            ContainerName::parse(&c.name).map_err(|e| TestbedError::BadSpec(e.to_string()))?;
            if !seen.insert(c.name.as_str()) {
                return Err(TestbedError::BadSpec(format!(
                    "container name {:?} used twice",
                    c.name
                )));
            }
        }
        Ok(())
    }

    fn prestop_command(&self) -> Vec<String> {
        vec![
            format!("{ENTRYPOINT_BIN_DIR}/{ENTRYPOINT_NAME}"),
            "wait".to_owned(),
            "--timeout".to_owned(),
            format!("{}s", self.grace_seconds),
        ]
    }
}

/// What happened to one container while its pod was deleted.
#[derive(Debug, Clone)]
pub struct ContainerRecord {
    pub name: String,
    pub id: String,
    pub prestop: Option<HookRecord>,
    /// When StopContainer was issued (the runtime sends TERM at once).
    pub term_sent: Instant,
    /// The StopContainer timeout given, in seconds (the rest of the grace period).
    pub stop_timeout_secs: i64,
    pub stop_returned: Instant,
    pub stop_error: Option<String>,
    /// When the runtime saw the container exit (Unix ns, the runtime's own clock).
    pub finished_at_ns: i64,
    pub exit_code: i32,
    pub reason: String,
}

/// A preStop hook run through ExecSync.
#[derive(Debug, Clone)]
pub struct HookRecord {
    pub command: Vec<String>,
    pub started: Instant,
    pub returned: Instant,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The ExecSync error, if the call itself failed (the kubelet logs it and goes on).
    pub error: Option<String>,
}

impl HookRecord {
    pub fn took(&self) -> Duration {
        self.returned.saturating_duration_since(self.started)
    }
}

/// The timeline of one pod deletion.
#[derive(Debug, Clone)]
pub struct Deletion {
    pub pod_uid: String,
    pub started: Instant,
    /// `started` on the wall clock (Unix ns), to place the runtime's timestamps.
    pub started_unix_ns: i64,
    pub containers: Vec<ContainerRecord>,
    pub sandbox_removed: Instant,
    /// Exit-file events per container, when the deletion was probed.
    pub exit_files: Option<BTreeMap<String, ExitFileEvents>>,
    /// When the pod's share directory appeared during the deletion, if it did.
    pub pod_dir_created: Option<Instant>,
}

impl Deletion {
    pub fn container(&self, name: &str) -> Option<&ContainerRecord> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// Milliseconds from the start of the deletion to `at`.
    pub fn ms(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.started).as_secs_f64() * 1e3
    }

    /// Milliseconds from the start of the deletion to when the runtime saw `name` exit.
    pub fn finished_ms(&self, name: &str) -> Option<f64> {
        self.container(name)
            .map(|c| (c.finished_at_ns - self.started_unix_ns) as f64 / 1e6)
    }

    /// Container names in the order the runtime saw them exit.
    pub fn exit_order(&self) -> Vec<&str> {
        let mut cs: Vec<&ContainerRecord> = self.containers.iter().collect();
        cs.sort_by_key(|c| c.finished_at_ns);
        cs.into_iter().map(|c| c.name.as_str()).collect()
    }

    /// Every step with its offset, for failure messages.
    pub fn describe(&self) -> String {
        let mut lines = Vec::new();
        for c in &self.containers {
            if let Some(h) = &c.prestop {
                lines.push(format!(
                    "{}: preStop {:.0}..{:.0} ms exit={:?} err={:?} stderr={:?}",
                    c.name,
                    self.ms(h.started),
                    self.ms(h.returned),
                    h.exit_code,
                    h.error,
                    h.stderr.trim()
                ));
            }
            lines.push(format!(
                "{}: TERM {:.0} ms (timeout {} s), StopContainer returned {:.0} ms, \
                 finished {:.0} ms, exit code {}{}",
                c.name,
                self.ms(c.term_sent),
                c.stop_timeout_secs,
                self.ms(c.stop_returned),
                self.finished_ms(&c.name).unwrap_or(f64::NAN),
                c.exit_code,
                c.stop_error
                    .as_ref()
                    .map(|e| format!(", stop error: {e}"))
                    .unwrap_or_default()
            ));
        }
        if let Some(files) = &self.exit_files {
            for (name, ev) in files {
                let show =
                    |t: Option<Instant>| t.map_or("-".to_owned(), |t| format!("{:.0}", self.ms(t)));
                lines.push(format!(
                    "{name}: exit file created {} allow {} removed {} (ms)",
                    show(ev.created),
                    show(ev.allowed),
                    show(ev.removed)
                ));
            }
        }
        lines.join("\n")
    }
}

/// What to record while deleting.
#[derive(Debug, Clone)]
pub struct DeleteOptions {
    /// Watch the pod's exit files (one inotify instance per deletion; turn off when deleting
    /// hundreds of pods at once).
    pub probe_exit_files: bool,
}

impl Default for DeleteOptions {
    fn default() -> Self {
        DeleteOptions {
            probe_exit_files: true,
        }
    }
}

struct RunningContainer {
    spec: ContainerSpec,
    id: String,
}

/// A pod running on a [`super::Node`]. Dropping it without [`Pod::delete`] leaves it running
/// until the node is torn down.
pub struct Pod {
    node: Arc<NodeShared>,
    spec: PodSpec,
    sandbox_id: String,
    containers: Vec<RunningContainer>,
    shim_pid: Option<u32>,
}

fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(timeout);
    req
}

fn now_unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn host_network() -> NamespaceOption {
    // Host network: the node has no CNI. The hostname must then stay empty, or runc refuses
    // to set it without a private UTS namespace.
    NamespaceOption {
        network: NamespaceMode::Node as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        target_id: String::new(),
    }
}

impl Pod {
    pub(crate) async fn run(node: Arc<NodeShared>, spec: PodSpec) -> Result<Pod, TestbedError> {
        spec.validate()?;
        let mut client = node.client();
        let sandbox_config = Self::sandbox_config(&node, &spec)?;
        let sandbox_id = client
            .run_pod_sandbox(request(
                RunPodSandboxRequest {
                    config: Some(sandbox_config.clone()),
                    runtime_handler: String::new(),
                },
                SETUP_TIMEOUT,
            ))
            .await
            .map_err(TestbedError::cri("RunPodSandbox"))?
            .into_inner()
            .pod_sandbox_id;
        let mut pod = Pod {
            shim_pid: super::cleanup::shim_pid(&node.state_dir, &sandbox_id),
            node,
            spec,
            sandbox_id,
            containers: Vec::new(),
        };
        if let Err(e) = pod.start_containers(&mut client, &sandbox_config).await {
            pod.remove_sandbox(&mut client).await;
            return Err(e);
        }
        Ok(pod)
    }

    fn sandbox_config(node: &NodeShared, spec: &PodSpec) -> Result<PodSandboxConfig, TestbedError> {
        let log_directory = node
            .log_dir
            .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid));
        mkdir(&log_directory, 0o755)?;
        let mut labels: BTreeMap<String, String> = spec.labels.clone();
        labels.insert(LABEL_POD_NAME.to_owned(), spec.name.clone());
        labels.insert(LABEL_POD_NAMESPACE.to_owned(), spec.namespace.clone());
        labels.insert(LABEL_POD_UID.to_owned(), spec.uid.clone());
        // The kubelet passes the pod's annotations plus the two it adds itself.
        let mut annotations = spec.annotations.clone();
        annotations.insert("kubernetes.io/config.source".to_owned(), "api".to_owned());
        annotations.insert(
            "kubernetes.io/config.seen".to_owned(),
            humantime::format_rfc3339_nanos(SystemTime::now()).to_string(),
        );
        Ok(PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: 0,
            }),
            hostname: String::new(),
            log_directory: log_directory.to_string_lossy().into_owned(),
            dns_config: None,
            labels: labels.into_iter().collect(),
            annotations: annotations.into_iter().collect(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("/{}", Self::cgroup_rel(node, spec)),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(host_network()),
                    run_as_user: None,
                    readonly_rootfs: false,
                    privileged: false,
                }),
                sysctls: Default::default(),
            }),
        })
    }

    fn cgroup_rel(node: &NodeShared, spec: &PodSpec) -> String {
        format!("{}/pod{}", node.cgroup_root, spec.uid)
    }

    async fn start_containers(
        &mut self,
        client: &mut RuntimeServiceClient<Channel>,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<(), TestbedError> {
        let opted_in = self.spec.opted_in();
        if opted_in {
            // The agent installs the entrypoint here; the bind mount needs the directory
            // even before that.
            mkdir(&self.node.share_dir.join("bin"), 0o755)?;
        }
        // The kubelet starts a pod's containers one after the other, in spec order.
        for c in self.spec.containers.clone() {
            if opted_in {
                // The kubelet creates a subPathExpr directory (root-owned, 0750) before the
                // container starts; the agent opens it up for non-root sidecars.
                mkdir(&self.container_dir(&c.name), 0o750)?;
            }
            mkdir(
                &PathBuf::from(&sandbox_config.log_directory).join(&c.name),
                0o755,
            )?;
            let config = self.container_config(&c, opted_in);
            let id = client
                .create_container(request(
                    CreateContainerRequest {
                        pod_sandbox_id: self.sandbox_id.clone(),
                        config: Some(config),
                        sandbox_config: Some(sandbox_config.clone()),
                    },
                    SETUP_TIMEOUT,
                ))
                .await
                .map_err(TestbedError::cri("CreateContainer"))?
                .into_inner()
                .container_id;
            self.containers.push(RunningContainer {
                spec: c,
                id: id.clone(),
            });
            client
                .start_container(request(
                    StartContainerRequest { container_id: id },
                    SETUP_TIMEOUT,
                ))
                .await
                .map_err(TestbedError::cri("StartContainer"))?;
        }
        Ok(())
    }

    fn container_config(&self, c: &ContainerSpec, opted_in: bool) -> ContainerConfig {
        let spec = &self.spec;
        let labels: BTreeMap<String, String> = [
            (LABEL_CONTAINER_NAME, c.name.clone()),
            (LABEL_POD_NAME, spec.name.clone()),
            (LABEL_POD_NAMESPACE, spec.namespace.clone()),
            (LABEL_POD_UID, spec.uid.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let mut annotations: BTreeMap<String, String> = [
            ("io.kubernetes.container.hash", container_hash(c)),
            ("io.kubernetes.container.restartCount", "0".to_owned()),
            (
                "io.kubernetes.container.terminationMessagePath",
                "/dev/termination-log".to_owned(),
            ),
            (
                "io.kubernetes.container.terminationMessagePolicy",
                "File".to_owned(),
            ),
            (ANNOTATION_GRACE, spec.grace_seconds.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        if c.injected {
            annotations.insert(
                "io.kubernetes.container.preStopHandler".to_owned(),
                serde_json::json!({"exec": {"command": spec.prestop_command()}}).to_string(),
            );
        }
        let mounts = if opted_in {
            vec![
                Mount {
                    container_path: EXIT_DIR.to_owned(),
                    host_path: self.container_dir(&c.name).to_string_lossy().into_owned(),
                    readonly: false,
                    selinux_relabel: false,
                    propagation: 0,
                },
                Mount {
                    container_path: ENTRYPOINT_BIN_DIR.to_owned(),
                    host_path: self
                        .node
                        .share_dir
                        .join("bin")
                        .to_string_lossy()
                        .into_owned(),
                    readonly: true,
                    selinux_relabel: false,
                    propagation: 0,
                },
            ]
        } else {
            Vec::new()
        };
        ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: c.name.clone(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: BUSYBOX_IMAGE.to_owned(),
                ..Default::default()
            }),
            command: vec!["/bin/sh".to_owned(), "-c".to_owned(), c.script.clone()],
            args: Vec::new(),
            working_dir: String::new(),
            envs: c
                .env
                .iter()
                .map(|(k, v)| KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            mounts,
            labels: labels.into_iter().collect(),
            annotations: annotations.into_iter().collect(),
            log_path: format!("{}/0.log", c.name),
            stdin: false,
            stdin_once: false,
            tty: false,
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    namespace_options: Some(host_network()),
                    ..Default::default()
                }),
            }),
        }
    }

    pub fn uid(&self) -> &str {
        &self.spec.uid
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn spec(&self) -> &PodSpec {
        &self.spec
    }

    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    pub fn container_id(&self, name: &str) -> Option<&str> {
        self.containers
            .iter()
            .find(|c| c.spec.name == name)
            .map(|c| c.id.as_str())
    }

    /// The container's directory in the share (its `/var/run/exitorder`).
    pub fn container_dir(&self, name: &str) -> PathBuf {
        self.node
            .share_dir
            .join("pods")
            .join(&self.spec.uid)
            .join(name)
    }

    /// What the container wrote to stdout and stderr (the CRI log file, raw).
    pub fn container_log(&self, name: &str) -> String {
        let path = self
            .node
            .log_dir
            .join(format!(
                "{}_{}_{}",
                self.spec.namespace, self.spec.name, self.spec.uid
            ))
            .join(name)
            .join("0.log");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Waits until `container` has written `needle` to its output.
    pub async fn wait_output(
        &self,
        container: &str,
        needle: &str,
        timeout: Duration,
    ) -> Result<(), TestbedError> {
        let deadline = Instant::now() + timeout;
        while !self.container_log(container).contains(needle) {
            if Instant::now() >= deadline {
                return Err(TestbedError::Timeout {
                    what: format!("output {needle:?} from container {container}"),
                    waited: timeout,
                    context: format!("; its output so far: {:?}", self.container_log(container)),
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Waits until every container's script has set its TERM trap (printed
    /// [`super::script::READY`]): a shell stopped before that would ignore TERM as PID 1.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), TestbedError> {
        for c in &self.containers {
            self.wait_output(&c.spec.name, super::script::READY, timeout)
                .await?;
        }
        Ok(())
    }

    /// Deletes the pod the way the kubelet does, recording every step.
    pub async fn delete(self) -> Result<Deletion, TestbedError> {
        self.delete_with(DeleteOptions::default()).await
    }

    /// The kubelet's termination: for every container at once, the preStop hook (if any)
    /// through ExecSync with the grace period as timeout, then StopContainer with what is
    /// left of the grace period (at least 2 s); then the sandbox is stopped and removed.
    /// Each container's exit time and code are read from the runtime before the removal.
    pub async fn delete_with(self, opts: DeleteOptions) -> Result<Deletion, TestbedError> {
        let mut client = self.node.client();
        let names: Vec<String> = self
            .containers
            .iter()
            .map(|c| c.spec.name.clone())
            .collect();
        // A probe that cannot start (inotify instances used up) only costs the exit-file
        // timeline, not the deletion.
        let probe = if opts.probe_exit_files {
            ExitFileProbe::start(&self.node.share_dir.join("pods"), &self.spec.uid, &names).ok()
        } else {
            None
        };
        let started = Instant::now();
        let started_unix_ns = now_unix_ns();
        let grace = self.spec.grace_seconds;
        let prestop = self.spec.prestop_command();
        let mut tasks = tokio::task::JoinSet::new();
        for c in &self.containers {
            let hook = c.spec.injected.then(|| prestop.clone());
            tasks.spawn(kill_container(
                self.node.client(),
                c.spec.name.clone(),
                c.id.clone(),
                hook,
                grace,
            ));
        }
        let mut killed = Vec::new();
        while let Some(res) = tasks.join_next().await {
            match res {
                Ok(rec) => killed.push(rec),
                Err(e) => {
                    self.remove_sandbox(&mut client).await;
                    return Err(TestbedError::Task(e.to_string()));
                }
            }
        }
        let mut containers = Vec::with_capacity(killed.len());
        for name in &names {
            let Some(mut rec) = killed.iter().find(|r| &r.name == name).cloned() else {
                continue;
            };
            match client
                .container_status(request(
                    ContainerStatusRequest {
                        container_id: rec.id.clone(),
                        verbose: false,
                    },
                    SETUP_TIMEOUT,
                ))
                .await
            {
                Ok(resp) => {
                    if let Some(st) = resp.into_inner().status {
                        rec.finished_at_ns = st.finished_at;
                        rec.exit_code = st.exit_code;
                        rec.reason = st.reason;
                    }
                }
                Err(s) => {
                    self.remove_sandbox(&mut client).await;
                    return Err(TestbedError::cri("ContainerStatus")(s));
                }
            }
            containers.push(rec);
        }
        let (exit_files, pod_dir_created) = match probe {
            Some(p) => {
                let (files, dir) = p.finish();
                (Some(files), dir)
            }
            None => (None, None),
        };
        self.remove_sandbox_checked(&mut client).await?;
        Ok(Deletion {
            pod_uid: self.spec.uid.clone(),
            started,
            started_unix_ns,
            containers,
            sandbox_removed: Instant::now(),
            exit_files,
            pod_dir_created,
        })
    }

    /// StopPodSandbox + RemovePodSandbox, then the shim must be gone and the pod's cgroups
    /// are removed.
    async fn remove_sandbox_checked(
        &self,
        client: &mut RuntimeServiceClient<Channel>,
    ) -> Result<(), TestbedError> {
        let stop = client
            .stop_pod_sandbox(request(
                StopPodSandboxRequest {
                    pod_sandbox_id: self.sandbox_id.clone(),
                },
                SETUP_TIMEOUT,
            ))
            .await
            .map_err(TestbedError::cri("StopPodSandbox"));
        let remove = client
            .remove_pod_sandbox(request(
                RemovePodSandboxRequest {
                    pod_sandbox_id: self.sandbox_id.clone(),
                },
                SETUP_TIMEOUT,
            ))
            .await
            .map_err(TestbedError::cri("RemovePodSandbox"));
        let shim_gone = match self.shim_pid {
            Some(pid) => wait_shim_gone(pid, SHIM_EXIT_TIMEOUT).await,
            None => true,
        };
        let cgroup_problems = remove_cgroup(&Self::cgroup_rel(&self.node, &self.spec)).await;
        stop?;
        remove?;
        if !shim_gone {
            if let Some(pid) = self.shim_pid.filter(|p| shim_alive(*p)) {
                return Err(TestbedError::ShimLeft {
                    pod: self.spec.uid.clone(),
                    pid,
                    waited: SHIM_EXIT_TIMEOUT,
                });
            }
        }
        if !cgroup_problems.is_empty() {
            return Err(TestbedError::Teardown(cgroup_problems));
        }
        Ok(())
    }

    /// Best effort, on the way out of a failed run or delete.
    async fn remove_sandbox(&self, client: &mut RuntimeServiceClient<Channel>) {
        let _ = self.remove_sandbox_checked(client).await;
    }
}

/// A stable stand-in for the kubelet's container hash.
fn container_hash(c: &ContainerSpec) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    c.name.hash(&mut h);
    c.script.hash(&mut h);
    c.env.hash(&mut h);
    c.injected.hash(&mut h);
    format!("{:08x}", h.finish() & 0xffff_ffff)
}

async fn kill_container(
    mut client: RuntimeServiceClient<Channel>,
    name: String,
    id: String,
    hook: Option<Vec<String>>,
    grace_secs: u64,
) -> ContainerRecord {
    let grace = i64::try_from(grace_secs).unwrap_or(i64::MAX);
    let mut stop_timeout = grace;
    let prestop = match hook {
        Some(cmd) => {
            let t0 = Instant::now();
            let res = client
                .exec_sync(request(
                    ExecSyncRequest {
                        container_id: id.clone(),
                        cmd: cmd.clone(),
                        timeout: grace,
                    },
                    Duration::from_secs(grace_secs.saturating_add(10)),
                ))
                .await;
            let returned = Instant::now();
            // The kubelet takes the hook's whole seconds off the grace period, and leaves at
            // least 2 s for the stop.
            let hook_secs = i64::try_from(returned.duration_since(t0).as_secs()).unwrap_or(0);
            stop_timeout = (grace - hook_secs).max(MIN_STOP_GRACE_SECS);
            Some(match res {
                Ok(r) => {
                    let r = r.into_inner();
                    HookRecord {
                        command: cmd,
                        started: t0,
                        returned,
                        exit_code: Some(r.exit_code),
                        stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
                        error: None,
                    }
                }
                Err(s) => HookRecord {
                    command: cmd,
                    started: t0,
                    returned,
                    exit_code: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    error: Some(s.to_string()),
                },
            })
        }
        None => None,
    };
    let term_sent = Instant::now();
    let stop = client
        .stop_container(request(
            StopContainerRequest {
                container_id: id.clone(),
                timeout: stop_timeout,
            },
            Duration::from_secs(u64::try_from(stop_timeout).unwrap_or(0) + 30),
        ))
        .await;
    ContainerRecord {
        name,
        id,
        prestop,
        term_sent,
        stop_timeout_secs: stop_timeout,
        stop_returned: Instant::now(),
        stop_error: stop.err().map(|s| s.to_string()),
        finished_at_ns: 0,
        exit_code: -1,
        reason: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_builders_and_validation() {
        let spec = PodSpec::new("web")
            .grace(8)
            .exit_priorities(&[("proxy", 1)])
            .container(ContainerSpec::new("app", "sleep 1"))
            .container(ContainerSpec::new("proxy", "sleep 1").injected());
        assert!(spec.opted_in());
        assert_eq!(
            spec.annotations.get(exitorder::priority::ANNOTATION).unwrap(),
            r#"{"proxy":1}"#
        );
        assert_eq!(
            spec.prestop_command(),
            [
                "/var/run/exitorder-bin/exitorder-entrypoint",
                "wait",
                "--timeout",
                "8s"
            ]
        );
        spec.validate().unwrap();
        let dup = spec.clone().container(ContainerSpec::new("app", "true"));
        assert!(dup.validate().is_err());
        let bad = PodSpec::new("x").container(ContainerSpec::new("Bad_Name", "true"));
        assert!(bad.validate().is_err());
        assert!(PodSpec::new("empty").validate().is_err());
    }
}
