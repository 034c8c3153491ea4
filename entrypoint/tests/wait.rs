//! Runs the real binary against a temporary directory, playing the agent's
//! part by hand: watch for `exit`, then rename an `allow` file over it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_exitorder-entrypoint");
/// Generous bound for things that should happen "at once", so a loaded CI
/// machine does not make the tests flaky.
const PROMPTLY: Duration = Duration::from_secs(5);
/// How long a hook that should be blocked must stay blocked.
const BLOCKED_FOR: Duration = Duration::from_millis(300);
const STEP: Duration = Duration::from_millis(5);

/// A running hook, killed if the test fails before it ends.
struct Hook {
    child: Option<Child>,
}

impl Hook {
    fn spawn(args: &[&str]) -> Hook {
        Self::spawn_with_env(args, &[])
    }

    fn spawn_with_env(args: &[&str], env: &[(&str, &str)]) -> Hook {
        Self::spawn_command(Command::new(BIN).args(args), env)
    }

    /// Runs the hook under `umask 077`, as hardened images often do.
    fn spawn_with_strict_umask(args: &[&str]) -> Hook {
        Self::spawn_command(
            Command::new("sh")
                .args(["-c", "umask 077; exec \"$0\" \"$@\"", BIN])
                .args(args),
            &[],
        )
    }

    fn spawn_command(command: &mut Command, env: &[(&str, &str)]) -> Hook {
        command
            .env_remove("EXITORDER_DIR")
            .env_remove("EXITORDER_WAIT_TIMEOUT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        Hook {
            child: Some(command.spawn().expect("spawn exitorder-entrypoint")),
        }
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("hook already finished")
    }

    /// Fails if the hook exits within `period`.
    fn assert_blocked_for(&mut self, period: Duration) {
        let until = Instant::now() + period;
        while Instant::now() < until {
            if let Some(status) = self.child().try_wait().expect("try_wait") {
                let output = self.collect();
                panic!(
                    "hook exited with {status} while it should be waiting; stderr: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            sleep(STEP);
        }
    }

    /// Waits for the hook to exit within `limit` and returns its output.
    fn exit_within(mut self, limit: Duration) -> Output {
        let until = Instant::now() + limit;
        while self.child().try_wait().expect("try_wait").is_none() {
            assert!(Instant::now() < until, "hook still running after {limit:?}");
            sleep(STEP);
        }
        self.collect()
    }

    fn collect(&mut self) -> Output {
        self.child
            .take()
            .expect("hook already finished")
            .wait_with_output()
            .expect("collect hook output")
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + PROMPTLY;
    while !condition() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        sleep(STEP);
    }
}

fn exit_file(dir: &Path) -> PathBuf {
    dir.join("exit")
}

fn wait_for_request(dir: &Path) {
    eventually("the hook to create exit containing wait", || {
        fs::read(exit_file(dir)).is_ok_and(|content| content == b"wait\n")
    });
}

/// Answers the way the agent does: write a temp file, rename it over `exit`.
fn answer(dir: &Path, content: &str) {
    let temp = dir.join(".exit.tmp");
    fs::write(&temp, content).expect("write answer");
    fs::rename(&temp, exit_file(dir)).expect("rename answer over exit");
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

#[test]
fn blocks_until_allowed_then_exits_promptly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hook =
        Hook::spawn_with_strict_umask(&["wait", "--dir", path(dir.path()), "--timeout", "60s"]);

    wait_for_request(dir.path());
    // The agent must be able to read the request whatever the image's umask.
    let mode = fs::metadata(exit_file(dir.path()))
        .expect("stat exit")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
    hook.assert_blocked_for(BLOCKED_FOR);

    answer(dir.path(), "allow\n");
    let allowed_at = Instant::now();
    let output = hook.exit_within(PROMPTLY);
    assert!(
        allowed_at.elapsed() < Duration::from_secs(2),
        "took {:?} to notice the answer",
        allowed_at.elapsed()
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!exit_file(dir.path()).exists(), "exit must be removed");
    let log = stderr(&output);
    assert!(
        log.contains("exitorder-entrypoint: exit allowed after "),
        "{log}"
    );
    assert!(output.stdout.is_empty());
}

#[test]
fn only_allow_in_exit_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hook = Hook::spawn(&["wait", "--dir", path(dir.path()), "--timeout", "60s"]);
    wait_for_request(dir.path());

    fs::write(dir.path().join("exit.other"), "allow").expect("write other file");
    answer(dir.path(), "deny\n");
    answer(dir.path(), "allowed\n");
    hook.assert_blocked_for(BLOCKED_FOR);

    answer(dir.path(), " allow ");
    let output = hook.exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn answer_written_in_place_also_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hook = Hook::spawn(&["wait", "--dir", path(dir.path()), "--timeout", "60s"]);
    wait_for_request(dir.path());
    hook.assert_blocked_for(BLOCKED_FOR);

    // Truncate-and-write instead of rename: seen through IN_CLOSE_WRITE.
    fs::write(exit_file(dir.path()), "allow\n").expect("overwrite exit");
    let output = hook.exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!exit_file(dir.path()).exists());
}

#[test]
fn runs_the_command_only_after_allow_and_returns_its_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let marker = elsewhere.path().join("ran");
    let mut hook = Hook::spawn(&[
        "wait",
        "--dir",
        path(dir.path()),
        "--timeout",
        "60s",
        "--",
        "sh",
        "-c",
        "touch \"$0\"; exit 7",
        path(&marker),
    ]);

    wait_for_request(dir.path());
    hook.assert_blocked_for(BLOCKED_FOR);
    assert!(!marker.exists(), "command ran before the exit was allowed");

    answer(dir.path(), "allow");
    let output = hook.exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    assert!(marker.exists(), "command did not run");
    assert!(!exit_file(dir.path()).exists());
}

