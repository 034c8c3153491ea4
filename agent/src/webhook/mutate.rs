//! The pod mutation, pure: a pod in, a JSONPatch (or a denial) out. Everything the webhook
//! decides is here, apart from HTTP and TLS, so every rule is tested on plain values.
//!
//! The patch is the difference between the pod as received and the pod as mutated, both
//! through the same typed round trip: it names only what exitorder changed, so fields this
//! build does not know (a newer API server's) are left as they are.

use std::collections::BTreeMap;
use std::time::Duration;

use exitorder_contract::annotation;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

pub use super::inject::HandshakeVolume;
use super::inject::{self, Sidecar};
use crate::decide::priority::{self, PodPriorities};
use crate::decide::restart::{RestartRecord, MAX_RECORD_BYTES};
use crate::decide::stoporder::StopOrder;
use crate::podspec;

/// The project's image, as the chart's defaults name it: what `exitorder-install` runs.
pub const DEFAULT_INSTALL_IMAGE: &str =
    concat!("ghcr.io/exitorder/exitorder:", env!("CARGO_PKG_VERSION"));

/// What the mutation needs to know of the node side.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The share's host path, as the agent's `--share-dir`.
    pub share_dir: String,
    /// The host's bin directory, as the agent's `--bin-dir`.
    pub bin_dir: String,
    /// The agent's grace reserve: an entrypoint gives up this long before the pod's grace
    /// period ends, as the agent releases it then.
    pub grace_reserve: Duration,
    pub handshake_volume: HandshakeVolume,
    /// The image the init container `exitorder-install` copies the entrypoint from.
    pub install_image: String,
    /// The entrypoint's presence wait (`EXITORDER_PRESENCE` in each ordered sidecar's env),
    /// when set: how long a sidecar waits for an agent to say it serves the directory (0: for the timeout whatever, as entrypoints before presence
    /// did; what an upgrade from such a release sets while agents roll out). Unset: the
    /// entrypoint's own default.
    pub agent_presence: Option<Duration>,
    /// Every container a sidecar waits for gets `exitorder-entrypoint mark` as its preStop
    /// (see [`super::inject::Sidecar::mark`]). Off in the host share's layout while the agents
    /// roll out: there the entrypoint is the node's, and a node still running an agent of a
    /// release before `mark` would fail the hook (see [`super::rollout`]).
    pub mark_containers: bool,
    /// The pod-local exit directories' volume is a tmpfs (`medium: Memory`, see
    /// [`super::podlocal::volumes`]). Off while the agents roll out (see
    /// [`super::rollout::exits_in_memory`]).
    pub exits_in_memory: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            share_dir: exitorder_contract::share::DEFAULT_DIR.to_owned(),
            bin_dir: exitorder_contract::bin::DEFAULT_DIR.to_owned(),
            grace_reserve: Duration::from_secs(5),
            handshake_volume: HandshakeVolume::EmptyDir,
            install_image: DEFAULT_INSTALL_IMAGE.to_owned(),
            agent_presence: None,
            mark_containers: true,
            exits_in_memory: true,
        }
    }
}

/// The webhook's answer for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Admit, with this patch (empty: unchanged) and these warnings for the user.
    Allow {
        patch: json_patch::Patch,
        warnings: Vec<String>,
    },
    /// Refuse the pod, saying why.
    Deny(String),
}

impl Admission {
    fn unchanged() -> Self {
        Admission::Allow {
            patch: json_patch::Patch::default(),
            warnings: Vec::new(),
        }
    }
}

/// Kubernetes' default terminationGracePeriodSeconds.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;

/// Whether the pod asks for injection (`"true"` under our name or the Kruise alias).
pub fn opted_in(annotations: &BTreeMap<String, String>) -> bool {
    [annotation::INJECT, annotation::INJECT_KRUISE]
        .iter()
        .any(|k| annotations.get(*k).is_some_and(|v| v == "true"))
}

