//! Which fields of a Pod the runner honours, which it accepts knowing they change nothing on a
//! one-node test bed (said as a note, never silently), and which it refuses.
//!
//! The check walks the Pod as the user wrote it (YAML or JSON), before it is typed: a field
//! that k8s-openapi does not know (a typo, a newer API) is caught here too, instead of being
//! dropped by deserialization.

use serde_json::Value;

/// What the runner does with a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// Applied the way the kubelet applies it.
    Honoured,
    /// Accepted, with no effect here; the note says why.
    Noted(&'static str),
    /// Not supported; the text says why (or what to do instead).
    Refused(&'static str),
    /// Any content: a free-form map (labels, annotations) or status.
    Opaque,
}

const SCHEDULING: &str =
    "a scheduling field: the test bed is one node and runs every pod it is given";
const NO_API: &str = "there is no API server on the test bed";

/// Fields of a container (main, init and native sidecar alike), relative to the container.
const CONTAINER: &[(&str, Rule)] = &[
    ("name", Rule::Honoured),
    ("image", Rule::Honoured),
    ("imagePullPolicy", Rule::Noted("images come from the node's local store; nothing is pulled")),
    ("command", Rule::Honoured),
    ("args", Rule::Honoured),
    ("workingDir", Rule::Honoured),
    ("env[].name", Rule::Honoured),
    ("env[].value", Rule::Honoured),
    ("env[].valueFrom.fieldRef.fieldPath", Rule::Honoured),
    ("env[].valueFrom.fieldRef.apiVersion", Rule::Honoured),
    ("env[].valueFrom", Rule::Refused("only valueFrom.fieldRef is supported (no API server for configMapKeyRef/secretKeyRef; resourceFieldRef is not supported)")),
    ("envFrom", Rule::Refused("envFrom needs ConfigMaps or Secrets, and there is no API server on the test bed")),
    ("ports", Rule::Honoured),
    ("volumeMounts[].name", Rule::Honoured),
    ("volumeMounts[].mountPath", Rule::Honoured),
    ("volumeMounts[].subPath", Rule::Honoured),
    ("volumeMounts[].subPathExpr", Rule::Honoured),
    ("volumeMounts[].readOnly", Rule::Honoured),
    ("volumeMounts[].mountPropagation", Rule::Honoured),
    ("volumeMounts", Rule::Refused("only name, mountPath, subPath, subPathExpr, readOnly and mountPropagation are supported")),
    ("volumeDevices", Rule::Refused("block volumes are not supported")),
    ("resources", Rule::Noted("only CPU is played: the request as the pod cgroup's weight, by QoS tier, and the limit as the container's CFS quota, as the kubelet sets them; memory is not enforced on the test bed")),
    ("resizePolicy", Rule::Noted("resources are not resized on the test bed")),
    ("securityContext.runAsUser", Rule::Honoured),
    ("securityContext.runAsGroup", Rule::Honoured),
    ("securityContext.runAsNonRoot", Rule::Honoured),
    ("securityContext.privileged", Rule::Honoured),
    ("securityContext.capabilities.add", Rule::Honoured),
    ("securityContext.capabilities.drop", Rule::Honoured),
    ("securityContext.readOnlyRootFilesystem", Rule::Honoured),
    ("securityContext.allowPrivilegeEscalation", Rule::Honoured),
    ("securityContext.seccompProfile.type", Rule::Honoured),
    ("securityContext.procMount", Rule::Honoured),
    ("securityContext", Rule::Refused("supported: runAsUser, runAsGroup, runAsNonRoot, privileged, capabilities, readOnlyRootFilesystem, allowPrivilegeEscalation, seccompProfile (RuntimeDefault, Unconfined), procMount Default")),
    ("lifecycle.postStart", Rule::Honoured),
    ("lifecycle.preStop", Rule::Honoured),
    ("lifecycle.stopSignal", Rule::Refused("stopSignal is not supported")),
    ("livenessProbe", Rule::Honoured),
    ("readinessProbe", Rule::Honoured),
    ("startupProbe", Rule::Honoured),
    ("restartPolicy", Rule::Honoured),
    ("restartPolicyRules", Rule::Honoured),
    ("terminationMessagePath", Rule::Honoured),
    ("terminationMessagePolicy", Rule::Honoured),
    ("stdin", Rule::Refused("stdin is not supported")),
    ("stdinOnce", Rule::Refused("stdin is not supported")),
    ("tty", Rule::Refused("tty is not supported")),
];

/// Fields of a handler (lifecycle hook or probe action).
const HANDLER: &[(&str, Rule)] = &[
    ("exec.command", Rule::Honoured),
    ("httpGet.path", Rule::Honoured),
    ("httpGet.port", Rule::Honoured),
    ("httpGet.host", Rule::Honoured),
    ("httpGet.scheme", Rule::Honoured),
    ("httpGet.httpHeaders[].name", Rule::Honoured),
    ("httpGet.httpHeaders[].value", Rule::Honoured),
    ("sleep.seconds", Rule::Honoured),
    ("tcpSocket.port", Rule::Honoured),
    ("tcpSocket.host", Rule::Honoured),
    ("grpc", Rule::Refused("gRPC probes are not supported")),
];

const PROBE: &[(&str, Rule)] = &[
    ("initialDelaySeconds", Rule::Honoured),
    ("periodSeconds", Rule::Honoured),
    ("timeoutSeconds", Rule::Honoured),
    ("successThreshold", Rule::Honoured),
    ("failureThreshold", Rule::Honoured),
    ("terminationGracePeriodSeconds", Rule::Honoured),
];

/// Fields of the Pod itself.
const POD: &[(&str, Rule)] = &[
    ("apiVersion", Rule::Honoured),
    ("kind", Rule::Honoured),
    ("metadata.name", Rule::Honoured),
    ("metadata.generateName", Rule::Honoured),
    ("metadata.namespace", Rule::Honoured),
    ("metadata.uid", Rule::Honoured),
    ("metadata.labels", Rule::Opaque),
    ("metadata.annotations", Rule::Opaque),
    (
        "metadata.ownerReferences",
        Rule::Noted("owner references only matter to controllers"),
    ),
    ("metadata.creationTimestamp", Rule::Opaque),
    ("metadata.resourceVersion", Rule::Opaque),
    ("metadata.generation", Rule::Opaque),
    ("metadata.managedFields", Rule::Opaque),
    ("metadata.finalizers", Rule::Noted(NO_API)),
    (
        "metadata.deletionTimestamp",
        Rule::Refused("the runner deletes pods itself (RunningPod::delete)"),
    ),
    (
        "metadata.deletionGracePeriodSeconds",
        Rule::Refused("give the grace period to the deletion (--grace-period)"),
    ),
    ("metadata", Rule::Refused("unknown metadata field")),
    ("status", Rule::Opaque),
    (
        "spec.ephemeralContainers",
        Rule::Refused("ephemeral containers are not supported"),
    ),
    ("spec.volumes[].name", Rule::Honoured),
    ("spec.volumes[].hostPath.path", Rule::Honoured),
    ("spec.volumes[].hostPath.type", Rule::Honoured),
    ("spec.volumes[].emptyDir.medium", Rule::Honoured),
    (
        "spec.volumes[].emptyDir.sizeLimit",
        Rule::Noted("emptyDir sizeLimit is not enforced on the test bed"),
    ),
    (
        "spec.volumes[]",
        Rule::Refused(
            "only hostPath and emptyDir volumes are supported (no API server for the others)",
        ),
    ),
    ("spec.restartPolicy", Rule::Honoured),
    ("spec.terminationGracePeriodSeconds", Rule::Honoured),
    ("spec.hostNetwork", Rule::Honoured),
    ("spec.hostPID", Rule::Honoured),
    ("spec.hostIPC", Rule::Honoured),
    ("spec.shareProcessNamespace", Rule::Honoured),
    // Where the runtime says it supports user namespaces (containerd 2.x with a runc that
    // makes idmapped mounts); elsewhere the pod is refused, as the kubelet refuses it.
    ("spec.hostUsers", Rule::Honoured),
    ("spec.nodeName", Rule::Honoured),
    ("spec.securityContext.runAsUser", Rule::Honoured),
    ("spec.securityContext.runAsGroup", Rule::Honoured),
    ("spec.securityContext.runAsNonRoot", Rule::Honoured),
    ("spec.securityContext.supplementalGroups", Rule::Honoured),
    ("spec.securityContext.seccompProfile.type", Rule::Honoured),
    (
        "spec.securityContext.fsGroup",
        Rule::Refused("fsGroup (volume ownership changes) is not supported"),
    ),
    (
        "spec.securityContext",
        Rule::Refused(
            "supported: runAsUser, runAsGroup, runAsNonRoot, supplementalGroups, seccompProfile",
        ),
    ),
    (
        "spec.dnsPolicy",
        Rule::Noted("host-network pods use the node's resolv.conf"),
    ),
    (
        "spec.serviceAccountName",
        Rule::Noted("no service account token is mounted: there is no API server on the test bed"),
    ),
    (
        "spec.serviceAccount",
        Rule::Noted("no service account token is mounted: there is no API server on the test bed"),
    ),
    (
        "spec.automountServiceAccountToken",
        Rule::Noted("no service account token is mounted: there is no API server on the test bed"),
    ),
    (
        "spec.enableServiceLinks",
        Rule::Noted("there are no Services on the test bed"),
    ),
    (
        "spec.imagePullSecrets",
        Rule::Noted("images come from the node's local store; nothing is pulled"),
    ),
    ("spec.tolerations", Rule::Noted(SCHEDULING)),
    ("spec.affinity", Rule::Noted(SCHEDULING)),
    ("spec.nodeSelector", Rule::Noted(SCHEDULING)),
    ("spec.priorityClassName", Rule::Noted(SCHEDULING)),
    ("spec.priority", Rule::Noted(SCHEDULING)),
    ("spec.preemptionPolicy", Rule::Noted(SCHEDULING)),
    ("spec.schedulerName", Rule::Noted(SCHEDULING)),
    ("spec.topologySpreadConstraints", Rule::Noted(SCHEDULING)),
    (
        "spec.runtimeClassName",
        Rule::Refused("the test bed has one runtime handler (runc)"),
    ),
    ("spec", Rule::Refused("not supported by the test bed")),
];

/// A field that was accepted without effect, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub field: String,
    pub why: &'static str,
}

