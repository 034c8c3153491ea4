//! The test bed's Pod runner against a real containerd: each Pod field it supports behaves as
//! the kubelet makes it behave, each field it refuses is refused by name, and native sidecars
//! start and stop in the KEP-753 order. No agent here: these are the kubelet's rules.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use std::time::Duration;

use exitorder_testbed::kubelet::{
    pod_from_yaml, DeleteOptions, Phase, PodStatus, RunOptions, RunningPod, What,
};
use exitorder_testbed::skip::node_with_or_skip;
use exitorder_testbed::{Node, NodeOptions, TestbedError};
use serde_json::Value;

const START: Duration = Duration::from_secs(60);

/// A node whose relist is quicker than the kubelet's 1 s, so that restart and completion
/// tests do not wait on it.
async fn node() -> Option<Node> {
    let opts = NodeOptions {
        relist_period: Duration::from_millis(200),
        ..NodeOptions::default()
    };
    node_with_or_skip(opts).await
}

fn pod(yaml: &str) -> Value {
    pod_from_yaml(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn free_port() -> u16 {
    exitorder_testbed::node::free_port().expect("a free port")
}

/// The first event of `container` matching `pred`, Unix ns.
fn at(s: &PodStatus, container: &str, pred: impl Fn(&What) -> bool) -> i64 {
    s.timeline
        .first(container, pred)
        .map(|e| e.at_ns)
        .unwrap_or_else(|| panic!("no such event for {container}:\n{}", s.timeline.render(0)))
}

fn started(w: &What) -> bool {
    matches!(w, What::Started { .. })
}

fn term(w: &What) -> bool {
    matches!(w, What::Term { .. })
}

fn exited(w: &What) -> bool {
    matches!(w, What::Exited { .. })
}

fn opts() -> RunOptions {
    RunOptions::default()
}

/// Deletes a pod whose containers ignore TERM, when how they end is not what the test is
/// about: with a 1 s grace period (`kubectl delete --grace-period=1`), not the pod's own.
async fn delete_at_once(running: RunningPod) {
    let opts = DeleteOptions {
        grace_period: Some(1),
        ..DeleteOptions::probed()
    };
    running.delete_with(opts).await.expect("delete");
}

/// The value printed as `KEY=value` in a CRI log (`<time> <stream> <tag> <message>` lines).
fn printed(log: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    log.lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .find_map(|m| m.strip_prefix(&prefix).map(str::to_owned))
        .unwrap_or_else(|| panic!("{key} not printed in:\n{log}"))
}

#[tokio::test]
async fn fields_reach_the_process_as_the_kubelet_sets_them() {
    let Some(node) = node().await else { return };
    let created = node.dir().join("made-by-directory-or-create");
    let yaml = format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: fields
  namespace: team-a
  labels: {{app: shop}}
spec:
  hostNetwork: true
  initContainers:
    - name: first
      image: busybox:1.36
      command: [sh, -c, "echo one > /scratch/order"]
      volumeMounts: [{{name: scratch, mountPath: /scratch}}]
    - name: second
      image: busybox:1.36
      command: [sh, -c, "echo two >> /scratch/order"]
      volumeMounts: [{{name: scratch, mountPath: /scratch}}]
  containers:
    - name: show
      image: busybox:1.36
      workingDir: /tmp
      command: [sh, -c]
      args:
        - |
          echo "POD_UID=$POD_UID"; echo "POD_NAME=$POD_NAME"; echo "NS=$NS"; echo "NODE=$NODE"
          echo "HOST_IP=$HOST_IP"; echo "APP=$APP"; echo "GREETING=$GREETING"; echo "PWD=$(pwd)"
          echo "ARG=$(POD_NAME)"; echo "ORDER=$(cat /scratch/order | tr '\n' ',')"
          echo hello > /var/run/exitorder/hello && echo "SUBPATH=written"
          if echo x > /ro/x 2>/dev/null; then echo "RO=writable"; else echo "RO=refused"; fi
          echo "DONE=yes"; while :; do sleep 3600 & wait $!; done
      env:
        - {{name: POD_UID, valueFrom: {{fieldRef: {{fieldPath: metadata.uid}}}}}}
        - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
        - {{name: NS, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
        - {{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
        - {{name: HOST_IP, valueFrom: {{fieldRef: {{fieldPath: status.hostIP}}}}}}
        - {{name: APP, valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['app']"}}}}}}
        - {{name: GREETING, value: "hello from $(NODE)"}}
      volumeMounts:
        - {{name: share, mountPath: /var/run/exitorder, subPathExpr: "pods/$(POD_UID)/show"}}
        - {{name: scratch, mountPath: /scratch}}
        - {{name: made, mountPath: /ro, readOnly: true}}
    - name: secure
      image: busybox:1.36
      command:
        - sh
        - -c
        - |
          echo "UID=$(id -u)"; echo "GID=$(id -g)"
          if touch /rootfs-write 2>/dev/null; then echo "ROOTFS=writable"; else echo "ROOTFS=read-only"; fi
          echo "CAPS=$(grep CapEff /proc/self/status | tr -d ' \t' | cut -d: -f2)"
          echo "NNP=$(grep NoNewPrivs /proc/self/status | tr -d ' \t' | cut -d: -f2)"
          echo "DONE=yes"; while :; do sleep 3600 & wait $!; done
      securityContext:
        runAsUser: 1000
        runAsGroup: 3000
        readOnlyRootFilesystem: true
        allowPrivilegeEscalation: false
        capabilities: {{drop: [ALL]}}
    - name: netadmin
      image: busybox:1.36
      command: [sh, -c, "echo \"CAPS=$(grep CapEff /proc/self/status | tr -d ' \\t' | cut -d: -f2)\"; echo DONE=yes; while :; do sleep 3600 & wait $!; done"]
      securityContext:
        capabilities: {{drop: [ALL], add: [NET_ADMIN]}}
  volumes:
    - {{name: share, hostPath: {{path: /var/lib/exitorder, type: Directory}}}}
    - {{name: scratch, emptyDir: {{}}}}
    - {{name: made, hostPath: {{path: {created}, type: DirectoryOrCreate}}}}
"#,
        created = created.display()
    );
    let running = node.run_pod(&pod(&yaml), &opts()).await.expect("run");
    running.wait_started(START).await.expect("started");
    for c in ["show", "secure", "netadmin"] {
        running
            .wait_output(c, "DONE=yes", START)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let show = running.container_log("show");
    let uid = running.uid().to_owned();
    assert_eq!(printed(&show, "POD_UID"), uid);
    assert_eq!(printed(&show, "POD_NAME"), "fields");
    assert_eq!(printed(&show, "NS"), "team-a");
    assert_eq!(printed(&show, "NODE"), exitorder_testbed::NODE_NAME);
    assert!(!printed(&show, "HOST_IP").is_empty());
    assert_eq!(printed(&show, "APP"), "shop");
    assert_eq!(
        printed(&show, "GREETING"),
        format!("hello from {}", exitorder_testbed::NODE_NAME)
    );
    assert_eq!(printed(&show, "PWD"), "/tmp");
    // $(VAR) in args is the kubelet's expansion, not the shell's.
    assert_eq!(printed(&show, "ARG"), "fields");
    // Init containers ran to completion, in order, before the main containers.
    assert_eq!(printed(&show, "ORDER"), "one,two,");
    assert_eq!(printed(&show, "RO"), "refused");
    assert_eq!(printed(&show, "SUBPATH"), "written");
    // subPathExpr: the directory the kubelet made on the host, seen in the container.
    let host_dir = running.container_dir("show");
    assert_eq!(
        std::fs::read_to_string(host_dir.join("hello")).expect("written through the mount"),
        "hello\n"
    );
    assert!(
        created.is_dir(),
        "DirectoryOrCreate made {}",
        created.display()
    );

    let secure = running.container_log("secure");
    assert_eq!(printed(&secure, "UID"), "1000");
    assert_eq!(printed(&secure, "GID"), "3000");
    assert_eq!(printed(&secure, "ROOTFS"), "read-only");
    assert_eq!(printed(&secure, "CAPS"), "0000000000000000");
    assert_eq!(printed(&secure, "NNP"), "1");
    // CAP_NET_ADMIN is bit 12.
    assert_eq!(
        printed(&running.container_log("netadmin"), "CAPS"),
        "0000000000001000"
    );

    let s = running.status();
    let first_exit = at(&s, "first", exited);
    assert!(
        first_exit <= at(&s, "second", started),
        "{}",
        s.timeline.render(0)
    );
    assert!(
        at(&s, "second", exited) <= at(&s, "show", started),
        "{}",
        s.timeline.render(0)
    );
    delete_at_once(running).await;
    node.shutdown().await.expect("teardown");
}

#[tokio::test]
async fn the_kubelets_labels_and_annotations_reach_the_runtime() {
    use exitorder::cri::{ListContainersRequest, ListPodSandboxRequest};
    let Some(node) = node().await else { return };
    let p = pod(r#"
apiVersion: v1
kind: Pod
metadata:
  name: labelled
  labels: {tier: web}
  annotations: {exitorder.io/container-exit-priority: '{"proxy": 1}'}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 12
  containers:
    - {name: app, image: busybox:1.36, command: [sleep, "3600"]}
    - name: proxy
      image: busybox:1.36
      command: [sleep, "3600"]
      lifecycle: {preStop: {exec: {command: ["true"]}}}
"#);
    let running = node.run_pod(&p, &opts()).await.expect("run");
    running.wait_started(START).await.expect("started");
    let mut client = node.client();
    let sandboxes = client
        .list_pod_sandbox(ListPodSandboxRequest { filter: None })
        .await
        .expect("list sandboxes")
        .into_inner()
        .items;
    let sb = sandboxes
        .iter()
        .find(|s| s.id == running.sandbox_id())
        .expect("sandbox");
    assert_eq!(sb.labels["io.kubernetes.pod.uid"], running.uid());
    assert_eq!(sb.labels["io.kubernetes.pod.name"], "labelled");
    assert_eq!(sb.labels["io.kubernetes.pod.namespace"], "default");
    assert_eq!(sb.labels["tier"], "web");
    assert_eq!(
        sb.annotations["exitorder.io/container-exit-priority"],
        r#"{"proxy": 1}"#
    );
    assert_eq!(sb.annotations["kubernetes.io/config.source"], "api");
    let containers = client
        .list_containers(ListContainersRequest { filter: None })
        .await
        .expect("list containers")
        .into_inner()
        .containers;
    let proxy = containers
        .iter()
        .find(|c| {
            c.pod_sandbox_id == running.sandbox_id()
                && c.labels
                    .get("io.kubernetes.container.name")
                    .map(String::as_str)
                    == Some("proxy")
        })
        .expect("proxy container");
    assert_eq!(proxy.labels["io.kubernetes.pod.uid"], running.uid());
    assert_eq!(
        proxy.annotations["io.kubernetes.pod.terminationGracePeriod"],
        "12"
    );
    assert_eq!(
        proxy.annotations["io.kubernetes.container.restartCount"],
        "0"
    );
    assert!(proxy.annotations["io.kubernetes.container.preStopHandler"].contains("true"));
    delete_at_once(running).await;
    node.shutdown().await.expect("teardown");
}

#[tokio::test]
async fn post_start_holds_the_next_container() {
    let Some(node) = node().await else { return };
    let p = pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: poststart}
spec:
  hostNetwork: true
  containers:
    - name: proxy
      image: busybox:1.36
      command: [sleep, "3600"]
      lifecycle: {postStart: {exec: {command: [sh, -c, "sleep 2"]}}}
    - {name: app, image: busybox:1.36, command: [sleep, "3600"]}
"#);
    let running = node.run_pod(&p, &opts()).await.expect("run");
    let s = running.wait_started(START).await.expect("started");
    let hook_end = at(&s, "proxy", |w| {
        matches!(w, What::PostStartEnded { ok: true, .. })
    });
    let hook_start = at(&s, "proxy", |w| matches!(w, What::PostStartStarted { .. }));
    let app = at(&s, "app", |w| matches!(w, What::Created { .. }));
    assert!(
        hook_end - hook_start >= 1_900_000_000,
        "{}",
        s.timeline.render(0)
    );
    assert!(
        app >= hook_end,
        "app created before proxy's postStart returned:\n{}",
        s.timeline.render(0)
    );
    delete_at_once(running).await;
    node.shutdown().await.expect("teardown");
}

#[tokio::test]
async fn probes_report_readiness_and_a_failed_liveness_restarts() {
    let Some(node) = node().await else { return };
    let (web, dead) = (free_port(), free_port());
    let yaml = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: probed}}
spec:
  hostNetwork: true
  # httpd and sleep run as PID 1 without a TERM handler: only the KILL ends them.
  terminationGracePeriodSeconds: 2
  containers:
    - name: web
      image: busybox:1.36
      command: [sh, -c, "mkdir -p /www; (sleep 2; echo ok > /www/ready) & exec httpd -f -p {web} -h /www"]
      readinessProbe: {{httpGet: {{path: /ready, port: {web}}}, periodSeconds: 1, failureThreshold: 1}}
    - name: doomed
      image: busybox:1.36
      command: [sh, -c, "echo attempt; exec sleep 3600"]
      livenessProbe: {{tcpSocket: {{port: {dead}}}, initialDelaySeconds: 1, periodSeconds: 1, failureThreshold: 2, terminationGracePeriodSeconds: 1}}
      lifecycle: {{preStop: {{exec: {{command: [sh, -c, "echo preStop ran"]}}}}}}
"#
    );
    let running = node.run_pod(&pod(&yaml), &opts()).await.expect("run");
    let s = running
        .wait_for("web ready", START, |s| {
            s.container("web").is_some_and(|c| c.ready)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Not ready until /ready answered 200 (it appears after 2 s).
    let ready = at(&s, "web", |w| matches!(w, What::Ready));
    assert!(
        ready - at(&s, "web", started) >= 1_500_000_000,
        "{}",
        s.timeline.render(0)
    );
    let s = running
        .wait_for("doomed restarted", START, |s| {
            s.container("doomed")
                .is_some_and(|c| c.attempt >= 1 && c.running)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let killed = at(&s, "doomed", |w| matches!(w, What::Killing { .. }));
    assert!(at(&s, "doomed", |w| matches!(w, What::PreStopStarted { .. })) >= killed);
    // The probe's own grace period (1 s, raised to the kubelet's 2 s minimum), not the pod's.
    assert!(
        s.timeline
            .first("doomed", |w| matches!(w, What::Term { grace_seconds: 2 }))
            .is_some(),
        "{}",
        s.timeline.render(0)
    );
    assert!(s
        .timeline
        .first("doomed", |w| matches!(w, What::Started { attempt: 1 }))
        .is_some());
    running
        .wait_output("doomed", "attempt", START)
        .await
        .expect("the new attempt has its own log");
    assert!(running.container_log_of("doomed", 0).contains("attempt"));
    running.delete().await.expect("delete");
    node.shutdown().await.expect("teardown");
}

#[tokio::test]
async fn restart_policies_and_the_phase() {
    let Some(node) = node().await else { return };
    let with = |policy: &str, script: &str| {
        pod(&format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{generateName: policy-}}
spec:
  hostNetwork: true
  restartPolicy: {policy}
  containers:
    - name: main
      image: busybox:1.36
      command: [sh, -c, '{script}']
      volumeMounts: [{{name: state, mountPath: /state}}]
  volumes: [{{name: state, emptyDir: {{}}}}]
"#
        ))
    };
    // Fails once, then succeeds: the emptyDir outlives the attempts, as it does in a pod.
    let flaky = "if [ -e /state/ran ]; then exit 0; fi; touch /state/ran; exit 1";
    let never = node
        .run_pod(&with("Never", "exit 0"), &opts())
        .await
        .expect("run");
    let on_failure = node
        .run_pod(&with("OnFailure", flaky), &opts())
        .await
        .expect("run");
    let never_failed = node
        .run_pod(&with("Never", flaky), &opts())
        .await
        .expect("run");
    let always = node
        .run_pod(&with("Always", "exit 0"), &opts())
        .await
        .expect("run");

    let s = never.wait_completed(START).await.expect("completes");
    assert_eq!(s.phase, Phase::Succeeded);
    assert_eq!(s.container("main").map(|c| c.attempt), Some(0));
    let s = on_failure.wait_completed(START).await.expect("completes");
    assert_eq!(s.phase, Phase::Succeeded, "{}", s.timeline.render(0));
    assert_eq!(s.container("main").map(|c| c.attempt), Some(1));
    let s = never_failed.wait_completed(START).await.expect("completes");
    assert_eq!(s.phase, Phase::Failed);
    let s = always
        .wait_for("a restart", START, |s| {
            s.container("main").is_some_and(|c| c.attempt >= 1)
        })
        .await
        .expect("restarted");
    assert_eq!(s.phase, Phase::Running);
    for p in [never, on_failure, never_failed, always] {
        p.delete().await.expect("delete");
    }
    node.shutdown().await.expect("teardown");
}

const SIDECARS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: native}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 30
  initContainers:
    - name: mesh
      image: busybox:1.36
      restartPolicy: Always
      command: [sh, -c, "trap 'exit 0' TERM; echo serving; while :; do sleep 3600 & wait $!; done"]
      lifecycle: {preStop: {exec: {command: [sh, -c, "echo drain"]}}}
    - name: logs
      image: busybox:1.36
      restartPolicy: Always
      command: [sh, -c, "trap 'exit 0' TERM; echo serving; while :; do sleep 3600 & wait $!; done"]
      lifecycle: {preStop: {exec: {command: [sh, -c, "echo flush"]}}}
  containers:
    - name: app
      image: busybox:1.36
      command: [sh, -c, "trap 'sleep 2; exit 0' TERM; echo serving; while :; do sleep 3600 & wait $!; done"]
"#;

#[tokio::test]
async fn native_sidecars_start_first_and_stop_last_in_reverse_order() {
    let Some(node) = node().await else { return };
    let running = node.run_pod(&pod(SIDECARS), &opts()).await.expect("run");
    running.wait_started(START).await.expect("started");
    for c in ["mesh", "logs", "app"] {
        running
            .wait_output(c, "serving", START)
            .await
            .expect("trap set");
    }
    let d = running.delete().await.expect("delete");
    let s = &d.timeline;
    let first = |c: &str, f: fn(&What) -> bool| {
        s.first(c, f)
            .map(|e| e.at_ns)
            .unwrap_or_else(|| panic!("{c}:\n{}", d.describe()))
    };
    // Started in declaration order, the sidecars before the app.
    assert!(first("mesh", started) < first("logs", started));
    assert!(first("logs", started) < first("app", started));
    // Every preStop ran at once when the deletion began (KEP-753 as the kubelet does today)...
    for c in ["mesh", "logs"] {
        let hook = first(c, |w| matches!(w, What::PreStopStarted { .. }));
        assert!(
            d.ms(hook) < 500.0,
            "{c} preStop at {:.0} ms:\n{}",
            d.ms(hook),
            d.describe()
        );
    }
    // ...but TERM came to the sidecars only after the app exited, in reverse order, each
    // after the next one ended.
    let app_exit = d.container("app").expect("app").finished_at_ns;
    assert!(d.ms(app_exit) >= 1900.0, "{}", d.describe());
    let logs = d.container("logs").expect("logs");
    let mesh = d.container("mesh").expect("mesh");
    assert!(logs.term_ns.expect("TERM") >= app_exit, "{}", d.describe());
    assert!(
        mesh.term_ns.expect("TERM") >= logs.finished_at_ns,
        "{}",
        d.describe()
    );
    assert_eq!(d.exit_order(), ["app", "logs", "mesh"], "{}", d.describe());
    assert!(
        d.containers.iter().all(|c| c.exit_code == 0),
        "{}",
        d.describe()
    );
    node.shutdown().await.expect("teardown");
}

#[tokio::test]
async fn native_sidecars_of_a_completed_pod_are_stopped() {
    let Some(node) = node().await else { return };
    let mut p = pod(SIDECARS);
    p["spec"]["restartPolicy"] = "Never".into();
    p["spec"]["containers"][0]["command"][2] = "sleep 1; exit 0".into();
    let running = node.run_pod(&p, &opts()).await.expect("run");
    let s = running.wait_completed(START).await.expect("completes");
    assert_eq!(s.phase, Phase::Succeeded, "{}", s.timeline.render(0));
    for c in ["mesh", "logs"] {
        let st = s.container(c).expect("sidecar");
        assert!(
            !st.running && st.finished,
            "{c}: {st:?}\n{}",
            s.timeline.render(0)
        );
    }
    assert!(
        at(&s, "logs", term) >= at(&s, "app", exited),
        "{}",
        s.timeline.render(0)
    );
    assert!(
        at(&s, "mesh", term) >= at(&s, "logs", exited),
        "{}",
        s.timeline.render(0)
    );
    running.delete().await.expect("delete");
    node.shutdown().await.expect("teardown");
}

#[tokio::test]
async fn deletion_honours_the_grace_period_override_and_prestop_sleep() {
    let Some(node) = node().await else { return };
    let p = pod(r#"
apiVersion: v1
kind: Pod
metadata: {name: deaf}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 30
  containers:
    - name: deaf
      image: busybox:1.36
      command: [sh, -c, "trap '' TERM; echo serving; while :; do sleep 1; done"]
    - name: sleepy
      image: busybox:1.36
      command: [sh, -c, "trap 'exit 0' TERM; echo serving; while :; do sleep 3600 & wait $!; done"]
      lifecycle: {preStop: {sleep: {seconds: 1}}}
"#);
    let running = node.run_pod(&p, &opts()).await.expect("run");
    for c in ["deaf", "sleepy"] {
        running
            .wait_output(c, "serving", START)
            .await
            .expect("trap set");
    }
    let d = running
        .delete_with(DeleteOptions {
            grace_period: Some(3),
            probe_exit_files: false,
            ..Default::default()
        })
        .await
        .expect("delete");
    let deaf = d.container("deaf").expect("deaf");
    assert_eq!(deaf.exit_code, 137, "{}", d.describe());
    assert_eq!(deaf.stop_timeout_secs, 3);
    let killed_ms = d.ms(deaf.finished_at_ns);
    assert!(
        (2500.0..6000.0).contains(&killed_ms),
        "killed at {killed_ms:.0} ms:\n{}",
        d.describe()
    );
    let sleepy = d.container("sleepy").expect("sleepy");
    let term_ms = d.ms(sleepy.term_ns.expect("TERM"));
    assert!(
        term_ms >= 990.0,
        "TERM at {term_ms:.0} ms, before the 1 s preStop sleep ended:\n{}",
        d.describe()
    );
    // The hook's whole second came off the grace period; the kubelet leaves at least 2 s.
    assert_eq!(sleepy.stop_timeout_secs, 2, "{}", d.describe());
    node.shutdown().await.expect("teardown");
}

#[tokio::test]
async fn what_cannot_run_here_is_refused_by_name() {
    let Some(node) = node().await else { return };
    let expect_err =
        |res: Result<exitorder_testbed::RunningPod, TestbedError>, needle: &str| match res {
            Ok(_) => panic!("ran; expected an error about {needle}"),
            Err(e) => assert!(e.to_string().contains(needle), "{e}"),
        };
    let base = |extra: &str| {
        pod(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: refused}}\nspec:\n  {extra}\n  containers:\n    - {{name: app, image: busybox:1.36, command: [sleep, '1']}}\n"
        ))
    };
    // No CNI: a pod off the node's network is refused unless asked to run there anyway.
    expect_err(
        node.run_pod(&base("dnsPolicy: ClusterFirst"), &opts())
            .await,
        "spec.hostNetwork",
    );
    let mut missing = base("hostNetwork: true");
    missing["spec"]["containers"][0]["image"] = "registry.example/nothing:1".into();
    expect_err(
        node.run_pod(&missing, &opts()).await,
        "registry.example/nothing:1",
    );
    let mut volume = base("hostNetwork: true");
    volume["spec"]["volumes"] = serde_json::json!([{"name": "v", "hostPath": {"path": "/nonexistent/exitorder", "type": "Directory"}}]);
    volume["spec"]["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "v", "mountPath": "/v"}]);
    expect_err(node.run_pod(&volume, &opts()).await, "volume \"v\"");
    let mut secret: Value = base("hostNetwork: true");
    secret["spec"]["volumes"] = serde_json::json!([{"name": "s", "secret": {"secretName": "x"}}]);
    expect_err(
        node.run_pod(&secret, &opts()).await,
        "spec.volumes[0].secret",
    );
    node.shutdown().await.expect("teardown");
}
