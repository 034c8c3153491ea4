//! A container's preStop hook, run the way `kuberuntime_container.go` `executePreStopHook`
//! runs it, for a pod's kill and a single container's alike:
//! - the hook runs on its own (a goroutine upstream, a task here) and the kill waits for it
//!   at most the grace period: `select { case <-time.After(gracePeriod): ... case <-done: }`.
//!   At that limit the kubelet only stops waiting: an exec hook is run with no timeout
//!   (`RunInContainer(ctx, id, cmd, 0)`), so it runs on until its container stops;
//! - a hook that failed before the limit records the Warning `FailedPreStopHook`;
//! - the whole seconds it took come off the grace period (`int64(metav1.Now().Sub(start.Time).Seconds())`).
//!
//! A kill that is cancelled (the pod worker's context: a shortened grace period) cancels the
//! hook's call too: [`Hook`] aborts it when dropped before [`Hook::detach`]. Whether the exec
//! itself ends then is the runtime's doing (the test bed's is the real containerd); the
//! entrypoint holds either way (a run that outlives its call leaves a later run's request
//! alone).

use std::time::Duration;

use tokio::task::JoinHandle;

use super::actions::{self, Target};
use super::api::{self, reasons, EventType};
use super::plan::Handler;
use super::{config, PodCtx, What};

/// A preStop hook as it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRecord {
    pub handler: String,
    pub started_ns: i64,
    /// When the kubelet stopped waiting for it: it returned, or the grace period ended.
    pub returned_ns: i64,
    pub ok: bool,
    /// What it printed, or why it failed.
    pub detail: String,
}

impl HookRecord {
    pub fn took(&self) -> Duration {
        Duration::from_nanos(u64::try_from(self.returned_ns - self.started_ns).unwrap_or(0))
    }
}

/// A hook still running after the kill stopped waiting for it: aborted if dropped, left to
/// run once [`Hook::detach`]ed.
pub(super) struct Hook(Option<JoinHandle<Result<String, String>>>);

impl Hook {
    /// The kill went on to its end: the hook runs on until its container stops.
    pub(super) fn detach(mut self) {
        self.0.take();
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

/// The program a failing preStop exec asks for (see [`super::DeleteOptions::exec_fails`]): no
/// image has it.
const MISSING_HOOK: &str = "/.exitorder-test-bed/no-such-hook";

/// The hook `h` of container `name` as the runtime plays it in this pod's kill: started late
/// (this returns after the lag), failing to start, or failing at once.
pub(super) async fn as_played(ctx: &PodCtx, name: &str, h: &Handler) -> Handler {
    let (lag, fails, exits) = ctx
        .execs
        .lock()
        .map(|e| {
            (
                e.lag.iter().find(|(n, _)| n == name).map(|(_, d)| *d),
                e.fails.iter().any(|n| n == name),
                e.exits.iter().find(|(n, _)| n == name).map(|(_, c)| *c),
            )
        })
        .unwrap_or_default();
    if let Some(lag) = lag {
        tokio::time::sleep(lag).await;
    }
    match (h, exits) {
        // The runtime is asked to exec a program that is not there: the exec fails to start,
        // as the hook's would.
        (Handler::Exec(_), _) if fails => Handler::Exec(vec![MISSING_HOOK.to_owned()]),
        // A program that starts and fails at once, before anything the hook would do.
        (Handler::Exec(_), Some(code)) => Handler::Exec(vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            format!("exit {code}"),
        ]),
        _ => h.clone(),
    }
}

/// Runs `h` in container `name` (`id`) with `grace` seconds to go, with its Event when
/// `events`; the record, the seconds it took, and the hook if it still runs.
pub(super) async fn run(
    ctx: &PodCtx,
    name: &str,
    id: &str,
    h: &Handler,
    grace: i64,
    events: bool,
) -> (HookRecord, i64, Hook) {
    let handler = config::describe(h);
    let started_ns = super::now_ns();
    ctx.record_at(
        started_ns,
        Some(name),
        What::PreStopStarted {
            handler: handler.clone(),
        },
    );
    let t0 = std::time::Instant::now();
    let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
    // Only the kubelet's own waiting is bounded for an exec hook; other handlers run in the
    // kubelet and end with its wait.
    let timeout = match h {
        Handler::Exec(_) => None,
        _ => Some(limit),
    };
    let (client, id_owned, ip, handler_owned) = (
        ctx.node.client(),
        id.to_owned(),
        ctx.plan.host_ip.clone(),
        h.clone(),
    );
    let mut task = tokio::spawn(async move {
        let target = Target {
            client,
            container_id: &id_owned,
            pod_ip: &ip,
        };
        actions::run(&handler_owned, &target, timeout).await
    });
    let res = match tokio::time::timeout(limit, &mut task).await {
        Ok(Ok(res)) => Some(res),
        Ok(Err(e)) => Some(Err(format!("the hook's task: {e}"))),
        Err(_) => None,
    };
    let returned_ns = super::now_ns();
    let (ok, detail, still) = match res {
        Some(Ok(d)) => (true, d, Hook(None)),
        Some(Err(e)) => {
            if events {
                // executePreStopHook: a hook that failed (not one the grace period cut off,
                // which the kubelet only logs).
                ctx.report_event(
                    Some(name),
                    reasons::FAILED_PRE_STOP_HOOK,
                    EventType::Warning,
                    api::PRE_STOP_FAILED.to_owned(),
                );
            }
            (false, e, Hook(None))
        }
        None => (
            false,
            format!(
                "not done within the grace period ({grace} s): still running, no longer waited for"
            ),
            Hook(Some(task)),
        ),
    };
    ctx.record_at(
        returned_ns,
        Some(name),
        What::PreStopEnded {
            ok,
            detail: detail.clone(),
        },
    );
    let took = i64::try_from(t0.elapsed().as_secs()).unwrap_or(0);
    (
        HookRecord {
            handler,
            started_ns,
            returned_ns,
            ok,
            detail,
        },
        took,
        still,
    )
}
