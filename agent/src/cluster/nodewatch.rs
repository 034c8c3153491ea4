//! The agent's own Node, as the API server holds it: whether its kubelet says the node is
//! shutting down, and which kubelet it is. One watch of one object (field selector
//! `metadata.name`), as every kubelet holds of its own Node; served from the API server's watch
//! cache, with an event only when the Node's object changes (its status is written every
//! `nodeStatusReportFrequency`, 5 min by default, or on a change such as this one).
//!
//! Graceful node shutdown keeps every pod `Running` in the API (see [`crate::kubelet`]) and
//! records no Event per pod; what it does publish is the Node's `Ready` condition turned
//! `False` with "node is shutting down" (`nodestatus/setters.go` `ReadyCondition`, from the
//! shutdown manager's `ShutdownStatus()`), posted beside the pods' kills. A kill seen before it
//! is ordered as any pod kill (the marks tell it) and gets its budget once it comes: every
//! pending wait is decided again then.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::cluster::watchloop;
use crate::cluster::PodSignal;

/// `nodeshutdown` `nodeShutdownNotAdmittedReason`'s companion: the message the shutdown
/// manager's `ShutdownStatus()` returns while the node shuts down, which the Ready condition
/// carries.
pub const SHUTTING_DOWN: &str = "node is shutting down";

/// What the agent reads of its Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The kubelet says the node is shutting down: every kill now is the shutdown's.
    pub shutting_down: bool,
    /// The kubelet's version, (major, minor), from `status.nodeInfo.kubeletVersion`.
    pub kubelet: Option<(u32, u32)>,
}

impl NodeFacts {
    pub fn of(node: &Node) -> NodeFacts {
        let status = node.status.as_ref();
        let shutting_down = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| {
                c.type_ == "Ready"
                    && c.status == "False"
                    && c.message
                        .as_deref()
                        .is_some_and(|m| m.contains(SHUTTING_DOWN))
            });
        let kubelet = status
            .and_then(|s| s.node_info.as_ref())
            .and_then(|i| kubelet_version(&i.kubelet_version));
        NodeFacts {
            shutting_down,
            kubelet,
        }
    }
}

/// `v1.31.4`, `v1.32.0-eks-1234`, `1.30.2+k3s1`: (major, minor).
pub fn kubelet_version(text: &str) -> Option<(u32, u32)> {
    let text = text.trim().trim_start_matches('v');
    let mut parts = text.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The decision loop's handle on the Node.
pub type NodeView = watch::Receiver<NodeFacts>;

/// The watch of the Node; [`NodeWatch::run`] drives it until shutdown.
pub struct NodeWatch {
    api: Api<Node>,
    name: String,
    facts: watch::Sender<NodeFacts>,
    tx: mpsc::UnboundedSender<PodSignal>,
}

/// A watch of the Node named `node`, and its view.
pub fn node_watch(
    client: Client,
    node: &str,
    tx: mpsc::UnboundedSender<PodSignal>,
) -> (NodeView, NodeWatch) {
    let (facts, view) = watch::channel(NodeFacts::default());
    (
        view,
        NodeWatch {
            api: Api::all(client),
            name: node.to_owned(),
            facts,
            tx,
        },
    )
}

struct Watching<'a>(&'a NodeWatch);

impl watchloop::Consumer<Node> for Watching<'_> {
    fn on_event(&mut self, ev: watcher::Event<Node>) -> bool {
        let (node, running) = match ev {
            watcher::Event::Apply(n) => (n, true),
            watcher::Event::InitApply(n) => (n, false),
            _ => return false,
        };
        if node.metadata.name.as_deref() != Some(self.0.name.as_str()) {
            return running;
        }
        let now = NodeFacts::of(&node);
        let changed = self.0.facts.send_if_modified(|f| {
            let changed = *f != now;
            *f = now.clone();
            changed
        });
        if changed {
            if now.shutting_down {
                info!(event = "node_shutdown", node = %self.0.name, "the kubelet says the node is shutting down: every kill is the shutdown's, within its budget");
            }
            let _ = self.0.tx.send(PodSignal::Node);
        }
        running
    }

    fn on_error(&mut self, e: &watcher::Error) {
        warn!(node = %self.0.name, error = %e, "the watch of this node failed (a graceful shutdown is then ordered with the pods' own grace); retrying");
    }
}

impl NodeWatch {
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let api = self.api.clone();
        let start = move || watcher(api.clone(), config.clone());
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        watchloop::run(start, &mut Watching(&self), backoff, shutdown).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubelet_versions() {
        assert_eq!(kubelet_version("v1.31.4"), Some((1, 31)));
        assert_eq!(kubelet_version("v1.32.0-eks-1234"), Some((1, 32)));
        assert_eq!(kubelet_version("1.30.2+k3s1"), Some((1, 30)));
        assert_eq!(kubelet_version("v1.35"), Some((1, 35)));
        assert_eq!(kubelet_version(""), None);
        assert_eq!(kubelet_version("vX.Y"), None);
    }

    #[test]
    fn the_ready_condition_says_shutting_down() {
        let node = |status: &str, message: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": {"name": "n"},
                "status": {
                    "conditions": [{"type": "Ready", "status": status, "message": message}],
                    "nodeInfo": {"kubeletVersion": "v1.33.1", "machineID": "", "systemUUID": "",
                        "bootID": "", "kernelVersion": "", "osImage": "",
                        "containerRuntimeVersion": "", "kubeProxyVersion": "",
                        "operatingSystem": "linux", "architecture": "amd64"},
                },
            }))
            .unwrap()
        };
        let f = NodeFacts::of(&node("False", "node is shutting down"));
        assert_eq!(
            f,
            NodeFacts {
                shutting_down: true,
                kubelet: Some((1, 33))
            }
        );
        assert!(!NodeFacts::of(&node("True", "kubelet is posting ready status")).shutting_down);
        assert!(!NodeFacts::of(&node("False", "container runtime is down")).shutting_down);
    }
}
