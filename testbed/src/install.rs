//! The agent installed the way a cluster installs it: the chart rendered by a real helm, its
//! DaemonSet's pod run by the Pod runner from the project's own image. Only the chart's
//! documented values point it at the test bed (`shareDir`, `criSocket`, `metrics.port`); the
//! rendered output is run as it is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::kubelet::{RunOptions, RunningPod};
use crate::manifest;
use crate::node::{LogLine, Node, TestbedError};

/// Where `scripts/tools.sh` puts helm, under [`tools_dir`].
pub const HELM_IN_TOOLS: &str = "helm/helm";
/// The chart, relative to the repository.
pub const CHART_IN_TREE: &str = "deploy/helm/exitorder";
/// What `scripts/image` writes, relative to the repository.
pub const IMAGE_IN_TREE: &str = "target/image/exitorder.tar";
/// The namespace the manifests and the tests install into.
pub const NAMESPACE: &str = "exitorder";

/// A helm v3 binary.
#[derive(Debug, Clone)]
pub struct Helm {
    pub path: PathBuf,
}

/// What the tests and scripts keep across clones on a machine (fetched tools, the previous
/// release's binaries): `EXITORDER_CACHE`, else `$XDG_CACHE_HOME/exitorder`, else
/// `~/.cache/exitorder`, as `scripts/tools.sh` says.
pub fn cache_dir() -> PathBuf {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("EXITORDER_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("exitorder")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/exitorder")))
        .unwrap_or_else(|| std::env::temp_dir().join("exitorder-cache"))
}

/// Where `scripts/tools.sh` keeps the tools it fetches.
pub fn tools_dir() -> PathBuf {
    cache_dir().join("tools")
}

/// Where a tool the tests run may be, in order: the file `env` names, `name` on PATH, then
/// `in_tree` (where `scripts/tools.sh` unpacks it).
pub fn tool_candidates(env: &str, name: &str, in_tree: PathBuf) -> Vec<PathBuf> {
    std::env::var_os(env)
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .collect::<Vec<_>>()
        }))
        .chain(std::iter::once(in_tree))
        .collect()
}

impl Helm {
    /// `EXITORDER_HELM`, else `helm` on PATH, else the one `scripts/tools.sh` fetched.
    pub fn find() -> Result<Helm, TestbedError> {
        for path in tool_candidates("EXITORDER_HELM", "helm", tools_dir().join(HELM_IN_TOOLS)) {
            if path.is_file() {
                return Ok(Helm { path });
            }
        }
        Err(TestbedError::BinaryMissing {
            name: "helm",
            hint: "fetch it with `. scripts/tools.sh && ensure_helm` (or set EXITORDER_HELM)",
        })
    }

