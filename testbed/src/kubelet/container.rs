//! One container's life, as the kubelet runs it: create and start an attempt, run its
//! postStart hook (the pod worker waits for it before the next container), run its probes,
//! see it exit, restart it by the pod's policy with the crash-loop back-off.

use std::sync::Arc;
use std::time::Duration;

use exitorder::cri::{CreateContainerRequest, StartContainerRequest, StopContainerRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::actions::{self, Target, MAX_RUNTIME_SECONDS};
use super::api::{self, reasons, EventType};
use super::config;
use super::kills::ContainerKill;
use super::plan::{ContainerPlan, Kind, Probe};
use super::prestop;
use super::{PodCtx, RestartPolicy, Then, What};

/// The kubelet's longest crash-loop back-off.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// The kubelet gives a killed container at least this long to stop.
pub(crate) const MIN_GRACE_SECONDS: i64 = 2;
/// CRI calls that set a container up; no image is ever pulled, so they are quick.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(timeout);
    req
}

/// The back-off before restart number `n` (0-based): none for the first, then `initial`
/// doubling up to the kubelet's 5 minutes.
pub(crate) fn backoff(n: u32, initial: Duration) -> Duration {
    if n == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32.checked_shl(n - 1).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(MAX_BACKOFF)
}

enum ProbeNews {
    StartupSucceeded,
    StartupFailed(String),
    Ready(bool),
    LivenessFailed(String),
}

/// The image the pod's spec names for `name` now.
fn spec_image(ctx: &PodCtx, name: &str) -> Option<String> {
    ctx.lock().containers.get(name).map(|s| s.image.clone())
}

/// Waits until the pod's spec names another image for `c` than `c`'s.
async fn image_changed(ctx: &PodCtx, c: &ContainerPlan) {
    ctx.wait_until(|s| {
        s.containers
            .get(&c.name)
            .is_some_and(|s| s.image != c.image)
    })
    .await;
}

