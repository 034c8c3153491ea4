//! One container resolved as the kubelet resolves it: env in declaration order with `$(VAR)`
//! expansion and fieldRefs, command and args expanded, mounts with subPath(Expr), handlers,
//! probes and security.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Probe as K8sProbe};

use super::actions::{lifecycle_handler, probe};
use super::security::security;
use super::{ContainerPlan, Handler, Kind, MountPlan, PlanError, Planner, Probe, Volume};

impl<E: Fn(&str, String) -> PlanError> Planner<'_, E> {
    pub(super) fn container(
        &self,
        c: Container,
        kind: Kind,
        field: &str,
        pod: &PodBase<'_>,
        volumes: &BTreeMap<String, Volume>,
    ) -> Result<ContainerPlan, PlanError> {
        let err = self.err;
        let f = |sub: &str| format!("{field}.{sub}");
        exitorder::handshake::share::ContainerName::parse(&c.name)
            .map_err(|e| err(&f("name"), e.to_string()))?;
        let image = c
            .image
            .clone()
            .filter(|i| !i.is_empty())
            .ok_or_else(|| err(&f("image"), "a container needs an image".into()))?;

        // Env in declaration order; each value may refer to the ones before it.
        let mut env: Vec<(String, String)> = Vec::new();
        let mut known: HashMap<String, String> = HashMap::new();
        for (i, e) in c.env.clone().unwrap_or_default().into_iter().enumerate() {
            let value = match (&e.value, &e.value_from) {
                (_, Some(from)) => {
                    let fr = from.field_ref.as_ref().ok_or_else(|| {
                        err(
                            &f(&format!("env[{i}].valueFrom")),
                            "only fieldRef is supported".into(),
                        )
                    })?;
                    pod.field(&fr.field_path).ok_or_else(|| {
                        err(
                            &f(&format!("env[{i}].valueFrom.fieldRef.fieldPath")),
                            format!("{:?} is not a supported field (metadata.name, metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'], spec.nodeName, spec.serviceAccountName, status.hostIP, status.podIP)", fr.field_path),
                        )
                    })?
                }
                (Some(v), None) => expand(v, &known),
                (None, None) => String::new(),
            };
            known.insert(e.name.clone(), value.clone());
            match env.iter_mut().find(|(k, _)| *k == e.name) {
                Some(slot) => slot.1 = value,
                None => env.push((e.name, value)),
            }
        }
        let command: Vec<String> = c
            .command
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|s| expand(s, &known))
            .collect();
        let args: Vec<String> = c
            .args
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|s| expand(s, &known))
            .collect();

        let mut mounts = Vec::new();
        for (i, m) in c
            .volume_mounts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let mf = f(&format!("volumeMounts[{i}]"));
            if !volumes.contains_key(&m.name) {
                return Err(err(
                    &format!("{mf}.name"),
                    format!("no volume named {:?}", m.name),
                ));
            }
            if !m.mount_path.starts_with('/') {
                return Err(err(&format!("{mf}.mountPath"), "must be absolute".into()));
            }
            let sub_path = match (m.sub_path.as_deref(), m.sub_path_expr.as_deref()) {
                (Some(s), Some(_)) if !s.is_empty() => {
                    return Err(err(
                        &mf,
                        "subPath and subPathExpr are mutually exclusive".into(),
                    ))
                }
                (_, Some(expr)) if !expr.is_empty() => Some((expand(expr, &known), "subPathExpr")),
                (Some(s), _) if !s.is_empty() => Some((s.to_owned(), "subPath")),
                _ => None,
            };
            let sub_path = match sub_path {
                Some((p, which)) => {
                    if p.starts_with('/') || p.split('/').any(|seg| seg == "..") {
                        return Err(err(
                            &format!("{mf}.{which}"),
                            format!("{p:?} must be a relative path without '..'"),
                        ));
                    }
                    Some(p)
                }
                None => None,
            };
            let propagation = match m.mount_propagation.as_deref() {
                None | Some("None") => None,
                Some(p @ ("HostToContainer" | "Bidirectional")) => Some(p.to_owned()),
                Some(other) => {
                    return Err(err(
                        &format!("{mf}.mountPropagation"),
                        format!("{other:?}: None, HostToContainer or Bidirectional"),
                    ))
                }
            };
            mounts.push(MountPlan {
                volume: m.name,
                container_path: m.mount_path,
                sub_path,
                read_only: m.read_only.unwrap_or(false),
                propagation,
            });
        }

        let ports: Vec<(Option<String>, i32)> = c
            .ports
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.name, p.container_port))
            .collect();
        let ports_json = c
            .ports
            .as_ref()
            .filter(|p| !p.is_empty())
            .and_then(|p| serde_json::to_string(p).ok());
        let handler = |h: &LifecycleHandler, hf: &str| -> Result<Handler, PlanError> {
            lifecycle_handler(h, hf, &ports, err)
        };
        let lifecycle = c.lifecycle.clone().unwrap_or_default();
        let post_start = lifecycle
            .post_start
            .as_ref()
            .map(|h| handler(h, &f("lifecycle.postStart")))
            .transpose()?;
        let pre_stop = lifecycle
            .pre_stop
            .as_ref()
            .map(|h| handler(h, &f("lifecycle.preStop")))
            .transpose()?;
        let probe = |p: &Option<K8sProbe>, name: &str| -> Result<Option<Probe>, PlanError> {
            p.as_ref()
                .map(|p| probe(p, &f(name), &ports, err))
                .transpose()
        };
        let liveness = probe(&c.liveness_probe, "livenessProbe")?;
        let readiness = probe(&c.readiness_probe, "readinessProbe")?;
        let startup = probe(&c.startup_probe, "startupProbe")?;
        if kind == Kind::Init && (liveness.is_some() || readiness.is_some() || startup.is_some()) {
            return Err(err(
                field,
                "init containers that run to completion take no probes".into(),
            ));
        }
        let security = security(c.security_context.as_ref(), &f("securityContext"), err)?;
        let cpu_limit_milli = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("cpu"))
            .map(|q| super::millicores(&q.0).map_err(|why| err(&f("resources.limits.cpu"), why)))
            .transpose()?;
        Ok(ContainerPlan {
            name: c.name.clone(),
            kind,
            image,
            command,
            args,
            working_dir: c.working_dir.clone().unwrap_or_default(),
            env,
            mounts,
            security,
            post_start,
            pre_stop,
            liveness,
            readiness,
            startup,
            termination_message_path: c
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".to_owned()),
            termination_message_policy: c
                .termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".to_owned()),
            ports_json,
            cpu_limit_milli,
            // A main container's is set from the pod's and its own by the caller; an init
            // container's retries follow the pod's policy alone.
            restart: super::Restarts::pod(super::RestartPolicy::Never),
            spec: c,
        })
    }
}

