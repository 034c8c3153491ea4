//! End to end on a real containerd: the pods of deploy/examples/, as users write them, run and
//! deleted by the test bed's Pod runner the way the kubelet does it, the real agent answering
//! the real entrypoint. Order is asserted from the runtime's own `finished_at`.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use exitorder_e2e::support;

use std::time::Duration;

use exitorder_testbed::What;
use support::{assert_exited_after, edit_script, example, pod, set_grace, Bed};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test]
async fn sidecar_exits_after_main() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let running = bed.run_ready(&example("two-level")).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show("sidecar_exits_after_main", &d);

    assert_exited_after(&bed, &d, "proxy", "app");
    let app = d.container("app").expect("app");
    let proxy = d.container("proxy").expect("proxy");
    assert_eq!(
        (app.exit_code, proxy.exit_code),
        (0, 0),
        "{}",
        bed.context(&d)
    );
    // The app drains for 2 s after TERM; TERM comes at once (it has no preStop).
    let app_ms = d.finished_ms("app").unwrap_or_default();
    assert!(
        app_ms >= 1900.0,
        "app finished at {app_ms:.0} ms{}",
        bed.context(&d)
    );
    let hook = proxy.prestop.as_ref().expect("proxy preStop ran");
    assert!(hook.ok, "{}", bed.context(&d));
    // The handshake as the share saw it: the preStop asked, the agent answered, the preStop
    // took the answer away.
    let files = d.exit_files.as_ref().expect("probed");
    let ev = files.get("proxy").expect("proxy exit file events");
    match (ev.created, ev.allowed, ev.removed) {
        (Some(c), Some(a), Some(r)) => assert!(c <= a && a <= r, "{}", bed.context(&d)),
        _ => panic!("incomplete handshake {ev:?}{}", bed.context(&d)),
    }
    bed.allowed_ordered(&uid, "proxy", "").await;
    // The timeline of the pod has every step, in the kubelet's order.
    let t = &d.timeline;
    let at = |c: &str, f: &dyn Fn(&What) -> bool| t.first(c, f).map(|e| e.at_ns);
    let app_started = at("app", &|w| matches!(w, What::Started { .. }));
    let proxy_started = at("proxy", &|w| matches!(w, What::Started { .. }));
    assert!(app_started <= proxy_started, "{}", bed.context(&d));
    let prestop = at("proxy", &|w| matches!(w, What::PreStopStarted { .. }));
    let term = at("proxy", &|w| matches!(w, What::Term { .. }));
    assert!(prestop.is_some() && prestop <= term, "{}", bed.context(&d));
    bed.finish().await;
}

#[tokio::test]
async fn three_levels_exit_in_order() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let running = bed.run_ready(&example("three-level")).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show("three_levels_exit_in_order", &d);

    assert_eq!(
        d.exit_order(),
        ["app", "proxy", "log-shipper"],
        "exit order{}",
        bed.context(&d)
    );
    assert_exited_after(&bed, &d, "proxy", "app");
    assert_exited_after(&bed, &d, "log-shipper", "proxy");
    for name in ["app", "proxy", "log-shipper"] {
        assert_eq!(d.container(name).map(|c| c.exit_code), Some(0), "{name}");
    }
    for name in ["proxy", "log-shipper"] {
        bed.allowed_ordered(&uid, name, "").await;
    }
    bed.finish().await;
}

#[tokio::test]
async fn sidecar_waits_for_slow_main() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let mut p = example("two-level");
    edit_script(&mut p, "app", "sleep 2", "sleep 3");
    let running = bed.run_ready(&p).await;
    let d = running.delete().await.expect("delete pod");
    bed.show("sidecar_waits_for_slow_main", &d);

    assert_exited_after(&bed, &d, "proxy", "app");
    let hook = d
        .container("proxy")
        .and_then(|c| c.prestop.as_ref())
        .expect("proxy preStop ran");
    assert!(
        hook.took() >= Duration::from_millis(2900),
        "proxy preStop returned after {:?}, before the app's 3 s drain ended{}",
        hook.took(),
        bed.context(&d)
    );
    bed.finish().await;
}

