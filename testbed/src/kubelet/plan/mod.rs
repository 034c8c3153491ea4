//! A Pod, checked and resolved the way the kubelet resolves it before it calls the runtime:
//! env values expanded and fieldRefs filled in, subPathExpr expanded from the container's env,
//! named ports looked up, security settings merged from pod and container. Pure: no runtime,
//! no files; every problem is an error that names the field.
//!
//! Parts:
//! - `container`: one container resolved: env expanded, command, mounts, handlers, probes;
//! - `actions`: lifecycle handlers and probes: exec, httpGet, tcpSocket, sleep;
//! - `security`: a container's security settings, as the runtime gets them;
//! - `volumes`: the pod's volumes the test bed supports: hostPath and emptyDir;
//! - `restart`: whether a container starts again, read apart from the agent.

mod actions;
mod container;
pub mod restart;
mod security;
mod volumes;

use std::collections::BTreeMap;

pub use container::expand;
use container::PodBase;
use k8s_openapi::api::core::v1::{Container, Pod};
use security::seccomp;
use serde_json::Value;
pub use volumes::{HostPathType, Volume};

use super::fields::{self, Note};

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("pod {pod}: {field}: {problem}")]
pub struct PlanError {
    pub pod: String,
    pub field: String,
    pub problem: String,
}

/// Pod-level facts the runner provides, as the kubelet and the API server would.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The pod's UID when the Pod has none (the API server assigns one).
    pub uid: String,
    /// `spec.nodeName` when the Pod has none (the scheduler's choice).
    pub node_name: String,
    /// The node's address: `status.hostIP`, and `status.podIP` of host-network pods.
    pub host_ip: String,
    /// Run a pod that does not ask for `hostNetwork` on the node's network anyway (there is
    /// no CNI on the test bed); said in the notes. Otherwise such a pod is refused.
    pub force_host_network: bool,
    /// A suffix for `metadata.generateName`.
    pub name_suffix: String,
}

#[cfg(test)]
impl Placement {
    /// A node's placement for the test bed's own unit tests.
    pub(crate) fn example() -> Placement {
        Placement {
            uid: "7b0e6c9e-4c1e-4d63-9a43-2f6f3c1d9b10".into(),
            node_name: "node-1".into(),
            host_ip: "10.0.0.7".into(),
            force_host_network: false,
            name_suffix: "abcde".into(),
        }
    }
}

/// The pod's restartPolicy; a container's own (KEP-5307) is its plan's `restart`.
pub use restart::{RestartPolicy, Restarts, Then};

