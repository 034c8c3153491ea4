//! One sidecar of a finished Job shut down, and the runtime's word on a container's exit.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::records::append;
use crate::decide::bounds::Later as _;
use crate::decide::RunState;
use crate::pod::PodUid;
use crate::runtime::{ExitStatus, Runtime};
use crate::stats::Stats;

/// How long a sidecar's HTTP shutdown may take.
const HTTP_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an announced exit may take to show in the runtime's container status.
const EXIT_CODE_WAIT: Duration = Duration::from_secs(5);
/// How long a sidecar created but not started yet is waited for before its HTTP shutdown.
const START_WAIT: Duration = Duration::from_secs(10);

/// The exit code of a container whose exit the runtime has announced. containerd's CRI
/// status says "exited" a little after its exit event: asked again for a short while, but
/// not for a container the runtime no longer has, whose status never comes (one task serves
/// every Job of the node: pods removed as soon as they finish must not hold it up).
pub(super) async fn exit_code(
    runtime: &Runtime,
    id: &str,
) -> Result<ExitStatus, crate::runtime::RuntimeError> {
    let deadline = tokio::time::Instant::now().later(EXIT_CODE_WAIT);
    loop {
        match runtime.exit_status(id).await? {
            ExitStatus::NotYet if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            status => return Ok(status),
        }
    }
}

/// Whether the container exits (or is gone) within `limit` (its status read a few times a
/// second).
async fn exited_within(runtime: &Runtime, id: &str, limit: Duration) -> bool {
    // `limit` is the pod's grace period: any int64 the pod set, bounded only here.
    let deadline = tokio::time::Instant::now().later(limit);
    loop {
        if matches!(
            runtime.exit_status(id).await,
            Ok(ExitStatus::Exited(_) | ExitStatus::Gone)
        ) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Returns once the container is past created (or after `limit`, or when its status cannot
/// be read). An exec reaches no process in a container not started yet, and the kubelet starts
/// one right after creating it: in a pod restarted in place, a quick app can finish while its
/// proxy's next attempt is only created, and that proxy is asked to leave a moment later.
async fn started_within(runtime: &Runtime, id: &str, limit: Duration) {
    let deadline = tokio::time::Instant::now().later(limit);
    loop {
        match runtime.describe(id).await {
            Ok(Some(d)) if d.info.state == RunState::Created => {}
            _ => return,
        }
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) fn how(urls: &BTreeMap<String, String>, name: &str) -> String {
    match urls.get(name) {
        Some(url) => format!("HTTP shutdown {url}"),
        None => "StopContainer".to_owned(),
    }
}

/// One sidecar to shut down.
pub(super) struct Shutdown {
    pub(super) runtime: Runtime,
    pub(super) dir: PathBuf,
    pub(super) pod: PodUid,
    pub(super) name: String,
    pub(super) id: String,
    pub(super) url: Option<String>,
    pub(super) grace: Duration,
}

/// One sidecar's shutdown: its HTTP endpoint through the entrypoint in the sidecar (distroless
/// images have no client of their own), else, or when that fails, the runtime's stop. Recorded
/// once it took effect: an agent that stops before that leaves it to its successor.
pub(super) async fn shut_down(s: Shutdown, stats: Arc<Stats>) {
    let (pod, name) = (&s.pod, &s.name);
    let done = format!("shutdown {}", s.id);
    if let Some(url) = &s.url {
        started_within(&s.runtime, &s.id, START_WAIT).await;
        let cmd = vec![
            exitorder_contract::mount::ENTRYPOINT.to_owned(),
            "shutdown".to_owned(),
            "--post".to_owned(),
            url.clone(),
            "--timeout".to_owned(),
            format!(
                "{}s",
                HTTP_SHUTDOWN_TIMEOUT.as_secs().saturating_sub(2).max(1)
            ),
        ];
        let res = s.runtime.exec_sync(&s.id, cmd, HTTP_SHUTDOWN_TIMEOUT).await;
        // A sidecar that exits on the request can take the entrypoint with it (the kernel
        // kills what is left in its PID namespace) before it reports success.
        let took = match &res {
            Ok((0, _)) => true,
            // Its status says "exited" a little after the exit itself.
            _ => matches!(
                exit_code(&s.runtime, &s.id).await,
                Ok(ExitStatus::Exited(_) | ExitStatus::Gone)
            ),
        };
        if took {
            append(&s.dir, pod, &done, &stats);
            info!(event = "job_shutdown", pod = %pod, container = %name, how = "http", url = %url, "sidecar asked to shut down: the Job's main containers have finished");
            // One that answers and runs on would keep the Job from ever completing: it gets
            // the pod's grace period to exit, then the runtime stops it.
            if exited_within(&s.runtime, &s.id, s.grace).await {
                return;
            }
            warn!(event = "job_shutdown_ignored", pod = %pod, container = %name, url = %url, grace_seconds = s.grace.as_secs(), "the sidecar answered its shutdown but still runs after the grace period; stopping it through the runtime");
        } else {
            match res {
                Ok((code, out)) => {
                    warn!(pod = %pod, container = %name, url = %url, exit_code = code, output = %out, "HTTP shutdown failed; stopping the sidecar through the runtime");
                }
                Err(e) => {
                    stats.runtime_error(e.kind());
                    warn!(pod = %pod, container = %name, url = %url, error = %e, "HTTP shutdown could not run; stopping the sidecar through the runtime");
                }
            }
        }
    }
    // Recorded first: StopContainer returns only once the sidecar has stopped, and the
    // runtime finishes a stop it accepted whether or not the agent is still there.
    append(&s.dir, pod, &done, &stats);
    info!(event = "job_shutdown", pod = %pod, container = %name, how = "stop", grace_seconds = s.grace.as_secs(), "stopping the sidecar: the Job's main containers have finished");
    if let Err(e) = s.runtime.stop_container(&s.id, s.grace).await {
        stats.runtime_error(e.kind());
        warn!(pod = %pod, container = %name, error = %e, "cannot stop the sidecar");
    }
}
