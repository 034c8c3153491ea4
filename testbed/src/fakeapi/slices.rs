//! Services and their EndpointSlices (discovery.k8s.io/v1), with the EndpointSlice controller
//! played as kubernetes' `pkg/controller/endpointslice` writes them: one slice per Service
//! (label `kubernetes.io/service-name`), an endpoint per selected pod that is not terminal,
//! matched by `targetRef.uid`, with `podToEndpoint`'s conditions
//! (`staging/src/k8s.io/endpointslice/utils.go`): `serving` the pod's readiness,
//! `terminating` its `deletionTimestamp`, `ready` = `publishNotReadyAddresses || (serving &&
//! !terminating)`. A pod the fake holds without conditions is ready while `Running` (the test
//! bed's kubelet reports none).
//!
//! The controller acts a lag after each pod write (100 ms by default, as a quiet
//! controller-manager's queue and its write take; a test sets a busy one's), in the order of
//! the writes. Reads: a LIST (any `resourceVersion`) and a WATCH, both by namespace, both
//! selected by `kubernetes.io/service-name=NAME` or `kubernetes.io/service-name in (A,B)`.
//! Every change of a pod's endpoint is recorded, with its time, for tests to measure from.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use exitorder_contract::endpoints::SERVICE_NAME_LABEL;

/// The controller's default lag after a pod write.
pub const DEFAULT_LAG: Duration = Duration::from_millis(100);

/// One change of a pod's endpoint, as the controller wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceChange {
    pub at: SystemTime,
    pub service: String,
    pub pod_uid: String,
    /// `None`: the endpoint was removed.
    pub ready: Option<bool>,
    pub terminating: Option<bool>,
}

struct Service {
    selector: BTreeMap<String, String>,
    publish_not_ready: bool,
}

/// A watch of one namespace's slices, by the Services its selector names.
struct SliceWatcher {
    namespace: String,
    services: Option<BTreeSet<String>>,
    tx: mpsc::UnboundedSender<Bytes>,
}

/// The slices' part of the fake's state.
#[derive(Default)]
pub(super) struct Slices {
    services: BTreeMap<(String, String), Service>,
    /// Each Service's one slice, by (namespace, Service).
    slices: BTreeMap<(String, String), Value>,
    /// Every watch event sent: (resourceVersion, namespace, Service, line).
    history: Vec<(u64, String, String, Bytes)>,
    watchers: Vec<SliceWatcher>,
    lag: Option<Duration>,
    changes: Vec<SliceChange>,
    /// The controller's queue of pod writes: (when due, the pod, deleted).
    queue: Option<mpsc::UnboundedSender<(tokio::time::Instant, Value, bool)>>,
}

/// What a `labelSelector` of slices names: `None` for every slice; an error for a form the
/// fake does not play.
pub(super) fn selected(selector: Option<&str>) -> Result<Option<BTreeSet<String>>, String> {
    let Some(sel) = selector.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    if let Some(name) = sel.strip_prefix(&format!("{SERVICE_NAME_LABEL}=")) {
        return Ok(Some(BTreeSet::from([name.to_owned()])));
    }
    let set = sel
        .strip_prefix(SERVICE_NAME_LABEL)
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix("in"))
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("the fake selects slices by {SERVICE_NAME_LABEL} only: {sel}"))?;
    Ok(Some(set.split(',').map(|s| s.trim().to_owned()).collect()))
}

