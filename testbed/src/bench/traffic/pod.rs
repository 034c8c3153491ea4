//! The traffic benchmark's pod (testbed/pods/traffic.yaml) as each way of ordering the
//! sidecars' exits has it.

use std::path::Path;

use anyhow::anyhow;

use super::{TrafficSettings, World};

const TRAFFIC_POD: &str = include_str!("../../../pods/traffic.yaml");
pub(super) const APP: &str = "app";
pub(super) const PROXY: &str = "proxy";
pub(super) const SHIPPER: &str = "shipper";

/// How a strategy orders the sidecars' exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The kubelet's default: every container is sent TERM at once.
    None,
    /// exitorder: the sidecars' preStop waits, the agent answers when the app has exited.
    Exitorder,
    /// The OpenKruise proposal: the same waits, answered by a daemon that looks once a second.
    Kruise,
    /// Linkerd's `config.alpha.linkerd.io/proxy-wait-before-exit-seconds`: a fixed preStop
    /// sleep of this many seconds (on the shipper too, to be fair to it).
    LinkerdWait(u64),
    /// Native sidecars (KEP-753): the proxy and the shipper as restartable init containers,
    /// stopped after the app; the proxy's preStop drains it at t = 0 (haproxy's soft stop,
    /// as Istio's native mode drains Envoy in its preStop).
    Native,
}

impl Strategy {
    pub fn name(self) -> String {
        match self {
            Strategy::None => "none (kubelet default)".to_owned(),
            Strategy::Exitorder => "exitorder".to_owned(),
            Strategy::Kruise => "Kruise-style 1 s daemon".to_owned(),
            Strategy::LinkerdWait(s) => format!("Linkerd wait-before-exit {s} s"),
            Strategy::Native => "native sidecars, proxy drained in preStop".to_owned(),
        }
    }

    pub(super) fn tag(self) -> String {
        match self {
            Strategy::None => "none".to_owned(),
            Strategy::Exitorder => "exitorder".to_owned(),
            Strategy::Kruise => "kruise".to_owned(),
            Strategy::LinkerdWait(s) => format!("linkerd{s}"),
            Strategy::Native => "native".to_owned(),
        }
    }
}

fn set_env(container: &mut serde_json::Value, name: &str, value: String) {
    if let Some(env) = container["env"].as_array_mut() {
        for e in env.iter_mut() {
            if e["name"] == name {
                e["value"] = serde_json::Value::String(value);
                return;
            }
        }
        env.push(serde_json::json!({ "name": name, "value": value }));
    }
}

/// The ports one pod listens on.
pub(super) struct Ports {
    pub app: u16,
    pub inbound: u16,
    pub outbound: u16,
}

/// The pod named `name` under `strategy`, its app logging into `log_dir`.
pub(super) fn traffic_pod(
    name: &str,
    strategy: Strategy,
    settings: &TrafficSettings,
    ports: &Ports,
    world: &World,
    log_dir: &Path,
) -> anyhow::Result<serde_json::Value> {
    let mut pod = crate::kubelet::pod_from_yaml(TRAFFIC_POD)?;
    pod["metadata"]["name"] = serde_json::Value::String(name.to_owned());
    pod["spec"]["terminationGracePeriodSeconds"] = serde_json::json!(settings.grace_seconds);
    pod["spec"]["volumes"][0]["hostPath"]["path"] =
        serde_json::Value::String(log_dir.display().to_string());
    {
        let containers = pod["spec"]["containers"]
            .as_array_mut()
            .ok_or_else(|| anyhow!("traffic.yaml has no containers"))?;
        for c in containers.iter_mut() {
            let port = |p: u16| p.to_string();
            match c["name"].as_str() {
                Some(APP) => {
                    set_env(c, "POD", name.to_owned());
                    set_env(c, "APP_PORT", port(ports.app));
                    set_env(c, "OUT_PORT", port(ports.outbound));
                    set_env(c, "CALLS", settings.app_calls.to_string());
                }
                Some(PROXY) => {
                    set_env(c, "APP_PORT", port(ports.app));
                    set_env(c, "IN_PORT", port(ports.inbound));
                    set_env(c, "OUT_PORT", port(ports.outbound));
                    set_env(c, "UP_PORT", port(world.upstream));
                }
                Some(SHIPPER) => set_env(c, "SINK_PORT", port(world.sink_port)),
                _ => {}
            }
        }
    }
    apply(&mut pod, strategy, settings)?;
    Ok(pod)
}