    fn run(&self, args: &[String]) -> Result<String, TestbedError> {
        let out = Command::new(&self.path)
            .args(args)
            .output()
            .map_err(|e| TestbedError::io("run", &self.path, e))?;
        if !out.status.success() {
            return Err(TestbedError::Command {
                command: format!("helm {}", args.join(" ")),
                status: out.status.to_string(),
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `helm template exitorder CHART --namespace NS --set K=V...`.
    pub fn template(
        &self,
        chart: &Path,
        namespace: &str,
        values: &[(String, String)],
    ) -> Result<String, TestbedError> {
        let mut args = vec![
            "template".to_owned(),
            "exitorder".to_owned(),
            chart.display().to_string(),
            "--namespace".to_owned(),
            namespace.to_owned(),
        ];
        for (k, v) in values {
            args.push("--set".to_owned());
            args.push(format!("{k}={v}"));
        }
        self.run(&args)
    }

    /// `helm lint --strict CHART --set K=V...`.
    pub fn lint(&self, chart: &Path, values: &[(String, String)]) -> Result<String, TestbedError> {
        let mut args = vec![
            "lint".to_owned(),
            "--strict".to_owned(),
            chart.display().to_string(),
        ];
        for (k, v) in values {
            args.push("--set".to_owned());
            args.push(format!("{k}={v}"));
        }
        self.run(&args)
    }
}

/// How to install the agent from the chart on a node.
#[derive(Debug, Clone)]
pub struct ChartOptions {
    pub helm: Helm,
    pub chart: PathBuf,
    /// The image archive (`scripts/image`), imported into the node first.
    pub image: PathBuf,
    /// A free port of the node for the agent's HTTP endpoint (it runs on the node's network).
    pub metrics_port: u16,
    /// More `--set` values.
    pub values: Vec<(String, String)>,
    pub ready_timeout: Duration,
}

/// The agent's pod, as the chart's DaemonSet runs it.
pub struct ChartAgent {
    pub pod: RunningPod,
}

/// The values that point the chart at `node`: its share and socket, a free metrics port, JSON
/// logs (read by the tests), and an image that is never pulled.
pub fn node_values(node: &Node, metrics_port: u16) -> Vec<(String, String)> {
    vec![
        ("shareDir".into(), node.share_dir().display().to_string()),
        ("criSocket".into(), node.socket().display().to_string()),
        ("metrics.port".into(), metrics_port.to_string()),
        ("agent.logFormat".into(), "json".into()),
        ("image.pullPolicy".into(), "Never".into()),
    ]
}

/// The agent's pod as a node would run it: the DaemonSet's pod template of the rendered chart.
pub fn agent_pod(rendered: &str) -> Result<Value, TestbedError> {
    let docs = manifest::documents(rendered)?;
    let ds = manifest::find(&docs, "DaemonSet", None)
        .ok_or_else(|| TestbedError::BadSpec("the rendered chart has no DaemonSet".into()))?;
    Ok(manifest::pod_of(ds)?)
}

impl ChartAgent {
    /// Imports the image, renders the chart for `node` and runs the DaemonSet's pod until its
    /// readiness probe passes.
    pub async fn install(node: &Node, opts: &ChartOptions) -> Result<ChartAgent, TestbedError> {
        node.import_image(&opts.image)?;
        let mut values = node_values(node, opts.metrics_port);
        values.extend(opts.values.iter().cloned());
        let rendered = opts.helm.template(&opts.chart, NAMESPACE, &values)?;
        let pod = agent_pod(&rendered)?;
        let running = node.run_pod(&pod, &RunOptions::default()).await?;
        running.wait_ready(opts.ready_timeout).await?;
        Ok(ChartAgent { pod: running })
    }

    /// The agent's log lines so far (its container's CRI log, JSON lines parsed).
    pub fn lines(&self) -> Vec<LogLine> {
        parse_cri_log(&self.pod.container_log("agent"))
    }

    /// Waits for a log line matching `pred`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&LogLine) -> bool,
    ) -> Result<LogLine, TestbedError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| pred(l)) {
                return Ok(l);
            }
            if tokio::time::Instant::now() >= deadline {
                let lines = self.lines();
                let tail: Vec<&str> = lines
                    .iter()
                    .rev()
                    .take(25)
                    .map(|l| l.text.as_str())
                    .collect();
                return Err(TestbedError::Timeout {
                    what: what.to_owned(),
                    waited: timeout,
                    context: format!(
                        "; the agent's log ends with:\n{}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The messages of a CRI log (`<time> <stream> <F|P> <message>` lines), partial lines joined.
pub fn parse_cri_log(log: &str) -> Vec<LogLine> {
    let mut out = Vec::new();
    let mut partial = String::new();
    for line in log.lines() {
        let mut parts = line.splitn(4, ' ');
        let (_, _, tag, msg) = (parts.next(), parts.next(), parts.next(), parts.next());
        let msg = msg.unwrap_or_default();
        partial.push_str(msg);
        if tag == Some("P") {
            continue;
        }
        let text = std::mem::take(&mut partial);
        out.push(LogLine {
            at: Instant::now(),
            json: serde_json::from_str(&text).ok(),
            text,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_log_lines_are_joined_and_parsed() {
        let log = "2026-11-23T09:00:00.1Z stderr F {\"fields\":{\"event\":\"allow\"}}\n\
                   2026-11-23T09:00:00.2Z stderr P {\"fields\":\n\
                   2026-11-23T09:00:00.2Z stderr F {\"message\":\"x\"}}\n\
                   2026-11-23T09:00:00.3Z stdout F plain text\n";
        let lines = parse_cri_log(log);
        assert_eq!(lines.len(), 3);
        assert!(lines[0].is("allow", &[]));
        assert_eq!(lines[1].text, "{\"fields\":{\"message\":\"x\"}}");
        assert_eq!(lines[1].message(), Some("x"));
        assert!(lines[2].json.is_none());
    }
}
