//! The test bed's kubelet passes the kubelet's own node-conformance lifecycle tests. Every
//! claim exitorder makes about ordering is proven on the test bed, so its kubelet must stop,
//! restart and kill containers as a conformant node does: here are the termination and
//! restart scenarios of Kubernetes' `test/e2e_node/container_lifecycle_test.go` ("Containers
//! Lifecycle", `[NodeConformance]`, v1.36.2), each the same pod with the same timings and the
//! same assertions with upstream's tolerances (pod construction and assertions ported in
//! `exitorder_e2e::support::lifecycle`), run without the agent on containerd 1.6, 1.7 and
//! 2.1. Each case names its upstream test; `docs/testbed.md` lists them, and the upstream
//! behaviours the test bed does not play.
//!
//! One test per containerd, the cases of each at once on one node (as upstream runs its
//! specs in parallel on one node), and one containerd at a time: the simultaneity
//! tolerances (1 s) are upstream's, not widened for a machine running three nodes.
//!
//! Needs root and `containerd runc busybox-static`; 1.7 and 2.1 come from
//! `EXITORDER_CONTAINERD_1_7` / `EXITORDER_CONTAINERD_2_1` (`scripts/test` sets them).
//! Without them a test prints "SKIPPED: <reason>" and passes, except in CI (`CI` set),
//! where it fails.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::{Duration, Instant};

use exitorder_e2e::support::lifecycle::{
    about, container, handler, pod, probe, sidecar, started_post_start_gate, Exec, Output,
    ALTERNATE_IMAGE,
};
use exitorder_e2e::support::{self, skip_or_fail};
use exitorder_testbed::kubelet::{RunOptions, RunningPod};
use exitorder_testbed::{runtime_env_var, runtime_from_env, DeleteOptions, Node, NodeOptions};
use exitorder_testbed::{Phase, PodStatus};
use serde_json::{json, Value};

/// One containerd at a time (see the module's doc).
static ONE_RUNTIME_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn the_lifecycle_conformance_cases_pass_on_containerd_1_6() {
    conformance_on("1.6").await;
}

#[tokio::test]
async fn the_lifecycle_conformance_cases_pass_on_containerd_1_7() {
    conformance_on("1.7").await;
}

#[tokio::test]
async fn the_lifecycle_conformance_cases_pass_on_containerd_2_1() {
    conformance_on("2.1").await;
}

type CaseResult = Result<(), String>;
type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseResult> + 'a>>;

/// One upstream test: its path of `Describe`/`When`/`It` texts, and the case.
struct Case<'a> {
    upstream: &'static str,
    run: CaseFuture<'a>,
}

async fn conformance_on(version: &str) {
    let _one = ONE_RUNTIME_AT_A_TIME.lock().await;
    let mut opts = NodeOptions::default();
    if version != "1.6" {
        let Some(bin) = runtime_from_env(version) else {
            skip_or_fail(&format!(
                "containerd {version} is not here: {} is not set (scripts/test sets it)",
                runtime_env_var(version)
            ));
            return;
        };
        opts.containerd_bin = Some(bin);
    }
    let Some(node) = support::node_with_or_skip(opts).await else {
        return;
    };
    let logs: Vec<tempfile::TempDir> = (0..CASES)
        .map(|_| tempfile::tempdir().expect("a log directory"))
        .collect();
    let cases = cases(&node, &logs);
    assert_eq!(cases.len(), CASES, "one log directory per case");
    let names: Vec<&str> = cases.iter().map(|c| c.upstream).collect();
    let results = futures_util::future::join_all(cases.into_iter().map(|c| c.run)).await;
    let mut failed = Vec::new();
    for (name, result) in names.iter().zip(results) {
        match result {
            Ok(()) => eprintln!("containerd {version}: ok: {name}"),
            Err(e) => failed.push(format!("{name}:\n{e}")),
        }
    }
    let _ = node.shutdown().await;
    assert!(
        failed.is_empty(),
        "containerd {version}: {} of {} upstream cases failed:\n\n{}",
        failed.len(),
        names.len(),
        failed.join("\n\n")
    );
}

const CASES: usize = 17;

