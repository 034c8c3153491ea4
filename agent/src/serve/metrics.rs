//! The agent's HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the process answers),
//! `/readyz` (the share watch runs and the runtime answered its last call).

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::decide::Reason;
use crate::serve::Limits;
use crate::stats::{Histogram, Stats, LATENCY_BUCKETS};

/// Renders every metric family in the Prometheus text format.
pub fn render(stats: &Stats) -> String {
    let mut out = String::with_capacity(4096);
    let _ = writeln!(
        out,
        "# HELP exitorder_allow_latency_seconds Time from an exit file appearing to allow written.\n\
         # TYPE exitorder_allow_latency_seconds histogram"
    );
    for reason in Reason::ALL {
        write_histogram(
            &mut out,
            "exitorder_allow_latency_seconds",
            &format!("reason=\"{reason}\""),
            stats.latency(reason),
        );
    }
    let _ = writeln!(
        out,
        "# HELP exitorder_allows_total Exits allowed, by reason.\n# TYPE exitorder_allows_total counter"
    );
    for reason in Reason::ALL {
        let _ = writeln!(
            out,
            "exitorder_allows_total{{reason=\"{reason}\"}} {}",
            stats.allows(reason)
        );
    }
    let _ = writeln!(
        out,
        "# HELP exitorder_pending_exits Containers waiting for exit permission.\n\
         # TYPE exitorder_pending_exits gauge\nexitorder_pending_exits {}",
        stats.pending()
    );
    let _ = writeln!(
        out,
        "# HELP exitorder_event_source How container exits are detected (1 = in use).\n\
         # TYPE exitorder_event_source gauge\nexitorder_event_source{{source=\"{}\"}} 1",
        stats.event_source()
    );
    let _ = writeln!(
        out,
        "# HELP exitorder_runtime_errors_total Failed runtime calls, by call.\n\
         # TYPE exitorder_runtime_errors_total counter"
    );
    for (kind, n) in stats.runtime_errors() {
        let _ = writeln!(out, "exitorder_runtime_errors_total{{kind=\"{kind}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP exitorder_api_errors_total Failed API server calls (pod watch, Events), by kind.\n\
         # TYPE exitorder_api_errors_total counter"
    );
    for (kind, n) in stats.api_errors() {
        let _ = writeln!(out, "exitorder_api_errors_total{{kind=\"{kind}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP exitorder_api_watch State of the pod watch (1 = current): off means runtime-only.\n\
         # TYPE exitorder_api_watch gauge"
    );
    // Every state, 0 or 1: a series per state that never disappears.
    for state in crate::stats::API_WATCH_STATES {
        let on = u8::from(stats.api_watch() == state);
        let _ = writeln!(out, "exitorder_api_watch{{state=\"{state}\"}} {on}");
    }
    let _ = writeln!(
        out,
        "# HELP exitorder_pod_events_total Kubernetes Events about pods, by outcome.\n\
         # TYPE exitorder_pod_events_total counter"
    );
    for (outcome, n) in stats.pod_events() {
        let _ = writeln!(
            out,
            "exitorder_pod_events_total{{outcome=\"{outcome}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP exitorder_share_errors_total Share entries that could not be read or written.\n\
         # TYPE exitorder_share_errors_total counter\nexitorder_share_errors_total {}",
        stats.share_errors()
    );
    let _ = writeln!(
        out,
        "# HELP exitorder_kernel_exit_source Whether container exits are seen from the kernel (a pidfd on each container's first process), ahead of the runtime's events.\n\
         # TYPE exitorder_kernel_exit_source gauge\nexitorder_kernel_exit_source {}\n\
         # HELP exitorder_kernel_watched_containers Running containers whose exit the kernel source awaits.\n\
         # TYPE exitorder_kernel_watched_containers gauge\nexitorder_kernel_watched_containers {}\n\
         # HELP exitorder_kernel_exits_total Container exits told by the kernel source.\n\
         # TYPE exitorder_kernel_exits_total counter\nexitorder_kernel_exits_total {}\n\
         # HELP exitorder_pods_settled_by_cgroup_total Stopping pods found by a look at their cgroup to have started no container the agent does not know, with no listing of the runtime.\n\
         # TYPE exitorder_pods_settled_by_cgroup_total counter\nexitorder_pods_settled_by_cgroup_total {}",
        u8::from(stats.kernel_source()),
        stats.kernel_watches(),
        stats.kernel_exits(),
        stats.settlements_by_cgroup()
    );
    let _ = writeln!(
        out,
        "# HELP exitorder_share_breaches_total Writable mounts found reaching another pod's exit directories (or every pod's).\n\
         # TYPE exitorder_share_breaches_total counter\nexitorder_share_breaches_total {}",
        stats.share_breaches()
    );
    let _ = writeln!(
        out,
        "# HELP exitorder_share_rejected_total Share entries refused, by reason: links, files that are not regular, entries that are not directories, bad names, unexpected content.\n\
         # TYPE exitorder_share_rejected_total counter"
    );
    // Every reason, 0 or more: a closed set of series that never disappears.
    for why in crate::handshake::share::Rejection::ALL {
        let _ = writeln!(
            out,
            "exitorder_share_rejected_total{{reason=\"{why}\"}} {}",
            stats.share_rejections(why)
        );
    }
    let _ = writeln!(
        out,
        "# HELP exitorder_exit_file_churn_total Waits that came back within the churn window; their decisions were coalesced.\n\
         # TYPE exitorder_exit_file_churn_total counter\nexitorder_exit_file_churn_total {}",
        stats.exit_churns()
    );
    let (containers, pods) = stats.view_size();
    let _ = writeln!(
        out,
        "# HELP exitorder_view_containers Containers the agent's node view holds.\n\
         # TYPE exitorder_view_containers gauge\nexitorder_view_containers {containers}\n\
         # HELP exitorder_view_pods Pods the agent's node view holds.\n\
         # TYPE exitorder_view_pods gauge\nexitorder_view_pods {pods}"
    );
    let _ = writeln!(
        out,
        "# HELP exitorder_http_connections Open connections to this endpoint.\n\
         # TYPE exitorder_http_connections gauge\nexitorder_http_connections {}\n\
         # HELP exitorder_http_connections_evicted_total Connections closed to make room for a new one, from the peer holding the most.\n\
         # TYPE exitorder_http_connections_evicted_total counter\nexitorder_http_connections_evicted_total {}",
        stats.http.open.load(std::sync::atomic::Ordering::Relaxed),
        stats.http.evicted.load(std::sync::atomic::Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP exitorder_ready Whether the agent is ready (1), as /readyz says: the entrypoint installed, the share watched, the runtime answering.\n\
         # TYPE exitorder_ready gauge\nexitorder_ready {}",
        u8::from(readiness(stats).is_ok())
    );
    let _ = writeln!(
        out,
        "# HELP exitorder_job_pods Completing pods whose Job shutdown state the agent keeps.\n\
         # TYPE exitorder_job_pods gauge\nexitorder_job_pods {}\n\
         # HELP exitorder_job_restarts_in_place_total In-place restarts of completing pods (a RestartAllContainers rule matched a container's exit), none taken for the end of the Job.\n\
         # TYPE exitorder_job_restarts_in_place_total counter\nexitorder_job_restarts_in_place_total {}",
        stats.job_pods(),
        stats.job_restarts_in_place()
    );
    let _ = writeln!(
        out,
        "# HELP exitorder_kept_entries What the agent keeps per pod or container besides the view and the waits, by kind: removed containers' ids (view_tombstones), pods the API server deleted (api_tombstones), problems logged once (warnings), exit files' last appearances (exit_history), directories watched (watches).\n\
         # TYPE exitorder_kept_entries gauge"
    );
    // Every kind, 0 or more: a closed set of series that never disappears.
    for kind in crate::stats::Kept::ALL {
        let _ = writeln!(
            out,
            "exitorder_kept_entries{{kind=\"{}\"}} {}",
            kind.as_str(),
            stats.kept(kind)
        );
    }
    out
}

/// One histogram's samples (`labels`: `key="value"` pairs, or empty), after its HELP/TYPE.
pub fn write_histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let (buckets, count, sum) = h.read();
    let sep = if labels.is_empty() { "" } else { "," };
    for (le, n) in LATENCY_BUCKETS.iter().zip(buckets) {
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {n}");
    }
    let set = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(
        out,
        "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}\n{name}_sum{set} {sum}\n{name}_count{set} {count}"
    );
}

fn respond(stats: &Stats, req: &Request<Incoming>) -> Response<Full<Bytes>> {
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
            let mut r = text(StatusCode::OK, render(stats));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
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
    fn histograms_with_and_without_labels() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(3));
        let mut out = String::new();
        write_histogram(&mut out, "x_seconds", "reason=\"ordered\"", &h);
        assert!(
            out.starts_with("x_seconds_bucket{reason=\"ordered\",le=\"0.001\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{reason=\"ordered\",le=\"0.005\"} 1\n"),
            "{out}"
        );
        assert!(
            out.ends_with(
                "x_seconds_bucket{reason=\"ordered\",le=\"+Inf\"} 1\n\
             x_seconds_sum{reason=\"ordered\"} 0.003\n\
             x_seconds_count{reason=\"ordered\"} 1\n"
            ),
            "{out}"
        );
        let mut out = String::new();
        write_histogram(&mut out, "y_seconds", "", &h);
        assert!(
            out.starts_with("y_seconds_bucket{le=\"0.001\"} 0\n"),
            "{out}"
        );
        assert!(
            out.ends_with(
                "y_seconds_bucket{le=\"+Inf\"} 1\ny_seconds_sum 0.003\ny_seconds_count 1\n"
            ),
            "{out}"
        );
        assert_eq!(out.lines().count(), LATENCY_BUCKETS.len() + 3);
    }

    #[test]
    fn share_rejections_by_reason() {
        use crate::handshake::share::Rejection;
        let stats = Stats::default();
        stats.share_rejected(Rejection::Link);
        stats.share_rejected(Rejection::Link);
        stats.share_rejected(Rejection::NotAFile);
        let out = render(&stats);
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
        assert!(out.contains("# TYPE exitorder_share_rejected_total counter\n"));
    }
}
