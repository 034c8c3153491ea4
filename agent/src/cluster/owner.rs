//! The agent's own DaemonSet: the only way to tell an uninstall from a restart. Both reach
//! the agent the same way (the kubelet stops its pod); only in an uninstall is the DaemonSet
//! gone (background deletion, `helm uninstall`'s) or being deleted (foreground). A rolling
//! update, a pod deleted by hand, a node drain and a crash all leave it in place, and the
//! next agent answers the waits the last one left.
//!
//! Watched, not only read at SIGTERM: `helm uninstall` deletes the DaemonSet and then, at
//! once, the agent's RBAC and ServiceAccount, while the DaemonSet's pods are stopped later by
//! the garbage collector; a read at SIGTERM then meets a 401 or 403. The watch of this one
//! object (field selector `metadata.name`, allowed by the Role's `resourceNames`) has seen
//! the deletion by then. The read at SIGTERM stays for what the watch may have missed.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::runtime::watcher;
use kube::{Api, Client};
use tracing::{info, warn};

use crate::agent::Farewell;
use crate::backoff::Backoff;

/// How long the read at SIGTERM may take: part of the agent's bounded shutdown, and a read
/// that does not come back is taken for a restart (waits kept), as is any failure.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The agent's DaemonSet, `namespace/name`, and what its watch has seen of it.
#[derive(Debug, Clone)]
pub struct Owner {
    api: Api<DaemonSet>,
    namespace: String,
    name: String,
    deleted: Arc<AtomicBool>,
    /// Seen in the watch's current list.
    listed: Arc<AtomicBool>,
}

impl Owner {
    pub fn new(client: Client, namespace: &str, name: &str) -> Owner {
        Owner {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            deleted: Arc::default(),
            listed: Arc::default(),
        }
    }

    fn shown(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Watches the DaemonSet until `shutdown`, remembering a deletion.
    pub async fn watch(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        loop {
            let stream = watcher(self.api.clone(), config.clone());
            tokio::pin!(stream);
            let failed = loop {
                tokio::select! {
                    () = &mut shutdown => return,
                    item = stream.next() => match item {
                        Some(Ok(ev)) => {
                            backoff.reset();
                            self.on_event(ev);
                        }
                        Some(Err(e)) => break Some(e),
                        None => break None,
                    }
                }
            };
            if let Some(e) = failed {
                warn!(daemonset = %self.shown(), error = %e, "the watch of the agent's DaemonSet failed (an uninstall is then told by a read at SIGTERM); retrying");
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }

    fn on_event(&self, ev: watcher::Event<DaemonSet>) {
        let deleting = |ds: &DaemonSet| ds.metadata.deletion_timestamp.is_some();
        let gone = match ev {
            watcher::Event::Delete(_) => true,
            watcher::Event::Apply(ds) => deleting(&ds),
            watcher::Event::InitApply(ds) => {
                self.listed.store(true, Ordering::Release);
                deleting(&ds)
            }
            watcher::Event::Init => {
                self.listed.store(false, Ordering::Release);
                false
            }
            watcher::Event::InitDone => {
                if self.listed.load(Ordering::Acquire) {
                    info!(daemonset = %self.shown(), "watching the agent's DaemonSet: a stop while it is deleted is an uninstall");
                } else {
                    // A wrong name (hand-written manifests) would make every restart an
                    // uninstall: said now, not found out at the next rolling update.
                    warn!(daemonset = %self.shown(), "the agent's DaemonSet is not found (is EXITORDER_DAEMONSET right?): a stop will be taken for an uninstall, letting every waiting sidecar on the node go");
                }
                false
            }
        };
        if gone && !self.deleted.swap(true, Ordering::AcqRel) {
            info!(daemonset = %self.shown(), "the agent's DaemonSet is being deleted: at its stop the agent lets every wait on the node go");
        }
    }

    /// Whether the agent leaves for good: its DaemonSet was seen deleted, or is gone or being
    /// deleted now. Anything else, an API server that does not answer included, is a restart.
    pub async fn farewell(&self) -> Farewell {
        if self.deleted.load(Ordering::Acquire) {
            return Farewell::Uninstall;
        }
        let ds = self.shown();
        match tokio::time::timeout(CHECK_TIMEOUT, self.api.get_opt(&self.name)).await {
            Ok(Ok(None)) => {
                info!(daemonset = %ds, "the agent's DaemonSet is gone: exitorder is being uninstalled from this node");
                Farewell::Uninstall
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