#[test]
fn stale_allow_from_an_earlier_run_does_not_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(exit_file(dir.path()), "allow\n").expect("plant stale answer");
    let mut hook = Hook::spawn(&["wait", "--dir", path(dir.path()), "--timeout", "60s"]);

    wait_for_request(dir.path());
    hook.assert_blocked_for(BLOCKED_FOR);

    answer(dir.path(), "allow\n");
    let output = hook.exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn kruise_form_waits_then_runs_entrypoint_with_args() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hook = Hook::spawn_with_env(
        &[
            "-wait-container-exit",
            "-entrypoint",
            "sh",
            "--",
            "-c",
            "exit 3",
        ],
        &[
            ("EXITORDER_DIR", path(dir.path())),
            ("EXITORDER_WAIT_TIMEOUT", "60s"),
        ],
    );

    wait_for_request(dir.path());
    hook.assert_blocked_for(BLOCKED_FOR);

    answer(dir.path(), "allow\n");
    let output = hook.exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(!exit_file(dir.path()).exists());
}

#[test]
fn timeout_proceeds_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let hook = Hook::spawn(&[
        "wait",
        "--dir",
        path(dir.path()),
        "--timeout",
        "300ms",
        "--",
        "sh",
        "-c",
        "exit 5",
    ]);

    let output = hook.exit_within(PROMPTLY);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "gave up after only {:?}",
        started.elapsed()
    );
    assert_eq!(output.status.code(), Some(5), "{}", stderr(&output));
    let log = stderr(&output);
    assert!(
        log.contains("exitorder-entrypoint: no exit permission after 300ms; proceeding"),
        "{log}"
    );
    assert!(!exit_file(dir.path()).exists(), "exit must be removed");
}

#[test]
fn unusable_directory_proceeds_at_once() {
    let base = tempfile::tempdir().expect("tempdir");
    let missing = base.path().join("missing");
    let not_a_dir = base.path().join("file");
    fs::write(&not_a_dir, "").expect("write file");

    for dir in [&missing, &not_a_dir] {
        let started = Instant::now();
        let hook = Hook::spawn(&[
            "wait",
            "--dir",
            path(dir),
            "--timeout",
            "60s",
            "--",
            "sh",
            "-c",
            "exit 4",
        ]);
        let output = hook.exit_within(PROMPTLY);
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
        let log = stderr(&output);
        assert!(log.contains(path(dir)), "{log}");
        assert!(log.contains("proceeding without exit permission"), "{log}");
    }
    assert!(!missing.exists(), "the directory must not be created");
}

#[test]
fn directory_removed_while_waiting_proceeds() {
    let base = tempfile::tempdir().expect("tempdir");
    let dir = base.path().join("container");
    fs::create_dir(&dir).expect("mkdir");
    let mut hook = Hook::spawn(&["wait", "--dir", path(&dir), "--timeout", "60s"]);
    wait_for_request(&dir);
    hook.assert_blocked_for(Duration::from_millis(100));

    fs::remove_dir_all(&dir).expect("remove directory");
    let output = hook.exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("proceeding"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn command_that_cannot_run_exits_126_or_127() {
    let base = tempfile::tempdir().expect("tempdir");
    let missing_dir = base.path().join("missing");
    let not_executable = base.path().join("script");
    fs::write(&not_executable, "#!/bin/sh\n").expect("write script");
    fs::set_permissions(&not_executable, fs::Permissions::from_mode(0o644)).expect("chmod");

    for (command, code) in [
        (base.path().join("no-such-command"), 127),
        (not_executable, 126),
    ] {
        let hook = Hook::spawn(&["wait", "--dir", path(&missing_dir), "--", path(&command)]);
        let output = hook.exit_within(PROMPTLY);
        assert_eq!(output.status.code(), Some(code), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("exitorder-entrypoint: cannot run"),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn usage_errors_exit_64_with_usage_on_stderr() {
    for args in [
        &[][..],
        &["bogus"],
        &["wait", "--bogus"],
        &["wait", "--dir"],
        &["wait", "--timeout"],
        &["wait", "--timeout", "1.5s"],
        &["wait", "sh"],
        &["-wait-container-exit", "-entrypoint"],
    ] {
        let output = Hook::spawn(args).exit_within(PROMPTLY);
        assert_eq!(output.status.code(), Some(64), "{args:?}");
        let log = stderr(&output);
        assert!(log.starts_with("exitorder-entrypoint: "), "{args:?}: {log}");
        assert!(
            log.contains("usage: exitorder-entrypoint wait"),
            "{args:?}: {log}"
        );
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn bad_timeout_in_environment_is_a_usage_error() {
    let output = Hook::spawn_with_env(&["wait"], &[("EXITORDER_WAIT_TIMEOUT", "soon")])
        .exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(64));
    assert!(stderr(&output).contains("EXITORDER_WAIT_TIMEOUT"));
}

#[test]
fn help_goes_to_stdout() {
    for flag in ["-h", "--help"] {
        let output = Hook::spawn(&[flag]).exit_within(PROMPTLY);
        assert_eq!(output.status.code(), Some(0));
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            text.starts_with("usage: exitorder-entrypoint wait"),
            "{text}"
        );
        assert!(output.stderr.is_empty());
    }
}