/// `pod` as `strategy` has it.
fn apply(
    pod: &mut serde_json::Value,
    strategy: Strategy,
    settings: &TrafficSettings,
) -> anyhow::Result<()> {
    let sidecars = [PROXY, SHIPPER];
    let containers = pod["spec"]["containers"]
        .as_array_mut()
        .ok_or_else(|| anyhow!("traffic.yaml has no containers"))?;
    match strategy {
        Strategy::None => {}
        Strategy::Exitorder | Strategy::Kruise => {
            // As the exitorder webhook leaves a pod in hostPath mode (testbed/pods/bench.yaml).
            let timeout = format!("{}s", settings.grace_seconds.saturating_sub(5).max(1));
            for c in containers.iter_mut() {
                let Some(name) = c["name"].as_str().map(str::to_owned) else {
                    continue;
                };
                if !sidecars.contains(&name.as_str()) {
                    continue;
                }
                if let Some(env) = c["env"].as_array_mut() {
                    env.push(serde_json::json!({
                        "name": "POD_UID",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                    }));
                    if strategy == Strategy::Kruise {
                        // The proposal's daemon writes no presence file: wait for its answer.
                        env.push(serde_json::json!({"name": "EXITORDER_PRESENCE", "value": "0"}));
                    }
                }
                let mounts = c["volumeMounts"].as_array_mut();
                let share = serde_json::json!({
                    "name": "exitorder",
                    "mountPath": "/var/run/exitorder",
                    "subPathExpr": format!("pods/$(POD_UID)/{name}"),
                });
                let bin = serde_json::json!({
                    "name": "exitorder-bin",
                    "mountPath": "/var/run/exitorder-bin",
                    "readOnly": true,
                });
                match mounts {
                    Some(m) => m.extend([share, bin]),
                    None => c["volumeMounts"] = serde_json::json!([share, bin]),
                }
                c["lifecycle"] = serde_json::json!({"preStop": {"exec": {"command": [
                    "/var/run/exitorder-bin/exitorder-entrypoint", "wait", "--timeout", timeout,
                ]}}});
            }
            pod["metadata"]["annotations"] = serde_json::json!({
                "exitorder.io/container-exit-priority": r#"{"proxy": 1, "shipper": 1}"#,
            });
            if let Some(volumes) = pod["spec"]["volumes"].as_array_mut() {
                volumes.push(serde_json::json!({
                    "name": "exitorder",
                    "hostPath": {"path": "/var/lib/exitorder", "type": "Directory"},
                }));
                volumes.push(serde_json::json!({
                    "name": "exitorder-bin",
                    "hostPath": {"path": "/var/lib/exitorder-bin", "type": "Directory"},
                }));
            }
        }
        Strategy::LinkerdWait(seconds) => {
            for c in containers.iter_mut() {
                if c["name"].as_str().is_some_and(|n| sidecars.contains(&n)) {
                    c["lifecycle"] = serde_json::json!({"preStop": {"exec": {"command": [
                        "sleep", seconds.to_string(),
                    ]}}});
                }
            }
        }
        Strategy::Native => {
            let mut init = Vec::new();
            containers.retain(|c| {
                let sidecar = c["name"].as_str().is_some_and(|n| sidecars.contains(&n));
                if sidecar {
                    init.push(c.clone());
                }
                !sidecar
            });
            for c in &mut init {
                c["restartPolicy"] = serde_json::json!("Always");
                if c["name"] == PROXY {
                    // haproxy's soft stop: it closes its listeners and leaves once its
                    // connections are done, as Envoy's drain does.
                    c["lifecycle"] = serde_json::json!({"preStop": {"exec": {"command": [
                        "kill", "-USR1", "1",
                    ]}}});
                }
            }
            pod["spec"]["initContainers"] = serde_json::Value::Array(init);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(strategy: Strategy) -> serde_json::Value {
        let mut pod = crate::kubelet::pod_from_yaml(TRAFFIC_POD).expect("traffic.yaml");
        apply(&mut pod, strategy, &TrafficSettings::default()).expect("apply");
        pod
    }

    fn names(v: &serde_json::Value) -> Vec<&str> {
        v.as_array()
            .map(|a| a.iter().filter_map(|c| c["name"].as_str()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn each_strategy_shapes_the_same_pod() {
        let none = pod(Strategy::None);
        assert_eq!(names(&none["spec"]["containers"]), [APP, PROXY, SHIPPER]);
        assert!(none["spec"]["containers"][1]["lifecycle"].is_null());

        let ordered = pod(Strategy::Exitorder);
        let proxy = &ordered["spec"]["containers"][1];
        assert_eq!(
            proxy["lifecycle"]["preStop"]["exec"]["command"][3], "25s",
            "{proxy}"
        );
        assert!(
            ordered["metadata"]["annotations"]["exitorder.io/container-exit-priority"]
                .as_str()
                .is_some_and(|a| a.contains("shipper"))
        );
        assert!(!ordered.to_string().contains("EXITORDER_PRESENCE"));
        assert!(pod(Strategy::Kruise)
            .to_string()
            .contains("EXITORDER_PRESENCE"));

        let linkerd = pod(Strategy::LinkerdWait(5));
        assert_eq!(
            linkerd["spec"]["containers"][2]["lifecycle"]["preStop"]["exec"]["command"],
            serde_json::json!(["sleep", "5"])
        );

        let native = pod(Strategy::Native);
        assert_eq!(names(&native["spec"]["containers"]), [APP]);
        assert_eq!(names(&native["spec"]["initContainers"]), [PROXY, SHIPPER]);
        assert_eq!(
            native["spec"]["initContainers"][0]["restartPolicy"],
            "Always"
        );
        assert_eq!(
            native["spec"]["initContainers"][0]["lifecycle"]["preStop"]["exec"]["command"],
            serde_json::json!(["kill", "-USR1", "1"])
        );
    }
}
