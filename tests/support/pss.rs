//! Pod Security Standards, the `baseline` and `restricted` profiles, as the API server's
//! PodSecurity admission checks them (k8s.io/pod-security-admission, policy version latest):
//! the fields a pod may not set, each violation named. Used to show that what the webhook adds
//! keeps a pod admissible.

use serde_json::Value;

/// Volume types `restricted` allows (every other is refused; `hostPath` already by baseline).
const RESTRICTED_VOLUMES: [&str; 9] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Capabilities `baseline` lets a container add.
const BASELINE_CAPS: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |k| spec[k].as_array().into_iter().flatten())
}

/// What keeps `pod` out of a namespace enforcing `baseline`.
pub fn baseline_violations(pod: &Value) -> Vec<String> {
    let spec = &pod["spec"];
    let mut out = Vec::new();
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[field] == true {
            out.push(format!("spec.{field}"));
        }
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        if v.get("hostPath").is_some() {
            out.push(format!("volume {} is a hostPath", v["name"]));
        }
    }
    for c in containers(spec) {
        let name = &c["name"];
        let sc = &c["securityContext"];
        if sc["privileged"] == true {
            out.push(format!("container {name} is privileged"));
        }
        for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            if !cap.as_str().is_some_and(|c| BASELINE_CAPS.contains(&c)) {
                out.push(format!("container {name} adds capability {cap}"));
            }
        }
        for p in c["ports"].as_array().into_iter().flatten() {
            if p["hostPort"].as_i64().is_some_and(|h| h != 0) {
                out.push(format!("container {name} has a hostPort"));
            }
        }
        let seccomp = &sc["seccompProfile"]["type"];
        if seccomp == "Unconfined" {
            out.push(format!("container {name}: seccomp Unconfined"));
        }
        if sc["procMount"].as_str().is_some_and(|m| m != "Default") {
            out.push(format!("container {name}: procMount"));
        }
    }
    if spec["securityContext"]["seccompProfile"]["type"] == "Unconfined" {
        out.push("pod: seccomp Unconfined".to_owned());
    }
    out
}

/// What keeps `pod` out of a namespace enforcing `restricted` (baseline's included).
pub fn restricted_violations(pod: &Value) -> Vec<String> {
    let spec = &pod["spec"];
    let psc = &spec["securityContext"];
    let mut out = baseline_violations(pod);
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let allowed = v
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| *k != "name")
            .all(|(k, _)| RESTRICTED_VOLUMES.contains(&k.as_str()));
        if !allowed {
            out.push(format!(
                "volume {} is of a type restricted refuses",
                v["name"]
            ));
        }
    }
    let pod_non_root = psc["runAsNonRoot"] == true;
    let pod_seccomp = matches!(
        psc["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault" | "Localhost")
    );
    if psc["runAsUser"] == 0 {
        out.push("pod runs as uid 0".to_owned());
    }
    for c in containers(spec) {
        let name = &c["name"];
        let sc = &c["securityContext"];
        if sc["allowPrivilegeEscalation"] != false {
            out.push(format!(
                "container {name}: allowPrivilegeEscalation is not false"
            ));
        }
        let drops_all = sc["capabilities"]["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|c| c == "ALL"));
        if !drops_all {
            out.push(format!("container {name} does not drop ALL capabilities"));
        }
        for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            if cap != "NET_BIND_SERVICE" {
                out.push(format!("container {name} adds {cap}"));
            }
        }
        let non_root = match &sc["runAsNonRoot"] {
            Value::Bool(b) => *b,
            _ => pod_non_root,
        };
        if !non_root {
            out.push(format!("container {name}: runAsNonRoot is not true"));
        }
        if sc["runAsUser"] == 0 {
            out.push(format!("container {name} runs as uid 0"));
        }
        let seccomp = match sc["seccompProfile"]["type"].as_str() {
            Some(t) => matches!(t, "RuntimeDefault" | "Localhost"),
            None => pod_seccomp,
        };
        if !seccomp {
            out.push(format!(
                "container {name}: no RuntimeDefault or Localhost seccomp profile"
            ));
        }
    }
    out
}
