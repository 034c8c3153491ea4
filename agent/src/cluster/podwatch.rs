//! The pods of this node as the API server sees them: whether each is being deleted, its grace
//! period, restart policy and annotations.
//!
//! A kube-rs watcher on `spec.nodeName=<node>` fills a reflector store; the decision loop only
//! ever reads that store (a lock held for a lookup, never an API call). The view says nothing
//! while it is not known to be current (before the first list, after any watch error until the
//! next list): the agent then decides by the runtime's rules alone, which never allow early.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::cluster::podevents::{ConfirmRequest, Confirmer};
use crate::cluster::watchloop;
use crate::cluster::PodSignal;
use crate::decide::restart::{Policy, RecordError, Restart, RestartError, RestartRecord};
use crate::decide::stoporder::StopOrder;
use crate::kubelet::grace;
use crate::kubelet::kills::PodKill;
use crate::pod::PodUid;
use crate::stats::Stats;
use crate::view::SandboxInfo;
use exitorder_contract::annotation;

/// Server-side timeout of one watch request; kube's watcher also gives up on a stream that
/// stays silent a little longer than this, so a connection that died without a FIN is
/// replaced within about two minutes.
pub const WATCH_TIMEOUT_SECS: u32 = 120;

/// How long a deleted pod is remembered after the API server dropped it: its containers can
/// outlive the API object (a force delete) and their waits still need its deadline.
const TOMBSTONE_TTL: Duration = Duration::from_secs(600);
/// At most this many deleted pods are remembered, the oldest forgotten first. Each holds the
/// pod's annotations (up to 256 KiB), and pods scheduled here and deleted at once would
/// otherwise each stay for the whole TTL. More than a node's pods: only pods whose containers
/// are still stopping need one, and the decision loop drops those the runtime no longer has.
const MAX_TOMBSTONES: usize = 1_024;

const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What the agent reads of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiPod {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
    /// metadata.deletionTimestamp is set (or the object is gone).
    pub deleting: bool,
    /// metadata.deletionGracePeriodSeconds: the grace of this deletion, which
    /// `kubectl delete --grace-period` can make shorter than the spec's.
    pub deletion_grace: Option<Duration>,
    /// When the deletion was asked (metadata.deletionTimestamp less the deletion's grace),
    /// in Unix seconds, as the API server recorded it.
    pub deletion_requested: Option<i64>,
    /// status.phase.
    pub phase: Option<String>,
    /// status.reason: why a pod ended (`Evicted`, `DeadlineExceeded`, ...).
    pub status_reason: Option<String>,
    /// When `activeDeadlineSeconds` ends (status.startTime + the spec's seconds), in Unix
    /// seconds: the kubelet kills the pod then.
    pub active_deadline: Option<i64>,
    /// spec.terminationGracePeriodSeconds.
    pub grace: Option<Duration>,
    /// spec.priority: a graceful node shutdown's band.
    pub priority: Option<i32>,
    pub restart_policy: Option<String>,
    pub annotations: BTreeMap<String, String>,
    /// Init containers with `restartPolicy: Always` (native sidecars), in declaration order.
    pub native_sidecars: Vec<String>,
    /// The main containers (spec.containers), in declaration order.
    pub containers: Vec<String>,
    /// Whether the kubelet starts each main container again after an exit (the pod's
    /// restartPolicy, or the container's own and its rules), or why that cannot be told.
    pub restarts: BTreeMap<String, Result<Restart, RestartError>>,
    /// The containers whose exits can restart every container in place (KEP-5532), with
    /// their rules.
    pub restart_all: BTreeMap<String, Result<Restart, RestartError>>,
}

/// A grace field of the pod, bounded: the API server accepts any int64 here.
fn seconds(s: Option<i64>) -> Option<Duration> {
    s.map(crate::decide::bounds::grace_seconds)
}

impl ApiPod {
    /// Whether the kubelet starts main container `name` again after an exit: its own
    /// policy and rules, or the pod's policy for a name the spec does not have.
    pub fn restart_of(&self, name: &str) -> Result<Restart, RestartError> {
        match self.restarts.get(name) {
            Some(r) => r.clone(),
            None => Ok(Restart::pod(Policy::parse(self.restart_policy.as_deref())?)),
        }
    }

