//! `exitorder explain`: what exitorder will do with a pod, before it runs. Pure: a pod (or a
//! workload's template) in, an [`Explanation`] out, computed by the very functions the webhook
//! and the agent run (the mutation, priority resolution, the kubelet's stop order, Job
//! completion, the presets), so that what it says is what happens. [`explain`] takes one pod.
//!
//! Parts:
//! - [`model`]: what is said, as data (`-o json` is its serde form);
//! - `exit`: who waits for whom on deletion;
//! - `job`: how a completing pod's sidecars are ended;
//! - [`text`]: the human rendering.

mod exit;
mod job;
pub mod model;
pub mod text;

pub use model::*;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::Value;

use crate::webhook::mutate::{self, Admission, Settings};
use crate::webhook::pss::{self, Profile};

/// Every pod in a manifest's text, explained; documents without a pod (a Service, a
/// ConfigMap) are passed over, and a text with none is an error.
pub fn explain_text(text: &str, options: &Options) -> Result<Vec<Explanation>, ExplainError> {
    let docs = crate::cli::manifest::documents(text)?;
    let mut out = Vec::new();
    let mut last_err = None;
    for doc in &docs {
        match crate::cli::manifest::pod_of(doc) {
            Ok(pod) => out.push(explain(&object_name(doc), &pod, options)?),
            Err(e) => last_err = Some(e),
        }
    }
    match (out.is_empty(), last_err) {
        (true, Some(e)) => Err(e.into()),
        (true, None) => {
            Err(crate::cli::manifest::ManifestError::Yaml("no document".to_owned()).into())
        }
        _ => Ok(out),
    }
}

/// Every pod of `text` explained, as text or as a JSON array.
pub fn report(text: &str, options: &Options, json: bool) -> Result<Report, ExplainError> {
    let all = explain_text(text, options)?;
    let denied = all
        .iter()
        .any(|e| matches!(e.injection, Injection::Denied { .. }));
    let text = if json {
        let mut s = serde_json::to_string_pretty(&all).map_err(ExplainError::Json)?;
        s.push('\n');
        s
    } else {
        all.iter()
            .map(text::render)
            .collect::<Vec<_>>()
            .join("\n---\n\n")
    };
    Ok(Report { text, denied })
}

