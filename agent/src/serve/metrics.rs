//! The agent's HTTP endpoint: `/metrics` (OpenMetrics text), `/healthz` (the process answers
//! and its decision loop goes round),
//! `/readyz` (the share watch runs and the runtime answered its last call).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::decide::Reason;
use crate::handshake::share::Rejection;
use crate::kubelet::kills::Kill;
use crate::serve::openmetrics::{self, Families, Read};
use crate::serve::Limits;
use crate::stats::Stats;

// The series that grow with the pods the agent keeps something of ([`per_pod_series`]).
const PENDING_EXITS: &str = "exitorder_pending_exits";
const VIEW_CONTAINERS: &str = "exitorder_view_containers";
const VIEW_PODS: &str = "exitorder_view_pods";
const JOB_PODS: &str = "exitorder_job_pods";
const KEPT_ENTRIES: &str = "exitorder_kept_entries";

/// Every series that grows with the pods the agent keeps something of, as `/metrics` writes
/// it (name and labels): each must come back down as the agent forgets the pods. The churn
/// test and the bench watch these.
pub fn per_pod_series() -> Vec<String> {
    let mut series: Vec<String> = [VIEW_PODS, VIEW_CONTAINERS, PENDING_EXITS, JOB_PODS]
        .map(str::to_owned)
        .into();
    series.extend(
        crate::stats::Kept::ALL.map(|k| format!("{KEPT_ENTRIES}{{kind=\"{}\"}}", k.as_str())),
    );
    series
}

