//! Runs the real binary against a temporary directory, playing the agent's
//! part by hand: watch for `exit`, then rename an `allow` file over it.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

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
    assert!(log.contains("is the exitorder agent running"), "{log}");
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
        // Looked up in PATH, as a shell would.
        ("no-such-command-exitorder-test".into(), 127),
        (not_executable, 126),
        (base.path().to_path_buf(), 126),
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
        &["wait", "-bogus"],
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

fn running_as_root() -> bool {
    fs::metadata("/proc/self").expect("stat /proc/self").uid() == 0
}

/// Runs the binary as `nobody` when the tests run as root, who may write
/// into any directory whatever its mode.
fn spawn_unprivileged(args: &[&str]) -> Hook {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(BIN);
    command.args(args);
    if running_as_root() {
        command.uid(65534).gid(65534);
    }
    Hook::spawn_command(command)
}

#[test]
fn read_only_directory_proceeds_at_once_saying_so() {
    let base = tempfile::tempdir().expect("tempdir");
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).expect("chmod base");
    let empty = base.path().join("empty");
    let stale = base.path().join("stale");
    for dir in [&empty, &stale] {
        fs::create_dir(dir).expect("mkdir");
    }
    fs::write(exit_file(&stale), "allow\n").expect("plant stale answer");
    for (dir, needle) in [
        (&empty, "cannot create exit file in"),
        (&stale, "cannot remove stale exit file in"),
    ] {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o555)).expect("chmod read-only");
        let started = Instant::now();
        let hook = spawn_unprivileged(&[
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
        assert_code(&output, 4);
        let log = stderr(&output);
        assert!(log.contains(needle), "{log}");
        assert!(log.contains("proceeding without exit permission"), "{log}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "a read-only directory must not cost the timeout"
        );
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).expect("chmod back");
    }
    assert!(!exit_file(&empty).exists());
}

#[test]
fn exit_file_removed_by_someone_else_proceeds() {
    for moved in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut hook = Hook::spawn(&[
            "wait",
            "--dir",
            path(dir.path()),
            "--timeout",
            "60s",
            "--",
            "sh",
            "-c",
            "exit 6",
        ]);
        wait_for_request(dir.path());
        hook.assert_blocked_for(Duration::from_millis(100));

        if moved {
            fs::rename(exit_file(dir.path()), dir.path().join("elsewhere")).expect("move exit");
        } else {
            fs::remove_file(exit_file(dir.path())).expect("remove exit");
        }
        let output = hook.exit_within(PROMPTLY);
        assert_code(&output, 6);
        let log = stderr(&output);
        assert!(log.contains("exit was removed by someone else"), "{log}");
        assert!(log.contains("proceeding"), "{log}");
        assert!(!exit_file(dir.path()).exists());
    }
}

#[test]
fn exit_replaced_by_another_file_counts_only_if_it_says_allow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hook = Hook::spawn(&["wait", "--dir", path(dir.path()), "--timeout", "60s"]);
    wait_for_request(dir.path());
    let replacement = dir.path().join("replacement");

    for content in ["something else\n", ""] {
        fs::write(&replacement, content).expect("write replacement");
        fs::rename(&replacement, exit_file(dir.path())).expect("rename over exit");
        hook.assert_blocked_for(BLOCKED_FOR);
    }

    fs::write(&replacement, "allow").expect("write replacement");
    fs::rename(&replacement, exit_file(dir.path())).expect("rename over exit");
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    assert!(
        stderr(&output).contains("exit allowed after"),
        "{}",
        stderr(&output)
    );
    assert!(!exit_file(dir.path()).exists());
}

#[test]
fn signal_while_waiting_exits_128_plus_signal_and_withdraws_the_request() {
    for (signal, code) in [("TERM", 143), ("INT", 130), ("HUP", 129)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("ran");
        let hook = Hook::spawn(&[
            "wait",
            "--dir",
            path(dir.path()),
            "--timeout",
            "60s",
            "--",
            "sh",
            "-c",
            "touch \"$0\"",
            path(&marker),
        ]);
        wait_for_request(dir.path());
        send_signal(hook.id(), signal);

        let output = hook.exit_within(PROMPTLY);
        assert_code(&output, code);
        let log = stderr(&output);
        assert!(log.contains(&format!("SIG{signal} while waiting")), "{log}");
        assert!(!exit_file(dir.path()).exists(), "exit must be removed");
        assert!(!marker.exists(), "the command must not run after a signal");
    }
}

#[test]
fn wrapped_command_gets_the_signals_the_wait_caught() {
    // The wait blocks TERM to read it from a signalfd; the command must
    // receive it as usual, not inherit the block.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hook = Hook::spawn(&[
        "wait",
        "--dir",
        path(dir.path()),
        "--timeout",
        "60s",
        "--",
        "sh",
        "-c",
        "kill -s TERM $$; exit 3",
    ]);
    wait_for_request(dir.path());
    hook.assert_blocked_for(Duration::from_millis(50));
    answer(dir.path(), "allow\n");
    let output = hook.exit_within(PROMPTLY);
    assert_eq!(
        signal_of(output.status),
        Some(15),
        "{}; stderr: {}",
        output.status,
        stderr(&output)
    );
}

/// The unprivileged user the hook runs as in [`without_inotify_instances_the_wait_polls`].
const NOBODY: u32 = 65534;

/// Holds every inotify instance `uid` may have (fs.inotify.max_user_instances), as a node
/// draining hundreds of pods whose sidecars run as the same user does; killed on drop.
struct InotifyHog(std::process::Child);

