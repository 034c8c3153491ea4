//! A node whose kubelet (the test bed's) reports to a fake API server as the real one does,
//! and the agent watching that API server: what every test of the kubelet's own kills runs on.

use std::sync::Arc;
use std::time::Duration;

use crate::fakeapi::{FakeApi, ServedApi};
use crate::support::{self, agent_bin, Bed};
use exitorder_testbed::kubelet::RunOptions;
use exitorder_testbed::{
    AgentOptions, ApiLog, DeleteOptions, Deletion, Kill, Reported, RunningPod,
};
use serde_json::Value;

/// The node's name, as the agent and the fake API server know it.
pub const NODE: &str = "kills-node";

/// A port nothing listens on.
pub fn free_port() -> u16 {
    exitorder_testbed::node::free_port().expect("a free port")
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A node, a fake API server fed by the test bed's kubelet, and the agent watching it.
pub struct KillBed {
    pub bed: Bed,
    pub served: ServedApi,
    pub log: Arc<ApiLog>,
    _dir: tempfile::TempDir,
}

impl KillBed {
    pub async fn start() -> Option<KillBed> {
        KillBed::start_with(&[]).await
    }

    /// With these environment variables for the agent besides its API server's.
    pub async fn start_with(env: &[(&str, &str)]) -> Option<KillBed> {
        let node = support::node_or_skip().await?;
        let served = FakeApi::for_node(NODE).serve();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = AgentOptions::new(agent_bin(), &node, support::static_entrypoint());
        opts.grace_reserve = secs(1);
        let kubeconfig = served.write_kubeconfig(dir.path());
        opts.env = vec![
            ("KUBECONFIG".to_owned(), kubeconfig.display().to_string()),
            ("NODE_NAME".to_owned(), NODE.to_owned()),
        ];
        opts.env
            .extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let bed = Bed::with_agent(node, opts).await;
        bed.agent
            .wait_for("pod watch current", secs(10), |l| {
                l.says("pod watch current", &[("node", NODE)])
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let log = Arc::new(ApiLog::forwarding_to(Arc::new(served.api.clone())));
        Some(KillBed {
            bed,
            served,
            log,
            _dir: dir,
        })
    }

    /// Runs `pod` until ready; the fake API server has it as scheduled here and running.
    pub async fn run(&self, pod: &Value) -> RunningPod {
        let running = self.run_unready(pod).await;
        running
            .wait_ready(secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        running
    }

    /// Runs `pod`; the fake API server has it as scheduled here and running.
    pub async fn run_unready(&self, pod: &Value) -> RunningPod {
        self.run_tuned(pod, |_| {}).await
    }

    /// Runs `pod` with the run's options tuned; the fake API server has it as scheduled here
    /// and running.
    pub async fn run_tuned(&self, pod: &Value, tune: impl FnOnce(&mut RunOptions)) -> RunningPod {
        let mut opts = RunOptions {
            force_host_network: true,
            api: Some(self.log.clone()),
            ..Default::default()
        };
        tune(&mut opts);
        let running = self
            .bed
            .node
            .run_pod(pod, &opts)
            .await
            .unwrap_or_else(|e| panic!("run pod: {e}"));
        self.served
            .api
            .apply(support::api_pod_of(pod, &running, NODE));
        running
    }

    /// Kills the pod the kubelet's way `kill`, asserts the proxy left after the app, let go
    /// by the order, and the API said `Running` until the end.
    pub async fn kill_keeps_order(&self, pod: &Value, kill: Kill, kind: &str) -> Deletion {
        let running = self.run(pod).await;
        let uid = running.uid().to_owned();
        let d = running
            .delete_with(DeleteOptions {
                kill,
                ..DeleteOptions::probed()
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        self.bed.show(kind, &d);
        support::assert_exited_after(&self.bed, &d, "proxy", "app");
        let allow = self.bed.allowed(&uid, "proxy").await;
        assert!(
            allow.is("allow", &[("reason", "ordered")]),
            "{kind}: {allow:?}{}",
            self.bed.context(&d)
        );
        self.api_said_running_until_the_end(&uid, &d);
        d
    }

    /// Every status the kubelet reported before the last container exited said `Running`.
    pub fn api_said_running_until_the_end(&self, uid: &str, d: &Deletion) {
        let last_exit = d
            .containers
            .iter()
            .map(|c| c.finished_at_ns)
            .max()
            .unwrap_or(0);
        for (at, r) in self.log.seen() {
            let Reported::Status { pod, status } = r else {
                continue;
            };
            if pod.uid != uid {
                continue;
            }
            let at_ns = at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |t| t.as_nanos() as i64);
            if at_ns < last_exit {
                assert_eq!(status.phase, "Running", "{status:?} before the last exit");
            }
        }
    }

    /// Every allow the agent logged for `container` of pod `uid`, oldest first, once the
    /// first is in the log. The agent logs an allow after its rename, so the entrypoint (and
    /// the preStop the caller waited on) may return before the line is written: it is awaited,
    /// up to a deadline, and an empty list after that is the caller's failure to report.
    pub async fn allows(&self, uid: &str, container: &str) -> Vec<exitorder_testbed::LogLine> {
        let of = [("pod", uid), ("container", container)];
        // A missing line is reported by the caller with its own context.
        let _ = self
            .bed
            .agent
            .wait_for("an allow", Duration::from_secs(10), |l| l.is("allow", &of))
            .await;
        self.bed
            .agent
            .lines()
            .into_iter()
            .filter(|l| l.is("allow", &of))
            .collect()
    }

    /// Event LISTs the agent made of the fake API server.
    pub fn event_reads(&self) -> usize {
        self.served
            .api
            .requests()
            .iter()
            .filter(|r| r.starts_with("GET ") && r.contains("/events?"))
            .count()
    }

    /// Asserts that the agent's decisions took the Node's word that the node shuts down, and
    /// asked for no Event from then on (every kill is the shutdown's). Before it, a wait whose
    /// marks had not come yet may have been read once (a loaded runtime runs the hooks' execs
    /// late): the decisions log both, in their own order, which is what is checked.
    pub fn assert_no_read_once_the_node_said_shutdown(&self) {
        let lines = self.bed.agent.lines();
        let applied = lines
            .iter()
            .position(|l| l.is("node_shutdown_applied", &[]))
            .unwrap_or_else(|| {
                panic!(
                    "the agent never took the shutdown{}",
                    self.bed.agent.log_tail(40)
                )
            });
        let after: Vec<_> = lines[applied..]
            .iter()
            .filter(|l| l.is("word_asked", &[]))
            .collect();
        assert!(
            after.is_empty(),
            "Events asked for after the Node said shutdown: {after:?}"
        );
        // Every read the fake API server served was one the agent logged.
        let asked = lines.iter().filter(|l| l.is("word_asked", &[])).count();
        assert!(
            self.event_reads() <= asked,
            "{} reads served, {asked} logged",
            self.event_reads()
        );
    }

    pub async fn finish(self) {
        self.bed.finish().await;
    }
}