    /// `None` for an object without a UID, or whose UID is no pod UID (neither is ever sent
    /// by a real API server).
    pub fn from_pod(pod: &Pod) -> Option<ApiPod> {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let record = spec.map(RestartRecord::of_spec);
        Some(ApiPod {
            uid: PodUid::parse(meta.uid.as_deref()?).ok()?,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            deletion_grace: seconds(meta.deletion_grace_period_seconds),
            deletion_requested: meta.deletion_timestamp.as_ref().and_then(|t| {
                t.0.as_second()
                    .checked_sub(meta.deletion_grace_period_seconds.unwrap_or(0).max(0))
            }),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
            status_reason: pod.status.as_ref().and_then(|s| s.reason.clone()),
            active_deadline: active_deadline(pod),
            grace: seconds(spec.and_then(|s| s.termination_grace_period_seconds)),
            priority: spec.and_then(|s| s.priority),
            restart_policy: spec.and_then(|s| s.restart_policy.clone()),
            annotations: meta.annotations.clone().unwrap_or_default(),
            native_sidecars: spec
                .and_then(|s| s.init_containers.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| crate::podspec::is_native(c))
                .map(|c| c.name.clone())
                .collect(),
            containers: record.as_ref().map(|r| r.names()).unwrap_or_default(),
            restarts: record.as_ref().map(|r| r.restarts()).unwrap_or_default(),
            restart_all: record.as_ref().map(|r| r.restart_all()).unwrap_or_default(),
        })
    }

    /// A pod as an agent without the API server knows it: from its sandbox (identity and
    /// annotations, as the kubelet copied them) and the webhook's [`RestartRecord`] among
    /// them. `None` when the pod carries no record. Never `deleting`: a deletion stops every
    /// container at once, and a Job shutdown then asks for what the kubelet already does.
    pub fn from_record(
        sandbox: &SandboxInfo,
        grace: Option<Duration>,
    ) -> Option<Result<ApiPod, RecordError>> {
        let value = sandbox.annotations.get(annotation::RESTARTS)?;
        let record = match RestartRecord::parse(value) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let later = record.unknown_fields();
        if !later.is_empty() {
            debug!(pod = %sandbox.pod_uid, fields = ?later, "the pod's restart record has fields of a later release; read past them");
        }
        let native_sidecars = match sandbox.annotations.get(annotation::NATIVE_SIDECARS) {
            Some(v) => match StopOrder::from_annotation(v) {
                Ok(order) => order.native().to_vec(),
                Err(e) => return Some(Err(RecordError::Json(e.to_string()))),
            },
            None => Vec::new(),
        };
        Some(Ok(ApiPod {
            uid: sandbox.pod_uid.clone(),
            namespace: sandbox.namespace.clone(),
            name: sandbox.name.clone(),
            deleting: false,
            deletion_grace: None,
            deletion_requested: None,
            phase: None,
            status_reason: None,
            active_deadline: None,
            grace,
            priority: None,
            restart_policy: record.restart_policy.clone(),
            annotations: sandbox
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            native_sidecars,
            containers: record.names(),
            restarts: record.restarts(),
            restart_all: record.restart_all(),
        }))
    }

    /// Whether the API object itself says the whole pod is being killed, and why: deleted (or
    /// gone), over (a terminal phase), or past its `activeDeadlineSeconds` at `now_unix`.
    /// `None` proves nothing: the kubelet keeps a pod `Running`, with no deletion, all through
    /// its own kills (see [`crate::kubelet`]); only its word for one container says the pod
    /// stays.
    pub fn pod_kill(&self, now_unix: i64) -> Option<PodKill> {
        if self.deleting {
            return Some(PodKill::Deletion);
        }
        if matches!(self.phase.as_deref(), Some("Failed" | "Succeeded")) {
            return Some(match self.status_reason.as_deref() {
                Some("Evicted") => PodKill::Eviction,
                Some("DeadlineExceeded") => PodKill::ActiveDeadline,
                Some("Preempting") => PodKill::Preemption,
                // nodeshutdown: `nodeShutdownReason = "Terminated"` (`Shutdown` is only the
                // Node's Event reason).
                Some("Terminated") => PodKill::NodeShutdown,
                _ => PodKill::Unrecognised,
            });
        }
        if self.active_deadline.is_some_and(|d| now_unix >= d) {
            return Some(PodKill::ActiveDeadline);
        }
        None
    }

