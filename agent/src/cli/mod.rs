//! Command line of the `exitorder` binary. Every agent flag has an env fallback, the way a
//! DaemonSet passes configuration.
//!
//! Parts:
//! - [`explain`]: `exitorder explain`: what will happen to a pod;
//! - [`manifest`]: YAML manifests: Pods and workload templates.

pub mod explain;
pub mod manifest;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::agent;
use crate::runtime::socket_path;
use crate::runtime::source::SourceChoice;

#[derive(Debug, Parser)]
#[command(
    name = "exitorder",
    version,
    about = "Sidecars leave a pod after the containers they serve"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent (one per node, as a DaemonSet).
    Agent(AgentArgs),
    /// Run the admission webhook (a Deployment): pods annotated `exitorder.io/inject: "true"`
    /// get the share, the mounts and the waiting preStop on every sidecar.
    Webhook(WebhookArgs),
    /// What exitorder will do with a pod, before it runs: what the webhook injects, who waits
    /// for whom on deletion, the grace budget, the Job shutdown, the Pod Security profile
    /// met, and warnings. Reads a Pod or a workload (Deployment, Job, CronJob, StatefulSet,
    /// DaemonSet, ReplicaSet), YAML or JSON, several documents allowed. Exit status 2 when
    /// the webhook would refuse a pod.
    Explain(ExplainArgs),
    /// The demo on a private containerd: runs `exitorder-testbed demo` (a separate binary,
    /// not in the node image).
    #[command(disable_help_flag = true)]
    Demo(TestbedArgs),
    /// The benchmark on a private containerd: runs `exitorder-testbed bench` (a separate
    /// binary, not in the node image).
    #[command(disable_help_flag = true)]
    Bench(TestbedArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The manifest: a file, or `-` for stdin.
    pub file: PathBuf,
    /// `text` for people, `json` (an array, one object per pod) for tools.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// The webhook's `--handshake-volume`, as the chart's `webhook.handshakeVolume`.
    #[arg(long, value_enum, default_value_t = crate::webhook::HandshakeVolume::EmptyDir)]
    pub handshake_volume: crate::webhook::HandshakeVolume,
    /// The agents' `--grace-reserve`, as the chart's `agent.graceReserve`.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace_reserve: Duration,
    /// What the agents are told of the kubelets' configuration, as the chart's
    /// `agent.kubelet` gives it.
    #[command(flatten)]
    pub kubelet: KubeletArgs,
    /// The kubelet's version (`1.33`), for the grace of its own kills; an agent reads it from
    /// its Node. Unset: the longest any version gives.
    #[arg(long, value_parser = parse_kubelet_version)]
    pub kubelet_version: Option<crate::kubelet::grace::Version>,
}

/// The kubelets' configuration, which no API shows, as the agents are told it (the chart's
/// `agent.kubelet` values): the grace the kubelet gives its own kills.
#[derive(Debug, Clone, Default, Args)]
pub struct KubeletArgs {
    /// The kubelet's `evictionMaxPodGracePeriod`: the grace of a soft node-pressure eviction,
    /// which the agent's deadline follows once it recognised an eviction, by the kubelet's
    /// version's rule (unset: the pod's own grace bounds it).
    #[arg(long, env = "EXITORDER_KUBELET_EVICTION_MAX_POD_GRACE", value_parser = parse_duration)]
    pub kubelet_eviction_max_pod_grace: Option<Duration>,
    /// The kubelet's feature gate `AllowOverwriteTerminationGracePeriodSeconds` is on (1.32 to
    /// 1.34): a soft eviction's grace is then `evictionMaxPodGracePeriod` even above the pod's.
    #[arg(long, env = "EXITORDER_KUBELET_EVICTION_OVERWRITES_POD_GRACE")]
    pub kubelet_eviction_overwrites_pod_grace: bool,
    /// The kubelet's `shutdownGracePeriod` less `shutdownGracePeriodCriticalPods`: what regular
    /// pods get in a graceful node shutdown (unset: the pod's own grace bounds it).
    #[arg(long, env = "EXITORDER_KUBELET_SHUTDOWN_GRACE_REGULAR", value_parser = parse_duration)]
    pub kubelet_shutdown_grace_regular: Option<Duration>,
    /// The kubelet's `shutdownGracePeriodCriticalPods`: what pods of priority 2000000000 and
    /// above get in a graceful node shutdown.
    #[arg(long, env = "EXITORDER_KUBELET_SHUTDOWN_GRACE_CRITICAL", value_parser = parse_duration)]
    pub kubelet_shutdown_grace_critical: Option<Duration>,
    /// The kubelet's `shutdownGracePeriodByPodPriority`, as `PRIORITY=DURATION` bands separated
    /// by commas (`0=10s,100000=30s`); replaces the two above when given.
    #[arg(long, env = "EXITORDER_KUBELET_SHUTDOWN_GRACE_BY_PRIORITY", value_parser = parse_bands)]
    pub kubelet_shutdown_grace_by_priority: Option<Bands>,
}

