//! A pod racing its own handshake volume at full speed, on a real containerd: what it does
//! in its `exitorder` emptyDir costs that pod at most, never another pod's order, nor the
//! agent's liveness, memory or watches, and never makes the agent look outside the volume.
//!
//! The racers run on the host against the pod's volume (where the kubelet keeps it), as
//! another container of the pod mounting the whole volume would: busybox has no
//! `renameat2(RENAME_EXCHANGE)`, and the host's threads race faster than a shell.
//!
//! Needs root and `containerd runc busybox-static`; without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use exitorder_e2e::support::procfs::{
    inotify_watched_inodes, inotify_watches, open_fds, peak_rss_kib,
};
use exitorder_e2e::support::{self, Bed};
use exitorder_testbed::RunningPod;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Threads changing a pod's volume until dropped.
struct Racers {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Racers {
    fn new() -> Racers {
        Racers {
            stop: Arc::new(AtomicBool::new(false)),
            rounds: Arc::new(AtomicU64::new(0)),
            threads: Vec::new(),
        }
    }

    /// Runs `round` without pause until stopped.
    fn spawn(&mut self, mut round: impl FnMut() + Send + 'static) {
        let (stop, rounds) = (self.stop.clone(), self.rounds.clone());
        self.threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                round();
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    /// `exit` made and removed in `dir` without end.
    fn churn_exit(&mut self, dir: PathBuf) {
        std::fs::create_dir_all(&dir).expect("churn dir");
        let exit = dir.join("exit");
        self.spawn(move || {
            let _ = std::fs::write(&exit, "wait\n");
            let _ = std::fs::remove_file(&exit);
        });
    }

    /// `name` (a directory of the pod's) exchanged with a link to `target` without end.
    fn exchange(&mut self, volume: &Path, name: &str, target: &Path) {
        let real = volume.join(name);
        let link = volume.join(format!("{name}-link"));
        std::fs::create_dir_all(&real).expect("real dir");
        std::fs::write(real.join("exit"), "wait\n").expect("exit in the real dir");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link).expect("link");
        self.spawn(move || {
            let _ = rustix::fs::renameat_with(
                rustix::fs::CWD,
                &real,
                rustix::fs::CWD,
                &link,
                rustix::fs::RenameFlags::EXCHANGE,
            );
        });
    }

    fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().expect("racer");
        }
        self.rounds()
    }
}

impl Drop for Racers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The pod's `exitorder` emptyDir, where the kubelet keeps it.
fn volume(bed: &Bed, pod: &RunningPod) -> PathBuf {
    bed.node.empty_dir(pod.uid(), "exitorder")
}

fn inode(p: &Path) -> u64 {
    std::fs::metadata(p).expect("stat").ino()
}

async fn metric(bed: &Bed, name: &str) -> f64 {
    let addr = support::metrics_addr(&bed.agent).await;
    let (_, text) = support::http_get(&addr, "/metrics").await;
    support::parse_metrics(&text)
        .into_iter()
        .find(|(k, _)| k == name)
        .map_or(0.0, |(_, v)| v)
}