    /// The grace period the kubelet gives this pod's containers, as it computes it: the
    /// deletion's own when set and not 0, else the spec's, and never under 1 s.
    pub fn grace(&self) -> Option<Duration> {
        grace::of_pod(self.deletion_grace, self.grace)
    }
}

/// When the kubelet kills `pod` for its `activeDeadlineSeconds` (`active_deadline.go`
/// `pastActiveDeadline`: status.startTime + spec.activeDeadlineSeconds), in Unix seconds.
fn active_deadline(pod: &Pod) -> Option<i64> {
    let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
    let start = pod.status.as_ref()?.start_time.as_ref()?.0.as_second();
    start.checked_add(seconds.max(0))
}

/// The grace period the kubelet gives a pod's containers, read from the object: see
/// [`ApiPod::grace`].
pub fn grace_of(pod: &Pod) -> Option<Duration> {
    grace::of_pod(
        seconds(pod.metadata.deletion_grace_period_seconds),
        seconds(
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds),
        ),
    )
}

struct Shared {
    current: AtomicBool,
    tombstones: Mutex<HashMap<PodUid, (ApiPod, Instant)>>,
}

/// The decision loop's handle on the watched pods: reads of the store, and requests for
/// confirming reads (answered as [`PodSignal::Confirmed`]).
#[derive(Clone)]
pub struct PodView {
    store: Store<Pod>,
    shared: Arc<Shared>,
    confirm: mpsc::UnboundedSender<ConfirmRequest>,
}

impl PodView {
    /// Whether the view is known to be current.
    pub fn is_current(&self) -> bool {
        self.shared.current.load(Ordering::Acquire)
    }

    /// The pod with this namespace, name and UID, if the view is current and has it (or
    /// recently saw it deleted). A pod of the same name but another UID is a different pod.
    pub fn get(&self, namespace: &str, name: &str, uid: &PodUid) -> Option<ApiPod> {
        if !self.is_current() {
            return None;
        }
        if !name.is_empty() {
            let key = ObjectRef::<Pod>::new(name).within(namespace);
            if let Some(p) = self.store.get(&key).and_then(|p| ApiPod::from_pod(&p)) {
                if p.uid == *uid {
                    return Some(p);
                }
            }
        }
        let tombstones = self.shared.tombstones.lock().ok()?;
        tombstones.get(uid).map(|(p, _)| p.clone())
    }

    /// The pod with this UID, when its names are not known (the runtime has not described
    /// it yet): a scan of this node's pods.
    pub fn get_by_uid(&self, uid: &PodUid) -> Option<ApiPod> {
        if !self.is_current() {
            return None;
        }
        let found = self
            .store
            .state()
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
            .and_then(|p| ApiPod::from_pod(p));
        found.or_else(|| {
            let tombstones = self.shared.tombstones.lock().ok()?;
            tombstones.get(uid).map(|(p, _)| p.clone())
        })
    }

    /// Asks for a confirming read; never waits.
    pub fn confirm(&self, req: ConfirmRequest) {
        let _ = self.confirm.send(req);
    }

    /// Forgets the deleted pods that `keep` does not name (the runtime no longer has them:
    /// no wait of theirs can need the API server's word any more); how many are left.
    pub fn keep_tombstones(&self, keep: impl Fn(&PodUid) -> bool) -> usize {
        match self.shared.tombstones.lock() {
            Ok(mut t) => {
                t.retain(|uid, (_, at)| keep(uid) && at.elapsed() < TOMBSTONE_TTL);
                t.len()
            }
            Err(_) => 0,
        }
    }
}

/// The watch itself; [`PodWatch::run`] drives it until shutdown.
pub struct PodWatch {
    api: Api<Pod>,
    node: String,
    writer: reflector::store::Writer<Pod>,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<PodSignal>,
    stats: Arc<Stats>,
    /// Whether the current outage was already logged at warn level.
    outage_logged: bool,
}

