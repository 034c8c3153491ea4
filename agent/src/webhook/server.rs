//! The webhook's HTTPS endpoint: `POST /mutate` and `POST /validate` (AdmissionReview),
//! `GET /healthz`, `GET /readyz`, `GET /metrics`, all on one TLS port.
//!
//! The API server gives a webhook `timeoutSeconds` (at most 10 s) and then goes on without
//! it (failurePolicy Ignore): every request here is answered well within that or dropped, a
//! slow or endless body included, and no body is read past its limit.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use super::mutate::Settings;
use super::review::{self, Outcome};
use super::rollout::AgentsView;
use super::tls::{CertFiles, ReloadCounts, Reloading, TlsError};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::serve::openmetrics::{self, Families, Read};
use crate::serve::{self, Limits};
use crate::stats::ConnStats;
use crate::stats::Histogram;

/// Larger than any pod the API server accepts (its request limit is 3 MiB), with room for
/// the review around it.
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// A TLS handshake, the request head and its body each get this long.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("address {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving certificate: {0}")]
    Tls(#[from] TlsError),
}

/// Everything the webhook needs.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub addr: SocketAddr,
    pub files: CertFiles,
    pub settings: Settings,
    /// How often the certificate files are checked for a change.
    pub reload_interval: Duration,
    /// How long the in-flight requests get after `cancel`.
    pub shutdown_timeout: Duration,
    /// How long it goes on serving after `cancel`, saying it is not ready: the Service's
    /// endpoints are removed some time after the pod is told to stop, and a request sent
    /// meanwhile must not meet a closed port (failurePolicy Ignore would admit the pod
    /// without its injection).
    pub drain_delay: Duration,
    /// The agents' rollout, when the webhook follows their DaemonSet: what an injected
    /// sidecar's presence wait is (see [`super::rollout`]).
    pub agents: Option<AgentsView>,
}

/// What the endpoint counts.
#[derive(Default)]
pub struct WebhookStats {
    draining: std::sync::atomic::AtomicBool,
    reviews: [AtomicU64; Outcome::ALL.len()],
    invalid: AtomicU64,
    latency: Histogram,
    reloads: Arc<ReloadCounts>,
    conns: Arc<ConnStats>,
}

impl WebhookStats {
    fn reviews_of(&self, o: Outcome) -> &AtomicU64 {
        let [patched, unchanged, denied] = &self.reviews;
        match o {
            Outcome::Patched => patched,
            Outcome::Unchanged => unchanged,
            Outcome::Denied => denied,
        }
    }
}

/// The webhook's metric families, read from its [`WebhookStats`] at each scrape.
impl Collector for Read<WebhookStats> {
    fn encode(&self, enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &*self.0;
        let mut f = Families(enc);
        let counted =
            Outcome::ALL.map(|o| (o.as_str(), stats.reviews_of(o).load(Ordering::Relaxed)));
        let invalid = ("invalid", stats.invalid.load(Ordering::Relaxed));
        f.labelled(
            MetricType::Counter,
            "exitorder_webhook_reviews",
            "Admission reviews answered, by outcome.",
            "outcome",
            counted.into_iter().chain([invalid]),
        )?;
        f.histograms(
            "exitorder_webhook_review_seconds",
            "Time from a review's request head to its answer.",
            None,
            [("", &stats.latency)],
        )?;
        f.labelled(
            MetricType::Counter,
            "exitorder_webhook_certificate_reloads",
            "Serving certificate reloads, by result.",
            "result",
            [
                ("ok", stats.reloads.ok.load(Ordering::Relaxed)),
                ("failed", stats.reloads.failed.load(Ordering::Relaxed)),
            ],
        )?;
        f.connections(
            "exitorder_webhook_connections",
            "Open connections.",
            &stats.conns,
        )
    }
}

/// A bound webhook, ready to serve.
pub struct Webhook {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    certs: Arc<Reloading>,
    cfg: WebhookConfig,
    stats: Arc<WebhookStats>,
}

