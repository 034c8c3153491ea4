//! A Job's pod in the demo (`restartPolicy` Never or OnFailure): it runs until its work is
//! done, its main containers finished for good and its sidecars shut down by the agent, and
//! only then is it deleted, as a Job's pod is in a cluster.

use std::time::Duration;

use anyhow::Context;
use exitorder_contract::annotation;
use k8s_openapi::api::core::v1::PodSpec;
use serde::Serialize;
use serde_json::Value;

use crate::kubelet::{Phase, RunningPod};

/// How a Job's pod ended before it was deleted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobRun {
    /// Whether it completed (phase Succeeded or Failed) within `--complete-timeout`.
    pub completed: bool,
    /// Its phase when the demo stopped waiting.
    pub phase: Phase,
}

/// Whether the pod completes rather than runs until deleted.
pub(super) fn completes(pod: &Value) -> bool {
    matches!(
        pod["spec"]["restartPolicy"].as_str(),
        Some("Never" | "OnFailure")
    )
}

/// Gives a completing pod that did not pass through the webhook the record the webhook
/// writes on one ([`annotation::RESTARTS`]): the demo's agent runs without an API server
/// and reads the pod's restart policies from it, as an agent with the API server reads the
/// spec. Whether it was added.
pub(super) fn add_restart_record(pod: &mut Value) -> anyhow::Result<bool> {
    if !completes(pod) || !pod["metadata"]["annotations"][annotation::RESTARTS].is_null() {
        return Ok(false);
    }
    let spec: PodSpec =
        serde_json::from_value(pod["spec"].clone()).context("the pod's spec cannot be read")?;
    let Some(value) = exitorder::webhook::mutate::restart_record(&spec) else {
        return Ok(false);
    };
    super::mutation::annotations_mut(pod)?.insert(annotation::RESTARTS.to_owned(), value.into());
    Ok(true)
}

/// Waits until the pod completes, at most `timeout`, and says how it ended.
pub(super) async fn run_to_completion(
    running: &RunningPod,
    timeout: Duration,
    with_agent: bool,
    out: &mut dyn FnMut(&str),
) -> JobRun {
    out(&format!(
        "restartPolicy {:?}: a Job's pod. It runs until its work is done (its main containers \
         finished for good, its sidecars shut down) before it is deleted; waiting at most {}...",
        running.plan().restart_policy,
        humantime::format_duration(timeout)
    ));
    match running.wait_completed(timeout).await {
        Ok(status) => {
            out(&format!("The pod completed: phase {}.", status.phase));
            JobRun {
                completed: true,
                phase: status.phase,
            }
        }
        Err(_) => {
            let status = running.status();
            let still: Vec<&str> = status
                .containers
                .iter()
                .filter(|(_, c)| c.running)
                .map(|(n, _)| n.as_str())
                .collect();
            out(&format!(
                "The pod did not complete within {}: {} still running{}.",
                humantime::format_duration(timeout),
                still.join(", "),
                if with_agent {
                    ""
                } else {
                    " (a sidecar never exits on its own: a meshed Job without exitorder)"
                }
            ));
            JobRun {
                completed: false,
                phase: status.phase,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_completing_pod_gets_the_webhooks_record_once() {
        let mut pod = json!({"metadata": {"name": "j"}, "spec": {"restartPolicy": "Never",
            "containers": [{"name": "worker", "image": "w", "restartPolicy": "OnFailure"},
                           {"name": "proxy", "image": "p"}]}});
        assert!(add_restart_record(&mut pod).expect("a pod"));
        let value = pod["metadata"]["annotations"][annotation::RESTARTS]
            .as_str()
            .expect("recorded");
        // The annotation's grammar (the contract): the main containers, in order.
        let record: serde_json::Value = serde_json::from_str(value).expect("JSON");
        assert_eq!(record["containers"][0]["name"], "worker");
        assert_eq!(record["containers"][1]["name"], "proxy");
        // Already there (the webhook's): left as it is.
        assert!(!add_restart_record(&mut pod).expect("a pod"));
        // A pod that never completes gets none.
        let mut pod = json!({"metadata": {}, "spec": {"containers": [{"name": "a"}]}});
        assert!(!add_restart_record(&mut pod).expect("a pod"));
        assert!(pod["metadata"]["annotations"].is_null());
    }
}
