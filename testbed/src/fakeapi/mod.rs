//! A small Kubernetes API server over plain HTTP, for the end-to-end tests and the benchmark: pod list, get and watch (the way kube-rs's
//! watcher asks), events.k8s.io/v1 Event creation, Event lists (core/v1 and events.k8s.io/v1,
//! with field selectors), the Node, and an outage switch. Enough to drive the agent's pod
//! watch and Events for real, over the wire, with kube's own client.
//!
//! It is also the API server of the test bed's kubelet ([`crate::ApiSink`], in
//! `sink`): the kubelet's core/v1 Events (`events`, through client-go's recorder pipeline),
//! its pod status writes and its Node's Ready condition (`node`).
//!
//! Parts:
//! - `requests`: the requests answered, their queries decoded, each kind counted;
//! - `events`: one store of Events, served as core/v1 and events.k8s.io/v1, the kubelet's
//!   through client-go's correlator;
//! - `select`: Event field selectors and the two shapes of one stored Event;
//! - `node`: the kubelet's Node and its `Ready` condition;
//! - `daemonsets`: the agent's own DaemonSet, read and watched by name, made forbidden as an
//!   uninstall leaves it;
//! - `objects`: pods as the API server returns them, being deleted, in another phase;
//! - `slices`: Services' EndpointSlices, read and watched, written by the EndpointSlice
//!   controller as it follows the pods;
//! - `sink`: the API server of the test bed's kubelet: its Events, pod status and Node.

mod daemonsets;
mod events;
mod node;
mod objects;
mod requests;
mod select;
mod sink;
mod slices;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::mpsc;

pub use objects::{api_pod_of, deleting, pod, with_phase};
use requests::classify;
pub(crate) use requests::Query;
pub use requests::RequestKind;
pub use slices::SliceChange;

type Body = BoxBody<Bytes, Infallible>;

#[derive(Default)]
struct State {
    /// Pods by UID, as last written.
    pods: BTreeMap<String, Value>,
    rv: u64,
    watchers: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Every watch event sent, by resourceVersion: a watch from version N gets those after N
    /// first, as from a real API server's watch cache.
    history: Vec<(u64, Bytes)>,
    events: Vec<Value>,
    down: bool,
    /// Watch events written but not yet delivered (a lagging watch); `None` when delivered
    /// at once.
    held: Option<Vec<(u64, Bytes)>>,
    /// Watch requests answer 403 (a role without `watch`).
    forbid_watch: bool,
    /// Path and query of every request, in order.
    requests: Vec<String>,
    /// Requests by kind.
    counts: BTreeMap<RequestKind, usize>,
    /// Every Event (the kubelet's and those POSTed), as core/v1.
    event_store: events::EventStore,
    /// The kubelet's recorder drops every Event while on.
    drop_kubelet_events: bool,
    node: node::NodeState,
    /// DaemonSets by (namespace, name): the agent's own, watched and read at its SIGTERM.
    daemonsets: BTreeMap<(String, String), Value>,
    ds_watchers: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Every DaemonSet watch event sent, by resourceVersion, replayed to a watch from before.
    ds_history: Vec<(u64, Bytes)>,
    /// DaemonSet reads answer 403 (the agent's RBAC deleted, as `helm uninstall` does).
    forbid_daemonsets: bool,
    /// The kubelet recorder's one sender, when its Events are sent with a latency.
    kubelet_sender: Option<std::sync::mpsc::Sender<(crate::PodRef, crate::KubeletEvent)>>,
    node_watchers: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Every Node watch event sent, by resourceVersion.
    node_history: Vec<(u64, Bytes)>,
    slices: slices::Slices,
}

/// A kind's watch history and its watchers.
type Watched<'a> = (
    &'a Vec<(u64, Bytes)>,
    &'a mut Vec<mpsc::UnboundedSender<Bytes>>,
);

#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