/// Runs `c` until the pod is deleted (`cancel`) or the container finishes for good.
pub(crate) async fn supervise(ctx: Arc<PodCtx>, c: ContainerPlan, cancel: CancellationToken) {
    let mut c = c;
    let name = c.name.clone();
    let name = name.as_str();
    // After an in-place restart of the whole pod, every container goes on from its last
    // attempt: the kubelet counts its restarts on.
    let mut attempt = ctx
        .lock()
        .containers
        .get(name)
        .filter(|s| s.id.is_some())
        .map_or(0, |s| s.attempt.saturating_add(1));
    // The pod's sync, held from this container's kill until its next attempt started, as
    // `SyncPod` kills and starts again in one sync (see `kill`).
    let mut sync: Option<tokio::sync::MutexGuard<'_, ()>> = None;
    loop {
        // The spec's image now: an in-place update started this attempt, or came while the
        // last one ended. The container hash (config) follows the spec.
        if let Some(image) = spec_image(&ctx, name).filter(|i| *i != c.image) {
            c.spec.image = Some(image.clone());
            c.image = image;
        }
        // A start in flight is let finish, never dropped: containerd goes on starting a
        // container whose call was dropped, and the deletion's listing, taken meanwhile,
        // would see it created and leave it running. The kubelet's pod worker likewise
        // runs a pod's termination only once its sync returned (pod_workers.go
        // podWorkerLoop), and SyncTerminatingPod checks that nothing runs after the kill.
        if cancel.is_cancelled() {
            return;
        }
        let created = create_and_start(&ctx, &c, attempt, sync.is_some()).await;
        // The sync that killed the last attempt ends with this one's start.
        drop(sync.take());
        let id = match created {
            Ok(id) => id,
            Err(e) => {
                ctx.record(Some(name), What::Error { detail: e.clone() });
                ctx.container(name, |s| s.finished = true);
                ctx.update(|s| {
                    s.message.get_or_insert(format!("container {name}: {e}"));
                });
                return;
            }
        };
        if cancel.is_cancelled() {
            return;
        }
        let exited = ctx.node.exits.watch(&id);
        tokio::pin!(exited);
        let (news_tx, mut news) = mpsc::unbounded_channel();
        let probes = cancel.child_token();
        let mut killing = false;
        // Killed because the spec changed: started again at once, whatever the policy.
        let mut redefined = false;
        // `shouldRestartOnFailure`: the probe kills' ", will be restarted".
        let restarts = ctx.plan.restart_policy != RestartPolicy::Never;

        if let Some(h) = &c.post_start {
            ctx.record(
                Some(name),
                What::PostStartStarted {
                    handler: config::describe(h),
                },
            );
            let target = target(&ctx, &id);
            let res = tokio::select! {
                () = cancel.cancelled() => return,
                res = actions::run(h, &target, None) => res,
            };
            ctx.record(
                Some(name),
                What::PostStartEnded {
                    ok: res.is_ok(),
                    detail: res.clone().unwrap_or_else(|e| e),
                },
            );
            if res.is_err() {
                // kuberuntime_container.go startContainer: a Warning FailedPostStartHook
                // Event, then the kill with that reason as the Killing message.
                killing = true;
                ctx.report_event(
                    Some(name),
                    reasons::FAILED_POST_START_HOOK,
                    EventType::Warning,
                    api::POST_START_FAILED.to_owned(),
                );
                let message = api::FAILED_POST_START_KILL.to_owned();
                sync = kill(
                    &ctx,
                    &c,
                    &id,
                    "postStart hook failed",
                    &message,
                    None,
                    &cancel,
                )
                .await;
            }
        }
        if !killing {
            match &c.startup {
                Some(p) => spawn_probe(
                    &ctx,
                    &c,
                    &id,
                    p.clone(),
                    ProbeKind::Startup,
                    &news_tx,
                    &probes,
                ),
                None => started(&ctx, &c, &id, &news_tx, &probes),
            }
        }
        let exit = loop {
            tokio::select! {
                () = cancel.cancelled() => {
                    probes.cancel();
                    return;
                }
                res = &mut exited => break res.ok(),
                Some(n) = news.recv() => match n {
                    ProbeNews::StartupSucceeded => {
                        ctx.record(Some(name), What::StartupDone);
                        started(&ctx, &c, &id, &news_tx, &probes);
                    }
                    ProbeNews::Ready(ready) => {
                        ctx.container(name, |s| s.ready = ready);
                        ctx.record(Some(name), if ready { What::Ready } else { What::NotReady });
                    }
                    ProbeNews::StartupFailed(detail) if !killing => {
                        killing = true;
                        probes.cancel();
                        let why = ContainerKill::Startup;
                        let message = why.message(&c, restarts);
                        sync = kill(&ctx, &c, &id, &detail, &message, why.grace(&c), &cancel).await;
                    }
                    ProbeNews::LivenessFailed(detail) if !killing => {
                        killing = true;
                        probes.cancel();
                        let why = ContainerKill::Liveness;
                        let message = why.message(&c, restarts);
                        sync = kill(&ctx, &c, &id, &detail, &message, why.grace(&c), &cancel).await;
                    }
                    ProbeNews::StartupFailed(_) | ProbeNews::LivenessFailed(_) => {}
                },
                () = image_changed(&ctx, &c), if !killing => {
                    killing = true;
                    redefined = true;
                    probes.cancel();
                    let why = ContainerKill::DefinitionChanged;
                    let message = why.message(&c, true);
                    sync = kill(&ctx, &c, &id, "its definition changed", &message, None, &cancel).await;
                }
            }
        };
        probes.cancel();
        let exit = exit.unwrap_or(super::ExitInfo {
            exit_code: -1,
            finished_at_ns: super::now_ns(),
            reason: "lost".into(),
        });
        if redefined {
            // computePodActions put it in ContainersToStart with the kill: started again in
            // the same sync, with no back-off (its back-off key holds the new spec's hash).
            ctx.exited(name, attempt, &exit, false);
            ctx.record(
                Some(name),
                What::Restarting {
                    attempt: attempt + 1,
                    after_ms: 0,
                },
            );
            attempt += 1;
            continue;
        }
        let outcome = match (c.kind, c.restart.after(exit.exit_code)) {
            (_, Then::RestartAll) => Then::RestartAll,
            (Kind::Main, outcome) => outcome,
            (Kind::Sidecar, _) => Then::Restart,
            // An init container is retried on failure unless the pod never restarts.
            (Kind::Init, _)
                if exit.exit_code != 0
                    && ctx.plan.restart_policy != super::RestartPolicy::Never =>
            {
                Then::Restart
            }
            (Kind::Init, _) => Then::Done,
        };
        ctx.exited(name, attempt, &exit, outcome == Then::Done);
        let wait = backoff(attempt, ctx.crash_backoff);
        if outcome != Then::Restart || !wait.is_zero() {
            // The sync ends here: no start follows in it (the container is done, the whole
            // pod restarts, or its back-off is for a later sync).
            drop(sync.take());
        }
        match outcome {
            Then::Done => return,
            Then::RestartAll => {
                // The pod worker takes it from here (KEP-5532): this container is not
                // restarted alone.
                ctx.record(
                    Some(name),
                    What::RestartingAll {
                        exit_code: exit.exit_code,
                    },
                );
                ctx.update(|s| s.restarting_all = Some(name.to_owned()));
                return;
            }
            Then::Restart => {}
        }
        ctx.record(
            Some(name),
            What::Restarting {
                attempt: attempt + 1,
                after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            },
        );
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
            // A new spec has a back-off of its own: none yet.
            () = image_changed(&ctx, &c) => {}
        }
        attempt += 1;
    }
}

