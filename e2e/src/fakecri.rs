//! An in-process fake CRI runtime (tonic over a unix socket) for what a real containerd 1.6
//! cannot show on demand: exact states, env-only priorities, unknown pods, failing calls.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use exitorder::cri::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use exitorder::cri::*;
use exitorder::runtime::{ANNOTATION_GRACE, LABEL_CONTAINER_NAME, LABEL_POD_UID};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

/// Namespace of every fake pod.
pub const POD_NAMESPACE: &str = "default";

/// Name of the fake pod with this UID (what its sandbox metadata says).
pub fn pod_name(uid: &str) -> String {
    format!("pod-{uid}")
}

#[derive(Clone, Debug)]
pub struct FakeContainer {
    pub id: String,
    pub pod_uid: String,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: i64,
    pub envs: Vec<(String, String)>,
    pub annotations: HashMap<String, String>,
    /// What ContainerStatus says once the container has exited.
    pub exit_code: i32,
}

#[derive(Clone, Debug)]
pub struct FakeSandbox {
    pub id: String,
    pub uid: String,
    pub annotations: HashMap<String, String>,
    pub created_at: i64,
}

#[derive(Default)]
pub struct State {
    pub sandboxes: Vec<FakeSandbox>,
    pub containers: Vec<FakeContainer>,
    /// When set, every call fails with this code.
    pub fail_with: Option<tonic::Code>,
    /// ContainerStatus of these container ids fails (Unavailable).
    pub fail_status_of: std::collections::HashSet<String>,
    pub list_calls: u64,
    /// ContainerStatus of these ids waits until the gate opens (a runtime slow to answer).
    pub held_status: HashMap<String, Arc<tokio::sync::Semaphore>>,
    /// ContainerStatus calls made, by id.
    pub status_calls_of: HashMap<String, u64>,
    /// What Version answers (default "fake", so the agent polls).
    pub runtime_name: Option<(String, String)>,
    /// The CRI event stream's feed, once a test turns events on.
    pub events: Option<tokio::sync::broadcast::Sender<ContainerEventResponse>>,
    pub events_unimplemented: bool,
    pub subscriptions: u64,
    /// StopContainer calls made, by id.
    pub stopped: Vec<String>,
    /// ExecSync calls made: the id, and the container's state when the call came.
    pub execs: Vec<(String, ContainerState)>,
    seq: i64,
}

#[derive(Clone, Default)]
pub struct FakeCri {
    pub state: Arc<Mutex<State>>,
}

