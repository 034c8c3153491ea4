//! Faults on the real containerd of the test bed, each while a sidecar's preStop waits for its
//! main container: the runtime killed and started again, its socket absent when the agent
//! starts, the agent killed or stopped mid-drain, file events lost, the share replaced under
//! the agent, a full disk, an API server answering garbage. In each, every exit stays ordered.
//!
//! Needs root and `containerd runc busybox-static`; mandatory in CI, as tests/e2e.rs.

use exitorder_e2e::fakeapi;
use exitorder_e2e::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use exitorder::cri::ContainerStatusRequest;
use exitorder_testbed::{AgentOptions, AgentProcess, Node, NodeOptions};
use support::{
    agent_bin, assert_exited_after, edit_script, example, http_get, metrics_addr, node_or_skip,
    node_with_or_skip, parse_metrics, set_grace, static_entrypoint, until, Bed,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The sum of every sample of `name` (any labels) in a metrics text.
fn metric(text: &str, name: &str) -> f64 {
    parse_metrics(text)
        .iter()
        .filter(|(series, _)| series == name || series.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v)
        .sum()
}

/// A container's init process, as the runtime reports it.
async fn container_pid(node: &Node, id: &str) -> i32 {
    let status = node
        .client()
        .container_status(ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: true,
        })
        .await
        .unwrap_or_else(|e| panic!("container status {id}: {e}"))
        .into_inner();
    let info = status.info.get("info").expect("verbose info");
    let v: serde_json::Value = serde_json::from_str(info).expect("info is JSON");
    v["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .expect("pid")
}

fn exit_file(bed: &Bed, uid: &str, container: &str) -> PathBuf {
    bed.node
        .share_dir()
        .join("pods")
        .join(uid)
        .join(container)
        .join("exit")
}

/// The children of a process, from /proc.
fn children(pid: i32) -> Vec<String> {
    read(Path::new(&format!("/proc/{pid}/task/{pid}/children")))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The two-level example with a 3 s drain and a long grace period: the deadline never
/// decides in these tests, the order does.
fn slow_two_level() -> serde_json::Value {
    let mut p = example("two-level");
    edit_script(&mut p, "app", "sleep 2", "sleep 3");
    set_grace(&mut p, 40);
    p
}

#[tokio::test]
async fn containerd_restarted_mid_wait_misses_no_exit() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let addr = metrics_addr(&bed.agent).await;
    let running = bed.run_ready(&slow_two_level()).await;
    let uid = running.uid().to_owned();
    let app_id = running.container_id("app").expect("app id");
    let app_pid = container_pid(&bed.node, &app_id).await;
    let deletion = tokio::spawn(running.delete());
    bed.held(&uid, "proxy").await;
    // The app got its TERM (it has no preStop) before the runtime goes: its trap is draining
    // (`sleep 3`, a child of its shell), and it exits while containerd is away.
    let proc_dir = PathBuf::from(format!("/proc/{app_pid}"));
    until("the app draining after its TERM", secs(15), || {
        std::future::ready(
            children(app_pid)
                .iter()
                .any(|c| read(Path::new(&format!("/proc/{c}/cmdline"))) == "sleep\u{0}3\u{0}"),
        )
    })
    .await;
    let before = bed.agent.lines().len();
    bed.node.kill_containerd();
    let exit = exit_file(&bed, &uid, "proxy");
    until("the app's exit while containerd is down", secs(30), || {
        std::future::ready(!proc_dir.exists())
    })
    .await;
    assert_eq!(
        read(&exit).trim(),
        "wait",
        "the proxy was answered while the runtime could not say the app had exited\n{}",
        bed.agent.log_tail(20)
    );
    bed.node
        .restart_containerd(secs(30))
        .await
        .unwrap_or_else(|e| panic!("containerd restart: {e}"));

    // The reconnect and the catch-up listing, in the log and the metrics.
    for (what, event, message) in [
        ("the listing after the reconnect", "relisted", ""),
        (
            "containerd's event stream again",
            "",
            "exit source connected",
        ),
    ] {
        until(what, secs(20), || {
            std::future::ready(bed.agent.lines()[before..].iter().any(|l| {
                (event.is_empty() || l.is(event, &[]))
                    && (message.is_empty() || l.says(message, &[]))
            }))
        })
        .await;
    }
    let connected = bed
        .agent
        .lines()
        .iter()
        .filter(|l| l.says("exit source connected", &[]))
        .count();
    assert!(connected >= 2, "{}", bed.agent.log_tail(30));
    let (_, text) = http_get(&addr, "/metrics").await;
    assert!(
        metric(&text, "exitorder_runtime_errors_total") >= 1.0,
        "{text}"
    );
    let d = deletion
        .await
        .expect("delete task")
        .unwrap_or_else(|e| panic!("delete pod: {e}"));
    bed.show("containerd_restarted_mid_wait_misses_no_exit", &d);
    assert_exited_after(&bed, &d, "proxy", "app");
    // The kill failed with the runtime away and was tried again, the proxy's preStop with it
    // (the pod worker's retry: a fresh hook and grace for the containers still running).
    let proxy_hooks = d
        .timeline
        .events
        .iter()
        .filter(|e| {
            e.container.as_deref() == Some("proxy")
                && matches!(e.what, exitorder_testbed::What::PreStopStarted { .. })
        })
        .count();
    assert!(
        d.timeline
            .events
            .iter()
            .any(|e| matches!(e.what, exitorder_testbed::What::KillFailed { .. }))
            && proxy_hooks == 2,
        "{}",
        bed.context(&d)
    );
    // The restart broke the preStop's exec (the kubelet then stops the sidecar itself, once
    // the runtime is back); whatever the agent answered after it, it was not the deadline
    // and not before the app's exit.
    if let Some(allow) = bed
        .agent
        .find(|l| l.is("allow", &[("pod", &uid), ("container", "proxy")]))
    {
        assert_ne!(
            allow.field("reason").as_deref(),
            Some("deadline"),
            "{}",
            bed.context(&d)
        );
    }
    bed.finish().await;
}

#[tokio::test]
async fn runtime_socket_absent_at_start() {
    let Some(node) = node_or_skip().await else {
        return;
    };
    // The agent is given a socket path that does not exist yet, as on a node where the agent
    // starts before containerd; it appears later (a link to the real one).
    let late = node.dir().join("late.sock");
    let mut opts = AgentOptions::new(agent_bin(), &node, static_entrypoint());
    opts.cri_socket = late.clone();
    let agent = AgentProcess::start(&opts)
        .await
        .unwrap_or_else(|e| panic!("agent did not start: {e}"));
    let addr = metrics_addr(&agent).await;
    let (status, body) = http_get(&addr, "/readyz").await;
    assert_eq!(status, 503, "ready without a runtime: {body}");
    until("a failed runtime call counted", secs(10), || {
        let addr = addr.clone();
        async move {
            let (_, text) = http_get(&addr, "/metrics").await;
            metric(&text, "exitorder_runtime_errors_total") >= 1.0
        }
    })
    .await;
    std::os::unix::fs::symlink(node.socket(), &late).expect("link the socket");
    until("ready once the runtime is there", secs(40), || {
        let addr = addr.clone();
        async move { http_get(&addr, "/readyz").await.0 == 200 }
    })
    .await;
    agent
        .wait_for("containerd's event stream", secs(40), |l| {
            l.says("exit source connected", &[("source", "containerd_events")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let bed = Bed {
        agent,
        agent_opts: opts,
        node,
    };
    let running = bed.run_ready(&example("two-level")).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show("runtime_socket_absent_at_start", &d);
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.finish().await;
}

#[tokio::test]
async fn agent_killed_mid_drain_its_successor_answers_every_wait_in_order() {
    let Some(mut bed) = Bed::start(secs(3)).await else {
        return;
    };
    let mut p = example("three-level");
    edit_script(&mut p, "app", "sleep 2", "sleep 4");
    set_grace(&mut p, 40);
    let running = bed.run_ready(&p).await;
    let uid = running.uid().to_owned();
    let deletion = tokio::spawn(running.delete());
    for c in ["proxy", "log-shipper"] {
        bed.held(&uid, c).await;
    }
    bed.restart_agent().await.unwrap_or_else(|e| panic!("{e}"));
    let d = deletion.await.expect("delete task").expect("delete pod");
    bed.show(
        "agent_killed_mid_drain_its_successor_answers_every_wait_in_order",
        &d,
    );
    assert_eq!(
        d.exit_order(),
        ["app", "proxy", "log-shipper"],
        "{}",
        bed.context(&d)
    );
    assert_exited_after(&bed, &d, "proxy", "app");
    assert_exited_after(&bed, &d, "log-shipper", "proxy");
    for c in ["proxy", "log-shipper"] {
        bed.allowed_ordered(&uid, c, "").await;
    }
    bed.finish().await;
}

#[tokio::test]
async fn sigterm_with_exits_pending_stops_in_bounds_and_leaves_them_to_the_successor() {
    let Some(mut bed) = Bed::start(secs(3)).await else {
        return;
    };
    let running = bed.run_ready(&slow_two_level()).await;
    let uid = running.uid().to_owned();
    let deletion = tokio::spawn(running.delete());
    bed.held(&uid, "proxy").await;
    // Bounded: the agent's own shutdown timeout is 10 s; it has nothing slow to finish here.
    let status = bed
        .agent
        .terminate(secs(15))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = status.unwrap_or_else(|| panic!("the agent ignored SIGTERM"));
    assert!(status.success(), "agent exit: {status}");
    // Answering on the way out would break the order: the wait is left as it was.
    assert_eq!(read(&exit_file(&bed, &uid, "proxy")).trim(), "wait");
    assert!(bed
        .agent
        .lines()
        .iter()
        .any(|l| l.says("agent stopped", &[("pending", "1")])));
    bed.agent = AgentProcess::start(&bed.agent_opts)
        .await
        .unwrap_or_else(|e| panic!("successor: {e}"));
    let d = deletion.await.expect("delete task").expect("delete pod");
    bed.show(
        "sigterm_with_exits_pending_stops_in_bounds_and_leaves_them_to_the_successor",
        &d,
    );
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.finish().await;
}

#[tokio::test]
async fn lost_file_events_are_recovered_by_a_rescan() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let pid = bed.agent.pid().expect("agent pid");
    let agent_pid = rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid")).expect("pid");
    let running = bed.run_ready(&slow_two_level()).await;
    let uid = running.uid().to_owned();
    // Stopped, the agent reads no events: what follows overflows its inotify queue, the
    // proxy's exit file among them.
    rustix::process::kill_process(agent_pid, rustix::process::Signal::STOP).expect("SIGSTOP");
    let deletion = tokio::spawn(running.delete());
    let exit = exit_file(&bed, &uid, "proxy");
    until("the proxy's exit file", secs(15), || {
        std::future::ready(read(&exit).trim() == "wait")
    })
    .await;
    let pods = bed.node.share_dir().join("pods");
    // Each junk directory is two events (created, removed): past the queue's length for sure.
    let queue: usize = read(Path::new("/proc/sys/fs/inotify/max_queued_events"))
        .trim()
        .parse()
        .unwrap_or(16_384);
    for i in 0..queue / 2 + 1_000 {
        let junk = pods.join(format!("junk-{i}"));
        std::fs::create_dir(&junk).expect("junk dir");
        std::fs::remove_dir(&junk).expect("junk dir");
    }
    rustix::process::kill_process(agent_pid, rustix::process::Signal::CONT).expect("SIGCONT");
    bed.agent
        .wait_for("the rescan", secs(15), |l| {
            l.says("file events were lost; rescanning the share", &[])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let d = deletion.await.expect("delete task").expect("delete pod");
    bed.show("lost_file_events_are_recovered_by_a_rescan", &d);
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.finish().await;
}

#[tokio::test]
async fn share_removed_and_created_again_under_the_agent() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let share = bed.node.share_dir().to_owned();
    // Moved away and removed, as `rm -rf` of a node cleanup would leave it, then the
    // directory an operator (or the chart's DirectoryOrCreate) makes again.
    let old = share.with_extension("old");
    std::fs::rename(&share, &old).expect("move the share away");
    std::fs::remove_dir_all(&old).expect("remove the old share");
    std::fs::create_dir(&share).expect("create the share again");
    bed.agent
        .wait_for("the agent on the new share", secs(30), |l| {
            l.is("share_reopened", &[])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The entrypoint is apart from the share: what happened to the share did not touch it.
    assert!(
        bed.node.bin_dir().join("exitorder-entrypoint").is_file(),
        "the entrypoint is gone"
    );
    assert!(!share.join("bin").exists(), "the share got a bin/ again");
    let running = bed.run_ready(&slow_two_level()).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show("share_removed_and_created_again_under_the_agent", &d);
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.finish().await;
}

/// A bind mount of `source` on `target`, as a hostPath volume is; unmounted when dropped.
struct BindMount(PathBuf);

impl BindMount {
    fn new(source: &Path, target: &Path) -> BindMount {
        let status = std::process::Command::new("mount")
            .arg("--bind")
            .arg(source)
            .arg(target)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "bind {} on {}",
            source.display(),
            target.display()
        );
        BindMount(target.to_owned())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test]
async fn a_share_root_removed_under_its_mount_stops_the_agent_for_a_fresh_mount() {
    let Some(node) = node_or_skip().await else {
        return;
    };
    // In a pod the agent sees the share through a hostPath (bind) mount: removing the host
    // directory leaves the agent a deleted directory, in which nothing can be made again.
    let host = node.dir().join("host-share");
    let seen = node.dir().join("mounted-share");
    std::fs::create_dir(&host).expect("host directory");
    std::fs::create_dir(&seen).expect("mount point");
    let mount = BindMount::new(&host, &seen);
    let mut opts = AgentOptions::new(agent_bin(), &node, static_entrypoint());
    opts.share_dir = seen.clone();
    let mut agent = AgentProcess::start(&opts)
        .await
        .unwrap_or_else(|e| panic!("agent did not start: {e}"));
    // The agent may still be making its start-up entries in it (`bin/`, `pods/`): a removal
    // that finds one new is done again until the directory is gone, within a deadline.
    let deadline = std::time::Instant::now() + secs(10);
    loop {
        match std::fs::remove_dir_all(&host) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("removing the host directory again: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("remove the host directory: {e}"),
        }
    }
    let status = agent
        .wait_exit(secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("the agent runs on\n{}", agent.log_tail(20)));
    assert!(!status.success(), "agent exit: {status}");
    assert!(
        agent.lines().iter().any(|l| l.is("share_lost", &[])),
        "{}",
        agent.log_tail(20)
    );
    assert!(
        agent
            .lines()
            .iter()
            .any(|l| l.text.contains("exiting so that it is mounted again")),
        "{}",
        agent.log_tail(20)
    );
    drop(mount);
    if let Err(e) = node.shutdown().await {
        panic!("node teardown: {e}");
    }
}

/// A small tmpfs as the share, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = std::env::temp_dir().join(format!(
            "exitorder-fulldisk-{}",
            exitorder_testbed::random_suffix()
        ));
        std::fs::create_dir(&dir).expect("mount point");
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs on {}", dir.display());
        SmallDisk(dir)
    }

    /// Fills it: a file written until the disk says ENOSPC.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).expect("filler");
        let block = vec![0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc_enospc()) => break,
                Err(e) => panic!("fill: {e}"),
            }
        }
        path
    }
}

fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn a_full_disk_delays_the_allow_never_corrupts_it() {
    let disk = SmallDisk::mount("8m");
    let opts = NodeOptions {
        share_dir: Some(disk.0.clone()),
        ..NodeOptions::default()
    };
    let Some(node) = node_with_or_skip(opts).await else {
        return;
    };
    let mut agent_opts = AgentOptions::new(agent_bin(), &node, static_entrypoint());
    agent_opts.grace_reserve = secs(3);
    let bed = Bed::with_agent(node, agent_opts).await;
    let addr = metrics_addr(&bed.agent).await;
    let running = bed.run_ready(&slow_two_level()).await;
    let uid = running.uid().to_owned();
    let deletion = tokio::spawn(running.delete());
    bed.held(&uid, "proxy").await;
    let filler = disk.fill();
    // The app exits; the allow cannot be written: the agent says so, counts it and tries again.
    let failed = bed
        .agent
        .wait_for("a failed allow", secs(20), |l| {
            l.is("allow_failed", &[("pod", &uid), ("container", "proxy")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        failed
            .field("error")
            .unwrap_or_default()
            .contains("No space"),
        "{}",
        failed.text
    );
    let (_, text) = http_get(&addr, "/metrics").await;
    assert!(
        metric(&text, "exitorder_share_errors_total") >= 1.0,
        "{text}"
    );
    // Never a partial answer, nor a temp file left behind.
    let dir = exit_file(&bed, &uid, "proxy");
    assert_eq!(read(&dir).trim(), "wait");
    let dir = dir.parent().expect("container dir").to_owned();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("container dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // `agent`: the agent's presence, written when it first watched the directory.
    assert_eq!(names, ["agent", "exit"], "{}", dir.display());
    // Space again: the next try answers.
    std::fs::remove_file(&filler).expect("free the disk");
    bed.allowed_ordered(&uid, "proxy", "").await;
    let d = deletion.await.expect("delete task").expect("delete pod");
    bed.show("a_full_disk_delays_the_allow_never_corrupts_it", &d);
    assert_exited_after(&bed, &d, "proxy", "app");
    assert_eq!(d.container("proxy").map(|c| c.exit_code), Some(0));
    bed.finish().await;
    drop(disk);
}

/// An "API server" that answers every request with one of several kinds of garbage, in turn:
/// JSON that is not a list, truncated JSON, an HTML error page, a 500, bytes that are not HTTP,
/// a connection closed without an answer. Counts the requests.
async fn serve_garbage() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    tokio::spawn(async move {
        const ANSWERS: [&[u8]; 6] = [
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\r\n{\"kind\":\"PodList\",\"items\":7}",
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"kind\":\"PodList\",\"items\":[{\"metadata\":",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 20\r\n\r\n<html>oops</html>\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nboom\n",
            b"\x00\xff\xfe garbage that is not HTTP\r\n\r\n",
            b"",
        ];
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let n = count.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(ANSWERS[n % ANSWERS.len()]).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr, asked)
}

#[tokio::test]
async fn an_api_server_answering_garbage_leaves_the_runtime_rules() {
    let Some(node) = node_or_skip().await else {
        return;
    };
    let (api, asked) = serve_garbage().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = fakeapi::write_kubeconfig(dir.path(), &api);
    let mut opts = AgentOptions::new(agent_bin(), &node, static_entrypoint());
    opts.env = vec![
        ("KUBECONFIG".to_owned(), kubeconfig.display().to_string()),
        ("NODE_NAME".to_owned(), "exitorder-testbed".to_owned()),
    ];
    let bed = Bed::with_agent(node, opts).await;
    let addr = metrics_addr(&bed.agent).await;
    until("the garbage served a few times", secs(20), || {
        let n = asked.load(std::sync::atomic::Ordering::Relaxed);
        async move { n >= 3 }
    })
    .await;
    let running = bed.run_ready(&slow_two_level()).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("delete pod");
    bed.show(
        "an_api_server_answering_garbage_leaves_the_runtime_rules",
        &d,
    );
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    let (_, text) = http_get(&addr, "/metrics").await;
    assert!(metric(&text, "exitorder_api_errors_total") >= 1.0, "{text}");
    assert!(
        text.contains("exitorder_api_watch{state=\"up\"} 0"),
        "the watch never counts as up on garbage\n{text}"
    );
    assert!(
        !bed.agent
            .lines()
            .iter()
            .any(|l| l.text.contains("panicked")),
        "{}",
        bed.agent.log_tail(30)
    );
    assert_eq!(http_get(&addr, "/healthz").await.0, 200);
    bed.finish().await;
}
