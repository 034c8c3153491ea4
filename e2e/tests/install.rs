//! The install as users get it: the chart rendered by a real helm (lint, every runtime, the
//! schema, every object a valid Kubernetes object, RBAC exactly what the agent needs, the
//! admission webhook's objects and its generated certificate, the plain manifests in step
//! with the chart), and, on a real containerd, the chart's DaemonSet pod run from the
//! project's image (built by `scripts/image`), ordering the example pods.
//!
//! Needs helm (`. scripts/tools.sh && ensure_helm`), the `openssl` command line, the image
//! archive (`scripts/image`), root and `containerd runc busybox-static`; without them each
//! test prints "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are
//! mandatory.

use exitorder_e2e::support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use exitorder_testbed::install::{ChartAgent, ChartOptions, NAMESPACE};
use exitorder_testbed::kubelet::RunOptions;
use exitorder_testbed::manifest;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde_json::{json, Value};
use support::chart::{chart, count, helm, kind, render, set, typed};
use support::{example, skip_or_fail};

fn root() -> &'static Path {
    exitorder_e2e::repo()
}

/// Every rendered object is what the API server would accept as its kind (its k8s-openapi
/// type), and the kinds rendered are exactly `kinds`.
fn assert_valid_objects(docs: &[Value], kinds: &[&str]) {
    fn is<T: serde::de::DeserializeOwned>(d: &Value) -> bool {
        serde_json::from_value::<T>(d.clone()).is_ok()
    }
    let mut seen = BTreeSet::new();
    for d in docs {
        let k = d["kind"].as_str().unwrap_or_default();
        assert!(kinds.contains(&k), "unexpected object {k} rendered:\n{d}");
        let ok = match k {
            "DaemonSet" => is::<DaemonSet>(d),
            "ServiceAccount" => is::<ServiceAccount>(d),
            "ClusterRole" => is::<ClusterRole>(d),
            "ClusterRoleBinding" => is::<ClusterRoleBinding>(d),
            "Role" => is::<Role>(d),
            "RoleBinding" => is::<RoleBinding>(d),
            "Deployment" => is::<Deployment>(d),
            "Service" => is::<Service>(d),
            "PodDisruptionBudget" => is::<PodDisruptionBudget>(d),
            "MutatingWebhookConfiguration" => is::<MutatingWebhookConfiguration>(d),
            "ValidatingWebhookConfiguration" => is::<ValidatingWebhookConfiguration>(d),
            "Secret" => is::<Secret>(d),
            other => panic!("no type to check a {other} with"),
        };
        assert!(ok, "{k} does not deserialize:\n{d}");
        seen.insert(k);
    }
    assert_eq!(seen, kinds.iter().copied().collect::<BTreeSet<_>>());
}

