//! The admission webhook over real HTTPS (a test CA, rustls on both ends), with real
//! AdmissionReview JSON: each returned patch is applied (json-patch) and the result checked
//! field by field, as a k8s-openapi `Pod`, and for idempotence. Then from YAML to an ordered
//! exit: the example pods of deploy/examples/ go through the running `exitorder webhook`
//! binary, and the patched pods run on the test bed's real containerd with the real agent.

use exitorder_e2e::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use exitorder::webhook::{CertFiles, Settings, Webhook, WebhookConfig};
use k8s_openapi::api::core::v1::{Container, Pod};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::{json, Value};
use support::{assert_exited_after, example, review_body, Bed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const ENTRYPOINT: &str = "/var/run/exitorder-bin/exitorder-entrypoint";

/// A test CA and serving certificates it signs.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA");
        Pki {
            ca,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// Writes a new serving pair for 127.0.0.1 and localhost (temp + rename, as a Secret
    /// update replaces files); returns the certificate's DER.
    fn issue(&self) -> Vec<u8> {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(names)
            .expect("params")
            .signed_by(&key, &self.ca)
            .expect("sign");
        for (name, text) in [("tls.crt", cert.pem()), ("tls.key", key.serialize_pem())] {
            let tmp = self.dir.path().join(format!(".{name}.tmp"));
            std::fs::write(&tmp, text).expect("write");
            std::fs::rename(&tmp, self.dir.path().join(name)).expect("rename");
        }
        cert.der().to_vec()
    }

    fn files(&self) -> CertFiles {
        CertFiles {
            cert: self.dir.path().join("tls.crt"),
            key: self.dir.path().join("tls.key"),
        }
    }

    fn connector(&self) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).expect("CA root");
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(cfg))
    }
}

/// One HTTP/1.1 exchange over a verified TLS connection.
struct Reply {
    status: u16,
    body: Vec<u8>,
    /// The certificate the server presented.
    cert: Vec<u8>,
}

async fn exchange(pki: &Pki, addr: SocketAddr, head: &str, body: &[u8]) -> Reply {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = pki.connector().connect(name, tcp).await.expect("TLS");
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    tls.write_all(head.as_bytes()).await.expect("write head");
    tls.write_all(body).await.expect("write body");
    tls.flush().await.expect("flush");
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut out)).await;
    // A TLS close without close_notify is an error here, but the bytes read so far are whole.
    let _ = read.expect("an answer within 30 s");
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(&out)));
    let status_line = String::from_utf8_lossy(&out[..split]).to_string();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line}"));
    Reply {
        status,
        body: out[split + 4..].to_vec(),
        cert,
    }
}

async fn post(pki: &Pki, addr: SocketAddr, body: &[u8]) -> Reply {
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    exchange(pki, addr, &head, body).await
}

async fn get(pki: &Pki, addr: SocketAddr, path: &str) -> Reply {
    let head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    exchange(pki, addr, &head, b"").await
}

/// A webhook served in this process.
struct Served {
    pki: Pki,
    addr: SocketAddr,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn start() -> Served {
        Served::start_draining(Duration::ZERO).await
    }

    async fn start_draining(drain_delay: Duration) -> Served {
        Served::start_with(Settings::default(), drain_delay).await
    }

    async fn start_with(settings: Settings, drain_delay: Duration) -> Served {
        Served::start_following(settings, drain_delay, None).await
    }

    /// Following the agents' rollout through `agents`.
    async fn start_following(
        settings: Settings,
        drain_delay: Duration,
        agents: Option<exitorder::webhook::rollout::AgentsView>,
    ) -> Served {
        let pki = Pki::new();
        pki.issue();
        let cfg = WebhookConfig {
            addr: "127.0.0.1:0".parse().expect("addr"),
            files: pki.files(),
            settings,
            reload_interval: Duration::from_millis(50),
            shutdown_timeout: Duration::from_secs(5),
            drain_delay,
            agents,
        };
        let webhook = Webhook::bind(cfg).await.expect("bind");
        let addr = webhook.local_addr().expect("bound");
        let cancel = CancellationToken::new();
        let task = tokio::spawn(webhook.run(cancel.clone()));
        Served {
            pki,
            addr,
            cancel,
            task,
        }
    }

    /// Reviews `pod`; the response object.
    async fn review(&self, pod: &Value) -> Value {
        let reply = post(&self.pki, self.addr, &review_body(pod)).await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let out: Value = serde_json::from_slice(&reply.body).expect("JSON answer");
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(
            out["response"]["uid"],
            "7e0e7f3c-1d2b-4d7e-9a43-2f1c0f1e1a01"
        );
        out["response"].clone()
    }

    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the webhook stops within its shutdown timeout")
            .expect("webhook task");
    }
}

/// An AdmissionReview of a change to a pod (`operation`, with `sub_resource` for an
/// ephemeral container's addition), as the API server sends it.
fn review_of(pod: &Value, operation: &str, sub_resource: Option<&str>) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&review_body(pod)).expect("review");
    v["request"]["operation"] = operation.into();
    if let Some(sub) = sub_resource {
        v["request"]["subResource"] = sub.into();
        v["request"]["oldObject"] = pod.clone();
    }
    serde_json::to_vec(&v).expect("review JSON")
}

