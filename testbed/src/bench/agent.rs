//! The agent as the benchmark runs it: started with its exit source forced or chosen, the
//! source it connected, and its log's allows read once every pod's proxy has one.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::{AGENT_POLL, LOG_LAG, PROXY};
use crate::agentlog::AllowLog;
use crate::binaries::Binaries;
use crate::node::{AgentOptions, AgentProcess, Node};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AgentSource {
    Events,
    Poll,
}

impl AgentSource {
    /// `EXITORDER_EXIT_SOURCE` takes clap's value names (`containerd-events`); the agent
    /// reports the source as `containerd_events`.
    pub(super) fn env_value(self) -> &'static str {
        match self {
            AgentSource::Events => "containerd-events",
            AgentSource::Poll => "poll",
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            AgentSource::Events => "containerd_events",
            AgentSource::Poll => "poll",
        }
    }
}

/// Starts the agent; `source` forces its exit source, `None` lets it choose.
pub(super) async fn start_agent(
    node: &Node,
    bin: &Binaries,
    source: Option<AgentSource>,
) -> anyhow::Result<AgentProcess> {
    match source {
        Some(s) => start_agent_with(node, bin, &[("EXITORDER_EXIT_SOURCE", s.env_value())]).await,
        None => start_agent_with(node, bin, &[]).await,
    }
}

/// Starts the agent with these environment variables besides its defaults.
pub(super) async fn start_agent_with(
    node: &Node,
    bin: &Binaries,
    env: &[(&str, &str)],
) -> anyhow::Result<AgentProcess> {
    let mut opts = AgentOptions::new(&bin.agent, node, &bin.entrypoint);
    opts.poll_interval = AGENT_POLL;
    opts.env
        .extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    AgentProcess::start(&opts)
        .await
        .context("starting the agent")
}

/// The event source the agent connected, if it did within a short wait.
pub(super) async fn connected_source(agent: &AgentProcess) -> Option<String> {
    agent
        .wait_for("\"exit source connected\"", Duration::from_secs(3), |l| {
            l.message() == Some("exit source connected")
        })
        .await
        .ok()
        .and_then(|l| l.field("source"))
}

/// Waits (up to [`LOG_LAG`]) until the agent has logged an allow for every pod's proxy, then
/// reads its log.
pub(super) async fn agent_allows(
    agent: &AgentProcess,
    uids: &[String],
) -> anyhow::Result<AllowLog> {
    let deadline = Instant::now() + LOG_LAG;
    loop {
        let lines = agent.lines();
        let log = AllowLog::from_lines(lines.iter().filter_map(|l| l.json.as_ref()))
            .context("reading the agent's log")?;
        let all = uids
            .iter()
            .all(|u| log.allows.contains_key(&(u.clone(), PROXY.to_owned())));
        if all || Instant::now() >= deadline {
            return Ok(log);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