/// A watch of the pods on `node`, its view, its confirming reader, and the signals both send.
pub fn pod_watch(
    client: Client,
    node: &str,
    stats: Arc<Stats>,
) -> (
    PodView,
    PodWatch,
    Confirmer,
    mpsc::UnboundedReceiver<PodSignal>,
    mpsc::UnboundedSender<PodSignal>,
) {
    let (store, writer) = reflector::store();
    let shared = Arc::new(Shared {
        current: AtomicBool::new(false),
        tombstones: Mutex::new(HashMap::new()),
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let (confirm_tx, confirm_rx) = mpsc::unbounded_channel();
    stats.set_api_watch("syncing");
    let view = PodView {
        store,
        shared: shared.clone(),
        confirm: confirm_tx,
    };
    let confirmer = Confirmer::new(client.clone(), node, confirm_rx, tx.clone(), stats.clone());
    let watch = PodWatch {
        api: Api::all(client),
        node: node.to_owned(),
        writer,
        shared,
        tx: tx.clone(),
        stats,
        outage_logged: false,
    };
    (view, watch, confirmer, rx, tx)
}

/// Remembers a deleted pod, within [`TOMBSTONE_TTL`] and [`MAX_TOMBSTONES`]; the UID of the
/// oldest forgotten to make room, if one was.
fn remember(
    tombstones: &mut HashMap<PodUid, (ApiPod, Instant)>,
    pod: ApiPod,
    now: Instant,
) -> Option<PodUid> {
    tombstones.retain(|_, (_, at)| now.saturating_duration_since(*at) < TOMBSTONE_TTL);
    let mut forgot = None;
    if !tombstones.contains_key(&pod.uid) && tombstones.len() >= MAX_TOMBSTONES {
        let oldest = tombstones
            .iter()
            .min_by_key(|(_, (_, at))| *at)
            .map(|(uid, _)| uid.clone());
        if let Some(uid) = oldest {
            tombstones.remove(&uid);
            forgot = Some(uid);
        }
    }
    tombstones.insert(pod.uid.clone(), (pod, now));
    forgot
}

fn error_kind(e: &watcher::Error) -> &'static str {
    match e {
        watcher::Error::InitialListFailed(_) => "list",
        watcher::Error::WatchStartFailed(_) => "watch_start",
        watcher::Error::WatchError(_) => "watch_status",
        watcher::Error::WatchFailed(_) => "watch",
        watcher::Error::NoResourceVersion => "no_resource_version",
    }
}

impl PodWatch {
    /// Lists and watches until `shutdown`. Any error ends the stream: the next one starts with
    /// a fresh list after a backoff, so the view is only called current again once a complete
    /// list has been applied (a resumed watch says nothing until something changes).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let config = watcher::Config::default()
            .fields(&format!("spec.nodeName={}", self.node))
            .timeout(WATCH_TIMEOUT_SECS);
        let api = self.api.clone();
        let start = move || {
            watcher(api.clone(), config.clone()).modify(|p| {
                // Nothing here reads managedFields; they are most of a pod's size.
                p.metadata.managed_fields = None;
            })
        };
        let backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
        watchloop::run(start, &mut self, backoff, shutdown).await;
    }
}

impl PodWatch {
    /// Remembers `pod` as deleted: gone from the API (a force delete does that at once) while
    /// its containers may still be stopping.
    fn bury(&self, pod: &Pod) {
        let Some(mut p) = ApiPod::from_pod(pod) else {
            return;
        };
        p.deleting = true;
        let uid = p.uid.clone();
        if let Ok(mut t) = self.shared.tombstones.lock() {
            if let Some(forgot) = remember(&mut t, p, Instant::now()) {
                warn!(pod = %forgot, limit = MAX_TOMBSTONES, "more deleted pods than the agent remembers; forgetting the oldest (its remaining waits are decided by the runtime's rules)");
            }
            self.stats
                .set_kept(crate::stats::Kept::ApiTombstones, t.len());
        }
        let _ = self.tx.send(PodSignal::Changed(uid));
    }

    /// Buries the pods of `before` (the view before a list) that the list no longer has: a
    /// pod deleted while the watch was away, force-deleted or its deletion finished, is a
    /// deletion still, never a pod the view does not know.
    fn bury_vanished(&self, before: &[Arc<Pod>]) {
        let listed = self.writer.as_reader().state();
        let listed: std::collections::HashSet<&str> = listed
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let vanished: Vec<&Arc<Pod>> = before
            .iter()
            .filter(|p| {
                p.metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| !listed.contains(uid))
            })
            .collect();
        if vanished.is_empty() {
            return;
        }
        info!(node = %self.node, pods = vanished.len(), "pods deleted while the pod watch was away");
        for pod in vanished {
            self.bury(pod);
        }
    }
}