impl Slices {
    /// The controller's queue, for the task that works it.
    pub(super) fn take_queue(
        &mut self,
    ) -> mpsc::UnboundedReceiver<(tokio::time::Instant, Value, bool)> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.queue = Some(tx);
        rx
    }

    pub(super) fn set_lag(&mut self, lag: Duration) {
        self.lag = Some(lag);
    }

    pub(super) fn changes(&self) -> Vec<SliceChange> {
        self.changes.clone()
    }

    /// A pod was written (or deleted): the controller will see it after its lag.
    pub(super) fn pod_written(&self, pod: &Value, deleted: bool) {
        if self.services.is_empty() {
            return;
        }
        if let Some(q) = &self.queue {
            let due = tokio::time::Instant::now() + self.lag.unwrap_or(DEFAULT_LAG);
            let _ = q.send((due, pod.clone(), deleted));
        }
    }

    /// Adds a Service and its slice, listing the `pods` it selects at once.
    pub(super) fn add_service<'a>(
        &mut self,
        rv: &mut u64,
        namespace: &str,
        name: &str,
        selector: BTreeMap<String, String>,
        publish_not_ready: bool,
        pods: impl Iterator<Item = &'a Value>,
    ) {
        let key = (namespace.to_owned(), name.to_owned());
        self.services.insert(
            key.clone(),
            Service {
                selector,
                publish_not_ready,
            },
        );
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-fake"), "namespace": namespace,
                         "labels": {SERVICE_NAME_LABEL: name,
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
            "endpoints": [],
        });
        self.slices.insert(key.clone(), slice);
        for pod in pods {
            self.reconcile_one(&key, pod, false);
        }
        self.publish(rv, &key, "ADDED");
    }

    /// What the controller writes for `pod` in every Service of its namespace.
    pub(super) fn reconcile(&mut self, rv: &mut u64, pod: &Value, deleted: bool) {
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let keys: Vec<(String, String)> = self
            .services
            .keys()
            .filter(|(n, _)| *n == ns)
            .cloned()
            .collect();
        for key in keys {
            if self.reconcile_one(&key, pod, deleted) {
                self.publish(rv, &key, "MODIFIED");
            }
        }
    }

    /// Writes `pod`'s endpoint in the slice of Service `key`; whether it changed.
    fn reconcile_one(&mut self, key: &(String, String), pod: &Value, deleted: bool) -> bool {
        let Some(svc) = self.services.get(key) else {
            return false;
        };
        let labels = &pod["metadata"]["labels"];
        let selects = !svc.selector.is_empty()
            && svc
                .selector
                .iter()
                .all(|(k, v)| labels[k].as_str() == Some(v.as_str()));
        let phase = pod["status"]["phase"].as_str().unwrap_or_default();
        let terminal = phase == "Succeeded" || phase == "Failed";
        let want = (selects && !deleted && !terminal).then(|| endpoint(pod, svc.publish_not_ready));
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let Some(slice) = self.slices.get_mut(key) else {
            return false;
        };
        let Some(endpoints) = slice["endpoints"].as_array_mut() else {
            return false;
        };
        let at = endpoints
            .iter()
            .position(|e| e["targetRef"]["uid"].as_str() == Some(uid.as_str()));
        let changed = match (at, &want) {
            (None, None) => false,
            (Some(i), None) => {
                endpoints.remove(i);
                true
            }
            (None, Some(e)) => {
                endpoints.push(e.clone());
                true
            }
            (Some(i), Some(e)) if endpoints[i] != *e => {
                endpoints[i] = e.clone();
                true
            }
            (Some(_), Some(_)) => false,
        };
        if changed {
            let cond = want.as_ref().map(|e| &e["conditions"]);
            self.changes.push(SliceChange {
                at: SystemTime::now(),
                service: key.1.clone(),
                pod_uid: uid,
                ready: cond.and_then(|c| c["ready"].as_bool()),
                terminating: cond.and_then(|c| c["terminating"].as_bool()),
            });
        }
        changed
    }

    fn publish(&mut self, rv: &mut u64, key: &(String, String), kind: &str) {
        let Some(slice) = self.slices.get_mut(key) else {
            return;
        };
        *rv += 1;
        slice["metadata"]["resourceVersion"] = json!(rv.to_string());
        let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": slice})));
        self.history
            .push((*rv, key.0.clone(), key.1.clone(), line.clone()));
        self.watchers.retain(|w| {
            if w.namespace != key.0 || w.services.as_ref().is_some_and(|s| !s.contains(&key.1)) {
                return !w.tx.is_closed();
            }
            w.tx.send(line.clone()).is_ok()
        });
    }

    /// A LIST of `namespace`'s slices that `services` selects.
    pub(super) fn list(
        &self,
        rv: u64,
        namespace: &str,
        services: Option<&BTreeSet<String>>,
    ) -> Value {
        let items: Vec<&Value> = self
            .slices
            .iter()
            .filter(|((n, s), _)| n == namespace && services.is_none_or(|set| set.contains(s)))
            .map(|(_, v)| v)
            .collect();
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        })
    }

    /// A WATCH from `from`: what was sent since, then each change.
    pub(super) fn watch(
        &mut self,
        from: u64,
        namespace: &str,
        services: Option<BTreeSet<String>>,
    ) -> mpsc::UnboundedReceiver<Bytes> {
        let (tx, rx) = mpsc::unbounded_channel();
        for (_, _, _, line) in self.history.iter().filter(|(rv, n, s, _)| {
            *rv > from && n == namespace && services.as_ref().is_none_or(|set| set.contains(s))
        }) {
            let _ = tx.send(line.clone());
        }
        self.watchers.push(SliceWatcher {
            namespace: namespace.to_owned(),
            services,
            tx,
        });
        rx
    }

    /// Open watches end (an outage).
    pub(super) fn drop_watches(&mut self) {
        self.watchers.clear();
    }
}