impl Webhook {
    /// Loads the certificate and binds the port: what can fail at start-up fails here.
    pub async fn bind(cfg: WebhookConfig) -> Result<Self, WebhookError> {
        let certs = Reloading::new(cfg.files.clone())?;
        let acceptor = TlsAcceptor::from(Arc::new(certs.server_config()?));
        let listener = serve::bind(cfg.addr).map_err(|source| WebhookError::Listen {
            addr: cfg.addr,
            source,
        })?;
        Ok(Webhook {
            listener,
            acceptor,
            certs,
            cfg,
            stats: Arc::new(WebhookStats::default()),
        })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `cancel`, then lets the requests in flight finish within the shutdown
    /// timeout; connections still open then are dropped.
    pub async fn run(self, cancel: CancellationToken) {
        let Webhook {
            listener,
            acceptor,
            certs,
            cfg,
            stats,
        } = self;
        if let Ok(addr) = listener.local_addr() {
            info!(addr = %addr, "webhook listening (TLS)");
        }
        let reload = tokio::spawn(
            certs
                .watch(cfg.reload_interval, Arc::clone(&stats.reloads))
                .instrument(tracing::info_span!("certificate_reload")),
        );
        let settings = Arc::new(cfg.settings);
        let agents = cfg.agents.clone();
        // Connections stop at the end of the drain, not at `cancel`.
        let stop = CancellationToken::new();
        let drained = {
            let (cancel, stop, stats) = (cancel.clone(), stop.clone(), Arc::clone(&stats));
            let delay = cfg.drain_delay;
            async move {
                cancel.cancelled().await;
                stats.draining.store(true, Ordering::Relaxed);
                info!(delay = ?delay, "webhook draining: not ready, still answering");
                tokio::time::sleep(delay).await;
                stop.cancel();
            }
        };
        let serving = {
            let stats = Arc::clone(&stats);
            serve::accept_loop(
                listener,
                Limits::WEBHOOK,
                Arc::clone(&stats.conns),
                stop.clone(),
                move |tcp, _peer, conn| {
                    Connection {
                        acceptor: acceptor.clone(),
                        settings: Arc::clone(&settings),
                        agents: agents.clone(),
                        stats: Arc::clone(&stats),
                        conn,
                    }
                    .serve(tcp)
                },
            )
        };
        tokio::pin!(serving);
        tokio::select! {
            () = &mut serving => {}
            () = drained => {
                info!("webhook shutting down");
                if tokio::time::timeout(cfg.shutdown_timeout, serving).await.is_err() {
                    warn!(timeout = ?cfg.shutdown_timeout, "connections still open at the end of the shutdown; dropped");
                }
            }
        }
        reload.abort();
    }
}

struct Connection {
    acceptor: TlsAcceptor,
    settings: Arc<Settings>,
    agents: Option<AgentsView>,
    stats: Arc<WebhookStats>,
    conn: serve::Conn,
}

impl Connection {
    async fn serve(self, tcp: tokio::net::TcpStream) {
        let handshake = tokio::time::timeout(IO_TIMEOUT, self.acceptor.accept(tcp));
        let tls = match tokio::select! {
            r = handshake => r,
            () = self.conn.stop.cancelled() => return,
        } {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                debug!(error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                debug!("TLS handshake timed out");
                return;
            }
        };
        let (settings, agents, stats) = (self.settings, self.agents, self.stats);
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (settings, stats) = (Arc::clone(&settings), Arc::clone(&stats));
            let settings = with_agents(settings, agents.as_ref());
            async move { Ok::<_, Infallible>(respond(req, &settings, &stats).await) }
        });
        serve::http1(tls, svc, &Limits::WEBHOOK, self.conn).await;
    }
}

/// The settings a review is answered with, following the agents' rollout as it is now (read
/// once per request; the webhook's own when nothing changes).
fn with_agents(settings: Arc<Settings>, agents: Option<&AgentsView>) -> Arc<Settings> {
    let Some(agents) = agents else {
        return settings;
    };
    let now = super::rollout::following(&settings, agents.get());
    if now.agent_presence == settings.agent_presence
        && now.mark_containers == settings.mark_containers
        && now.exits_in_memory == settings.exits_in_memory
    {
        return settings;
    }
    Arc::new(now)
}

fn text(code: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    r
}

async fn respond(
    req: Request<Incoming>,
    settings: &Settings,
    stats: &Arc<WebhookStats>,
) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/mutate") => {
            review_request(review::Ask::Mutate, req, settings, stats).await
        }
        (&Method::POST, "/validate") => {
            review_request(review::Ask::Validate, req, settings, stats).await
        }
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") if stats.draining.load(Ordering::Relaxed) => {
            text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
        }
        // Serving at all means a certificate loaded: start-up fails without one.
        (&Method::GET, "/readyz") => text(StatusCode::OK, "ready\n"),
        (&Method::GET, "/metrics") => {
            let mut r = text(StatusCode::OK, openmetrics::render(stats));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(openmetrics::CONTENT_TYPE),
            );
            r
        }
        (_, "/mutate" | "/validate" | "/healthz" | "/readyz" | "/metrics") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

async fn review_request(
    ask: review::Ask,
    req: Request<Incoming>,
    settings: &Settings,
    stats: &WebhookStats,
) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let invalid = |code: StatusCode, why: String| {
        stats.invalid.fetch_add(1, Ordering::Relaxed);
        debug!(event = "review_invalid", reason = %why, "request refused");
        text(code, format!("{why}\n"))
    };
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        // Refused before reading any of it.
        return invalid(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {MAX_BODY} bytes"),
        );
    }
    let body = Limited::new(req.into_body(), MAX_BODY);
    let bytes = match tokio::time::timeout(IO_TIMEOUT, body.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return invalid(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than {MAX_BODY} bytes"),
            )
        }
        Ok(Err(e)) => return invalid(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
        Err(_) => {
            return invalid(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body took longer than {IO_TIMEOUT:?}"),
            )
        }
    };
    match review::answer_to(ask, &bytes, settings) {
        Ok(a) => {
            stats.reviews_of(a.outcome).fetch_add(1, Ordering::Relaxed);
            stats.latency.observe(started.elapsed());
            match &a.message {
                Some(m) => {
                    info!(event = "review", outcome = a.outcome.as_str(), pod = %a.pod, reason = %m, "pod refused")
                }
                None => debug!(event = "review", outcome = a.outcome.as_str(), pod = %a.pod),
            }
            let mut r = text(StatusCode::OK, a.body);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => invalid(StatusCode::BAD_REQUEST, e.to_string()),
    }
}
