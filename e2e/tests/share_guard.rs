//! Which pods the share's guard depends on: its webhook configuration's `matchConditions`,
//! rendered by a real helm, evaluated with a CEL interpreter as the API server evaluates them.
//! Only a pod with a container that mounts writable a hostPath that may reach the share or
//! the bin directory is ever sent; every pod not sent is one the guard itself would admit;
//! and with the webhook down a node-exporter-like DaemonSet pod is admitted under every
//! install the chart offers by default.
//!
//! Needs helm (`. scripts/tools.sh && ensure_helm`); without it each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use cel_interpreter::{Context, Program};
use exitorder_e2e::support::chart::{count, helm, render};
use serde_json::{json, Value};

const SHARE: &str = "/var/lib/exitorder";
const BIN: &str = "/var/lib/exitorder-bin";

const HOSTPATH_WEBHOOK: &[(&str, &str)] = &[
    ("webhook.enabled", "true"),
    ("webhook.handshakeVolume", "hostPath"),
];

/// Every webhook of every admission configuration rendered: (its configuration's kind, the
/// webhook).
fn webhooks(docs: &[Value]) -> Vec<(String, Value)> {
    docs.iter()
        .filter(|d| {
            d["kind"] == "MutatingWebhookConfiguration"
                || d["kind"] == "ValidatingWebhookConfiguration"
        })
        .flat_map(|d| {
            let k = d["kind"].as_str().unwrap_or_default().to_owned();
            d["webhooks"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |w| (k.clone(), w))
        })
        .collect()
}

/// Whether every matchCondition of `webhook` holds for `pod` (what sends it the pod).
fn conditions_hold(webhook: &Value, pod: &Value) -> bool {
    webhook["matchConditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .all(|c| {
            let expr = c["expression"].as_str().expect("an expression");
            let program = Program::compile(expr).unwrap_or_else(|e| panic!("{e}: {expr}"));
            let mut ctx = Context::default();
            ctx.add_variable("object", pod.clone()).expect("object");
            match program.execute(&ctx) {
                Ok(cel_interpreter::Value::Bool(b)) => b,
                other => panic!("{expr} on {pod}: {other:?}"),
            }
        })
}

/// Whether the namespace selector of `webhook` sends pods of `namespace` (the chart's use
/// `kubernetes.io/metadata.name NotIn` only).
fn namespace_sent(webhook: &Value, namespace: &str) -> bool {
    webhook["namespaceSelector"]["matchExpressions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .all(|e| {
            assert_eq!(e["key"], "kubernetes.io/metadata.name", "{e}");
            assert_eq!(e["operator"], "NotIn", "{e}");
            !e["values"]
                .as_array()
                .is_some_and(|v| v.iter().any(|n| n == namespace))
        })
}

/// A pod with one hostPath volume at `path`, mounted by a container of `field`
/// (`containers`, `initContainers`, `ephemeralContainers`), read-only or not.
fn pod_mounting(path: &str, read_only: bool, field: &str) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "monitoring"},
        "spec": {
            "volumes": [{"name": "host", "hostPath": {"path": path}}],
            "containers": [{"name": "main", "image": "busybox"}],
        },
    });
    let mount = json!({"name": "host", "mountPath": "/host", "readOnly": read_only});
    let container = json!({"name": "c", "image": "busybox", "volumeMounts": [mount]});
    match field {
        "containers" => pod["spec"]["containers"][0]["volumeMounts"] = json!([mount]),
        other => pod["spec"][other] = json!([container]),
    }
    pod
}

/// The guard's webhook, with the hostPath injection.
fn guard() -> Option<Value> {
    let helm = helm()?;
    let docs = render(&helm, HOSTPATH_WEBHOOK);
    let (_, guard) = webhooks(&docs)
        .into_iter()
        .find(|(k, _)| k == "ValidatingWebhookConfiguration")
        .expect("the share's guard, with the hostPath injection");
    assert_eq!(guard["failurePolicy"], "Fail");
    Some(guard)
}