/// The agent's metric families, read from its [`Stats`] at each scrape.
impl Collector for Read<Stats> {
    fn encode(&self, enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &*self.0;
        let mut f = Families(enc);
        f.histograms(
            "exitorder_allow_latency_seconds",
            "Time from an exit file appearing to allow written.",
            Some("reason"),
            Reason::ALL.map(|r| (r.as_str(), stats.latency(r))),
        )?;
        f.labelled(
            MetricType::Counter,
            "exitorder_allows",
            "Exits allowed, by reason.",
            "reason",
            Reason::ALL.map(|r| (r.as_str(), stats.allows(r))),
        )?;
        f.labelled(
            MetricType::Counter,
            "exitorder_allows_by_kill",
            "Exits allowed, by the kind of kill the agent recognised: a deletion, one of the kubelet's own whole-pod kills (eviction, node_shutdown, active_deadline, preemption, pod_kill: unnamed, unknown: no word), or the restart of one container.",
            "kill",
            Kill::ALL.map(|k| (k.as_str(), stats.allows_in(k))),
        )?;
        f.labelled(
            MetricType::Counter,
            "exitorder_api_reads",
            "Reads of the API server made for a decision (the kubelet's Events of a pod), by what was read.",
            "kind",
            stats.api_reads(),
        )?;
        f.gauge(
            PENDING_EXITS,
            "Containers waiting for exit permission.",
            stats.pending(),
        )?;
        f.labelled(
            MetricType::Gauge,
            "exitorder_event_source",
            "How container exits are detected (1 = in use).",
            "source",
            [(stats.event_source(), 1)],
        )?;
        f.labelled(
            MetricType::Counter,
            "exitorder_runtime_errors",
            "Failed runtime calls, by call.",
            "kind",
            stats.runtime_errors(),
        )?;
        f.labelled(
            MetricType::Counter,
            "exitorder_api_errors",
            "Failed API server calls (pod watch, Events), by kind.",
            "kind",
            stats.api_errors(),
        )?;
        // Every state, 0 or 1: a series per state that never disappears.
        let watch = stats.api_watch();
        f.labelled(
            MetricType::Gauge,
            "exitorder_api_watch",
            "State of the pod watch (1 = current): off means runtime-only.",
            "state",
            crate::stats::API_WATCH_STATES.map(|s| (s, u64::from(s == watch))),
        )?;
        f.labelled(
            MetricType::Counter,
            "exitorder_pod_events",
            "Kubernetes Events about pods, by outcome.",
            "outcome",
            stats.pod_events(),
        )?;
        f.counter(
            "exitorder_share_errors",
            "Share entries that could not be read or written.",
            stats.share_errors(),
        )?;
        f.gauge(
            "exitorder_kernel_exit_source",
            "Whether container exits are seen from the kernel (a pidfd on each container's first process), ahead of the runtime's events.",
            u64::from(stats.kernel_source()),
        )?;
        f.gauge(
            "exitorder_kernel_watched_containers",
            "Running containers whose exit the kernel source awaits.",
            stats.kernel_watches(),
        )?;
        f.counter(
            "exitorder_kernel_exits",
            "Container exits told by the kernel source.",
            stats.kernel_exits(),
        )?;
        f.counter(
            "exitorder_pods_settled_by_cgroup",
            "Stopping pods found by a look at their cgroup to have started no container the agent does not know, with no listing of the runtime.",
            stats.settlements_by_cgroup(),
        )?;
        f.gauge(
            "exitorder_inotify_watches",
            "inotify watches the agent holds on exit directories and the levels above them (root's fs.inotify.max_user_watches is shared with every root process of the node).",
            stats.inotify_watches(),
        )?;
        f.gauge(
            "exitorder_inotify_unavailable",
            "Whether exit directories are polled because no inotify instance could be had (root's fs.inotify.max_user_instances used up).",
            u64::from(stats.inotify_polling()),
        )?;
        f.gauge(
            "exitorder_pods_polled",
            "Pods whose exit directories are polled for now, for having spent their budget of file events or watches.",
            stats.pods_polled(),
        )?;
        f.labelled(
            MetricType::Counter,
            "exitorder_pod_budget_spent",
            "Times a pod's exit directories spent their budget, by what: file events, or watches (directories). The pod is polled for a while.",
            "what",
            stats.pod_budgets_spent(),
        )?;
        f.counter(
            "exitorder_share_breaches",
            "Writable mounts found reaching another pod's exit directories (or every pod's).",
            stats.share_breaches(),
        )?;
        // Every reason, 0 or more: a closed set of series that never disappears.
        f.labelled(
            MetricType::Counter,
            "exitorder_share_rejected",
            "Share entries refused, by reason: links, files that are not regular, entries that are not directories, bad names, unexpected content.",
            "reason",
            Rejection::ALL.map(|why| (why.as_str(), stats.share_rejections(why))),
        )?;
        f.counter(
            "exitorder_exit_file_churn",
            "Waits that came back within the churn window; their decisions were coalesced.",
            stats.exit_churns(),
        )?;
        f.counter(
            "exitorder_waits_withdrawn",
            "Waits whose request went before the agent answered it: the entrypoint's own timeout, its presence wait, a signal, or the container gone.",
            stats.waits_withdrawn(),
        )?;
        let (containers, pods) = stats.view_size();
        f.gauge(
            VIEW_CONTAINERS,
            "Containers the agent's node view holds.",
            containers,
        )?;
        f.gauge(VIEW_PODS, "Pods the agent's node view holds.", pods)?;
        f.connections(
            "exitorder_http_connections",
            "Open connections to this endpoint.",
            &stats.http,
        )?;
        f.gauge(
            "exitorder_ready",
            "Whether the agent is ready (1), as /readyz says: the entrypoint installed, the share watched, the runtime answering.",
            u64::from(readiness(stats).is_ok()),
        )?;
        f.gauge(
            JOB_PODS,
            "Completing pods whose Job shutdown state the agent keeps.",
            stats.job_pods(),
        )?;
        f.counter(
            "exitorder_job_restarts_in_place",
            "In-place restarts of completing pods (a RestartAllContainers rule matched a container's exit), none taken for the end of the Job.",
            stats.job_restarts_in_place(),
        )?;
        // Every kind, 0 or more: a closed set of series that never disappears.
        f.labelled(
            MetricType::Gauge,
            KEPT_ENTRIES,
            "What the agent keeps per pod or container besides the view and the waits, by kind: removed containers' ids (view_tombstones), pods the API server deleted (api_tombstones), problems logged once (warnings), exit files' last appearances (exit_history), directories watched (watches).",
            "kind",
            crate::stats::Kept::ALL.map(|k| (k.as_str(), stats.kept(k))),
        )
    }
}

