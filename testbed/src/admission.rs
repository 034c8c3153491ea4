//! A pod through the admission webhook's own mutation, as the API server admits it: the
//! webhook's JSONPatch applied to the pod, or its denial. The one pass the demo, the bench and
//! the end-to-end tests share.

use exitorder::webhook::{Admission, Settings};
use serde_json::Value;

/// The webhook's answer, with its patch applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    /// The pod as the API server stores it.
    pub pod: Value,
    /// What the API server would show `kubectl` beside it.
    pub warnings: Vec<String>,
}

/// Why a pod was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error("the webhook refuses the pod: {0}")]
    Denied(String),
    #[error("the webhook's patch does not apply: {0}")]
    Patch(#[from] json_patch::PatchError),
}

/// `pod` as the API server stores it once the webhook with `settings` has admitted it.
pub fn admit(pod: &Value, settings: &Settings) -> Result<Admitted, AdmitError> {
    match exitorder::webhook::mutate(pod, settings) {
        Admission::Deny(message) => Err(AdmitError::Denied(message)),
        Admission::Allow { patch, warnings } => {
            let mut pod = pod.clone();
            json_patch::patch(&mut pod, &patch)?;
            Ok(Admitted { pod, warnings })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exitorder_contract::annotation;
    use serde_json::json;

    /// An opted-in pod whose second container is a sidecar the webhook knows by name.
    fn meshed(priorities: Option<&str>) -> Value {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": {annotation::INJECT: "true"}},
            "spec": {"containers": [
                {"name": "app", "image": "busybox"},
                {"name": "linkerd-proxy", "image": "busybox"},
            ]},
        });
        if let Some(p) = priorities {
            pod["metadata"]["annotations"][annotation::PRIORITY] = json!(p);
        }
        pod
    }

    #[test]
    fn the_patch_is_applied_to_a_copy() {
        let pod = meshed(None);
        let settings = Settings {
            handshake_volume: exitorder::webhook::HandshakeVolume::HostPath,
            ..Settings::default()
        };
        let admitted = admit(&pod, &settings).unwrap();
        assert_ne!(
            admitted.pod, pod,
            "an opted-in pod with a sidecar is changed"
        );
        let proxy = &admitted.pod["spec"]["containers"][1];
        assert!(
            proxy["lifecycle"]["preStop"].is_object(),
            "the sidecar waits in its preStop: {proxy}"
        );
        assert_eq!(pod["spec"]["containers"][1].get("lifecycle"), None);
    }

    #[test]
    fn a_denial_is_an_error_with_the_webhooks_message() {
        let pod = meshed(Some("not json"));
        match admit(&pod, &Settings::default()) {
            Err(AdmitError::Denied(m)) => assert!(m.contains(annotation::PRIORITY), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