fn target<'a>(ctx: &'a PodCtx, id: &'a str) -> Target<'a> {
    Target {
        client: ctx.node.client(),
        container_id: id,
        pod_ip: &ctx.plan.host_ip,
    }
}

/// The container has started (postStart returned, startup probe passed): liveness and
/// readiness probing begins; without a readiness probe it is ready at once.
fn started(
    ctx: &Arc<PodCtx>,
    c: &ContainerPlan,
    id: &str,
    news: &mpsc::UnboundedSender<ProbeNews>,
    probes: &CancellationToken,
) {
    ctx.container(&c.name, |s| {
        s.started = true;
        s.ready = c.readiness.is_none();
    });
    if c.readiness.is_none() {
        ctx.record(Some(&c.name), What::Ready);
    }
    if let Some(p) = &c.readiness {
        spawn_probe(ctx, c, id, p.clone(), ProbeKind::Readiness, news, probes);
    }
    if let Some(p) = &c.liveness {
        spawn_probe(ctx, c, id, p.clone(), ProbeKind::Liveness, news, probes);
    }
}

/// `synced`: the caller holds the pod's sync already (the start is the one that follows its
/// container's kill in the same sync).
async fn create_and_start(
    ctx: &PodCtx,
    c: &ContainerPlan,
    attempt: u32,
    synced: bool,
) -> Result<String, String> {
    // Not while another container's kill holds the pod's sync.
    if !synced {
        drop(ctx.sync.lock().await);
    }
    let mut client = ctx.node.client();
    let sources = ctx.mount_sources.get(&c.name).cloned().unwrap_or_default();
    let log_dir = std::path::Path::new(&ctx.sandbox_config.log_directory).join(&c.name);
    std::fs::create_dir_all(&log_dir)
        .map_err(|e| format!("log directory {}: {e}", log_dir.display()))?;
    let config = config::container(&ctx.plan, c, attempt, &sources);
    let id = client
        .create_container(request(
            CreateContainerRequest {
                pod_sandbox_id: ctx.sandbox_id.clone(),
                config: Some(config),
                sandbox_config: Some(ctx.sandbox_config.clone()),
            },
            SETUP_TIMEOUT,
        ))
        .await
        .map_err(|s| format!("CreateContainer: {}", s.message()))?
        .into_inner()
        .container_id;
    ctx.container(&c.name, |s| {
        s.attempt = attempt;
        s.id = Some(id.clone());
        s.started = false;
        s.ready = false;
    });
    ctx.record(Some(&c.name), What::Created { attempt });
    client
        .start_container(request(
            StartContainerRequest {
                container_id: id.clone(),
            },
            SETUP_TIMEOUT,
        ))
        .await
        .map_err(|s| format!("StartContainer: {}", s.message()))?;
    ctx.container(&c.name, |s| s.running = true);
    ctx.record(Some(&c.name), What::Started { attempt });
    Ok(id)
}

/// The kubelet's kill of one container outside a pod deletion (liveness or startup probe,
/// postStart failure, a changed spec): `killContainer`'s Killing Event with `message`, its
/// preStop hook, then StopContainer with what is left of the grace period. `why` is the
/// timeline's detail.
///
/// The kill is `SyncPod`'s, which no one cancels (kubelet.go runs the runtime's `SyncPod` under
/// `context.WithoutCancel`): once begun it runs to its end, and the pod's sync is held (the
/// guard returned) until the container's next attempt started in the same sync; a pod kill
/// waits for it (`pod_workers.go` queues it in `pendingUpdate` until the sync returns).
async fn kill<'a>(
    ctx: &'a PodCtx,
    c: &ContainerPlan,
    id: &str,
    why: &str,
    message: &str,
    grace: Option<i64>,
    cancel: &CancellationToken,
) -> Option<tokio::sync::MutexGuard<'a, ()>> {
    let sync = tokio::select! {
        () = cancel.cancelled() => return None,
        g = ctx.sync.lock() => g,
    };
    ctx.record(
        Some(&c.name),
        What::Killing {
            reason: why.to_owned(),
        },
    );
    // killContainer records the Event first, before the preStop hook.
    ctx.report_event(
        Some(&c.name),
        reasons::KILLING,
        EventType::Normal,
        message.to_owned(),
    );
    let mut grace = grace.unwrap_or(ctx.plan.grace_seconds);
    let mut hook = None;
    if let (Some(h), true) = (&c.pre_stop, grace > 0) {
        let (_, took, still) = prestop::run(ctx, &c.name, id, h, grace, true).await;
        grace -= took;
        hook = Some(still);
    }
    let grace = grace.max(MIN_GRACE_SECONDS);
    ctx.record(
        Some(&c.name),
        What::Term {
            grace_seconds: grace,
        },
    );
    let mut client = ctx.node.client();
    let stop = client.stop_container(request(
        StopContainerRequest {
            container_id: id.to_owned(),
            timeout: grace.min(MAX_RUNTIME_SECONDS),
        },
        Duration::from_secs(u64::try_from(grace.min(MAX_RUNTIME_SECONDS)).unwrap_or(0) + 30),
    ));
    let _ = stop.await;
    if let Some(h) = hook {
        h.detach();
    }
    Some(sync)
}

