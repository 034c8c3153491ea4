//! An app's wait for its pod's endpoints (`wait --settle`): an agent that says it holds such
//! waits decides alone; with no agent, or one of a release that does not hold them, the
//! entrypoint sleeps the settle time itself before the app's own hook, so the wait is never
//! shorter than the sleep it replaces. The test plays the agent by hand, as `wait.rs` does.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const SERVING: &str = "version=1\nstate=serving\n";
const SERVING_ENDPOINTS: &str = "version=1\nstate=serving\nendpoints=1\n";

fn settle_wait(dir: &Path, settle: &str) -> Hook {
    Hook::spawn(&[
        "wait",
        "--dir",
        path(dir),
        "--timeout",
        "120s",
        "--presence",
        "200ms",
        &format!("--settle={settle}"),
        "--",
        "sh",
        "-c",
        "echo the-apps-own-hook",
    ])
}

#[test]
fn with_no_agent_the_settle_time_is_slept_before_the_apps_hook() {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let hook = settle_wait(dir.path(), "1500ms");
    let output = hook.exit_within(Duration::from_secs(60));
    assert_code(&output, 0);
    let log = stderr(&output);
    assert!(log.contains("no exitorder agent serves"), "{log}");
    assert!(log.contains("waiting the settle time (1500ms)"), "{log}");
    assert!(
        started.elapsed() >= Duration::from_millis(1700),
        "presence 200 ms + settle 1500 ms, took {:?}",
        started.elapsed()
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "the-apps-own-hook"
    );
}

#[test]
fn an_agent_that_holds_endpoints_decides_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    present(dir.path(), SERVING_ENDPOINTS);
    // A settle time far longer than the test's limit: slept, it would fail the test.
    let hook = settle_wait(dir.path(), "10m");
    wait_for_request(dir.path());
    answer(dir.path(), "allow\n");
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    let log = stderr(&output);
    assert!(!log.contains("settle time"), "{log}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "the-apps-own-hook"
    );
}

#[test]
fn an_agent_that_does_not_hold_endpoints_leaves_the_settle_time_to_the_entrypoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    present(dir.path(), SERVING);
    let hook = settle_wait(dir.path(), "1500ms");
    wait_for_request(dir.path());
    let answered = Instant::now();
    answer(dir.path(), "allow\n");
    let output = hook.exit_within(Duration::from_secs(60));
    assert_code(&output, 0);
    let log = stderr(&output);
    assert!(log.contains("exit allowed"), "{log}");
    assert!(log.contains("waiting the settle time (1500ms)"), "{log}");
    assert!(
        answered.elapsed() >= Duration::from_millis(1500),
        "took {:?} from the answer",
        answered.elapsed()
    );
}