/// `shutdownGracePeriodByPodPriority` bands, (priority, grace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bands(pub Vec<(i32, Duration)>);

impl KubeletArgs {
    pub fn config(&self) -> crate::kubelet::grace::KubeletConfig {
        crate::kubelet::grace::KubeletConfig {
            eviction_max_pod_grace: self.kubelet_eviction_max_pod_grace,
            eviction_overwrites_pod_grace: self.kubelet_eviction_overwrites_pod_grace,
            shutdown_regular_pods: self.kubelet_shutdown_grace_regular,
            shutdown_critical_pods: self.kubelet_shutdown_grace_critical,
            shutdown_by_priority: self
                .kubelet_shutdown_grace_by_priority
                .clone()
                .unwrap_or_default()
                .0,
        }
    }
}

/// `0=10s,100000=30s`: at most 32 bands, each a priority (an int32) and a duration.
fn parse_bands(s: &str) -> Result<Bands, String> {
    let mut bands = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (p, d) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected PRIORITY=DURATION"))?;
        let priority: i32 = p
            .trim()
            .parse()
            .map_err(|_| format!("{p:?}: a priority is a 32-bit integer"))?;
        bands.push((priority, parse_duration(d.trim())?));
    }
    if bands.is_empty() || bands.len() > 32 {
        return Err(format!("{s:?}: between 1 and 32 PRIORITY=DURATION bands"));
    }
    Ok(Bands(bands))
}

/// `1.33` or `v1.33.2`: (major, minor).
fn parse_kubelet_version(s: &str) -> Result<crate::kubelet::grace::Version, String> {
    crate::cluster::nodewatch::kubelet_version(s)
        .ok_or_else(|| format!("{s:?}: expected a version such as 1.33 or v1.33.2"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

impl ExplainArgs {
    pub fn options(&self) -> crate::cli::explain::Options {
        crate::cli::explain::Options {
            settings: crate::webhook::Settings {
                grace_reserve: self.grace_reserve,
                handshake_volume: self.handshake_volume,
                ..crate::webhook::Settings::default()
            },
            kubelet: self.kubelet.config(),
            kubelet_version: self.kubelet_version,
        }
    }
}

/// Arguments handed on to `exitorder-testbed` as they are.
#[derive(Debug, Clone, Args)]
pub struct TestbedArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<std::ffi::OsString>,
}

/// The test bed's binary, which holds `demo` and `bench`: beside this executable (a build
/// tree's `target/<profile>/`), else on PATH.
pub fn testbed_binary() -> PathBuf {
    const NAME: &str = "exitorder-testbed";
    Some(beside_this_executable(NAME))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(NAME))
}

/// `name` in this executable's directory (the bare name when that cannot be known).
pub fn beside_this_executable(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A command line's duration (`500ms`, `5s`, `1m`), for every command's flags.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 5s, 1m)"))
}