/// The text annotations of an object as sent (no typed parse: any object has them).
pub fn annotations_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Mutates one pod object, as the API server sent it.
pub fn mutate(object: &Value, settings: &Settings) -> Admission {
    // Opt-in is read from the object as sent: a pod that did not opt in is never refused,
    // even one this build's types cannot read.
    let raw_annotations = annotations_of(object);
    if !opted_in(&raw_annotations) {
        return Admission::unchanged();
    }
    let pod: Pod = match serde_json::from_value(object.clone()) {
        Ok(p) => p,
        Err(e) => return Admission::Deny(format!("the object is not a valid Pod: {e}")),
    };
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let mut mutated = pod.clone();
    let Injected {
        warnings,
        first,
        install_at,
    } = match inject_into(&mut mutated, &annotations, settings) {
        Ok(w) => w,
        Err(message) => return Admission::Deny(message),
    };
    let (Ok(before), Ok(after)) = (serde_json::to_value(&pod), serde_json::to_value(&mutated))
    else {
        return Admission::Deny("the pod could not be serialized".to_owned());
    };
    let mut patch = json_patch::diff(&before, &after);
    // The start order moves whole containers, as `move` operations after the edits (which
    // name the containers' original places): a container's fields this build does not know
    // move with it.
    let names: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
        .collect();
    patch.0.extend(moves_first(&names, &first));
    if let Some(at) = install_at.filter(|at| *at > 0) {
        let op = serde_json::json!({
            "op": "move",
            "from": format!("/spec/initContainers/{at}"),
            "path": "/spec/initContainers/0",
        });
        if let Ok(op) = serde_json::from_value(op) {
            patch.0.push(op);
        }
    }
    Admission::Allow { patch, warnings }
}

/// What the injection did beyond the pod's fields.
#[derive(Default)]
struct Injected {
    warnings: Vec<String>,
    /// Containers to move first (start order).
    first: Vec<String>,
    /// Where `exitorder-install` was appended, to be moved to the front.
    install_at: Option<usize>,
}

/// `move` operations that bring `first` (in this order) before the other containers, which
/// keep theirs; none when they already are.
fn moves_first(names: &[String], first: &[String]) -> Vec<json_patch::PatchOperation> {
    // Containers are followed by their place, not their name: the API server validates a
    // pod after the webhooks, so two containers may still share a name here, and by name
    // one of them would be moved on every pass.
    let mut target: Vec<usize> = Vec::new();
    for name in first {
        if let Some(i) = names.iter().position(|n| n == name) {
            if !target.contains(&i) {
                target.push(i);
            }
        }
    }
    let rest: Vec<usize> = (0..names.len()).filter(|i| !target.contains(i)).collect();
    target.extend(rest);
    let mut current: Vec<usize> = (0..names.len()).collect();
    let mut ops = Vec::new();
    for (k, want) in target.iter().enumerate() {
        let Some(p) = current.iter().position(|i| i == want) else {
            continue;
        };
        if p == k {
            continue;
        }
        let i = current.remove(p);
        current.insert(k, i);
        let op = serde_json::json!({
            "op": "move",
            "from": format!("/spec/containers/{p}"),
            "path": format!("/spec/containers/{k}"),
        });
        if let Ok(op) = serde_json::from_value(op) {
            ops.push(op);
        }
    }
    ops
}

/// One container the rules look at: a main container or a native sidecar.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub native: bool,
    pub priority: u8,
    /// Which rule gave the priority.
    pub source: priority::Source,
}

/// The pod's containers and native sidecars with their exit priorities, as the agent will
/// resolve them; an error names the bad annotation or env.
pub fn members(pod: &Pod, named: Option<&PodPriorities>) -> Result<Vec<Member>, String> {
    pod.spec
        .iter()
        .flat_map(podspec::ordered)
        .map(|(c, native)| {
            let env =
                priority::from_spec_env(c).map_err(|e| format!("container {:?}: {e}", c.name))?;
            let (priority, source) = priority::resolve_from(&c.name, named, env, native);
            Ok(Member {
                name: c.name.clone(),
                native,
                priority,
                source,
            })
        })
        .collect()
}

/// The kubelet's stop order for the native sidecars among `members`.
pub fn stop_order(members: &[Member]) -> StopOrder {
    StopOrder::new(
        members
            .iter()
            .filter(|m| m.native)
            .map(|m| m.name.clone())
            .collect(),
    )
}