fn respond(stats: &Arc<Stats>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let text = |code: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = code;
        r
    };
    // No body is ever read here: once answered, hyper drops what of it is already buffered
    // or closes the connection, so nothing a client sends is kept beyond its head.
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match req.uri().path() {
        "/metrics" => {
            let mut r = text(StatusCode::OK, openmetrics::render(stats));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(openmetrics::CONTENT_TYPE),
            );
            r
        }
        "/healthz" => match liveness(stats, std::time::Instant::now()) {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        "/readyz" => match readiness(stats) {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// How long the decision loop may go without a round before `/healthz` fails: it goes round
/// at least every second (a timer of its own), and no step of it blocks for long, so this
/// is a loop that is wedged. The kubelet's liveness probe then restarts the agent, whose
/// successor answers every wait left.
pub const LOOP_SILENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether the agent is alive (`/healthz`): the process answers, and its decision loop went
/// round within [`LOOP_SILENCE`] (or has not started yet: the start-up scan, the runtime's
/// first answer).
pub fn liveness(stats: &Stats, now: std::time::Instant) -> Result<(), String> {
    match stats.loop_silent(now) {
        Some(silent) if silent > LOOP_SILENCE => Err(format!(
            "the decision loop has not gone round for {} s",
            silent.as_secs()
        )),
        _ => Ok(()),
    }
}

/// Whether the agent is ready (`/readyz`, `exitorder_ready`): the entrypoint was installed,
/// the share is watched and the runtime answered its last call; else why not.
pub fn readiness(stats: &Stats) -> Result<(), String> {
    if let Some(refused) = stats.entrypoint_refused() {
        return Err(refused);
    }
    if stats.watching() && stats.runtime_ok() {
        return Ok(());
    }
    Err(format!(
        "share watch {}, runtime {}",
        if stats.watching() {
            "running"
        } else {
            "stopped"
        },
        if stats.runtime_ok() {
            "reachable"
        } else {
            "unreachable"
        }
    ))
}

/// The endpoint served on a thread of its own (see [`spawn`]); it says when it has ended.
#[derive(Debug)]
pub struct Endpoint {
    done: tokio::sync::oneshot::Receiver<()>,
}

impl Endpoint {
    /// Whether the endpoint ended (after its `stop`) within `bound`.
    pub async fn ended_within(self, bound: std::time::Duration) -> bool {
        // A dropped sender is an end too: the thread is gone.
        tokio::time::timeout(bound, self.done).await.is_ok()
    }
}

/// Serves the endpoint on `listener` until `stop`, on a thread and a runtime of its own.
///
/// The decision loop runs on the agent's runtime, and what wedges it (a system call on a
/// hung file system, work that never yields) holds the worker thread it runs on: tokio
/// cannot move the tasks queued on that worker, and the endpoint's accept task is often
/// among them. Served apart, `/healthz` still answers and says why it fails, `/metrics`
/// still shows what the agent was doing, rather than the kubelet's probe timing out on a
/// silent port.
pub fn spawn(
    listener: TcpListener,
    stats: Arc<Stats>,
    stop: CancellationToken,
) -> std::io::Result<Endpoint> {
    // Taken off the agent's runtime here, registered with the endpoint's own below.
    let listener = listener.into_std()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, done) = tokio::sync::oneshot::channel();
    let span = tracing::info_span!("metrics");
    std::thread::Builder::new()
        .name("metrics".to_owned())
        .spawn(move || {
            let _in = span.enter();
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => serve(listener, stats, stop).await,
                    Err(e) => tracing::error!(error = %e, "the metrics listener cannot be served"),
                }
            });
            let _ = tx.send(());
        })?;
    Ok(Endpoint { done })
}

/// Serves the endpoint on `listener` until `stop`, within [`Limits::METRICS`]: it is on the
/// node's network, where any pod can reach it.
pub async fn serve(listener: TcpListener, stats: Arc<Stats>, stop: CancellationToken) {
    let conns = Arc::clone(&stats.http);
    crate::serve::accept_loop(
        listener,
        Limits::METRICS,
        conns,
        stop,
        move |tcp, _peer, conn| {
            let stats = Arc::clone(&stats);
            async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let resp = respond(&stats, &req);
                    async move { Ok::<_, Infallible>(resp) }
                });
                crate::serve::http1(tcp, svc, &Limits::METRICS, conn).await;
            }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn healthz_fails_once_the_decision_loop_is_silent() {
        let stats = Stats::default();
        // Later than the stats' own epoch (taken at their first use).
        stats.loop_silent(std::time::Instant::now());
        let now = std::time::Instant::now() + Duration::from_secs(1);
        // Before the loop's first round (the start-up scan): alive.
        assert_eq!(liveness(&stats, now + Duration::from_secs(3600)), Ok(()));
        stats.loop_beat(now);
        assert_eq!(liveness(&stats, now + Duration::from_secs(9)), Ok(()));
        let err = liveness(&stats, now + Duration::from_secs(12)).unwrap_err();
        assert!(err.contains("has not gone round for 12 s"), "{err}");
        stats.loop_beat(now + Duration::from_secs(12));
        assert_eq!(liveness(&stats, now + Duration::from_secs(13)), Ok(()));
    }

    #[test]
    fn share_rejections_by_reason() {
        use crate::handshake::share::Rejection;
        let stats = Arc::new(Stats::default());
        stats.share_rejected(Rejection::Link);
        stats.share_rejected(Rejection::Link);
        stats.share_rejected(Rejection::NotAFile);
        let out = openmetrics::render(&stats);
        let series: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("exitorder_share_rejected_total"))
            .collect();
        // Every reason, counted or not, and nothing else.
        assert_eq!(
            series,
            [
                "exitorder_share_rejected_total{reason=\"link\"} 2",
                "exitorder_share_rejected_total{reason=\"not_a_file\"} 1",
                "exitorder_share_rejected_total{reason=\"not_a_directory\"} 0",
                "exitorder_share_rejected_total{reason=\"bad_name\"} 0",
                "exitorder_share_rejected_total{reason=\"unexpected_content\"} 0",
            ]
        );
        assert!(out.contains("# TYPE exitorder_share_rejected counter\n"));
    }
}
