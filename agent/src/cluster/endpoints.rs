//! A pod's endpoints, followed while an app of a pod that waits for them is held (see
//! [`crate::decide::endpoints`]): whether any EndpointSlice still lists the pod as ready, and
//! when none does any more.
//!
//! What the EndpointSlice controller writes (kubernetes `pkg/controller/endpointslice`,
//! `staging/src/k8s.io/endpointslice` `podToEndpoint`): a pod being deleted stays in its
//! Services' slices with `ready: false`, `serving` as its readiness, `terminating: true`
//! (KEP-1672); a Service with `publishNotReadyAddresses` keeps `ready: true` on it by design,
//! so `terminating: true` counts as withdrawn too. Endpoints are matched by `targetRef.uid`.
//!
//! The cost to the API server, per deletion of a pod that asked (none for any other pod, and
//! none while no such pod is being deleted): one LIST of the EndpointSlices of the pod's
//! namespace with `resourceVersion=0` (served from the watch cache, not etcd) to find the
//! slices that list it, then one LIST+WATCH of its Services' slices by their
//! `kubernetes.io/service-name` label, also from the cache, held until the withdrawal (about
//! the controller's delay, a second or less) and at most the pod's maximum wait. No watch
//! outlives its pod's waits, and no node watches the cluster's slices: at 5,000 nodes of 110
//! pods, a rollout of every pod costs 2 reads and one short watch per pod deleted, spread as
//! the rollout spreads its deletions.
//!
//! Parts: [`Request`] (what the decision loop asks), [`Follower`] (the one task answering,
//! each pod followed by its own future inside it), [`state_of`] (a pod's state from slices).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt as _;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::Client;
use tokio::sync::mpsc;
use tracing::debug;

use crate::cluster::PodSignal;
use crate::decide::endpoints::{Untold, Withdrawal};
use crate::pod::PodUid;
use crate::stats::Stats;
use exitorder_contract::endpoints::SERVICE_NAME_LABEL;

/// How long the first read may take; a slower API server leaves the wait to its settle time.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A follow the decision loop asks for, or ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Follow the endpoints of this pod of this namespace.
    Follow { uid: PodUid, namespace: String },
    /// Its waits are over: stop.
    Stop(PodUid),
}

/// Where one pod's slices say it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// No slice lists it.
    Absent,
    /// Listed, and ready in at least one slice.
    Ready,
    /// Listed, but nowhere ready (withdrawn, terminating, or never ready).
    NotReady,
}

/// Where the slices `slices` say the pod `uid` stands.
pub fn state_of<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>, uid: &str) -> Listing {
    let mut listed = false;
    for slice in slices {
        for e in slice.endpoints.iter().flatten() {
            if e.target_ref.as_ref().and_then(|r| r.uid.as_deref()) != Some(uid) {
                continue;
            }
            listed = true;
            let c = e.conditions.as_ref();
            // `ready` unset reads as true (the API's own rule); a terminating endpoint is
            // withdrawn even where `publishNotReadyAddresses` keeps it ready.
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            if ready && !terminating {
                return Listing::Ready;
            }
        }
    }
    if listed {
        Listing::NotReady
    } else {
        Listing::Absent
    }
}

/// The Service a slice belongs to, by the controller's label; `None` for a slice without one
/// (or an empty one), which cannot be followed by it.
fn service_of(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(SERVICE_NAME_LABEL)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

type Follow = Abortable<Pin<Box<dyn Future<Output = ()> + Send>>>;

/// Answers [`Request`]s: each pod followed by a future of its own, all in this one task.
pub struct Follower {
    client: Client,
    rx: mpsc::UnboundedReceiver<Request>,
    tx: mpsc::UnboundedSender<PodSignal>,
    stats: Arc<Stats>,
}

impl Follower {
    pub(crate) fn new(
        client: Client,
        rx: mpsc::UnboundedReceiver<Request>,
        tx: mpsc::UnboundedSender<PodSignal>,
        stats: Arc<Stats>,
    ) -> Follower {
        Follower {
            client,
            rx,
            tx,
            stats,
        }
    }

    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut follows: FuturesUnordered<Follow> = FuturesUnordered::new();
        let mut handles: HashMap<PodUid, AbortHandle> = HashMap::new();
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                req = self.rx.recv() => match req {
                    None => break,
                    Some(Request::Follow { uid, namespace }) => {
                        if handles.contains_key(&uid) {
                            continue;
                        }
                        let (handle, registration) = AbortHandle::new_pair();
                        handles.insert(uid.clone(), handle);
                        let fut: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(follow(
                            self.client.clone(),
                            uid,
                            namespace,
                            self.tx.clone(),
                            self.stats.clone(),
                        ));
                        follows.push(Abortable::new(fut, registration));
                    }
                    Some(Request::Stop(uid)) => {
                        if let Some(h) = handles.remove(&uid) {
                            h.abort();
                        }
                    }
                },
                Some(_) = follows.next(), if !follows.is_empty() => {}
            }
        }
        for h in handles.into_values() {
            h.abort();
        }
    }
}