impl watchloop::Consumer<Pod> for PodWatch {
    fn on_event(&mut self, ev: watcher::Event<Pod>) -> bool {
        // What the view held before a list replaces it: a pod it had that the list lacks was
        // deleted while the watch was away (no DELETED reaches a new list).
        let before =
            matches!(ev, watcher::Event::InitDone).then(|| self.writer.as_reader().state());
        self.writer.apply_watcher_event(&ev);
        match ev {
            watcher::Event::Init | watcher::Event::InitApply(_) => false,
            watcher::Event::InitDone => {
                // Buried before the view says it is current, so no reader sees it current
                // without them.
                self.bury_vanished(&before.unwrap_or_default());
                let was_current = self.shared.current.swap(true, Ordering::AcqRel);
                self.stats.set_api_watch("up");
                if !was_current {
                    info!(node = %self.node, pods = self.writer.as_reader().len(), "pod watch current");
                }
                self.outage_logged = false;
                let _ = self.tx.send(PodSignal::Resync);
                false
            }
            watcher::Event::Apply(pod) => {
                if let Some(uid) = pod
                    .metadata
                    .uid
                    .as_deref()
                    .and_then(|u| PodUid::parse(u).ok())
                {
                    let _ = self.tx.send(PodSignal::Changed(uid));
                }
                true
            }
            watcher::Event::Delete(pod) => {
                self.bury(&pod);
                true
            }
        }
    }