/// The agent's own part of an allow (µs from the exit it waited for).
fn decided_us(bed: &Bed, uid: &str) -> u64 {
    bed.agent
        .find(|l| l.is("allow", &[("pod", uid), ("container", "proxy")]))
        .and_then(|l| l.field("decided_us"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX)
}

/// Victims deleted one after the other while the racers run: each ordered, its allow decided
/// within `bound_us` of the app's exit. One in the share, one pod-local, alternately.
async fn victims_ordered(bed: &Bed, n: usize, bound_us: u64) -> Vec<u64> {
    let mut decided = Vec::new();
    for i in 0..n {
        let mut p = if i % 2 == 0 {
            support::example("two-level")
        } else {
            support::pod_local("victim")
        };
        p["metadata"]["name"] = format!("victim-{i}").into();
        let running = bed.run_ready(&p).await;
        let uid = running.uid().to_owned();
        // Served before it goes, as a pod that lived more than a moment is: the flood may
        // delay the agent's first mark of a new pod past the sidecar's 1 s presence wait on
        // a busy machine (a deadline, not a span).
        let served = if i % 2 == 0 {
            bed.node.share_dir().join("pods").join(&uid).join("proxy")
        } else {
            volume(bed, &running).join("proxy")
        }
        .join(exitorder_contract::handshake::AGENT_FILE);
        support::until(
            "the agent serves the victim",
            Duration::from_secs(30),
            || std::future::ready(served.exists()),
        )
        .await;
        let d = running.delete().await.expect("delete victim");
        bed.assert_ordered(&d, &uid, "proxy", "app").await;
        let us = decided_us(bed, &uid);
        assert!(
            us < bound_us,
            "victim {i}: decided {us} µs after the app's exit{}",
            bed.context(&d)
        );
        decided.push(us);
    }
    decided
}

#[tokio::test]
async fn exit_churn_in_its_own_volume_costs_that_pod_only() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let pid = bed.agent.pid().expect("agent pid");
    // A container of the pod mounting the whole volume churns an `exit` of its own making
    // from inside, as fast as its shell goes; the host's racers below stand in for faster
    // ones (and for what busybox cannot do).
    let mut p = support::pod_local("flooder");
    p["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .push(serde_json::json!({
            "name": "churner",
            "image": "busybox:1.36",
            "command": ["sh", "-c",
                "trap 'exit 0' TERM; mkdir -p /v/inpod; while :; do echo wait > /v/inpod/exit; rm -f /v/inpod/exit; done"],
            "volumeMounts": [{"name": "exitorder", "mountPath": "/v"}],
        }));
    let flooder = bed.run_ready(&p).await;
    let vol = volume(&bed, &flooder);
    // And in the host share, where a container has only its own directory: its `exit`.
    let mut p = support::example("two-level");
    p["metadata"]["name"] = "share-flooder".into();
    let share_flooder = bed.run_ready(&p).await;
    let mut racers = Racers::new();
    racers.churn_exit(vol.join("churn"));
    racers.churn_exit(vol.join("churn2"));
    racers.churn_exit(
        bed.node
            .share_dir()
            .join("pods")
            .join(share_flooder.uid())
            .join("proxy"),
    );
    // Tens of thousands of directories too: far more than a pod's share of watches.
    for i in 0..20_000 {
        std::fs::create_dir_all(vol.join(format!("d{i}"))).expect("dir");
    }
    let decided = victims_ordered(&bed, 4, 200_000).await;
    let rounds = racers.rounds();
    eprintln!("exit churn: {rounds} racer rounds; victims decided in µs: {decided:?}");
    assert!(rounds > 1_000, "the racers hardly ran: {rounds}");
    // The pod with 20,000 directories is past its share of watches whatever the racers'
    // speed: polled. (The churners spend the events budget too, on a machine fast enough.)
    let polled = metric(&bed, "exitorder_pods_polled").await;
    let spent = metric(&bed, "exitorder_pod_budget_spent_total{what=\"watches\"}").await;
    assert!(
        spent >= 1.0 && (1.0..=2.0).contains(&polled),
        "{polled} polled, {spent} past their watches\n{}",
        bed.agent.log_tail(20)
    );
    let (watches, fds) = (inotify_watches(pid).len(), open_fds(pid));
    assert!(
        watches < 200 && fds < 200,
        "the agent holds {watches} watches, {fds} descriptors\n{}",
        bed.agent.log_tail(20)
    );
    racers.stop();
    let peak = peak_rss_kib(pid);
    eprintln!("exit churn: agent peak RSS {peak} KiB, {watches} watches, {fds} descriptors");
    assert!(peak < 96 * 1024, "agent peak RSS {peak} KiB");
    // The flooding pods themselves, polled now, are still ordered when they go.
    for pod in [flooder, share_flooder] {
        let uid = pod.uid().to_owned();
        let d = pod.delete().await.expect("delete flooder");
        bed.assert_ordered(&d, &uid, "proxy", "app").await;
    }
    assert!(bed.agent.find(|l| l.text.contains("panicked")).is_none());
    bed.finish().await;
}