/// Applies an allowed response's patch; also checks the result is a valid Pod.
fn patched(pod: &Value, response: &Value) -> Value {
    assert_eq!(response["allowed"], true, "denied: {response}");
    let mut out = pod.clone();
    if let Some(b64) = response["patch"].as_str() {
        assert_eq!(response["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64 patch");
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("JSONPatch");
        json_patch::patch(&mut out, &patch).expect("the patch applies");
    }
    let _: Pod = serde_json::from_value(out.clone()).expect("still a Pod");
    out
}

/// Reviews `pod`, applies the patch, and checks a second pass changes nothing.
async fn inject(w: &Served, pod: &Value) -> (Value, Vec<String>) {
    let response = w.review(pod).await;
    let out = patched(pod, &response);
    let again = w.review(&out).await;
    assert_eq!(again["allowed"], true);
    assert!(
        again.get("patch").is_none(),
        "a second pass patched: {again}"
    );
    let warnings = response["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (out, warnings)
}

fn container(pod: &Value, name: &str) -> Container {
    let pod: Pod = serde_json::from_value(pod.clone()).expect("pod");
    let spec = pod.spec.expect("spec");
    spec.containers
        .into_iter()
        .chain(spec.init_containers.unwrap_or_default())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn prestop(c: &Container) -> Vec<String> {
    c.lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.clone())
        .unwrap_or_default()
}

/// Asserts `name` got its own directory of the pod's `exitorder` emptyDir, the entrypoint
/// from `exitorder-bin` (read-only) and a waiting preStop ending in `then`; and the pod the two
/// emptyDirs and, first of its init containers, `exitorder-install`. No hostPath.
fn assert_injected(pod: &Value, name: &str, timeout: &str, then: &[&str]) {
    let c = container(pod, name);
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    let own = mounts
        .iter()
        .find(|m| m.mount_path == "/var/run/exitorder")
        .unwrap_or_else(|| panic!("{name}: no exit directory mount"));
    assert_eq!(
        (
            own.name.as_str(),
            own.sub_path.as_deref(),
            own.sub_path_expr.as_deref()
        ),
        ("exitorder", Some(name), None)
    );
    let bin = mounts
        .iter()
        .find(|m| m.mount_path == "/var/run/exitorder-bin")
        .unwrap_or_else(|| panic!("{name}: no entrypoint mount"));
    assert_eq!(
        (bin.name.as_str(), bin.sub_path.as_deref(), bin.read_only),
        ("exitorder-bin", None, Some(true))
    );
    assert!(
        !c.env.iter().flatten().any(|e| e.name == "POD_UID"),
        "{name}: POD_UID is for the share"
    );
    assert_prestop(&c, timeout, then);
    let volumes = pod["spec"]["volumes"].as_array().expect("volumes");
    // The exit directories in a small tmpfs, the entrypoint's copy on the node's disk.
    for (v, empty_dir) in [
        ("exitorder", json!({"medium": "Memory", "sizeLimit": "1Mi"})),
        ("exitorder-bin", json!({})),
    ] {
        let volume = volumes
            .iter()
            .find(|x| x["name"] == v)
            .unwrap_or_else(|| panic!("no volume {v}"));
        assert_eq!(volume["emptyDir"], empty_dir, "{v}");
    }
    assert!(
        volumes.iter().all(|v| v.get("hostPath").is_none()),
        "a hostPath: {volumes:?}"
    );
    let install = &pod["spec"]["initContainers"][0];
    assert_eq!(install["name"], "exitorder-install");
    assert_eq!(install["image"], exitorder::webhook::DEFAULT_INSTALL_IMAGE);
    assert_eq!(
        install["command"],
        json!([
            "/usr/local/bin/exitorder-entrypoint",
            "install",
            "/var/run/exitorder-bin"
        ])
    );
    assert_eq!(
        install["volumeMounts"],
        json!([{"name": "exitorder-bin", "mountPath": "/var/run/exitorder-bin"}])
    );
}

fn assert_prestop(c: &Container, timeout: &str, then: &[&str]) {
    let want: Vec<String> = [ENTRYPOINT, "wait", "--timeout", timeout]
        .iter()
        .chain(then)
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(prestop(c), want, "{}", c.name);
}

/// Asserts `name` got the share, its directory, the entrypoint, POD_UID and a waiting
/// preStop ending in `then` (`--handshake-volume hostPath`).
fn assert_share_injected(pod: &Value, name: &str, timeout: &str, then: &[&str]) {
    let c = container(pod, name);
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    let own = mounts
        .iter()
        .find(|m| m.mount_path == "/var/run/exitorder")
        .unwrap_or_else(|| panic!("{name}: no exit directory mount"));
    assert_eq!(own.name, "exitorder-share");
    assert_eq!(
        own.sub_path_expr.as_deref(),
        Some(format!("pods/$(POD_UID)/{name}").as_str())
    );
    let bin = mounts
        .iter()
        .find(|m| m.mount_path == "/var/run/exitorder-bin")
        .unwrap_or_else(|| panic!("{name}: no entrypoint mount"));
    // The entrypoint from the host's bin directory, apart from the share, read-only.
    assert_eq!(
        (bin.name.as_str(), bin.sub_path.as_deref(), bin.read_only),
        ("exitorder-bin", None, Some(true))
    );
    let volumes = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        volumes
            .iter()
            .any(|v| v["name"] == "exitorder-bin"
                && v["hostPath"]["path"] == "/var/lib/exitorder-bin"),
        "no host bin directory volume: {volumes:?}"
    );
    let uid = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_UID")
        .unwrap_or_else(|| panic!("{name}: no POD_UID"));
    assert_eq!(
        uid.value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("metadata.uid")
    );
    assert_prestop(&c, timeout, then);
    let volume = pod["spec"]["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "exitorder-share"))
        .expect("the share volume");
    assert_eq!(volume["hostPath"]["path"], "/var/lib/exitorder");
}

/// `name`, a container the sidecars wait for, got only what makes it say on the node when the
/// kubelet stops it: its own exit directory, the entrypoint read-only (and `POD_UID` in the
/// host share's layout), and a preStop `exitorder-entrypoint mark` running its own hook after
/// (in the host share's layout, the node's entrypoint by the name a rollback of the agents
/// leaves as it is, `exitorder-entrypoint-v2`); nothing else of it changed.
fn assert_untouched(before: &Value, after: &Value, name: &str) {
    let (was, is) = (container(before, name), container(after, name));
    let prestop = prestop(&is);
    let host_share = after["spec"]["volumes"]
        .as_array()
        .is_some_and(|v| v.iter().any(|v| v["name"] == "exitorder-share"));
    let program = if host_share {
        "/var/run/exitorder-bin/exitorder-entrypoint-v2"
    } else {
        "/var/run/exitorder-bin/exitorder-entrypoint"
    };
    assert_eq!(
        prestop.get(..2),
        Some(&[program.to_owned(), "mark".to_owned()][..]),
        "{name}: {prestop:?}"
    );
    let mounts = is.volume_mounts.clone().unwrap_or_default();
    for path in ["/var/run/exitorder", "/var/run/exitorder-bin"] {
        assert!(
            mounts.iter().any(|m| m.mount_path == path),
            "{name}: {mounts:?}"
        );
    }
    let bare = |mut c: Container| {
        c.lifecycle = None;
        c.volume_mounts = None;
        c.env = c.env.map(|e| {
            e.into_iter()
                .filter(|v| v.name != "POD_UID")
                .collect::<Vec<_>>()
        });
        c.env = c.env.filter(|e| !e.is_empty());
        c
    };
    assert_eq!(bare(was), bare(is), "{name} was changed beyond its mark");
}

#[tokio::test]
async fn an_opted_in_pod_gets_its_sidecar_injected() {
    let w = Served::start().await;
    let pod = example("injected");
    let (out, warnings) = inject(&w, &pod).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_injected(&out, "proxy", "25s", &[]);
    assert_untouched(&pod, &out, "app");
    // Nothing else of the pod changed.
    assert_eq!(
        out["metadata"]["annotations"],
        pod["metadata"]["annotations"]
    );
    w.stop().await;
}

/// Fields of the newest Kubernetes releases (container restart rules, user namespaces,
/// resize policies) go through untouched, whether the webhook's types know them or not.
#[tokio::test]
async fn the_newest_pod_fields_pass_through() {
    let w = Served::start().await;
    let mut pod = example("injected");
    let newest = json!({
        "restartPolicy": "Never",
        "restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}},
            {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0, 1]}}
        ],
        "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
        "aFieldOfAFutureRelease": {"kept": true}
    });
    let app = pod["spec"]["containers"]
        .as_array_mut()
        .and_then(|cs| cs.iter_mut().find(|c| c["name"] == "app"))
        .expect("the app");
    for (k, v) in newest.as_object().expect("fields") {
        app[k] = v.clone();
    }
    pod["spec"]["hostUsers"] = false.into();
    pod["spec"]["aPodFieldOfAFutureRelease"] = json!([1, 2]);
    let (out, _) = inject(&w, &pod).await;
    let app = out["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "app"))
        .expect("the app");
    for (k, v) in newest.as_object().expect("fields") {
        assert_eq!(&app[k], v, "{k}");
    }
    assert_eq!(out["spec"]["hostUsers"], false);
    assert_eq!(out["spec"]["aPodFieldOfAFutureRelease"], json!([1, 2]));
    assert_injected(&out, "proxy", "25s", &[]);
    w.stop().await;
}

