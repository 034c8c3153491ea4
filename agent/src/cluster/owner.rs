//! The agent's own DaemonSet: the only way to tell an uninstall from a restart. Both reach
//! the agent the same way (the kubelet stops its pod); only in an uninstall is the DaemonSet
//! gone (background deletion, `helm uninstall`'s) or being deleted (foreground). A rolling
//! update, a pod deleted by hand, a node drain and a crash all leave it in place, and the
//! next agent answers the waits the last one left.
//!
//! Watched, not only read at SIGTERM: `helm uninstall` deletes the DaemonSet and then, at
//! once, the agent's RBAC and ServiceAccount (helm `pkg/releaseutil/kind_sorter.go`
//! `UninstallOrder`: DaemonSet before RoleBinding, Role and ServiceAccount), while the
//! DaemonSet's pods are stopped later by the garbage collector; a read at SIGTERM then meets a
//! 401 or 403. The watch of this one
//! object (field selector `metadata.name`, allowed by the Role's `resourceNames`) has seen
//! the deletion by then. The read at SIGTERM stays for what the watch may have missed.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::runtime::watcher;
use kube::{Api, Client};
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::cluster::watchloop;

/// Why the agent stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Farewell {
    /// Restarted, upgraded or stopped by hand, or not known: waits stay for the next agent.
    #[default]
    Restart,
    /// exitorder is being uninstalled from the node.
    Uninstall,
}

/// The watch's consumer: what it sees goes into the owner's [`Seen`].
struct Watching<'a>(&'a Owner);

impl watchloop::Consumer<DaemonSet> for Watching<'_> {
    fn on_event(&mut self, ev: watcher::Event<DaemonSet>) -> bool {
        let running = matches!(ev, watcher::Event::Apply(_) | watcher::Event::Delete(_));
        self.0.on_event(ev);
        running
    }

    fn on_error(&mut self, e: &watcher::Error) {
        warn!(daemonset = %self.0.shown(), error = %e, "the watch of the agent's DaemonSet failed (an uninstall is then told by a read at SIGTERM); retrying");
    }
}

/// How long the read at SIGTERM may take: part of the agent's bounded shutdown, and a read
/// that does not come back is taken for a restart (waits kept), as is any failure.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The agent's DaemonSet, `namespace/name`, and what its watch has seen of it.
#[derive(Debug, Clone)]
pub struct Owner {
    api: Api<DaemonSet>,
    namespace: String,
    name: String,
    seen: Arc<Mutex<Seen>>,
}

impl Seen {
    /// Takes one watch event in; at the end of a listing, whether the DaemonSet was in it.
    fn on(&mut self, ev: watcher::Event<DaemonSet>) -> Option<bool> {
        match ev {
            watcher::Event::Delete(ds) => {
                self.uid = ds.metadata.uid.or(self.uid.take());
                self.deleted = true;
            }
            watcher::Event::Apply(ds) | watcher::Event::InitApply(ds) => {
                self.listed = true;
                self.deleted = ds.metadata.deletion_timestamp.is_some();
                self.uid = ds.metadata.uid;
            }
            watcher::Event::Init => self.listed = false,
            watcher::Event::InitDone => {
                // Seen before and missing from a fresh listing: deleted while the watch was
                // down (a listing says nothing of what it no longer holds).
                if !self.listed && self.uid.is_some() {
                    self.deleted = true;
                }
                return Some(self.listed);
            }
        }
        None
    }
}

/// What the watch has seen of the DaemonSet.
#[derive(Debug, Default)]
struct Seen {
    /// The UID of the object last seen by that name: a 404 is an uninstall only for a
    /// DaemonSet this agent has seen (a wrong name must not make every restart one).
    uid: Option<String>,
    /// Seen deleted, or with a `deletionTimestamp`; cleared when a live object of that name
    /// is seen again (deleted with `--cascade=orphan` and created again: the agents adopted).
    deleted: bool,
    /// In the watch's current list.
    listed: bool,
}

impl Owner {
    pub fn new(client: Client, namespace: &str, name: &str) -> Owner {
        Owner {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            seen: Arc::default(),
        }
    }

