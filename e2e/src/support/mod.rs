//! Helpers for the end-to-end tests: a node with the real agent on it, the static entrypoint
//! built once per test process, and assertions on deletion timelines.
//!
//! Parts:
//! - `chart`: the in-tree chart rendered by a real helm, into documents;
//! - `compat`: the previous release's agent and entrypoint, built from its commit into a cache
//!   outside the clone;
//! - `killbed`: a node whose kubelet reports to a fake API server, the agent watching it;
//! - `lifecycle`: the kubelet's node-conformance lifecycle cases, ported;
//! - `flood`: idle and slow-loris connections from one peer, kept up;
//! - `pods`: the tests' pods: the examples as users start from them, edited, injected;
//! - `procfs`: what `/proc` says of a process: inotify watches, memory, descriptors.

pub mod chart;
pub mod compat;
pub mod flood;
pub mod killbed;
pub mod lifecycle;
pub mod pods;
pub mod procfs;

pub use pods::{
    api_pod_of, bare, container_mut, draining_two_level, edit_script, example, inject_with,
    injected, pod, pod_local, set_grace,
};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use exitorder::handshake::elf::check_static_executable;
use exitorder_testbed::kubelet::{RunOptions, RunningPod};
use exitorder_testbed::{AgentOptions, AgentProcess, Deletion, LogLine, Node};
use serde_json::Value;

/// The agent executable under test, built (or found up to date) once per test process.
/// `EXITORDER_AGENT_BIN` names one built elsewhere instead.
///
/// Cargo gives `CARGO_BIN_EXE_*` only to a package's own tests, and these tests live apart
/// from the agent's package (no package depends on itself); cargo is not locked while tests
/// run, so the build here waits on nothing.
pub fn agent_bin() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        if let Some(bin) = std::env::var_os("EXITORDER_AGENT_BIN") {
            return Ok(PathBuf::from(bin));
        }
        // The workspace's features, as `cargo test --workspace` (scripts/test) resolves them:
        // the binary is then linked from that build's artifacts, and neither build undoes the
        // other's. A run of some tests only (`--test NAME`) resolves a smaller set, so each
        // such run builds the agent's crate again (some 15 s here).
        let mut args: Vec<std::ffi::OsString> = [
            "build",
            "--workspace",
            "--bin",
            "exitorder",
            "--message-format=json-render-diagnostics",
        ]
        .map(Into::into)
        .into();
        // Into the target dir and profile this test was built with (`--release`, a
        // `--target-dir`); a cross build (`--target`) names its agent in EXITORDER_AGENT_BIN.
        if let Some((target_dir, profile)) = build_place() {
            args.extend(["--target-dir".into(), target_dir.into_os_string()]);
            args.extend(["--profile".into(), profile.into()]);
        }
        let stdout = cargo("the agent's build", &args)?;
        String::from_utf8_lossy(&stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            // The library is an artifact named `exitorder` too, with no executable.
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "exitorder")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .ok_or_else(|| "the agent's build named no executable".to_owned())
    });
    match built {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// Runs the cargo that runs these tests (`CARGO`) with `args` in the repository: its
/// standard output, or why `what` failed.
pub(crate) fn cargo(what: &str, args: &[impl AsRef<std::ffi::OsStr>]) -> Result<Vec<u8>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(crate::repo())
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "{what} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Where this test binary was built, `<target dir>/<profile's dir>/deps/<test>`: the target
/// dir and the profile (`debug` is the dev and test profiles' dir).
fn build_place() -> Option<(PathBuf, String)> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let target_dir = profile_dir.parent()?;
    let profile = match profile_dir.file_name()?.to_str()? {
        "debug" => "dev",
        other => other,
    };
    Some((target_dir.to_path_buf(), profile.to_owned()))
}

/// Builds `exitorder-entrypoint` statically, as the image ships it, from the workspace of
/// `manifest` (this one's when `None`), into `<target_dir>/release`.
pub(crate) fn build_static_entrypoint(
    what: &str,
    manifest: Option<&str>,
    target_dir: &str,
) -> Result<(), String> {
    let mut args = vec!["rustc"];
    if let Some(m) = manifest {
        args.extend(["--manifest-path", m]);
    }
    args.extend([
        "-p",
        "exitorder-entrypoint",
        "--release",
        "--bin",
        "exitorder-entrypoint",
        "--target-dir",
        target_dir,
        "--",
        "-C",
        "target-feature=+crt-static",
        "-C",
        "panic=abort",
    ]);
    cargo(what, &args).map(|_| ())
}

