//! `exitorder explain`: what exitorder will do with a pod, before it runs. Pure: a pod (or a
//! workload's template) in, an [`Explanation`] out, computed by the very functions the webhook
//! and the agent run (the mutation, priority resolution, the kubelet's stop order, Job
//! completion, the presets), so that what it says is what happens.
//!
//! - [`explain`]: one pod;
//! - [`text`]: the human rendering (`-o json` is the serde form).

pub mod text;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;
use serde_json::Value;

use crate::decide::priority::{self, Source};
use crate::decide::restart::Restart;
use crate::decide::stoporder::StopOrder;
use crate::jobs::completion::{self, Participation};
use crate::presets::{self, Enabler};
use crate::webhook::mutate::{self, Admission, Settings};
use crate::webhook::pss::{self, Profile};

/// Everything said about one pod.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `Kind namespace/name` of the object read.
    pub object: String,
    pub injection: Injection,
    pub exit: ExitPlan,
    pub grace: Grace,
    pub job: Job,
    pub pod_security: PodSecurity,
    pub warnings: Vec<Warning>,
}

/// What the webhook does with the pod.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Injection {
    /// The pod does not ask for it (`exitorder.io/inject: "true"`).
    NotRequested,
    /// Admitted with these changes (JSONPatch operations, `op path`).
    Injected {
        handshake: String,
        changes: Vec<String>,
    },
    /// Refused, saying why.
    Denied { reason: String },
}

/// One container in the exit order.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    pub name: String,
    /// An init container with `restartPolicy: Always`.
    pub native: bool,
    pub priority: u8,
    pub priority_from: Source,
    /// The preset it is known by (name, or image through the webhook).
    pub preset: Option<String>,
    /// Containers whose exit it waits for when the pod is deleted.
    pub waits_for: Vec<String>,
    /// Whether its preStop waits for the agent (a sidecar's exit is ordered only then).
    pub waits_in_prestop: bool,
}

/// The order of exits when the pod is deleted.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitPlan {
    /// Whether the agent orders this pod at all (it opted in).
    pub ordered: bool,
    pub members: Vec<Member>,
    /// Native sidecars in the order the kubelet stops them, after every main container.
    pub native_stop_order: Vec<String>,
}

/// The pod's time budget on deletion.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Grace {
    pub grace_period_seconds: u64,
    pub reserve_seconds: u64,
    /// When the agent releases every waiting sidecar, order or not, after the deletion.
    pub release_by_seconds: u64,
}

/// What happens when the pod's work is done (restartPolicy Never or OnFailure).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    /// `off` (the pod never completes, or did not opt in), `opted-out`, or `on`.
    pub shutdown: String,
    pub restart_policy: Option<String>,
    /// The sidecars shut down, lowest priority first, each level after the one before exited.
    pub steps: Vec<ShutdownStep>,
}

/// How one sidecar is shut down when the work is done.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownStep {
    pub container: String,
    pub priority: u8,
    /// `POST <url>` through the entrypoint, `stop` (SIGTERM through the runtime), or
    /// `left running` (its shutdown would restart the pod), `kubelet` (a native sidecar).
    pub how: String,
}

/// The strictest Pod Security profile the pod meets, as admitted.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSecurity {
    pub profile: Profile,
    /// What `restricted` refuses.
    pub restricted_refuses: Vec<String>,
}

/// Something the user should know, with a stable code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    pub code: &'static str,
    pub message: String,
}

/// What explain assumes of the cluster: the webhook's and agent's settings.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub settings: Settings,
}

/// Why an object cannot be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error(transparent)]
    Manifest(#[from] crate::cli::manifest::ManifestError),
    #[error("cannot write JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("{object}: not a valid Pod: {source}")]
    NotAPod {
        object: String,
        source: serde_json::Error,
    },
}

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