#[tokio::test]
async fn an_exchanged_link_never_gets_a_watch_nor_takes_the_kubelets() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let pid = bed.agent.pid().expect("agent pid");
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("exit"), "wait\n").expect("outside exit");
    let kube_pods = bed.node.kubelet_root().join("pods");
    let share_pods = bed.node.share_dir().join("pods");
    let (outside_ino, kube_ino, share_ino) =
        (inode(outside.path()), inode(&kube_pods), inode(&share_pods));
    let before = inotify_watched_inodes(pid);
    assert!(before.contains(&kube_ino) && before.contains(&share_ino));
    let outside_atime = std::fs::metadata(outside.path().join("exit"))
        .expect("stat")
        .atime();

    let hostile = bed.run_ready(&support::pod_local("exchanger")).await;
    let vol = volume(&bed, &hostile);
    let mut racers = Racers::new();
    racers.exchange(&vol, "proxy2", outside.path());
    racers.exchange(&vol, "proxy3", &kube_pods);
    racers.exchange(&vol, "proxy4", &share_pods);
    // Sampled while they race: never a watch outside, the roots watched throughout.
    let deadline = std::time::Instant::now() + secs(5);
    let mut samples = 0;
    while std::time::Instant::now() < deadline {
        let watched = inotify_watched_inodes(pid);
        assert!(!watched.contains(&outside_ino), "a watch outside the pod");
        assert!(
            watched.contains(&kube_ino) && watched.contains(&share_ino),
            "a root's watch went: {watched:?}"
        );
        samples += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rounds = racers.stop();
    eprintln!("exchange: {rounds} exchanges, {samples} samples of the agent's watches");
    assert!(rounds > 1_000, "the racers hardly ran: {rounds}");
    // Nothing outside was read (its access time, before this test reads it) or written.
    assert_eq!(
        std::fs::metadata(outside.path().join("exit"))
            .expect("stat")
            .atime(),
        outside_atime,
        "the file outside was read"
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("exit")).expect("outside exit"),
        "wait\n"
    );
    // A pod created after the race is found by its events, not a rescan: ordered at once.
    let decided = victims_ordered(&bed, 2, 200_000).await;
    eprintln!("exchange: victims after the race decided in µs: {decided:?}");
    let uid = hostile.uid().to_owned();
    let d = hostile.delete().await.expect("delete");
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.finish().await;
}

#[tokio::test]
async fn sigterm_ends_the_agent_in_bounds_under_a_flood() {
    let Some(mut bed) = Bed::start(secs(3)).await else {
        return;
    };
    let outside = tempfile::tempdir().expect("outside");
    let hostile = bed.run_ready(&support::pod_local("flood-term")).await;
    let waiting = bed.run_ready(&support::example("two-level")).await;
    let vol = volume(&bed, &hostile);
    let mut racers = Racers::new();
    racers.churn_exit(vol.join("churn"));
    racers.exchange(&vol, "proxy2", outside.path());
    // A wait pending in another pod when the agent goes: left for the next agent.
    let exit = bed
        .node
        .share_dir()
        .join("pods")
        .join(waiting.uid())
        .join("proxy/exit");
    std::fs::write(&exit, "wait\n").expect("a pending wait");
    tokio::time::sleep(secs(2)).await;
    let started = std::time::Instant::now();
    let status = bed
        .agent
        .terminate(secs(15))
        .await
        .expect("signal")
        .unwrap_or_else(|| panic!("the agent did not end\n{}", bed.agent.log_tail(20)));
    let took = started.elapsed();
    racers.stop();
    eprintln!("sigterm under a flood: the agent ended in {took:?} with {status}");
    assert!(status.success(), "{status}\n{}", bed.agent.log_tail(20));
    assert!(took < secs(12), "{took:?}");
    assert_eq!(std::fs::read_to_string(&exit).expect("exit"), "wait\n");
    std::fs::remove_file(&exit).expect("remove the planted wait");
    drop(waiting);
    drop(hostile);
    bed.finish().await;
}
