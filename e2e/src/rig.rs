//! The real agent loop on a temp share, against an in-process fake CRI runtime and, when a
//! test gives one, a cluster link (pod watch and Events).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exitorder::agent::{Agent, Config, Farewell};
use exitorder::cluster::Cluster;
use exitorder::decide::Reason;
use exitorder::stats::Stats;
use tokio::sync::oneshot;

use crate::fakecri::{FakeCri, Served};

pub const APP_UID: &str = "8a3e8c3b-1111-4c3e-9f00-000000000001";

pub struct Rig {
    _dir: tempfile::TempDir,
    pub share: PathBuf,
    /// The agent's `--bin-dir`.
    pub bin_dir: PathBuf,
    pub served: Served,
    pub stats: Arc<Stats>,
    agent: Option<(tokio::task::JoinHandle<()>, oneshot::Sender<Farewell>)>,
    pub reserve: Duration,
}

impl Default for Rig {
    fn default() -> Self {
        Rig::new()
    }
}

impl Rig {
    pub fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let share = dir.path().join("share");
        let served = FakeCri::default().serve(&dir.path().join("cri.sock"));
        Rig {
            share,
            bin_dir: dir.path().join("bin-dir"),
            served,
            _dir: dir,
            stats: Arc::new(Stats::default()),
            agent: None,
            reserve: Duration::from_secs(1),
        }
    }

    pub fn cri(&self) -> &FakeCri {
        &self.served.cri
    }

    pub fn start_agent(&mut self) {
        self.start_agent_with(|cfg| cfg.poll_interval = Duration::from_millis(10));
    }

    pub fn start_agent_with(&mut self, tune: impl FnOnce(&mut Config)) {
        self.stats = Arc::new(Stats::default());
        self.start_agent_linked(tune, None);
    }

    /// Starts the agent with `self.stats` (a test that built a cluster link on them keeps
    /// them) and the link, if any.
    pub fn start_agent_linked(&mut self, tune: impl FnOnce(&mut Config), cluster: Option<Cluster>) {
        let mut cfg = Config::new(self.share.clone(), self.served.socket.clone());
        cfg.grace_reserve = self.reserve;
        cfg.bin_dir = self.bin_dir.clone();
        tune(&mut cfg);
        let mut agent = Agent::start(cfg, self.stats.clone()).expect("agent start");
        if let Some(c) = cluster {
            agent = agent.with_cluster(c);
        }
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            agent
                .run(async { rx.await.unwrap_or_default() })
                .await
                .expect("agent run");
        });
        self.agent = Some((task, tx));
    }

    pub async fn stop_agent(&mut self) {
        self.stop_agent_for(Farewell::Restart).await;
    }

    /// Stops the agent as exitorder's uninstall does.
    pub async fn uninstall_agent(&mut self) {
        self.stop_agent_for(Farewell::Uninstall).await;
    }

    async fn stop_agent_for(&mut self, farewell: Farewell) {
        if let Some((task, tx)) = self.agent.take() {
            let _ = tx.send(farewell);
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("agent stops within its bound")
                .expect("agent task");
        }
    }

    pub fn dir(&self, uid: &str, name: &str) -> PathBuf {
        self.share.join("pods").join(uid).join(name)
    }

    /// What the entrypoint does when a preStop starts: create `exit` saying `wait`.
    pub fn request_exit(&self, uid: &str, name: &str) -> PathBuf {
        let dir = self.dir(uid, name);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("exit");
        std::fs::write(&f, "wait\n").unwrap();
        f
    }
}

impl Rig {
    /// What `exitorder-entrypoint mark` does when a preStop starts: `stopping` made anew.
    pub fn mark(&self, uid: &str, name: &str) {
        let dir = self.dir(uid, name);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(exitorder_contract::handshake::MARK_FILE);
        let _ = std::fs::remove_file(&f);
        std::fs::write(&f, "").unwrap();
    }
}

/// A preStop handler as the kubelet records it, running exitorder's entrypoint with `verb`.
pub fn entrypoint_prestop(verb: &str) -> String {
    serde_json::json!({"exec": {"command": [exitorder_contract::mount::ENTRYPOINT, verb]}})
        .to_string()
}

pub fn content(f: &Path) -> String {
    std::fs::read_to_string(f).unwrap_or_default()
}

/// Waits until `f` says allow; false if `within` passes first.
pub async fn allowed_within(f: &Path, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if content(f).trim() == "allow" {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// Waits until the agent has counted `n` allows for `reason` (the count follows the write).
pub async fn allows_reach(stats: &Stats, reason: Reason, n: u64) {
    let end = Instant::now() + Duration::from_secs(2);
    while stats.allows(reason) != n {
        assert!(
            Instant::now() < end,
            "allows for {reason}: {} (expected {n})",
            stats.allows(reason)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Asserts `f` is still unanswered over `span` (many agent poll rounds).
pub async fn stays_waiting(f: &Path, span: Duration) {
    assert!(
        !allowed_within(f, span).await,
        "{} was answered too early",
        f.display()
    );
    assert_eq!(content(f).trim(), "wait");
}

/// Waits until the agent reports `source` in use.
#[allow(dead_code)]
pub async fn source_becomes(stats: &Stats, source: &str) {
    let end = Instant::now() + Duration::from_secs(5);
    while stats.event_source() != source {
        assert!(
            Instant::now() < end,
            "source stayed {:?}, expected {source}",
            stats.event_source()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
