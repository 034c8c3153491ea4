//! The real agent loop on a temp share against an in-process fake CRI runtime.

use exitorder_e2e::rig;
use exitorder_e2e::support;

use std::time::{Duration, Instant};

use exitorder::agent::Config;
use exitorder::cri::{ContainerEventType, ContainerState};
use exitorder::decide::priority::ANNOTATION;
use exitorder::decide::Reason;
use rig::*;
use support::parse_metrics;

/// Starts the agent, has `waiting` ask to exit, and checks that it is held while `blocker`
/// runs and allowed once it exits.
async fn assert_held_until_exit(rig: &mut Rig, waiting: &str, blocker: &str) {
    rig.start_agent();
    let f = rig.request_exit(APP_UID, waiting);
    stays_waiting(&f, Duration::from_millis(200)).await;
    rig.cri()
        .set_state(blocker, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    rig.stop_agent().await;
}

fn two_level_pod(rig: &Rig, grace: u64) -> (String, String) {
    rig.cri()
        .add_pod(APP_UID, &[(ANNOTATION, r#"{"proxy":1}"#)]);
    let app = rig.cri().add_container(APP_UID, "app", 0, grace);
    let proxy = rig.cri().add_container(APP_UID, "proxy", 0, grace);
    (app, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_waits_until_main_exits() {
    let mut rig = Rig::new();
    let (app, _proxy) = two_level_pod(&rig, 60);
    rig.start_agent();
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(300)).await;
    assert_eq!(rig.stats.pending(), 1);
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&rig.stats, Reason::Ordered, 1).await;
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_levels_answered_in_order() {
    let mut rig = Rig::new();
    rig.cri()
        .add_pod(APP_UID, &[(ANNOTATION, r#"{"proxy":1,"logs":2}"#)]);
    let app = rig.cri().add_container(APP_UID, "app", 0, 60);
    let proxy = rig.cri().add_container(APP_UID, "proxy", 0, 60);
    rig.cri().add_container(APP_UID, "logs", 0, 60);
    rig.start_agent();
    let fp = rig.request_exit(APP_UID, "proxy");
    let fl = rig.request_exit(APP_UID, "logs");
    stays_waiting(&fp, Duration::from_millis(200)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&fp, Duration::from_secs(2)).await);
    // The proxy was allowed but still runs: logs keeps waiting for it.
    stays_waiting(&fl, Duration::from_millis(200)).await;
    rig.cri().set_state(&proxy, ContainerState::ContainerExited);
    assert!(allowed_within(&fl, Duration::from_secs(2)).await);
    rig.stop_agent().await;
}

/// Native sidecars (the webhook's annotation on the sandbox: no API server needed) declared
/// istio-proxy then logs: the kubelet stops logs first. Priorities that ask logs to wait for
/// istio-proxy are not followed for that pair, or the pod would be held to its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_sidecar_never_waits_for_one_the_kubelet_stops_later() {
    let mut rig = Rig::new();
    rig.cri().add_pod(
        APP_UID,
        &[
            (ANNOTATION, r#"{"istio-proxy":1,"logs":2}"#),
            (
                exitorder_contract::annotation::NATIVE_SIDECARS,
                r#"["istio-proxy","logs"]"#,
            ),
        ],
    );
    let app = rig.cri().add_container(APP_UID, "app", 0, 60);
    rig.cri().add_container(APP_UID, "istio-proxy", 0, 60);
    rig.cri().add_container(APP_UID, "logs", 0, 60);
    rig.start_agent();
    let logs = rig.request_exit(APP_UID, "logs");
    let proxy = rig.request_exit(APP_UID, "istio-proxy");
    // Both wait for the app, which the kubelet stops before any native sidecar.
    stays_waiting(&logs, Duration::from_millis(200)).await;
    stays_waiting(&proxy, Duration::from_millis(10)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    // istio-proxy still runs, and logs is allowed all the same.
    assert!(allowed_within(&logs, Duration::from_secs(2)).await);
    assert!(allowed_within(&proxy, Duration::from_secs(2)).await);
    allows_reach(&rig.stats, Reason::Ordered, 2).await;
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_agent_answers_files_already_waiting() {
    let mut rig = Rig::new();
    let (app, _) = two_level_pod(&rig, 60);
    rig.start_agent();
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;
    rig.stop_agent().await;
    // Main exits while no agent runs; a new agent must find the waiting file by scanning.
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    stays_waiting(&f, Duration::from_millis(100)).await;
    rig.start_agent();
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_agent_keeps_order_for_files_already_waiting() {
    let mut rig = Rig::new();
    let (app, _) = two_level_pod(&rig, 60);
    // Written while no agent runs.
    let f = rig.request_exit(APP_UID, "proxy");
    rig.start_agent();
    stays_waiting(&f, Duration::from_millis(300)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_main_container_is_waited_for() {
    let mut rig = Rig::new();
    rig.cri()
        .add_pod(APP_UID, &[(ANNOTATION, r#"{"proxy":1}"#)]);
    let old = rig.cri().add_container(APP_UID, "app", 0, 60);
    rig.cri().set_state(&old, ContainerState::ContainerExited);
    let new = rig.cri().add_container(APP_UID, "app", 1, 60);
    rig.cri().add_container(APP_UID, "proxy", 0, 60);
    assert_held_until_exit(&mut rig, "proxy", &new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_priority_orders_a_pod_without_annotation() {
    let mut rig = Rig::new();
    rig.cri().add_pod(APP_UID, &[]);
    let app = rig.cri().add_container(APP_UID, "app", 0, 60);
    let shipper = rig.cri().add_container(APP_UID, "log-shipper", 0, 60);
    rig.cri().set_env(&shipper, "KRUISE_EXIT_PRIORITY", "3");
    assert_held_until_exit(&mut rig, "log-shipper", &app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_proxy_preset_waits_without_any_priority_given() {
    let mut rig = Rig::new();
    rig.cri().add_pod(APP_UID, &[]);
    let app = rig.cri().add_container(APP_UID, "app", 0, 60);
    rig.cri().add_container(APP_UID, "linkerd-proxy", 0, 60);
    assert_held_until_exit(&mut rig, "linkerd-proxy", &app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_annotation_never_holds_the_pod() {
    for bad in [
        r#"{"proxy":256}"#,
        r#"{"proxy":-1}"#,
        "not json",
        r#"{"proxy":"1"}"#,
    ] {
        let mut rig = Rig::new();
        rig.cri().add_pod(APP_UID, &[(ANNOTATION, bad)]);
        rig.cri().add_container(APP_UID, "app", 0, 60);
        rig.cri().add_container(APP_UID, "proxy", 0, 60);
        rig.start_agent();
        let f = rig.request_exit(APP_UID, "proxy");
        assert!(allowed_within(&f, Duration::from_secs(2)).await, "{bad}");
        allows_reach(&rig.stats, Reason::Ordered, 1).await;
        rig.stop_agent().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_pod_fails_open() {
    let mut rig = Rig::new();
    rig.start_agent();
    let f = rig.request_exit(APP_UID, "proxy");
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&rig.stats, Reason::Unknown, 1).await;
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_releases_before_the_grace_period_ends() {
    let mut rig = Rig::new();
    rig.reserve = Duration::from_millis(1500);
    two_level_pod(&rig, 2);
    rig.start_agent();
    let started = Instant::now();
    let f = rig.request_exit(APP_UID, "proxy");
    assert!(allowed_within(&f, Duration::from_secs(3)).await);
    let took = started.elapsed();
    // grace 2 s - reserve 1.5 s: released at about 0.5 s, while main still runs.
    assert!(
        took >= Duration::from_millis(450),
        "released after {took:?}"
    );
    allows_reach(&rig.stats, Reason::Deadline, 1).await;
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_down_still_releases_at_the_deadline() {
    let mut rig = Rig::new();
    rig.reserve = Duration::from_millis(1500);
    two_level_pod(&rig, 2);
    rig.start_agent();
    // The agent learns the grace period while the runtime answers...
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;
    // ...then the runtime fails: the wait must still end by the deadline.
    rig.cri().fail_with(Some(tonic::Code::Unavailable));
    assert!(allowed_within(&f, Duration::from_secs(3)).await);
    allows_reach(&rig.stats, Reason::Deadline, 1).await;
    assert!(!rig.stats.runtime_errors().is_empty());
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_entries_are_skipped_and_the_agent_keeps_working() {
    let mut rig = Rig::new();
    let (app, _) = two_level_pod(&rig, 60);
    let pods = rig.share.join("pods");
    std::fs::create_dir_all(pods.join("NOT-A-UID/proxy")).unwrap();
    std::fs::write(pods.join("NOT-A-UID/proxy/exit"), "wait").unwrap();
    std::fs::create_dir_all(pods.join(APP_UID).join("Bad_Name")).unwrap();
    std::fs::write(pods.join(APP_UID).join("Bad_Name/exit"), "wait").unwrap();
    let odd = rig.request_exit(APP_UID, "odd");
    std::fs::write(&odd, "something else").unwrap();
    rig.start_agent();
    // Also after start-up, while the agent runs.
    std::fs::create_dir_all(pods.join("..uid..")).unwrap();
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    assert_eq!(content(&odd), "something else");
    assert_eq!(content(&pods.join("NOT-A-UID/proxy/exit")), "wait");
    rig.stop_agent().await;
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamically_linked_entrypoint_is_refused_and_the_agent_stays_not_ready() {
    // What `cargo build --release` gives: this test binary is linked the same way.
    let dynamic = std::env::current_exe().unwrap();
    let mut rig = Rig::new();
    let (app, _) = two_level_pod(&rig, 60);
    rig.start_agent_with(|cfg| cfg.entrypoint_binary = Some(dynamic.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let http = tokio::spawn(exitorder::serve::metrics::serve(
        listener,
        rig.stats.clone(),
        tokio_util::sync::CancellationToken::new(),
    ));
    // Whatever else comes up, readiness keeps saying why, naming the file and the fix.
    let (code, body) = http_get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains(&dynamic.display().to_string()), "{body}");
    assert!(
        body.contains("dynamically linked") && body.contains("crt-static"),
        "{body}"
    );
    assert!(!rig.share.join("bin/exitorder-entrypoint").exists());
    // The agent still answers waits: an entrypoint installed earlier may be serving pods.
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    assert_eq!(http_get(addr, "/readyz").await.0, 503);
    http.abort();
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_entrypoint_is_installed() {
    let busybox = std::path::Path::new("/bin/busybox");
    if !exitorder::handshake::elf::is_static_elf(busybox).unwrap_or(false) {
        // Only where busybox-static is installed (every end-to-end machine).
        return;
    }
    let mut rig = Rig::new();
    rig.start_agent_with(|cfg| cfg.entrypoint_binary = Some(busybox.to_owned()));
    // In the bin directory, apart from the share: nothing a pod can write.
    let installed = rig.bin_dir.join("exitorder-entrypoint");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(busybox).unwrap()
    );
    assert!(!rig.share.join("bin").exists());
    assert!(rig.stats.entrypoint_refused().is_none());
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_endpoints() {
    let mut rig = Rig::new();
    let (app, _) = two_level_pod(&rig, 60);
    rig.start_agent();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let http = tokio::spawn(exitorder::serve::metrics::serve(
        listener,
        rig.stats.clone(),
        tokio_util::sync::CancellationToken::new(),
    ));
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;

    let (code, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    let m = parse_metrics(&body);
    let get = |name: &str| m.iter().find(|(s, _)| s == name).map(|(_, v)| *v);
    for family in [
        "exitorder_allow_latency_seconds_bucket",
        "exitorder_allows_total",
        "exitorder_pending_exits",
        "exitorder_event_source",
        "exitorder_share_errors_total",
        "exitorder_api_watch",
    ] {
        assert!(
            m.iter().any(|(s, _)| s.starts_with(family)),
            "{family} missing"
        );
    }
    assert_eq!(get("exitorder_pending_exits"), Some(1.0));
    assert_eq!(
        get(r#"exitorder_allows_total{reason="ordered"}"#),
        Some(0.0)
    );
    assert_eq!(get(r#"exitorder_event_source{source="poll"}"#), Some(1.0));
    // Families that have no samples yet are still declared.
    for family in ["exitorder_api_errors", "exitorder_pod_events"] {
        assert!(
            body.contains(&format!("# TYPE {family} counter")),
            "{family} missing"
        );
    }
    assert_eq!(get(r#"exitorder_api_watch{state="off"}"#), Some(1.0));

    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&rig.stats, Reason::Ordered, 1).await;
    let end = Instant::now() + Duration::from_secs(2);
    while rig.stats.pending() != 0 {
        assert!(Instant::now() < end, "pending gauge never went back to 0");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (_, body) = http_get(addr, "/metrics").await;
    let m = parse_metrics(&body);
    let get = |name: &str| m.iter().find(|(s, _)| s == name).map(|(_, v)| *v);
    assert_eq!(
        get(r#"exitorder_allows_total{reason="ordered"}"#),
        Some(1.0)
    );
    assert_eq!(
        get(r#"exitorder_allow_latency_seconds_count{reason="ordered"}"#),
        Some(1.0)
    );
    assert_eq!(get("exitorder_pending_exits"), Some(0.0));

    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(http_get(addr, "/readyz").await.0, 200);
    rig.cri().fail_with(Some(tonic::Code::Unavailable));
    // The next runtime round fails; readiness follows.
    rig.request_exit(APP_UID, "other");
    let end = Instant::now() + Duration::from_secs(2);
    while http_get(addr, "/readyz").await.0 != 503 {
        assert!(
            Instant::now() < end,
            "readyz never reported the runtime down"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, body) = http_get(addr, "/metrics").await;
    assert!(
        body.contains("exitorder_runtime_errors_total{kind="),
        "{body}"
    );
    assert_eq!(http_get(addr, "/nope").await.0, 404);
    http.abort();
    rig.stop_agent().await;
}

/// An agent that never polls on its own: only events (or the start-up scan) make it read the
/// runtime, so an allow proves the event got through.
fn events_only(cfg: &mut Config) {
    cfg.poll_interval = Duration::from_secs(3600);
    cfg.reconcile_interval = Duration::from_secs(3600);
}

/// A two-level pod on a runtime with a CRI event stream, and an agent that reads the runtime
/// only when events (or its start-up listing) tell it to; returns the app's id.
async fn streaming_two_level_pod(rig: &mut Rig) -> String {
    rig.cri().with_events("cri-o", "1.30.2");
    let (app, _) = two_level_pod(rig, 600);
    rig.start_agent_with(events_only);
    source_becomes(&rig.stats, "cri_events").await;
    app
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_runtime_events_trigger_the_allow() {
    let mut rig = Rig::new();
    let app = streaming_two_level_pod(&mut rig).await;
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(200)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_event_stream_falls_back_to_polling() {
    let mut rig = Rig::new();
    rig.cri().with_unimplemented_events("containerd", "2.0.0");
    let (app, _) = two_level_pod(&rig, 600);
    rig.start_agent();
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(300)).await;
    assert_eq!(rig.stats.event_source(), "poll");
    // No event will come: polling must find the exit.
    rig.cri()
        .set_state_silently(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    assert_eq!(rig.stats.event_source(), "poll");
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_stream_reconnects_and_misses_nothing() {
    let mut rig = Rig::new();
    let app = streaming_two_level_pod(&mut rig).await;
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;
    // The runtime restarts mid-drain: the stream ends, and main exits with no event sent.
    rig.cri().drop_event_streams();
    rig.cri()
        .set_state_silently(&app, ContainerState::ContainerExited);
    // The reconnect re-lists and re-decides the pending pod.
    assert!(allowed_within(&f, Duration::from_secs(5)).await);
    // And the stream itself comes back.
    let end = Instant::now() + Duration::from_secs(5);
    while rig.cri().subscriptions() < 2 {
        assert!(Instant::now() < end, "the agent never resubscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    source_becomes(&rig.stats, "cri_events").await;
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_dates_a_wait_from_its_own_sight_not_the_files_times() {
    let mut rig = Rig::new();
    rig.reserve = Duration::from_millis(500);
    two_level_pod(&rig, 2);
    // The exit file claims to be an hour old (its times are the pod's to set): believed, the
    // deadline would have passed long ago. With no API server's record of the deletion, the
    // wait starts when the agent sees it: grace 2 s - reserve 0.5 s = 1.5 s from then.
    let f = rig.request_exit(APP_UID, "proxy");
    let written = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(written)
        .unwrap();
    let started = Instant::now();
    rig.start_agent();
    assert!(allowed_within(&f, Duration::from_secs(10)).await);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1400),
        "released after {took:?}"
    );
    allows_reach(&rig.stats, Reason::Deadline, 1).await;
    rig.stop_agent().await;
}

/// Bug: a sidecar whose priority comes only from its env was released at once (reason
/// "ordered") when its env could not be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_env_read_keeps_the_wait_ordered() {
    let mut rig = Rig::new();
    rig.cri().add_pod(APP_UID, &[]);
    let app = rig.cri().add_container(APP_UID, "app", 0, 60);
    let shipper = rig.cri().add_container(APP_UID, "log-shipper", 0, 60);
    rig.cri().set_env(&shipper, "EXITORDER_EXIT_PRIORITY", "2");
    rig.cri().fail_status_of(&shipper, true);
    rig.start_agent();
    let f = rig.request_exit(APP_UID, "log-shipper");
    stays_waiting(&f, Duration::from_millis(500)).await;
    // Readable again: the priority is known, and the wait is held for the app.
    rig.cri().fail_status_of(&shipper, false);
    stays_waiting(&f, Duration::from_millis(500)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(3)).await);
    allows_reach(&rig.stats, Reason::Ordered, 1).await;
    rig.stop_agent().await;
}

/// A failed env read is retried with back-off, not on every decision round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_env_reads_back_off() {
    let mut rig = Rig::new();
    rig.cri().add_pod(APP_UID, &[]);
    rig.cri().add_container(APP_UID, "app", 0, 60);
    let shipper = rig.cri().add_container(APP_UID, "log-shipper", 0, 60);
    rig.cri().fail_status_of(&shipper, true);
    // Polling every 10 ms: the old loop asked once per round, about a hundred times a second.
    rig.start_agent();
    let f = rig.request_exit(APP_UID, "log-shipper");
    stays_waiting(&f, Duration::from_millis(1000)).await;
    let calls = rig.cri().status_calls();
    assert!(calls <= 10, "{calls} ContainerStatus calls in 1 s");
    rig.stop_agent().await;
}

/// Bug: one failed runtime call cleared readiness, and only a later decision round set it
/// again: an idle node stayed not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_runtime_on_an_idle_node() {
    let mut rig = Rig::new();
    two_level_pod(&rig, 60);
    rig.start_agent_with(|cfg| cfg.reconcile_interval = Duration::from_millis(100));
    let until = |want: bool| {
        let stats = rig.stats.clone();
        async move {
            let end = Instant::now() + Duration::from_secs(10);
            while stats.runtime_ok() != want {
                assert!(Instant::now() < end, "runtime_ok never became {want}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    until(true).await;
    rig.cri().fail_with(Some(tonic::Code::Unavailable));
    until(false).await;
    rig.cri().fail_with(None);
    // Nothing pending, no exit anywhere: readiness comes back on its own.
    until(true).await;
    assert_eq!(rig.stats.pending(), 0);
    rig.stop_agent().await;
}

/// Bug: a container rewriting its exit file in a loop forced a runtime listing per write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churning_exit_file_does_not_hammer_the_runtime() {
    let mut rig = Rig::new();
    two_level_pod(&rig, 60);
    rig.start_agent_with(|cfg| cfg.poll_interval = Duration::from_millis(50));
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(200)).await;
    let before = rig.cri().list_calls();
    let started = Instant::now();
    // Paced like a container's loop, so that the agent sees each removal and each new
    // request on its own rather than all in one batch of file events.
    for _ in 0..100 {
        let _ = std::fs::remove_file(&f);
        tokio::time::sleep(Duration::from_millis(5)).await;
        std::fs::write(&f, "wait\n").unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stays_waiting(&f, Duration::from_millis(200)).await;
    let took = started.elapsed();
    let calls = rig.cri().list_calls() - before;
    // One listing per poll interval at most (plus the reconcile), whatever the writes.
    let bound = 4 + 2 * (took.as_millis() / 50) as u64;
    assert!(
        calls <= bound,
        "{calls} listings for 100 rewrites in {took:?} (bound {bound})"
    );
    assert!(rig.stats.exit_churns() > 0);
    rig.stop_agent().await;
}

/// Bug: the agent remembered every exit on the node. Its view holds what the runtime has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_follows_the_runtime_not_the_history() {
    let mut rig = Rig::new();
    two_level_pod(&rig, 60);
    rig.start_agent_with(|cfg| cfg.reconcile_interval = Duration::from_millis(50));
    for i in 0..500u32 {
        let id = rig
            .cri()
            .add_container(APP_UID, &format!("job-{}", i % 7), i + 1, 60);
        rig.cri().set_state(&id, ContainerState::ContainerExited);
        rig.cri().remove(&id);
    }
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let (containers, pods) = rig.stats.view_size();
        if containers == 2 && pods == 1 {
            break;
        }
        assert!(
            Instant::now() < end,
            "view holds {containers} containers of {pods} pods"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rig.stop_agent().await;
}

/// Waits until the runtime has been asked to describe `id`.
async fn described(rig: &Rig, id: &str) {
    let end = Instant::now() + Duration::from_secs(5);
    while rig.cri().status_calls_of(id) == 0 {
        assert!(Instant::now() < end, "{id} was never described");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Bug: a pod held while an unknown id was being read (it might have been one of the pod's
/// containers) stayed held when the answer was "not a container" (a sandbox's pause
/// container): the answer touched no pod, so none was decided again until the next listing,
/// seconds later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_finds_a_sandbox_releases_the_pod_it_held() {
    let mut rig = Rig::new();
    let app = streaming_two_level_pod(&mut rig).await;
    rig.cri().hold_status_of("pause-1");
    rig.cri()
        .send_event("pause-1", ContainerEventType::ContainerStartedEvent);
    described(&rig, "pause-1").await;
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;
    // The app exits while the id that appeared before the exit file is still being read:
    // it could be one of this pod's, so the wait stays ordered.
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    stays_waiting(&f, Duration::from_millis(200)).await;
    // The runtime answers: not a container. Nothing else will happen on this node.
    rig.cri().release_status_of("pause-1");
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&rig.stats, Reason::Ordered, 1).await;
    rig.stop_agent().await;
}

/// Bug: any container being read anywhere on the node held every pending pod, so on a busy
/// node (pods starting while others are deleted) allows waited on unrelated reads. The
/// kubelet starts no container in a pod it is stopping: one that appears after a pod's exit
/// file is another pod's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_starting_after_the_exit_file_holds_no_pod() {
    let mut rig = Rig::new();
    let app = streaming_two_level_pod(&mut rig).await;
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;
    // Another pod's container starts; its read does not answer.
    rig.cri().hold_status_of("other-pods-app");
    rig.cri()
        .send_event("other-pods-app", ContainerEventType::ContainerStartedEvent);
    described(&rig, "other-pods-app").await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    rig.cri().release_status_of("other-pods-app");
    rig.stop_agent().await;
}

/// Bug: the view held the app's first attempt as its last while the kubelet had already
/// started a second one whose events had not come (late on containerd 2.x's CRI stream,
/// or lost): the proxy was allowed out while the app still ran. A listing of the pod asked
/// after its exit file settles it: the kubelet starts nothing in a pod it is stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_whose_events_never_came_holds_the_sidecar() {
    let mut rig = Rig::new();
    let app = streaming_two_level_pod(&mut rig).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    let again = rig.cri().add_container(APP_UID, "app", 1, 600);
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(300)).await;
    rig.cri().set_state(&again, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&rig.stats, Reason::Ordered, 1).await;
    rig.stop_agent().await;
}

/// The same with polling: the last listing before the exit file shows the first attempt
/// exited, and the second one started after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_the_last_poll_holds_the_sidecar() {
    let mut rig = Rig::new();
    let (app, _) = two_level_pod(&rig, 600);
    rig.cri()
        .set_state_silently(&app, ContainerState::ContainerExited);
    rig.start_agent_with(|cfg| {
        cfg.poll_interval = Duration::from_millis(10);
        cfg.reconcile_interval = Duration::from_secs(3600);
    });
    let end = Instant::now() + Duration::from_secs(5);
    while rig.cri().list_calls() == 0 {
        assert!(Instant::now() < end, "the agent never listed the runtime");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let again = rig.cri().add_container(APP_UID, "app", 1, 600);
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(300)).await;
    rig.cri()
        .set_state_silently(&again, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    allows_reach(&rig.stats, Reason::Ordered, 1).await;
    rig.stop_agent().await;
}

/// Bug: on a node busy with a burst of deletions a runtime read took longer than the call's
/// timeout, and the agent took the runtime for gone: every wait on the node was held for its
/// deadline until the runtime "answered again". A slow answer is not an outage while the
/// runtime still answers Version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_times_out_on_a_busy_runtime_is_not_an_outage() {
    let mut rig = Rig::new();
    let app = streaming_two_level_pod(&mut rig).await;
    // Another pod's container starts, and its description does not answer in time.
    rig.cri().hold_status_of("busy-app");
    rig.cri()
        .send_event("busy-app", ContainerEventType::ContainerStartedEvent);
    described(&rig, "busy-app").await;
    let end = Instant::now() + Duration::from_secs(20);
    while rig.stats.runtime_errors().values().sum::<u64>() == 0 {
        assert!(Instant::now() < end, "the read never timed out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        rig.stats.runtime_ok(),
        "a slow read was taken for an outage: {:?}",
        rig.stats.runtime_errors()
    );
    // The runtime answers the description asked again; the pod is decided from the view.
    rig.cri().release_status_of("busy-app");
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(5)).await);
    allows_reach(&rig.stats, Reason::Ordered, 1).await;
    rig.stop_agent().await;
}
