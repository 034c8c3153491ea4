//! The admission webhook's latency: the real `exitorder webhook` process, reviews of the
//! example pods (opted in, linkerd, istio native sidecar, and one that did not opt in) sent
//! over HTTPS on one kept-alive connection, as the API server sends them. Measured from the
//! request written to the answer read, in this process.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{json, Value};

use super::proc::{mib, Sample};
use super::summary::summarize;
use crate::node::dirs::{make_temp_dir, DirGuard};

/// The pods reviewed, in turn.
const PODS: [(&str, &str); 4] = [
    (
        "injected",
        include_str!("../../../deploy/examples/injected.yaml"),
    ),
    (
        "linkerd",
        include_str!("../../../deploy/examples/linkerd.yaml"),
    ),
    (
        "istio-native",
        include_str!("../../../deploy/examples/istio-native.yaml"),
    ),
    (
        "two-level",
        include_str!("../../../deploy/examples/two-level.yaml"),
    ),
];

#[derive(Debug, Clone, Serialize)]
pub struct WebhookRow {
    pub reviews: usize,
    pub samples: usize,
    pub review_p50_ms: Option<f64>,
    pub review_p99_ms: Option<f64>,
    pub review_max_ms: Option<f64>,
    /// Answers by outcome: every opted-in example is patched, two-level (no annotation) not.
    pub patched: usize,
    pub unchanged: usize,
    pub denied: usize,
    /// The webhook's resident memory after the reviews.
    pub rss_mib: f64,
    pub cpu_seconds: f64,
}

/// A throwaway CA and a serving pair for 127.0.0.1, written to `dir`; the CA's certificate.
fn certificates(dir: &Path) -> anyhow::Result<rustls::pki_types::CertificateDer<'static>> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["localhost".to_owned()])?.signed_by(&key, &ca)?;
    std::fs::write(dir.join("tls.crt"), cert.pem())?;
    std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
    Ok(ca.der().clone())
}

fn review(uid: usize, pod: &Value) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("bench-{uid}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": pod,
            "dryRun": false
        }
    })
    .to_string()
    .into_bytes()
}

/// Runs `reviews` reviews against `exitorder webhook` started from `binary`.
pub async fn measure(binary: &Path, reviews: usize) -> anyhow::Result<WebhookRow> {
    let dir = DirGuard::new(make_temp_dir("eo-bench-webhook").context("a temporary directory")?);
    let ca = certificates(dir.path())?;
    let addr = SocketAddr::from((
        [127, 0, 0, 1],
        crate::node::free_port().context("a free port")?,
    ));
    let mut child = tokio::process::Command::new(binary)
        .arg("webhook")
        .arg("--cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--key")
        .arg(dir.path().join("tls.key"))
        .args(["--addr", &addr.to_string()])
        .env("EXITORDER_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} webhook", binary.display()))?;
    let pid = child.id().context("the webhook exited at once")?;
    let result = reviews_against(addr, ca, reviews).await;
    let sample = Sample::take(pid);
    let _ = child.start_kill();
    let _ = child.wait().await;
    let (latencies, counts) = result?;
    let sample = sample.context("reading the webhook's /proc")?;
    let s = summarize(&latencies);
    Ok(WebhookRow {
        reviews,
        samples: latencies.len(),
        review_p50_ms: s.map(|s| s.p50_ms),
        review_p99_ms: s.map(|s| s.p99_ms),
        review_max_ms: s.map(|s| s.max_ms),
        patched: counts[0],
        unchanged: counts[1],
        denied: counts[2],
        rss_mib: mib(sample.memory.rss_kib),
        cpu_seconds: sample.cpu_seconds,
    })
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(
    addr: SocketAddr,
    ca: rustls::pki_types::CertificateDer<'static>,
) -> anyhow::Result<Sender> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca)?;
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let deadline = Instant::now() + Duration::from_secs(20);
    let tcp = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(t) => break t,
            Err(e) if Instant::now() >= deadline => {
                bail!("the webhook did not listen on {addr} within 20 s: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

async fn reviews_against(
    addr: SocketAddr,
    ca: rustls::pki_types::CertificateDer<'static>,
    reviews: usize,
) -> anyhow::Result<(Vec<f64>, [usize; 3])> {
    let pods = PODS
        .iter()
        .map(|(name, yaml)| {
            crate::kubelet::pod_from_yaml(yaml).with_context(|| format!("example {name}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut sender = connect(addr, ca).await?;
    let mut latencies = Vec::with_capacity(reviews);
    let mut counts = [0usize; 3];
    for i in 0..reviews {
        let body = review(i, &pods[i % pods.len()]);
        let req = hyper::Request::post("/mutate")
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        sender.ready().await?;
        let started = Instant::now();
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
        if !status.is_success() {
            bail!(
                "review {i}: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        let answer: Value = serde_json::from_slice(&bytes)?;
        let r = &answer["response"];
        let slot = match (r["allowed"].as_bool(), r.get("patch").is_some()) {
            (Some(true), true) => 0,
            (Some(true), false) => 1,
            _ => 2,
        };
        counts[slot] += 1;
    }
    Ok((latencies, counts))
}
