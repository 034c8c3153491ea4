//! The agent's presence file: a sidecar whose directory no agent ever served proceeds after
//! its short presence wait, one whose agent said it serves waits for it however long, and an
//! uninstall ends every wait at once. The test plays the agent by hand, as `wait.rs` does.

mod common;

use std::time::Duration;

use common::*;

const SERVING: &str = "version=1\nstate=serving\n";
const UNINSTALLED: &str = "version=1\nstate=uninstalled\n";

#[test]
fn a_directory_no_agent_serves_is_left_after_the_presence_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hook = Hook::spawn_with_env(
        &["wait", "--dir", path(dir.path()), "--timeout", "120s"],
        &[("EXITORDER_PRESENCE", "300ms")],
    );
    // Far within the two-minute timeout: the presence wait ended it.
    let output = hook.exit_within(Duration::from_secs(30));
    assert_code(&output, 0);
    let log = stderr(&output);
    assert!(log.contains("no exitorder agent serves"), "{log}");
    assert!(!exit_file(dir.path()).exists(), "exit must be withdrawn");
}

#[test]
fn an_agent_that_said_it_serves_is_waited_for_past_the_presence_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    present(dir.path(), SERVING);
    let mut hook = Hook::spawn(&[
        "wait",
        "--dir",
        path(dir.path()),
        "--timeout",
        "120s",
        "--presence",
        "100ms",
    ]);
    wait_for_request(dir.path());
    hook.assert_blocked_for(Duration::from_millis(1500));
    answer(dir.path(), "allow\n");
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    assert!(
        stderr(&output).contains("exit allowed"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn an_agent_that_shows_itself_within_the_presence_wait_is_waited_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hook = Hook::spawn(&[
        "wait",
        "--dir",
        path(dir.path()),
        "--timeout",
        "120s",
        "--presence",
        "5s",
    ]);
    wait_for_request(dir.path());
    // The agent sees the request and marks the directory, as it does for a directory it
    // had not seen before.
    present(dir.path(), SERVING);
    hook.assert_blocked_for(Duration::from_secs(6));
    answer(dir.path(), "allow\n");
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    assert!(
        stderr(&output).contains("exit allowed"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn an_uninstall_ends_a_wait_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    present(dir.path(), SERVING);
    let mut hook = Hook::spawn_with_env(
        &["wait", "--dir", path(dir.path()), "--timeout", "120s"],
        &[("EXITORDER_PRESENCE", "1s")],
    );
    wait_for_request(dir.path());
    hook.assert_blocked_for(BLOCKED_FOR);
    present(dir.path(), UNINSTALLED);
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    let log = stderr(&output);
    assert!(log.contains("exitorder was uninstalled"), "{log}");
    assert!(!exit_file(dir.path()).exists(), "exit must be withdrawn");
}

#[test]
fn a_directory_left_by_an_uninstall_is_not_waited_on_at_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    present(dir.path(), UNINSTALLED);
    // Presence off: the uninstall's word is enough on its own.
    let hook = Hook::spawn(&["wait", "--dir", path(dir.path()), "--timeout", "120s"]);
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    assert!(
        stderr(&output).contains("exitorder was uninstalled"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn presence_zero_waits_for_the_answer_whatever() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hook = Hook::spawn_with_env(
        &["wait", "--dir", path(dir.path()), "--timeout", "120s"],
        &[("EXITORDER_PRESENCE", "0")],
    );
    wait_for_request(dir.path());
    hook.assert_blocked_for(Duration::from_millis(1500));
    answer(dir.path(), "allow\n");
    assert_code(&hook.exit_within(PROMPTLY), 0);
}

#[test]
fn a_later_releases_flag_is_skipped_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    present(dir.path(), SERVING);
    let hook = Hook::spawn(&[
        "wait",
        "--from-a-later-release=2",
        "--dir",
        path(dir.path()),
        "--timeout",
        "120s",
    ]);
    wait_for_request(dir.path());
    answer(dir.path(), "allow\n");
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    let log = stderr(&output);
    assert!(log.contains("ignoring --from-a-later-release=2"), "{log}");
}