    fn on_error(&mut self, e: &watcher::Error) {
        let kind = error_kind(e);
        self.stats.api_error(kind);
        self.stats.set_api_watch("down");
        let was_current = self.shared.current.swap(false, Ordering::AcqRel);
        if !self.outage_logged {
            self.outage_logged = true;
            warn!(error = %e, kind, "pod watch failed; deciding by the runtime's rules until it is current again");
        } else {
            debug!(error = %e, kind, "pod watch still failing");
        }
        if was_current {
            let _ = self.tx.send(PodSignal::Resync);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    const UID: &str = "4f2c0000-8d2b-4c3e-9f00-123456789abc";

    fn numbered(i: usize) -> PodUid {
        crate::pod::test_uid(&format!("4f2c0000-8d2b-4c3e-9f00-{i:012}"))
    }

    fn pod(deleted_at: Option<i64>, deletion_grace: Option<i64>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                namespace: Some("shop".into()),
                uid: Some(UID.into()),
                deletion_timestamp: deleted_at
                    .map(|s| Time(Timestamp::from_second(s).expect("valid time"))),
                deletion_grace_period_seconds: deletion_grace,
                annotations: Some(
                    [("exitorder.io/container-exit-priority".into(), "{}".into())].into(),
                ),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                termination_grace_period_seconds: Some(45),
                restart_policy: Some("Never".into()),
                ..Default::default()
            }),
            status: Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        }
    }

    /// A client that reaches no API server: the watch's events are given by hand.
    fn offline_client() -> Client {
        let svc = tower::service_fn(|_: hyper::Request<kube::client::Body>| async {
            Err::<hyper::Response<kube::client::Body>, _>(std::io::Error::other(
                "no API server here",
            ))
        });
        Client::new(svc, "default")
    }

    #[tokio::test]
    async fn a_pod_the_list_after_an_outage_lacks_is_a_deletion() {
        use watchloop::Consumer;
        let (view, mut watch, _confirmer, mut rx, _tx) =
            pod_watch(offline_client(), "node-a", Arc::new(Stats::default()));
        let uid = crate::pod::test_uid(UID);
        watch.on_event(watcher::Event::Init);
        watch.on_event(watcher::Event::InitApply(pod(None, None)));
        watch.on_event(watcher::Event::InitDone);
        let running = view.get("shop", "web-0", &uid).expect("the listed pod");
        assert!(!running.deleting);
        // An outage after which the list still has the pod buries nothing.
        watch.on_error(&watcher::Error::NoResourceVersion);
        assert!(view.get("shop", "web-0", &uid).is_none(), "not current");
        watch.on_event(watcher::Event::Init);
        watch.on_event(watcher::Event::InitApply(pod(None, None)));
        watch.on_event(watcher::Event::InitDone);
        assert!(view.get_by_uid(&uid).is_some_and(|p| !p.deleting));
        assert_eq!(view.keep_tombstones(|_| true), 0);
        watch.on_error(&watcher::Error::NoResourceVersion);
        while rx.try_recv().is_ok() {}
        // Force-deleted while the watch was away: the next list lacks it, and no DELETED came.
        watch.on_event(watcher::Event::Init);
        watch.on_event(watcher::Event::InitDone);
        let gone = view
            .get("shop", "web-0", &uid)
            .expect("remembered as deleted");
        assert!(gone.deleting, "{gone:?}");
        assert!(view.get_by_uid(&uid).is_some_and(|p| p.deleting));
        let mut changed = false;
        while let Ok(signal) = rx.try_recv() {
            changed |= matches!(&signal, PodSignal::Changed(u) if *u == uid);
        }
        assert!(changed, "the decision loop is told of the pod");
    }

    #[test]
    fn reads_what_decisions_need() {
        let p = ApiPod::from_pod(&pod(None, None)).expect("has a uid");
        assert_eq!(p.uid.as_str(), UID);
        assert_eq!((p.namespace.as_str(), p.name.as_str()), ("shop", "web-0"));
        assert_eq!(p.pod_kill(0), None);
        assert_eq!(p.grace(), Some(Duration::from_secs(45)));
        assert_eq!(p.restart_policy.as_deref(), Some("Never"));
        assert!(p
            .annotations
            .contains_key("exitorder.io/container-exit-priority"));
    }

    /// Runtime-only mode knows a completing pod as the API server would have told it.
    #[test]
    fn the_webhooks_record_tells_what_the_spec_does() {
        let spec: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(serde_json::json!({
            "restartPolicy": "Never",
            "initContainers": [{"name": "mesh", "restartPolicy": "Always"}],
            "containers": [{"name": "worker", "restartPolicy": "OnFailure"}, {"name": "logs"}]}))
        .expect("a spec");
        let mut from_api = pod(None, None);
        from_api.spec = Some(spec.clone());
        let from_api = ApiPod::from_pod(&from_api).expect("a uid");
        let record = RestartRecord::of_spec(&spec)
            .to_annotation()
            .expect("small");
        let mut sandbox = SandboxInfo {
            id: "sb".into(),
            pod_uid: crate::pod::test_uid(UID),
            namespace: "shop".into(),
            name: "web-0".into(),
            annotations: [
                (annotation::RESTARTS.to_owned(), record),
                (
                    annotation::NATIVE_SIDECARS.to_owned(),
                    r#"["mesh"]"#.to_owned(),
                ),
            ]
            .into(),
            created_at: 1,
        };
        let grace = Some(Duration::from_secs(45));
        let known = ApiPod::from_record(&sandbox, grace)
            .expect("a record")
            .expect("readable");
        assert_eq!(known.uid, from_api.uid);
        assert_eq!(
            (&known.namespace, &known.name),
            (&from_api.namespace, &from_api.name)
        );
        assert_eq!(known.restart_policy, from_api.restart_policy);
        assert_eq!(known.containers, from_api.containers);
        assert_eq!(known.restarts, from_api.restarts);
        assert_eq!(known.native_sidecars, from_api.native_sidecars);
        assert_eq!(known.grace(), grace);
        assert!(!known.deleting);
        // Unreadable: an error to report, not a pod to act on.
        sandbox
            .annotations
            .insert(annotation::RESTARTS.to_owned(), "{".to_owned());
        assert!(matches!(
            ApiPod::from_record(&sandbox, grace),
            Some(Err(RecordError::Json(_)))
        ));
        sandbox.annotations.remove(annotation::RESTARTS);
        assert!(ApiPod::from_record(&sandbox, grace).is_none());
    }

    #[test]
    fn deletion_grace_overrides_the_spec() {
        let p = ApiPod::from_pod(&pod(Some(1_000), Some(5))).expect("has a uid");
        assert_eq!(p.pod_kill(0), Some(PodKill::Deletion));
        assert_eq!(p.grace(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn zero_deletion_grace_means_the_specs_as_the_kubelet_reads_it() {
        let p = ApiPod::from_pod(&pod(Some(1_000), Some(0))).expect("has a uid");
        assert_eq!(p.grace(), Some(Duration::from_secs(45)));
        let mut spec_zero = pod(Some(1_000), Some(0));
        spec_zero
            .spec
            .as_mut()
            .unwrap()
            .termination_grace_period_seconds = Some(0);
        let p = ApiPod::from_pod(&spec_zero).expect("has a uid");
        assert_eq!(p.grace(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn the_api_object_shows_a_kubelet_kill_only_once_it_is_over_or_past_its_deadline() {
        // Phase Running proves nothing (the kubelet keeps it through its own kills); a
        // terminal phase names the kill by its reason.
        for (phase, reason, kill) in [
            (None, None, None),
            (Some("Pending"), None, None),
            (Some("Running"), None, None),
            (Some("Unknown"), None, None),
            (Some("Failed"), Some("Evicted"), Some(PodKill::Eviction)),
            (
                Some("Failed"),
                Some("DeadlineExceeded"),
                Some(PodKill::ActiveDeadline),
            ),
            (
                Some("Failed"),
                Some("Terminated"),
                Some(PodKill::NodeShutdown),
            ),
            (
                Some("Failed"),
                Some("Preempting"),
                Some(PodKill::Preemption),
            ),
            (Some("Failed"), None, Some(PodKill::Unrecognised)),
            (Some("Succeeded"), None, Some(PodKill::Unrecognised)),
        ] {
            let mut p = pod(None, None);
            let status = p.status.as_mut().unwrap();
            status.phase = phase.map(str::to_owned);
            status.reason = reason.map(str::to_owned);
            let p = ApiPod::from_pod(&p).expect("has a uid");
            assert_eq!(p.pod_kill(0), kill, "{phase:?} {reason:?}");
        }
    }

    #[test]
    fn active_deadline_seconds_count_from_the_start_time() {
        let mut p = pod(None, None);
        p.spec.as_mut().unwrap().active_deadline_seconds = Some(60);
        p.status.as_mut().unwrap().start_time =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap(),
            ));
        let api = ApiPod::from_pod(&p).expect("has a uid");
        assert_eq!(api.active_deadline, Some(1_060));
        assert_eq!(api.pod_kill(1_059), None);
        assert_eq!(api.pod_kill(1_060), Some(PodKill::ActiveDeadline));
        // Any number a spec holds is bounded.
        p.spec.as_mut().unwrap().active_deadline_seconds = Some(i64::MAX);
        assert_eq!(ApiPod::from_pod(&p).expect("uid").active_deadline, None);
    }

    #[test]
    fn deleted_pods_are_remembered_within_bounds() {
        let base = ApiPod::from_pod(&pod(Some(1_000), None)).expect("has a uid");
        let with_uid = |i: usize| ApiPod {
            uid: numbered(i),
            ..base.clone()
        };
        let t0 = Instant::now();
        let mut t = HashMap::new();
        for i in 0..MAX_TOMBSTONES {
            assert_eq!(
                remember(&mut t, with_uid(i), t0 + Duration::from_millis(i as u64)),
                None
            );
        }
        // Full: the oldest goes, and says so.
        let later = t0 + Duration::from_secs(5);
        assert_eq!(
            remember(&mut t, with_uid(MAX_TOMBSTONES), later),
            Some(numbered(0))
        );
        assert_eq!(t.len(), MAX_TOMBSTONES);
        assert!(t.contains_key(&numbered(MAX_TOMBSTONES)));
        // Past the TTL, every one of them goes.
        remember(&mut t, with_uid(0), later + TOMBSTONE_TTL);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn object_without_a_pod_uid_is_skipped() {
        for uid in [None, Some(""), Some("u"), Some("../4f2c0000")] {
            let mut p = pod(None, None);
            p.metadata.uid = uid.map(str::to_owned);
            assert_eq!(ApiPod::from_pod(&p), None, "{uid:?}");
        }
    }

    #[test]
    fn negative_seconds_are_the_shortest_grace() {
        // The API server stores a negative grace period as 1 s; the kubelet never waits less.
        let mut p = pod(Some(1_000), Some(-1));
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(-3);
        let p = ApiPod::from_pod(&p).expect("has a uid");
        assert_eq!(p.grace(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn huge_seconds_are_bounded() {
        for secs in [i64::MAX, i64::MAX - 1, 1 << 62] {
            let mut p = pod(Some(1_000), Some(secs));
            p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(secs);
            let p = ApiPod::from_pod(&p).expect("has a uid");
            assert_eq!(p.grace(), Some(crate::decide::bounds::MAX_SPAN));
        }
    }
}