/// What `exitorder explain` prints.
#[derive(Debug, Clone)]
pub struct Report {
    pub text: String,
    /// The webhook would refuse one of the pods.
    pub denied: bool,
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
    let exit = exit_plan(&typed, &annotations, &mut warnings);
    let grace = grace(&typed, options.settings.grace_reserve, &mut warnings);
    let job = job(&typed, &annotations, &exit, &mut warnings);
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

/// Who waits for whom: the agent's priorities on the admitted pod.
fn exit_plan(
    pod: &Pod,
    annotations: &BTreeMap<String, String>,
    warnings: &mut Vec<Warning>,
) -> ExitPlan {
    let opted_in = mutate::opted_in(annotations)
        || annotations.contains_key(priority::ANNOTATION)
        || annotations.contains_key(priority::ANNOTATION_KRUISE);
    let resolved =
        priority::from_annotations(annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(|e| e.to_string())
            .and_then(|named| mutate::members(pod, named.as_ref()));
    // As the agent: a malformed priority anywhere leaves the whole pod unordered.
    let (found, malformed) = match resolved {
        Ok(found) => (found, false),
        Err(e) => {
            if opted_in {
                warnings.push(Warning {
                    code: "bad-annotation",
                    message: format!(
                        "{e}: the agent orders nothing in this pod (every container counts as \
                         priority 0) and shuts none of its sidecars down"
                    ),
                });
            }
            (unordered(pod), true)
        }
    };
    let order = StopOrder::new(
        found
            .iter()
            .filter(|m| m.native)
            .map(|m| m.name.clone())
            .collect(),
    );
    if let Err(why) = mutate::check_stop_order(&found, &order) {
        warnings.push(Warning {
            code: "contradicting-priorities",
            message: why,
        });
    }
    let containers: Vec<&Container> = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .collect();
    let spec_of = |name: &str| containers.iter().copied().find(|c| c.name == name);
    let members: Vec<Member> = found
        .iter()
        .map(|m| {
            let c = spec_of(&m.name);
            // The agent never holds a container for one the kubelet stops only after it.
            let waits_for = found
                .iter()
                .filter(|o| o.priority < m.priority && !order.stops_after(&m.name, &o.name))
                .map(|o| o.name.clone())
                .collect();
            Member {
                name: m.name.clone(),
                native: m.native,
                priority: m.priority,
                priority_from: m.source,
                preset: presets::of(&m.name, c.and_then(|c| c.image.as_deref()))
                    .map(|p| p.name().to_owned()),
                waits_for,
                waits_in_prestop: c.is_some_and(|c| {
                    c.lifecycle
                        .as_ref()
                        .and_then(|l| l.pre_stop.as_ref())
                        .is_some_and(crate::webhook::inject::waits_for_agent)
                }),
            }
        })
        .collect();
    let ordered = opted_in && !malformed;
    if ordered {
        for m in members
            .iter()
            .filter(|m| m.priority > 0 && !m.waits_in_prestop)
        {
            warnings.push(Warning {
                code: "no-prestop",
                message: format!(
                    "sidecar {:?} (priority {}) has no preStop that waits for the agent: it \
                     gets SIGTERM with the others, unordered{}",
                    m.name,
                    m.priority,
                    if mutate::opted_in(annotations) {
                        ""
                    } else {
                        " (annotate the pod exitorder.io/inject: \"true\" for the webhook to add one)"
                    }
                ),
            });
        }
    }
    if ordered {
        shared_level(&members, warnings);
    }
    let mut native_stop_order: Vec<String> = order.native().to_vec();
    native_stop_order.reverse();
    ExitPlan {
        ordered,
        members,
        native_stop_order,
    }
}

/// Main-container sidecars that leave together with a mesh proxy: whatever they send
/// through it at their end (a log shipper's last flush) may be cut off.
fn shared_level(members: &[Member], warnings: &mut Vec<Warning>) {
    let is_mesh = |m: &Member| {
        m.preset
            .as_deref()
            .and_then(|p| presets::PRESETS.iter().find(|x| x.name() == p))
            .is_some_and(|p| p.mesh)
    };
    let main = || members.iter().filter(|m| !m.native && m.priority > 0);
    for proxy in main().filter(|m| is_mesh(m)) {
        let with: Vec<&str> = main()
            .filter(|m| m.priority == proxy.priority && !is_mesh(m))
            .map(|m| m.name.as_str())
            .collect();
        if with.is_empty() {
            continue;
        }
        let named: Vec<String> = with
            .iter()
            .map(|n| format!("{n:?}: {}", proxy.priority))
            .chain(std::iter::once(format!(
                "{:?}: {}",
                proxy.name,
                proxy.priority.saturating_add(1)
            )))
            .collect();
        warnings.push(Warning {
            code: "shared-level",
            message: format!(
                "{} exit together with the mesh proxy {:?} (priority {}): if they send through \
                 it, order them: exitorder.io/container-exit-priority: '{{{}}}'",
                with.join(", "),
                proxy.name,
                proxy.priority,
                named.join(", ")
            ),
        });
    }
}

/// The pod's containers, every one of priority 0: an unordered pod.
fn unordered(pod: &Pod) -> Vec<mutate::Member> {
    let spec = pod.spec.iter();
    let main = spec
        .clone()
        .flat_map(|s| s.containers.iter())
        .map(|c| (c, false));
    let native = spec
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| mutate::is_native(c))
        .map(|c| (c, true));
    main.chain(native)
        .map(|(c, native)| mutate::Member {
            name: c.name.clone(),
            native,
            priority: 0,
            source: Source::Default,
        })
        .collect()
}

fn grace(pod: &Pod, reserve: Duration, warnings: &mut Vec<Warning>) -> Grace {
    // The agent's own reading of the pod (a UID is all it asks more) and its own deadline.
    let mut with_uid = pod.clone();
    with_uid.metadata.uid = Some("explain".to_owned());
    let api_grace = crate::cluster::podwatch::ApiPod::from_pod(&with_uid).and_then(|a| a.grace());
    let now = std::time::Instant::now();
    let clock = crate::decide::facts::Clock {
        first_seen: now,
        api_grace,
        runtime_grace: None,
        reserve,
    };
    let grace = api_grace.unwrap_or(crate::decide::facts::DEFAULT_GRACE);
    let release_by = clock.deadline().saturating_duration_since(now);
    if release_by < Duration::from_secs(1) {
        warnings.push(Warning {
            code: "short-grace",
            message: format!(
                "a grace period of {} s leaves nothing after the agent's {} s reserve: waiting \
                 sidecars are released at once, unordered",
                grace.as_secs(),
                reserve.as_secs()
            ),
        });
    }
    Grace {
        grace_period_seconds: grace.as_secs(),
        reserve_seconds: reserve.as_secs(),
        release_by_seconds: release_by.as_secs(),
    }
}

fn job(
    pod: &Pod,
    annotations: &BTreeMap<String, String>,
    exit: &ExitPlan,
    warnings: &mut Vec<Warning>,
) -> Job {
    let restart_policy = pod.spec.as_ref().and_then(|s| s.restart_policy.clone());
    let participation = completion::completes(restart_policy.as_deref(), annotations);
    let shutdown = match participation {
        Participation::Off => "off",
        Participation::OptedOut(_) => "opted-out",
        Participation::On(_) => "on",
    };
    let mut job = Job {
        shutdown: shutdown.to_owned(),
        restart_policy: restart_policy.clone(),
        steps: Vec::new(),
    };
    if !matches!(participation, Participation::On(_)) {
        return job;
    }
    if !exit.ordered {
        // Malformed priorities: the agent leaves the pod's sidecars as they are.
        job.shutdown = "off".to_owned();
        return job;
    }
    // As the agent: a restart rule it cannot read leaves every sidecar running, and with no
    // main container there is no work whose end it waits for.
    let unreadable: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .filter_map(|c| {
            Restart::of(restart_policy.as_deref(), c)
                .err()
                .map(|e| format!("{:?}: {e}", c.name))
        })
        .collect();
    if !unreadable.is_empty() {
        warnings.push(Warning {
            code: "restart-rules-unreadable",
            message: format!(
                "the agent cannot tell whether the kubelet restarts {}; it shuts none of the \
                 sidecars down, as without exitorder",
                unreadable.join(", ")
            ),
        });
        return job;
    }
    if !exit.members.iter().any(|m| !m.native && m.priority == 0) {
        warnings.push(Warning {
            code: "no-main-container",
            message: "every container is a sidecar (priority above 0): no work ends, and the \
                      agent shuts none of them down"
                .to_owned(),
        });
        return job;
    }
    let (urls, bad) = completion::shutdown_urls(annotations);
    if let Some(bad) = bad {
        warnings.push(Warning {
            code: "bad-annotation",
            message: format!("{bad}; the sidecars are stopped through the runtime"),
        });
    }
    let spec = pod.spec.as_ref();
    let container = |name: &str| {
        spec.into_iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .find(|c| c.name == name)
    };
    let mut sidecars: Vec<&Member> = exit.members.iter().filter(|m| m.priority > 0).collect();
    sidecars.sort_by_key(|m| (m.native, m.priority));
    for m in sidecars {
        let c = container(&m.name);
        let restart = c.map(|c| Restart::of(restart_policy.as_deref(), c));
        let how = if m.native {
            "kubelet".to_owned()
        } else if matches!(&restart, Some(Ok(r)) if completion::shutdown_restarts_all(r)) {
            "left running".to_owned()
        } else if let Some(url) = urls.get(&m.name) {
            format!("POST {url}")
        } else {
            "stop".to_owned()
        };
        if let Some(w) = c.and_then(|c| disabled_endpoint(c, annotations, &how, &urls)) {
            warnings.push(w);
        }
        job.steps.push(ShutdownStep {
            container: m.name.clone(),
            priority: m.priority,
            how,
        });
    }
    job
}

/// A preset's shutdown endpoint the pod has not turned on.
/// Said only where the agent would use it: not for a native sidecar, one left running, or one
/// with a URL of the pod's own.
fn disabled_endpoint(
    c: &Container,
    annotations: &BTreeMap<String, String>,
    how: &str,
    urls: &BTreeMap<String, String>,
) -> Option<Warning> {
    let preset = presets::of(&c.name, c.image.as_deref())?;
    let endpoint = preset.shutdown?;
    let own_url = urls.get(&c.name).is_some_and(|u| u != endpoint.url);
    if !(how == "stop" || how == format!("POST {}", endpoint.url)) || own_url {
        return None;
    }
    let enable = match endpoint.enabled_by? {
        Enabler::Annotation { key, value } => format!("annotate the pod {key}: {value:?}"),
        Enabler::Arg(flag) => format!("run it with {flag}"),
    };
    let off = !endpoint.served(annotations, Some(&crate::webhook::presets::args_of(c)));
    let who = if c.name == preset.name() {
        format!("{:?}", c.name)
    } else {
        format!("{:?} ({})", c.name, preset.name())
    };
    off.then(|| Warning {
        code: "shutdown-disabled",
        message: format!(
            "{who} serves {} only when enabled, and it is not here: {}; {enable} for a clean \
             exit",
            endpoint.url,
            if how == "stop" {
                "it is stopped through the runtime when the Job's work is done".to_owned()
            } else {
                format!("the agent tries it ({how}), then stops it through the runtime")
            }
        ),
    })
}

#[cfg(test)]
mod tests;
