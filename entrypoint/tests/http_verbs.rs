//! `shutdown`, `await`, `wait --http-get` and `wait --sleep`, run as the
//! real binary against small HTTP servers on 127.0.0.1.

mod common;

use std::fs;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;

/// What a test that expects a failure gives the binary as its timeout.
const SHORT: &str = "1s";
const SHORT_DURATION: Duration = Duration::from_secs(1);
/// Bound on how long such a test may take: the timeout plus a lot.
const SHORT_LIMIT: Duration = Duration::from_secs(30);

#[test]
fn shutdown_posts_an_empty_body_to_the_path() {
    let server = Server::start(|_| Reply::Status(200));
    let url = server.url("/shutdown?now=1");
    let output = Hook::spawn(&["shutdown", "--post", &url]).exit_within(PROMPTLY);
    assert_code(&output, 0);
    assert!(
        stderr(&output).contains(&format!("POST {url}: 200 OK")),
        "{}",
        stderr(&output)
    );

    let received = server.wait_for_requests(1);
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.request_line(), "POST /shutdown?now=1 HTTP/1.1");
    assert_eq!(request.header("content-length"), Some("0"));
    assert_eq!(request.header("connection"), Some("close"));
    let host = format!("127.0.0.1:{}", server.port);
    assert_eq!(request.header("host"), Some(host.as_str()));
    assert!(request.body.is_empty());
}