/// What fieldRefs read.
pub(super) struct PodBase<'a> {
    pub(super) name: &'a str,
    pub(super) namespace: &'a str,
    pub(super) uid: &'a str,
    pub(super) labels: &'a BTreeMap<String, String>,
    pub(super) annotations: &'a BTreeMap<String, String>,
    pub(super) node_name: &'a str,
    pub(super) host_ip: &'a str,
    pub(super) service_account: &'a str,
}

impl PodBase<'_> {
    fn field(&self, path: &str) -> Option<String> {
        let keyed = |prefix: &str, map: &BTreeMap<String, String>| {
            let key = path
                .strip_prefix(prefix)?
                .strip_prefix("['")?
                .strip_suffix("']")?;
            Some(map.get(key).cloned().unwrap_or_default())
        };
        Some(match path {
            "metadata.name" => self.name.to_owned(),
            "metadata.namespace" => self.namespace.to_owned(),
            "metadata.uid" => self.uid.to_owned(),
            "spec.nodeName" => self.node_name.to_owned(),
            "spec.serviceAccountName" => self.service_account.to_owned(),
            // Host-network pods have the node's address.
            "status.hostIP" | "status.podIP" | "status.hostIPs" | "status.podIPs" => {
                self.host_ip.to_owned()
            }
            _ => {
                return keyed("metadata.labels", self.labels)
                    .or_else(|| keyed("metadata.annotations", self.annotations))
            }
        })
    }
}

/// The kubelet's `$(VAR)` expansion: known variables are replaced, `$$` is a literal `$`,
/// anything else is left as written.
pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match vars.get(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}