/// The agent's objects: what the chart renders by default.
const AGENT_KINDS: &[&str] = &[
    "DaemonSet",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// The agent's objects and the webhook's, with its generated certificate.
const WEBHOOK_KINDS: &[&str] = &[
    "DaemonSet",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "MutatingWebhookConfiguration",
    "Secret",
];

const WEBHOOK: &[(&str, &str)] = &[("webhook.enabled", "true")];
/// The webhook's hostPath injection, which puts exit directories in the share: the share's
/// guard comes with it.
const HOSTPATH_WEBHOOK: &[(&str, &str)] = &[
    ("webhook.enabled", "true"),
    ("webhook.handshakeVolume", "hostPath"),
];
const CERT_MANAGER: &[(&str, &str)] = &[
    ("webhook.enabled", "true"),
    ("webhook.shareGuard.enabled", "true"),
    ("webhook.certManager.enabled", "true"),
];

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
        // Every object is what the API server would accept as its kind; the webhook's
        // with the agent's by default (the recommended install), the agent's alone without.
        assert_valid_objects(&docs, WEBHOOK_KINDS);
        let agent_only = render(&helm, &[("runtime", runtime), ("webhook.enabled", "false")]);
        assert_valid_objects(&agent_only, AGENT_KINDS);
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
    // The kubelet's pods, where pod-local exit directories are: by runtime, or as given,
    // mounted so that a tmpfs the kubelet mounts later is seen.
    for (values, root) in [
        (vec![], "/var/lib/kubelet"),
        (vec![("runtime", "k3s")], "/var/lib/kubelet"),
        (
            vec![("runtime", "microk8s")],
            "/var/snap/microk8s/common/var/lib/kubelet",
        ),
        (
            vec![("kubeletRootDir", "/var/lib/k0s/kubelet/")],
            "/var/lib/k0s/kubelet",
        ),
    ] {
        let docs = render(&helm, &values);
        let ds = kind(&docs, "DaemonSet");
        assert_eq!(env_of(ds, "EXITORDER_KUBELET_ROOT_DIR"), root, "{values:?}");
        let spec = &ds["spec"]["template"]["spec"];
        let pods = format!("{root}/pods");
        assert!(
            spec["volumes"]
                .as_array()
                .expect("volumes")
                .iter()
                .any(|v| v["name"] == "kubelet-pods"
                    && v["hostPath"]["path"] == pods.as_str()
                    && v["hostPath"]["type"] == "Directory"),
            "{values:?}"
        );
        let mount = spec["containers"][0]["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .find(|m| m["name"] == "kubelet-pods")
            .expect("the kubelet's pods mounted");
        assert_eq!(mount["mountPath"], pods.as_str());
        assert_eq!(mount["mountPropagation"], "HostToContainer");
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
    // The test bed weighs the agent by the chart's request, as the kubelet would.
    let cpu = c["resources"]["requests"]["cpu"]
        .as_str()
        .expect("a CPU request");
    assert_eq!(
        exitorder_testbed::kubelet::plan::millicores(cpu),
        Ok(exitorder_testbed::AGENT_CPU_REQUEST_MILLI)
    );
    let env = c["env"].as_array().expect("env");
    assert!(env
        .iter()
        .any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"));
}

#[test]
fn rbac_is_exactly_what_the_agent_needs() {
    let Some(helm) = helm() else { return };
    // The webhook's one read is the agents' DaemonSet (its rollout): an identity of its own,
    // bound to the agent's namespaced Role on that one object, and nothing cluster-wide.
    for (values, accounts) in [(&[("webhook.enabled", "false")][..], 1), (WEBHOOK, 2)] {
        let docs = render(&helm, values);
        assert_agent_rbac(&docs, accounts);
        for (k, n) in [
            ("Role", 1),
            ("RoleBinding", 1),
            ("ClusterRole", 1),
            ("ClusterRoleBinding", 1),
            ("ServiceAccount", accounts),
        ] {
            assert_eq!(count(&docs, k), n, "{values:?}: {k}");
        }
    }
    let docs = render(&helm, WEBHOOK);
    let deployment = kind(&docs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], true);
    let webhook_sa = pod["serviceAccountName"]
        .as_str()
        .expect("the webhook's account");
    assert!(
        docs.iter()
            .any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == webhook_sa),
        "{webhook_sa}"
    );
    let args = pod["containers"][0]["args"].as_array().expect("args");
    let at = args
        .iter()
        .position(|a| a == "--agent-daemonset")
        .expect("--agent-daemonset");
    let ds = kind(&docs, "DaemonSet");
    assert_eq!(
        args[at + 1].as_str(),
        Some(
            format!(
                "{NAMESPACE}/{}",
                ds["metadata"]["name"].as_str().unwrap_or("")
            )
            .as_str()
        )
    );
}

/// One ClusterRole with the agent's rules, bound to the agent's ServiceAccount only; the
/// namespaced Role on its DaemonSet bound to `accounts` accounts (the agent's, and the
/// webhook's when there is one).
fn assert_agent_rbac(docs: &[Value], accounts: usize) {
    let role: ClusterRole = typed(docs, "ClusterRole");
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
            (s(&[""]), s(&["pods"]), s(&["list", "watch"])),
            (s(&[""]), s(&["nodes"]), s(&["list", "watch"])),
            (s(&[""]), s(&["events"]), s(&["list"])),
            (
                s(&["discovery.k8s.io"]),
                s(&["endpointslices"]),
                s(&["list", "watch"])
            ),
            (s(&["events.k8s.io"]), s(&["events"]), s(&["create"])),
        ]
    );
    let binding: ClusterRoleBinding = typed(docs, "ClusterRoleBinding");
    let subjects = binding.subjects.expect("subjects");
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    let subject = &subjects[0];
    let sa = kind(docs, "ServiceAccount");
    assert_eq!(subject.kind, "ServiceAccount");
    assert_eq!(Some(subject.name.as_str()), sa["metadata"]["name"].as_str());
    assert_eq!(subject.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(
        kind(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"],
        sa["metadata"]["name"]
    );
    // In its own namespace, its own DaemonSet only: what tells an uninstall from a restart.
    let ds = kind(docs, "DaemonSet");
    let ds_name = ds["metadata"]["name"].as_str().expect("name");
    let role: Role = typed(docs, "Role");
    assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE));
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0].api_groups, Some(s(&["apps"])));
    assert_eq!(rules[0].resources, Some(s(&["daemonsets"])));
    assert_eq!(rules[0].resource_names, Some(s(&[ds_name])));
    assert_eq!(rules[0].verbs, s(&["get", "list", "watch"]));
    let binding: RoleBinding = typed(docs, "RoleBinding");
    let subjects = binding.subjects.expect("subjects");
    assert_eq!(subjects.len(), accounts, "{subjects:?}");
    assert_eq!(
        Some(subjects[0].name.as_str()),
        sa["metadata"]["name"].as_str()
    );
    assert_eq!(
        binding.role_ref.name,
        role.metadata.name.clone().unwrap_or_default()
    );
    let env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env");
    let named = format!("{NAMESPACE}/{ds_name}");
    assert!(
        env.iter()
            .any(|e| e["name"] == "EXITORDER_DAEMONSET" && e["value"] == named.as_str()),
        "{env:?}"
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
        ("webhook.timeoutSeconds", "30", "timeoutSeconds"),
        ("webhook.notAKey", "1", "notAKey"),
        ("webhook.replicas", "0", "replicas"),
        ("kubeletRootDir", "var/lib/kubelet", "kubeletRootDir"),
        ("webhook.handshakeVolume", "hostpath", "handshakeVolume"),
        (
            "webhook.certManager.issuerRef.kind",
            "ClusterIssuer",
            "issuerRef",
        ),
        ("image.digest", "latest", "digest"),
        ("prometheusRule.deadlineRatio", "2", "deadlineRatio"),
        ("grafanaDashboard.notAKey", "1", "notAKey"),
    ] {
        let err = helm
            .template(&chart(), NAMESPACE, &set(&[(key, value)]))
            .expect_err(&format!("{key}={value} rendered"))
            .to_string();
        assert!(err.contains(says), "{key}={value}: {err}");
    }
}