#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// CRI socket of the node's runtime (`unix://` prefix accepted).
    #[arg(
        long,
        env = "EXITORDER_CRI_SOCKET",
        default_value = "/run/containerd/containerd.sock"
    )]
    pub cri_socket: String,
    /// Host directory shared with the pods (`pods/<uid>/<container>/`).
    #[arg(
        long,
        env = "EXITORDER_SHARE_DIR",
        default_value = exitorder_contract::share::DEFAULT_DIR
    )]
    pub share_dir: PathBuf,
    /// Host directory the entrypoint is installed in, for pods that take it from the node
    /// (mounted read-only): apart from the share, so that nothing a pod can write holds a
    /// binary other pods run.
    #[arg(
        long,
        env = "EXITORDER_BIN_DIR",
        default_value = exitorder_contract::bin::DEFAULT_DIR
    )]
    pub bin_dir: PathBuf,
    /// The kubelet's root directory (its `--root-dir`): pod-local exit directories are in
    /// the pods' `emptyDir` volumes under its `pods/` (`/var/snap/microk8s/common/var/lib/kubelet`
    /// on microk8s, `/var/lib/k0s/kubelet` on k0s).
    #[arg(
        long,
        env = "EXITORDER_KUBELET_ROOT_DIR",
        default_value = exitorder_contract::podlocal::DEFAULT_KUBELET_ROOT
    )]
    pub kubelet_root_dir: PathBuf,
    /// The agent's own pod (from the downward API): its own mounts of the share and of the
    /// kubelet's pods are what it works through, not a breach.
    #[arg(long, env = "EXITORDER_POD_UID", value_parser = crate::pod::PodUid::parse)]
    pub pod_uid: Option<crate::pod::PodUid>,
    /// This node's name (from the downward API): the pod watch's `spec.nodeName` and the
    /// Events' reporting instance. Without it there is no pod watch.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// The agent's own DaemonSet, `NAMESPACE/NAME`: read once at SIGTERM, to tell an
    /// uninstall (the DaemonSet gone or being deleted: every waiting sidecar on the node is
    /// let go, and the directories say no agent will answer) from a restart or a rolling
    /// update (waits stay for the next agent). Without it, or without the API server, every
    /// stop is taken for a restart.
    #[arg(long, env = "EXITORDER_DAEMONSET", value_parser = parse_daemonset)]
    pub daemonset: Option<(String, String)>,
    /// Time kept back from the grace deadline so a released sidecar can still drain before
    /// the kubelet's SIGKILL.
    #[arg(long, env = "EXITORDER_GRACE_RESERVE", default_value = "5s", value_parser = parse_duration)]
    pub grace_reserve: Duration,
    /// How often the runtime is read while an exit is pending (never while none is).
    #[arg(long, env = "EXITORDER_POLL_INTERVAL", default_value = "25ms", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// How container exits are detected: `auto` picks from the runtime's Version answer
    /// (containerd's own events on every containerd, 1.x and 2.x, falling back to CRI events
    /// on containerd >= 2.0 where the socket does not serve them; CRI events on CRI-O;
    /// polling otherwise).
    #[arg(long, env = "EXITORDER_EXIT_SOURCE", value_enum, default_value_t = SourceChoice::Auto)]
    pub exit_source: SourceChoice,
    /// See each container's exit from the kernel (a pidfd on its first process), ahead of
    /// the runtime's event. Needs the host's pid namespace (the chart's `hostPID`).
    #[arg(long, env = "EXITORDER_KERNEL_EXIT_SOURCE", default_value_t = true, action = clap::ArgAction::Set)]
    pub kernel_exit_source: bool,
    /// Address of the HTTP endpoint for /metrics, /healthz and /readyz.
    #[arg(long, env = "EXITORDER_METRICS_ADDR", default_value = "0.0.0.0:9484")]
    pub metrics_addr: SocketAddr,
    /// The static entrypoint to install in `--bin-dir`, as `exitorder-entrypoint` and
    /// `exitorder-entrypoint-v2` (default: `exitorder-entrypoint` beside this executable).
    #[arg(long, env = "EXITORDER_ENTRYPOINT_BINARY")]
    pub entrypoint_binary: Option<PathBuf>,
    /// How old a wait must be before the kubelet's word that it restarts that one container
    /// releases it (reason not_terminating): time for a deletion the kubelet already acts on
    /// to reach the agent's own watch, so a slow watch cannot release a sidecar out of order.
    #[arg(long, env = "EXITORDER_API_SETTLE", default_value = "250ms", value_parser = parse_duration)]
    pub api_settle: Duration,
    /// How long after a sidecar's wait began the silence of the containers it waits for
    /// shows that the kubelet stops it alone (a restart), when every one of them marks: longer
    /// than the kubelet's preStop execs of one pod kill ever start apart on this node.
    #[arg(long, env = "EXITORDER_KILL_EVIDENCE_WINDOW", default_value = "4s", value_parser = parse_duration)]
    pub kill_evidence_window: Duration,
    /// What the agent is told of the kubelet's configuration.
    #[command(flatten)]
    pub kubelet: KubeletArgs,
    /// How long a graceful shutdown may take after SIGTERM.
    #[arg(long, env = "EXITORDER_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// How often directories of pods the runtime no longer has are looked for (one is removed
    /// when two looks in a row find it), and the share rescanned for lost file events.
    #[arg(long, env = "EXITORDER_GC_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub gc_interval: Duration,
    /// A pod directory changed more recently than this is never removed: the kubelet may be
    /// creating it.
    #[arg(long, env = "EXITORDER_GC_MIN_AGE", default_value = "60s", value_parser = parse_duration)]
    pub gc_min_age: Duration,
}