/// A field the runner refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct Refusal {
    pub field: String,
    pub why: String,
}

/// Every rule with its full path shape (indices as `[]`): the pod's own, and the container,
/// handler and probe tables under each place they apply.
fn rules() -> &'static [(String, Rule)] {
    static RULES: std::sync::OnceLock<Vec<(String, Rule)>> = std::sync::OnceLock::new();
    RULES.get_or_init(|| {
        let mut all: Vec<(String, Rule)> = POD.iter().map(|(k, r)| ((*k).to_owned(), *r)).collect();
        for c in ["spec.containers[]", "spec.initContainers[]"] {
            all.push((c.to_owned(), Rule::Refused("not supported by the test bed")));
            all.extend(CONTAINER.iter().map(|(k, r)| (format!("{c}.{k}"), *r)));
            for hook in ["lifecycle.postStart", "lifecycle.preStop"] {
                all.push((
                    format!("{c}.{hook}"),
                    Rule::Refused("supported handlers: exec, httpGet, sleep"),
                ));
                for (k, r) in HANDLER.iter().filter(|(k, _)| !k.starts_with("tcpSocket")) {
                    all.push((format!("{c}.{hook}.{k}"), *r));
                }
                all.push((
                    format!("{c}.{hook}.tcpSocket"),
                    Rule::Refused("tcpSocket lifecycle handlers are deprecated and not supported"),
                ));
            }
            for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                all.push((format!("{c}.{probe}"), Rule::Refused("unknown probe field")));
                for (k, r) in PROBE.iter().chain(HANDLER) {
                    if *k != "sleep.seconds" {
                        all.push((format!("{c}.{probe}.{k}"), *r));
                    }
                }
            }
            all.push((format!("{c}.ports[]"), Rule::Refused("unknown port field")));
            for k in ["containerPort", "name", "protocol", "hostPort", "hostIP"] {
                all.push((format!("{c}.ports[].{k}"), Rule::Honoured));
            }
        }
        all
    })
}