#[tokio::test]
async fn deadline_lets_sidecar_go_before_the_kill() {
    // Grace 8 s, reserve 3 s: the proxy is released at about 5 s and drains before the
    // runtime kills the app (which ignores TERM) at 8 s.
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let mut p = example("two-level");
    edit_script(
        &mut p,
        "app",
        "trap 'echo \"TERM: finishing requests\"; sleep 2; echo done; exit 0' TERM",
        "trap '' TERM",
    );
    set_grace(&mut p, 8);
    let running = bed.run_ready(&p).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show("deadline_lets_sidecar_go_before_the_kill", &d);

    assert_exited_after(&bed, &d, "app", "proxy");
    let app = d.container("app").expect("app");
    let proxy = d.container("proxy").expect("proxy");
    assert_eq!(app.exit_code, 137, "app was not killed{}", bed.context(&d));
    assert_eq!(proxy.exit_code, 0, "{}", bed.context(&d));
    let allow = bed.allowed(&uid, "proxy").await;
    assert_eq!(
        allow.field("reason").as_deref(),
        Some("deadline"),
        "{}",
        bed.context(&d)
    );
    let allowed_ms = d.ms(allow.at_ns().expect("timestamped"));
    assert!(
        (4500.0..6500.0).contains(&allowed_ms),
        "deadline allow at {allowed_ms:.0} ms, expected about 5000{}",
        bed.context(&d)
    );
    let proxy_ms = d.finished_ms("proxy").unwrap_or_default();
    assert!(
        proxy_ms < 7000.0,
        "proxy finished at {proxy_ms:.0} ms, too close to the kill{}",
        bed.context(&d)
    );
    bed.finish().await;
}

#[tokio::test]
async fn restarted_agent_answers_a_pending_wait() {
    let Some(mut bed) = Bed::start(secs(3)).await else {
        return;
    };
    let mut p = example("two-level");
    edit_script(&mut p, "app", "sleep 2", "sleep 3");
    set_grace(&mut p, 20);
    let running = bed.run_ready(&p).await;
    let uid = running.uid().to_owned();
    let deletion = tokio::spawn(running.delete());

    bed.agent
        .wait_for("the agent holding the proxy", secs(10), |l| {
            l.is("held", &[("pod", &uid), ("container", "proxy")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let first = bed.agent.pid();
    bed.restart_agent().await.unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(first, bed.agent.pid());

    let d = deletion.await.expect("delete task").expect("delete pod");
    bed.show("restarted_agent_answers_a_pending_wait", &d);
    assert_exited_after(&bed, &d, "proxy", "app");
    // The answer came from the new agent, and in order.
    bed.allowed_ordered(&uid, "proxy", &bed.context(&d)).await;
    assert_eq!(d.container("proxy").map(|c| c.exit_code), Some(0));
    bed.finish().await;
}

#[tokio::test]
async fn pod_without_exitorder_is_not_held() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let plain = pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: plain}
spec:
  containers:
    - name: app
      image: busybox:1.36
      command: [sh, -c, "trap 'exit 0' TERM; touch /tmp/serving; while :; do sleep 3600 & wait $!; done"]
      readinessProbe: {exec: {command: [test, -e, /tmp/serving]}, periodSeconds: 1}
    - name: helper
      image: busybox:1.36
      command: [sh, -c, "trap 'exit 0' TERM; touch /tmp/serving; while :; do sleep 3600 & wait $!; done"]
      readinessProbe: {exec: {command: [test, -e, /tmp/serving]}, periodSeconds: 1}
"#);
    let running = bed.run_ready(&plain).await;
    let uid = running.uid().to_owned();
    let share_dir = running.container_dir("app");
    let d = running.delete().await.expect("delete pod");
    bed.show("pod_without_exitorder_is_not_held", &d);

    for c in &d.containers {
        assert!(c.prestop.is_none());
        let after_term =
            d.finished_ms(&c.name).unwrap_or(f64::NAN) - d.ms(c.term_ns.expect("TERM sent"));
        assert!(
            after_term < 1000.0,
            "{} finished {after_term:.0} ms after TERM{}",
            c.name,
            bed.context(&d)
        );
        assert_eq!(c.exit_code, 0);
    }
    assert_eq!(d.pod_dir_created_ns, None, "{}", bed.context(&d));
    assert!(d
        .exit_files
        .as_ref()
        .expect("probed")
        .values()
        .all(|e| e.created.is_none()));
    assert!(!share_dir.exists());
    assert!(
        bed.agent
            .find(|l| l.field("pod").as_deref() == Some(uid.as_str()))
            .is_none(),
        "the agent acted on a pod that did not opt in:\n{}",
        bed.agent.log_tail(20)
    );
    bed.finish().await;
}
