//! The exitorder agent as a child process, with its JSON log lines captured as they come.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Node, TestbedError};

/// How to start the agent against a [`Node`].
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The `exitorder` executable.
    pub binary: PathBuf,
    pub cri_socket: PathBuf,
    pub share_dir: PathBuf,
    /// The node's kubelet root: pod-local exit directories are in its pods' `emptyDir`s.
    pub kubelet_root_dir: PathBuf,
    /// The static entrypoint the agent installs into `bin_dir`.
    pub entrypoint_binary: PathBuf,
    /// The node's bin directory (`--bin-dir`).
    pub bin_dir: PathBuf,
    pub grace_reserve: Duration,
    pub poll_interval: Duration,
    /// How long start-up may take until "agent ready".
    pub ready_timeout: Duration,
    pub env: Vec<(String, String)>,
    /// Where the agent runs as the chart's DaemonSet pod would, weighted by its CPU request
    /// (the node's [`AgentCpu`]); `None`: in the test bed's own cgroup.
    pub cpu: Option<AgentCpu>,
}

/// The node's CPU weights, for placing the agent among its pods.
#[derive(Debug, Clone)]
pub struct AgentCpu(Arc<super::CpuLayout>);

impl AgentOptions {
    /// The agent on `node`'s socket and share, 3 s grace reserve, default poll interval.
    pub fn new(binary: impl Into<PathBuf>, node: &Node, entrypoint: impl Into<PathBuf>) -> Self {
        AgentOptions {
            binary: binary.into(),
            cri_socket: node.socket().to_owned(),
            share_dir: node.share_dir().to_owned(),
            kubelet_root_dir: node.kubelet_root(),
            entrypoint_binary: entrypoint.into(),
            bin_dir: node.bin_dir(),
            grace_reserve: Duration::from_secs(3),
            poll_interval: Duration::from_millis(25),
            ready_timeout: Duration::from_secs(20),
            env: Vec::new(),
            cpu: node.shared.cpu.clone().map(AgentCpu),
        }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        // Its own process group, so a Ctrl-C at the terminal leaves stopping it to us.
        cmd.process_group(0)
            .arg("agent")
            .arg("--cri-socket")
            .arg(&self.cri_socket)
            .arg("--share-dir")
            .arg(&self.share_dir)
            .arg("--kubelet-root-dir")
            .arg(&self.kubelet_root_dir)
            .arg("--entrypoint-binary")
            .arg(&self.entrypoint_binary)
            .arg("--bin-dir")
            .arg(&self.bin_dir)
            .arg("--grace-reserve")
            .arg(format!("{}ms", self.grace_reserve.as_millis()))
            .arg("--poll-interval")
            .arg(format!("{}ms", self.poll_interval.as_millis()))
            .arg("--metrics-addr")
            .arg("127.0.0.1:0")
            .env("EXITORDER_LOG_FORMAT", "json")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }
}

/// One line the agent logged, with when it was read.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub at: Instant,
    pub text: String,
    /// The line parsed, when it is JSON (`EXITORDER_LOG_FORMAT=json`).
    pub json: Option<serde_json::Value>,
}

impl LogLine {
    /// The log message (`fields.message`).
    pub fn message(&self) -> Option<&str> {
        self.json.as_ref()?.get("fields")?.get("message")?.as_str()
    }