fn cases<'a>(node: &'a Node, logs: &'a [tempfile::TempDir]) -> Vec<Case<'a>> {
    let dir = |i: usize| logs[i].path();
    vec![
        Case {
            upstream: "Containers Lifecycle when Running a pod with init containers and regular \
                       containers, restartPolicy=Never when A regular container has a PreStop \
                       hook when A regular container fails a startup probe should call the \
                       container's preStop hook and terminate it if its startup probe fails",
            run: Box::pin(prestop_on_probe_failure(node, dir(0), "startupProbe")),
        },
        Case {
            upstream: "Containers Lifecycle when Running a pod with init containers and regular \
                       containers, restartPolicy=Never when A regular container has a PreStop \
                       hook when A regular container fails a liveness probe should call the \
                       container's preStop hook and terminate it if its liveness probe fails",
            run: Box::pin(prestop_on_probe_failure(node, dir(1), "livenessProbe")),
        },
        Case {
            upstream: "Containers Lifecycle when Running a pod with init containers and regular \
                       containers, restartPolicy=Never when a pod cannot terminate gracefully \
                       should respect termination grace period seconds",
            run: Box::pin(cannot_terminate_gracefully(node, dir(2), false)),
        },
        Case {
            upstream: "Containers Lifecycle when Running a pod with init containers and regular \
                       containers, restartPolicy=Never when a pod cannot terminate gracefully \
                       should respect termination grace period seconds with long-running \
                       preStop hook",
            run: Box::pin(cannot_terminate_gracefully(node, dir(3), true)),
        },
        Case {
            upstream: "Containers Lifecycle when A pod with restartable init containers is \
                       terminating when The containers exit successfully should terminate \
                       sidecars in reverse order after all main containers have exited",
            run: Box::pin(sidecars_in_reverse_order(node, dir(4))),
        },
        Case {
            upstream: "Containers Lifecycle when A pod with restartable init containers is \
                       terminating when The PreStop hooks don't exit should terminate sidecars \
                       simultaneously if prestop doesn't exit",
            run: Box::pin(sidecars_simultaneously_if_prestop_does_not_exit(
                node,
                dir(5),
            )),
        },
        Case {
            upstream: "Containers Lifecycle when A pod with restartable init containers is \
                       terminating when the restartable init containers have multiple PreStop \
                       hooks should call sidecar container PreStop hook simultaneously",
            run: Box::pin(sidecar_prestops_simultaneously(node, dir(6))),
        },
        Case {
            upstream: "Containers Lifecycle when running restartable init containers with \
                       startup probes when using a PreStop hook should call the container's \
                       preStop hook and not launch next container if the restartable init \
                       container's startup probe fails",
            run: Box::pin(sidecar_startup_probe_fails(node, dir(7))),
        },
        Case {
            upstream: "Containers Lifecycle when running restartable init containers with \
                       liveness probes should call the container's preStop hook and start the \
                       next container if the restartable init container's liveness probe fails",
            run: Box::pin(sidecar_liveness_probe_fails(node, dir(8))),
        },
        Case {
            upstream: "Containers Lifecycle when A pod with restartable init containers is \
                       terminating when Restartable init containers are terminated during \
                       initialization should not hang in termination if terminated during \
                       initialization",
            run: Box::pin(no_hang_if_terminated_during_initialization(node, dir(9))),
        },
        Case {
            upstream: "Containers Lifecycle when A pod with restartable init containers is \
                       terminating when there is a non-started restartable init container \
                       should terminate restartable init containers gracefully if there is a \
                       non-started restartable init container",
            run: Box::pin(non_started_sidecar(node, dir(10))),
        },
        Case {
            upstream: "Containers Lifecycle when A pod is running only regular containers when \
                       the regular container has its image updated should successfully restart \
                       when the image is updated, restartPolicy=Always",
            run: Box::pin(image_updated(node, dir(11), "Always")),
        },
        Case {
            upstream: "Containers Lifecycle when A pod is running only regular containers when \
                       the regular container has its image updated should successfully restart \
                       when the image is updated and restartPolicy=OnFailure",
            run: Box::pin(image_updated(node, dir(12), "OnFailure")),
        },
        Case {
            upstream: "Containers Lifecycle when A pod is running only regular containers when \
                       the regular container has its image updated should successfully restart \
                       when the image is updated and restartPolicy=Never",
            run: Box::pin(image_updated(node, dir(13), "Never")),
        },
        Case {
            upstream: "Containers Lifecycle when using a restartable init container in a Pod \
                       with restartPolicy=Never when a restartable init container runs \
                       continuously should restart when updated with a new image",
            run: Box::pin(sidecar_image_updated(node, dir(14))),
        },
        Case {
            upstream: "Containers Lifecycle when A pod with restartable init containers is \
                       terminating when The containers exit successfully should mark pod as \
                       failed if regular container has exceeded its termination grace period \
                       seconds",
            run: Box::pin(regular_exceeds_grace(node, dir(15))),
        },
        Case {
            upstream: "Containers Lifecycle when A pod with restartable init containers is \
                       terminating when The containers exit successfully should mark pod as \
                       succeeded if any of the restartable init containers have exceeded its \
                       termination grace period seconds",
            run: Box::pin(sidecar_exceeds_grace(node, dir(16))),
        },
    ]
}