/// A pinned digest is what every image reference of the chart runs: the agent's, the
/// webhook's and the init container the webhook injects.
#[test]
fn a_pinned_digest_is_what_runs() {
    let Some(helm) = helm() else { return };
    let digest = format!("sha256:{}", "ab".repeat(32));
    let docs = render(
        &helm,
        &[
            ("image.digest", digest.as_str()),
            ("webhook.enabled", "true"),
        ],
    );
    let pinned = format!("ghcr.io/exitorder/exitorder@{digest}");
    assert_eq!(
        container(kind(&docs, "DaemonSet"), "agent")["image"],
        pinned.as_str()
    );
    let webhook = container(kind(&docs, "Deployment"), "webhook");
    assert_eq!(webhook["image"], pinned.as_str());
    let args: Vec<&str> = webhook["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--install-image")
        .expect("--install-image");
    assert_eq!(args.get(at + 1), Some(&pinned.as_str()), "{args:?}");
}

/// The container named `name` of a workload's pod template.
fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The Secret name of the webhook's `tls` volume.
fn tls_secret_of(deployment: &Value) -> String {
    deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "tls"))
        .and_then(|v| v["secret"]["secretName"].as_str())
        .expect("a tls volume from a Secret")
        .to_owned()
}

#[test]
fn the_webhook_chart_lints_and_renders() {
    let Some(helm) = helm() else { return };
    helm.lint(&chart(), &set(WEBHOOK))
        .unwrap_or_else(|e| panic!("{e}"));
    let docs = render(&helm, WEBHOOK);
    assert_valid_objects(&docs, WEBHOOK_KINDS);

    // Pod-local injection (the default) puts nothing in the share: no guard.
    assert_eq!(count(&docs, "ValidatingWebhookConfiguration"), 0);
    // The share's guard, with the hostPath injection: pods that may reach the share
    // writable, and every ephemeral container, failing closed for those only (which they
    // are: `share_guard.rs`).
    let hostpath = render(&helm, HOSTPATH_WEBHOOK);
    let vwc: ValidatingWebhookConfiguration = typed(&hostpath, "ValidatingWebhookConfiguration");
    let guard = &vwc.webhooks.expect("webhooks")[0];
    assert_eq!(guard.name, "share-guard.exitorder.io");
    assert_eq!(guard.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(guard.side_effects, "None");
    let svc = guard.client_config.service.as_ref().expect("service");
    assert_eq!(svc.path.as_deref(), Some("/validate"));
    let rule = &guard.rules.as_deref().expect("rules")[0];
    assert_eq!(
        rule.resources.as_deref(),
        Some(&["pods".to_owned(), "pods/ephemeralcontainers".to_owned()][..])
    );
    assert_eq!(
        rule.operations.as_deref(),
        Some(&["CREATE".to_owned(), "UPDATE".to_owned()][..])
    );
    let conditions = guard.match_conditions.as_deref().expect("matchConditions");
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    for (values, guards) in [
        (
            &[
                ("webhook.enabled", "true"),
                ("webhook.handshakeVolume", "hostPath"),
                ("webhook.shareGuard.enabled", "false"),
            ][..],
            0,
        ),
        (
            &[
                ("webhook.enabled", "true"),
                ("webhook.shareGuard.enabled", "true"),
            ][..],
            1,
        ),
    ] {
        let docs = render(&helm, values);
        assert_eq!(
            count(&docs, "ValidatingWebhookConfiguration"),
            guards,
            "{values:?}"
        );
    }

    // The configuration: pod creations, never blocking them, called again after other
    // injectors, through the rendered Service.
    let mwc: MutatingWebhookConfiguration = typed(&docs, "MutatingWebhookConfiguration");
    let hooks = mwc.webhooks.expect("webhooks");
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    let hook = &hooks[0];
    assert_eq!(hook.name, "inject.exitorder.io");
    assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(hook.reinvocation_policy.as_deref(), Some("IfNeeded"));
    assert_eq!(hook.side_effects, "None");
    assert_eq!(hook.match_policy.as_deref(), Some("Equivalent"));
    assert!(
        hook.timeout_seconds.is_some_and(|t| (1..=10).contains(&t)),
        "{:?}",
        hook.timeout_seconds
    );
    assert_eq!(hook.admission_review_versions, ["v1"]);
    let rules = hook.rules.as_deref().expect("rules");
    assert_eq!(rules.len(), 1, "{rules:?}");
    let rule = &rules[0];
    assert_eq!(rule.operations.as_deref(), Some(&["CREATE".to_owned()][..]));
    assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(rule.api_versions.as_deref(), Some(&["v1".to_owned()][..]));
    assert_eq!(rule.resources.as_deref(), Some(&["pods".to_owned()][..]));
    assert_eq!(rule.scope.as_deref(), Some("Namespaced"));
    let excluded = |hook: &k8s_openapi::api::admissionregistration::v1::MutatingWebhook| {
        hook.namespace_selector
            .as_ref()
            .and_then(|s| s.match_expressions.as_ref())
            .into_iter()
            .flatten()
            .filter(|e| e.key == "kubernetes.io/metadata.name" && e.operator == "NotIn")
            .flat_map(|e| e.values.clone().unwrap_or_default())
            .collect::<BTreeSet<String>>()
    };
    let skipped = excluded(hook);
    assert!(
        skipped.contains("kube-system") && skipped.contains(NAMESPACE),
        "{skipped:?}"
    );
    let service_ref = hook.client_config.service.as_ref().expect("a service");
    assert_eq!(service_ref.path.as_deref(), Some("/mutate"));
    assert_eq!(service_ref.port, Some(443));
    assert_eq!(service_ref.namespace, NAMESPACE);
    assert!(hook.client_config.ca_bundle.is_some());
    let svc = kind(&docs, "Service");
    assert_eq!(svc["metadata"]["name"], service_ref.name.as_str());
    assert_eq!(svc["metadata"]["namespace"], NAMESPACE);
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "https");

    // The Deployment: `exitorder webhook` with the mounted certificate, two replicas, HTTPS
    // probes on the `https` port, least privilege.
    let deploy = kind(&docs, "Deployment");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let c = container(deploy, "webhook");
    let argv: Vec<&str> = [&c["command"], &c["args"]]
        .into_iter()
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(argv.contains(&"webhook"), "{argv:?}");
    for pair in [
        ["--cert", "/etc/exitorder/tls/tls.crt"],
        ["--key", "/etc/exitorder/tls/tls.key"],
        ["--addr", "0.0.0.0:8443"],
        ["--share-dir", "/var/lib/exitorder"],
        ["--grace-reserve", "5s"],
        ["--handshake-volume", "emptyDir"],
        // The init container it injects runs this chart's own image, which is what the
        // webhook names by default.
        ["--install-image", exitorder::webhook::DEFAULT_INSTALL_IMAGE],
    ] {
        assert!(argv.windows(2).any(|w| w == pair), "{pair:?} in {argv:?}");
    }
    assert_eq!(c["image"], exitorder::webhook::DEFAULT_INSTALL_IMAGE);
    let docs_share = render(
        &helm,
        &[
            ("webhook.enabled", "true"),
            ("webhook.handshakeVolume", "hostPath"),
        ],
    );
    let c_share = container(kind(&docs_share, "Deployment"), "webhook");
    assert!(c_share["args"].as_array().is_some_and(|a| a
        .windows(2)
        .any(|w| w[0] == "--handshake-volume" && w[1] == "hostPath")));
    assert_eq!(c["ports"][0]["name"], "https");
    assert_eq!(c["ports"][0]["containerPort"], 8443);
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["scheme"], "HTTPS", "{probe}");
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], "https", "{probe}");
    }
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    let mount = c["volumeMounts"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == "tls"))
        .expect("the tls mount");
    assert_eq!(mount["mountPath"], "/etc/exitorder/tls");
    assert_eq!(mount["readOnly"], true);
    assert_eq!(
        kind(&docs, "Secret")["metadata"]["name"],
        tls_secret_of(deploy).as_str()
    );

    // The Service and the PodDisruptionBudget select the Deployment's pods, and only them
    // (not the agent's).
    let pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("pod labels");
    let agent_labels = kind(&docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("agent pod labels");
    let pdb = kind(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    for selector in [
        &pdb["spec"]["selector"]["matchLabels"],
        &svc["spec"]["selector"],
        &deploy["spec"]["selector"]["matchLabels"],
    ] {
        let selector = selector.as_object().expect("a selector");
        assert!(!selector.is_empty());
        assert!(
            selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "{selector:?} does not select {pod_labels:?}"
        );
        assert!(
            !selector.iter().all(|(k, v)| agent_labels.get(k) == Some(v)),
            "{selector:?} selects the agent's pods"
        );
    }

    // One replica: no PodDisruptionBudget (it would block every drain of its node).
    let docs = render(
        &helm,
        &[("webhook.enabled", "true"), ("webhook.replicas", "1")],
    );
    assert_eq!(count(&docs, "PodDisruptionBudget"), 0);

    // The release's namespace is what is skipped, whichever it is.
    let text = helm
        .template(&chart(), "sidecars-system", &set(WEBHOOK))
        .unwrap_or_else(|e| panic!("{e}"));
    let docs = manifest::documents(&text).unwrap_or_else(|e| panic!("{e}"));
    let mwc: MutatingWebhookConfiguration = typed(&docs, "MutatingWebhookConfiguration");
    let skipped = excluded(&mwc.webhooks.expect("webhooks")[0]);
    assert!(skipped.contains("sidecars-system"), "{skipped:?}");
}

/// `openssl ARGS` in `dir`: whether it succeeded, and its stdout and stderr.
fn openssl(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn have_openssl() -> bool {
    Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The generated certificate, key and CA (PEM) of a render, and the Service's name.
struct GeneratedTls {
    crt: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
    service: String,
}

fn generated_tls(docs: &[Value]) -> GeneratedTls {
    let secret: Secret = typed(docs, "Secret");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.expect("data");
    let get = |k: &str| {
        data.get(k)
            .unwrap_or_else(|| panic!("no {k} in the Secret"))
            .0
            .clone()
    };
    let mwc: MutatingWebhookConfiguration = typed(docs, "MutatingWebhookConfiguration");
    let bundle = mwc.webhooks.expect("webhooks")[0]
        .client_config
        .ca_bundle
        .clone()
        .expect("a caBundle")
        .0;
    let ca = get("ca.crt");
    assert_eq!(bundle, ca, "the caBundle is not the Secret's ca.crt");
    let service: Service = typed(docs, "Service");
    GeneratedTls {
        crt: get("tls.crt"),
        key: get("tls.key"),
        ca,
        service: service.metadata.name.expect("a Service name"),
    }
}

#[test]
fn the_generated_certificate_is_valid_for_the_service() {
    let Some(helm) = helm() else { return };
    if !have_openssl() {
        skip_or_fail("the certificate test needs the openssl command line (Debian: openssl)");
        return;
    }
    let tls = generated_tls(&render(&helm, WEBHOOK));
    let dir = tempfile::tempdir().expect("a temp dir");
    for (file, pem) in [
        ("ca.pem", &tls.ca),
        ("crt.pem", &tls.crt),
        ("key.pem", &tls.key),
    ] {
        std::fs::write(dir.path().join(file), pem).expect("write a PEM file");
    }
    // Signed by the caBundle's CA, for a TLS server.
    let (ok, out) = openssl(
        dir.path(),
        &[
            "verify",
            "-purpose",
            "sslserver",
            "-CAfile",
            "ca.pem",
            "crt.pem",
        ],
    );
    assert!(ok && out.contains("crt.pem: OK"), "{out}");
    // For every name of the Service, among them the one the API server calls.
    let (ok, out) = openssl(
        dir.path(),
        &["x509", "-in", "crt.pem", "-noout", "-ext", "subjectAltName"],
    );
    assert!(ok, "{out}");
    let names: BTreeSet<&str> = out
        .split([',', '\n'])
        .filter_map(|n| n.trim().strip_prefix("DNS:"))
        .collect();
    let svc = &tls.service;
    for name in [
        svc.clone(),
        format!("{svc}.{NAMESPACE}"),
        format!("{svc}.{NAMESPACE}.svc"),
        format!("{svc}.{NAMESPACE}.svc.cluster.local"),
    ] {
        assert!(names.contains(name.as_str()), "{name} not in {names:?}");
    }
    // The key is the certificate's.
    let (ok, from_crt) = openssl(dir.path(), &["x509", "-in", "crt.pem", "-noout", "-pubkey"]);
    assert!(ok, "{from_crt}");
    let (ok, from_key) = openssl(dir.path(), &["pkey", "-in", "key.pem", "-pubout"]);
    assert!(ok, "{from_key}");
    assert_eq!(from_crt, from_key, "tls.key is not tls.crt's key");
    // Valid webhook.certValidityDays (3650 by default): still valid in 3600 days.
    let (ok, out) = openssl(
        dir.path(),
        &[
            "x509",
            "-in",
            "crt.pem",
            "-noout",
            "-checkend",
            &(3600 * 86400).to_string(),
        ],
    );
    assert!(ok, "the certificate ends within 3600 days: {out}");

    // A shorter validity is the one given.
    let tls = generated_tls(&render(
        &helm,
        &[
            ("webhook.enabled", "true"),
            ("webhook.certValidityDays", "30"),
        ],
    ));
    std::fs::write(dir.path().join("short.pem"), &tls.crt).expect("write a PEM file");
    let (ok, out) = openssl(
        dir.path(),
        &[
            "x509",
            "-in",
            "short.pem",
            "-noout",
            "-checkend",
            &(31 * 86400).to_string(),
        ],
    );
    assert!(!ok, "a 30-day certificate is still valid in 31 days: {out}");
}

#[test]
fn the_webhook_certificate_can_come_from_cert_manager() {
    let Some(helm) = helm() else { return };
    helm.lint(&chart(), &set(CERT_MANAGER))
        .unwrap_or_else(|e| panic!("{e}"));
    let docs = render(&helm, CERT_MANAGER);
    // No Secret of the chart's: cert-manager writes it.
    assert_eq!(count(&docs, "Secret"), 0);
    let deploy = kind(&docs, "Deployment");
    let svc = kind(&docs, "Service")["metadata"]["name"]
        .as_str()
        .expect("a Service name")
        .to_owned();

    // The configuration names the serving Certificate for cert-manager's CA injector, and has
    // no caBundle of its own.
    let mwc = kind(&docs, "MutatingWebhookConfiguration");
    serde_json::from_value::<MutatingWebhookConfiguration>(mwc.clone())
        .expect("a MutatingWebhookConfiguration");
    let inject = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .expect("the inject-ca-from annotation");
    let (ns, cert_name) = inject.split_once('/').expect("<namespace>/<certificate>");
    assert_eq!(ns, NAMESPACE);
    assert!(
        mwc["webhooks"][0]["clientConfig"].get("caBundle").is_none(),
        "{mwc}"
    );
    // The guard's too.
    let vwc = kind(&docs, "ValidatingWebhookConfiguration");
    assert_eq!(
        vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        inject
    );
    assert!(vwc["webhooks"][0]["clientConfig"].get("caBundle").is_none());

    // The serving Certificate: into the Secret the Deployment mounts, for the Service's names.
    let serving = manifest::find(&docs, "Certificate", Some(cert_name))
        .unwrap_or_else(|| panic!("no Certificate {cert_name}"));
    assert_eq!(serving["apiVersion"], "cert-manager.io/v1");
    assert_eq!(serving["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        serving["spec"]["secretName"],
        tls_secret_of(deploy).as_str()
    );
    let dns: Vec<&str> = serving["spec"]["dnsNames"]
        .as_array()
        .expect("dnsNames")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        dns.contains(&format!("{svc}.{NAMESPACE}.svc").as_str()),
        "{dns:?}"
    );

    // Signed by the chart's CA Issuer, whose CA Certificate the self-signed Issuer signs.
    assert_eq!(count(&docs, "Certificate"), 2);
    assert_eq!(count(&docs, "Issuer"), 2);
    let issuer_of = |cert: &Value| {
        let r = &cert["spec"]["issuerRef"];
        assert_eq!(r["kind"], "Issuer", "{cert}");
        let name = r["name"].as_str().expect("an issuer name");
        manifest::find(&docs, "Issuer", Some(name))
            .unwrap_or_else(|| panic!("no Issuer {name}"))
            .clone()
    };
    let ca_issuer = issuer_of(serving);
    let ca_secret = ca_issuer["spec"]["ca"]["secretName"]
        .as_str()
        .expect("a CA Issuer");
    let ca_cert = docs
        .iter()
        .find(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == ca_secret)
        .expect("the CA Certificate");
    assert_eq!(ca_cert["spec"]["isCA"], true);
    assert_eq!(issuer_of(ca_cert)["spec"]["selfSigned"], json!({}));

    // An issuer of the user's: only the serving Certificate, signed by it.
    let docs = render(
        &helm,
        &[
            ("webhook.enabled", "true"),
            ("webhook.certManager.enabled", "true"),
            ("webhook.certManager.issuerRef.name", "corp-ca"),
            ("webhook.certManager.issuerRef.kind", "ClusterIssuer"),
        ],
    );
    assert_eq!(count(&docs, "Issuer"), 0);
    assert_eq!(count(&docs, "Certificate"), 1);
    assert_eq!(count(&docs, "Secret"), 0);
    assert_eq!(
        kind(&docs, "Certificate")["spec"]["issuerRef"],
        json!({"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "corp-ca"})
    );
}

#[test]
fn the_plain_manifests_are_the_chart_rendered() {
    let Some(helm) = helm() else { return };
    let file = root().join("deploy/manifests/exitorder.yaml");
    let text = std::fs::read_to_string(&file).expect("deploy/manifests/exitorder.yaml");
    let docs = manifest::documents(&text).expect("valid YAML");
    let ns: Namespace = serde_json::from_value(docs[0].clone()).expect("a Namespace first");
    assert_eq!(ns.metadata.name.as_deref(), Some(NAMESPACE));
    let rendered = render(&helm, &[("webhook.enabled", "false")]);
    assert_eq!(
        &docs[1..],
        &rendered[..],
        "deploy/manifests/exitorder.yaml drifted from the chart: run scripts/manifests"
    );
}

#[tokio::test]
async fn the_charts_agent_from_the_image_orders_the_examples() {
    let Some(helm) = helm() else { return };
    let Some(image) = support::project_image_archive().await else {
        return;
    };
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let opts = ChartOptions {
        helm,
        chart: chart(),
        image,
        metrics_port: exitorder_e2e::support::killbed::free_port(),
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
    // hostPID (agent.kernelExitSource): each container's exit is also seen from the kernel.
    agent
        .wait_for("the kernel exit source", Duration::from_secs(10), |l| {
            l.is("kernel_source", &[("source", "pidfd")])
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
            support::assert_reason_ordered(&allow, name);
        }
        assert!(
            d.containers.iter().all(|c| c.exit_code == 0),
            "{}",
            d.describe()
        );
    }
    // The node's cgroups, mounted read-only by the chart, told that no container the agent
    // had not heard of ran in the stopping pods: settled without listing the runtime.
    let (_, text) =
        support::http_get(&format!("127.0.0.1:{}", opts.metrics_port), "/metrics").await;
    let settled = support::parse_metrics(&text)
        .into_iter()
        .find(|(s, _)| s == "exitorder_pods_settled_by_cgroup_total")
        .map_or(0.0, |(_, v)| v);
    assert!(settled >= 2.0, "pods settled by their cgroup: {settled}");
    // The agent's own mounts of the share and of the kubelet's pods are how it serves them:
    // never reported as a breach (the chart gives it its pod's UID).
    assert!(
        !agent.lines().iter().any(|l| l.is("share_breach", &[])),
        "the agent reported its own mounts"
    );
    agent.pod.delete().await.expect("delete the agent");
    node.shutdown().await.expect("teardown");
}

#[tokio::test]
async fn the_demo_installs_the_agent_from_the_chart() {
    use exitorder_testbed::demo::{demo, DemoArgs};
    use exitorder_testbed::verdict::Verdict;
    let Some(_helm) = helm() else { return };
    let Some(image) = support::project_image_archive().await else {
        return;
    };
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    node.shutdown().await.expect("probe node teardown");
    let args = DemoArgs {
        pod: None,
        inject: None,
        image: Vec::new(),
        host_network: true,
        grace_period: None,
        kill: exitorder_testbed::demo::DemoKill::Deletion,
        ready_timeout: Duration::from_secs(60),
        complete_timeout: Duration::from_secs(120),
        without_agent: false,
        traffic: false,
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