    /// A field of the event as text (strings as they are, numbers and others as JSON).
    pub fn field(&self, name: &str) -> Option<String> {
        let v = self.json.as_ref()?.get("fields")?.get(name)?;
        Some(match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }

    /// Whether this is the given event (the agent's stable `event` field: `allow`, `held`)
    /// with the given field values.
    pub fn is(&self, event: &str, fields: &[(&str, &str)]) -> bool {
        self.field("event").as_deref() == Some(event)
            && fields
                .iter()
                .all(|(k, v)| self.field(k).as_deref() == Some(*v))
    }

    /// Whether this is the given log message with the given field values (for lines that
    /// carry no `event`).
    pub fn says(&self, message: &str, fields: &[(&str, &str)]) -> bool {
        self.message() == Some(message)
            && fields
                .iter()
                .all(|(k, v)| self.field(k).as_deref() == Some(*v))
    }

    /// When the agent stamped the line (Unix ns), from its own timestamp.
    pub fn at_ns(&self) -> Option<i64> {
        let ts = self.json.as_ref()?.get("timestamp")?.as_str()?;
        crate::agentlog::timestamp_ns(ts).ok()
    }
}

#[derive(Default)]
struct LogState {
    lines: Vec<LogLine>,
    closed: bool,
}

/// A running agent. Killed (SIGKILL, by its PID) when dropped.
pub struct AgentProcess {
    child: Option<Child>,
    /// The pod cgroup it runs in, left once it has ended.
    cgroup: Option<(Arc<super::CpuLayout>, String)>,
    log: Arc<Mutex<LogState>>,
    changed: tokio::sync::watch::Receiver<usize>,
}

fn lock(log: &Mutex<LogState>) -> std::sync::MutexGuard<'_, LogState> {
    match log.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl AgentProcess {
    /// Starts the agent and waits for its "agent ready" line.
    pub async fn start(opts: &AgentOptions) -> Result<AgentProcess, TestbedError> {
        let agent = Self::spawn(opts)?;
        agent
            .wait_for(
                "the agent's \"agent ready\" line",
                opts.ready_timeout,
                |l| l.says("agent ready", &[]),
            )
            .await?;
        Ok(agent)
    }

    /// Starts the agent without waiting for it.
    pub fn spawn(opts: &AgentOptions) -> Result<AgentProcess, TestbedError> {
        let mut child = opts
            .command()
            .spawn()
            .map_err(|e| TestbedError::io("start", &opts.binary, e))?;
        // Moved at once: the threads it starts from now on are in its pod's cgroup, and
        // cgroup.procs moves any it has already started.
        let mut cgroup = None;
        if let Some(AgentCpu(cpu)) = &opts.cpu {
            let pid = child.id();
            let name = format!("exitorder-agent-{pid}");
            match cpu.run_as_pod(&name, super::AGENT_CPU_REQUEST_MILLI, pid) {
                Ok(path) => cgroup = Some((Arc::clone(cpu), path)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(TestbedError::io("place the agent in", name, e));
                }
            }
        }
        let log = Arc::new(Mutex::new(LogState::default()));
        let (tx, changed) = tokio::sync::watch::channel(0usize);
        if let Some(stderr) = child.stderr.take() {
            let log = Arc::clone(&log);
            let echo = std::env::var_os("EXITORDER_TESTBED_ECHO").is_some();
            let spawned = std::thread::Builder::new()
                .name("exitorder-agent-log".to_owned())
                .spawn(move || {
                    for line in BufReader::new(stderr).lines() {
                        let Ok(text) = line else { break };
                        if echo {
                            eprintln!("agent: {text}");
                        }
                        let line = LogLine {
                            at: Instant::now(),
                            json: serde_json::from_str(&text).ok(),
                            text,
                        };
                        let n = {
                            let mut st = lock(&log);
                            st.lines.push(line);
                            st.lines.len()
                        };
                        let _ = tx.send(n);
                    }
                    lock(&log).closed = true;
                    let _ = tx.send(usize::MAX);
                });
            if let Err(e) = spawned {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TestbedError::io("start log reader for", &opts.binary, e));
            }
        }
        Ok(AgentProcess {
            child: Some(child),
            cgroup,
            log,
            changed,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<LogLine> {
        lock(&self.log).lines.clone()
    }

    /// The first line so far that matches.
    pub fn find(&self, pred: impl Fn(&LogLine) -> bool) -> Option<LogLine> {
        lock(&self.log).lines.iter().find(|l| pred(l)).cloned()
    }

    /// The last `n` lines, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        let st = lock(&self.log);
        st.lines[st.lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits for a line matching `pred` (lines already read count too).
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&LogLine) -> bool,
    ) -> Result<LogLine, TestbedError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changed = self.changed.clone();
        loop {
            let closed = {
                let st = lock(&self.log);
                if let Some(l) = st.lines.iter().find(|l| pred(l)) {
                    return Ok(l.clone());
                }
                st.closed
            };
            if closed {
                return Err(TestbedError::AgentExited {
                    status: format!("before {what}"),
                    log_tail: self.log_tail(30),
                });
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                // The reader is gone: the next round sees `closed`.
                Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(_) => {
                    return Err(TestbedError::Timeout {
                        what: what.to_owned(),
                        waited: timeout,
                        context: format!("; the agent's log ends with:\n{}", self.log_tail(30)),
                    })
                }
            }
        }
    }

    /// SIGTERM, as the kubelet stops the agent's pod, then waits up to `timeout` for the
    /// process to end; `None` if it is still running then (it is left running).
    pub async fn terminate(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<std::process::ExitStatus>, TestbedError> {
        let Some(child) = self.child.as_mut() else {
            return Ok(None);
        };
        if let Some(pid) = i32::try_from(child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            rustix::process::kill_process(pid, rustix::process::Signal::TERM)
                .map_err(|e| TestbedError::io("signal", "the agent", e.into()))?;
        }
        self.wait_exit(timeout).await
    }

    /// Waits up to `timeout` for the process to end by itself; `None` if it still runs.
    pub async fn wait_exit(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<std::process::ExitStatus>, TestbedError> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(child) = self.child.as_mut() else {
                return Ok(None);
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    self.leave_cgroup();
                    return Ok(Some(status));
                }
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(None) => return Ok(None),
                Err(e) => return Err(TestbedError::io("wait for", "the agent", e)),
            }
        }
    }

    /// SIGKILL, as a node losing the agent would see it; waits for the process to go.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.leave_cgroup();
    }

    fn leave_cgroup(&mut self) {
        if let Some((cpu, cgroup)) = self.cgroup.take() {
            cpu.leave(&cgroup);
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields() {
        let text = r#"{"timestamp":"2026-11-21T12:00:00.000100Z","level":"INFO","fields":{"message":"exit allowed","event":"allow","pod":"p","container":"proxy","reason":"ordered","waited_ms":1034},"target":"exitorder::agent"}"#;
        let line = LogLine {
            at: Instant::now(),
            json: serde_json::from_str(text).ok(),
            text: text.to_owned(),
        };
        assert_eq!(line.message(), Some("exit allowed"));
        assert_eq!(line.field("waited_ms").as_deref(), Some("1034"));
        assert!(line.is("allow", &[("container", "proxy"), ("reason", "ordered")]));
        assert!(!line.is("allow", &[("reason", "deadline")]));
        assert!(line.says("exit allowed", &[("pod", "p")]));
        assert_eq!(line.at_ns(), Some(1_795_262_400_000_100_000));
    }
}