#[tokio::test]
async fn the_share_layout_on_request() {
    let settings = Settings {
        handshake_volume: exitorder::webhook::HandshakeVolume::HostPath,
        ..Settings::default()
    };
    let w = Served::start_with(settings, Duration::ZERO).await;
    let pod = example("injected");
    let (out, warnings) = inject(&w, &pod).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_share_injected(&out, "proxy", "25s", &[]);
    assert_untouched(&pod, &out, "app");
    assert!(out["spec"]["initContainers"].is_null(), "{out}");
    w.stop().await;
}

/// A pod that a namespace enforcing Pod Security `restricted` admits is still admitted after
/// the injection, and so is one under `baseline`.
#[tokio::test]
async fn a_restricted_pod_stays_restricted() {
    let w = Served::start().await;
    let pod = example("restricted");
    assert_eq!(
        exitorder::webhook::pss::restricted_violations(&pod),
        Vec::<String>::new()
    );
    let (out, warnings) = inject(&w, &pod).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_injected(&out, "proxy", "25s", &[]);
    assert_eq!(
        exitorder::webhook::pss::restricted_violations(&out),
        Vec::<String>::new(),
        "{out}"
    );
    // The baseline example too: what the injection adds is restricted whatever the pod is.
    let (out, _) = inject(&w, &example("injected")).await;
    assert_eq!(
        exitorder::webhook::pss::baseline_violations(&out),
        Vec::<String>::new()
    );
    let install =
        serde_json::json!({"spec": {"containers": [out["spec"]["initContainers"][0].clone()]}});
    assert_eq!(
        exitorder::webhook::pss::restricted_violations(&install),
        Vec::<String>::new()
    );
    // And the checker is no rubber stamp: the share layout is refused by both.
    let settings = Settings {
        handshake_volume: exitorder::webhook::HandshakeVolume::HostPath,
        ..Settings::default()
    };
    let share = Served::start_with(settings, Duration::ZERO).await;
    let (out, _) = inject(&share, &pod).await;
    let v = exitorder::webhook::pss::baseline_violations(&out);
    assert!(v.iter().any(|v| v.contains("hostPath")), "{v:?}");
    share.stop().await;
    w.stop().await;
}