    fn shown(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Watches the DaemonSet until `shutdown`, remembering a deletion.
    pub async fn watch(self, shutdown: impl Future<Output = ()>) {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let api = self.api.clone();
        let start = move || watcher(api.clone(), config.clone());
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        watchloop::run(start, &mut Watching(&self), backoff, shutdown).await;
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        match self.seen.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn on_event(&self, ev: watcher::Event<DaemonSet>) {
        let mut seen = self.seen();
        let was_deleted = seen.deleted;
        if let Some(listed) = seen.on(ev) {
            if listed {
                info!(daemonset = %self.shown(), "watching the agent's DaemonSet: a stop while it is deleted is an uninstall");
            } else if seen.uid.is_none() {
                // A wrong name (hand-written manifests, a kustomize prefix): every stop is
                // then taken for a restart, and after an uninstall the sidecars wait out their
                // own timeout. Said now, not found out then.
                warn!(daemonset = %self.shown(), "the agent's DaemonSet is not found (is EXITORDER_DAEMONSET right?): an uninstall cannot be told from a restart, and leaves waits to the sidecars' own timeout");
            }
        }
        if seen.deleted && !was_deleted {
            info!(daemonset = %self.shown(), "the agent's DaemonSet is being deleted: at its stop the agent lets every wait on the node go");
        }
    }

    /// Whether the agent leaves for good: its DaemonSet was seen deleted, or is gone or being
    /// deleted now (a 404 only for one this agent has seen). Anything else, an API server that
    /// does not answer included, is a restart.
    pub async fn farewell(&self) -> Farewell {
        let (deleted, known) = {
            let seen = self.seen();
            (seen.deleted, seen.uid.clone())
        };
        if deleted {
            return Farewell::Uninstall;
        }
        let ds = self.shown();
        match tokio::time::timeout(CHECK_TIMEOUT, self.api.get_opt(&self.name)).await {
            Ok(Ok(None)) if known.is_some() => {
                info!(daemonset = %ds, "the agent's DaemonSet is gone: exitorder is being uninstalled from this node");
                Farewell::Uninstall
            }
            Ok(Ok(None)) => {
                warn!(daemonset = %ds, "the agent's DaemonSet was never seen and is not found: stopping as for a restart (waits stay for the next agent)");
                Farewell::Restart
            }
            Ok(Ok(Some(ds_obj))) if ds_obj.metadata.deletion_timestamp.is_some() => {
                info!(daemonset = %ds, "the agent's DaemonSet is being deleted: exitorder is being uninstalled from this node");
                Farewell::Uninstall
            }
            Ok(Ok(Some(_))) => Farewell::Restart,
            Ok(Err(e)) => {
                warn!(daemonset = %ds, error = %e, "cannot read the agent's DaemonSet; stopping as for a restart (waits stay for the next agent)");
                Farewell::Restart
            }
            Err(_) => {
                warn!(daemonset = %ds, timeout = ?CHECK_TIMEOUT, "the agent's DaemonSet could not be read in time; stopping as for a restart (waits stay for the next agent)");
                Farewell::Restart
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn ds(uid: &str, deleting: bool) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("exitorder".into()),
                uid: Some(uid.into()),
                deletion_timestamp: deleting
                    .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                ..ObjectMeta::default()
            },
            ..DaemonSet::default()
        }
    }

    fn listed(seen: &mut Seen, objects: Vec<DaemonSet>) -> Option<bool> {
        seen.on(watcher::Event::Init);
        for o in objects {
            seen.on(watcher::Event::InitApply(o));
        }
        seen.on(watcher::Event::InitDone)
    }

    #[test]
    fn a_deletion_is_remembered_until_a_live_one_is_seen_again() {
        let mut seen = Seen::default();
        assert_eq!(listed(&mut seen, vec![ds("a", false)]), Some(true));
        assert!(!seen.deleted);
        // Foreground deletion: the object stays, marked.
        seen.on(watcher::Event::Apply(ds("a", true)));
        assert!(seen.deleted);
        // Deleted with --cascade=orphan and created again: the agents are adopted.
        seen.on(watcher::Event::Delete(ds("a", false)));
        assert!(seen.deleted);
        seen.on(watcher::Event::Apply(ds("b", false)));
        assert!(!seen.deleted);
        assert_eq!(seen.uid.as_deref(), Some("b"));
    }

    #[test]
    fn one_gone_while_the_watch_was_down_is_deleted_and_one_never_seen_is_not() {
        let mut seen = Seen::default();
        assert_eq!(listed(&mut seen, vec![]), Some(false));
        assert!(!seen.deleted && seen.uid.is_none());
        assert_eq!(listed(&mut seen, vec![ds("a", false)]), Some(true));
        assert_eq!(listed(&mut seen, vec![]), Some(false));
        assert!(seen.deleted);
    }
}
