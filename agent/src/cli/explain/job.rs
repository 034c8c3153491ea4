//! How a completing pod's sidecars are ended once its work is done, as the agent's Job
//! shutdown does it, and the preset endpoints the pod has not turned on.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{ExitPlan, How, Job, Member, Shutdown, ShutdownStep, Warning};
use crate::decide::restart::Restart;
use crate::jobs::completion::{self, Participation};
use crate::presets::{self, Enabler};

/// The Job shutdown of `pod`, whose containers by name are `containers`.
pub(super) fn job(
    pod: &Pod,
    containers: &BTreeMap<&str, &Container>,
    annotations: &BTreeMap<String, String>,
    exit: &ExitPlan,
    warnings: &mut Vec<Warning>,
) -> Job {
    let restart_policy = pod.spec.as_ref().and_then(|s| s.restart_policy.clone());
    let participation = completion::completes(restart_policy.as_deref(), annotations);
    let shutdown = match participation {
        Participation::Off => Shutdown::Off,
        Participation::OptedOut(_) => Shutdown::OptedOut,
        Participation::On(_) => Shutdown::On,
    };
    let mut job = Job {
        shutdown,
        restart_policy: restart_policy.clone(),
        steps: Vec::new(),
    };
    if !matches!(participation, Participation::On(_)) {
        return job;
    }
    if !exit.ordered {
        // Malformed priorities: the agent leaves the pod's sidecars as they are.
        job.shutdown = Shutdown::Off;
        return job;
    }
    // As the agent: a restart rule it cannot read leaves every sidecar running, and with no
    // main container there is no work whose end it waits for. Every container, in the
    // pod's order, as the agent reads them.
    let unreadable: Vec<String> = pod
        .spec
        .iter()
        .flat_map(crate::podspec::containers)
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
    let mut sidecars: Vec<&Member> = exit.members.iter().filter(|m| m.priority > 0).collect();
    sidecars.sort_by_key(|m| (m.native, m.priority));
    for m in sidecars {
        let c = containers.get(m.name.as_str()).copied();
        let restart = c.map(|c| Restart::of(restart_policy.as_deref(), c));
        let how = if m.native {
            How::Kubelet
        } else if matches!(&restart, Some(Ok(r)) if completion::shutdown_restarts_all(r)) {
            How::LeftRunning
        } else if let Some(url) = urls.get(&m.name) {
            How::Post(url.clone())
        } else {
            How::Stop
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
    how: &How,
    urls: &BTreeMap<String, String>,
) -> Option<Warning> {
    let preset = presets::of(&c.name, c.image.as_deref())?;
    let endpoint = preset.shutdown?;
    let own_url = urls.get(&c.name).is_some_and(|u| u != endpoint.url);
    let used = match how {
        How::Stop => true,
        How::Post(url) => url == endpoint.url,
        How::LeftRunning | How::Kubelet => false,
    };
    if !used || own_url {
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
            if *how == How::Stop {
                "it is stopped through the runtime when the Job's work is done".to_owned()
            } else {
                format!("the agent tries it ({how}), then stops it through the runtime")
            }
        ),
    })
}