/// Builds `exitorder-entrypoint` statically (it runs inside busybox containers) into
/// target/static, once per test process. A target dir of its own: its flags (static,
/// `panic=abort`) would otherwise make the workspace's artifacts be built again.
/// `EXITORDER_ENTRYPOINT_BIN` names one built elsewhere instead (`scripts/test` builds it once
/// for every test process), checked as static all the same.
pub fn static_entrypoint() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let bin = match std::env::var_os("EXITORDER_ENTRYPOINT_BIN") {
            Some(bin) => PathBuf::from(bin),
            None => {
                build_static_entrypoint("the static entrypoint's build", None, "target/static")?;
                crate::repo().join("target/static/release/exitorder-entrypoint")
            }
        };
        match check_static_executable(&bin) {
            Ok(()) => Ok(bin),
            Err(e) => Err(format!("{}: {e}", bin.display())),
        }
    });
    match built {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

pub use exitorder_testbed::skip::{node_or_skip, node_with_or_skip, skip_or_fail};

/// A node with the agent running on it.
pub struct Bed {
    // Declared first so it is killed before the node goes away.
    pub agent: AgentProcess,
    pub agent_opts: AgentOptions,
    pub node: Node,
}

/// On containerd the agent must detect exits from containerd's own event service (on 1.x the
/// CRI stream has a single subscriber, the kubelet's; on 2.x it comes late): asserted from the
/// agent's report.
async fn expect_containerd_events(agent: &AgentProcess) {
    agent
        .wait_for(
            "\"exit source connected\" with containerd_events",
            Duration::from_secs(10),
            |l| l.says("exit source connected", &[("source", "containerd_events")]),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

impl Bed {
    /// Starts a node and the agent (reserve as given); `None` as for [`node_or_skip`].
    pub async fn start(grace_reserve: Duration) -> Option<Bed> {
        let node = node_or_skip().await?;
        let mut agent_opts = AgentOptions::new(agent_bin(), &node, static_entrypoint());
        agent_opts.grace_reserve = grace_reserve;
        let agent = match AgentProcess::start(&agent_opts).await {
            Ok(a) => a,
            Err(e) => panic!("agent did not start: {e}"),
        };
        expect_containerd_events(&agent).await;
        Some(Bed {
            agent,
            agent_opts,
            node,
        })
    }

    /// The agent on `node` with `agent_opts`, once it reports containerd's event stream.
    pub async fn with_agent(node: Node, agent_opts: AgentOptions) -> Bed {
        let agent = match AgentProcess::start(&agent_opts).await {
            Ok(a) => a,
            Err(e) => panic!("agent did not start: {e}"),
        };
        expect_containerd_events(&agent).await;
        Bed {
            agent,
            agent_opts,
            node,
        }
    }

    /// Kills the agent with SIGKILL and starts a fresh one with the same options.
    pub async fn restart_agent(&mut self) -> Result<(), String> {
        self.agent.kill();
        self.agent = AgentProcess::start(&self.agent_opts)
            .await
            .map_err(|e| e.to_string())?;
        expect_containerd_events(&self.agent).await;
        Ok(())
    }

    /// Stops the agent with SIGTERM and asserts it exits 0 within its bound.
    pub async fn terminate_agent(&mut self) {
        let status = self
            .agent
            .terminate(Duration::from_secs(15))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            status.is_some_and(|s| s.success()),
            "agent exit: {status:?}"
        );
    }

    /// Asserts `later` exited after `earlier` and was let go by the order (`ordered`).
    pub async fn assert_ordered(&self, d: &Deletion, uid: &str, later: &str, earlier: &str) {
        assert_exited_after(self, d, later, earlier);
        self.allowed_ordered(uid, later, &self.context(d)).await;
    }

    /// Waits until the agent holds `container` of pod `uid` (its preStop waits, in order).
    pub async fn held(&self, uid: &str, container: &str) {
        self.agent
            .wait_for(
                &format!("the agent holding {container}"),
                Duration::from_secs(15),
                |l| l.is("held", &[("pod", uid), ("container", container)]),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits for the agent's allow of `container` of pod `uid` and asserts the order let it
    /// go (`reason=ordered`); `context` ends the failure's message.
    pub async fn allowed_ordered(&self, uid: &str, container: &str, context: &str) -> LogLine {
        let allow = self.allowed(uid, container).await;
        assert_reason_ordered(&allow, &format!("{container}{context}"));
        allow
    }

    /// Waits for the agent's allow of `container` of pod `uid`.
    pub async fn allowed(&self, uid: &str, container: &str) -> LogLine {
        self.agent
            .wait_for(
                &format!("the allow of {container}"),
                Duration::from_secs(10),
                |l| l.is("allow", &[("pod", uid), ("container", container)]),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs `pod` (on the node's network whatever it asks: there is no CNI here) and waits
    /// until it is ready.
    pub async fn run_ready(&self, pod: &Value) -> RunningPod {
        run_ready(&self.node, pod).await
    }

    /// Stops the agent, then tears the node down; fails the test if anything is left.
    pub async fn finish(self) {
        let Bed {
            mut agent, node, ..
        } = self;
        agent.kill();
        if let Err(e) = node.shutdown().await {
            panic!("node teardown: {e}");
        }
    }

    /// Prints the deletion's timeline (shown with `--nocapture`, or when the test fails).
    pub fn show(&self, test: &str, d: &Deletion) {
        eprintln!("--- {test}: deletion timeline ---\n{}", d.describe());
    }

    /// Context for a failed assertion: the deletion's steps and the agent's last lines.
    pub fn context(&self, d: &Deletion) -> String {
        format!(
            "\n--- deletion ---\n{}\n--- agent log ---\n{}",
            d.describe(),
            self.agent.log_tail(25)
        )
    }
}

/// The agent `agent` on `node`, installing `entrypoint`, with a grace reserve of 1 s, told of
/// the fake API server `served` as node `node_name` and of its own DaemonSet
/// `exitorder/exitorder`, which the fake then holds: what tells an uninstall from a restart.
pub fn agent_with_daemonset(
    agent: &Path,
    node: &Node,
    entrypoint: &Path,
    served: &crate::fakeapi::ServedApi,
    node_name: &str,
    dir: &Path,
) -> AgentOptions {
    served.api.put_daemonset("exitorder", "exitorder", false);
    let mut opts = AgentOptions::new(agent, node, entrypoint);
    opts.grace_reserve = Duration::from_secs(1);
    opts.env = vec![
        (
            "KUBECONFIG".to_owned(),
            served.write_kubeconfig(dir).display().to_string(),
        ),
        ("NODE_NAME".to_owned(), node_name.to_owned()),
        (
            "EXITORDER_DAEMONSET".to_owned(),
            "exitorder/exitorder".to_owned(),
        ),
    ];
    opts
}

/// Runs `pod` on `node` (on the node's network) and waits until it is ready.
pub async fn run_ready(node: &Node, pod: &Value) -> RunningPod {
    let opts = RunOptions {
        force_host_network: true,
        ..RunOptions::default()
    };
    let running = node
        .run_pod(pod, &opts)
        .await
        .unwrap_or_else(|e| panic!("run pod: {e}"));
    running
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    running
}

/// Asserts the runtime saw `later` exit after `earlier`.
pub fn assert_exited_after(bed: &Bed, d: &Deletion, later: &str, earlier: &str) {
    let l = d.container(later).expect("container in deletion");
    let e = d.container(earlier).expect("container in deletion");
    assert!(
        l.finished_at_ns > e.finished_at_ns,
        "{later} finished at {:.0} ms, not after {earlier} at {:.0} ms{}",
        d.finished_ms(later).unwrap_or(f64::NAN),
        d.finished_ms(earlier).unwrap_or(f64::NAN),
        bed.context(d)
    );
}

/// The agent's metrics address, from its "metrics listening" line.
pub async fn metrics_addr(agent: &AgentProcess) -> String {
    agent
        .wait_for("\"metrics listening\"", Duration::from_secs(10), |l| {
            l.says("metrics listening", &[])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .field("addr")
        .expect("metrics address")
}

/// GET `path` on `addr` (HTTP/1.0, one connection): (status, body); (0, why) when it cannot
/// be asked within 5 s.
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    match http_answer(addr, path, "").await {
        Ok(text) => {
            let status = text
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = text
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_owned())
                .unwrap_or_default();
            (status, body)
        }
        Err(why) => (0, why),
    }
}

/// The whole answer (head and body) to a GET of `path` on `addr` (HTTP/1.0, one
/// connection), sent with `headers` (each line ending in CRLF); why not, when it cannot be
/// had within 5 s.
pub async fn http_answer(addr: &str, path: &str, headers: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: agent\r\n{headers}\r\n").as_bytes())
            .await?;
        let mut text = String::new();
        s.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    match tokio::time::timeout(Duration::from_secs(5), ask).await {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// Polls `check` until it holds, failing the test with `what` after `within`.
pub async fn until<F, Fut>(what: &str, within: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    if let Err(e) = exitorder_testbed::clock::until(what, within, check).await {
        panic!("{e}");
    }
}

/// A client for the fake API server `served`, configured as the agent configures its own.
pub fn api_client(served: &crate::fakeapi::ServedApi) -> kube::Client {
    let url = format!("http://{}", served.addr).parse().expect("url");
    exitorder::cluster::client_for(kube::Config::new(url)).expect("kube client")
}

/// Parses Prometheus text into (series with labels, value), checking every line's shape.
pub fn parse_metrics(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("series and value");
            (
                series.to_owned(),
                value.parse::<f64>().expect("numeric value"),
            )
        })
        .collect()
}

/// The project's image archive (`scripts/image` writes it). `None` when it was not built and
/// this is not CI (the test then returns, having said why); in CI a missing image fails.
///
/// While the image is being built beside the tests (`scripts/test` sets
/// `EXITORDER_IMAGE_PENDING` then, in CI's staged run), this waits for the archive, or for
/// the build's failure mark, within [`IMAGE_PENDING_DEADLINE`].
pub async fn project_image_archive() -> Option<PathBuf> {
    let archive = crate::repo().join(exitorder_testbed::install::IMAGE_IN_TREE);
    if std::env::var_os(IMAGE_PENDING).is_some() {
        let failed = archive.with_extension("failed");
        until(
            "the project's image, built beside the tests",
            IMAGE_PENDING_DEADLINE,
            || std::future::ready(archive.is_file() || failed.exists()),
        )
        .await;
        assert!(
            archive.is_file(),
            "the project's image could not be built beside the tests ({} is there; the part \
             image-amd64 of the run says why)",
            failed.display()
        );
    }
    if !archive.is_file() {
        skip_or_fail(&format!(
            "the project's image {} is not built (scripts/image)",
            archive.display()
        ));
        return None;
    }
    Some(archive)
}

/// Set by `scripts/test` while the image is built beside the first stage of tests.
const IMAGE_PENDING: &str = "EXITORDER_IMAGE_PENDING";

/// How long a test waits for the image built beside it: a cold release build of the agent at
/// the lowest priority on a two-core machine, with room; a run never hangs past it.
const IMAGE_PENDING_DEADLINE: Duration = Duration::from_secs(15 * 60);

/// Imports the project's image into `node` as the demo does; its reference, the one the chart
/// and the webhook name by default. `None` as for [`project_image_archive`].
pub async fn project_image(node: &Node) -> Option<String> {
    let archive = project_image_archive().await?;
    let image = exitorder_testbed::demo::import_project_image(node, &archive)
        .unwrap_or_else(|e| panic!("{e:#}"));
    Some(image.to_owned())
}

/// Asserts an allow was the order's (`reason=ordered`), not the deadline's or another.
pub fn assert_reason_ordered(allow: &LogLine, what: &str) {
    assert_eq!(allow.field("reason").as_deref(), Some("ordered"), "{what}");
}

/// An AdmissionReview of a pod creation, as the API server sends it.
pub fn review_body(pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7e0e7f3c-1d2b-4d7e-9a43-2f1c0f1e1a01",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"],
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    }))
    .expect("review JSON")
}