/// The share's guard (`/validate`), for pods that did not opt in as for those that did: only a
/// container's own directory, as the hostPath mode mounts it, or a read-only mount.
#[tokio::test]
async fn the_share_guard_refuses_every_other_way_in() {
    let w = Served::start().await;
    let validate = |body: Vec<u8>| {
        let (pki, addr) = (&w.pki, w.addr);
        async move {
            let head = format!(
                "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let reply = exchange(pki, addr, &head, &body).await;
            assert_eq!(
                reply.status,
                200,
                "{}",
                String::from_utf8_lossy(&reply.body)
            );
            let out: Value = serde_json::from_slice(&reply.body).expect("JSON");
            out["response"].clone()
        }
    };
    let share_pod = |path: &str, mount: Value, env: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "intruder", "namespace": "default"},
               "spec": {"volumes": [{"name": "s", "hostPath": {"path": path}}],
                        "containers": [{"name": "c", "image": "busybox:1.36",
                                        "volumeMounts": [mount], "env": env}]}})
    };
    let whole = json!({"name": "s", "mountPath": "/share"});
    let own = json!({"name": "s", "mountPath": "/var/run/exitorder",
                     "subPathExpr": "pods/$(POD_UID)/c"});
    let uid =
        json!([{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]);
    let forged = json!([{"name": "POD_UID", "value": "0f5c7a1e-8d2b-4c3e-9f00-123456789abc"}]);
    for (what, pod) in [
        (
            "the whole share, not opted in",
            share_pod("/var/lib/exitorder", whole.clone(), json!([])),
        ),
        (
            "a // spelling",
            share_pod("/var/lib//exitorder/", whole.clone(), json!([])),
        ),
        (
            "the share's old entrypoint directory",
            share_pod("/var/lib/exitorder/bin", whole.clone(), json!([])),
        ),
        (
            "the host's bin directory, writable",
            share_pod("/var/lib/exitorder-bin", whole.clone(), json!([])),
        ),
        (
            "a parent of the share",
            share_pod("/var/lib", whole.clone(), json!([])),
        ),
        (
            "another pod's directory through a POD_UID of its own",
            share_pod("/var/lib/exitorder", own.clone(), forged),
        ),
    ] {
        let r = validate(review_body(&pod)).await;
        assert_eq!(r["allowed"], false, "{what}: {r}");
        let m = r["status"]["message"].as_str().unwrap_or_default();
        assert!(m.contains("\"c\"") && m.contains("\"s\""), "{what}: {m}");
    }
    // What the hostPath mode injects, and read-only mounts, pass.
    for (what, pod) in [
        (
            "the own directory",
            share_pod("/var/lib/exitorder", own.clone(), uid.clone()),
        ),
        (
            "read-only",
            share_pod(
                "/var/lib",
                json!({"name": "s", "mountPath": "/h", "readOnly": true}),
                json!([]),
            ),
        ),
        (
            "another directory",
            share_pod("/var/log", whole.clone(), json!([])),
        ),
    ] {
        let r = validate(review_body(&pod)).await;
        assert_eq!(r["allowed"], true, "{what}: {r}");
    }
    let settings = Settings {
        handshake_volume: exitorder::webhook::HandshakeVolume::HostPath,
        ..Settings::default()
    };
    let share = Served::start_with(settings, Duration::ZERO).await;
    let (injected, _) = inject(&share, &example("injected")).await;
    share.stop().await;
    assert_eq!(validate(review_body(&injected)).await["allowed"], true);
    // An ephemeral container added to that pod may not mount the share writable, not even
    // as a directory of its own.
    let mut debug = injected.clone();
    debug["spec"]["ephemeralContainers"] = json!([{"name": "debug", "image": "busybox:1.36",
        "env": uid, "volumeMounts": [{"name": "exitorder-share", "mountPath": "/var/run/exitorder",
                                       "subPathExpr": "pods/$(POD_UID)/debug"}]}]);
    let r = validate(review_of(&debug, "UPDATE", Some("ephemeralcontainers"))).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(r["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("ephemeral container \"debug\""));
    w.stop().await;
}

/// One peer holding 2,000 idle and slow connections (opening another for each one closed)
/// leaves the API server's reviews, probes and scrapes answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_and_slow_connections_leaves_reviews_answered() {
    const FLOOD: usize = 2_000;
    support::flood::raise_nofile();
    let w = Served::start().await;
    let flood = support::flood::Flood::start(w.addr, FLOOD);
    support::until(
        "the flood's connections opened",
        Duration::from_secs(60),
        || {
            let opened = flood.opened();
            async move { opened >= FLOOD }
        },
    )
    .await;
    let pod = example("injected");
    for round in 0..20 {
        let response = w.review(&pod).await;
        assert_eq!(response["allowed"], true, "round {round}: {response}");
        assert!(response["patch"].is_string(), "round {round}: {response}");
        assert_eq!(
            get(&w.pki, w.addr, "/readyz").await.status,
            200,
            "round {round}"
        );
    }
    let text = metrics(&w).await;
    let evicted = support::parse_metrics(&text)
        .into_iter()
        .find(|(n, _)| n == "exitorder_webhook_connections_evicted_total")
        .map_or(0.0, |(_, v)| v);
    assert!(evicted > 0.0, "the flood never met the limit:\n{text}");
    flood.stop().await;
    w.stop().await;
}

#[tokio::test]
async fn a_linkerd_pod_needs_no_priority() {
    let w = Served::start().await;
    let pod = example("linkerd");
    let (out, _) = inject(&w, &pod).await;
    assert_injected(&out, "linkerd-proxy", "25s", &[]);
    assert_untouched(&pod, &out, "app");
    w.stop().await;
}

#[tokio::test]
async fn an_istio_native_sidecar_drains_after_the_wait() {
    let w = Served::start().await;
    let pod = example("istio-native");
    let (out, _) = inject(&w, &pod).await;
    assert_injected(
        &out,
        "istio-proxy",
        "25s",
        &[
            "--",
            "sh",
            "-c",
            "echo drain started; sleep 1; echo drained",
        ],
    );
    assert_untouched(&pod, &out, "app");
    assert_eq!(
        out["metadata"]["annotations"]["exitorder.io/native-sidecars"],
        r#"["istio-proxy"]"#
    );
    // The istio injector's real preStop, and a grace period of its own.
    let mut real = pod.clone();
    real["spec"]["terminationGracePeriodSeconds"] = 60.into();
    real["spec"]["initContainers"][0]["lifecycle"]["preStop"]["exec"]["command"] =
        json!(["pilot-agent", "request", "POST", "drain"]);
    let (out, _) = inject(&w, &real).await;
    assert_injected(
        &out,
        "istio-proxy",
        "55s",
        &["--", "pilot-agent", "request", "POST", "drain"],
    );
    w.stop().await;
}

