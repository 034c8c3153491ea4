//! The fake API server as the test bed kubelet's API server: its Events stored through the
//! recorder's pipeline, its status written on the pod, its Node's Ready condition.

use crate::kubelet::api::{self, reasons};
use crate::{ApiSink, ApiStatus, EventType, KubeletEvent, PodRef};
use serde_json::{json, Value};

use super::events::{rfc3339, Involved};
use super::FakeApi;

impl FakeApi {
    /// The kubelet's recorder sends its Events as client-go's does from here on: one sender
    /// (`tools/record/event.go` `StartEventWatcher`: one goroutine writing them to the API
    /// server in order), each write taking `latency`, so a burst queues behind its first.
    /// Each Event keeps the time the kubelet made it.
    pub fn send_kubelet_events_after(&self, latency: std::time::Duration) {
        let (tx, rx) = std::sync::mpsc::channel::<(PodRef, KubeletEvent)>();
        let api = self.clone();
        std::thread::spawn(move || {
            for (pod, event) in rx {
                std::thread::sleep(latency);
                api.store_kubelet_event(&pod, &event);
            }
        });
        self.lock().kubelet_sender = Some(tx);
    }

    fn store_kubelet_event(&self, pod: &PodRef, event: &KubeletEvent) {
        let mut s = self.lock();
        if s.drop_kubelet_events {
            return;
        }
        // `ref.GetReference`: the pod's own resourceVersion, as the kubelet last saw it.
        let resource_version = s
            .pods
            .get(&pod.uid)
            .and_then(|p| p["metadata"]["resourceVersion"].as_str())
            .map(str::to_owned);
        let involved = Involved {
            kind: "Pod".to_owned(),
            api_version: "v1".to_owned(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            resource_version,
        };
        let state = &mut *s;
        state
            .event_store
            .record_kubelet(&mut state.rv, &state.node.name, involved, event);
    }
}

impl ApiSink for FakeApi {
    fn event(&self, pod: &PodRef, event: &KubeletEvent) {
        let sender = self.lock().kubelet_sender.clone();
        match sender {
            Some(tx) => {
                let _ = tx.send((pod.clone(), event.clone()));
            }
            None => self.store_kubelet_event(pod, event),
        }
    }

    /// The pod with that UID gets the status (a pod the API server does not have is not
    /// written: the kubelet's status manager would get NotFound), published MODIFIED.
    fn status(&self, pod: &PodRef, status: &ApiStatus) {
        self.modify(&pod.uid, |p| write_status(p, status));
    }

    fn node_shutting_down(&self) {
        let mut s = self.lock();
        let rv = s.rv + 1;
        if !s.node.shutting_down(rv) {
            return;
        }
        s.rv = rv;
        // The status write reaches the Node's watchers.
        let line = bytes::Bytes::from(format!(
            "{}\n",
            json!({"type": "MODIFIED", "object": s.node.to_json()})
        ));
        s.node_history.push((rv, line.clone()));
        s.node_watchers.retain(|w| w.send(line.clone()).is_ok());
        if s.drop_kubelet_events {
            return;
        }
        // The shutdown manager's Event on the kubelet's nodeRef (kubelet.go: Kind Node, the
        // node's name as its name and UID, no namespace).
        let name = s.node.name.clone();
        let involved = Involved {
            kind: "Node".to_owned(),
            api_version: String::new(),
            namespace: String::new(),
            name: name.clone(),
            uid: name.clone(),
            resource_version: None,
        };
        let event = KubeletEvent {
            reason: reasons::NODE_SHUTDOWN_EVENT.to_owned(),
            kind: EventType::Normal,
            message: api::NODE_SHUTDOWN_DETECTED.to_owned(),
            field_path: None,
            at: std::time::SystemTime::now(),
        };
        let state = &mut *s;
        state
            .event_store
            .record_kubelet(&mut state.rv, &name, involved, &event);
    }
}

/// `status` written on the pod object: phase, reason and message as given (absent when
/// `None`), and the `DisruptionTarget` condition replaced or added when there is one (the
/// kubelet never takes one back).
fn write_status(pod: &mut Value, status: &ApiStatus) {
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    let st = &mut pod["status"];
    st["phase"] = json!(status.phase);
    for (key, value) in [("reason", &status.reason), ("message", &status.message)] {
        match value {
            Some(v) => st[key] = json!(v),
            None => {
                if let Some(o) = st.as_object_mut() {
                    o.remove(key);
                }
            }
        }
    }
    let Some(target) = &status.disruption_target else {
        return;
    };
    let condition = json!({
        "type": "DisruptionTarget",
        "status": "True",
        "reason": target.reason,
        "message": target.message,
        "lastTransitionTime": rfc3339(std::time::SystemTime::now()),
    });
    if !st["conditions"].is_array() {
        st["conditions"] = json!([]);
    }
    if let Some(conditions) = st["conditions"].as_array_mut() {
        conditions.retain(|c| c["type"] != "DisruptionTarget");
        conditions.push(condition);
    }
}
