//! The fake API server's DaemonSets: the agent's own, listed, read and watched by name, and
//! made forbidden as `helm uninstall` leaves them once the agent's RBAC is deleted.

use bytes::Bytes;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::{json_response, status, Body, FakeApi, Query, State};

impl FakeApi {
    /// A GET under `/apis/apps/v1/namespaces/NS/daemonsets`: a list, a read or a watch;
    /// `None` for any other path.
    pub(super) fn daemonsets(&self, path: &str, q: &Query) -> Option<Response<Body>> {
        let rest = path.strip_prefix("/apis/apps/v1/namespaces/")?;
        let (ns, name) = match rest.strip_suffix("/daemonsets") {
            Some(ns) => (ns, None),
            None => {
                let (ns, name) = rest.split_once("/daemonsets/")?;
                (ns, Some(name))
            }
        };
        if self.lock().forbid_daemonsets {
            return Some(status(
                StatusCode::FORBIDDEN,
                "daemonsets.apps is forbidden",
            ));
        }
        if name.is_none() && q.get("watch") == Some("true") {
            let from = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            return Some(self.watch_of(from, |s| (&s.ds_history, &mut s.ds_watchers)));
        }
        let s = self.lock();
        if let Some(name) = name {
            return Some(match s.daemonsets.get(&(ns.to_owned(), name.to_owned())) {
                Some(ds) => json_response(StatusCode::OK, ds),
                None => status(
                    StatusCode::NOT_FOUND,
                    &format!("daemonsets.apps \"{name}\" not found"),
                ),
            });
        }
        let wanted = q
            .get("fieldSelector")
            .and_then(|f| f.strip_prefix("metadata.name="));
        let items: Vec<Value> = s
            .daemonsets
            .iter()
            .filter(|((n, name), _)| n == ns && wanted.is_none_or(|w| w == name))
            .map(|(_, ds)| ds.clone())
            .collect();
        let body = json!({
            "apiVersion": "apps/v1", "kind": "DaemonSetList",
            "metadata": {"resourceVersion": s.rv.to_string()},
            "items": items,
        });
        Some(json_response(StatusCode::OK, &body))
    }

    /// Creates the DaemonSet `namespace/name` (`deleting`: with a `deletionTimestamp`, as a
    /// foreground deletion leaves it while its pods go).
    pub fn put_daemonset(&self, namespace: &str, name: &str, deleting: bool) {
        let mut ds = daemonset(namespace, name);
        ds["metadata"]["resourceVersion"] = "1".into();
        if deleting {
            ds["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
        store(&mut self.lock(), namespace, name, ds);
    }

    /// The DaemonSet `namespace/name` (created when missing) at `generation`, its status as
    /// the DaemonSet controller writes it during a rollout: the generation it `observed`, the
    /// nodes it should run on (`desired`), those running the current template (`updated`) and
    /// those available.
    #[allow(clippy::too_many_arguments)]
    pub fn roll_daemonset(
        &self,
        namespace: &str,
        name: &str,
        generation: i64,
        observed: i64,
        desired: i32,
        updated: i32,
        available: i32,
    ) {
        let mut s = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let mut ds = s
            .daemonsets
            .get(&key)
            .cloned()
            .unwrap_or_else(|| daemonset(namespace, name));
        ds["metadata"]["generation"] = json!(generation);
        ds["status"] = json!({
            "observedGeneration": observed,
            "desiredNumberScheduled": desired,
            "currentNumberScheduled": desired,
            "numberMisscheduled": 0,
            "numberReady": available,
            "updatedNumberScheduled": updated,
            "numberAvailable": available,
        });
        store(&mut s, namespace, name, ds);
    }

    /// Removes the DaemonSet `namespace/name`, as a background deletion does at once.
    pub fn remove_daemonset(&self, namespace: &str, name: &str) {
        let mut s = self.lock();
        if let Some(ds) = s
            .daemonsets
            .remove(&(namespace.to_owned(), name.to_owned()))
        {
            publish(&mut s, "DELETED", ds);
        }
    }

    /// DaemonSet reads and watches answer 403 while on: the agent's RBAC deleted.
    pub fn forbid_daemonsets(&self, forbid: bool) {
        self.lock().forbid_daemonsets = forbid;
    }
}

/// The DaemonSet `namespace/name`, its pod template empty.
fn daemonset(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "uid": "ds-uid"},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}},
    })
}

/// Stores `ds` as `namespace/name` and tells the watches: ADDED, or MODIFIED when one was there.
fn store(s: &mut State, namespace: &str, name: &str, ds: Value) {
    let key = (namespace.to_owned(), name.to_owned());
    let kind = if s.daemonsets.contains_key(&key) {
        "MODIFIED"
    } else {
        "ADDED"
    };
    s.daemonsets.insert(key, ds.clone());
    publish(s, kind, ds);
}

/// Sends a DaemonSet's change to the DaemonSet watches.
fn publish(s: &mut State, kind: &str, mut ds: Value) {
    s.rv += 1;
    ds["metadata"]["resourceVersion"] = json!(s.rv.to_string());
    let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": ds})));
    s.ds_history.push((s.rv, line.clone()));
    s.ds_watchers.retain(|w| w.send(line.clone()).is_ok());
}