pub struct ServedApi {
    pub addr: SocketAddr,
    pub api: FakeApi,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ServedApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ServedApi {
    /// Writes a kubeconfig for this server (no credentials) in `dir`; its path.
    pub fn write_kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        write_kubeconfig(dir, &self.addr.to_string())
    }
}

/// A kubeconfig in `dir` for an API server at `addr` over plain HTTP, without credentials.
pub fn write_kubeconfig(dir: &std::path::Path, addr: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
        ),
    )
    .expect("write kubeconfig");
    path
}

fn status(code: StatusCode, message: &str) -> Response<Body> {
    // The reason as the real API server gives it: clients (kube's `get_opt`) go by it.
    let reason = match code {
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        StatusCode::BAD_REQUEST => "BadRequest",
        _ => "",
    };
    let body = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *r.status_mut() = code;
    r
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

impl FakeApi {
    /// An API server whose Node (and kubelet, as an [`crate::ApiSink`]) is
    /// `node`; [`FakeApi::default`]'s is `fake-node`.
    pub fn for_node(node: &str) -> FakeApi {
        let api = FakeApi::default();
        api.lock().node.name = node.to_owned();
        api
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub fn serve(self) -> ServedApi {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind fake API");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("addr");
        let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
        let api = self.clone();
        let controller = self
            .clone()
            .endpointslice_controller(self.lock().slices.take_queue());
        let task = tokio::spawn(async move {
            tokio::spawn(controller);
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let api = api.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let api = api.clone();
                        async move { Ok::<_, Infallible>(api.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        ServedApi {
            addr,
            api: self,
            task,
        }
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let method = req.method().clone();
        let q = Query::parse(&query);
        {
            let mut s = self.lock();
            s.requests.push(format!("{method} {path}?{query}"));
            *s.counts.entry(classify(&method, &path, &q)).or_default() += 1;
            if s.down {
                return status(StatusCode::SERVICE_UNAVAILABLE, "fake API server is down");
            }
        }
        if method == Method::GET && q.get("watch") != Some("true") {
            if let Some(r) = self.get_more(&path, &q) {
                return r;
            }
        }
        if method == Method::GET {
            if let Some(r) = self.daemonsets(&path, &q) {
                return r;
            }
            if let Some(r) = self.slices_request(&path, &q) {
                return r;
            }
        }
        if method == Method::GET && path == "/api/v1/nodes" && q.get("watch") == Some("true") {
            let from = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            return self.watch_of(from, |s| (&s.node_history, &mut s.node_watchers));
        }
        if method == Method::GET && path == "/api/v1/pods" {
            return if query.split('&').any(|kv| kv == "watch=true") {
                if self.lock().forbid_watch {
                    return status(StatusCode::FORBIDDEN, "pods is forbidden: cannot watch");
                }
                let from = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("resourceVersion="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                self.watch(from)
            } else {
                self.list()
            };
        }
        if method == Method::GET {
            if let Some(rest) = path.strip_prefix("/api/v1/namespaces/") {
                if let Some((ns, name)) = rest.split_once("/pods/") {
                    return self.get(ns, name);
                }
            }
        }
        if method == Method::POST
            && path.starts_with("/apis/events.k8s.io/v1/namespaces/")
            && path.ends_with("/events")
        {
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return status(StatusCode::BAD_REQUEST, "unreadable body"),
            };
            let Ok(ev) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "not JSON");
            };
            let ns = path
                .trim_start_matches("/apis/events.k8s.io/v1/namespaces/")
                .trim_end_matches("/events");
            let mut s = self.lock();
            s.events.push(ev.clone());
            let state = &mut *s;
            state.event_store.record_posted(&mut state.rv, ns, &ev);
            return json_response(StatusCode::CREATED, &ev);
        }
        status(StatusCode::NOT_FOUND, "not in the fake")
    }

    /// The reads besides pods and DaemonSets: Event lists and the Node.
    fn get_more(&self, path: &str, q: &Query) -> Option<Response<Body>> {
        let (group, ns) = if path == "/api/v1/events" {
            (select::Group::Core, None)
        } else if path == "/apis/events.k8s.io/v1/events" {
            (select::Group::EventsV1, None)
        } else if let Some(ns) = path
            .strip_prefix("/api/v1/namespaces/")
            .and_then(|r| r.strip_suffix("/events"))
        {
            (select::Group::Core, Some(ns))
        } else if let Some(ns) = path
            .strip_prefix("/apis/events.k8s.io/v1/namespaces/")
            .and_then(|r| r.strip_suffix("/events"))
        {
            (select::Group::EventsV1, Some(ns))
        } else if let Some(name) = path.strip_prefix("/api/v1/nodes/") {
            let s = self.lock();
            return Some(if s.node.name == name {
                json_response(StatusCode::OK, &s.node.to_json())
            } else {
                status(
                    StatusCode::NOT_FOUND,
                    &format!("nodes \"{name}\" not found"),
                )
            });
        } else if path == "/api/v1/nodes" {
            let s = self.lock();
            let node = s.node.to_json();
            let wanted = q.get("fieldSelector").unwrap_or("");
            let items: Vec<Value> = match wanted.strip_prefix("metadata.name=") {
                Some(name) if name != s.node.name => Vec::new(),
                _ if !wanted.is_empty() && !wanted.starts_with("metadata.name=") => {
                    return Some(status(
                        StatusCode::BAD_REQUEST,
                        &format!("the fake selects nodes by metadata.name only: {wanted}"),
                    ));
                }
                _ => vec![node],
            };
            let body = json!({
                "apiVersion": "v1", "kind": "NodeList",
                "metadata": {"resourceVersion": s.rv.to_string()},
                "items": items,
            });
            return Some(json_response(StatusCode::OK, &body));
        } else {
            return None;
        };
        let s = self.lock();
        Some(match s.event_store.list(group, ns, q, s.rv) {
            Ok(list) => json_response(StatusCode::OK, &list),
            Err(m) => status(StatusCode::BAD_REQUEST, &m),
        })
    }

    /// A read of one pod: what was last written, whatever the watches have delivered.
    fn get(&self, ns: &str, name: &str) -> Response<Body> {
        let s = self.lock();
        let found = s
            .pods
            .values()
            .find(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name);
        match found {
            Some(p) => json_response(StatusCode::OK, p),
            None => status(StatusCode::NOT_FOUND, "pods not found"),
        }
    }

    fn list(&self) -> Response<Body> {
        let s = self.lock();
        let body = json!({
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": s.rv.to_string()},
            "items": s.pods.values().cloned().collect::<Vec<_>>(),
        });
        json_response(StatusCode::OK, &body)
    }

    fn watch(&self, from: u64) -> Response<Body> {
        self.watch_of(from, |s| (&s.history, &mut s.watchers))
    }

    /// A watch stream: the events of `history` after `from`, then each one sent to the
    /// watchers `of` picks.
    fn watch_of(&self, from: u64, of: impl FnOnce(&mut State) -> Watched<'_>) -> Response<Body> {
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut s = self.lock();
            let (history, watchers) = of(&mut s);
            for (_, line) in history.iter().filter(|(rv, _)| *rv > from) {
                let _ = tx.send(line.clone());
            }
            watchers.push(tx);
        }
        stream_response(rx)
    }

    fn publish(&self, kind: &str, pod: Value) {
        publish_in(&mut self.lock(), kind, pod);
    }

    /// Changes the stored pod with UID `uid` in place (nothing when there is none) and
    /// publishes it MODIFIED, all under one lock: nothing written meanwhile is lost.
    fn modify(&self, uid: &str, f: impl FnOnce(&mut Value)) {
        let mut s = self.lock();
        let Some(mut pod) = s.pods.get(uid).cloned() else {
            return;
        };
        f(&mut pod);
        publish_in(&mut s, "MODIFIED", pod);
    }
}

/// A watch's response: each line sent on `rx`, as it comes.
fn stream_response(rx: mpsc::UnboundedReceiver<Bytes>) -> Response<Body> {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(line)), rx))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// Stores `pod` as written now and sends it to the watches (or holds it for them).
fn publish_in(s: &mut State, kind: &str, mut pod: Value) {
    s.rv += 1;
    pod["metadata"]["resourceVersion"] = json!(s.rv.to_string());
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if kind == "DELETED" {
        s.pods.remove(&uid);
    } else {
        s.pods.insert(uid, pod.clone());
    }
    s.slices.pod_written(&pod, kind == "DELETED");
    let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": pod})));
    let rv = s.rv;
    if let Some(held) = s.held.as_mut() {
        held.push((rv, line));
        return;
    }
    s.history.push((rv, line.clone()));
    s.watchers.retain(|w| w.send(line.clone()).is_ok());
}

impl FakeApi {
    /// Creates or updates a pod (ADDED the first time, MODIFIED after).
    pub fn apply(&self, pod: Value) {
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let kind = if self.lock().pods.contains_key(&uid) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.publish(kind, pod);
    }

    pub fn delete(&self, pod: Value) {
        self.publish("DELETED", pod);
    }

    /// Down: every request answers 503 and open watches end. Up again: requests are served.
    pub fn set_down(&self, down: bool) {
        let mut s = self.lock();
        s.down = down;
        if down {
            s.watchers.clear();
            s.slices.drop_watches();
        }
    }

    /// Lagging watches: while on, changes are stored (reads see them) but not delivered;
    /// turned off, what was held is delivered.
    pub fn hold_watches(&self, hold: bool) {
        let mut s = self.lock();
        if hold {
            s.held.get_or_insert_with(Vec::new);
        } else if let Some(lines) = s.held.take() {
            for (rv, line) in lines {
                s.history.push((rv, line.clone()));
                s.watchers.retain(|w| w.send(line.clone()).is_ok());
            }
        }
    }

    /// Watch requests answer 403 while on.
    pub fn forbid_watch(&self, forbid: bool) {
        self.lock().forbid_watch = forbid;
    }

    pub fn events(&self) -> Vec<Value> {
        self.lock().events.clone()
    }

    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// How many requests of `kind` were made.
    pub fn request_count(&self, kind: RequestKind) -> usize {
        self.lock().counts.get(&kind).copied().unwrap_or(0)
    }

    /// Every kind of request made, with how many.
    pub fn request_counts(&self) -> BTreeMap<RequestKind, usize> {
        self.lock().counts.clone()
    }

    /// The kubelet's Events as stored (core/v1 JSON, counted and combined as its recorder
    /// does), in creation order; apart from [`FakeApi::events`], the ones POSTed.
    pub fn kubelet_events(&self) -> Vec<Value> {
        self.lock().event_store.kubelet()
    }

    /// While on, the kubelet's recorder drops every Event (its QPS, its queue, the spam
    /// filter beyond what is played already): none reaches the API.
    pub fn drop_kubelet_events(&self, drop: bool) {
        self.lock().drop_kubelet_events = drop;
    }

    /// The Node as a GET returns it.
    pub fn node(&self) -> Value {
        self.lock().node.to_json()
    }

    /// The Node's kubelet is of `version` (`v1.33.1`), from the next read or watch of it.
    pub fn set_kubelet_version(&self, version: &str) {
        self.lock().node.kubelet_version = version.to_owned();
    }

    /// The pod with UID `uid` as last written.
    pub fn pod(&self, uid: &str) -> Option<Value> {
        self.lock().pods.get(uid).cloned()
    }

    /// Waits until `n` events were posted, or panics after `within`.
    pub async fn wait_events(&self, n: usize, within: Duration) -> Vec<Value> {
        let end = Instant::now() + within;
        loop {
            let evs = self.events();
            if evs.len() >= n {
                return evs;
            }
            assert!(
                Instant::now() < end,
                "{} events posted, expected {n}: {evs:?}",
                evs.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
