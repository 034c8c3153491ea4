//! admission.k8s.io/v1 AdmissionReview in and out: the request body's bytes to the response
//! body's bytes, around the pure [`mutate`](super::mutate::mutate). Anything that is not a
//! review is refused with a reason (the HTTP layer answers 400), never a panic.
//!
//! The review types are written here rather than taken from kube's `admission` feature:
//! kube-core 5's `AdmissionResponse` writes `patch` as an array of numbers, where the API
//! documents base64 for every `[]byte` (kube-rs/kube#1781), and its `AdmissionRequest`
//! reads the object's metadata through typed `ObjectMeta`, so a request it cannot type is
//! refused before the mutation sees it. These read only the six fields the answer needs and
//! hand the object to [`mutate`](super::mutate::mutate) exactly as sent, so the patch is
//! made against the bytes the API server will apply it to.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::mutate::{self, Admission, Settings};

const API_VERSION: &str = "admission.k8s.io/v1";
const KIND: &str = "AdmissionReview";

/// How a review ended, for the metrics and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted with a patch.
    Patched,
    /// Admitted as it was (not opted in, already injected, not a pod creation).
    Unchanged,
    /// Refused, with a message for the user.
    Denied,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Patched, Outcome::Unchanged, Outcome::Denied];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Patched => "patched",
            Outcome::Unchanged => "unchanged",
            Outcome::Denied => "denied",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadReview {
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error("the body is not an admission.k8s.io/v1 AdmissionReview with a request: {0}")]
    NotReview(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<RequestIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn {
    uid: String,
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    kind: Option<GroupVersionKind>,
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct GroupVersionKind {
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut {
    uid: String,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    /// The JSONPatch, base64 as the API server's []byte fields are.
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut>,
}

#[derive(Serialize)]
struct StatusOut {
    code: u16,
    message: String,
}

/// One answered review.
#[derive(Debug)]
pub struct Answer {
    pub body: Vec<u8>,
    pub outcome: Outcome,
    /// `namespace/name` of the pod, or its generateName's namespace alone, for the log.
    pub pod: String,
    /// The denial's message, for the log.
    pub message: Option<String>,
}

/// What a review is asked of the webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// `/mutate`: the injection, for pod creations.
    Mutate,
    /// `/validate`: the share's guard, for every pod and ephemeral container sent.
    Validate,
}

/// Answers one request body to `/mutate`.
pub fn answer(body: &[u8], settings: &Settings) -> Result<Answer, BadReview> {
    answer_to(Ask::Mutate, body, settings)
}

/// Answers one request body.
pub fn answer_to(ask: Ask, body: &[u8], settings: &Settings) -> Result<Answer, BadReview> {
    let review: ReviewIn = serde_json::from_slice::<Value>(body)
        .map_err(|e| BadReview::NotJson(e.to_string()))
        .and_then(|v| serde_json::from_value(v).map_err(|e| BadReview::NotReview(e.to_string())))?;
    if review.api_version.as_deref() != Some(API_VERSION) || review.kind.as_deref() != Some(KIND) {
        return Err(BadReview::NotReview(format!(
            "apiVersion {:?}, kind {:?}",
            review.api_version.unwrap_or_default(),
            review.kind.unwrap_or_default()
        )));
    }
    let Some(req) = review.request else {
        return Err(BadReview::NotReview("no request".to_owned()));
    };
    let pod = format!(
        "{}/{}",
        req.namespace.as_deref().unwrap_or_default(),
        req.name.as_deref().unwrap_or_default()
    );
    let is_pod_creation = req.operation.as_deref() == Some("CREATE")
        && req
            .kind
            .as_ref()
            .is_some_and(|k| k.group.is_empty() && k.kind == "Pod");
    let is_pod = req
        .kind
        .as_ref()
        .is_some_and(|k| k.group.is_empty() && k.kind == "Pod");
    let pass = || Admission::Allow {
        patch: json_patch::Patch::default(),
        warnings: Vec::new(),
    };
    let admission = match (ask, &req.object) {
        (Ask::Mutate, Some(object)) if is_pod_creation => mutate::mutate(object, settings),
        // Pod creations, updates and ephemeral containers (an update of the subresource,
        // whose object is the whole pod) are what the guard's configuration sends.
        (Ask::Validate, Some(object)) if is_pod => {
            match super::guard::check(object, &settings.share_dir, &settings.bin_dir) {
                Ok(()) => pass(),
                Err(why) => Admission::Deny(why),
            }
        }
        // Anything else passes: it is no pod, or nothing the webhook is asked about.
        _ => pass(),
    };
    let (response, outcome, message) = match admission {
        Admission::Allow { patch, warnings } if patch.0.is_empty() => (
            ResponseOut {
                uid: req.uid,
                allowed: true,
                patch_type: None,
                patch: None,
                warnings,
                status: None,
            },
            Outcome::Unchanged,
            None,
        ),
        Admission::Allow { patch, warnings } => {
            let json = serde_json::to_vec(&patch)
                .map_err(|e| BadReview::NotReview(format!("the patch: {e}")))?;
            (
                ResponseOut {
                    uid: req.uid,
                    allowed: true,
                    patch_type: Some("JSONPatch"),
                    patch: Some(base64::engine::general_purpose::STANDARD.encode(json)),
                    warnings,
                    status: None,
                },
                Outcome::Patched,
                None,
            )
        }
        Admission::Deny(message) => (
            ResponseOut {
                uid: req.uid,
                allowed: false,
                patch_type: None,
                patch: None,
                warnings: Vec::new(),
                status: Some(StatusOut {
                    code: 403,
                    message: format!("exitorder: {message}"),
                }),
            },
            Outcome::Denied,
            Some(message),
        ),
    };
    let out = ReviewOut {
        api_version: API_VERSION,
        kind: KIND,
        response,
    };
    let body =
        serde_json::to_vec(&out).map_err(|e| BadReview::NotReview(format!("the answer: {e}")))?;
    Ok(Answer {
        body,
        outcome,
        pod,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn review(object: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "request": {"uid": "u-1", "operation": "CREATE",
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "namespace": "ns", "object": object}}))
        .unwrap()
    }

    #[test]
    fn broken_bodies_are_refused_with_a_reason() {
        let s = Settings::default();
        for body in [
            &b""[..],
            b"{",
            b"\xff\xfe",
            b"[]",
            b"null",
            b"{\"request\": 1}",
        ] {
            assert!(answer(body, &s).is_err(), "{body:?}");
        }
        let wrong = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": KIND,
                           "request": {"uid": "x"}});
        let e = answer(&serde_json::to_vec(&wrong).unwrap(), &s).unwrap_err();
        assert!(e.to_string().contains("v1beta1"), "{e}");
    }

    #[test]
    fn the_answer_carries_the_uid_and_a_base64_patch() {
        let pod = json!({"metadata": {"name": "p", "annotations": {"exitorder.io/inject": "true"}},
                         "spec": {"containers": [{"name": "app", "image": "a"},
                                                 {"name": "linkerd-proxy", "image": "l"}]}});
        let a = answer(&review(pod), &Settings::default()).unwrap();
        assert_eq!(a.outcome, Outcome::Patched);
        let out: Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(out["apiVersion"], API_VERSION);
        assert_eq!(out["response"]["uid"], "u-1");
        assert_eq!(out["response"]["allowed"], true);
        assert_eq!(out["response"]["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(out["response"]["patch"].as_str().unwrap())
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
        assert!(!patch.0.is_empty());
    }

    #[test]
    fn a_denial_has_a_status_message() {
        let pod = json!({"metadata": {"annotations": {"exitorder.io/inject": "true",
                                                      "exitorder.io/container-exit-priority": "{"}},
                         "spec": {"containers": [{"name": "app", "image": "a"}]}});
        let a = answer(&review(pod), &Settings::default()).unwrap();
        assert_eq!(a.outcome, Outcome::Denied);
        let out: Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["code"], 403);
        let m = out["response"]["status"]["message"].as_str().unwrap();
        assert!(m.contains("exitorder.io/container-exit-priority"), "{m}");
    }

    #[test]
    fn other_operations_pass_unchanged() {
        let body = serde_json::to_vec(&json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "request": {"uid": "u", "operation": "UPDATE",
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "object": {"metadata": {"annotations": {"exitorder.io/inject": "true"}}}}}))
        .unwrap();
        let a = answer(&body, &Settings::default()).unwrap();
        assert_eq!(a.outcome, Outcome::Unchanged);
    }
}
