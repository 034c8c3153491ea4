use super::*;
use crate::decide::priority::Source;
use serde_json::json;

fn pod(annotations: Value, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
           "spec": spec})
}

fn run(p: &Value) -> Explanation {
    explain("Pod ns/p", p, &Options::default()).unwrap()
}

fn codes(e: &Explanation) -> Vec<&'static str> {
    e.warnings.iter().map(|w| w.code).collect()
}

fn member<'a>(e: &'a Explanation, name: &str) -> &'a Member {
    e.exit.members.iter().find(|m| m.name == name).unwrap()
}

fn shutdown_how(e: &Explanation) -> BTreeMap<&str, String> {
    e.job
        .steps
        .iter()
        .map(|s| (s.container.as_str(), s.how.to_string()))
        .collect()
}

const INJECT: &str = "exitorder.io/inject";
const PRIO: &str = "exitorder.io/container-exit-priority";

#[test]
fn an_injected_mesh_pod_is_ordered_and_warns_of_nothing() {
    let e = run(&pod(
        json!({INJECT: "true"}),
        json!({"containers": [{"name": "app", "image": "busybox"},
                              {"name": "linkerd-proxy", "image": "cr.l5d.io/linkerd/proxy:stable-2.14.10"}]}),
    ));
    assert!(matches!(&e.injection, Injection::Injected { changes, .. } if !changes.is_empty()));
    assert!(e.exit.ordered);
    let proxy = member(&e, "linkerd-proxy");
    assert_eq!(
        (proxy.priority, proxy.priority_from, proxy.preset.as_deref()),
        (1, Source::Preset, Some("linkerd-proxy"))
    );
    assert_eq!(proxy.waits_for, ["app"]);
    assert!(proxy.waits_in_prestop);
    assert!(member(&e, "app").waits_for.is_empty());
    assert_eq!(e.job.shutdown, Shutdown::Off);
    assert_eq!(
        (e.grace.grace_period_seconds, e.grace.release_by_seconds),
        (30, 25)
    );
    // Without the kubelet's configuration every kill of its own is bounded by the pod's grace.
    assert!(
        e.grace
            .kills
            .iter()
            .all(|k| (k.grace_period_seconds, k.release_by_seconds) == (30, 25)),
        "{:?}",
        e.grace.kills
    );
    assert_eq!(e.pod_security.profile, Profile::Baseline);
    assert!(e.warnings.is_empty(), "{:?}", e.warnings);
}

#[test]
fn a_pod_that_did_not_opt_in_is_not_ordered() {
    let e = run(&pod(
        json!({}),
        json!({"containers": [{"name": "app", "image": "a"}, {"name": "istio-proxy", "image": "b"}]}),
    ));
    assert!(matches!(e.injection, Injection::NotRequested));
    assert!(!e.exit.ordered);
    assert!(e.warnings.is_empty(), "{:?}", e.warnings);
    let text = text::render(&e);
    assert!(text.contains("not ordered"), "{text}");
}