// ----- helpers -----

async fn run(node: &Node, pod: &Value) -> Result<RunningPod, String> {
    node.run_pod(pod, &RunOptions::default())
        .await
        .map_err(|e| format!("the pod did not run: {e}"))
}

async fn wait(
    p: &RunningPod,
    what: &str,
    within: Duration,
    pred: impl Fn(&PodStatus) -> bool,
) -> Result<PodStatus, String> {
    p.wait_for(what, within, pred)
        .await
        .map_err(|e| e.to_string())
}

/// `WaitForPodNoLongerRunningInNamespace`: Succeeded or Failed.
async fn no_longer_running(p: &RunningPod, within: Duration) -> Result<PodStatus, String> {
    wait(p, "the pod no longer running", within, |s| {
        matches!(s.phase, Phase::Succeeded | Phase::Failed)
    })
    .await
}

/// `WaitForPodNameRunningInNamespace`, and every main container's script past its `trap`
/// (its `Started` line): a TERM before the trap is ignored by a shell that is PID 1, where
/// upstream's API round trips leave the script that time.
async fn running_and_trapping(p: &RunningPod, logs: &Path, mains: &[&str]) -> CaseResult {
    wait(p, "the pod running", Duration::from_secs(60), |s| {
        s.phase == Phase::Running
    })
    .await?;
    said_within(logs, Duration::from_secs(30), |o| {
        mains.iter().try_for_each(|m| o.starts(m))
    })
    .await
    .map(|_| ())
}