/// Injects into `pod`.
fn inject_into(
    pod: &mut Pod,
    annotations: &BTreeMap<String, String>,
    settings: &Settings,
) -> Result<Injected, String> {
    let mut warnings = Vec::new();
    let named =
        priority::from_annotations(annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(|e| e.to_string())?;
    super::presets::write(pod, named.as_ref());
    let members = members(pod, named.as_ref())?;
    if let Some(named) = &named {
        let key = if annotations.contains_key(priority::ANNOTATION) {
            priority::ANNOTATION
        } else {
            priority::ANNOTATION_KRUISE
        };
        let all = all_names(pod);
        for name in named.keys().filter(|n| !all.contains(&n.as_str())) {
            warnings.push(format!(
                "{key} names {name:?}, which is not a container of this pod"
            ));
        }
    }
    let order = stop_order(&members);
    check_stop_order(&members, &order)?;
    let sidecars: Vec<&Member> = members.iter().filter(|m| m.priority > 0).collect();
    let endpoints =
        crate::decide::endpoints::policy(|name| annotations.get(name).map(String::as_str))
            .map_err(|e| e.to_string())?;
    if sidecars.is_empty() && endpoints.is_none() {
        if let Some(spec) = &pod.spec {
            inject::share_only_as_injected(spec, &settings.share_dir)?;
        }
        return Ok(Injected {
            warnings,
            ..Injected::default()
        });
    }
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    let timeout = entrypoint_timeout(grace, settings.grace_reserve);
    let Some(spec) = pod.spec.as_mut() else {
        return Ok(Injected {
            warnings,
            ..Injected::default()
        });
    };
    let mut install_at = None;
    match settings.handshake_volume {
        HandshakeVolume::HostPath => {
            inject::share_volume(spec, &settings.share_dir, &settings.bin_dir)?
        }
        HandshakeVolume::EmptyDir => {
            super::podlocal::volumes(spec, settings.exits_in_memory)?;
            install_at = super::podlocal::install_container(spec, &settings.install_image)?;
        }
    }
    let sidecar = Sidecar {
        timeout,
        handshake: settings.handshake_volume,
        presence: settings.agent_presence,
        // While the host share's agents roll out from a release before the second name,
        // marks are off for the same reason.
        second_name: settings.mark_containers,
    };
    for c in spec.containers.iter_mut().chain(
        spec.init_containers
            .iter_mut()
            .flatten()
            .filter(|c| podspec::is_native(c)),
    ) {
        if sidecars.iter().any(|m| m.name == c.name) {
            sidecar.inject(c, &mut warnings)?;
        } else if let Some(policy) = endpoints {
            sidecar.hold_for_endpoints(c, policy.settle, &mut warnings)?;
        } else if settings.mark_containers {
            sidecar.mark(c, &mut warnings)?;
        }
    }
    inject::share_only_as_injected(spec, &settings.share_dir)?;
    let mut first = Vec::new();
    if annotations
        .get(annotation::AWAIT_SIDECARS)
        .is_some_and(|v| v == "true")
    {
        let names: Vec<&str> = sidecars
            .iter()
            .filter(|m| !m.native)
            .map(|m| m.name.as_str())
            .collect();
        first = inject::start_first(&mut spec.containers, &names, &mut warnings);
    }
    if !order.native().is_empty() {
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                annotation::NATIVE_SIDECARS.to_owned(),
                order.to_annotation(),
            );
    }
    record_restarts(pod, &mut warnings);
    Ok(Injected {
        warnings,
        first,
        install_at,
    })
}

/// The value the webhook writes as [`annotation::RESTARTS`] on a pod with this spec; `None`
/// when the record would be larger than an agent reads.
pub fn restart_record(spec: &k8s_openapi::api::core::v1::PodSpec) -> Option<String> {
    RestartRecord::of_spec(spec).to_annotation()
}

/// Records what Job completion needs from the spec on a pod that completes (restartPolicy
/// Never or OnFailure), for an agent without the API server; a pod that never completes
/// carries no record, whatever it was sent with.
fn record_restarts(pod: &mut Pod, warnings: &mut Vec<String>) {
    let Some(spec) = &pod.spec else { return };
    let completes = matches!(spec.restart_policy.as_deref(), Some("Never" | "OnFailure"));
    let record = completes.then(|| restart_record(spec));
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match record {
        Some(Some(value)) => {
            annotations.insert(annotation::RESTARTS.to_owned(), value);
        }
        Some(None) => {
            annotations.remove(annotation::RESTARTS);
            warnings.push(format!(
                "the containers' restart rules take more than {MAX_RECORD_BYTES} bytes: \
                 {} is not recorded, and an agent without the API server does not shut this \
                 Job's sidecars down",
                annotation::RESTARTS
            ));
        }
        None => {
            annotations.remove(annotation::RESTARTS);
        }
    }
}

