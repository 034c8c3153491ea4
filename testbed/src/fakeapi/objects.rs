//! Pods as the API server returns them: scheduled and running (a pod the test bed runs among
//! them), being deleted (as a deletion asked now writes it), in another phase.

use std::time::SystemTime;

use serde_json::{json, Value};

/// A pod as the API server returns it. `deleted` is (seconds from now until the kill,
/// deletionGracePeriodSeconds).
pub fn pod(uid: &str, name: &str, node: &str, deleted: Option<(i64, i64)>) -> Value {
    let mut meta = json!({
        "name": name,
        "namespace": "default",
        "uid": uid,
        "annotations": {"exitorder.io/container-exit-priority": "{\"proxy\":1}"},
    });
    if let Some((in_secs, grace)) = deleted {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs() as i64;
        let ts = k8s_openapi::jiff::Timestamp::from_second(now + in_secs).expect("time");
        meta["deletionTimestamp"] = json!(ts.to_string());
        meta["deletionGracePeriodSeconds"] = json!(grace);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 30,
            "restartPolicy": "Always",
            "containers": [{"name": "app", "image": "app"}, {"name": "proxy", "image": "proxy"}],
        },
        "status": {"phase": "Running"},
    })
}

/// `pod` being deleted, as the API server writes a deletion asked now with `grace` seconds
/// (a later, shorter one rewrites both fields).
pub fn deleting(mut pod: Value, grace: i64) -> Value {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    let ts = k8s_openapi::jiff::Timestamp::from_second(now + grace).expect("time");
    pod["metadata"]["deletionTimestamp"] = json!(ts.to_string());
    pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    pod
}

/// `pod` in another phase (the kubelet sets Failed when it evicts a pod).
pub fn with_phase(mut pod: Value, phase: &str) -> Value {
    pod["status"]["phase"] = json!(phase);
    pod
}

/// `pod` as the API server holds it once the kubelet of `node` runs it as `running`:
/// scheduled there, `Running`.
pub fn api_pod_of(pod: &Value, running: &crate::kubelet::RunningPod, node: &str) -> Value {
    let mut api_pod = pod.clone();
    api_pod["metadata"]["uid"] = running.uid().into();
    api_pod["metadata"]["name"] = running.name().into();
    api_pod["metadata"]["namespace"] = running.namespace().into();
    api_pod["spec"]["nodeName"] = node.into();
    api_pod["status"] = json!({"phase": "Running"});
    api_pod
}
