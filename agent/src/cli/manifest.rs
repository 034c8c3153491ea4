//! Kubernetes manifests as users and Helm write them: YAML (or JSON) with one or more
//! documents, Pods or workloads whose pod template is what a node would run. Read by
//! `exitorder explain` and by the test bed, which runs them.

use serde_json::Value;

/// A manifest that gives no pod.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("not valid YAML: {0}")]
    Yaml(String),
    #[error("a {0:?} has no pod template (give a Pod or a workload)")]
    NoTemplate(String),
    #[error("the {0} has no spec.template")]
    MissingTemplate(String),
}

/// Every non-empty document of a YAML (or JSON) text, as JSON values.
pub fn documents(text: &str) -> Result<Vec<Value>, ManifestError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| ManifestError::Yaml(e.to_string()))?;
    Ok(docs
        .into_iter()
        .filter(|d| !d.is_null())
        .flat_map(|d| match d {
            // `kind: List`, as `kubectl get -o yaml` writes several objects.
            Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => m
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            other => vec![other],
        })
        .collect())
}

/// The object of `kind` (and `name`, when given) among `docs`.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: Option<&str>) -> Option<&'a Value> {
    docs.iter().find(|d| {
        d.get("kind").and_then(Value::as_str) == Some(kind)
            && name.is_none_or(|n| d.pointer("/metadata/name").and_then(Value::as_str) == Some(n))
    })
}

/// The Pod a node would run for `doc`: the Pod itself, or the pod template of a workload
/// (DaemonSet, Deployment, StatefulSet, ReplicaSet, Job; a CronJob's job template), named
/// the way its controller names pods (`<workload>-` plus a suffix) and placed in its
/// namespace.
pub fn pod_of(doc: &Value) -> Result<Value, ManifestError> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind == "Pod" {
        return Ok(doc.clone());
    }
    let template = match kind {
        "DaemonSet" | "Deployment" | "StatefulSet" | "ReplicaSet" | "Job" => {
            doc.pointer("/spec/template")
        }
        "CronJob" => doc.pointer("/spec/jobTemplate/spec/template"),
        other => return Err(ManifestError::NoTemplate(other.to_owned())),
    }
    .ok_or_else(|| ManifestError::MissingTemplate(kind.to_owned()))?;
    let owner = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("pod");
    let mut meta = template
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    if let Value::Object(m) = &mut meta {
        m.remove("name");
        m.remove("creationTimestamp");
        m.insert("generateName".into(), Value::String(format!("{owner}-")));
        if let Some(ns) = doc.pointer("/metadata/namespace") {
            m.insert("namespace".into(), ns.clone());
        }
    }
    let mut spec = template.get("spec").cloned().unwrap_or(Value::Null);
    if kind == "DaemonSet" {
        // The DaemonSet controller pins its pods to their node.
        if let Value::Object(s) = &mut spec {
            s.remove("nodeName");
        }
    }
    Ok(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_documents_and_a_daemonset_template() {
        let text = r#"
# a comment
apiVersion: v1
kind: ServiceAccount
metadata: {name: agent, namespace: exitorder}
---
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: exitorder
  namespace: exitorder
spec:
  template:
    metadata:
      labels: {app: exitorder}
    spec:
      hostNetwork: true
      containers:
        - name: agent
          image: ghcr.io/exitorder/exitorder:0.1.0
          args: ["agent"]
"#;
        let docs = documents(text).unwrap();
        assert_eq!(docs.len(), 2);
        let ds = find(&docs, "DaemonSet", Some("exitorder")).unwrap();
        let pod = pod_of(ds).unwrap();
        assert_eq!(pod["kind"], "Pod");
        assert_eq!(pod["metadata"]["generateName"], "exitorder-");
        assert_eq!(pod["metadata"]["namespace"], "exitorder");
        assert_eq!(pod["metadata"]["labels"]["app"], "exitorder");
        assert_eq!(pod["spec"]["containers"][0]["args"][0], "agent");
        assert!(pod_of(find(&docs, "ServiceAccount", None).unwrap()).is_err());
    }

    #[test]
    fn bad_yaml_is_an_error() {
        assert!(documents("a: [unclosed").is_err());
    }
}
