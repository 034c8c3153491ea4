//! The kubelet's in-place restart of a whole pod (KEP-5532, `RestartAllContainers`), as
//! Kubernetes 1.35 and 1.36 document it: once a container's exit matches such a rule, every
//! running container is killed at once (no ordering, no preStop hook, no grace period), every
//! init and regular container is removed from the runtime, and the pod starts again from its
//! first init container in the same sandbox, with the same volumes, each container's attempt
//! counted on. Restarts of a pod that keeps asking for them are spaced by the crash-loop
//! back-off, as the kubelet spaces them.

use exitorder::cri::RemoveContainerRequest;

use super::container::{backoff, request};
use super::termination::{kill_all, pod_containers, Stop, SETUP_TIMEOUT};
use super::{Phase, PodCtx, What};

/// Kills and removes every container of the pod; the caller starts it again.
pub(super) async fn restart_all(ctx: &PodCtx) {
    ctx.set_phase(Phase::Pending);
    kill_all(ctx, Stop::Immediate).await;
    let mut client = ctx.node.client();
    // A runtime that does not answer is asked again, as the kubelet's next sync would, for
    // as long as a CRI call may take; then the pod starts again over what is left.
    let deadline = tokio::time::Instant::now() + SETUP_TIMEOUT;
    let listed = loop {
        match pod_containers(ctx).await {
            Ok(listed) => break listed,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e.message(), "ListContainers failed; asking again");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => {
                ctx.record(
                    None,
                    What::Error {
                        detail: format!("ListContainers: {}", e.message()),
                    },
                );
                break Vec::new();
            }
        }
    };
    for c in listed {
        if let Err(e) = client
            .remove_container(request(
                RemoveContainerRequest {
                    container_id: c.id.clone(),
                },
                SETUP_TIMEOUT,
            ))
            .await
        {
            let name = c.metadata.map(|m| m.name).unwrap_or_default();
            ctx.record(
                Some(&name),
                What::Error {
                    detail: format!("RemoveContainer: {}", e.message()),
                },
            );
        }
    }
    let n = ctx.update_with(|s| {
        s.restarts_all = s.restarts_all.saturating_add(1);
        for c in s.containers.values_mut() {
            c.running = false;
            c.started = false;
            c.ready = false;
            c.finished = false;
        }
        s.restarting_all = None;
        s.restarts_all
    });
    ctx.record(None, What::AllContainersRemoved);
    tokio::time::sleep(backoff(n.saturating_sub(1), ctx.crash_backoff)).await;
}