#[test]
fn contradicting_priorities_are_refused_and_said() {
    // The main proxy would wait for a native sidecar the kubelet stops only after it.
    let e = run(&pod(
        json!({INJECT: "true", PRIO: r#"{"proxy": 2, "logs": 1}"#}),
        json!({"initContainers": [{"name": "logs", "image": "l", "restartPolicy": "Always"}],
               "containers": [{"name": "app", "image": "a"}, {"name": "proxy", "image": "p"}]}),
    ));
    assert!(matches!(&e.injection, Injection::Denied { reason } if reason.contains("logs")));
    assert!(
        codes(&e).contains(&"contradicting-priorities"),
        "{:?}",
        e.warnings
    );
    assert!(codes(&e).contains(&"denied"));
    assert_eq!(e.exit.native_stop_order, ["logs"]);
    // The same pod opted in by its priorities alone: not refused, but said.
    let e = run(&pod(
        json!({PRIO: r#"{"proxy": 2, "logs": 1}"#}),
        json!({"initContainers": [{"name": "logs", "image": "l", "restartPolicy": "Always"}],
               "containers": [{"name": "app", "image": "a"}, {"name": "proxy", "image": "p"}]}),
    ));
    assert_eq!(
        codes(&e),
        ["contradicting-priorities", "no-prestop", "no-prestop"]
    );
}

#[test]
fn native_sidecars_stop_in_reverse_declaration_order() {
    let e = run(&pod(
        json!({INJECT: "true"}),
        json!({"initContainers": [
                   {"name": "istio-proxy", "image": "istio/proxyv2", "restartPolicy": "Always"},
                   {"name": "vault-agent", "image": "hashicorp/vault", "restartPolicy": "Always"}],
               "containers": [{"name": "app", "image": "a"}]}),
    ));
    assert_eq!(e.exit.native_stop_order, ["vault-agent", "istio-proxy"]);
    assert_eq!(
        member(&e, "istio-proxy").priority_from,
        Source::NativeSidecar
    );
    assert!(e.warnings.is_empty(), "{:?}", e.warnings);
}

#[test]
fn a_sidecar_whose_prestop_cannot_wait_is_said() {
    let e = run(&pod(
        json!({INJECT: "true", PRIO: r#"{"proxy": 1}"#}),
        json!({"containers": [
            {"name": "app", "image": "a"},
            {"name": "proxy", "image": "p",
             "lifecycle": {"preStop": {"tcpSocket": {"port": 80}}}}]}),
    ));
    let c = codes(&e);
    assert!(c.contains(&"webhook"), "{:?}", e.warnings);
    assert!(c.contains(&"no-prestop"), "{:?}", e.warnings);
    assert!(!member(&e, "proxy").waits_in_prestop);
}

#[test]
fn a_bad_priority_annotation_is_said() {
    let e = run(&pod(
        json!({PRIO: "{not json"}),
        json!({"containers": [{"name": "app", "image": "a"}, {"name": "istio-proxy", "image": "b"}]}),
    ));
    assert_eq!(codes(&e), ["bad-annotation"]);
    // As the agent: the whole pod unordered.
    assert!(!e.exit.ordered);
    assert_eq!(member(&e, "istio-proxy").priority, 0);
    // A bad env, the same; and a Job's sidecars are left running.
    let e = run(&pod(
        json!({INJECT: "true"}),
        json!({"restartPolicy": "Never", "containers": [
            {"name": "app", "image": "a"},
            {"name": "istio-proxy", "image": "b", "env": [{"name": "EXITORDER_EXIT_PRIORITY", "value": "x"}]}]}),
    ));
    assert!(
        codes(&e).contains(&"bad-annotation") || codes(&e).contains(&"denied"),
        "{:?}",
        e.warnings
    );
    assert!(!e.exit.ordered);
    assert_eq!(e.job.shutdown, Shutdown::Off);
    assert!(e.job.steps.is_empty());
    // A bad shutdown annotation: stopped through the runtime.
    let e = run(&pod(
        json!({INJECT: "true", "exitorder.io/sidecar-shutdown": "[1]"}),
        json!({"restartPolicy": "Never", "containers": [
            {"name": "app", "image": "a"}, {"name": "istio-proxy", "image": "b"}]}),
    ));
    assert_eq!(codes(&e), ["bad-annotation"]);
    assert_eq!(
        shutdown_how(&e)["istio-proxy"],
        "POST http://127.0.0.1:15020/quitquitquit"
    );
}

#[test]
fn a_grace_period_within_the_reserve_is_said() {
    let e = run(&pod(
        json!({INJECT: "true"}),
        json!({"terminationGracePeriodSeconds": 5,
               "containers": [{"name": "app", "image": "a"}, {"name": "istio-proxy", "image": "b"}]}),
    ));
    assert_eq!(codes(&e), ["short-grace"]);
    // Held until the kubelet cuts the hook: the order kept while anything may run.
    assert_eq!(e.grace.release_by_seconds, 5);
    let e = run(&pod(
        json!({INJECT: "true"}),
        json!({"terminationGracePeriodSeconds": -3,
               "containers": [{"name": "app", "image": "a"}, {"name": "istio-proxy", "image": "b"}]}),
    ));
    // The kubelet gives at least a second.
    assert_eq!(e.grace.grace_period_seconds, 1);
}

#[test]
fn job_shutdown_by_preset_endpoint_runtime_stop_and_disabled_endpoints() {
    let spec = json!({"restartPolicy": "Never", "containers": [
        {"name": "app", "image": "a"},
        {"name": "linkerd-proxy", "image": "cr.l5d.io/linkerd/proxy:stable"},
        {"name": "sql", "image": "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2", "args": ["p:r:db"]},
        {"name": "daprd", "image": "daprio/daprd"},
        {"name": "fluent-bit", "image": "fluent/fluent-bit"},
        {"name": "vault-agent", "image": "hashicorp/vault"}],
        "initContainers": [{"name": "sql-native", "image": "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2",
                            "restartPolicy": "Always"}]});
    let e = run(&pod(json!({INJECT: "true"}), spec.clone()));
    assert_eq!(e.job.shutdown, Shutdown::On);
    let how = shutdown_how(&e);
    assert_eq!(how["daprd"], "POST http://127.0.0.1:3500/v1.0/shutdown");
    assert_eq!(how["linkerd-proxy"], "stop");
    // Known by image; without --quitquitquit the webhook writes no URL for it.
    assert_eq!(how["sql"], "stop");
    assert_eq!(how["fluent-bit"], "stop");
    // A native sidecar is the kubelet's to stop: its endpoint is not said to be missing.
    assert_eq!(how["sql-native"], "kubelet");
    assert_eq!(member(&e, "sql").priority_from, Source::Env);
    assert_eq!(member(&e, "linkerd-proxy").priority, 1);
    let disabled: Vec<&str> = e
        .warnings
        .iter()
        .filter(|w| w.code == "shutdown-disabled")
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(disabled.len(), 3, "{disabled:?}");
    assert!(disabled[0].contains("config.linkerd.io/proxy-admin-shutdown"));
    assert!(disabled[1].contains("--quitquitquit"));
    assert!(disabled[2].contains("vault.hashicorp.com/agent-enable-quit"));
    // Enabled: both shut down through their endpoints, nothing said.
    let mut spec = spec;
    spec["containers"][2]["args"] = json!(["--quitquitquit", "p:r:db"]);
    let e = run(&pod(
        json!({INJECT: "true", "config.linkerd.io/proxy-admin-shutdown": "enabled",
               "vault.hashicorp.com/agent-enable-quit": "true"}),
        spec,
    ));
    let how = shutdown_how(&e);
    assert_eq!(how["linkerd-proxy"], "POST http://127.0.0.1:4191/shutdown");
    assert_eq!(how["sql"], "POST http://127.0.0.1:9091/quitquitquit");
    assert_eq!(
        how["vault-agent"],
        "POST http://127.0.0.1:8200/agent/v1/quit"
    );
    // The other sidecars leave with the proxy: said, nothing else.
    assert_eq!(codes(&e), ["shared-level"]);
}

#[test]
fn a_sidecar_leaving_with_the_mesh_proxy_is_said() {
    let spec = json!({"containers": [
        {"name": "app", "image": "a"},
        {"name": "fluent-bit", "image": "f"},
        {"name": "linkerd-proxy", "image": "p"}]});
    let e = run(&pod(json!({INJECT: "true"}), spec.clone()));
    assert_eq!(codes(&e), ["shared-level"]);
    assert!(
        e.warnings[0]
            .message
            .contains(r#"'{"fluent-bit": 1, "linkerd-proxy": 2}'"#),
        "{:?}",
        e.warnings
    );
    // Ordered as the warning says: nothing to say, and the proxy waits for the shipper.
    let e = run(&pod(
        json!({INJECT: "true", PRIO: r#"{"fluent-bit": 1, "linkerd-proxy": 2}"#}),
        spec,
    ));
    assert!(e.warnings.is_empty(), "{:?}", e.warnings);
    assert_eq!(member(&e, "linkerd-proxy").waits_for, ["app", "fluent-bit"]);
}

#[test]
fn a_job_whose_sidecars_the_agent_cannot_shut_down_says_why() {
    // No main container: no work ends.
    let e = run(&pod(
        json!({INJECT: "true"}),
        json!({"restartPolicy": "Never", "containers": [
            {"name": "istio-proxy", "image": "p"}, {"name": "fluent-bit", "image": "f"}]}),
    ));
    assert_eq!(codes(&e), ["shared-level", "no-main-container"]);
    assert!(e.job.steps.is_empty());
    // A restart rule this build cannot read.
    let e = run(&pod(
        json!({INJECT: "true"}),
        json!({"restartPolicy": "Never", "containers": [
            {"name": "app", "image": "a", "restartPolicy": "Never", "restartPolicyRules": [
                {"action": "RestartLater", "exitCodes": {"operator": "In", "values": [1]}}]},
            {"name": "istio-proxy", "image": "p"}]}),
    ));
    assert!(
        codes(&e).contains(&"restart-rules-unreadable"),
        "{:?}",
        e.warnings
    );
    assert!(e.job.steps.is_empty());
    // Every such container is named, in the pod's order.
    let rule = json!([{"action": "RestartLater", "exitCodes": {"operator": "In", "values": [1]}}]);
    let e = run(&pod(
        json!({INJECT: "true"}),
        json!({"restartPolicy": "Never", "containers": [
            {"name": "zeta", "image": "a", "restartPolicy": "Never", "restartPolicyRules": rule},
            {"name": "alpha", "image": "a", "restartPolicy": "Never", "restartPolicyRules": rule},
            {"name": "istio-proxy", "image": "p"}]}),
    ));
    let message = &e
        .warnings
        .iter()
        .find(|w| w.code == "restart-rules-unreadable")
        .unwrap()
        .message;
    let (zeta, alpha) = (message.find("\"zeta\""), message.find("\"alpha\""));
    assert!(zeta.is_some() && zeta < alpha, "{message}");
}

#[test]
fn a_sidecar_whose_shutdown_restarts_the_pod_is_left_running() {
    let e = run(&pod(
        json!({INJECT: "true", PRIO: r#"{"proxy": 1}"#,
               "exitorder.io/terminate-sidecars-on-completion": "true"}),
        json!({"restartPolicy": "Never", "containers": [
            {"name": "app", "image": "a"},
            {"name": "proxy", "image": "p", "restartPolicy": "Never", "restartPolicyRules": [
                {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [143]}}]}]}),
    ));
    assert_eq!(e.job.steps.len(), 1);
    assert_eq!(e.job.steps[0].how, How::LeftRunning);
}

#[test]
fn a_job_that_opted_out_keeps_its_sidecars() {
    let e = run(&pod(
        json!({INJECT: "true", "exitorder.io/terminate-sidecars-on-completion": "false"}),
        json!({"restartPolicy": "OnFailure", "containers": [
            {"name": "app", "image": "a"}, {"name": "istio-proxy", "image": "p"}]}),
    ));
    assert_eq!(e.job.shutdown, Shutdown::OptedOut);
    assert!(e.job.steps.is_empty());
}

#[test]
fn pod_security_of_the_admitted_pod() {
    let restricted = json!({"runAsNonRoot": true, "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}});
    let spec = json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 1000},
        "containers": [
            {"name": "app", "image": "a", "securityContext": restricted},
            {"name": "istio-proxy", "image": "p", "securityContext": restricted}]});
    let e = run(&pod(json!({INJECT: "true"}), spec.clone()));
    assert_eq!(
        e.pod_security.profile,
        Profile::Restricted,
        "{:?}",
        e.pod_security
    );
    // The hostPath handshake takes it out of every profile but privileged.
    let options = Options {
        settings: Settings {
            handshake_volume: mutate::HandshakeVolume::HostPath,
            ..Settings::default()
        },
        ..Options::default()
    };
    let e = explain("Pod ns/p", &pod(json!({INJECT: "true"}), spec), &options).unwrap();
    assert_eq!(e.pod_security.profile, Profile::Privileged);
    assert_eq!(codes(&e), ["pod-security"]);
}

#[test]
fn workloads_and_several_documents() {
    let text = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  template:
    metadata:
      annotations: {exitorder.io/inject: "true"}
    spec:
      containers:
        - {name: app, image: a}
        - {name: daprd, image: daprio/daprd}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: app, image: a}]
"#;
    let all = explain_text(text, &Options::default()).unwrap();
    let objects: Vec<&str> = all.iter().map(|e| e.object.as_str()).collect();
    assert_eq!(objects, ["Deployment shop/web", "CronJob nightly"]);
    assert_eq!(member(&all[0], "daprd").waits_for, ["app"]);
    assert!(explain_text("kind: Service\nmetadata: {name: x}\n", &Options::default()).is_err());
    assert!(explain_text("", &Options::default()).is_err());
    assert!(explain_text("a: [", &Options::default()).is_err());
    let r = report(text, &Options::default(), true).unwrap();
    let v: Value = serde_json::from_str(&r.text).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(2));
    assert_eq!(v[0]["exit"]["members"][1]["priorityFrom"], "preset");
    assert!(!r.denied);
}

#[test]
fn text_output_escapes_control_characters() {
    let e = run(&pod(
        json!({PRIO: "{\"evil\\u001b[2J\": 1}"}),
        json!({"containers": [{"name": "app", "image": "a"}, {"name": "evil\u{1b}[2J", "image": "b"}]}),
    ));
    let text = text::render(&e);
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(text.contains("\\u{1b}[2J"), "{text}");
}

#[test]
fn the_job_words_in_json_are_the_ones_the_text_says() {
    let job = Job {
        shutdown: Shutdown::OptedOut,
        restart_policy: Some("Never".to_owned()),
        steps: [
            How::Post("http://127.0.0.1:4191/shutdown".to_owned()),
            How::Stop,
            How::LeftRunning,
            How::Kubelet,
        ]
        .into_iter()
        .map(|how| ShutdownStep {
            container: "c".to_owned(),
            priority: 1,
            how,
        })
        .collect(),
    };
    let steps = |how: &str| json!({"container": "c", "priority": 1, "how": how});
    assert_eq!(
        serde_json::to_value(&job).unwrap(),
        json!({"shutdown": "opted-out", "restartPolicy": "Never", "steps": [
            steps("POST http://127.0.0.1:4191/shutdown"), steps("stop"),
            steps("left running"), steps("kubelet")]})
    );
    assert_eq!(serde_json::to_value(Shutdown::Off).unwrap(), json!("off"));
    assert_eq!(serde_json::to_value(Shutdown::On).unwrap(), json!("on"));
}

#[test]
fn the_kubelets_own_kills_get_the_budget_its_configuration_gives() {
    let spec = json!({"containers": [{"name": "app", "image": "a"}, {"name": "linkerd-proxy", "image": "p"}]});
    let options = Options {
        kubelet: crate::kubelet::grace::KubeletConfig {
            eviction_max_pod_grace: Some(Duration::from_secs(10)),
            shutdown_regular_pods: Some(Duration::from_secs(20)),
            ..Default::default()
        },
        kubelet_version: Some((1, 35)),
        ..Options::default()
    };
    let e = explain("Pod ns/p", &pod(json!({INJECT: "true"}), spec), &options).unwrap();
    let kills: Vec<(&str, u64, u64)> = e
        .grace
        .kills
        .iter()
        .map(|k| {
            (
                k.kill.as_str(),
                k.grace_period_seconds,
                k.release_by_seconds,
            )
        })
        .collect();
    assert_eq!(
        kills,
        [
            ("eviction", 10, 5),
            ("node_shutdown", 20, 15),
            ("active_deadline", 30, 25),
            ("preemption", 30, 25),
        ]
    );
    let text = super::text::render(&e);
    assert!(
        text.contains("eviction 10 s (released by 5 s), node_shutdown 20 s"),
        "{text}"
    );
}

#[test]
fn an_unknown_kubelet_gets_the_longest_eviction_budget_any_version_gives() {
    let spec = json!({"terminationGracePeriodSeconds": 30,
        "containers": [{"name": "app", "image": "a"}, {"name": "linkerd-proxy", "image": "p"}]});
    let options = Options {
        kubelet: crate::kubelet::grace::KubeletConfig {
            eviction_max_pod_grace: Some(Duration::from_secs(10)),
            ..Default::default()
        },
        ..Options::default()
    };
    let e = explain("Pod ns/p", &pod(json!({INJECT: "true"}), spec), &options).unwrap();
    let eviction = e.grace.kills.iter().find(|k| k.kill == "eviction").unwrap();
    // Kubelets before 1.28 give the preStop the pod's own 30 s.
    assert_eq!(eviction.grace_period_seconds, 30);
}

#[test]
fn what_tells_a_restart_is_said() {
    let spec = json!({"containers": [
        {"name": "app", "image": "a"},
        {"name": "proxy", "image": "p"},
    ]});
    let annotations =
        json!({INJECT: "true", crate::decide::priority::ANNOTATION: r#"{"proxy": 1}"#});
    // Injected: the app marks, so the node tells a restart.
    let e = run(&pod(annotations, spec.clone()));
    assert_eq!(e.exit.restart_evidence, Some("others_silent"));
    assert!(
        !codes(&e).contains(&"restart-needs-event"),
        "{:?}",
        codes(&e)
    );
    assert!(e.exit.members.iter().all(|m| m.marks_when_stopped));
    // Written by hand, the app without `mark`: only the kubelet's Event tells it.
    let mut by_hand = spec;
    by_hand["containers"][1]["lifecycle"] = json!({"preStop": {"exec": {"command":
        ["/var/run/exitorder-bin/exitorder-entrypoint", "wait", "--timeout", "25s"]}}});
    let e = run(&pod(
        json!({crate::decide::priority::ANNOTATION: r#"{"proxy": 1}"#}),
        by_hand,
    ));
    assert_eq!(e.exit.restart_evidence, Some("kubelet_event"));
    assert!(
        codes(&e).contains(&"restart-needs-event"),
        "{:?}",
        codes(&e)
    );
    let text = super::text::render(&e);
    assert!(text.contains("only by the kubelet's Event"), "{text}");
}

#[test]
fn the_apps_wait_for_the_pods_endpoints_is_shown_with_its_bounds() {
    let e = run(&pod(
        json!({INJECT: "true", "exitorder.io/wait-for-endpoints": "true",
               "exitorder.io/endpoints-settle": "3s"}),
        json!({"containers": [{"name": "app", "image": "busybox"},
                              {"name": "linkerd-proxy", "image": "cr.l5d.io/linkerd/proxy:stable-2.14.10"}]}),
    ));
    let w = e.exit.endpoints.as_ref().expect("the endpoints wait");
    assert_eq!(w.apps, ["app"]);
    assert_eq!((w.settle_ms, w.max_wait_ms), (3000, 15_000));
    let text = text::render(&e);
    assert!(
        text.contains("endpoints first: app wait(s) until no EndpointSlice lists the pod as ready"),
        "{text}"
    );
    assert!(text.contains("3000 ms for its consumers"), "{text}");
    // Without the annotation, nothing is said; with a bad one, a warning.
    assert!(run(&pod(
        json!({INJECT: "true"}),
        json!({"containers": [{"name": "app", "image": "a"}]})
    ))
    .exit
    .endpoints
    .is_none());
    let bad = run(&pod(
        json!({INJECT: "true", "exitorder.io/wait-for-endpoints": "always"}),
        json!({"containers": [{"name": "app", "image": "a"}]}),
    ));
    assert!(
        codes(&bad).contains(&"bad-endpoints-annotation"),
        "{:?}",
        bad.warnings
    );
}
