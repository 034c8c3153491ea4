//! The Node the fake API server's kubelet runs: its `Ready` condition, which the kubelet sets
//! `False` when graceful node shutdown begins (`nodestatus/setters.go` `ReadyCondition`: the
//! shutdown manager's `ShutdownStatus()` error, "node is shutting down", as its message).

use std::time::SystemTime;

use crate::kubelet::api::{self, reasons};
use serde_json::{json, Value};

use super::events::rfc3339;

pub(super) struct NodeState {
    pub name: String,
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet_version: String,
    /// `None`: ready; else why not (the Ready condition's message).
    pub not_ready: Option<String>,
    pub since: SystemTime,
    pub resource_version: u64,
}

impl Default for NodeState {
    fn default() -> Self {
        NodeState {
            name: "fake-node".to_owned(),
            kubelet_version: "v1.34.2".to_owned(),
            not_ready: None,
            since: SystemTime::now(),
            resource_version: 0,
        }
    }
}

impl NodeState {
    /// The shutdown manager's view reached the Node's status; `true` when it changed.
    pub fn shutting_down(&mut self, rv: u64) -> bool {
        if self.not_ready.is_some() {
            return false;
        }
        self.not_ready = Some(api::NODE_SHUTTING_DOWN.to_owned());
        self.since = SystemTime::now();
        self.resource_version = rv;
        true
    }

    /// The Node as the API server returns it.
    pub fn to_json(&self) -> Value {
        let (status, reason, message) = match &self.not_ready {
            None => ("True", "KubeletReady", "kubelet is posting ready status"),
            Some(m) => ("False", reasons::KUBELET_NOT_READY, m.as_str()),
        };
        let now = rfc3339(SystemTime::now());
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "uid": "6f0d3e2a-1b7c-4c55-9a3e-0c1d2e3f4a5b",
                "resourceVersion": self.resource_version.to_string(),
            },
            "status": {
                "conditions": [{
                    "type": "Ready",
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": rfc3339(self.since),
                }],
                "nodeInfo": {
                    "kubeletVersion": self.kubelet_version,
                    "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                    "osImage": "", "containerRuntimeVersion": "containerd://1.6.20",
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
                },
            },
        })
    }
}