fn all_names(pod: &Pod) -> Vec<&str> {
    pod.spec
        .iter()
        .flat_map(podspec::containers)
        .map(|c| c.name.as_str())
        .collect()
}

/// Refuses priorities the kubelet's stop order cannot satisfy: the pod would be held to its
/// deadline on every deletion.
pub fn check_stop_order(members: &[Member], order: &StopOrder) -> Result<(), String> {
    let prios: Vec<(&str, u8)> = members
        .iter()
        .map(|m| (m.name.as_str(), m.priority))
        .collect();
    let Some(&(waiter, other)) = order.contradictions(&prios).first() else {
        return Ok(());
    };
    let prio = |name: &str| {
        prios
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, p)| *p)
    };
    let waiter_is_native = order.is_native(waiter);
    let why = if waiter_is_native {
        format!(
            "native sidecars stop in reverse declaration order and {other:?} is declared before \
             {waiter:?}; give {other:?} an exit priority of at least {}, or declare it after {waiter:?}",
            prio(waiter)
        )
    } else {
        format!(
            "the kubelet stops native sidecars only after every main container has exited; give \
             {waiter:?} an exit priority of at most {}",
            prio(other)
        )
    };
    Err(format!(
        "{} {waiter:?} (exit priority {}) would wait for native sidecar {other:?} (exit priority \
         {}), which the kubelet stops only after it: the pod would be held until its grace \
         period ends; {why}",
        if waiter_is_native {
            "native sidecar"
        } else {
            "container"
        },
        prio(waiter),
        prio(other),
    ))
}