#[tokio::test]
async fn the_kruise_alias_and_every_prestop_form() {
    let w = Served::start().await;
    let pod = support::pod(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: forms
  annotations:
    container-exit-priority.kruise.io/auto-inject-prestop: "true"
    kruise.io/container-exit-priority: '{"exec": 1, "http": 2, "sleeper": 3, "named-port": 1, "ghost": 4}'
spec:
  terminationGracePeriodSeconds: 45
  containers:
    - {name: app, image: busybox:1.36}
    - name: exec
      image: busybox:1.36
      lifecycle: {preStop: {exec: {command: [/bin/drain, --now]}}}
    - name: http
      image: busybox:1.36
      lifecycle: {preStop: {httpGet: {path: /quitquitquit, port: 15020}}}
    - name: named-port
      image: busybox:1.36
      ports: [{name: admin, containerPort: 9901}]
      lifecycle: {preStop: {httpGet: {path: drain, port: admin}}}
    - name: sleeper
      image: busybox:1.36
      lifecycle: {preStop: {sleep: {seconds: 3}}}
    - name: envd
      image: busybox:1.36
      env: [{name: KRUISE_EXIT_PRIORITY, value: "2"}]
"#,
    );
    let (out, warnings) = inject(&w, &pod).await;
    assert_injected(&out, "exec", "40s", &["--", "/bin/drain", "--now"]);
    assert_injected(
        &out,
        "http",
        "40s",
        &["--http-get", "http://127.0.0.1:15020/quitquitquit"],
    );
    assert_injected(
        &out,
        "named-port",
        "40s",
        &["--http-get", "http://127.0.0.1:9901/drain"],
    );
    assert_injected(&out, "sleeper", "40s", &["--sleep", "3s"]);
    assert_injected(&out, "envd", "40s", &[]);
    assert_untouched(&pod, &out, "app");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("\"ghost\"")
            && warnings[0].contains("kruise.io/container-exit-priority"),
        "{warnings:?}"
    );
    w.stop().await;
}