/// `NAMESPACE/NAME`, both DNS labels or subdomains as the API server has them.
fn parse_daemonset(s: &str) -> Result<(String, String), String> {
    let (ns, name) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?}: expected NAMESPACE/NAME"))?;
    let valid = |part: &str| {
        !part.is_empty()
            && part.len() <= 253
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !valid(ns) || !valid(name) {
        return Err(format!(
            "{s:?}: NAMESPACE and NAME are lowercase letters, digits, '-' and '.'"
        ));
    }
    Ok((ns.to_owned(), name.to_owned()))
}

impl AgentArgs {
    /// The whole agent's configuration these flags describe.
    pub fn app_config(&self) -> crate::app::AppConfig {
        crate::app::AppConfig {
            agent: self.config(),
            metrics_addr: self.metrics_addr,
            node_name: self.node_name.clone(),
            daemonset: self.daemonset.clone(),
            shutdown_timeout: self.shutdown_timeout,
        }
    }

    /// The agent configuration these flags describe.
    pub fn config(&self) -> agent::Config {
        let mut cfg = agent::Config::new(self.share_dir.clone(), socket_path(&self.cri_socket));
        cfg.grace_reserve = self.grace_reserve;
        cfg.kubelet_root_dir = self.kubelet_root_dir.clone();
        cfg.bin_dir = self.bin_dir.clone();
        cfg.own_pod_uid = self.pod_uid.clone();
        cfg.kernel_exit_source = self.kernel_exit_source;
        cfg.exit_source = self.exit_source;
        cfg.poll_interval = self.poll_interval.max(Duration::from_millis(1));
        cfg.api_settle = self.api_settle;
        cfg.evidence = crate::kubelet::evidence::Rule {
            window: self.kill_evidence_window,
        };
        cfg.kubelet = self.kubelet.config();
        // A timer period of zero is refused by tokio.
        cfg.gc_interval = self.gc_interval.max(Duration::from_millis(10));
        cfg.gc_min_age = self.gc_min_age;
        cfg.entrypoint_binary = Some(
            self.entrypoint_binary
                .clone()
                .unwrap_or_else(default_entrypoint_binary),
        );
        cfg
    }
}