/// The output once `check` holds of it, at most `within`; else `check`'s complaint.
async fn said_within(
    logs: &Path,
    within: Duration,
    check: impl Fn(&Output) -> CaseResult,
) -> Result<Output, String> {
    let deadline = Instant::now() + within;
    loop {
        let o = Output::read(logs);
        match check(&o) {
            Ok(()) => return Ok(o),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn restarts(s: &PodStatus, name: &str) -> u32 {
    s.container(name).map_or(0, |c| c.attempt)
}

/// Upstream's `AfterEach`: every pod deleted.
async fn delete(p: RunningPod) -> CaseResult {
    p.delete_with(DeleteOptions::default())
        .await
        .map(|_| ())
        .map_err(|e| format!("deleting the pod: {e}"))
}

/// `expectPodTerminationContainerStatuses`: each named container terminated with exactly
/// this exit code and reason.
fn terminated_as(s: &PodStatus, want: &[(&str, i32, &str)]) -> CaseResult {
    for (name, code, reason) in want {
        let exit = s.container(name).and_then(|c| c.last_exit.as_ref());
        match exit {
            Some(e) if e.exit_code == *code && e.reason == *reason => {}
            other => {
                return Err(format!(
                    "{name}: expected terminated with {code}/{reason}, got {other:?}"
                ))
            }
        }
    }
    Ok(())
}

/// The six start-order checks of upstream's three-sidecar pods.
fn three_sidecars_start_in_order(o: &Output) -> CaseResult {
    for (a, b) in [
        ("restartable-init-1", "restartable-init-2"),
        ("restartable-init-1", "restartable-init-3"),
        ("restartable-init-2", "restartable-init-3"),
        ("restartable-init-1", "regular-1"),
        ("restartable-init-2", "regular-1"),
        ("restartable-init-3", "regular-1"),
    ] {
        o.starts_before(a, b)?;
    }
    Ok(())
}

/// Upstream's exit checks of its three-sidecar pods: every sidecar after `regular-1`, the
/// sidecars in reverse order.
fn three_sidecars_stop_in_reverse_after_regular(o: &Output) -> CaseResult {
    for ri in [
        "restartable-init-1",
        "restartable-init-2",
        "restartable-init-3",
    ] {
        o.exits_before("regular-1", ri)?;
    }
    o.exits_before("restartable-init-3", "restartable-init-2")?;
    o.exits_before("restartable-init-2", "restartable-init-1")
}

/// Each of the three sidecars terminated with `code`/`reason`.
fn three_sidecars_terminated_as(s: &PodStatus, code: i32, reason: &str) -> CaseResult {
    terminated_as(
        s,
        &[
            ("restartable-init-1", code, reason),
            ("restartable-init-2", code, reason),
            ("restartable-init-3", code, reason),
        ],
    )
}

/// Three sidecars `{Delay: 60, TerminationSeconds: 5}` with 1.36.2's PostStart gate, each
/// with `prestop` (an Exec for its preStop hook, or none), and `regular-1 {Delay: 5}`.
fn three_sidecars_pod(name: &str, logs: &Path, prestop: Option<Exec>) -> Value {
    let init = (1..=3)
        .map(|i| {
            let n = format!("restartable-init-{i}");
            let mut c = sidecar(
                &n,
                &Exec {
                    delay: 60,
                    termination_seconds: 5,
                    ..Exec::default()
                },
            );
            c["lifecycle"] = json!({"postStart": started_post_start_gate()});
            if let Some(p) = &prestop {
                c["lifecycle"]["preStop"] = handler("PreStop", &n, p.clone());
            }
            c
        })
        .collect();
    let regular = container(
        "regular-1",
        &Exec {
            delay: 5,
            ..Exec::default()
        },
    );
    pod(name, "Never", init, vec![regular], logs)
}

// ----- the cases -----

/// `restartPolicy: Never`; `regular-1 {Delay: 100, TerminationSeconds: 15}` whose startup
/// (or liveness) probe `exit 1` fails once after 10 s; its preStop `{Delay: 1}`.
async fn prestop_on_probe_failure(node: &Node, logs: &Path, probe_field: &str) -> CaseResult {
    let mut c = container(
        "regular-1",
        &Exec {
            delay: 100,
            termination_seconds: 15,
            ..Exec::default()
        },
    );
    let mut p = probe("exit 1");
    p["initialDelaySeconds"] = 10.into();
    p["failureThreshold"] = 1.into();
    c[probe_field] = p;
    let hook = Exec {
        delay: 1,
        ..Exec::default()
    };
    c["lifecycle"] = json!({"preStop": handler("PreStop", "regular-1", hook)});
    let running = run(node, &pod("test-pod", "Never", vec![], vec![c], logs)).await?;
    no_longer_running(&running, Duration::from_secs(120)).await?;
    let o = Output::read(logs);
    o.run_together("regular-1", "PreStop-regular-1")?;
    o.starts("PreStop-regular-1")?;
    o.exits("regular-1")?;
    delete(running).await
}

/// `sleep 10000` (TERM ignored), grace 30, optionally a preStop `sleep 10000`: deleted with
/// the pod's grace, it is gone within twice the grace.
async fn cannot_terminate_gracefully(node: &Node, logs: &Path, long_prestop: bool) -> CaseResult {
    let mut c = json!({"name": "regular1", "image": support::lifecycle::IMAGE,
        "command": ["sleep", "10000"]});
    if long_prestop {
        c["lifecycle"] = json!({"preStop": {"exec": {"command": ["sleep", "10000"]}}});
    }
    let mut p = pod("pod-terminate-seconds", "Never", vec![], vec![c], logs);
    p["spec"]["terminationGracePeriodSeconds"] = 30.into();
    let running = run(node, &p).await?;
    wait(&running, "the pod running", Duration::from_secs(60), |s| {
        s.phase == Phase::Running
    })
    .await?;
    let start = Instant::now();
    let d = running
        .delete_with(DeleteOptions::default())
        .await
        .map_err(|e| format!("deleting: {e}"))?;
    let took = start.elapsed();
    // `WaitForPodNotFoundInNamespace(gracePeriod + bufferSeconds)`: 30 + 30 s.
    if took > Duration::from_secs(60) {
        return Err(format!(
            "the pod was deleted after {took:?}, not within 60 s; its timeline:\n{}",
            d.timeline.render(d.started_ns)
        ));
    }
    Ok(())
}

/// The regular container exits 0 after 5 s; the sidecars (5 s to stop each) stop after it,
/// in reverse order, each ending 0/Completed.
async fn sidecars_in_reverse_order(node: &Node, logs: &Path) -> CaseResult {
    let running = run(
        node,
        &three_sidecars_pod("serialize-termination", logs, None),
    )
    .await?;
    let s = no_longer_running(&running, Duration::from_secs(300)).await?;
    three_sidecars_terminated_as(&s, 0, "Completed")?;
    let o = Output::read(logs);
    three_sidecars_start_in_order(&o)?;
    three_sidecars_stop_in_reverse_after_regular(&o)?;
    delete(running).await
}

/// Every sidecar's preStop loops forever (every 0.2 s): the grace (30 s) runs out in the
/// hooks, each sidecar gets the 2 s minimum and is killed (137/Error); the hooks end within
/// 1 s of each other, each about 32 s after it began (± 1.5 s).
async fn sidecars_simultaneously_if_prestop_does_not_exit(node: &Node, logs: &Path) -> CaseResult {
    let hook = Exec {
        loop_forever: true,
        loop_period: Some(0.2),
        ..Exec::default()
    };
    let p = three_sidecars_pod("serialize-termination", logs, Some(hook));
    let running = run(node, &p).await?;
    let s = no_longer_running(&running, Duration::from_secs(300)).await?;
    three_sidecars_terminated_as(&s, 137, "Error")?;
    let o = Output::read(logs);
    three_sidecars_start_in_order(&o)?;
    let mut starts = Vec::new();
    let mut lasts = Vec::new();
    for i in 1..=3 {
        let hook = format!("PreStop-restartable-init-{i}");
        starts.push(o.time_of_start(&hook)?);
        lasts.push(o.time_of_last_loop(&hook)?);
    }
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        about(
            &format!(
                "expected PreStop {} & PreStop {} to be killed at the same time",
                a + 1,
                b + 1
            ),
            lasts[a] - lasts[b],
            0,
            1000,
        )?;
    }
    for i in 0..3 {
        // "30 seconds + 2 second minimum grace for the SIGKILL".
        about(
            &format!("expected PreStop {} to live for ~32 seconds", i + 1),
            lasts[i] - starts[i],
            32_000,
            1500,
        )?;
    }
    delete(running).await
}

/// Every sidecar's preStop `{Delay: 1}`: the hooks all begin at once (within 1 s), and the
/// sidecars still stop in reverse order after the regular container.
async fn sidecar_prestops_simultaneously(node: &Node, logs: &Path) -> CaseResult {
    let hook = Exec {
        delay: 1,
        loop_period: Some(0.2),
        ..Exec::default()
    };
    let p = three_sidecars_pod("serialize-termination-simul-prestop", logs, Some(hook));
    let running = run(node, &p).await?;
    let s = no_longer_running(&running, Duration::from_secs(300)).await?;
    three_sidecars_terminated_as(&s, 0, "Completed")?;
    let o = Output::read(logs);
    three_sidecars_start_in_order(&o)?;
    three_sidecars_stop_in_reverse_after_regular(&o)?;
    let mut starts = Vec::new();
    for i in 1..=3 {
        starts.push(o.time_of_start(&format!("PreStop-restartable-init-{i}"))?);
    }
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        about(
            &format!(
                "expected PreStop {} & PreStop {} to be killed at the same time",
                a + 1,
                b + 1
            ),
            starts[a] - starts[b],
            0,
            1000,
        )?;
    }
    delete(running).await
}

/// A sidecar `{Delay: 600, TerminationSeconds: 15}` with a preStop `{Delay: 1}` and the
/// probe `probe_field` (`exit 1`, after 5 s, once), before `regular-1 {Delay: 1}`;
/// `restartPolicy: Always`.
fn failing_sidecar_pod(logs: &Path, probe_field: &str) -> Value {
    let mut ri = sidecar(
        "restartable-init-1",
        &Exec {
            delay: 600,
            termination_seconds: 15,
            ..Exec::default()
        },
    );
    let mut p = probe("exit 1");
    p["initialDelaySeconds"] = 5.into();
    p["failureThreshold"] = 1.into();
    ri[probe_field] = p;
    let hook = Exec {
        delay: 1,
        ..Exec::default()
    };
    ri["lifecycle"] = json!({"preStop": handler("PreStop", "restartable-init-1", hook)});
    let regular = container(
        "regular-1",
        &Exec {
            delay: 1,
            ..Exec::default()
        },
    );
    pod(
        "restartable-init-container-failed-startup",
        "Always",
        vec![ri],
        vec![regular],
        logs,
    )
}

/// The sidecar's startup probe fails: its preStop runs, it restarts, and the regular
/// container never starts (the pod stays Pending).
async fn sidecar_startup_probe_fails(node: &Node, logs: &Path) -> CaseResult {
    let running = run(node, &failing_sidecar_pod(logs, "startupProbe")).await?;
    let s = wait(
        &running,
        "restartable-init-1 restarted twice",
        Duration::from_secs(120),
        |s| restarts(s, "restartable-init-1") >= 2,
    )
    .await?;
    if s.phase != Phase::Pending {
        return Err(format!("pod phase {}, expected Pending", s.phase));
    }
    let o = Output::read(logs);
    o.run_together("restartable-init-1", "PreStop-restartable-init-1")?;
    o.starts("PreStop-restartable-init-1")?;
    o.exits("restartable-init-1")?;
    o.doesnt_start("regular-1")?;
    delete(running).await
}

/// The sidecar's liveness probe fails: its preStop runs, it restarts, and the regular
/// container starts (and, exiting after 1 s, restarts too).
async fn sidecar_liveness_probe_fails(node: &Node, logs: &Path) -> CaseResult {
    let running = run(node, &failing_sidecar_pod(logs, "livenessProbe")).await?;
    wait(
        &running,
        "restartable-init-1 restarted twice",
        Duration::from_secs(120),
        |s| restarts(s, "restartable-init-1") >= 2,
    )
    .await?;
    wait(
        &running,
        "regular-1 restarted",
        Duration::from_secs(120),
        |s| restarts(s, "regular-1") >= 1,
    )
    .await?;
    let o = Output::read(logs);
    o.run_together("restartable-init-1", "PreStop-restartable-init-1")?;
    o.starts("PreStop-restartable-init-1")?;
    o.exits("restartable-init-1")?;
    o.starts("regular-1")?;
    delete(running).await
}

/// Deleted (grace 3) while its first, regular init container runs and no sidecar started:
/// gone in under 3 + 2 s.
async fn no_hang_if_terminated_during_initialization(node: &Node, logs: &Path) -> CaseResult {
    let mut init = vec![container(
        "start-init",
        &Exec {
            delay: 300,
            ..Exec::default()
        },
    )];
    for i in 1..=3 {
        let n = format!("restartable-init-{i}");
        let mut c = sidecar(
            &n,
            &Exec {
                delay: 60,
                termination_seconds: 5,
                ..Exec::default()
            },
        );
        let hook = Exec {
            delay: 1,
            ..Exec::default()
        };
        c["lifecycle"] = json!({"preStop": handler("PreStop", &n, hook)});
        init.push(c);
    }
    let regular = container(
        "regular-1",
        &Exec {
            delay: 5,
            ..Exec::default()
        },
    );
    let p = pod(
        "dont-hang-if-terminated-in-init",
        "Never",
        init,
        vec![regular],
        logs,
    );
    let running = run(node, &p).await?;
    wait(
        &running,
        "start-init started and running",
        Duration::from_secs(120),
        |s| {
            s.phase == Phase::Pending
                && s.container("start-init")
                    .is_some_and(|c| c.started && c.running)
        },
    )
    .await?;
    said_within(logs, Duration::from_secs(30), |o| o.starts("start-init")).await?;
    let start = Instant::now();
    let d = running
        .delete_with(DeleteOptions {
            grace_period: Some(3),
            ..DeleteOptions::default()
        })
        .await
        .map_err(|e| format!("deleting: {e}"))?;
    let took = start.elapsed();
    if took >= Duration::from_secs(5) {
        return Err(format!(
            "the pod took {took:?} to delete, expected under 3 + 2 s: it should not wait on \
             sidecars that never started; its timeline:\n{}",
            d.timeline.render(d.started_ns)
        ));
    }
    Ok(())
}

/// A sidecar whose startup probe never succeeds (the next one is never launched): deleted
/// with grace 180, the pod is gone within 1 + 60 s.
async fn non_started_sidecar(node: &Node, logs: &Path) -> CaseResult {
    let long = |term| Exec {
        delay: 600,
        termination_seconds: term,
        ..Exec::default()
    };
    let init1 = container(
        "init-1",
        &Exec {
            delay: 1,
            termination_seconds: 5,
            ..Exec::default()
        },
    );
    let mut ri2 = sidecar("restartable-init-2", &long(1));
    let mut never = probe("false");
    never["failureThreshold"] = 600.into();
    ri2["startupProbe"] = never;
    let ri3 = sidecar("restartable-init-3", &long(1));
    let regular = container("regular-1", &long(1));
    let mut p = pod(
        "terminate-restartable-init-gracefully",
        "Never",
        vec![init1, ri2, ri3],
        vec![regular],
        logs,
    );
    p["spec"]["terminationGracePeriodSeconds"] = 180.into();
    let running = run(node, &p).await?;
    wait(
        &running,
        "restartable-init-2 running, not started",
        Duration::from_secs(120),
        |s| {
            s.phase == Phase::Pending
                && s.container("restartable-init-2")
                    .is_some_and(|c| c.running && !c.started)
        },
    )
    .await?;
    // Its script past its `trap` (see `running_and_trapping`).
    said_within(logs, Duration::from_secs(30), |o| {
        o.starts("restartable-init-2")
    })
    .await?;
    let start = Instant::now();
    let d = running
        .delete_with(DeleteOptions {
            grace_period: Some(180),
            ..DeleteOptions::default()
        })
        .await
        .map_err(|e| format!("deleting: {e}"))?;
    let took = start.elapsed();
    if took > Duration::from_secs(61) {
        return Err(format!(
            "the pod took {took:?} to delete, not within 61 s: it should be deleted before \
             its terminationGracePeriodSeconds if the restartable init containers get the \
             termination signal; its timeline:\n{}",
            d.timeline.render(d.started_ns)
        ));
    }
    Ok(())
}

/// Updates `name`'s image to [`ALTERNATE_IMAGE`] and waits (up to `within`) for a new
/// attempt of it running the new image.
async fn update_image(running: &RunningPod, name: &str, within: Duration) -> CaseResult {
    running
        .update_image(name, ALTERNATE_IMAGE)
        .await
        .map_err(|e| format!("updating the image: {e}"))?;
    wait(
        running,
        &format!("{name} restarted with the new image"),
        within,
        |s| {
            s.container(name)
                .is_some_and(|c| c.running && c.image == ALTERNATE_IMAGE && c.attempt > 0)
        },
    )
    .await
    .map(|_| ())
}

/// Two regular containers `{Delay: 60}`; the first one's image is updated: it restarts
/// (within 20 s), the other does not (within 30 s), whatever the restart policy.
async fn image_updated(node: &Node, logs: &Path, policy: &str) -> CaseResult {
    let c = |n| {
        container(
            n,
            &Exec {
                delay: 60,
                ..Exec::default()
            },
        )
    };
    let name = format!("container-image-update-{}", policy.to_lowercase());
    let p = pod(
        &name,
        policy,
        vec![],
        vec![c("regular-1"), c("regular-2")],
        logs,
    );
    let running = run(node, &p).await?;
    running_and_trapping(&running, logs, &["regular-1", "regular-2"]).await?;
    update_image(&running, "regular-1", Duration::from_secs(20)).await?;
    let s = wait(
        &running,
        "regular-2 running",
        Duration::from_secs(30),
        |s| s.container("regular-2").is_some_and(|c| c.running),
    )
    .await?;
    if restarts(&s, "regular-2") >= 1 {
        return Err("regular-2 restarted: only the updated container should".into());
    }
    delete(running).await
}

/// `restartPolicy: Never`; two sidecars `{Delay: 600}` and `regular-1 {Delay: 60}`; the
/// first sidecar's image is updated: it restarts, the other sidecar and the regular
/// container do not.
async fn sidecar_image_updated(node: &Node, logs: &Path) -> CaseResult {
    let long = Exec {
        delay: 600,
        ..Exec::default()
    };
    let init = vec![
        sidecar("restartable-init-1", &long),
        sidecar("restartable-init-2", &long),
    ];
    let regular = container(
        "regular-1",
        &Exec {
            delay: 60,
            ..Exec::default()
        },
    );
    let p = pod(
        "restartable-init-container-imgupdate-never",
        "Never",
        init,
        vec![regular],
        logs,
    );
    let running = run(node, &p).await?;
    running_and_trapping(&running, logs, &["restartable-init-1", "regular-1"]).await?;
    update_image(&running, "restartable-init-1", Duration::from_secs(120)).await?;
    // The new attempt's first line follows its start by a moment (upstream's API round trip
    // covers it): read once it is there.
    let o = said_within(logs, Duration::from_secs(30), |o| {
        o.has_restarted("restartable-init-1")
    })
    .await?;
    o.has_not_restarted("regular-1")?;
    o.has_restarted("restartable-init-1")?;
    o.has_not_restarted("restartable-init-2")?;
    delete(running).await
}

/// Grace 5: a pod of `regular-1` and three sidecars (`{Delay: 600}`, each taking `terms[i]`
/// seconds after TERM), with 1.36.2's PostStart gate on the sidecars when `gate`; deleted
/// with grace 5, it ends as `want` says, in the phase `phase`.
async fn exceeds_grace(
    node: &Node,
    logs: &Path,
    terms: [u32; 4],
    gate: bool,
    want: [i32; 4],
    phase: Phase,
) -> CaseResult {
    let long = |t| Exec {
        delay: 600,
        termination_seconds: t,
        ..Exec::default()
    };
    let init = (1..=3)
        .map(|i| {
            let mut c = sidecar(&format!("restartable-init-{i}"), &long(terms[i]));
            if gate {
                c["lifecycle"] = json!({"postStart": started_post_start_gate()});
            }
            c
        })
        .collect();
    let regular = container("regular-1", &long(terms[0]));
    let mut p = pod("test-pod", "Never", init, vec![regular], logs);
    p["spec"]["terminationGracePeriodSeconds"] = 5.into();
    let running = run(node, &p).await?;
    let names = [
        "regular-1",
        "restartable-init-1",
        "restartable-init-2",
        "restartable-init-3",
    ];
    running_and_trapping(&running, logs, &names).await?;
    let d = running
        .delete_with(DeleteOptions {
            grace_period: Some(5),
            ..DeleteOptions::default()
        })
        .await
        .map_err(|e| format!("deleting: {e}"))?;
    for (name, code) in names.iter().zip(want) {
        let reason = if code == 0 { "Completed" } else { "Error" };
        match d.container(name) {
            Some(c) if c.exit_code == code && c.reason == reason => {}
            other => {
                return Err(format!(
                    "{name}: expected terminated with {code}/{reason}, got {:?}",
                    other.map(|c| (c.exit_code, &c.reason))
                ))
            }
        }
    }
    if d.phase != phase {
        return Err(format!("the pod ended {}, expected {phase}", d.phase));
    }
    Ok(())
}

/// The regular container needs 20 s after TERM: killed at the grace (137); the sidecars
/// then get the 2 s minimum: those needing 20 s are killed, the one needing 1 s ends 0.
async fn regular_exceeds_grace(node: &Node, logs: &Path) -> CaseResult {
    exceeds_grace(
        node,
        logs,
        [20, 20, 1, 20],
        false,
        [137, 137, 0, 137],
        Phase::Failed,
    )
    .await
}

/// Only the second sidecar needs 20 s after TERM: it is killed, the rest end 0, and the pod
/// succeeds (sidecars do not count toward its phase).
async fn sidecar_exceeds_grace(node: &Node, logs: &Path) -> CaseResult {
    exceeds_grace(
        node,
        logs,
        [1, 1, 20, 1],
        true,
        [0, 0, 137, 0],
        Phase::Succeeded,
    )
    .await
}