impl InotifyHog {
    fn start(uid: u32) -> InotifyHog {
        use std::os::unix::process::CommandExt;
        let max: u64 = fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
            .expect("read fs.inotify.max_user_instances")
            .trim()
            .parse()
            .expect("max_user_instances is a number");
        let mut command = Command::new("sleep");
        command.arg("600");
        // SAFETY: between fork and exec only async-signal-safe calls are made
        // (setrlimit, setgid, setuid, inotify_init1), on values owned by the closure.
        unsafe {
            command.pre_exec(move || {
                let room = libc::rlimit {
                    rlim_cur: max + 64,
                    rlim_max: max + 64,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &room) != 0
                    || libc::setgid(uid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // Without CLOEXEC: `sleep` inherits and holds them.
                while libc::inotify_init1(0) >= 0 {}
                Ok(())
            });
        }
        InotifyHog(command.spawn().expect("start the inotify hog"))
    }
}

impl Drop for InotifyHog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// On a node out of inotify instances for the sidecar's user, the wait must not fail
/// open (releasing the sidecar out of order during a mass drain): it polls `exit`.
#[test]
fn without_inotify_instances_the_wait_polls() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "this test needs root (setuid to another user) and CI runs as root"
        );
        eprintln!("skipped: needs root");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).expect("chown dir");
    let _hog = InotifyHog::start(NOBODY);

    use std::os::unix::process::CommandExt;
    let mut command = Command::new(BIN);
    command
        .args(["wait", "--dir", path(dir.path()), "--timeout", "60s"])
        .uid(NOBODY)
        .gid(NOBODY);
    let mut hook = Hook::spawn_command(command);
    hook.wait_for_stderr("checking every 50ms instead");
    assert!(
        hook.stderr_so_far().contains("max_user_instances"),
        "{}",
        hook.stderr_so_far()
    );
    wait_for_request(dir.path());
    hook.assert_blocked_for(BLOCKED_FOR);

    answer(dir.path(), "allow\n");
    let output = hook.exit_within(PROMPTLY);
    assert_code(&output, 0);
    assert!(
        stderr(&output).contains("exit allowed after "),
        "{}",
        stderr(&output)
    );
    assert!(!exit_file(dir.path()).exists(), "exit must be removed");
}

#[test]
fn sigkill_while_waiting_leaves_the_request_and_the_next_wait_takes_it_over() {
    // SIGKILL cannot be caught: the request stays behind. The kubelet moves on to
    // StopContainer; the next wait in the same directory (a restarted container's preStop)
    // asks afresh and is not ended by anything written for the killed one.
    let dir = tempfile::tempdir().expect("tempdir");
    let hook = Hook::spawn(&["wait", "--dir", path(dir.path()), "--timeout", "60s"]);
    wait_for_request(dir.path());
    send_signal(hook.id(), "KILL");
    let output = hook.exit_within(PROMPTLY);
    assert_eq!(signal_of(output.status), Some(9));
    assert_eq!(
        fs::read_to_string(exit_file(dir.path())).expect("request left behind"),
        "wait\n"
    );
    // The agent answers the orphaned request before the next wait starts: that `allow` was
    // for the killed one and must not end the next.
    answer(dir.path(), "allow\n");
    let mut next = Hook::spawn(&["wait", "--dir", path(dir.path()), "--timeout", "60s"]);
    wait_for_request(dir.path());
    next.assert_blocked_for(BLOCKED_FOR);
    answer(dir.path(), "allow\n");
    let output = next.exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn a_request_made_again_in_its_place_is_not_withdrawn_by_the_first() {
    // The kubelet runs a preStop hook again when it starts a pod's kill over (a shortened
    // grace period, a retried kill) while the first run may still wait: the second run's
    // request takes the first's place, and the first must leave it alone when it ends (here
    // by its timeout). The new request is put in place in one step, as the first sees it.
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Hook::spawn(&["wait", "--dir", path(dir.path()), "--timeout", "1s"]);
    wait_for_request(dir.path());
    answer(dir.path(), "wait\n");
    let output = first.exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("no exit permission after 1s"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        fs::read_to_string(exit_file(dir.path())).ok().as_deref(),
        Some("wait\n"),
        "the other request was withdrawn: {}",
        stderr(&output)
    );
    // Its own request, or the agent's answer in its place, it withdraws as before.
    let output =
        Hook::spawn(&["wait", "--dir", path(dir.path()), "--timeout", "1s"]).exit_within(PROMPTLY);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!exit_file(dir.path()).exists());
}

/// `mark` says in the directory that the container is being stopped (`stopping`, made anew
/// each time, so a mark the agent has not taken yet is replaced), waits for nothing, and runs
/// the hook the container had, returning its status.
#[test]
fn mark_says_so_then_runs_the_hook_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let ran = elsewhere.path().join("ran");
    let mark = dir.path().join("stopping");
    for round in 0..2 {
        let started = Instant::now();
        let output = Command::new(BIN)
            .args([
                "mark",
                "--dir",
                path(dir.path()),
                "--",
                "sh",
                "-c",
                "touch \"$0\"; exit 3",
            ])
            .arg(&ran)
            .output()
            .expect("run mark");
        assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
        assert!(ran.exists(), "round {round}: the hook did not run");
        assert!(mark.is_file(), "round {round}: no mark");
        assert!(started.elapsed() < Duration::from_secs(5));
        // Nothing waited: no request was made.
        assert!(!exit_file(dir.path()).exists());
        fs::remove_file(&ran).expect("reset");
    }
    // A directory it cannot write: said, and the hook runs all the same.
    let gone = dir.path().join("missing");
    let output = Command::new(BIN)
        .args(["mark", "--dir", path(&gone), "--", "true"])
        .output()
        .expect("run mark");
    assert_eq!(output.status.code(), Some(0));
    assert!(
        stderr(&output).contains("will not know"),
        "{}",
        stderr(&output)
    );
}