#[derive(Clone, Copy)]
enum ProbeKind {
    Startup,
    Readiness,
    Liveness,
}

impl ProbeKind {
    fn name(self) -> &'static str {
        match self {
            ProbeKind::Startup => "startup",
            ProbeKind::Readiness => "readiness",
            ProbeKind::Liveness => "liveness",
        }
    }
}

fn spawn_probe(
    ctx: &Arc<PodCtx>,
    c: &ContainerPlan,
    id: &str,
    probe: Probe,
    kind: ProbeKind,
    news: &mpsc::UnboundedSender<ProbeNews>,
    cancel: &CancellationToken,
) {
    let (ctx, name, id, news, cancel) = (
        Arc::clone(ctx),
        c.name.clone(),
        id.to_owned(),
        news.clone(),
        cancel.clone(),
    );
    let span = tracing::info_span!("testbed_probe", container = %name, probe = kind.name());
    tokio::spawn(
        async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = run_probe(&ctx, &name, &id, &probe, kind, &news) => {}
            }
        }
        .instrument(span),
    );
}

/// The kubelet's prober: after the initial delay, every period; a result counts once it
/// repeats `successThreshold` or `failureThreshold` times.
async fn run_probe(
    ctx: &PodCtx,
    name: &str,
    id: &str,
    p: &Probe,
    kind: ProbeKind,
    news: &mpsc::UnboundedSender<ProbeNews>,
) {
    let secs = |s: i64| Duration::from_secs(u64::try_from(s).unwrap_or(0));
    tokio::time::sleep(secs(p.initial_delay_seconds)).await;
    let mut tick = tokio::time::interval(secs(p.period_seconds));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut oks, mut fails) = (0u32, 0u32);
    let mut ready: Option<bool> = None;
    loop {
        tick.tick().await;
        let res = actions::run(&p.handler, &target(ctx, id), Some(secs(p.timeout_seconds))).await;
        match res {
            Ok(_) => {
                oks += 1;
                fails = 0;
            }
            Err(e) => {
                fails += 1;
                oks = 0;
                ctx.record(
                    Some(name),
                    What::ProbeFailed {
                        probe: kind.name(),
                        detail: e.clone(),
                    },
                );
                if fails >= p.failure_threshold {
                    match kind {
                        ProbeKind::Readiness => {
                            if ready != Some(false) {
                                ready = Some(false);
                                let _ = news.send(ProbeNews::Ready(false));
                            }
                        }
                        ProbeKind::Liveness => {
                            let _ = news.send(ProbeNews::LivenessFailed(format!(
                                "liveness probe failed {fails} times: {e}"
                            )));
                            return;
                        }
                        ProbeKind::Startup => {
                            let _ = news.send(ProbeNews::StartupFailed(format!(
                                "startup probe failed {fails} times: {e}"
                            )));
                            return;
                        }
                    }
                }
                continue;
            }
        }
        // Startup and liveness succeed on the first success.
        match kind {
            ProbeKind::Startup => {
                let _ = news.send(ProbeNews::StartupSucceeded);
                return;
            }
            ProbeKind::Readiness if oks >= p.success_threshold && ready != Some(true) => {
                ready = Some(true);
                let _ = news.send(ProbeNews::Ready(true));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_loop_backoff_doubles_from_the_second_restart() {
        let ten = Duration::from_secs(10);
        assert_eq!(backoff(0, ten), Duration::ZERO);
        assert_eq!(backoff(1, ten), ten);
        assert_eq!(backoff(2, ten), Duration::from_secs(20));
        assert_eq!(backoff(6, ten), MAX_BACKOFF);
        assert_eq!(backoff(40, ten), MAX_BACKOFF);
    }
}