#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// PEM certificate chain to serve (a mounted Secret's `tls.crt`); reloaded when it changes.
    #[arg(long, env = "EXITORDER_WEBHOOK_CERT")]
    pub cert: PathBuf,
    /// PEM private key of the certificate (`tls.key`).
    #[arg(long, env = "EXITORDER_WEBHOOK_KEY")]
    pub key: PathBuf,
    /// Address of the HTTPS endpoint: /mutate, /healthz, /readyz, /metrics.
    #[arg(long, env = "EXITORDER_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    /// The share's host path, as the agents' `--share-dir`.
    #[arg(
        long,
        env = "EXITORDER_SHARE_DIR",
        default_value = exitorder_contract::share::DEFAULT_DIR
    )]
    pub share_dir: String,
    /// The host directory holding the entrypoint, as the agents' `--bin-dir`: what the
    /// hostPath mode mounts read-only, and what no pod may mount writable.
    #[arg(
        long,
        env = "EXITORDER_BIN_DIR",
        default_value = exitorder_contract::bin::DEFAULT_DIR
    )]
    pub bin_dir: String,
    /// Where injected sidecars' exit directories live: `emptyDir` (the pod's own volume, no
    /// hostPath: admissible under Pod Security baseline and restricted) or `hostPath` (the
    /// node's share).
    #[arg(long, env = "EXITORDER_HANDSHAKE_VOLUME", value_enum, default_value_t = crate::webhook::HandshakeVolume::EmptyDir)]
    pub handshake_volume: crate::webhook::HandshakeVolume,
    /// The image the injected init container `exitorder-install` copies the entrypoint from
    /// (the chart passes its own).
    #[arg(long, env = "EXITORDER_INSTALL_IMAGE", default_value = crate::webhook::DEFAULT_INSTALL_IMAGE)]
    pub install_image: String,
    /// The agents' `--grace-reserve`: injected entrypoints give up this long before the pod's
    /// grace period ends.
    #[arg(long, env = "EXITORDER_GRACE_RESERVE", default_value = "5s", value_parser = parse_duration)]
    pub grace_reserve: Duration,
    /// The injected sidecars' presence wait (`EXITORDER_PRESENCE` in their env): how long a
    /// sidecar waits for an agent to say it serves its directory before proceeding without
    /// one; `0s` waits for the agent's answer until the entrypoint's timeout. Unset: it follows
    /// the agents' rollout (`--agent-daemonset`), else the entrypoint's default (1s).
    #[arg(long, env = "EXITORDER_AGENT_PRESENCE", value_parser = parse_duration)]
    pub agent_presence: Option<Duration>,
    /// The agents' DaemonSet, `NAMESPACE/NAME` (the chart passes its own), watched: while its
    /// rollout is not complete, or its state not known, injected sidecars wait for an agent's
    /// answer (no presence wait), so none leaves early on a node whose agent is a release
    /// behind; once every node runs the current agent, the entrypoint's 1 s applies again.
    #[arg(long, env = "EXITORDER_AGENT_DAEMONSET", value_parser = parse_daemonset)]
    pub agent_daemonset: Option<(String, String)>,
    /// How often the certificate files are checked for a change.
    #[arg(long, env = "EXITORDER_WEBHOOK_RELOAD_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub reload_interval: Duration,
    /// After SIGTERM: how long it goes on answering while /readyz says "draining", so that
    /// requests sent before the Service drops this pod still find it.
    #[arg(long, env = "EXITORDER_WEBHOOK_DRAIN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub drain_delay: Duration,
    /// How long the requests in flight get after the drain.
    #[arg(long, env = "EXITORDER_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
}

impl WebhookArgs {
    pub fn config(&self) -> crate::webhook::WebhookConfig {
        crate::webhook::WebhookConfig {
            addr: self.addr,
            files: crate::webhook::CertFiles {
                cert: self.cert.clone(),
                key: self.key.clone(),
            },
            settings: crate::webhook::Settings {
                share_dir: self.share_dir.clone(),
                bin_dir: self.bin_dir.clone(),
                grace_reserve: self.grace_reserve,
                handshake_volume: self.handshake_volume,
                install_image: self.install_image.clone(),
                agent_presence: self.agent_presence,
                mark_containers: true,
                exits_in_memory: true,
            },
            reload_interval: self.reload_interval.max(Duration::from_millis(10)),
            shutdown_timeout: self.shutdown_timeout,
            drain_delay: self.drain_delay,
            agents: None,
        }
    }
}

