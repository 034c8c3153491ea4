//! The install as users get it: the chart rendered by a real helm (lint, every runtime, the
//! schema, every object a valid Kubernetes object, RBAC exactly what the agent needs, the
//! plain manifests in step with the chart), and, on a real containerd, the chart's DaemonSet
//! pod run from the project's image (built by `scripts/image`), ordering the example pods.
//!
//! Needs helm (`. scripts/tools.sh && ensure_helm`), the image archive (`scripts/image`),
//! root and `containerd runc busybox-static`; without them each test prints "SKIPPED:
//! <reason>" and passes, except in CI (`CI` set), where they are mandatory.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use exitorder_testbed::install::{
    ChartAgent, ChartOptions, Helm, CHART_IN_TREE, IMAGE_IN_TREE, NAMESPACE,
};
use exitorder_testbed::kubelet::RunOptions;
use exitorder_testbed::manifest;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::{json, Value};
use support::{example, skip_or_fail};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    root().join(CHART_IN_TREE)
}

fn helm() -> Option<Helm> {
    match Helm::find(root()) {
        Ok(h) => Some(h),
        Err(e) => {
            skip_or_fail(&format!("the chart tests need helm: {e}"));
            None
        }
    }
}

fn set(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn render(helm: &Helm, values: &[(&str, &str)]) -> Vec<Value> {
    let text = helm
        .template(&chart(), NAMESPACE, &set(values))
        .unwrap_or_else(|e| panic!("{e}"));
    manifest::documents(&text).unwrap_or_else(|e| panic!("{e}"))
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    manifest::find(docs, kind, None).unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn env_of(ds: &Value, name: &str) -> String {
    ds.pointer("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array)
        .and_then(|env| env.iter().find(|e| e["name"] == name))
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("no env {name}"))
        .to_owned()
}

#[test]
fn the_chart_lints_and_renders_valid_objects_for_every_runtime() {
    let Some(helm) = helm() else { return };
    helm.lint(&chart(), &[]).unwrap_or_else(|e| panic!("{e}"));
    helm.lint(&chart(), &set(&[("podMonitor.enabled", "true")]))
        .unwrap_or_else(|e| panic!("{e}"));
    for (runtime, socket) in [
        ("containerd", "/run/containerd/containerd.sock"),
        ("crio", "/var/run/crio/crio.sock"),
        ("k3s", "/run/k3s/containerd/containerd.sock"),
        ("rke2", "/run/k3s/containerd/containerd.sock"),
        ("microk8s", "/var/snap/microk8s/common/run/containerd.sock"),
    ] {
        let docs = render(&helm, &[("runtime", runtime)]);
        let ds = kind(&docs, "DaemonSet");
        // The socket's directory is what is mounted; the agent is told the socket inside.
        let (dir, file) = socket.rsplit_once('/').expect("a path");
        let volumes = ds["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes");
        assert!(
            volumes.iter().any(|v| v["hostPath"]["path"] == dir),
            "{runtime}: {volumes:?}"
        );
        assert!(env_of(ds, "EXITORDER_CRI_SOCKET").ends_with(&format!("/{file}")));
        // Every object is what the API server would accept as its kind.
        for d in &docs {
            let k = d["kind"].as_str().unwrap_or_default();
            let ok = match k {
                "DaemonSet" => serde_json::from_value::<DaemonSet>(d.clone()).is_ok(),
                "ServiceAccount" => serde_json::from_value::<ServiceAccount>(d.clone()).is_ok(),
                "ClusterRole" => serde_json::from_value::<ClusterRole>(d.clone()).is_ok(),
                "ClusterRoleBinding" => {
                    serde_json::from_value::<ClusterRoleBinding>(d.clone()).is_ok()
                }
                other => panic!("unexpected object {other} rendered by default"),
            };
            assert!(ok, "{k} does not deserialize:\n{d}");
        }
        // And its pod runs on a node: the runner accepts every field it has.
        let place = exitorder_testbed::kubelet::plan::Placement {
            uid: exitorder_testbed::random_uuid(),
            node_name: "n".into(),
            host_ip: "127.0.0.1".into(),
            force_host_network: false,
            name_suffix: "x".into(),
        };
        let pod = manifest::pod_of(ds).expect("a pod template");
        exitorder_testbed::kubelet::plan::plan(&pod, &place).unwrap_or_else(|e| panic!("{e}"));
    }
    let docs = render(&helm, &[("podMonitor.enabled", "true")]);
    let pm = kind(&docs, "PodMonitor");
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
    let docs = render(
        &helm,
        &[
            ("criSocket", "unix:///tmp/x/y/cri.sock"),
            ("shareDir", "/tmp/share"),
        ],
    );
    let ds = kind(&docs, "DaemonSet");
    assert_eq!(env_of(ds, "EXITORDER_SHARE_DIR"), "/tmp/share");
    assert!(ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .any(|v| v["hostPath"]["path"] == "/tmp/x/y"));
}

#[test]
fn the_daemonset_runs_with_the_least_privilege_that_works() {
    let Some(helm) = helm() else { return };
    let docs = render(&helm, &[]);
    let spec = &kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["capabilities"]["add"], json!(["DAC_OVERRIDE"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    assert_eq!(spec["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["ports"][0]["name"], "metrics");
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert!(c["resources"]["requests"]["cpu"].is_string());
    let env = c["env"].as_array().expect("env");
    assert!(env
        .iter()
        .any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"));
}

#[test]
fn rbac_is_exactly_what_the_agent_needs() {
    let Some(helm) = helm() else { return };
    let docs = render(&helm, &[]);
    let role: ClusterRole =
        serde_json::from_value(kind(&docs, "ClusterRole").clone()).expect("a ClusterRole");
    let rules: Vec<(Vec<String>, Vec<String>, Vec<String>)> = role
        .rules
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            (
                r.api_groups.unwrap_or_default(),
                r.resources.unwrap_or_default(),
                r.verbs,
            )
        })
        .collect();
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        rules,
        vec![
            (s(&[""]), s(&["pods"]), s(&["get", "list", "watch"])),
            (s(&["events.k8s.io"]), s(&["events"]), s(&["create"])),
        ]
    );
    let binding: ClusterRoleBinding =
        serde_json::from_value(kind(&docs, "ClusterRoleBinding").clone())
            .expect("a ClusterRoleBinding");
    let subject = &binding.subjects.expect("subjects")[0];
    let sa = kind(&docs, "ServiceAccount");
    assert_eq!(subject.kind, "ServiceAccount");
    assert_eq!(Some(subject.name.as_str()), sa["metadata"]["name"].as_str());
    assert_eq!(subject.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(
        kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"],
        sa["metadata"]["name"]
    );
}

#[test]
fn the_schema_refuses_bad_values_by_name() {
    let Some(helm) = helm() else { return };
    for (key, value, says) in [
        ("runtime", "docker", "runtime"),
        ("metrics.port", "notanumber", "metrics.port"),
        ("agent.logFormat", "xml", "logFormat"),
        ("notAValue", "1", "notAValue"),
    ] {
        let err = helm
            .template(&chart(), NAMESPACE, &set(&[(key, value)]))
            .expect_err(&format!("{key}={value} rendered"))
            .to_string();
        assert!(err.contains(says), "{key}={value}: {err}");
    }
}

#[test]
fn the_plain_manifests_are_the_chart_rendered() {
    let Some(helm) = helm() else { return };
    let file = root().join("deploy/manifests/exitorder.yaml");
    let text = std::fs::read_to_string(&file).expect("deploy/manifests/exitorder.yaml");
    let docs = manifest::documents(&text).expect("valid YAML");
    let ns: Namespace = serde_json::from_value(docs[0].clone()).expect("a Namespace first");
    assert_eq!(ns.metadata.name.as_deref(), Some(NAMESPACE));
    let rendered = render(&helm, &[]);
    assert_eq!(
        &docs[1..],
        &rendered[..],
        "deploy/manifests/exitorder.yaml drifted from the chart: run scripts/manifests"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[tokio::test]
async fn the_charts_agent_from_the_image_orders_the_examples() {
    let Some(helm) = helm() else { return };
    let image = root().join(IMAGE_IN_TREE);
    if !image.is_file() {
        skip_or_fail(&format!(
            "the install test needs the image archive {} (scripts/image)",
            image.display()
        ));
        return;
    }
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let opts = ChartOptions {
        helm,
        chart: chart(),
        image,
        metrics_port: free_port(),
        values: Vec::new(),
        ready_timeout: Duration::from_secs(60),
    };
    let agent = ChartAgent::install(&node, &opts)
        .await
        .unwrap_or_else(|e| panic!("the chart's agent did not become ready: {e}"));
    let ready = agent.pod.status();
    let image_name = agent.pod.plan().containers[0].image.clone();
    assert!(
        image_name.starts_with("ghcr.io/exitorder/exitorder:"),
        "{image_name}"
    );
    assert!(ready.ready());
    agent
        .wait_for("entrypoint installed", Duration::from_secs(10), |l| {
            l.says("entrypoint installed", &[])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    agent
        .wait_for("containerd events", Duration::from_secs(10), |l| {
            l.says("exit source connected", &[("source", "containerd_events")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let run = RunOptions {
        force_host_network: true,
        ..RunOptions::default()
    };
    for (name, order) in [
        ("two-level", vec!["app", "proxy"]),
        ("three-level", vec!["app", "proxy", "log-shipper"]),
    ] {
        let running = node
            .run_pod(&example(name), &run)
            .await
            .expect("run example");
        running
            .wait_ready(Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let uid = running.uid().to_owned();
        let d = running.delete().await.expect("delete example");
        eprintln!("--- {name} ---\n{}", d.describe());
        assert_eq!(d.exit_order(), order, "{name}:\n{}", d.describe());
        for sidecar in &order[1..] {
            let allow = agent
                .wait_for("the allow", Duration::from_secs(10), |l| {
                    l.is("allow", &[("pod", &uid), ("container", sidecar)])
                })
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(allow.field("reason").as_deref(), Some("ordered"), "{name}");
        }
        assert!(
            d.containers.iter().all(|c| c.exit_code == 0),
            "{}",
            d.describe()
        );
    }
    agent.pod.delete().await.expect("delete the agent");
    node.shutdown().await.expect("teardown");
}

#[tokio::test]
async fn the_demo_installs_the_agent_from_the_chart() {
    use exitorder_testbed::demo::{demo, DemoArgs};
    use exitorder_testbed::verdict::Verdict;
    let Some(_helm) = helm() else { return };
    let image = root().join(IMAGE_IN_TREE);
    if !image.is_file() {
        skip_or_fail(&format!(
            "the demo's chart mode needs {} (scripts/image)",
            image.display()
        ));
        return;
    }
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    node.shutdown().await.expect("probe node teardown");
    let args = DemoArgs {
        pod: None,
        image: Vec::new(),
        host_network: true,
        grace_period: None,
        ready_timeout: Duration::from_secs(60),
        without_agent: false,
        json: true,
        binaries: Default::default(),
        chart: Some(chart()),
        agent_image: image,
    };
    let mut lines = Vec::new();
    let report = demo(&args, &mut |l| lines.push(l.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("demo failed: {e:#}"));
    let text = lines.join("\n");
    assert!(text.contains("Installed the agent from"), "{text}");
    assert_eq!(
        report.containers["proxy"].verdict,
        Verdict::Ordered,
        "{text}"
    );
}