#[test]
fn shutdown_accepts_any_2xx() {
    let server = Server::start(|_| Reply::Status(202));
    let output =
        Hook::spawn(&["shutdown", "--post", &server.url("/quitquitquit")]).exit_within(PROMPTLY);
    assert_code(&output, 0);
    assert!(
        stderr(&output).contains("202 Accepted"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn shutdown_fails_on_another_status_without_retrying() {
    for code in [503, 404, 302] {
        let server = Server::start(move |_| Reply::Status(code));
        let output =
            Hook::spawn(&["shutdown", "--post", &server.url("/shutdown")]).exit_within(PROMPTLY);
        assert_code(&output, 1);
        let log = stderr(&output);
        assert!(log.contains(&format!(": {code} ")), "{log}");
        assert!(log.contains("not a 2xx answer"), "{log}");
        assert_eq!(
            server.received().len(),
            1,
            "an answered POST is not sent again"
        );
    }
}

#[test]
fn shutdown_retries_a_refused_connection_until_the_server_is_up() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/shutdown");
    let mut hook = Hook::spawn(&["shutdown", "--post", &url, "--timeout", "2m"]);
    hook.wait_for_stderr("Connection refused");
    hook.wait_for_stderr("retrying for up to 120s");

    let server = Server::start_on(port, |_| Reply::Status(200));
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    let received = server.wait_for_requests(1);
    assert_eq!(received[0].request_line(), "POST /shutdown HTTP/1.1");
}

#[test]
fn shutdown_gives_up_on_refused_connections_after_the_timeout() {
    let url = format!("http://127.0.0.1:{}/shutdown", free_port());
    let started = Instant::now();
    let output =
        Hook::spawn(&["shutdown", "--post", &url, "--timeout", SHORT]).exit_within(SHORT_LIMIT);
    assert!(
        started.elapsed() >= SHORT_DURATION,
        "{:?}",
        started.elapsed()
    );
    assert_code(&output, 1);
    let log = stderr(&output);
    assert!(log.contains("gave up after 1s"), "{log}");
    assert!(log.contains("Connection refused"), "{log}");
}

#[test]
fn shutdown_times_out_on_a_server_that_never_answers() {
    let server = Server::start(|_| Reply::Silent);
    let started = Instant::now();
    let output = Hook::spawn(&["shutdown", "--post", &server.url("/"), "--timeout", SHORT])
        .exit_within(SHORT_LIMIT);
    assert!(
        started.elapsed() >= SHORT_DURATION,
        "{:?}",
        started.elapsed()
    );
    assert_code(&output, 1);
    assert!(
        stderr(&output).contains("timed out waiting for the answer"),
        "{}",
        stderr(&output)
    );
    let received = server.wait_for_requests(1);
    assert_eq!(received.len(), 1, "a sent POST is not sent again");
}

#[test]
fn slow_headers_within_the_timeout_are_read() {
    let server = Server::start(|_| {
        Reply::Dribble(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec(),
            Duration::from_millis(10),
        )
    });
    let output = Hook::spawn(&["shutdown", "--post", &server.url("/"), "--timeout", "60s"])
        .exit_within(Duration::from_secs(60));
    assert_code(&output, 0);
}

#[test]
fn an_answer_that_never_ends_its_status_line_times_out() {
    // A byte every 50 ms: each read succeeds quickly, so only a deadline for
    // the whole answer ends this (it would reach the size cap after minutes).
    let server =
        Server::start(|_| Reply::Endless(b"HTTP/1.1 200".to_vec(), Duration::from_millis(50)));
    let output = Hook::spawn(&["shutdown", "--post", &server.url("/"), "--timeout", SHORT])
        .exit_within(SHORT_LIMIT);
    assert_code(&output, 1);
    assert!(
        stderr(&output).contains("timed out waiting for the answer"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_huge_header_is_not_read() {
    let mut answer = b"HTTP/1.1 200 OK\r\nX-Big: ".to_vec();
    answer.extend(std::iter::repeat_n(b'a', 4 << 20));
    answer.extend_from_slice(b"\r\n\r\n");
    let server = Server::start(move |_| Reply::Raw(answer.clone()));
    for subcommand in [["await", "--http-get"], ["shutdown", "--post"]] {
        let output =
            Hook::spawn(&[subcommand[0], subcommand[1], &server.url("/")]).exit_within(PROMPTLY);
        assert_code(&output, 0);
    }
}

#[test]
fn a_status_line_longer_than_the_cap_fails() {
    let server = Server::start(|_| Reply::Raw(vec![b'H'; 1 << 20]));
    let output = Hook::spawn(&["shutdown", "--post", &server.url("/")]).exit_within(PROMPTLY);
    assert_code(&output, 1);
    assert!(
        stderr(&output).contains("no status line in the first 8192 bytes"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn answers_that_are_not_http_fail() {
    for (answer, needle) in [
        (
            &b"SSH-2.0-OpenSSH\r\n"[..],
            "not an HTTP answer: \"SSH-2.0-OpenSSH\"",
        ),
        (b"", "closed the connection without answering"),
        (b"HTTP/1.1 20", "closed the connection after 11 bytes"),
    ] {
        let server = Server::start(move |_| Reply::Raw(answer.to_vec()));
        let output = Hook::spawn(&["shutdown", "--post", &server.url("/")]).exit_within(PROMPTLY);
        assert_code(&output, 1);
        assert!(stderr(&output).contains(needle), "{}", stderr(&output));
    }
}

#[test]
fn await_returns_at_once_when_ready() {
    let server = Server::start(|_| Reply::Status(204));
    let url = server.url("/ready?full=1");
    let output = Hook::spawn(&["await", "--http-get", &url]).exit_within(PROMPTLY);
    assert_code(&output, 0);
    assert!(output.stderr.is_empty(), "{}", stderr(&output));
    let received = server.wait_for_requests(1);
    assert_eq!(received[0].request_line(), "GET /ready?full=1 HTTP/1.1");
    assert_eq!(received[0].header("connection"), Some("close"));
    assert_eq!(received[0].header("content-length"), None);
}

#[test]
fn await_polls_until_the_server_becomes_ready() {
    let server = Server::start(|index| Reply::Status(if index < 3 { 503 } else { 200 }));
    let url = server.url("/healthz");
    let output = Hook::spawn(&["await", "--http-get", &url, "--timeout", "2m"])
        .exit_within(Duration::from_secs(60));
    assert_code(&output, 0);
    let log = stderr(&output);
    assert!(
        log.contains(&format!("{url} is not ready: answered 503")),
        "{log}"
    );
    assert!(log.contains("polling for up to 120s"), "{log}");
    assert!(log.contains(&format!("{url} is ready (200 OK)")), "{log}");
    assert_eq!(server.received().len(), 4);
}

#[test]
fn await_waits_for_a_server_to_come_up() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/ready");
    let mut hook = Hook::spawn(&["await", "--http-get", &url]);
    hook.wait_for_stderr("Connection refused");
    // Refused for a while: still polling, gently.
    hook.assert_blocked_for(BLOCKED_FOR);

    let server = Server::start_on(port, |_| Reply::Status(200));
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    assert!(stderr(&output).contains("is ready"), "{}", stderr(&output));
    let received = server.wait_for_requests(1);
    assert_eq!(received[0].request_line(), "GET /ready HTTP/1.1");
}

#[test]
fn await_gives_up_after_the_timeout_naming_the_last_failure() {
    let server = Server::start(|_| Reply::Status(503));
    let url = server.url("/");
    let started = Instant::now();
    let output =
        Hook::spawn(&["await", "--http-get", &url, "--timeout", SHORT]).exit_within(SHORT_LIMIT);
    assert!(
        started.elapsed() >= SHORT_DURATION,
        "{:?}",
        started.elapsed()
    );
    assert_code(&output, 1);
    let log = stderr(&output);
    assert!(
        log.contains(&format!("{url} is not ready after 1s")),
        "{log}"
    );
    assert!(
        log.contains("last: answered 503 Service Unavailable"),
        "{log}"
    );
    // Polled, but not in a tight loop: 100 ms doubling to 1 s.
    let polls = server.wait_for_requests(1).len();
    assert!(polls <= 20, "{polls} polls in 1s");
}

#[test]
fn await_times_out_on_a_server_that_never_answers() {
    let server = Server::start(|_| Reply::Silent);
    let output = Hook::spawn(&["await", "--http-get", &server.url("/"), "--timeout", SHORT])
        .exit_within(SHORT_LIMIT);
    assert_code(&output, 1);
    let log = stderr(&output);
    assert!(
        log.contains("last: timed out waiting for the answer"),
        "{log}"
    );
}

#[test]
fn ipv6_loopback() {
    let Some(server) = Server::start_v6(|_| Reply::Status(200)) else {
        eprintln!("no IPv6 loopback on this machine; [::1] not tried");
        return;
    };
    let url = format!("http://[::1]:{}/ready", server.port);
    let output = Hook::spawn(&["await", "--http-get", &url]).exit_within(PROMPTLY);
    assert_code(&output, 0);
    let received = server.wait_for_requests(1);
    let host = format!("[::1]:{}", server.port);
    assert_eq!(received[0].header("host"), Some(host.as_str()));
}

#[test]
fn bad_urls_are_usage_errors_without_any_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    for (url, needle) in [
        // 0.0.0.0 would reach this listener if it were tried.
        (
            format!("http://0.0.0.0:{port}/"),
            "host 0.0.0.0 is not a loopback address",
        ),
        (
            format!("http://10.255.255.1:{port}/"),
            "not a loopback address",
        ),
        (
            format!("http://example.com:{port}/"),
            "names are not resolved",
        ),
        (
            format!("https://127.0.0.1:{port}/"),
            "https is not supported",
        ),
        (format!("127.0.0.1:{port}/"), "expected http://"),
        (format!("http://user@127.0.0.1:{port}/"), "user information"),
        (format!("http://127.0.0.1:{port}/a b"), "a space"),
        (format!("http://127.0.0.1:{port}x/"), "invalid port"),
        ("http://127.0.0.1:/".to_owned(), "empty port"),
    ] {
        for args in [
            vec!["shutdown", "--post", &url],
            vec!["await", "--http-get", &url],
            vec!["wait", "--dir", path(dir.path()), "--http-get", &url],
        ] {
            let output = Hook::spawn(&args).exit_within(PROMPTLY);
            assert_code(&output, 64);
            let log = stderr(&output);
            assert!(log.contains("invalid URL"), "{args:?}: {log}");
            assert!(log.contains(needle), "{args:?}: {log}");
            assert!(
                log.contains("usage: exitorder-entrypoint"),
                "{args:?}: {log}"
            );
        }
    }
    // A connection that was made waits in the listener's queue even after
    // the client closed it.
    assert!(
        listener
            .accept()
            .is_err_and(|err| err.kind() == std::io::ErrorKind::WouldBlock),
        "a bad URL was connected to"
    );
    assert!(
        !exit_file(dir.path()).exists(),
        "a usage error must not wait"
    );
}

#[test]
fn wait_then_http_get_after_the_allow() {
    let server = Server::start(|_| Reply::Status(200));
    let dir = tempfile::tempdir().expect("tempdir");
    let url = server.url("/prestop?drain=1");
    let mut hook = Hook::spawn(&[
        "wait",
        "--dir",
        path(dir.path()),
        "--timeout",
        "60s",
        "--http-get",
        &url,
    ]);
    wait_for_request(dir.path());
    hook.assert_blocked_for(BLOCKED_FOR);
    assert!(server.received().is_empty(), "GET sent before the allow");

    answer(dir.path(), "allow\n");
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    let received = server.wait_for_requests(1);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].request_line(), "GET /prestop?drain=1 HTTP/1.1");
    assert!(!exit_file(dir.path()).exists());
    assert!(!stderr(&output).contains("GET http"), "{}", stderr(&output));
}

#[test]
fn wait_http_get_answered_with_an_error_status_still_succeeds_and_says_so() {
    for code in [503, 404] {
        let server = Server::start(move |_| Reply::Status(code));
        let dir = tempfile::tempdir().expect("tempdir");
        let url = server.url("/stop");
        let hook = Hook::spawn(&[
            "wait",
            "--dir",
            path(dir.path()),
            "--timeout",
            "60s",
            "--http-get",
            &url,
        ]);
        wait_for_request(dir.path());
        answer(dir.path(), "allow\n");
        let output = hook.exit_within(PROMPTLY);
        assert_code(&output, 0);
        assert!(
            stderr(&output).contains(&format!("GET {url}: {code} ")),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn wait_http_get_that_cannot_connect_fails() {
    // No directory: the wait proceeds at once, then the GET is refused, and
    // is not retried (the kubelet's httpGet hook is not either).
    let base = tempfile::tempdir().expect("tempdir");
    let url = format!("http://127.0.0.1:{}/stop", free_port());
    let output = Hook::spawn(&[
        "wait",
        "--dir",
        path(&base.path().join("missing")),
        "--http-get",
        &url,
    ])
    .exit_within(PROMPTLY);
    assert_code(&output, 1);
    let log = stderr(&output);
    assert!(log.contains("proceeding without exit permission"), "{log}");
    assert!(
        log.contains(&format!("GET {url}: cannot connect: Connection refused")),
        "{log}"
    );
}

#[test]
fn wait_then_sleep_after_the_allow() {
    for (sleep, at_least) in [
        ("1", Duration::from_secs(1)),
        ("300ms", Duration::from_millis(300)),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut hook = Hook::spawn(&[
            "wait",
            "--dir",
            path(dir.path()),
            "--timeout",
            "60s",
            "--sleep",
            sleep,
        ]);
        wait_for_request(dir.path());
        hook.assert_blocked_for(BLOCKED_FOR);

        let allowed = Instant::now();
        answer(dir.path(), "allow\n");
        // The request is withdrawn before the sleep starts.
        eventually("exit to be removed", || !exit_file(dir.path()).exists());
        let output = hook.exit_within(Duration::from_secs(60));
        assert!(
            allowed.elapsed() >= at_least,
            "--sleep {sleep} returned after {:?}",
            allowed.elapsed()
        );
        assert_code(&output, 0);
        assert!(
            stderr(&output).contains("exit allowed"),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn wait_takes_one_follow_up_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    for rest in [
        &["--http-get", "http://127.0.0.1/", "--sleep", "1"][..],
        &["--sleep", "1", "--", "true"],
        &["--http-get", "http://127.0.0.1/", "--", "true"],
    ] {
        let mut args = vec!["wait", "--dir", path(dir.path())];
        args.extend(rest);
        let output = Hook::spawn(&args).exit_within(PROMPTLY);
        assert_code(&output, 64);
        assert!(
            stderr(&output).contains("only one of"),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    assert!(fs::read_dir(dir.path()).expect("read dir").next().is_none());
}