/// `exitorder-entrypoint` beside the running executable: true both in a build tree
/// (`target/<profile>/`) and in the agent image.
pub fn default_entrypoint_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| {
            p.parent()
                .map(|d| d.join(crate::handshake::share::ENTRYPOINT_NAME))
        })
        .unwrap_or_else(|| PathBuf::from(crate::handshake::share::ENTRYPOINT_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_flags_and_defaults() {
        let cli = Cli::try_parse_from([
            "exitorder",
            "agent",
            "--cri-socket",
            "unix:///run/k3s/containerd/containerd.sock",
            "--grace-reserve",
            "2500ms",
        ])
        .unwrap();
        let Command::Agent(a) = cli.command else {
            panic!("parsed as another command");
        };
        let cfg = a.config();
        assert_eq!(
            cfg.cri_socket,
            PathBuf::from("/run/k3s/containerd/containerd.sock")
        );
        assert_eq!(cfg.grace_reserve, Duration::from_millis(2500));
        assert_eq!(cfg.share_dir, PathBuf::from("/var/lib/exitorder"));
        assert_eq!(cfg.gc_interval, Duration::from_secs(60));
        assert_eq!(cfg.gc_min_age, Duration::from_secs(60));
        assert!(cfg
            .entrypoint_binary
            .unwrap()
            .ends_with("exitorder-entrypoint"));
        let cli = Cli::try_parse_from([
            "exitorder",
            "agent",
            "--gc-interval",
            "0s",
            "--gc-min-age",
            "2s",
        ])
        .unwrap();
        let Command::Agent(a) = cli.command else {
            panic!("parsed as another command");
        };
        let cfg = a.config();
        assert_eq!(cfg.gc_interval, Duration::from_millis(10));
        assert_eq!(cfg.gc_min_age, Duration::from_secs(2));
    }

    #[test]
    fn the_own_pod_uid_must_be_a_pod_uid() {
        const UID: &str = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";
        let cli = Cli::try_parse_from(["exitorder", "agent", "--pod-uid", UID]).unwrap();
        let Command::Agent(a) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(
            a.config().own_pod_uid.map(|u| u.to_string()),
            Some(UID.to_owned())
        );
        let err = Cli::try_parse_from(["exitorder", "agent", "--pod-uid", "../web-0"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--pod-uid") && err.contains("is not valid"),
            "{err}"
        );
    }

    #[test]
    fn webhook_flags_and_defaults() {
        let cli = Cli::try_parse_from([
            "exitorder",
            "webhook",
            "--cert",
            "/tls/tls.crt",
            "--key",
            "/tls/tls.key",
        ])
        .unwrap();
        let Command::Webhook(w) = cli.command else {
            panic!("parsed as another command");
        };
        let cfg = w.config();
        assert_eq!(cfg.addr.port(), 8443);
        assert_eq!(cfg.files.cert, PathBuf::from("/tls/tls.crt"));
        assert_eq!(cfg.settings.share_dir, "/var/lib/exitorder");
        assert_eq!(cfg.settings.grace_reserve, Duration::from_secs(5));
        let err = Cli::try_parse_from(["exitorder", "webhook", "--cert", "c"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--key"), "{err}");
    }

    #[test]
    fn demo_and_bench_hand_every_argument_on() {
        let cli = Cli::try_parse_from(["exitorder", "demo", "--pod", "x.yaml", "--help"]).unwrap();
        let Command::Demo(d) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(d.args, ["--pod", "x.yaml", "--help"]);
        let cli = Cli::try_parse_from(["exitorder", "bench"]).unwrap();
        assert!(matches!(cli.command, Command::Bench(b) if b.args.is_empty()));
    }

    #[test]
    fn exit_source_accepts_the_names_logs_and_metrics_use() {
        for (arg, want) in [
            ("containerd_events", SourceChoice::ContainerdEvents),
            ("containerd-events", SourceChoice::ContainerdEvents),
            ("cri_events", SourceChoice::CriEvents),
            ("poll", SourceChoice::Poll),
        ] {
            let cli = Cli::try_parse_from(["exitorder", "agent", "--exit-source", arg]).unwrap();
            let Command::Agent(a) = cli.command else {
                panic!("parsed as another command");
            };
            assert_eq!(a.exit_source, want, "{arg}");
        }
    }

    #[test]
    fn one_default_poll_interval() {
        let cli = Cli::try_parse_from(["exitorder", "agent"]).unwrap();
        let Command::Agent(a) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(a.poll_interval, agent::DEFAULT_POLL_INTERVAL);
        assert_eq!(a.config().poll_interval, agent::DEFAULT_POLL_INTERVAL);
    }

    #[test]
    fn bad_duration_is_a_clear_error() {
        let err = Cli::try_parse_from(["exitorder", "agent", "--grace-reserve", "soon"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--grace-reserve"), "{err}");
        assert!(err.contains("examples"), "{err}");
    }
}
