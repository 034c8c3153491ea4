//! The subcommands that call an HTTP endpoint of the pod's own: `await`,
//! `shutdown`, and the GET that ends `wait --http-get`.
//!
//! Each says on stderr what happened when it did not simply succeed: the
//! kubelet shows a failed hook's output in the pod's events, and the agent
//! logs what `shutdown` printed.

use core::time::Duration;

use crate::cli::{HttpArgs, DEFAULT_HTTP_TIMEOUT, EX_FAILED};
use crate::duration::show;
use crate::http::{self, HttpError, Method, Status};
use crate::log;
use crate::sys::{self, Instant};
use crate::url::Url;

/// First pause between attempts; doubled after each, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// Bound of one `await` attempt, so a server that accepts and never answers
/// costs one attempt, not the whole timeout.
pub const AWAIT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// `wait --http-get URL`, after the wait: one GET, as the kubelet's httpGet
/// hook does. Any answer counts (the kubelet does not fail a hook over its
/// status either); only a server that could not be reached is a failure.
pub fn hook_get(url: &Url) -> u8 {
    let deadline = Instant::now().saturating_add(DEFAULT_HTTP_TIMEOUT);
    match http::request(Method::Get, url, deadline) {
        Ok(status) => {
            if !status.is_success() && !status.is_redirect() {
                log!("GET {url}: {status}");
            }
            0
        }
        Err(err) => {
            log!("GET {url}: {err}");
            EX_FAILED
        }
    }
}

/// `shutdown --post URL`: one POST with an empty body; exit 0 on 2xx.
///
/// Only a connection that is refused or not answered is tried again (the
/// proxy may be restarting): once the request reached a server, sending it
/// twice could shut down a proxy that came back in between.
pub fn shutdown(args: &HttpArgs) -> u8 {
    let url = &args.url;
    let timeout = show(args.timeout);
    let deadline = Instant::now().saturating_add(args.timeout);
    let mut pause = FIRST_PAUSE;
    let mut first = true;
    loop {
        match http::request(Method::Post, url, deadline) {
            Ok(status) if status.is_success() => {
                log!("POST {url}: {status}");
                return 0;
            }
            Ok(status) => {
                log!("POST {url}: {status} (not a 2xx answer)");
                return EX_FAILED;
            }
            Err(err) if err.not_listening() => {
                if first {
                    log!("POST {url}: {err}; retrying for up to {timeout}");
                    first = false;
                }
                if !pause_before_retry(&mut pause, deadline) {
                    log!("POST {url}: gave up after {timeout}: {err}");
                    return EX_FAILED;
                }
            }
            Err(err) => {
                log!("POST {url}: {err}");
                return EX_FAILED;
            }
        }
    }
}

/// `await --http-get URL`: GET until a 2xx answer; exit 0 then, 1 after the
/// timeout, naming the last failure.
pub fn await_ready(args: &HttpArgs) -> u8 {
    let url = &args.url;
    let timeout = show(args.timeout);
    let started = Instant::now();
    let deadline = started.saturating_add(args.timeout);
    let mut pause = FIRST_PAUSE;
    let mut attempts: u32 = 0;
    loop {
        attempts = attempts.saturating_add(1);
        let attempt_deadline = deadline.min(Instant::now().saturating_add(AWAIT_ATTEMPT_TIMEOUT));
        let failure = match http::request(Method::Get, url, attempt_deadline) {
            Ok(status) if status.is_success() => {
                if attempts > 1 {
                    log!(
                        "{url} is ready ({status}) after {}ms",
                        started.elapsed().as_millis()
                    );
                }
                return 0;
            }
            Ok(status) => NotReady::Status(status),
            Err(err) => NotReady::Http(err),
        };
        if attempts == 1 {
            log!("{url} is not ready: {failure}; polling for up to {timeout}");
        }
        if !pause_before_retry(&mut pause, deadline) {
            log!("{url} is not ready after {timeout} ({attempts} attempts); last: {failure}");
            return EX_FAILED;
        }
    }
}

/// Why an `await` attempt did not count.
enum NotReady {
    Status(Status),
    Http(HttpError),
}

impl core::fmt::Display for NotReady {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NotReady::Status(status) => write!(f, "answered {status}"),
            NotReady::Http(err) => write!(f, "{err}"),
        }
    }
}

/// Sleeps the current pause (never past the deadline) and doubles it;
/// `false` when the deadline has come and there is to be no next attempt.
fn pause_before_retry(pause: &mut Duration, deadline: Instant) -> bool {
    let wake = deadline.min(Instant::now().saturating_add(*pause));
    sys::sleep_until(wake);
    *pause = pause.saturating_mul(2).min(MAX_PAUSE);
    Instant::now() < deadline
}
