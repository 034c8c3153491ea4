//! The kubelet's in-place restart of a whole pod (KEP-5532, `RestartAllContainers`), as
//! Kubernetes 1.35 and 1.36 document it: once a container's exit matches such a rule, every
//! running container is killed at once (no ordering, no preStop hook, no grace period), every
//! init and regular container is removed from the runtime, and the pod starts again from its
//! first init container in the same sandbox, with the same volumes, each container's attempt
//! counted on. Restarts of a pod that keeps asking for them are spaced by the crash-loop
//! back-off, as the kubelet spaces them.

use exitorder::cri::RemoveContainerRequest;

use super::container::{backoff, request};
use super::termination::{kill_all, pod_containers, Stop};
use super::{Phase, PodCtx, What};

const SETUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Kills and removes every container of the pod; the caller starts it again.
pub(super) async fn restart_all(ctx: &PodCtx) {
    ctx.set_phase(Phase::Pending);
    kill_all(ctx, Stop::Immediate).await;
    let mut client = ctx.node.client();
    let listed = pod_containers(ctx).await;
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
