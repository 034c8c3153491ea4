//! The tests' pods: the examples of `deploy/examples/` as users start from them, edited
//! (scripts, grace periods, pod-local exit directories) or injected by the webhook's own
//! mutation.

pub use exitorder_testbed::fakeapi::api_pod_of;
use exitorder_testbed::kubelet::pod_from_yaml;
use serde_json::Value;

/// The two-level example whose app drains for `drain` seconds on TERM, with the grace period
/// 30 s past that.
pub fn draining_two_level(drain: u64) -> Value {
    let mut p = example("two-level");
    edit_script(&mut p, "app", "sleep 2", &format!("sleep {drain}"));
    set_grace(&mut p, drain.saturating_add(30));
    p
}

/// The two-level example with its proxy's exit directory moved into the pod's `emptyDir`:
/// `exitorder` is the pod's own volume, mounted with `subPath: proxy`; only the entrypoint
/// still comes from the node (its bin directory).
pub fn pod_local(name: &str) -> Value {
    let mut p = example("two-level");
    p["metadata"]["name"] = name.into();
    let proxy = container_mut(&mut p, "proxy");
    proxy["volumeMounts"] = serde_json::json!([
        {"name": "exitorder", "mountPath": "/var/run/exitorder", "subPath": "proxy"},
        {"name": "exitorder-bin", "mountPath": "/var/run/exitorder-bin", "readOnly": true},
    ]);
    p["spec"]["volumes"] = serde_json::json!([
        {"name": "exitorder", "emptyDir": {}},
        {"name": "exitorder-bin", "hostPath": {"path": "/var/lib/exitorder-bin", "type": "Directory"}},
    ]);
    p
}

/// `pod` as the webhook mutates it with `settings` (the patch applied); panics on a denial.
pub fn inject_with(pod: &Value, settings: &exitorder::webhook::Settings) -> Value {
    match exitorder_testbed::admission::admit(pod, settings) {
        Ok(admitted) => admitted.pod,
        Err(e) => panic!("{e}"),
    }
}

/// `pod`, opted in, as the webhook injects it in the host share's layout (no image needed on
/// the node): every sidecar waits, every other container marks.
pub fn injected(pod: &Value) -> Value {
    let mut pod = pod.clone();
    pod["metadata"]["annotations"]["exitorder.io/inject"] = "true".into();
    let settings = exitorder::webhook::Settings {
        handshake_volume: exitorder::webhook::HandshakeVolume::HostPath,
        ..exitorder::webhook::Settings::default()
    };
    inject_with(&pod, &settings)
}

/// `p` without the preStops, mounts and env an example writes by hand: the webhook adds them.
pub fn bare(mut p: Value) -> Value {
    for c in p["spec"]["containers"].as_array_mut().into_iter().flatten() {
        if let Some(o) = c.as_object_mut() {
            o.remove("lifecycle");
            o.remove("volumeMounts");
            o.remove("env");
        }
    }
    if let Some(o) = p["spec"].as_object_mut() {
        o.remove("volumes");
    }
    p
}

/// A pod of deploy/examples/, as users start from it.
pub fn example(name: &str) -> Value {
    let path = crate::repo()
        .join("deploy/examples")
        .join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    pod_from_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A pod from YAML text.
pub fn pod(yaml: &str) -> Value {
    pod_from_yaml(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

/// The container named `name` of `pod` (main or init).
pub fn container_mut<'a>(pod: &'a mut Value, name: &str) -> &'a mut Value {
    let spec = &mut pod["spec"];
    for list in ["containers", "initContainers"] {
        if let Some(i) = spec[list]
            .as_array()
            .and_then(|cs| cs.iter().position(|c| c["name"] == name))
        {
            return &mut spec[list][i];
        }
    }
    panic!("no container {name} in the pod")
}

/// Replaces `from` by `to` in the shell script of `container` (`command: [sh, -c, SCRIPT]`).
pub fn edit_script(pod: &mut Value, container: &str, from: &str, to: &str) {
    let script = &mut container_mut(pod, container)["command"][2];
    let text = script.as_str().expect("a shell script").to_owned();
    assert!(
        text.contains(from),
        "{from:?} not in the script of {container}: {text}"
    );
    *script = Value::String(text.replace(from, to));
}

/// Sets the pod's grace period and every exitorder preStop's `--timeout` to it.
pub fn set_grace(pod: &mut Value, seconds: u64) {
    pod["spec"]["terminationGracePeriodSeconds"] = seconds.into();
    for list in ["containers", "initContainers"] {
        for c in pod["spec"][list].as_array_mut().into_iter().flatten() {
            let Some(cmd) = c
                .pointer_mut("/lifecycle/preStop/exec/command")
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            if let Some(i) = cmd.iter().position(|a| a == "--timeout") {
                if let Some(v) = cmd.get_mut(i + 1) {
                    *v = Value::String(format!("{seconds}s"));
                }
            }
        }
    }
}