/// Paths, and whether a container mounting them writable may reach the share or its bin.
const PATHS: &[(&str, bool)] = &[
    ("/", true),
    ("/var", true),
    ("/var/lib", true),
    ("/var/lib/", true),
    ("/var/lib/exitorder", true),
    ("/var/lib/exitorder/", true),
    ("/var/lib/exitorder/pods/x/proxy", true),
    ("/var/lib/exitorder-bin", true),
    ("/var/lib/exitorder-bin/exitorder-entrypoint", true),
    ("/var//lib/exitorder", true),
    ("/var/lib/./exitorder", true),
    ("/var/lib/kubelet/../exitorder", true),
    ("/var/lib/exitorder/.", true),
    ("var/lib/exitorder", true),
    ("/var/log", false),
    ("/var/lib/kubelet", false),
    ("/var/lib/exitorder2", false),
    ("/var/lib/exitorder-binaries", false),
    ("/run/containerd", false),
    ("/etc/cni/net.d", false),
    ("/proc", false),
];

#[test]
fn the_guard_is_sent_only_pods_that_may_reach_the_share_writable() {
    let Some(guard) = guard() else { return };
    for (path, reaches) in PATHS {
        for field in ["containers", "initContainers", "ephemeralContainers"] {
            let writable = pod_mounting(path, false, field);
            assert_eq!(
                conditions_hold(&guard, &writable),
                *reaches,
                "{path} mounted writable by {field}"
            );
            let read_only = pod_mounting(path, true, field);
            assert!(
                !conditions_hold(&guard, &read_only),
                "{path} mounted read-only by {field} is sent"
            );
        }
    }
    // A hostPath no container mounts, and no hostPath at all.
    let mut unmounted = pod_mounting("/", false, "containers");
    unmounted["spec"]["containers"][0]["volumeMounts"] = json!([]);
    assert!(!conditions_hold(&guard, &unmounted));
    let plain = json!({"spec": {"containers": [{"name": "app", "image": "busybox"}]}});
    assert!(!conditions_hold(&guard, &plain));
}

#[test]
fn every_pod_the_guard_is_not_sent_is_one_it_admits() {
    let Some(guard) = guard() else { return };
    for (path, _) in PATHS {
        for field in ["containers", "initContainers", "ephemeralContainers"] {
            for read_only in [false, true] {
                let pod = pod_mounting(path, read_only, field);
                if !conditions_hold(&guard, &pod) {
                    assert_eq!(
                        exitorder::webhook::guard::check(&pod, SHARE, BIN),
                        Ok(()),
                        "{path} ({field}, read-only {read_only}) is not sent, but the guard refuses it"
                    );
                }
            }
        }
    }
}

#[test]
fn with_the_webhook_down_a_node_exporter_is_admitted_under_every_default_install() {
    let Some(helm) = helm() else { return };
    // node-exporter's DaemonSet pod: the host's root, /proc and /sys, read-only, in its own
    // namespace.
    let node_exporter = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "node-exporter-x", "namespace": "monitoring"},
        "spec": {
            "hostNetwork": true, "hostPID": true,
            "volumes": [
                {"name": "root", "hostPath": {"path": "/"}},
                {"name": "proc", "hostPath": {"path": "/proc"}},
                {"name": "sys", "hostPath": {"path": "/sys"}},
            ],
            "containers": [{
                "name": "node-exporter", "image": "quay.io/prometheus/node-exporter",
                "volumeMounts": [
                    {"name": "root", "mountPath": "/host/root", "readOnly": true, "mountPropagation": "HostToContainer"},
                    {"name": "proc", "mountPath": "/host/proc", "readOnly": true},
                    {"name": "sys", "mountPath": "/host/sys", "readOnly": true},
                ],
            }],
        },
    });
    // A CNI DaemonSet writing its configuration and binaries on the host.
    let cni = pod_mounting("/etc/cni/net.d", false, "initContainers");
    for values in [
        // The chart's defaults: the webhook on, pod-local.
        &[][..],
        &[("webhook.enabled", "false")][..],
        HOSTPATH_WEBHOOK,
    ] {
        let docs = render(&helm, values);
        let webhook_on = !values.contains(&("webhook.enabled", "false"));
        assert_eq!(
            count(&docs, "MutatingWebhookConfiguration"),
            usize::from(webhook_on),
            "{values:?}"
        );
        for pod in [&node_exporter, &cni] {
            for (kind, webhook) in webhooks(&docs) {
                let sent = namespace_sent(&webhook, "monitoring") && conditions_hold(&webhook, pod);
                // A webhook that is down refuses what it is sent only when it fails closed.
                let refused_when_down = sent && webhook["failurePolicy"] == "Fail";
                assert!(
                    !refused_when_down,
                    "{values:?}: {kind} {} would refuse {} while the webhook is down",
                    webhook["name"], pod["metadata"]["name"]
                );
            }
        }
    }
}