/// Whether `path` is `prefix` or lies under it.
fn under(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|r| r.starts_with('.') || r.starts_with('['))
}

/// The rule for `path`: the longest one it lies under; and whether some rule lies deeper
/// than `path` (then a refused parent is only refused for its other fields).
fn lookup(path: &str) -> (Option<Rule>, bool) {
    let all = rules();
    let rule = all
        .iter()
        .filter(|(k, _)| under(path, k))
        .max_by_key(|(k, _)| k.len())
        .map(|(_, r)| *r);
    let deeper = all
        .iter()
        .any(|(k, _)| k.len() > path.len() && under(k, path));
    (rule, deeper)
}

/// Checks every field present in `pod` (the Pod as written, as JSON). Returns the notes for
/// fields accepted without effect, or the first refused field.
pub fn check(pod: &Value) -> Result<Vec<Note>, Refusal> {
    let mut notes = Vec::new();
    walk(pod, &mut String::new(), &mut String::new(), &mut notes)?;
    Ok(notes)
}

/// `shape` is the path with `[]` for indices (what the rules hold); `shown` has the indices
/// (what the user is told).
fn walk(
    v: &Value,
    shape: &mut String,
    shown: &mut String,
    notes: &mut Vec<Note>,
) -> Result<(), Refusal> {
    let is_leaf = !matches!(v, Value::Object(_) | Value::Array(_));
    if !shape.is_empty() {
        let refuse = |why: &str| Refusal {
            field: shown.clone(),
            why: why.to_owned(),
        };
        match lookup(shape) {
            (Some(Rule::Opaque), _) => return Ok(()),
            (Some(Rule::Noted(why)), _) => {
                notes.push(Note {
                    field: shown.clone(),
                    why,
                });
                return Ok(());
            }
            (Some(Rule::Refused(why)), deeper) if is_leaf || !deeper => return Err(refuse(why)),
            (Some(Rule::Honoured), _) if is_leaf => return Ok(()),
            (None, _) if is_leaf || !lookup(shape).1 => {
                return Err(refuse("not supported by the test bed"))
            }
            _ => {}
        }
    }
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if child.is_null() {
                    continue;
                }
                let (shape_len, shown_len) = (shape.len(), shown.len());
                if !shape.is_empty() {
                    shape.push('.');
                    shown.push('.');
                }
                shape.push_str(k);
                shown.push_str(k);
                let res = walk(child, shape, shown, notes);
                shape.truncate(shape_len);
                shown.truncate(shown_len);
                res?;
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let (shape_len, shown_len) = (shape.len(), shown.len());
                shape.push_str("[]");
                shown.push_str(&format!("[{i}]"));
                let res = walk(child, shape, shown, notes);
                shape.truncate(shape_len);
                shown.truncate(shown_len);
                res?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}}, "spec": spec})
    }

    #[test]
    fn a_supported_pod_passes_with_its_notes() {
        let p = pod(json!({
            "hostNetwork": true,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "app", "image": "busybox:1.36", "command": ["sh"],
                "env": [{"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
                "resources": {"limits": {"memory": "64Mi"}},
                "ports": [{"name": "metrics", "containerPort": 9484}],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 2},
                "lifecycle": {"preStop": {"sleep": {"seconds": 1}}},
                "securityContext": {"capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": true},
                "volumeMounts": [{"name": "share", "mountPath": "/s", "subPathExpr": "pods/$(UID)"}]
            }],
            "volumes": [{"name": "share", "hostPath": {"path": "/var/lib/exitorder", "type": "DirectoryOrCreate"}}]
        }));
        let notes = check(&p).unwrap();
        let fields: Vec<&str> = notes.iter().map(|n| n.field.as_str()).collect();
        assert_eq!(fields, ["spec.containers[0].resources", "spec.tolerations"]);
    }

    #[test]
    fn refused_fields_are_named_with_their_index() {
        for (spec, field) in [
            (
                json!({"containers": [{"name": "a"}, {"name": "b", "envFrom": [{"configMapRef": {"name": "x"}}]}]}),
                "spec.containers[1].envFrom",
            ),
            (
                json!({"containers": [{"name": "a", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}),
                "spec.containers[0].env[0].valueFrom.secretKeyRef",
            ),
            (
                json!({"volumes": [{"name": "v", "configMap": {"name": "c"}}]}),
                "spec.volumes[0].configMap",
            ),
            (
                json!({"containers": [{"name": "a", "securityContext": {"seLinuxOptions": {"level": "s0"}}}]}),
                "spec.containers[0].securityContext.seLinuxOptions",
            ),
            (
                json!({"initContainers": [{"name": "a", "lifecycle": {"preStop": {"tcpSocket": {"port": 1}}}}]}),
                "spec.initContainers[0].lifecycle.preStop.tcpSocket",
            ),
            (
                json!({"containers": [{"name": "a", "livenessProbe": {"grpc": {"port": 1}}}]}),
                "spec.containers[0].livenessProbe.grpc",
            ),
            (
                json!({"activeDeadlineSeconds": 5}),
                "spec.activeDeadlineSeconds",
            ),
            (
                json!({"containers": [{"name": "a", "tty": true}]}),
                "spec.containers[0].tty",
            ),
            (
                json!({"containers": [{"name": "a", "imagee": "typo"}]}),
                "spec.containers[0].imagee",
            ),
        ] {
            let err = check(&pod(spec.clone())).unwrap_err();
            assert_eq!(err.field, field, "{spec}: {err}");
        }
    }

    #[test]
    fn lifecycle_tcp_socket_is_refused_but_probes_may_use_it() {
        let ok = pod(
            json!({"containers": [{"name": "a", "livenessProbe": {"tcpSocket": {"port": 80}}}]}),
        );
        assert!(check(&ok).is_ok());
        let bad = pod(
            json!({"containers": [{"name": "a", "lifecycle": {"postStart": {"tcpSocket": {"port": 80}}}}]}),
        );
        assert!(check(&bad).is_err());
    }

    #[test]
    fn labels_annotations_and_status_are_free_form() {
        let p = json!({"metadata": {"name": "p", "annotations": {"x/y": "{\"a\": 1}"}},
                       "status": {"phase": "Running", "anything": [1, 2]},
                       "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(check(&p).unwrap(), []);
    }
}
