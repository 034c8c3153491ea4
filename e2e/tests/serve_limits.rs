//! The agent's endpoint and the webhook under a connection flood. Any pod can reach both (the
//! endpoint is on the node's network). While 2,000 connections are held against each, from
//! eight loopback addresses of their own (as pods have), each reopened as soon as the server
//! closes it, silent (not a byte, not even a TLS handshake) or slow (a request head, a TLS
//! handshake, or a head over TLS, a byte every 250 ms), the real servers answer another
//! peer's scrapes, probes and AdmissionReviews, each within a deadline. The servers hold no
//! more than their limit, count what they closed to make room, and stop with their flood
//! still on.

use exitorder_e2e::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exitorder::serve::Limits;
use exitorder::stats::Stats;
use exitorder::webhook::{CertFiles, Settings, Webhook, WebhookConfig};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::Value;
use support::flood::raise_nofile;
use support::{example, parse_metrics, review_body, until};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

/// Connections the flood keeps open against each server.
const FLOOD: usize = 2_000;
/// Where the flood comes from: more addresses than one, so that it passes the server-wide
/// limit as well as the per-peer one.
const FLOOD_PEERS: &[[u8; 4]] = &[
    [127, 0, 0, 2],
    [127, 0, 0, 3],
    [127, 0, 0, 4],
    [127, 0, 0, 5],
    [127, 0, 0, 6],
    [127, 0, 0, 7],
    [127, 0, 0, 8],
    [127, 0, 0, 9],
];
/// How long one answer (connection, TLS handshake and all) may take under the flood, on a
/// busy two-core machine that also runs the flood.
const DEADLINE: Duration = Duration::from_secs(20);
/// Rounds of requests while the flood is on.
const ROUNDS: usize = 20;
/// The flood's slow connections send a byte this often.
const TRICKLE: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Connects, sends nothing.
    Silent,
    /// A request head, a byte at a time, never finished.
    SlowHead,
    /// A TLS record announcing a ClientHello that comes a byte at a time.
    SlowHandshake,
    /// A whole TLS handshake, then a request head a byte at a time.
    SlowHeadOverTls,
}

struct Flood {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    /// `count` connections to `target`, of `kinds` in turn, from every flood address in turn.
    fn start(
        target: SocketAddr,
        count: usize,
        peers: &[[u8; 4]],
        kinds: &[Kind],
        tls: Option<TlsConnector>,
    ) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let tasks = (0..count)
            .map(|i| {
                let kind = kinds[i % kinds.len()];
                let peer = peers[(i / kinds.len()) % peers.len()];
                let from = SocketAddr::from((peer, 0));
                let (stop, opened, tls) = (Arc::clone(&stop), Arc::clone(&opened), tls.clone());
                tokio::spawn(async move { hold(from, target, kind, tls, &stop, &opened).await })
            })
            .collect();
        Flood {
            stop,
            opened,
            tasks,
        }
    }

    fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }
}

/// Keeps one connection of `kind` open, opening another each time the server closes it.
async fn hold(
    from: SocketAddr,
    target: SocketAddr,
    kind: Kind,
    tls: Option<TlsConnector>,
    stop: &AtomicBool,
    opened: &AtomicUsize,
) {
    const HEAD: &[u8] = b"POST /mutate HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    // Handshake record, TLS 1.0 framing as clients send it, 512 bytes announced; then a
    // ClientHello header announcing 508.
    const HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];
    while !stop.load(Ordering::Relaxed) {
        let tcp = async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(from)?;
            socket.connect(target).await
        };
        let Ok(mut tcp) = tcp.await else {
            // Out of ports or descriptors for a moment: the connections closed make room.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        match (kind, &tls) {
            (Kind::Silent, _) => trickle(&mut tcp, None, stop).await,
            (Kind::SlowHead, _) => {
                if tcp.write_all(HEAD).await.is_ok() {
                    trickle(&mut tcp, Some(b'a'), stop).await;
                }
            }
            (Kind::SlowHandshake, _) => {
                if tcp.write_all(HELLO).await.is_ok() {
                    trickle(&mut tcp, Some(0), stop).await;
                }
            }
            (Kind::SlowHeadOverTls, Some(tls)) => {
                let Ok(mut s) = tls.connect(server_name(), tcp).await else {
                    continue;
                };
                if s.write_all(HEAD).await.is_ok() && s.flush().await.is_ok() {
                    trickle(&mut s, Some(b'a'), stop).await;
                }
            }
            (Kind::SlowHeadOverTls, None) => panic!("a TLS flood needs a connector"),
        }
    }
}