pub struct Served {
    pub socket: PathBuf,
    pub cri: FakeCri,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeCri {
    /// Serves the fake on `socket` until the returned handle is dropped.
    pub fn serve(self, socket: &Path) -> Served {
        let listener = tokio::net::UnixListener::bind(socket).expect("bind fake CRI socket");
        let svc = RuntimeServiceServer::new(self.clone());
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await;
        });
        Served {
            socket: socket.to_owned(),
            cri: self,
            task,
        }
    }

    /// A creation time as the runtime gives it: the wall clock in ns (the agent compares it
    /// with when it asked for a listing), strictly increasing. A plain counter stood below
    /// every listing's time, so a listing asked before a pod existed, answered after the
    /// pod's own, removed the pod from the view.
    fn next(&self) -> i64 {
        let mut s = self.state.lock().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        s.seq = now.max(s.seq + 1);
        s.seq
    }

    /// Adds a pod sandbox with the pod's annotations.
    pub fn add_pod(&self, uid: &str, annotations: &[(&str, &str)]) {
        let n = self.next();
        self.state.lock().unwrap().sandboxes.push(FakeSandbox {
            id: format!("sb-{n}"),
            uid: uid.to_owned(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created_at: n,
        });
    }

    /// Adds a running container (attempt 0 unless given) and returns its id.
    pub fn add_container(&self, uid: &str, name: &str, attempt: u32, grace_secs: u64) -> String {
        let n = self.next();
        let id = format!("c-{name}-{n}");
        self.state.lock().unwrap().containers.push(FakeContainer {
            id: id.clone(),
            pod_uid: uid.to_owned(),
            name: name.to_owned(),
            attempt,
            state: ContainerState::ContainerRunning,
            created_at: n,
            envs: Vec::new(),
            annotations: [(ANNOTATION_GRACE.to_owned(), grace_secs.to_string())].into(),
            exit_code: 0,
        });
        id
    }

    /// Container `id` (which must exist) was created `ago` before now: one that has been
    /// running a while, as a container is by the time a probe fails.
    pub fn backdate(&self, id: &str, ago: std::time::Duration) {
        let ago = i64::try_from(ago.as_nanos()).unwrap_or(i64::MAX);
        self.change(id, |c| c.created_at = c.created_at.saturating_sub(ago));
    }

    /// Container `id` (which must exist) has this preStop, as the kubelet records it on the
    /// container (`io.kubernetes.container.preStopHandler`, the handler's JSON).
    pub fn set_prestop(&self, id: &str, handler: &str) {
        self.change(id, |c| {
            c.annotations.insert(
                exitorder_contract::kubelet::ANNOTATION_PRESTOP.to_owned(),
                handler.to_owned(),
            );
        });
    }

    /// Changes container `id` (which must exist).
    fn change(&self, id: &str, f: impl FnOnce(&mut FakeContainer)) {
        let mut s = self.state.lock().unwrap();
        let c = s
            .containers
            .iter_mut()
            .find(|c| c.id == id)
            .expect("no such fake container");
        f(c);
    }

    /// The container exits with `code` (an event is sent when events are on).
    pub fn exit(&self, id: &str, code: i32) {
        self.change(id, |c| c.exit_code = code);
        self.set_state(id, ContainerState::ContainerExited);
    }

    pub fn set_env(&self, id: &str, key: &str, value: &str) {
        let mut s = self.state.lock().unwrap();
        if let Some(c) = s.containers.iter_mut().find(|c| c.id == id) {
            c.envs.push((key.to_owned(), value.to_owned()));
        }
    }

    pub fn set_state(&self, id: &str, state: ContainerState) {
        self.set_state_silently(id, state);
        let s = self.state.lock().unwrap();
        if let (Some(tx), ContainerState::ContainerExited) = (&s.events, state) {
            let _ = tx.send(ContainerEventResponse {
                container_id: id.to_owned(),
                container_event_type: ContainerEventType::ContainerStoppedEvent as i32,
                ..Default::default()
            });
        }
    }

    /// Makes the fake claim to be this runtime, with a CRI event stream.
    pub fn with_events(&self, name: &str, version: &str) {
        let mut s = self.state.lock().unwrap();
        s.runtime_name = Some((name.to_owned(), version.to_owned()));
        s.events = Some(tokio::sync::broadcast::channel(256).0);
    }

    /// Claims to be a runtime with events, but answers UNIMPLEMENTED when asked for them.
    pub fn with_unimplemented_events(&self, name: &str, version: &str) {
        self.with_events(name, version);
        self.state.lock().unwrap().events_unimplemented = true;
    }

    /// Ends every open event stream (as a runtime restart does); new subscriptions work.
    pub fn drop_event_streams(&self) {
        let mut s = self.state.lock().unwrap();
        if s.events.is_some() {
            s.events = Some(tokio::sync::broadcast::channel(256).0);
        }
    }

    /// Changes a container's state without telling event subscribers (an event lost).
    pub fn set_state_silently(&self, id: &str, state: ContainerState) {
        self.change(id, |c| c.state = state);
    }

    pub fn subscriptions(&self) -> u64 {
        self.state.lock().unwrap().subscriptions
    }

    /// Makes ContainerStatus of `id` fail (or work again).
    pub fn fail_status_of(&self, id: &str, fail: bool) {
        let mut s = self.state.lock().unwrap();
        if fail {
            s.fail_status_of.insert(id.to_owned());
        } else {
            s.fail_status_of.remove(id);
        }
    }

    /// Makes ContainerStatus of `id` wait until [`FakeCri::release_status_of`].
    pub fn hold_status_of(&self, id: &str) {
        self.state
            .lock()
            .unwrap()
            .held_status
            .insert(id.to_owned(), Arc::new(tokio::sync::Semaphore::new(0)));
    }

    /// Lets every held ContainerStatus of `id` answer.
    pub fn release_status_of(&self, id: &str) {
        if let Some(gate) = self.state.lock().unwrap().held_status.remove(id) {
            gate.close();
        }
    }

    /// ContainerStatus calls made so far, for any id.
    pub fn status_calls(&self) -> u64 {
        self.state.lock().unwrap().status_calls_of.values().sum()
    }

    /// ContainerStatus calls made for `id` so far.
    pub fn status_calls_of(&self, id: &str) -> u64 {
        self.state
            .lock()
            .unwrap()
            .status_calls_of
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    /// Sends an event for any id (a sandbox's, one the fake does not know...).
    pub fn send_event(&self, id: &str, kind: ContainerEventType) {
        let s = self.state.lock().unwrap();
        if let Some(tx) = &s.events {
            let _ = tx.send(ContainerEventResponse {
                container_id: id.to_owned(),
                container_event_type: kind as i32,
                ..Default::default()
            });
        }
    }

    /// Removes a container from the runtime.
    pub fn remove(&self, id: &str) {
        self.state.lock().unwrap().containers.retain(|c| c.id != id);
    }

    /// Removes a pod from the runtime: its containers and its sandbox.
    pub fn remove_pod(&self, uid: &str) {
        let mut s = self.state.lock().unwrap();
        s.containers.retain(|c| c.pod_uid != uid);
        s.sandboxes.retain(|sb| sb.uid != uid);
    }

    /// The containers StopContainer was called for, in order.
    /// ExecSync calls made: the id, and the container's state when the call came.
    pub fn execs(&self) -> Vec<(String, ContainerState)> {
        self.state.lock().unwrap().execs.clone()
    }

    pub fn stopped(&self) -> Vec<String> {
        self.state.lock().unwrap().stopped.clone()
    }

    pub fn list_calls(&self) -> u64 {
        self.state.lock().unwrap().list_calls
    }

    pub fn fail_with(&self, code: Option<tonic::Code>) {
        self.state.lock().unwrap().fail_with = code;
    }

    fn check(&self) -> Result<(), Status> {
        match self.state.lock().unwrap().fail_with {
            Some(code) => Err(Status::new(code, "fake runtime failure")),
            None => Ok(()),
        }
    }

    fn to_container(c: &FakeContainer) -> Container {
        Container {
            id: c.id.clone(),
            pod_sandbox_id: String::new(),
            metadata: Some(ContainerMetadata {
                name: c.name.clone(),
                attempt: c.attempt,
            }),
            state: c.state as i32,
            created_at: c.created_at,
            labels: [
                (LABEL_POD_UID.to_owned(), c.pod_uid.clone()),
                (LABEL_CONTAINER_NAME.to_owned(), c.name.clone()),
            ]
            .into(),
            annotations: c.annotations.clone(),
            ..Default::default()
        }
    }
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not in the fake"))
}

#[tonic::async_trait]
impl RuntimeService for FakeCri {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        unimplemented()
    }

    async fn version(
        &self,
        _: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        self.check()?;
        let (name, version) = self
            .state
            .lock()
            .unwrap()
            .runtime_name
            .clone()
            .unwrap_or_else(|| ("fake".into(), "0.0.1".into()));
        Ok(Response::new(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: name,
            runtime_version: version,
            runtime_api_version: "v1".into(),
        }))
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        self.check()?;
        let selector = req
            .into_inner()
            .filter
            .map(|f| f.label_selector)
            .unwrap_or_default();
        let mut s = self.state.lock().unwrap();
        s.list_calls += 1;
        let items = s
            .sandboxes
            .iter()
            .filter(|sb| selector.get(LABEL_POD_UID).is_none_or(|u| *u == sb.uid))
            .map(|sb| PodSandbox {
                id: sb.id.clone(),
                created_at: sb.created_at,
                metadata: Some(PodSandboxMetadata {
                    name: pod_name(&sb.uid),
                    uid: sb.uid.clone(),
                    namespace: POD_NAMESPACE.to_owned(),
                    attempt: 0,
                }),
                labels: [(LABEL_POD_UID.to_owned(), sb.uid.clone())].into(),
                annotations: sb.annotations.clone(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(ListPodSandboxResponse { items }))
    }

    async fn list_containers(
        &self,
        req: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        self.check()?;
        let selector = req
            .into_inner()
            .filter
            .map(|f| f.label_selector)
            .unwrap_or_default();
        let s = self.state.lock().unwrap();
        let containers = s
            .containers
            .iter()
            .filter(|c| selector.get(LABEL_POD_UID).is_none_or(|u| *u == c.pod_uid))
            .map(Self::to_container)
            .collect();
        Ok(Response::new(ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        req: Request<ContainerStatusRequest>,
    ) -> Result<Response<ContainerStatusResponse>, Status> {
        self.check()?;
        let id = req.into_inner().container_id;
        let gate = {
            let mut s = self.state.lock().unwrap();
            *s.status_calls_of.entry(id.clone()).or_default() += 1;
            s.held_status.get(&id).cloned()
        };
        if let Some(gate) = gate {
            // Closed when released; nothing else ends the wait.
            let _ = gate.acquire().await;
        }
        let s = self.state.lock().unwrap();
        if s.fail_status_of.contains(&id) {
            return Err(Status::unavailable("fake ContainerStatus failure"));
        }
        let c = s
            .containers
            .iter()
            .find(|c| c.id == id)
            .ok_or_else(|| Status::not_found("no such container"))?;
        let envs: Vec<serde_json::Value> = c
            .envs
            .iter()
            .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
            .collect();
        let info = serde_json::json!({"pid": 1, "config": {"envs": envs}}).to_string();
        let listed = Self::to_container(c);
        Ok(Response::new(ContainerStatusResponse {
            status: Some(ContainerStatus {
                id: c.id.clone(),
                state: c.state as i32,
                metadata: listed.metadata,
                created_at: c.created_at,
                labels: listed.labels,
                annotations: listed.annotations,
                exit_code: c.exit_code,
                ..Default::default()
            }),
            info: [("info".to_owned(), info)].into(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        _: Request<RunPodSandboxRequest>,
    ) -> Result<Response<RunPodSandboxResponse>, Status> {
        unimplemented()
    }
    async fn stop_pod_sandbox(
        &self,
        _: Request<StopPodSandboxRequest>,
    ) -> Result<Response<StopPodSandboxResponse>, Status> {
        unimplemented()
    }
    async fn remove_pod_sandbox(
        &self,
        _: Request<RemovePodSandboxRequest>,
    ) -> Result<Response<RemovePodSandboxResponse>, Status> {
        unimplemented()
    }
    async fn pod_sandbox_status(
        &self,
        _: Request<PodSandboxStatusRequest>,
    ) -> Result<Response<PodSandboxStatusResponse>, Status> {
        unimplemented()
    }
    async fn create_container(
        &self,
        _: Request<CreateContainerRequest>,
    ) -> Result<Response<CreateContainerResponse>, Status> {
        unimplemented()
    }
    async fn start_container(
        &self,
        _: Request<StartContainerRequest>,
    ) -> Result<Response<StartContainerResponse>, Status> {
        unimplemented()
    }
    /// The container exits at once (status 0), as one that honours TERM does.
    async fn stop_container(
        &self,
        req: Request<StopContainerRequest>,
    ) -> Result<Response<StopContainerResponse>, Status> {
        self.check()?;
        let id = req.into_inner().container_id;
        let mut s = self.state.lock().unwrap();
        s.stopped.push(id.clone());
        let c = s
            .containers
            .iter_mut()
            .find(|c| c.id == id)
            .ok_or_else(|| Status::not_found("no such container"))?;
        c.state = ContainerState::ContainerExited;
        if let Some(tx) = &s.events {
            let _ = tx.send(ContainerEventResponse {
                container_id: id,
                container_event_type: ContainerEventType::ContainerStoppedEvent as i32,
                ..Default::default()
            });
        }
        Ok(Response::new(StopContainerResponse {}))
    }
    async fn remove_container(
        &self,
        _: Request<RemoveContainerRequest>,
    ) -> Result<Response<RemoveContainerResponse>, Status> {
        unimplemented()
    }
    /// Runs in a running container only (as runc does), and the container leaves on it: the
    /// agent execs only a sidecar's HTTP shutdown.
    async fn exec_sync(
        &self,
        req: Request<ExecSyncRequest>,
    ) -> Result<Response<ExecSyncResponse>, Status> {
        self.check()?;
        let id = req.into_inner().container_id;
        let state = {
            let mut s = self.state.lock().unwrap();
            let state = s
                .containers
                .iter()
                .find(|c| c.id == id)
                .map(|c| c.state)
                .ok_or_else(|| Status::not_found("no such container"))?;
            s.execs.push((id.clone(), state));
            state
        };
        if state != ContainerState::ContainerRunning {
            return Err(Status::unknown("container is not running"));
        }
        self.exit(&id, 0);
        Ok(Response::new(ExecSyncResponse {
            exit_code: 0,
            ..Default::default()
        }))
    }

    type GetContainerEventsStream = ReceiverStream<Result<ContainerEventResponse, Status>>;

    async fn get_container_events(
        &self,
        _: Request<GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        self.check()?;
        let mut feed = {
            let mut s = self.state.lock().unwrap();
            if s.events_unimplemented {
                return unimplemented();
            }
            s.subscriptions += 1;
            match &s.events {
                Some(tx) => tx.subscribe(),
                None => return unimplemented(),
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        tokio::spawn(async move {
            while let Ok(ev) = feed.recv().await {
                if tx.send(Ok(ev)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
