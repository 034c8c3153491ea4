//! Pod Security Standards, the `baseline` and `restricted` profiles, as the API server's
//! PodSecurity admission checks them (k8s.io/pod-security-admission, policy version latest):
//! the fields a pod may not set, each violation named. Used to show that what the webhook adds
//! keeps a pod admissible, and by `exitorder explain` to say which profile a pod meets.

// serde_json's `Value[key]` and `Value[index]` give `Null` for anything absent: reading a
// pod's fields by index cannot panic, whatever the pod holds.
#![allow(clippy::indexing_slicing)]

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

/// Sysctls `baseline` allows a pod to set.
const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types `baseline` allows.
const SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The security-context fields `baseline` checks alike on the pod and on each container:
/// Windows host processes, SELinux options and AppArmor profiles.
fn context_violations(sc: &Value, whose: &str, out: &mut Vec<String>) {
    if sc["windowsOptions"]["hostProcess"] == true {
        out.push(format!("{whose}: windowsOptions.hostProcess"));
    }
    let se = &sc["seLinuxOptions"];
    if se["type"]
        .as_str()
        .is_some_and(|t| !t.is_empty() && !SELINUX_TYPES.contains(&t))
    {
        out.push(format!("{whose}: seLinuxOptions.type {}", se["type"]));
    }
    for field in ["user", "role"] {
        if se[field].as_str().is_some_and(|v| !v.is_empty()) {
            out.push(format!("{whose}: seLinuxOptions.{field}"));
        }
    }
    if sc["appArmorProfile"]["type"] == "Unconfined" {
        out.push(format!("{whose}: appArmorProfile Unconfined"));
    }
}

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
        context_violations(sc, &format!("container {name}"), &mut out);
    }
    let psc = &spec["securityContext"];
    if psc["seccompProfile"]["type"] == "Unconfined" {
        out.push("pod: seccomp Unconfined".to_owned());
    }
    context_violations(psc, "pod", &mut out);
    for s in psc["sysctls"].as_array().into_iter().flatten() {
        if !s["name"]
            .as_str()
            .is_some_and(|n| SAFE_SYSCTLS.contains(&n))
        {
            out.push(format!("pod: sysctl {}", s["name"]));
        }
    }
    // The AppArmor annotations that predate the field (Kubernetes < 1.30).
    let annotations = pod["metadata"]["annotations"].as_object();
    for (k, v) in annotations.into_iter().flatten() {
        let profile = v.as_str().unwrap_or("");
        if k.starts_with("container.apparmor.security.beta.kubernetes.io/")
            && profile != "runtime/default"
            && !profile.starts_with("localhost/")
        {
            out.push(format!("annotation {k}: {profile}"));
        }
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

/// The strictest Pod Security profile a pod meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    Restricted,
    Baseline,
    Privileged,
}

impl Profile {
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Restricted => "restricted",
            Profile::Baseline => "baseline",
            Profile::Privileged => "privileged",
        }
    }
}

/// The strictest profile `pod` meets.
pub fn profile(pod: &Value) -> Profile {
    if !baseline_violations(pod).is_empty() {
        Profile::Privileged
    } else if !restricted_violations(pod).is_empty() {
        Profile::Baseline
    } else {
        Profile::Restricted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(metadata: Value, spec: Value) -> Value {
        json!({"metadata": metadata, "spec": spec})
    }

    #[test]
    fn baseline_refuses_host_processes_selinux_apparmor_and_unsafe_sysctls() {
        let app = json!({"name": "app", "image": "a"});
        let ok = pod(
            json!({"annotations": {"container.apparmor.security.beta.kubernetes.io/app": "runtime/default"}}),
            json!({"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}],
                                       "seLinuxOptions": {"type": "container_t", "level": "s0:c1"}},
                   "containers": [app]}),
        );
        assert_eq!(baseline_violations(&ok), Vec::<String>::new());
        assert_eq!(profile(&ok), Profile::Baseline);
        let bad = pod(
            json!({"annotations": {"container.apparmor.security.beta.kubernetes.io/app": "unconfined"}}),
            json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}],
                                       "appArmorProfile": {"type": "Unconfined"}},
                   "containers": [{"name": "app", "image": "a", "securityContext": {
                       "windowsOptions": {"hostProcess": true},
                       "seLinuxOptions": {"type": "spc_t", "user": "system_u"}}}]}),
        );
        let v = baseline_violations(&bad);
        assert_eq!(v.len(), 6, "{v:?}");
        assert_eq!(profile(&bad), Profile::Privileged);
    }
}
