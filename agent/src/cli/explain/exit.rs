//! Who waits for whom when the pod is deleted: the agent's priorities and the kubelet's stop
//! order on the admitted pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{EndpointsWait, ExitPlan, Member, Warning};
use crate::decide::endpoints;
use crate::decide::priority::{self, Source};
use crate::presets;
use crate::webhook::mutate;

/// Who waits for whom: the agent's priorities on the admitted pod.
pub(super) fn exit_plan(
    pod: &Pod,
    containers: &BTreeMap<&str, &Container>,
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
    let order = mutate::stop_order(&found);
    if let Err(why) = mutate::check_stop_order(&found, &order) {
        warnings.push(Warning {
            code: "contradicting-priorities",
            message: why,
        });
    }
    let members: Vec<Member> = found
        .iter()
        .map(|m| {
            let c = containers.get(m.name.as_str()).copied();
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
                // The agent reads the kubelet's record of the same handler, as its JSON.
                marks_when_stopped: c
                    .and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref())
                    .and_then(|h| serde_json::to_string(h).ok())
                    .is_some_and(|h| crate::kubelet::evidence::prestop_marks(&h)),
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
    let restart_evidence = restart_evidence(&members, ordered, warnings);
    let endpoints = endpoints_wait(&members, annotations, warnings);
    ExitPlan {
        ordered,
        members,
        native_stop_order,
        restart_evidence,
        endpoints,
    }
}

/// The apps' wait for the pod's endpoints, as the agent reads the pod's annotations.
fn endpoints_wait(
    members: &[Member],
    annotations: &BTreeMap<String, String>,
    warnings: &mut Vec<Warning>,
) -> Option<EndpointsWait> {
    let policy = match endpoints::policy(|name| annotations.get(name).map(String::as_str)) {
        Ok(p) => p?,
        Err(e) => {
            warnings.push(Warning {
                code: "bad-endpoints-annotation",
                message: format!("{e}: the webhook refuses the pod"),
            });
            return None;
        }
    };
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    Some(EndpointsWait {
        apps: members
            .iter()
            .filter(|m| m.priority == 0)
            .map(|m| m.name.clone())
            .collect(),
        settle_ms: ms(policy.settle),
        max_wait_ms: ms(policy.max_wait),
    })
}

/// What tells a waiting sidecar's restart from the pod's kill (see `kubelet::evidence`): the
/// marks of every container it waits for, or, where one does not mark, only the kubelet's
/// Event (said as a warning: without it the restart is held to the deadline).
fn restart_evidence(
    members: &[Member],
    ordered: bool,
    warnings: &mut Vec<Warning>,
) -> Option<&'static str> {
    let waiting: Vec<&Member> = members
        .iter()
        .filter(|m| ordered && m.waits_in_prestop && !m.waits_for.is_empty())
        .collect();
    if waiting.is_empty() {
        return None;
    }
    let silent: Vec<&str> = members
        .iter()
        .filter(|m| !m.marks_when_stopped)
        .filter(|m| waiting.iter().any(|w| w.waits_for.contains(&m.name)))
        .map(|m| m.name.as_str())
        .collect();
    if silent.is_empty() {
        return Some("others_silent");
    }
    warnings.push(Warning {
        code: "restart-needs-event",
        message: format!(
            "{} {} not say when the kubelet stops {}: a restart of a sidecar waiting for {} \
             (a failed probe, a changed spec) is told from the pod's kill only by the kubelet's \
             Event, and held to the deadline when that is lost; give {} the preStop \
             `exitorder-entrypoint mark` (the webhook does; from the node's bin directory, \
             `exitorder-entrypoint-v2 mark`)",
            silent.join(", "),
            if silent.len() == 1 { "does" } else { "do" },
            if silent.len() == 1 { "it" } else { "them" },
            if silent.len() == 1 { "it" } else { "them" },
            if silent.len() == 1 { "it" } else { "them" },
        ),
    });
    Some("kubelet_event")
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
    pod.spec
        .iter()
        .flat_map(crate::podspec::ordered)
        .map(|(c, native)| mutate::Member {
            name: c.name.clone(),
            native,
            priority: 0,
            source: Source::Default,
        })
        .collect()
}