/// `podToEndpoint`'s endpoint for `pod`.
fn endpoint(pod: &Value, publish_not_ready: bool) -> Value {
    let conditions = pod["status"]["conditions"].as_array();
    let serving = match conditions {
        Some(cs) => cs
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        None => pod["status"]["phase"] == "Running",
    };
    let terminating = !pod["metadata"]["deletionTimestamp"].is_null();
    let ready = publish_not_ready || (serving && !terminating);
    let ip = pod["status"]["podIP"].as_str().unwrap_or("127.0.0.1");
    json!({
        "addresses": [ip],
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
        "nodeName": pod["spec"]["nodeName"],
        "targetRef": {"kind": "Pod", "namespace": pod["metadata"]["namespace"],
                      "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
    })
}

impl super::FakeApi {
    /// A Service `name` in `namespace` selecting the pods with every label of `selector`,
    /// and its slice listing the pods already written.
    pub fn add_service(
        &self,
        namespace: &str,
        name: &str,
        selector: &[(&str, &str)],
        publish_not_ready: bool,
    ) {
        let mut s = self.lock();
        let state = &mut *s;
        let selector = selector
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        state.slices.add_service(
            &mut state.rv,
            namespace,
            name,
            selector,
            publish_not_ready,
            state.pods.values(),
        );
    }

    /// The EndpointSlice controller writes this long after each pod write, from the next.
    pub fn set_slice_lag(&self, lag: Duration) {
        self.lock().slices.set_lag(lag);
    }

    /// How many watches of slices are open (their clients still connected).
    pub fn open_slice_watches(&self) -> usize {
        self.lock()
            .slices
            .watchers
            .iter()
            .filter(|w| !w.tx.is_closed())
            .count()
    }

    /// Every change the controller made to a pod's endpoint, oldest first.
    pub fn slice_changes(&self) -> Vec<SliceChange> {
        self.lock().slices.changes()
    }

    /// The controller: works the queue of pod writes, each after its lag.
    pub(super) async fn endpointslice_controller(
        self,
        mut queue: mpsc::UnboundedReceiver<(tokio::time::Instant, Value, bool)>,
    ) {
        while let Some((due, pod, deleted)) = queue.recv().await {
            tokio::time::sleep_until(due).await;
            let mut s = self.lock();
            let state = &mut *s;
            state.slices.reconcile(&mut state.rv, &pod, deleted);
        }
    }

    /// A GET of `/apis/discovery.k8s.io/v1/namespaces/NS/endpointslices`, a LIST or a WATCH;
    /// `None` for any other path.
    pub(super) fn slices_request(
        &self,
        path: &str,
        q: &super::Query,
    ) -> Option<super::Response<super::Body>> {
        let ns = path
            .strip_prefix("/apis/discovery.k8s.io/v1/namespaces/")?
            .strip_suffix("/endpointslices")?;
        let services = match selected(q.get("labelSelector")) {
            Ok(s) => s,
            Err(m) => return Some(super::status(hyper::StatusCode::BAD_REQUEST, &m)),
        };
        if q.get("watch") == Some("true") {
            let from = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let rx = self.lock().slices.watch(from, ns, services);
            return Some(super::stream_response(rx));
        }
        let s = self.lock();
        let list = s.slices.list(s.rv, ns, services.as_ref());
        Some(super::json_response(hyper::StatusCode::OK, &list))
    }
}