#[tokio::test]
async fn pods_are_refused_with_the_problem_named() {
    let w = Served::start().await;
    let base = example("istio-native");
    let with = |key: &str, value: &str| {
        let mut p = base.clone();
        p["metadata"]["annotations"][key] = value.into();
        p
    };
    let key = "exitorder.io/container-exit-priority";
    let cases = [
        (with(key, "{not json"), vec![key, "not valid JSON"]),
        (with(key, "[1]"), vec![key, "JSON object"]),
        (with(key, r#"{"app": 256}"#), vec![key, "\"app\" is 256"]),
        (with(key, r#"{"app": -1}"#), vec![key, "\"app\" is -1"]),
        (with(key, r#"{"app": 1.5}"#), vec![key, "\"app\" is 1.5"]),
        (with(key, r#"{"app": "1"}"#), vec![key, "\"app\" is \"1\""]),
        // The app would wait for the native proxy, which the kubelet stops after it.
        (
            with(key, r#"{"app": 2}"#),
            vec!["\"app\"", "\"istio-proxy\"", "stops only after"],
        ),
    ];
    for (pod, wants) in cases {
        let r = w.review(&pod).await;
        assert_eq!(r["allowed"], false, "{r}");
        assert_eq!(r["status"]["code"], 403);
        let m = r["status"]["message"].as_str().unwrap_or_default();
        for want in wants {
            assert!(m.contains(want), "{want:?} not in {m}");
        }
    }
    // Two native sidecars whose priorities contradict their declaration order.
    let mut two = base.clone();
    let mut logs = two["spec"]["initContainers"][0].clone();
    logs["name"] = "logs".into();
    two["spec"]["initContainers"]
        .as_array_mut()
        .expect("init containers")
        .push(logs);
    two["metadata"]["annotations"][key] = r#"{"istio-proxy": 1, "logs": 2}"#.into();
    let r = w.review(&two).await;
    let m = r["status"]["message"].as_str().unwrap_or_default();
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        m.contains("native sidecar \"logs\"") && m.contains("\"istio-proxy\""),
        "{m}"
    );
    // The same priorities, declared in the kubelet's order, are admitted.
    two["metadata"]["annotations"][key] = r#"{"istio-proxy": 2, "logs": 1}"#.into();
    let (out, _) = inject(&w, &two).await;
    assert_eq!(
        out["metadata"]["annotations"]["exitorder.io/native-sidecars"],
        r#"["istio-proxy","logs"]"#
    );
    w.stop().await;
}

#[tokio::test]
async fn a_pod_that_did_not_opt_in_is_not_touched() {
    let w = Served::start().await;
    let mut pod = example("linkerd");
    pod["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations")
        .remove("exitorder.io/inject");
    // Even a malformed priority is not this webhook's business then.
    pod["metadata"]["annotations"]["exitorder.io/container-exit-priority"] = "nope".into();
    let r = w.review(&pod).await;
    assert_eq!(r["allowed"], true);
    assert!(r.get("patch").is_none() && r.get("status").is_none(), "{r}");
    w.stop().await;
}

#[tokio::test]
async fn broken_and_oversized_requests_get_an_answer() {
    let w = Served::start().await;
    for body in [
        &b""[..],
        b"{",
        b"\x00\xff garbage",
        b"[]",
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":5}}"#,
    ] {
        let r = post(&w.pki, w.addr, body).await;
        assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(body));
    }
    // Oversized: refused from its declared length, before any of it is read.
    let head = "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 67108864\r\n\
                Connection: close\r\n\r\n";
    let r = exchange(&w.pki, w.addr, head, b"").await;
    assert_eq!(r.status, 413, "{}", String::from_utf8_lossy(&r.body));
    // A body that never comes: answered when the webhook stops waiting for it.
    let head = "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\
                Connection: close\r\n\r\n";
    let r = exchange(&w.pki, w.addr, head, b"{").await;
    assert_eq!(r.status, 408, "{}", String::from_utf8_lossy(&r.body));
    // Not a route, not a method.
    assert_eq!(get(&w.pki, w.addr, "/nope").await.status, 404);
    assert_eq!(get(&w.pki, w.addr, "/mutate").await.status, 405);
    // Still serving, and it counted what it refused.
    assert_eq!(get(&w.pki, w.addr, "/healthz").await.status, 200);
    assert_eq!(get(&w.pki, w.addr, "/readyz").await.status, 200);
    let metrics = String::from_utf8(get(&w.pki, w.addr, "/metrics").await.body).expect("text");
    assert!(
        metrics.contains("exitorder_webhook_reviews_total{outcome=\"invalid\"} 8"),
        "{metrics}"
    );
    w.stop().await;
}

async fn metrics(w: &Served) -> String {
    String::from_utf8(get(&w.pki, w.addr, "/metrics").await.body).expect("text")
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let w = Served::start().await;
    let first = get(&w.pki, w.addr, "/healthz").await.cert;
    let second = w.pki.issue();
    assert_ne!(first, second);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let served = get(&w.pki, w.addr, "/healthz").await.cert;
        if served == second {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not served within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A broken pair keeps the current certificate (written whole, as a Secret update is).
    let failed = |m: &str| -> u64 {
        m.lines()
            .find_map(|l| {
                l.strip_prefix("exitorder_webhook_certificate_reloads_total{result=\"failed\"} ")
            })
            .and_then(|n| n.trim().parse().ok())
            .expect("the failed reloads counter")
    };
    let before = failed(&metrics(&w).await);
    let key = w.pki.files().key;
    let tmp = key.with_extension("tmp");
    std::fs::write(&tmp, "not a key").expect("write");
    std::fs::rename(&tmp, &key).expect("rename");
    loop {
        let m = metrics(&w).await;
        if failed(&m) > before {
            assert!(
                m.contains("exitorder_webhook_certificate_reloads_total{result=\"ok\"} 1"),
                "{m}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bad key was not noticed: {m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(&w.pki, w.addr, "/healthz").await.cert, second);
    w.stop().await;
}

#[tokio::test]
async fn a_stopping_webhook_answers_while_it_drains() {
    let w = Served::start_draining(Duration::from_secs(5)).await;
    w.cancel.cancel();
    // Not ready any more, so the Service stops sending; still answering what it sends.
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(&w.pki, w.addr, "/readyz").await.status != 503 {
        assert!(Instant::now() < deadline, "never said it was draining");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = post(&w.pki, w.addr, &review_body(&example("injected"))).await;
    assert_eq!(r.status, 200);
    // Then it stops, within the drain and the shutdown timeout.
    tokio::time::timeout(Duration::from_secs(20), w.task)
        .await
        .expect("stopped after the drain")
        .expect("webhook task");
}

#[tokio::test]
async fn a_missing_certificate_stops_the_start() {
    let pki = Pki::new();
    let cfg = WebhookConfig {
        addr: "127.0.0.1:0".parse().expect("addr"),
        files: pki.files(),
        settings: Settings::default(),
        reload_interval: Duration::from_secs(1),
        shutdown_timeout: Duration::from_secs(1),
        drain_delay: Duration::ZERO,
        agents: None,
    };
    let Err(e) = Webhook::bind(cfg).await else {
        panic!("started without a certificate");
    };
    assert!(e.to_string().contains("tls.crt"), "{e}");
}

// ---- From YAML to an ordered exit, through the real binary -------------------------------

/// `exitorder webhook` as a process, with the test CA's certificate.
struct WebhookProcess {
    child: tokio::process::Child,
    pki: Pki,
    addr: SocketAddr,
}

impl WebhookProcess {
    async fn start(grace_reserve: &str) -> WebhookProcess {
        let pki = Pki::new();
        pki.issue();
        let files = pki.files();
        let mut child = tokio::process::Command::new(exitorder_e2e::support::agent_bin())
            .args(["webhook", "--cert"])
            .arg(&files.cert)
            .arg("--key")
            .arg(&files.key)
            .args([
                "--addr",
                "127.0.0.1:0",
                "--grace-reserve",
                grace_reserve,
                "--drain-delay",
                "1s",
            ])
            .env("EXITORDER_LOG_FORMAT", "json")
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn exitorder webhook");
        // Its port, from its own log (port 0: no other socket can take it meanwhile).
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            let mut tx = Some(tx);
            while let Ok(Some(line)) = lines.next_line().await {
                let v: Value = serde_json::from_str(&line).unwrap_or_default();
                if v["fields"]["message"] == "webhook listening (TLS)" {
                    if let (Some(tx), Some(addr)) = (tx.take(), v["fields"]["addr"].as_str()) {
                        let _ = tx.send(addr.to_owned());
                    }
                }
            }
        });
        let addr: SocketAddr = tokio::time::timeout(Duration::from_secs(20), rx)
            .await
            .expect("the webhook listened within 20 s")
            .expect("its log")
            .parse()
            .expect("an address");
        assert_eq!(get(&pki, addr, "/readyz").await.status, 200);
        WebhookProcess { child, pki, addr }
    }

    async fn mutate(&self, pod: &Value) -> Value {
        let reply = post(&self.pki, self.addr, &review_body(pod)).await;
        assert_eq!(reply.status, 200);
        let out: Value = serde_json::from_slice(&reply.body).expect("JSON");
        patched(pod, &out["response"])
    }

    /// SIGTERM, as the kubelet stops it: it exits 0 within its shutdown timeout.
    async fn stop(mut self) {
        let pid = self.child.id().expect("running");
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let status = tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("exited within 15 s")
            .expect("wait");
        assert!(status.success(), "{status}");
    }
}

fn root() -> PathBuf {
    exitorder_e2e::repo().to_path_buf()
}

/// Runs `example` through the webhook and on the bed, deletes it, and checks `sidecar`
/// exited after `app`, released in order.
async fn ordered_through_the_webhook(example_name: &str, sidecar: &str) {
    assert!(root()
        .join("deploy/examples")
        .join(format!("{example_name}.yaml"))
        .is_file());
    ordered_through_the_webhook_as(example_name, &example(example_name), sidecar).await;
}

/// [`ordered_through_the_webhook`] for `pod`, told as `example_name`.
async fn ordered_through_the_webhook_as(example_name: &str, pod: &Value, sidecar: &str) {
    let Some(bed) = Bed::start(Duration::from_secs(3)).await else {
        return;
    };
    // The injected init container copies the entrypoint from the project's image.
    if support::project_image(&bed.node).await.is_none() {
        return;
    }
    let webhook = WebhookProcess::start("3s").await;
    let pod = webhook.mutate(pod).await;
    let running = bed.run_ready(&pod).await;
    let uid = running.uid().to_owned();
    // The exit directories are in the tmpfs the kubelet mounts for `medium: Memory`.
    let volume = bed.node.empty_dir(&uid, "exitorder");
    let fs = rustix::fs::statfs(&volume).expect("the pod's exitorder volume");
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    assert_eq!(fs.f_type, TMPFS_MAGIC, "{}", volume.display());
    let d = running.delete().await.expect("delete pod");
    bed.show(example_name, &d);
    assert_exited_after(&bed, &d, sidecar, "app");
    for c in &d.containers {
        assert_eq!(c.exit_code, 0, "{}{}", c.name, bed.context(&d));
    }
    let allow = bed.allowed_ordered(&uid, sidecar, &bed.context(&d)).await;
    let app_finished = d.container("app").expect("app").finished_at_ns;
    let allowed_at = allow.at_ns().expect("timestamped");
    // The runtime stamps `finished_at` when its shim has reaped the process, after the
    // kernel told the agent (a few ms on a busy node). The app exits 2 s after its TERM, so
    // an allow out of order would come seconds early, not within this.
    const REAPED_AFTER_EXIT_NS: i64 = 500_000_000;
    assert!(
        allowed_at >= app_finished - REAPED_AFTER_EXIT_NS,
        "allowed {} ms before the app finished{}",
        (app_finished - allowed_at) / 1_000_000,
        bed.context(&d)
    );
    let hook = d
        .container(sidecar)
        .and_then(|c| c.prestop.as_ref())
        .expect("the sidecar's preStop ran");
    assert!(hook.ok, "{}", bed.context(&d));
    if example_name == "istio-native" {
        // The kubelet started the hook at once, but the drain inside it ran only once the
        // agent allowed it, after the app had exited.
        assert!(hook.started_ns < app_finished, "{}", bed.context(&d));
        assert!(
            hook.detail.contains("drain started") && hook.detail.contains("drained"),
            "the drain did not run: {}{}",
            hook.detail,
            bed.context(&d)
        );
        assert!(hook.returned_ns >= allowed_at, "{}", bed.context(&d));
    }
    webhook.stop().await;
    bed.finish().await;
}

#[tokio::test]
async fn one_annotation_orders_the_exit_on_the_bed() {
    ordered_through_the_webhook("injected", "proxy").await;
}

/// Pod Security `restricted` on the bed: the app and the proxy as non-root users of their own,
/// no capabilities, the entrypoint copied in by `exitorder-install` as uid 65532, the proxy's
/// exit directory in the pod's own volume.
#[tokio::test]
async fn a_restricted_pod_is_ordered_on_the_bed() {
    ordered_through_the_webhook("restricted", "proxy").await;
}

#[tokio::test]
async fn a_linkerd_proxy_leaves_after_the_app_on_the_bed() {
    ordered_through_the_webhook("linkerd", "linkerd-proxy").await;
}

/// A sidecar known by its image only (istio's proxy image under a name of the pod's own):
/// the webhook writes its preset's priority as the container's env, and the agent, which
/// sees names and env but not images, orders it after the app.
#[tokio::test]
async fn a_sidecar_known_by_its_image_leaves_after_the_app_on_the_bed() {
    let mut pod = example("linkerd");
    let proxy = pod["spec"]["containers"]
        .as_array_mut()
        .and_then(|cs| cs.iter_mut().find(|c| c["name"] == "linkerd-proxy"))
        .expect("the example's proxy");
    proxy["name"] = "mesh".into();
    proxy["image"] = exitorder_testbed::node::PRESET_STAND_IN_IMAGE.into();
    let w = Served::start().await;
    let (out, _) = inject(&w, &pod).await;
    let env: Vec<(String, Option<String>)> = container(&out, "mesh")
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    assert!(
        env.contains(&("EXITORDER_EXIT_PRIORITY".to_owned(), Some("1".to_owned()))),
        "{env:?}"
    );
    assert_injected(&out, "mesh", "25s", &[]);
    // Not a pod that completes: no Job shutdown endpoint is written for it.
    assert_eq!(
        out["metadata"]["annotations"]["exitorder.io/sidecar-shutdown"],
        Value::Null
    );
    w.stop().await;
    ordered_through_the_webhook_as("image-preset", &pod, "mesh").await;
}

#[tokio::test]
async fn an_istio_native_sidecar_drains_after_the_app_on_the_bed() {
    ordered_through_the_webhook("istio-native", "istio-proxy").await;
}

/// A pod the webhook would refuse, given anyway (its priorities edited after admission, or
/// injected by other means): `logs` is declared after `istio-proxy`, so the kubelet stops it
/// first, and its priority asks it to wait for istio-proxy. The agent does not hold it for
/// istio-proxy (the pod would be held to its deadline), says so, and both exit in order
/// after the app, on the real containerd.
#[tokio::test]
async fn the_agent_keeps_the_kubelets_order_for_native_sidecars_on_the_bed() {
    let mut pod = example("istio-native");
    let mut logs = pod["spec"]["initContainers"][0].clone();
    logs["name"] = "logs".into();
    logs["lifecycle"]["preStop"]["exec"]["command"] = json!(["sh", "-c", "echo flushed"]);
    pod["spec"]["initContainers"]
        .as_array_mut()
        .expect("init containers")
        .push(logs);
    let mut pod = support::inject_with(&pod, &Settings::default());
    pod["metadata"]["annotations"]["exitorder.io/container-exit-priority"] =
        r#"{"istio-proxy": 1, "logs": 2}"#.into();
    support::set_grace(&mut pod, 20);
    let Some(bed) = Bed::start(Duration::from_secs(3)).await else {
        return;
    };
    if support::project_image(&bed.node).await.is_none() {
        return;
    }
    let running = bed.run_ready(&pod).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show("native_order", &d);
    for sidecar in ["istio-proxy", "logs"] {
        assert_exited_after(&bed, &d, sidecar, "app");
        bed.allowed_ordered(&uid, sidecar, &bed.context(&d)).await;
    }
    // The kubelet's order: logs (declared last) stopped before istio-proxy.
    assert_exited_after(&bed, &d, "istio-proxy", "logs");
    let said = bed.agent.find(|l| {
        l.is(
            "stop_order",
            &[
                ("pod", &uid),
                ("container", "logs"),
                ("not_waiting_for", "istio-proxy"),
            ],
        )
    });
    assert!(
        said.is_some(),
        "no stop_order line:\n{}",
        bed.agent.log_tail(30)
    );
    bed.finish().await;
}

/// The webhook following the agents' DaemonSet through its real watch of the fake API server:
/// mid-rollout (and before it knows) every injected sidecar gets `EXITORDER_PRESENCE=0ms`
/// (it waits for its agent, whatever its release); once the DaemonSet is rolled out, none
/// (the entrypoint's 1 s); an operator's `--agent-presence` wins either way. App containers,
/// which only mark, never get it.
#[tokio::test]
async fn the_presence_wait_follows_the_agents_rollout() {
    use exitorder::webhook::rollout::{self, Agents};
    let api = exitorder_e2e::fakeapi::FakeApi::default();
    let served = api.clone().serve();
    // Not known yet (the watch has not listed): no presence wait.
    let unknown = Served::start_following(
        Settings::default(),
        Duration::ZERO,
        Some(rollout::AgentsView::fixed(Agents::Unknown)),
    )
    .await;
    let (out, _) = inject(&unknown, &example("injected")).await;
    assert_eq!(
        container(&out, "proxy")
            .env
            .unwrap_or_default()
            .iter()
            .find(|e| e.name == "EXITORDER_PRESENCE")
            .and_then(|e| e.value.as_deref()),
        Some("0ms")
    );
    unknown.stop().await;
    api.roll_daemonset("exitorder", "exitorder", 5, 4, 3, 0, 0);
    let (view, watch) =
        rollout::rollout_watch(support::api_client(&served), "exitorder", "exitorder");
    let watching = tokio::spawn(watch.run(std::future::pending()));
    let w = Served::start_following(Settings::default(), Duration::ZERO, Some(view.clone())).await;
    let presence = |pod: &Value, name: &str| -> Option<String> {
        container(pod, name)
            .env
            .unwrap_or_default()
            .into_iter()
            .find(|e| e.name == "EXITORDER_PRESENCE")
            .and_then(|e| e.value)
    };
    let pod = example("injected");
    exitorder_e2e::support::until("the webhook's view", Duration::from_secs(10), || {
        let v = view.clone();
        async move { v.get() == Agents::RollingOut }
    })
    .await;
    let (out, _) = inject(&w, &pod).await;
    assert_eq!(presence(&out, "proxy").as_deref(), Some("0ms"));
    assert_eq!(presence(&out, "app"), None);
    for (updated, want, expected) in [
        (1, Agents::RollingOut, Some("0ms")),
        (3, Agents::Settled, None),
        (2, Agents::RollingOut, Some("0ms")),
    ] {
        api.roll_daemonset("exitorder", "exitorder", 5, 5, 3, updated, updated);
        exitorder_e2e::support::until("the webhook's view", Duration::from_secs(10), || {
            let v = view.clone();
            async move { v.get() == want }
        })
        .await;
        let (out, _) = inject(&w, &pod).await;
        assert_eq!(presence(&out, "proxy").as_deref(), expected, "{want:?}");
        // The exit volume a tmpfs only once every node's agent watches the mount table.
        let exit_volume = out["spec"]["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "exitorder"))
            .map(|v| v["emptyDir"].clone());
        let medium = exit_volume.as_ref().map(|e| e.get("medium").is_some());
        assert_eq!(
            medium,
            Some(want == Agents::Settled),
            "{want:?}: {exit_volume:?}"
        );
    }
    // The DaemonSet gone: no agent anywhere, nothing to wait for.
    api.remove_daemonset("exitorder", "exitorder");
    exitorder_e2e::support::until("the webhook sees it gone", Duration::from_secs(10), || {
        let v = view.clone();
        async move { v.get() == Agents::Settled }
    })
    .await;
    let (out, _) = inject(&w, &pod).await;
    assert_eq!(presence(&out, "proxy"), None);
    w.stop().await;
    // Told a value: it applies whatever the rollout.
    let told = Settings {
        agent_presence: Some(Duration::from_secs(2)),
        ..Settings::default()
    };
    let w = Served::start_following(
        told,
        Duration::ZERO,
        Some(rollout::AgentsView::fixed(Agents::RollingOut)),
    )
    .await;
    let (out, _) = inject(&w, &pod).await;
    assert_eq!(presence(&out, "proxy").as_deref(), Some("2000ms"));
    w.stop().await;
    watching.abort();
}