/// Where a container stands in the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An init container that runs to completion before the next starts.
    Init,
    /// An init container with `restartPolicy: Always` (KEP-753): started in order before the
    /// main containers, stopped after them in reverse order.
    Sidecar,
    /// A container of `spec.containers`.
    Main,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    Exec(Vec<String>),
    HttpGet {
        host: Option<String>,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    TcpSocket {
        host: Option<String>,
        port: u16,
    },
    Sleep(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub handler: Handler,
    pub initial_delay_seconds: i64,
    pub period_seconds: i64,
    pub timeout_seconds: i64,
    pub success_threshold: u32,
    pub failure_threshold: u32,
    /// A liveness probe's own grace period for the kill it causes.
    pub termination_grace_seconds: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seccomp {
    RuntimeDefault,
    Unconfined,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Security {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub run_as_non_root: bool,
    pub privileged: bool,
    pub add_capabilities: Vec<String>,
    pub drop_capabilities: Vec<String>,
    pub read_only_root: bool,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privs: bool,
    pub seccomp: Option<Seccomp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub volume: String,
    pub container_path: String,
    /// Relative path inside the volume (subPath, or subPathExpr expanded).
    pub sub_path: Option<String>,
    pub read_only: bool,
    /// `HostToContainer` or `Bidirectional` (`None`: private).
    pub propagation: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ContainerPlan {
    pub name: String,
    pub kind: Kind,
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub working_dir: String,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<MountPlan>,
    pub security: Security,
    pub post_start: Option<Handler>,
    pub pre_stop: Option<Handler>,
    pub liveness: Option<Probe>,
    pub readiness: Option<Probe>,
    pub startup: Option<Probe>,
    pub termination_message_path: String,
    pub termination_message_policy: String,
    /// The container's ports as the kubelet's `io.kubernetes.container.ports` annotation.
    pub ports_json: Option<String>,
    /// Its CPU limit (`resources.limits.cpu`), in millicores: the CFS quota of its cgroup.
    pub cpu_limit_milli: Option<u64>,
    /// The container's spec as written: what the kubelet's container hash covers, and what
    /// the preStop annotation shows.
    pub spec: Container,
    /// Whether a main container starts again after an exit (the pod's policy, or its own
    /// and its rules). Of an init container or native sidecar, only its
    /// `RestartAllContainers` rules are played.
    pub restart: Restarts,
}

#[derive(Debug, Clone)]
pub struct PodPlan {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub grace_seconds: i64,
    pub restart_policy: RestartPolicy,
    pub host_pid: bool,
    pub host_ipc: bool,
    pub share_process_namespace: bool,
    pub node_name: String,
    pub host_ip: String,
    pub pod_run_as_user: Option<i64>,
    pub pod_run_as_group: Option<i64>,
    pub supplemental_groups: Vec<i64>,
    pub pod_seccomp: Option<Seccomp>,
    /// Init containers and native sidecars, in declaration order.
    pub init: Vec<ContainerPlan>,
    pub containers: Vec<ContainerPlan>,
    pub volumes: BTreeMap<String, Volume>,
    /// The pod's CPU request in millicores as the kubelet sums it (its cgroup's weight);
    /// `None` for a BestEffort pod (no container requests or limits anything).
    pub cpu_request_milli: Option<u64>,
    /// `spec.hostUsers` (default true): false asks for a user namespace of the pod's own.
    pub host_users: bool,
    /// The first host ID of the pod's user namespace, once the runner gave it one
    /// (`hostUsers: false`); its 65536 IDs map the container's 0..65535.
    pub userns_host_id: Option<u32>,
    /// Fields accepted without effect here, with why.
    pub notes: Vec<Note>,
}

impl PodPlan {
    /// The pod's cgroup (relative to each hierarchy, under the node's `root`), in its QoS
    /// tier as the kubelet places it.
    pub fn cgroup(&self, root: &str) -> String {
        crate::node::Tier::of(self.cpu_request_milli).pod_cgroup(root, &self.uid)
    }

    /// Every container, init containers first.
    pub fn all(&self) -> impl Iterator<Item = &ContainerPlan> {
        self.init.iter().chain(&self.containers)
    }

    pub fn container(&self, name: &str) -> Option<&ContainerPlan> {
        self.all().find(|c| c.name == name)
    }

    pub fn has_sidecars(&self) -> bool {
        self.init.iter().any(|c| c.kind == Kind::Sidecar)
    }
}

/// A pod's CPU request as the kubelet weighs its cgroup: the main containers' and native
/// sidecars' requests summed, or the largest regular init container's if more; a container
/// with only a limit requests its limit. `None` when no container requests or limits anything
/// (a BestEffort pod).
fn pod_cpu_request(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    err: &impl Fn(&str, String) -> PlanError,
) -> Result<Option<u64>, PlanError> {
    let inits = spec.init_containers.iter().flatten().enumerate();
    let inits = inits.map(|(i, c)| (format!("spec.initContainers[{i}]"), c));
    let mains = spec.containers.iter().enumerate();
    let mains = mains.map(|(i, c)| (format!("spec.containers[{i}]"), c));
    let (mut any, mut running, mut init_max) = (false, 0u64, 0u64);
    for (field, c) in inits.chain(mains) {
        let Some(r) = &c.resources else { continue };
        let (requests, limits) = (r.requests.as_ref(), r.limits.as_ref());
        any |= requests.is_some_and(|m| !m.is_empty()) || limits.is_some_and(|m| !m.is_empty());
        let cpu = match (
            requests.and_then(|m| m.get("cpu")),
            limits.and_then(|m| m.get("cpu")),
        ) {
            (Some(q), _) => (format!("{field}.resources.requests.cpu"), q),
            (None, Some(q)) => (format!("{field}.resources.limits.cpu"), q),
            (None, None) => continue,
        };
        let milli = millicores(&cpu.1 .0).map_err(|why| err(&cpu.0, why))?;
        let regular_init = field.starts_with("spec.initContainers")
            && c.restart_policy.as_deref() != Some("Always");
        if regular_init {
            init_max = init_max.max(milli);
        } else {
            running = running.saturating_add(milli);
        }
    }
    Ok(any.then_some(running.max(init_max)))
}

/// A CPU quantity (`100m`, `2`, `0.5`) in millicores, rounded up as the API server rounds.
pub fn millicores(q: &str) -> Result<u64, String> {
    let bad = || format!("{q:?} is not a CPU quantity the test bed reads (100m, 2, 0.5)");
    if let Some(m) = q.strip_suffix('m') {
        return m.parse::<u64>().map_err(|_| bad());
    }
    let (whole, frac) = q.split_once('.').unwrap_or((q, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole
            .bytes()
            .chain(frac.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let mut milli = whole.checked_mul(1000).ok_or_else(bad)?;
    let digits: Vec<u64> = frac.bytes().map(|b| u64::from(b - b'0')).collect();
    for (i, scale) in [100, 10, 1].into_iter().enumerate() {
        milli += digits.get(i).copied().unwrap_or(0) * scale;
    }
    if digits.iter().skip(3).any(|d| *d > 0) {
        milli += 1;
    }
    Ok(milli)
}

/// A container's restart rules, or the field that cannot be read.
fn restart_of(
    pod_policy: RestartPolicy,
    c: &k8s_openapi::api::core::v1::Container,
    field: &str,
    err: &impl Fn(&str, String) -> PlanError,
) -> Result<Restarts, PlanError> {
    Restarts::of(pod_policy, c).map_err(|(which, why)| err(&format!("{field}.{which}"), why))
}

/// Checks and resolves `pod` (as written: the JSON of the YAML, before typing).
pub fn plan(pod: &Value, place: &Placement) -> Result<PodPlan, PlanError> {
    let name_hint = pod
        .pointer("/metadata/name")
        .or_else(|| pod.pointer("/metadata/generateName"))
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)")
        .to_owned();
    let err = |field: &str, problem: String| PlanError {
        pod: name_hint.clone(),
        field: field.to_owned(),
        problem,
    };
    if let Some(kind) = pod.get("kind").and_then(Value::as_str) {
        if kind != "Pod" {
            return Err(err("kind", format!("{kind:?} is not a Pod (give a Pod, or take the pod template out of the {kind})")));
        }
    }
    let notes = fields::check(pod).map_err(|r| err(&r.field, r.why))?;
    let typed: Pod = serde_json::from_value(pod.clone())
        .map_err(|e| err("(pod)", format!("not a valid Pod: {e}")))?;
    Planner {
        err: &err,
        place,
        notes,
    }
    .plan(typed)
}

pub(super) struct Planner<'a, E: Fn(&str, String) -> PlanError> {
    err: &'a E,
    place: &'a Placement,
    notes: Vec<Note>,
}

impl<E: Fn(&str, String) -> PlanError> Planner<'_, E> {
    fn plan(mut self, pod: Pod) -> Result<PodPlan, PlanError> {
        let err = self.err;
        let meta = pod.metadata;
        let name = match (meta.name, meta.generate_name) {
            (Some(n), _) if !n.is_empty() => n,
            (_, Some(g)) if !g.is_empty() => format!("{g}{}", self.place.name_suffix),
            _ => {
                return Err(err(
                    "metadata.name",
                    "a pod needs a name (or generateName)".into(),
                ))
            }
        };
        if !is_dns_subdomain(&name) {
            return Err(err(
                "metadata.name",
                format!("{name:?} is not a DNS subdomain"),
            ));
        }
        let namespace = meta.namespace.unwrap_or_else(|| "default".to_owned());
        let uid = meta
            .uid
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| self.place.uid.clone());
        exitorder::pod::PodUid::parse(&uid).map_err(|e| err("metadata.uid", e.to_string()))?;
        let labels = meta.labels.unwrap_or_default();
        let annotations = meta.annotations.unwrap_or_default();
        let spec = pod
            .spec
            .ok_or_else(|| err("spec", "a pod needs a spec".into()))?;
        let host_users = spec.host_users.unwrap_or(true);
        if !host_users && spec.host_network.unwrap_or(false) {
            // As the API server: a user namespace needs the pod's own network namespace.
            return Err(err(
                "spec.hostUsers",
                "hostUsers: false is not allowed with hostNetwork: true".into(),
            ));
        }
        if !host_users {
            // containerd pins a pod's user namespace to its network namespace: the pod gets
            // one of its own, on the test bed's point-to-point pod network.
        } else if !spec.host_network.unwrap_or(false) {
            if self.place.force_host_network {
                self.notes.push(Note {
                    field: "spec.hostNetwork".into(),
                    why: "not set: the pod runs on the node's network anyway (--host-network); \
                          the test bed has no CNI",
                });
            } else {
                return Err(err(
                    "spec.hostNetwork",
                    "only hostNetwork pods run on the test bed: it has no CNI to give a pod a \
                     network of its own (run it with --host-network to put it on the node's \
                     network anyway)"
                        .into(),
                ));
            }
        }
        let restart_policy = RestartPolicy::of_pod(spec.restart_policy.as_deref())
            .map_err(|e| err("spec.restartPolicy", e))?;
        let grace_seconds = spec
            .termination_grace_period_seconds
            .unwrap_or(DEFAULT_GRACE_SECONDS);
        if grace_seconds < 0 {
            return Err(err(
                "spec.terminationGracePeriodSeconds",
                "must not be negative".into(),
            ));
        }
        let node_name = spec
            .node_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| self.place.node_name.clone());
        let cpu_request_milli = pod_cpu_request(&spec, err)?;
        let psc = spec.security_context.unwrap_or_default();
        let pod_seccomp = seccomp(
            psc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            "spec.securityContext.seccompProfile.type",
            err,
        )?;
        let volumes = volumes::plan(spec.volumes.unwrap_or_default(), err)?;

        let base = PodBase {
            name: &name,
            namespace: &namespace,
            uid: &uid,
            labels: &labels,
            annotations: &annotations,
            node_name: &node_name,
            host_ip: &self.place.host_ip,
            service_account: spec
                .service_account_name
                .as_deref()
                .or(spec.service_account.as_deref())
                .unwrap_or("default"),
        };
        let mut init = Vec::new();
        for (i, c) in spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let field = format!("spec.initContainers[{i}]");
            let kind = match c.restart_policy.as_deref() {
                None => Kind::Init,
                Some("Always") => Kind::Sidecar,
                Some(other) => {
                    return Err(err(
                        &format!("{field}.restartPolicy"),
                        format!("{other:?}: an init container's restartPolicy can only be Always (a native sidecar)"),
                    ))
                }
            };
            // Only a rule's RestartAllContainers action is played for init containers and
            // native sidecars: a sidecar restarts anyway, and an init container's own
            // restarts follow the pod's policy.
            let restart = restart_of(restart_policy, &c, &field, &err)?;
            let mut plan = self.container(c, kind, &field, &base, &volumes)?;
            plan.restart = restart;
            init.push(plan);
        }
        let mut containers = Vec::new();
        for (i, c) in spec.containers.into_iter().enumerate() {
            let field = format!("spec.containers[{i}]");
            // Its own restartPolicy and restartPolicyRules (KEP-5307, Kubernetes 1.34+) over
            // the pod's, as the kubelet plays them.
            let restart = restart_of(restart_policy, &c, &field, &err)?;
            let mut plan = self.container(c, Kind::Main, &field, &base, &volumes)?;
            plan.restart = restart;
            containers.push(plan);
        }
        if containers.is_empty() {
            return Err(err(
                "spec.containers",
                "a pod needs at least one container".into(),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for c in init.iter().chain(&containers) {
            if !seen.insert(c.name.as_str()) {
                return Err(err(
                    "spec",
                    format!("container name {:?} used twice", c.name),
                ));
            }
        }
        Ok(PodPlan {
            name,
            namespace,
            uid,
            labels,
            annotations,
            grace_seconds,
            restart_policy,
            host_pid: spec.host_pid.unwrap_or(false),
            host_ipc: spec.host_ipc.unwrap_or(false),
            share_process_namespace: spec.share_process_namespace.unwrap_or(false),
            node_name,
            host_ip: self.place.host_ip.clone(),
            pod_run_as_user: psc.run_as_user,
            pod_run_as_group: psc.run_as_group,
            supplemental_groups: psc.supplemental_groups.unwrap_or_default(),
            pod_seccomp,
            init,
            containers,
            volumes,
            cpu_request_milli,
            host_users,
            userns_host_id: None,
            notes: self.notes,
        })
        .map(|mut p| {
            // Pod-level security applies to every container that does not say otherwise.
            let (user, group, non_root, sc) = (
                p.pod_run_as_user,
                p.pod_run_as_group,
                psc.run_as_non_root.unwrap_or(false),
                p.pod_seccomp.clone(),
            );
            for c in p.init.iter_mut().chain(p.containers.iter_mut()) {
                c.security.run_as_user = c.security.run_as_user.or(user);
                c.security.run_as_group = c.security.run_as_group.or(group);
                c.security.run_as_non_root |= non_root;
                if c.security.seccomp.is_none() {
                    c.security.seccomp = sc.clone();
                }
            }
            p
        })
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn place() -> Placement {
        Placement::example()
    }

    fn pod(containers: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"a": "b"}},
               "spec": {"hostNetwork": true, "containers": containers,
                        "volumes": [{"name": "share", "hostPath": {"path": "/var/lib/exitorder", "type": "DirectoryOrCreate"}},
                                    {"name": "scratch", "emptyDir": {}}]}})
    }

    #[test]
    fn env_is_expanded_in_order_with_field_refs() {
        let p = plan(
            &pod(json!([{
                "name": "proxy", "image": "busybox:1.36",
                "command": ["sh", "-c", "echo $(GREETING) from $(POD_NAME) $$(literal) $(MISSING)"],
                "env": [
                    {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "GREETING", "value": "hello $(NODE)"},
                ],
                "volumeMounts": [{"name": "share", "mountPath": "/var/run/exitorder", "subPathExpr": "pods/$(POD_UID)/proxy"}],
            }])),
            &place(),
        )
        .unwrap();
        let c = &p.containers[0];
        let env: BTreeMap<_, _> = c.env.iter().cloned().collect();
        assert_eq!(env["POD_UID"], place().uid);
        assert_eq!(env["POD_NAME"], "web");
        assert_eq!(env["NODE"], "node-1");
        assert_eq!(env["IP"], "10.0.0.7");
        assert_eq!(env["APP"], "web");
        assert_eq!(env["GREETING"], "hello node-1");
        assert_eq!(
            c.command[2],
            "echo hello node-1 from web $(literal) $(MISSING)"
        );
        assert_eq!(
            c.mounts[0].sub_path.as_deref(),
            Some(format!("pods/{}/proxy", place().uid).as_str())
        );
        assert_eq!(p.namespace, "default");
        assert_eq!(p.grace_seconds, 30);
        assert_eq!(p.restart_policy, RestartPolicy::Always);
    }

    #[test]
    fn handlers_and_probes_resolve_named_ports() {
        let p = plan(
            &pod(json!([{
                "name": "agent", "image": "x",
                "ports": [{"name": "metrics", "containerPort": 9484}],
                "readinessProbe": {"httpGet": {"path": "readyz", "port": "metrics"}, "periodSeconds": 2},
                "livenessProbe": {"tcpSocket": {"port": 9484}, "failureThreshold": 1},
                "lifecycle": {"preStop": {"sleep": {"seconds": 3}},
                              "postStart": {"exec": {"command": ["true"]}}},
            }])),
            &place(),
        )
        .unwrap();
        let c = &p.containers[0];
        assert_eq!(
            c.readiness.as_ref().unwrap().handler,
            Handler::HttpGet {
                host: None,
                port: 9484,
                path: "/readyz".into(),
                headers: vec![]
            }
        );
        assert_eq!(c.readiness.as_ref().unwrap().period_seconds, 2);
        assert_eq!(c.liveness.as_ref().unwrap().failure_threshold, 1);
        assert_eq!(c.pre_stop, Some(Handler::Sleep(3)));
        assert_eq!(c.post_start, Some(Handler::Exec(vec!["true".into()])));
        assert!(c.ports_json.as_deref().unwrap().contains("9484"));
    }

    #[test]
    fn native_sidecars_and_init_containers() {
        let mut v = pod(json!([{"name": "app", "image": "x"}]));
        v["spec"]["initContainers"] = json!([
            {"name": "setup", "image": "x"},
            {"name": "istio-proxy", "image": "x", "restartPolicy": "Always"},
        ]);
        let p = plan(&v, &place()).unwrap();
        assert_eq!(p.init[0].kind, Kind::Init);
        assert_eq!(p.init[1].kind, Kind::Sidecar);
        assert!(p.has_sidecars());
        assert_eq!(
            p.all().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["setup", "istio-proxy", "app"]
        );
    }

    #[test]
    fn problems_name_their_field() {
        let cases = [
            (
                json!([{"name": "a", "image": "x", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}]),
                "spec.containers[0].volumeMounts[0].name",
            ),
            (
                json!([{"name": "a", "image": "x", "volumeMounts": [{"name": "share", "mountPath": "/x", "subPath": "../etc"}]}]),
                "spec.containers[0].volumeMounts[0].subPath",
            ),
            (
                json!([{"name": "a", "image": "x", "readinessProbe": {"httpGet": {"port": "web"}}}]),
                "spec.containers[0].readinessProbe.httpGet.port",
            ),
            (
                json!([{"name": "a", "image": "x", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}]}]),
                "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
            ),
            (json!([{"name": "a"}]), "spec.containers[0].image"),
            (
                json!([{"name": "Bad_Name", "image": "x"}]),
                "spec.containers[0].name",
            ),
            (
                json!([{"name": "a", "image": "x"}, {"name": "a", "image": "x"}]),
                "spec",
            ),
            (
                json!([{"name": "a", "image": "x", "restartPolicy": "Sometimes"}]),
                "spec.containers[0].restartPolicy",
            ),
            (
                json!([{"name": "a", "image": "x", "restartPolicy": "Never",
                        "restartPolicyRules": [{"action": "Restart"}]}]),
                "spec.containers[0].restartPolicyRules",
            ),
            (
                json!([{"name": "a", "image": "x", "readinessProbe": {"httpGet": {"port": 80, "scheme": "HTTPS"}}}]),
                "spec.containers[0].readinessProbe.httpGet.scheme",
            ),
            (
                json!([{"name": "a", "image": "x", "securityContext": {"seccompProfile": {"type": "Localhost"}}}]),
                "spec.containers[0].securityContext.seccompProfile.type",
            ),
        ];
        for (containers, field) in cases {
            let e = plan(&pod(containers.clone()), &place()).unwrap_err();
            assert_eq!(e.field, field, "{containers}: {e}");
        }
    }

    /// Every container may restart the whole pod in place (KEP-5532): a native sidecar's and
    /// a main container's rules are planned, and an init container's rule it cannot read is
    /// named.
    #[test]
    fn restart_all_containers_rules_are_planned_for_every_kind() {
        let all_on_88 = json!([
            {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}]);
        let mut v = pod(
            json!([{"name": "app", "image": "x", "restartPolicy": "Never",
            "restartPolicyRules": all_on_88}]),
        );
        v["spec"]["initContainers"] = json!([{"name": "watcher", "image": "x",
            "restartPolicy": "Always", "restartPolicyRules": all_on_88}]);
        let p = plan(&v, &place()).expect("planned");
        for c in p.init.iter().chain(&p.containers) {
            assert_eq!(c.restart.after(88), Then::RestartAll, "{}", c.name);
        }
        v["spec"]["initContainers"][0]["restartPolicyRules"][0]["action"] = json!("Recreate");
        let e = plan(&v, &place()).unwrap_err();
        assert_eq!(e.field, "spec.initContainers[0].restartPolicyRules", "{e}");
    }

    /// A user-namespaced pod gets a network of its own (containerd pins its user namespace
    /// there), and one on the node's network is refused, as the API server refuses it.
    #[test]
    fn a_user_namespaced_pod_has_its_own_network_and_never_the_nodes() {
        let mut v = pod(json!([{"name": "a", "image": "x"}]));
        v["spec"]["hostUsers"] = json!(false);
        v["spec"]["hostNetwork"] = json!(false);
        let p = plan(&v, &place()).expect("planned without --host-network");
        assert!(!p.host_users);
        assert_eq!(p.userns_host_id, None, "given by the runner, not the plan");
        v["spec"]["hostNetwork"] = json!(true);
        let e = plan(&v, &place()).unwrap_err();
        assert_eq!(e.field, "spec.hostUsers", "{e}");
        assert!(pod_plan_default_host_users());
    }

    fn pod_plan_default_host_users() -> bool {
        plan(&pod(json!([{"name": "a", "image": "x"}])), &place())
            .expect("a plan")
            .host_users
    }

    #[test]
    fn pods_off_the_host_network_are_refused_unless_forced() {
        let mut v = pod(json!([{"name": "a", "image": "x"}]));
        v["spec"]["hostNetwork"] = json!(false);
        let e = plan(&v, &place()).unwrap_err();
        assert_eq!(e.field, "spec.hostNetwork");
        assert!(e.problem.contains("no CNI"), "{e}");
        let forced = Placement {
            force_host_network: true,
            ..place()
        };
        let p = plan(&v, &forced).unwrap();
        assert!(p.notes.iter().any(|n| n.field == "spec.hostNetwork"));
    }

    #[test]
    fn pod_security_is_the_default_of_each_container() {
        let mut v = pod(json!([
            {"name": "a", "image": "x"},
            {"name": "b", "image": "x", "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": false,
             "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}, "readOnlyRootFilesystem": true}},
        ]));
        v["spec"]["securityContext"] = json!({"runAsUser": 65534, "runAsGroup": 65534, "seccompProfile": {"type": "RuntimeDefault"}});
        let p = plan(&v, &place()).unwrap();
        assert_eq!(p.containers[0].security.run_as_user, Some(65534));
        let b = &p.containers[1].security;
        assert_eq!((b.run_as_user, b.run_as_group), (Some(1000), Some(65534)));
        assert!(b.no_new_privs && b.read_only_root);
        assert_eq!(b.drop_capabilities, ["ALL"]);
        assert_eq!(b.seccomp, Some(Seccomp::RuntimeDefault));
    }

    #[test]
    fn generate_name_and_a_given_uid() {
        let v = json!({"metadata": {"generateName": "job-", "uid": "0b5c1f44-2a35-4b54-8f4f-3c8a3b4b5a01"},
                       "spec": {"hostNetwork": true, "restartPolicy": "Never", "containers": [{"name": "a", "image": "x"}]}});
        let p = plan(&v, &place()).unwrap();
        assert_eq!(p.name, "job-abcde");
        assert_eq!(p.uid, "0b5c1f44-2a35-4b54-8f4f-3c8a3b4b5a01");
        assert_eq!(p.restart_policy, RestartPolicy::Never);
        let daemonset = json!({"kind": "DaemonSet", "metadata": {"name": "x"}});
        assert_eq!(plan(&daemonset, &place()).unwrap_err().field, "kind");
    }

    #[test]
    fn expansion_rules() {
        let vars: std::collections::HashMap<String, String> =
            [("A".to_owned(), "1".to_owned())].into();
        assert_eq!(expand("$(A)$(B)$$(A)$A$(", &vars), "1$(B)$(A)$A$(");
        assert_eq!(expand("plain", &vars), "plain");
    }

    #[test]
    fn cpu_quantities_read_as_the_api_server_reads_them() {
        assert_eq!(millicores("100m"), Ok(100));
        assert_eq!(millicores("2"), Ok(2000));
        assert_eq!(millicores("0.5"), Ok(500));
        assert_eq!(millicores(".25"), Ok(250));
        assert_eq!(millicores("1.0001"), Ok(1001));
        for bad in ["", ".", "1e3", "-1", "1Ki", "m", "1.5m"] {
            assert!(millicores(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_pods_cpu_request_is_summed_as_the_kubelet_sums_it() {
        let c = |name: &str, resources: Value| json!({"name": name, "image": "busybox:1.36", "command": ["true"], "resources": resources});
        let best = plan(&pod(json!([c("a", json!({}))])), &place()).expect("plan");
        assert_eq!(best.cpu_request_milli, None);
        let mut p = pod(json!([
            c("a", json!({"requests": {"cpu": "100m"}})),
            c("b", json!({"limits": {"cpu": "1"}})),
            c("c", json!({"requests": {"memory": "1Mi"}})),
        ]));
        p["spec"]["initContainers"] = json!([
            c("sidecar", json!({"requests": {"cpu": "50m"}})),
            c("setup", json!({"requests": {"cpu": "2"}})),
        ]);
        p["spec"]["initContainers"][0]["restartPolicy"] = json!("Always");
        // The regular init container's 2 cores outweigh the running 1.15.
        assert_eq!(
            plan(&p, &place()).expect("plan").cpu_request_milli,
            Some(2000)
        );
        p["spec"]["initContainers"][1]["resources"] = json!({});
        assert_eq!(
            plan(&p, &place()).expect("plan").cpu_request_milli,
            Some(1150)
        );
        // Memory alone makes a Burstable pod with the least weight.
        let mem = plan(
            &pod(json!([c("c", json!({"requests": {"memory": "1Mi"}}))])),
            &place(),
        );
        assert_eq!(mem.expect("plan").cpu_request_milli, Some(0));
        let bad = plan(
            &pod(json!([c("a", json!({"requests": {"cpu": "lots"}}))])),
            &place(),
        );
        assert!(bad.is_err_and(|e| e.to_string().contains("resources.requests.cpu")));
    }
}