/// Follows one pod until no slice lists it as ready, telling each change.
async fn follow(
    client: Client,
    uid: PodUid,
    namespace: String,
    tx: mpsc::UnboundedSender<PodSignal>,
    stats: Arc<Stats>,
) {
    let tell = |withdrawal| {
        let _ = tx.send(PodSignal::Endpoints {
            uid: uid.clone(),
            withdrawal,
        });
    };
    let api: Api<EndpointSlice> = Api::namespaced(client, &namespace);
    stats.api_read("endpointslices");
    let listed = match tokio::time::timeout(
        READ_TIMEOUT,
        api.list(&ListParams::default().match_any()),
    )
    .await
    {
        Ok(Ok(list)) => list.items,
        Ok(Err(e)) => {
            stats.api_error("endpointslices_list");
            debug!(pod = %uid, error = %e, "reading the namespace's EndpointSlices failed");
            return tell(Withdrawal::Untold(Untold::NoApi));
        }
        Err(_) => {
            stats.api_error("endpointslices_timeout");
            return tell(Withdrawal::Untold(Untold::NoApi));
        }
    };
    let mine: Vec<&EndpointSlice> = listed
        .iter()
        .filter(|s| state_of([*s], uid.as_str()) != Listing::Absent)
        .collect();
    match state_of(mine.iter().copied(), uid.as_str()) {
        Listing::Absent => return tell(Withdrawal::NotListed),
        Listing::NotReady => return tell(Withdrawal::Withdrawn(Instant::now())),
        Listing::Ready => tell(Withdrawal::Listed),
    }
    let services: BTreeSet<&str> = mine.iter().filter_map(|s| service_of(s)).collect();
    let unlabelled = mine.iter().any(|s| service_of(s).is_none());
    if services.is_empty() || unlabelled {
        // Slices written by hand carry no Service's label to follow them by: nothing tells
        // their withdrawal, and the settle time alone is waited.
        return tell(Withdrawal::Untold(Untold::NoApi));
    }
    let selector = format!(
        "{SERVICE_NAME_LABEL} in ({})",
        services.into_iter().collect::<Vec<_>>().join(",")
    );
    stats.api_read("endpointslices_watch");
    let config = watcher::Config::default().labels(&selector).any_semantic();
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
    let mut slices: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut relist: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut untold = false;
    while let Some(ev) = stream.next().await {
        let changed = match ev {
            Ok(watcher::Event::Apply(s)) => {
                slices.insert(s.metadata.name.clone().unwrap_or_default(), s);
                true
            }
            Ok(watcher::Event::Delete(s)) => {
                slices.remove(s.metadata.name.as_deref().unwrap_or_default());
                true
            }
            Ok(watcher::Event::Init) => {
                relist.clear();
                false
            }
            Ok(watcher::Event::InitApply(s)) => {
                relist.insert(s.metadata.name.clone().unwrap_or_default(), s);
                false
            }
            Ok(watcher::Event::InitDone) => {
                slices = std::mem::take(&mut relist);
                if untold && state_of(slices.values(), uid.as_str()) == Listing::Ready {
                    // Back after an outage, and still listed: the withdrawal is waited for
                    // again, up to the maximum.
                    untold = false;
                    tell(Withdrawal::Listed);
                }
                true
            }
            Err(e) => {
                stats.api_error("endpointslices_watch");
                debug!(pod = %uid, error = %e, "the watch of the pod's EndpointSlices failed");
                if !untold {
                    untold = true;
                    tell(Withdrawal::Untold(Untold::NoApi));
                }
                false
            }
        };
        if changed && state_of(slices.values(), uid.as_str()) != Listing::Ready {
            return tell(Withdrawal::Withdrawn(Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(endpoints: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "s", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "endpoints": endpoints,
        }))
        .expect("slice")
    }

    fn ep(uid: &str, conditions: serde_json::Value) -> serde_json::Value {
        json!({"addresses": ["10.0.0.1"], "conditions": conditions,
               "targetRef": {"kind": "Pod", "name": "p", "uid": uid}})
    }

    #[test]
    fn a_pod_is_ready_only_where_an_endpoint_of_its_uid_is_ready_and_not_terminating() {
        #[rustfmt::skip]
        let table = [
            ("not listed", json!([ep("other", json!({"ready": true}))]), Listing::Absent),
            ("ready", json!([ep("me", json!({"ready": true, "serving": true, "terminating": false}))]), Listing::Ready),
            ("ready unset reads as ready", json!([ep("me", json!({}))]), Listing::Ready),
            ("terminating", json!([ep("me", json!({"ready": false, "serving": true, "terminating": true}))]), Listing::NotReady),
            ("publishNotReadyAddresses keeps it ready while terminating",
             json!([ep("me", json!({"ready": true, "serving": true, "terminating": true}))]), Listing::NotReady),
            ("not ready", json!([ep("me", json!({"ready": false}))]), Listing::NotReady),
        ];
        for (what, eps, want) in table {
            assert_eq!(state_of([&slice(eps)], "me"), want, "{what}");
        }
        // One slice still ready is enough.
        let a = slice(json!([ep(
            "me",
            json!({"ready": false, "terminating": true})
        )]));
        let b = slice(json!([ep("me", json!({"ready": true}))]));
        assert_eq!(state_of([&a, &b], "me"), Listing::Ready);
    }
}