fn object_name(doc: &Value) -> String {
    let s = |p: &str| doc.pointer(p).and_then(Value::as_str).unwrap_or("");
    let (ns, name) = (s("/metadata/namespace"), s("/metadata/name"));
    let name = if name.is_empty() {
        s("/metadata/generateName")
    } else {
        name
    };
    let kind = s("/kind");
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

/// Explains one pod object.
pub fn explain(object: &str, pod: &Value, options: &Options) -> Result<Explanation, ExplainError> {
    let mut warnings = Vec::new();
    let (injection, admitted) = inject(pod, &options.settings, &mut warnings);
    let typed: Pod =
        serde_json::from_value(admitted.clone()).map_err(|source| ExplainError::NotAPod {
            object: object.to_owned(),
            source,
        })?;
    let annotations = typed.metadata.annotations.clone().unwrap_or_default();
    // By name, the first of a name (as a lookup in the spec finds it: the API server refuses
    // a second, explain reads whatever it is given).
    let mut containers: BTreeMap<&str, &Container> = BTreeMap::new();
    for c in typed.spec.iter().flat_map(crate::podspec::containers) {
        containers.entry(c.name.as_str()).or_insert(c);
    }
    let exit = exit::exit_plan(&typed, &containers, &annotations, &mut warnings);
    let grace = grace(
        &typed,
        options.settings.grace_reserve,
        &options.kubelet,
        options.kubelet_version,
        &mut warnings,
    );
    let job = job::job(&typed, &containers, &annotations, &exit, &mut warnings);
    let pod_security = PodSecurity {
        profile: pss::profile(&admitted),
        restricted_refuses: pss::restricted_violations(&admitted),
    };
    if pod_security.profile == Profile::Privileged {
        warnings.push(Warning {
            code: "pod-security",
            message: format!(
                "the pod meets no Pod Security profile but privileged: {}",
                pss::baseline_violations(&admitted).join("; ")
            ),
        });
    }
    Ok(Explanation {
        object: object.to_owned(),
        injection,
        exit,
        grace,
        job,
        pod_security,
        warnings,
    })
}

/// The webhook's answer, and the pod as the API server would store it.
fn inject(pod: &Value, settings: &Settings, warnings: &mut Vec<Warning>) -> (Injection, Value) {
    if !mutate::opted_in(&mutate::annotations_of(pod)) {
        return (Injection::NotRequested, pod.clone());
    }
    match mutate::mutate(pod, settings) {
        Admission::Deny(reason) => {
            warnings.push(Warning {
                code: "denied",
                message: format!("the webhook refuses this pod: {reason}"),
            });
            (Injection::Denied { reason }, pod.clone())
        }
        Admission::Allow { patch, warnings: w } => {
            warnings.extend(w.into_iter().map(|message| Warning {
                code: "webhook",
                message,
            }));
            let mut changes: Vec<String> = patch.0.iter().map(describe_op).collect();
            changes.dedup();
            let mut out = pod.clone();
            if let Err(e) = json_patch::patch(&mut out, &patch) {
                warnings.push(Warning {
                    code: "webhook",
                    message: format!("the webhook's patch does not apply: {e}"),
                });
            }
            let handshake = match settings.handshake_volume {
                mutate::HandshakeVolume::EmptyDir => "emptyDir",
                mutate::HandshakeVolume::HostPath => "hostPath",
            };
            (
                Injection::Injected {
                    handshake: handshake.to_owned(),
                    changes,
                },
                out,
            )
        }
    }
}

/// One patch operation as `op path`; edits inside a container's field (a preStop's argv
/// element by element) are told as one `edit` of that field.
fn describe_op(op: &json_patch::PatchOperation) -> String {
    let Ok(v) = serde_json::to_value(op) else {
        return "?".to_owned();
    };
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let (op, path) = (s("op"), s("path"));
    if op == "move" {
        return format!("move {} -> {path}", s("from"));
    }
    let parts: Vec<&str> = path.split('/').collect();
    let in_container =
        matches!(parts.get(2).copied(), Some("containers" | "initContainers")) && parts.len() > 5;
    if in_container {
        let field = parts.get(..5).unwrap_or_default().join("/");
        return format!("edit {field}");
    }
    format!("{op} {path}")
}

fn grace(
    pod: &Pod,
    reserve: Duration,
    kubelet: &crate::kubelet::grace::KubeletConfig,
    version: Option<crate::kubelet::grace::Version>,
    warnings: &mut Vec<Warning>,
) -> Grace {
    use crate::kubelet::kills::{Kill, PodKill};
    // The agent's own reading of the pod's grace and its own deadline.
    let api_grace = crate::cluster::podwatch::grace_of(pod);
    let now = std::time::Instant::now();
    let clock = crate::view::facts::Clock {
        first_seen: now,
        api_grace,
        runtime_grace: None,
        reserve,
    };
    let grace = api_grace.unwrap_or(crate::view::facts::DEFAULT_GRACE);
    let release_by = clock.deadline().saturating_duration_since(now);
    if grace <= reserve {
        warnings.push(Warning {
            code: "short-grace",
            message: format!(
                "a grace period of {} s leaves nothing after the agent's {} s reserve: waiting \
                 sidecars are held until the kubelet cuts their preStop, then drain within the \
                 2 s the kubelet gives every container after it",
                grace.as_secs(),
                reserve.as_secs()
            ),
        });
    }
    // The agent's deadline for each kill it can recognise, by the same rule it decides with
    // (`kubelet::grace::of_kill`).
    let kills = [
        PodKill::Eviction,
        PodKill::NodeShutdown,
        PodKill::ActiveDeadline,
        PodKill::Preemption,
    ]
    .into_iter()
    .map(|k| {
        let pod_grace = crate::kubelet::grace::PodGrace {
            own: api_grace,
            priority: pod.spec.as_ref().and_then(|s| s.priority),
        };
        let g =
            crate::kubelet::grace::of_kill(Some(Kill::Pod(k)), pod_grace, None, kubelet, version)
                .unwrap_or(crate::view::facts::DEFAULT_GRACE);
        let clock = crate::view::facts::Clock {
            api_grace: Some(g),
            ..clock
        };
        KillGrace {
            kill: Kill::Pod(k).to_string(),
            grace_period_seconds: g.as_secs(),
            release_by_seconds: clock.deadline().saturating_duration_since(now).as_secs(),
        }
    })
    .collect();
    Grace {
        grace_period_seconds: grace.as_secs(),
        reserve_seconds: reserve.as_secs(),
        release_by_seconds: release_by.as_secs(),
        kills,
    }
}

#[cfg(test)]
mod tests;