/// The entrypoint's own deadline: the pod's grace period minus the agent's reserve, and at
/// least a second.
pub fn entrypoint_timeout(grace_seconds: i64, reserve: Duration) -> Duration {
    let grace = Duration::from_secs(u64::try_from(grace_seconds).unwrap_or(0));
    grace.saturating_sub(reserve).max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply(object: &Value, admission: &Admission) -> Value {
        let Admission::Allow { patch, .. } = admission else {
            panic!("denied: {admission:?}");
        };
        let mut out = object.clone();
        json_patch::patch(&mut out, patch).unwrap();
        out
    }

    fn pod(annotations: Value, spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
               "spec": spec})
    }

    fn denied(a: &Admission) -> &str {
        match a {
            Admission::Deny(m) => m,
            other => panic!("allowed: {other:?}"),
        }
    }

    #[test]
    fn a_pod_that_did_not_opt_in_is_left_alone() {
        let p = pod(
            json!({"exitorder.io/container-exit-priority": "not json"}),
            json!({"containers": [{"name": "app", "image": "x"}, {"name": "linkerd-proxy", "image": "y"}]}),
        );
        assert_eq!(mutate(&p, &Settings::default()), Admission::unchanged());
        for v in ["false", "True", "yes", ""] {
            let p = pod(json!({"exitorder.io/inject": v}), json!({"containers": []}));
            assert_eq!(
                mutate(&p, &Settings::default()),
                Admission::unchanged(),
                "{v}"
            );
        }
    }

    #[test]
    fn the_install_container_goes_first_and_moves_nothing_else_field_by_field() {
        // Init containers this build cannot fully read keep every field: they move whole.
        let p = pod(
            json!({"exitorder.io/inject": "true"}),
            json!({"initContainers": [
                       {"name": "setup", "image": "s", "futureField": {"x": 1}},
                       {"name": "istio-proxy", "image": "p", "restartPolicy": "Always",
                        "futureField": [2]}],
                   "containers": [{"name": "app", "image": "a"}]}),
        );
        let out = apply(&p, &mutate(&p, &Settings::default()));
        let inits = out["spec"]["initContainers"].as_array().unwrap();
        let names: Vec<&str> = inits.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["exitorder-install", "setup", "istio-proxy"]);
        assert_eq!(inits[1]["futureField"], json!({"x": 1}));
        assert_eq!(inits[2]["futureField"], json!([2]));
        assert!(inits[0].get("futureField").is_none());
        assert_eq!(
            mutate(&out, &Settings::default()),
            Admission::unchanged(),
            "a second pass changes nothing"
        );
    }

    #[test]
    fn the_apps_of_a_pod_that_waits_for_its_endpoints_wait_with_their_settle_time() {
        let prestop = |out: &Value, name: &str| -> Vec<String> {
            let c = out["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
                .unwrap();
            serde_json::from_value(c["lifecycle"]["preStop"]["exec"]["command"].clone()).unwrap()
        };
        let p = pod(
            json!({"exitorder.io/inject": "true", "exitorder.io/wait-for-endpoints": "true",
                   "exitorder.io/endpoints-settle": "3s"}),
            json!({"containers": [
                {"name": "app", "image": "a",
                 "lifecycle": {"preStop": {"exec": {"command": ["drain", "--now"]}}}},
                {"name": "linkerd-proxy", "image": "p"}]}),
        );
        let out = apply(&p, &mutate(&p, &Settings::default()));
        assert_eq!(
            prestop(&out, "app"),
            [
                exitorder_contract::mount::ENTRYPOINT,
                "wait",
                "--timeout",
                "25s",
                "--settle=3000ms",
                "--",
                "drain",
                "--now"
            ]
        );
        assert_eq!(prestop(&out, "linkerd-proxy")[1], "wait");
        assert_eq!(
            mutate(&out, &Settings::default()),
            Admission::unchanged(),
            "a second pass changes nothing"
        );
        // A pod without sidecars still gets its app's wait, with the default settle time.
        let p = pod(
            json!({"exitorder.io/inject": "true", "exitorder.io/wait-for-endpoints": "true"}),
            json!({"containers": [{"name": "web", "image": "a"}]}),
        );
        let out = apply(&p, &mutate(&p, &Settings::default()));
        assert_eq!(
            prestop(&out, "web"),
            [
                exitorder_contract::mount::ENTRYPOINT,
                "wait",
                "--timeout",
                "25s",
                "--settle=2000ms"
            ]
        );
        // A bad value is refused, naming the annotation.
        let p = pod(
            json!({"exitorder.io/inject": "true", "exitorder.io/wait-for-endpoints": "true",
                   "exitorder.io/endpoints-settle": "soon"}),
            json!({"containers": [{"name": "web", "image": "a"}]}),
        );
        assert!(denied(&mutate(&p, &Settings::default())).contains("exitorder.io/endpoints-settle"));
        // The host share's layout while the agents roll out: the node's plain entrypoint, and
        // a warning that an earlier release's node lets the app go without the wait.
        let p = pod(
            json!({"exitorder.io/inject": "true", "exitorder.io/wait-for-endpoints": "true"}),
            json!({"containers": [{"name": "web", "image": "a"}]}),
        );
        let rolling = Settings {
            handshake_volume: HandshakeVolume::HostPath,
            mark_containers: false,
            ..Settings::default()
        };
        let admission = mutate(&p, &rolling);
        let Admission::Allow { warnings, .. } = &admission else {
            panic!("{admission:?}");
        };
        assert!(
            warnings.iter().any(|w| w.contains("rolling out")),
            "{warnings:?}"
        );
        assert_eq!(
            prestop(&apply(&p, &admission), "web")[0],
            exitorder_contract::mount::ENTRYPOINT
        );
    }

    #[test]
    fn the_entrypoint_timeout_follows_the_grace_period() {
        let r = Duration::from_secs(5);
        assert_eq!(entrypoint_timeout(30, r), Duration::from_secs(25));
        assert_eq!(entrypoint_timeout(120, r), Duration::from_secs(115));
        assert_eq!(entrypoint_timeout(3, r), Duration::from_secs(1));
        assert_eq!(entrypoint_timeout(-1, r), Duration::from_secs(1));
    }

    #[test]
    fn priorities_contradicting_the_kubelet_are_denied_naming_both() {
        let spec = json!({
            "initContainers": [
                {"name": "istio-proxy", "image": "p", "restartPolicy": "Always"},
                {"name": "logs", "image": "l", "restartPolicy": "Always"}],
            "containers": [{"name": "app", "image": "a"}]});
        let p = pod(
            json!({"exitorder.io/inject": "true",
                   "exitorder.io/container-exit-priority": r#"{"istio-proxy": 1, "logs": 2}"#}),
            spec.clone(),
        );
        let m = denied(&mutate(&p, &Settings::default())).to_owned();
        assert!(
            m.contains("\"logs\"") && m.contains("\"istio-proxy\""),
            "{m}"
        );
        assert!(m.contains("reverse declaration order"), "{m}");
        let p = pod(
            json!({"exitorder.io/inject": "true",
                   "exitorder.io/container-exit-priority": r#"{"app": 2}"#}),
            spec.clone(),
        );
        let m = denied(&mutate(&p, &Settings::default())).to_owned();
        assert!(
            m.contains("container \"app\"") && m.contains("\"istio-proxy\""),
            "{m}"
        );
        // Agreeing priorities are admitted.
        let p = pod(
            json!({"exitorder.io/inject": "true",
                   "exitorder.io/container-exit-priority": r#"{"istio-proxy": 2}"#}),
            spec,
        );
        let out = apply(&p, &mutate(&p, &Settings::default()));
        assert_eq!(
            out["metadata"]["annotations"]["exitorder.io/native-sidecars"],
            json!(r#"["istio-proxy","logs"]"#)
        );
    }

    #[test]
    fn a_completing_pod_carries_its_restart_record_and_no_other_pod_does() {
        let record = |out: &Value| -> Option<RestartRecord> {
            let v = out["metadata"]["annotations"][annotation::RESTARTS].as_str()?;
            Some(RestartRecord::parse(v).expect("the webhook's record reads back"))
        };
        let spec = json!({"restartPolicy": "Never", "containers": [
            {"name": "worker", "image": "w", "restartPolicy": "OnFailure",
             "restartPolicyRules": [
                 {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]},
            {"name": "linkerd-proxy", "image": "p"}]});
        // A value the pod was sent with is never kept: the webhook writes its own.
        let p = pod(
            json!({"exitorder.io/inject": "true", annotation::RESTARTS: "forged"}),
            spec.clone(),
        );
        let out = apply(&p, &mutate(&p, &Settings::default()));
        let got = record(&out).expect("a record");
        let spec: k8s_openapi::api::core::v1::PodSpec =
            serde_json::from_value(spec).expect("a spec");
        assert_eq!(got, RestartRecord::of_spec(&spec));
        assert_eq!(got.names(), ["worker", "linkerd-proxy"]);
        let restarts = got.restarts();
        let worker = restarts["worker"].as_ref().expect("readable");
        assert!(worker.restarts(1) && worker.restarts(42) && !worker.restarts(0));
        let proxy = restarts["linkerd-proxy"].as_ref().expect("readable");
        assert!(!proxy.restarts(1));
        // A pod that never completes carries none, forged or not.
        let p = pod(
            json!({"exitorder.io/inject": "true", annotation::RESTARTS: "forged"}),
            json!({"containers": [{"name": "app", "image": "a"},
                                  {"name": "linkerd-proxy", "image": "p"}]}),
        );
        assert_eq!(record(&apply(&p, &mutate(&p, &Settings::default()))), None);
        // Rules too large for the agent to read: none, and the webhook says why.
        let rules: Vec<Value> = (0..20)
            .map(|_| json!({"action": "Restart",
                            "exitCodes": {"operator": "In", "values": (0..255).collect::<Vec<i32>>()}}))
            .collect();
        let p = pod(
            json!({"exitorder.io/inject": "true"}),
            json!({"restartPolicy": "Never", "containers": [
                {"name": "worker", "image": "w", "restartPolicyRules": rules},
                {"name": "linkerd-proxy", "image": "p"}]}),
        );
        let admission = mutate(&p, &Settings::default());
        assert_eq!(record(&apply(&p, &admission)), None);
        let Admission::Allow { warnings, .. } = &admission else {
            panic!("denied: {admission:?}");
        };
        assert!(
            warnings.iter().any(|w| w.contains(annotation::RESTARTS)),
            "{warnings:?}"
        );
    }

    #[test]
    fn malformed_priorities_are_denied_with_the_annotation_named() {
        for (key, value, want) in [
            (
                "exitorder.io/container-exit-priority",
                "nope",
                "not valid JSON",
            ),
            (
                "exitorder.io/container-exit-priority",
                "[1]",
                "must be a JSON object",
            ),
            (
                "kruise.io/container-exit-priority",
                r#"{"a": 300}"#,
                "\"a\" is 300",
            ),
            (
                "exitorder.io/container-exit-priority",
                r#"{"a": -1}"#,
                "\"a\" is -1",
            ),
            (
                "exitorder.io/container-exit-priority",
                r#"{"a": "1"}"#,
                "\"a\" is \"1\"",
            ),
        ] {
            let p = pod(
                json!({"exitorder.io/inject": "true", key: value}),
                json!({"containers": [{"name": "a", "image": "x"}]}),
            );
            let m = denied(&mutate(&p, &Settings::default())).to_owned();
            assert!(m.contains(key) && m.contains(want), "{value}: {m}");
        }
        let p = pod(
            json!({"exitorder.io/inject": "true"}),
            json!({"containers": [{"name": "a", "image": "x",
                                   "env": [{"name": "EXITORDER_EXIT_PRIORITY", "value": "high"}]}]}),
        );
        let m = denied(&mutate(&p, &Settings::default())).to_owned();
        assert!(
            m.contains("\"a\"") && m.contains("EXITORDER_EXIT_PRIORITY"),
            "{m}"
        );
    }

    #[test]
    fn a_name_that_matches_no_container_is_a_warning() {
        let p = pod(
            json!({"exitorder.io/inject": "true",
                   "exitorder.io/container-exit-priority": r#"{"proxy": 1, "ghost": 2}"#}),
            json!({"containers": [{"name": "app", "image": "a"}, {"name": "proxy", "image": "p"}]}),
        );
        let Admission::Allow { warnings, patch } = mutate(&p, &Settings::default()) else {
            panic!("denied");
        };
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("\"ghost\""), "{warnings:?}");
        assert!(!patch.0.is_empty());
    }

    #[test]
    fn sidecars_move_first_as_whole_containers() {
        let p = pod(
            json!({"exitorder.io/inject": "true", "exitorder.io/await-sidecars": "true"}),
            json!({"containers": [
                {"name": "app", "image": "a", "futureField": {"kept": true}},
                {"name": "logs", "image": "l", "env": [{"name": "EXITORDER_EXIT_PRIORITY", "value": "2"}]},
                {"name": "linkerd-proxy", "image": "p", "futureField": 7}]}),
        );
        let a = mutate(&p, &Settings::default());
        let out = apply(&p, &a);
        let names: Vec<&str> = out["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        // logs has no readiness endpoint: it stays, with a warning.
        assert_eq!(names, ["linkerd-proxy", "app", "logs"]);
        // Fields this build does not know travel with their container.
        assert_eq!(out["spec"]["containers"][0]["futureField"], 7);
        assert_eq!(
            out["spec"]["containers"][1]["futureField"],
            json!({"kept": true})
        );
        let Admission::Allow { patch, warnings } = mutate(&out, &Settings::default()) else {
            panic!("denied");
        };
        assert!(patch.0.is_empty(), "a second pass: {patch:?}");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(
            moves_first(&["a".into(), "b".into()], &["a".into()]),
            vec![]
        );
    }

    #[test]
    fn containers_sharing_a_name_are_not_moved() {
        // Invalid (the API server refuses it after the webhooks), but seen here first.
        let p = pod(
            json!({"exitorder.io/inject": "true"}),
            json!({"containers": [
                {"image": "a"}, {"name": "app", "image": "b"}, {"image": "c"}]}),
        );
        assert_eq!(mutate(&p, &Settings::default()), Admission::unchanged());
        let names = ["p", "a", "p"].map(String::from);
        let ops = moves_first(&names, &["p".into()]);
        assert!(ops.is_empty(), "{ops:?}");
        let names = ["a", "p", "b", "p"].map(String::from);
        assert_eq!(moves_first(&names, &["p".into(), "p".into()]).len(), 1);
    }

    #[test]
    fn a_pod_that_did_not_opt_in_is_never_refused() {
        let p =
            json!({"metadata": {"annotations": {"other": "x"}}, "spec": {"containers": "nope"}});
        assert_eq!(mutate(&p, &Settings::default()), Admission::unchanged());
    }

    #[test]
    fn not_a_pod_is_denied() {
        let m = denied(&mutate(
            &json!({"metadata": {"annotations": {"exitorder.io/inject": "true"}},
                    "spec": {"containers": "nope"}}),
            &Settings::default(),
        ))
        .to_owned();
        assert!(m.contains("not a valid Pod"), "{m}");
    }
}