/// Sends `byte` every [`TRICKLE`] until the server closes the connection or the flood stops.
async fn trickle<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    byte: Option<u8>,
    stop: &AtomicBool,
) {
    let mut buf = [0u8; 512];
    loop {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            () = tokio::time::sleep(TRICKLE) => {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                if let Some(b) = byte {
                    if s.write_all(&[b]).await.is_err() || s.flush().await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

fn server_name() -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::try_from("localhost").expect("name")
}

/// What a request got, and how long it took.
struct Reply {
    status: u16,
    body: String,
    took: Duration,
}

/// Sends `head` and `body` on a new connection from 127.0.0.1 (over TLS with `tls`), reads
/// the answer to its end; fails the test past [`DEADLINE`].
async fn ask(target: SocketAddr, tls: Option<&TlsConnector>, head: &str, body: &[u8]) -> Reply {
    async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
        mut s: S,
        head: &str,
        body: &[u8],
    ) -> std::io::Result<Vec<u8>> {
        s.write_all(head.as_bytes()).await?;
        s.write_all(body).await?;
        s.flush().await?;
        let mut out = Vec::new();
        // A TLS close without close_notify is an error here; what was read is whole.
        let _ = s.read_to_end(&mut out).await;
        Ok(out)
    }
    let started = Instant::now();
    let answer = async {
        let tcp = tokio::net::TcpStream::connect(target).await?;
        match tls {
            Some(tls) => exchange(tls.connect(server_name(), tcp).await?, head, body).await,
            None => exchange(tcp, head, body).await,
        }
    };
    let out = tokio::time::timeout(DEADLINE, answer)
        .await
        .unwrap_or_else(|_| panic!("{head:?}: no answer within {DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("{head:?}: {e}"));
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (status_line, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{head:?}: no HTTP answer: {text:?}"));
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{head:?}: bad status line: {status_line:?}"));
    Reply {
        status,
        body: body.to_owned(),
        took,
    }
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
}

fn metric(text: &str, name: &str) -> f64 {
    parse_metrics(text)
        .into_iter()
        .find(|(n, _)| n == name)
        .map_or(f64::NAN, |(_, v)| v)
}

/// The slowest answers, for the record (`--nocapture`).
fn report(what: &str, mut took: Vec<Duration>) {
    took.sort();
    let at = |q: usize| took.get(took.len().saturating_sub(1) * q / 100).copied();
    // A kubelet probe gives up after 1 s by default.
    let past_1s = took.iter().filter(|t| **t > Duration::from_secs(1)).count();
    eprintln!(
        "{what} under the flood: {} answers, p50 {:?}, p90 {:?}, max {:?}, {past_1s} past 1 s",
        took.len(),
        at(50).unwrap_or_default(),
        at(90).unwrap_or_default(),
        took.last().copied().unwrap_or_default()
    );
}

/// Runs `test` on a runtime of its own, one flood at a time: two at once on a two-core
/// machine would measure each other.
fn one_at_a_time(test: impl std::future::Future<Output = ()>) {
    static FLOODS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = FLOODS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(test);
}

#[test]
fn the_agent_endpoint_answers_through_a_flood() {
    one_at_a_time(agent_endpoint_under_flood("agent endpoint", FLOOD_PEERS));
}

/// The kubelet probes the agent from the node's address, which every pod on the host network
/// shares: a flood from the very address of the scrapes and probes does not shut them out
/// either, as each is answering (and passed over) as soon as its head is in.
#[test]
fn the_agent_endpoint_answers_through_a_flood_from_its_clients_address() {
    one_at_a_time(agent_endpoint_under_flood(
        "agent endpoint, flood from 127.0.0.1",
        &[[127, 0, 0, 1]],
    ));
}

async fn agent_endpoint_under_flood(what: &str, peers: &[[u8; 4]]) {
    raise_nofile();
    let listener = exitorder::serve::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stats = Arc::new(Stats::default());
    stats.set_watching(true);
    stats.set_runtime_ok(true);
    let stop = CancellationToken::new();
    let server = tokio::spawn(exitorder::serve::metrics::serve(
        listener,
        Arc::clone(&stats),
        stop.clone(),
    ));
    let flood = Flood::start(addr, FLOOD, peers, &[Kind::Silent, Kind::SlowHead], None);
    let conns = Arc::clone(&stats.http);
    until(
        "the flood's connections opened, and the server making room",
        Duration::from_secs(120),
        || {
            let ready = flood.opened() >= FLOOD && conns.evicted.load(Ordering::Relaxed) > 0;
            async move { ready }
        },
    )
    .await;
    let mut took = Vec::new();
    for round in 0..ROUNDS {
        for (path, says) in [
            ("/metrics", "exitorder_http_connections_evicted_total"),
            ("/readyz", "ready"),
            ("/healthz", "ok"),
        ] {
            let r = ask(addr, None, &get(path), b"").await;
            assert_eq!(r.status, 200, "round {round}: {path}: {}", r.body);
            assert!(r.body.contains(says), "round {round}: {path}: {}", r.body);
            took.push(r.took);
        }
    }
    report(what, took);
    // Closed connections end a moment after they are told to: the count comes back within
    // the limit while the flood goes on.
    let max = Limits::METRICS.max_connections as u64;
    until(
        "open connections within the limit",
        Duration::from_secs(60),
        || {
            let open = conns.open.load(Ordering::Relaxed);
            async move { open <= max }
        },
    )
    .await;
    let text = ask(addr, None, &get("/metrics"), b"").await.body;
    assert!(
        metric(&text, "exitorder_http_connections_evicted_total") > 0.0,
        "{text}"
    );
    assert!(metric(&text, "exitorder_http_connections") >= 1.0, "{text}");
    eprintln!(
        "{what}: {} connections opened by the flood, {} closed to make room",
        flood.opened(),
        conns.evicted.load(Ordering::Relaxed)
    );
    // It stops with the flood still on, and no connection outlives it.
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the endpoint stops within its drain")
        .expect("server task");
    assert_eq!(conns.open.load(Ordering::Relaxed), 0);
    flood.stop().await;
}

/// A test CA, its serving certificate for localhost, and a client trusting it.
struct Pki {
    dir: tempfile::TempDir,
    connector: TlsConnector,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA");
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .signed_by(&key, &ca)
            .expect("sign");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("tls.crt"), cert.pem()).expect("write");
        std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).expect("write");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).expect("CA root");
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Pki {
            dir,
            connector: TlsConnector::from(Arc::new(cfg)),
        }
    }

    fn files(&self) -> CertFiles {
        CertFiles {
            cert: self.dir.path().join("tls.crt"),
            key: self.dir.path().join("tls.key"),
        }
    }
}

#[test]
fn the_webhook_answers_reviews_through_a_flood() {
    one_at_a_time(webhook_under_flood());
}

async fn webhook_under_flood() {
    raise_nofile();
    let pki = Pki::new();
    let webhook = Webhook::bind(WebhookConfig {
        addr: "127.0.0.1:0".parse().expect("addr"),
        files: pki.files(),
        settings: Settings::default(),
        reload_interval: Duration::from_secs(60),
        shutdown_timeout: Duration::from_secs(10),
        drain_delay: Duration::ZERO,
        agents: None,
    })
    .await
    .expect("bind");
    let addr = webhook.local_addr().expect("bound");
    let cancel = CancellationToken::new();
    let server = tokio::spawn(webhook.run(cancel.clone()));
    let tls = Some(&pki.connector);
    let flood = Flood::start(
        addr,
        FLOOD,
        FLOOD_PEERS,
        &[Kind::Silent, Kind::SlowHandshake, Kind::SlowHeadOverTls],
        Some(pki.connector.clone()),
    );
    until(
        "the flood's connections opened, and the webhook making room",
        Duration::from_secs(120),
        || {
            let opened = flood.opened();
            async move {
                if opened < FLOOD {
                    return false;
                }
                let text = ask(addr, tls, &get("/metrics"), b"").await.body;
                metric(&text, "exitorder_webhook_connections_evicted_total") > 0.0
            }
        },
    )
    .await;
    let pod = example("injected");
    let review = review_body(&pod);
    let post = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        review.len()
    );
    let (mut reviews, mut probes) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let r = ask(addr, tls, &post, &review).await;
        assert_eq!(r.status, 200, "round {round}: {}", r.body);
        let out: Value = serde_json::from_str(&r.body).expect("JSON answer");
        assert_eq!(out["kind"], "AdmissionReview", "round {round}: {out}");
        let response = &out["response"];
        assert_eq!(response["uid"], "7e0e7f3c-1d2b-4d7e-9a43-2f1c0f1e1a01");
        assert_eq!(response["allowed"], true, "round {round}: {response}");
        assert_eq!(
            response["patchType"], "JSONPatch",
            "round {round}: {response}"
        );
        reviews.push(r.took);
        let r = ask(addr, tls, &get("/readyz"), b"").await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "ready\n"),
            "round {round}"
        );
        probes.push(r.took);
    }
    report("webhook reviews", reviews);
    report("webhook /readyz", probes);
    let max = Limits::WEBHOOK.max_connections as f64;
    until(
        "open connections within the limit",
        Duration::from_secs(60),
        || async move {
            let text = ask(addr, tls, &get("/metrics"), b"").await.body;
            metric(&text, "exitorder_webhook_connections") <= max
        },
    )
    .await;
    let text = ask(addr, tls, &get("/metrics"), b"").await.body;
    eprintln!(
        "webhook: {} connections opened by the flood, {} closed to make room",
        flood.opened(),
        metric(&text, "exitorder_webhook_connections_evicted_total")
    );
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the webhook stops within its drain")
        .expect("server task");
    flood.stop().await;
}
