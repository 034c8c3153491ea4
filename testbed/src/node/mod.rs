//! A real node to test exitorder on: a private containerd, images built without a registry,
//! and the kubelet's part played through the CRI (pods run, hooks executed, containers stopped
//! the way the kubelet does it).
//!
//! Used by the end-to-end tests, `exitorder demo` and the benchmarks. Everything a [`Node`]
//! creates lives under one temporary directory and one cgroup subtree, so several nodes can
//! run side by side, and all of it goes away on [`Node::shutdown`] or on drop (also when a
//! test panics).
//!
//! Parts:
//! - `containerd`: the node's private containerd: its configuration, process, readiness;
//! - `image`: images without a registry: busybox, a shell and a pause image, imported;
//! - `traffic_image`: the traffic benchmark's image, with a real haproxy and rsyslog;
//! - `cpu`: the node's CPU weights, laid out as the kubelet lays them out;
//! - `agent`: the agent as a child process, its JSON log lines captured;
//! - `exits`: the relist that tells the runner of exits, as the kubelet's PLEG does;
//! - `exitfiles`: a pod's exit files watched while it is deleted, for its timeline;
//! - `dirs`: the node's directories: made private, the kubelet's root mounted shared, removed
//!   without passing through a mount;
//! - `cleanup`: nothing left behind: sandboxes, shims, cgroups.

mod agent;
pub(crate) mod cleanup;
mod containerd;
mod cpu;
pub(crate) mod dirs;
pub mod exitfiles;
pub mod exits;
mod image;
mod traffic_image;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::Channel;

use exitorder::cri::runtime_service_client::RuntimeServiceClient;
use exitorder::cri::VersionResponse;

pub use agent::{AgentCpu, AgentOptions, AgentProcess, LogLine};
pub(crate) use containerd::has_pod_network;
pub use containerd::PAUSE_IMAGE;
pub use containerd::{runc_from_env, runtime_env_var, runtime_from_env, RUNC_IDMAP_ENV, RUNTIMES};
pub(crate) use cpu::CpuLayout;
pub use cpu::{Tier, AGENT_CPU_REQUEST_MILLI};
pub use exitfiles::{ExitFileEvents, ExitFileProbe};
pub use image::{find_busybox, BUSYBOX_IMAGE, PRESET_STAND_IN_IMAGE};
pub(crate) use traffic_image::HAPROXY;
pub use traffic_image::{available as traffic_image_available, TRAFFIC_IMAGE};

/// Where the chart and the webhook put the share on a node; a pod's hostPath there is the
/// test bed's share.
pub const SHARE_PATH: &str = exitorder_contract::share::DEFAULT_DIR;
/// The host's bin directory as pods (and the chart) name it: this node's own is mapped there.
pub const BIN_PATH: &str = exitorder_contract::bin::DEFAULT_DIR;
/// The test bed's node name (`spec.nodeName`, the agent's `NODE_NAME`).
pub const NODE_NAME: &str = "testbed";

/// Why the test bed could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error(
        "a test node needs root (containerd and runc create namespaces, mounts and cgroups); \
         this process runs as uid {uid}"
    )]
    NotRoot { uid: u32 },
    #[error(
        "{name} is not installed (looked on PATH and in /usr/sbin, /usr/bin, /sbin, /bin); {hint}"
    )]
    BinaryMissing {
        name: &'static str,
        hint: &'static str,
    },
    #[error("{path}: {problem}")]
    BadBinary { path: PathBuf, problem: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("containerd rejected its configuration {config}; its log ends with:\n{log_tail}")]
    ConfigRejected { config: PathBuf, log_tail: String },
    #[error("containerd exited during start-up ({status}); its log ends with:\n{log_tail}")]
    ContainerdExited { status: String, log_tail: String },
    #[error(
        "containerd's CRI did not answer within {waited:?} (last error: {last}); \
         its log ends with:\n{log_tail}"
    )]
    NotReady {
        waited: Duration,
        last: String,
        log_tail: String,
    },
    #[error("`{command}` failed ({status}): {output}")]
    Command {
        command: String,
        status: String,
        output: String,
    },
    #[error("CRI {call}: {status}")]
    Cri {
        call: &'static str,
        #[source]
        status: Box<tonic::Status>,
    },
    #[error("pod spec: {0}")]
    BadSpec(String),
    #[error(
        "pod {pod}: container {container}: image {image:?} is not in the node's store (nothing \
         is pulled here: import it first, e.g. `--image FILE.tar`)"
    )]
    ImageMissing {
        pod: String,
        container: String,
        image: String,
    },
    #[error(
        "containerd-shim (pid {pid}) of pod {pod} still ran {waited:?} after the pod was removed"
    )]
    ShimLeft {
        pod: String,
        pid: u32,
        waited: Duration,
    },
    #[error("{what} did not happen within {waited:?}{context}")]
    Timeout {
        what: String,
        waited: Duration,
        context: String,
    },
    #[error("the agent exited ({status}); its log ends with:\n{log_tail}")]
    AgentExited { status: String, log_tail: String },
    #[error("pod {pod} was not started: an earlier pod of the same batch failed to start")]
    NotStarted { pod: String },
    #[error("a test bed task failed: {0}")]
    Task(String),
    #[error("teardown left things behind: {}", .0.join("; "))]
    Teardown(Vec<String>),
    #[error(transparent)]
    Runtime(#[from] exitorder::runtime::RuntimeError),
}

impl TestbedError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        TestbedError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn cri(call: &'static str) -> impl FnOnce(tonic::Status) -> TestbedError {
        move |status| TestbedError::Cri {
            call,
            status: Box::new(status),
        }
    }
}

/// The kubelet's root directory, below the node's.
pub(crate) const KUBELET_ROOT: &str = "kubelet";

/// How to start a [`Node`].
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// How long containerd may take to answer on its CRI socket.
    pub start_timeout: Duration,
    /// containerd snapshotter; `None` picks `overlayfs` where the node's directory can hold
    /// overlay upper layers, `native` otherwise.
    pub snapshotter: Option<String>,
    /// The exitorder share; default `<node dir>/share`.
    pub share_dir: Option<PathBuf>,
    /// How often the runner lists the node's containers to see exits (the kubelet's PLEG
    /// relists every second).
    pub relist_period: Duration,
    /// The directory holding the `containerd`, `containerd-shim-runc-v2` and `ctr` to run
    /// (another containerd version than the machine's, see [`runtime_from_env`]); it goes
    /// first in containerd's PATH, and runc still comes from the machine. `None`: PATH.
    pub containerd_bin: Option<PathBuf>,
    /// The runc the shim runs (containerd's `BinaryName`), such as one with idmapped mounts
    /// for `hostUsers: false` pods (see [`runc_from_env`]); `None`: the machine's, from PATH.
    pub runc: Option<PathBuf>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            start_timeout: Duration::from_secs(20),
            snapshotter: None,
            share_dir: None,
            relist_period: Duration::from_secs(1),
            containerd_bin: None,
            runc: None,
        }
    }
}

/// What pods and the node's teardown share.
/// The node's bin directory, in its own directory.
const BIN_DIR_NAME: &str = "entrypoint-bin";

impl NodeShared {
    pub(crate) fn bin_dir(&self) -> PathBuf {
        self.dir.join(BIN_DIR_NAME)
    }
}

pub(crate) struct NodeShared {
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    pub(crate) socket: PathBuf,
    pub(crate) state_dir: PathBuf,
    pub(crate) share_dir: PathBuf,
    pub(crate) log_dir: PathBuf,
    pub(crate) client: RuntimeServiceClient<Channel>,
    pub(crate) channel: Channel,
    /// The cgroup every pod of this node is created under (relative to each hierarchy).
    pub(crate) cgroup_root: String,
    /// The CPU weights of the runtime, the pods and the agent; `None` without a cpu controller.
    pub(crate) cpu: Option<Arc<CpuLayout>>,
    pub(crate) node_name: String,
    /// The node's address: `status.hostIP`, and the address of host-network pods.
    pub(crate) host_ip: String,
    pub(crate) exits: exits::ExitWatch,
}

impl NodeShared {
    pub(crate) fn client(&self) -> RuntimeServiceClient<Channel> {
        self.client.clone()
    }
}

/// A running private containerd with the test images imported, playing one Kubernetes node.
pub struct Node {
    shared: Arc<NodeShared>,
    containerd: Mutex<Option<containerd::Containerd>>,
    snapshotter: String,
    containerd_bin: Option<PathBuf>,
    runc: Option<PathBuf>,
    version: VersionResponse,
    /// Removes the node's directory when dropped, after everything else is torn down.
    _dir_guard: dirs::DirGuard,
}

impl Node {
    /// How the node weighs its processes for CPU (see `cpu`), `None` when all weigh the same.
    pub fn cpu_weights(&self) -> Option<String> {
        self.shared.cpu.as_ref().map(|c| c.describe())
    }

    /// Starts containerd in a fresh directory under /tmp, waits for its CRI and imports the
    /// busybox and pause images.
    pub async fn start(opts: NodeOptions) -> Result<Node, TestbedError> {
        let uid = rustix::process::geteuid().as_raw();
        if uid != 0 {
            return Err(TestbedError::NotRoot { uid });
        }
        let bins =
            containerd::Binaries::find(opts.containerd_bin.as_deref(), opts.runc.as_deref())?;
        let archive = image::archive()?;
        let (dir, id) = dirs::make_node_dir()?;
        let dir_guard = dirs::DirGuard::new(dir.clone());
        let share_dir = opts.share_dir.clone().unwrap_or_else(|| dir.join("share"));
        let log_dir = dir.join("pod-logs");
        // The kubelet makes its directory of pods when it starts, before any pod.
        let kubelet_pods = dir.join(KUBELET_ROOT).join("pods");
        // The host's bin directory is there as on a node the chart installed once (empty
        // until an agent installs the entrypoint): a pod that names it starts without an
        // agent, as the demo's --without-agent shows.
        let bin_dir = dir.join(BIN_DIR_NAME);
        for d in [&share_dir, &log_dir, &kubelet_pods, &bin_dir] {
            std::fs::create_dir_all(d).map_err(|e| TestbedError::io("create", d, e))?;
        }
        dirs::shared_mount(&dir.join(KUBELET_ROOT))?;
        let snapshotter = opts
            .snapshotter
            .clone()
            .unwrap_or_else(|| containerd::default_snapshotter(&dir).to_owned());
        let cgroup_root = format!("exitorder-testbed-{id}");
        let mut cd = containerd::Containerd::spawn(&bins, &dir, &snapshotter)?;
        let version = match cd.wait_ready(opts.start_timeout).await {
            Ok(v) => v,
            Err(e) => {
                cd.stop();
                return Err(e);
            }
        };
        let archive_path = dir.join("images.tar");
        let imported = std::fs::write(&archive_path, archive.as_slice())
            .map_err(|e| TestbedError::io("write", &archive_path, e))
            .and_then(|()| cd.import(&bins, &archive_path, &snapshotter));
        if let Err(e) = imported {
            cd.stop();
            return Err(e);
        }
        // containerd moves with all its threads; no shim runs yet, and every shim and runc it
        // starts from now on inherits its cgroup.
        let cpu = match CpuLayout::create(&cgroup_root, cd.pid()) {
            Ok(Some(layout)) => Some(Arc::new(layout)),
            Ok(None) => {
                tracing::warn!(
                    "no cpu cgroup controller here: the test node's processes all weigh the same"
                );
                None
            }
            Err(e) => {
                cd.stop();
                let _ = cleanup::remove_cgroup(&cgroup_root).await;
                return Err(TestbedError::io(
                    "lay out the CPU weights in",
                    Path::new(&cgroup_root),
                    e,
                ));
            }
        };
        let channel = exitorder::runtime::unix_channel(&cd.socket)?;
        let client =
            RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(16 * 1024 * 1024);
        let exits = exits::ExitWatch::start(client.clone(), opts.relist_period);
        let shared = Arc::new(NodeShared {
            id,
            socket: cd.socket.clone(),
            state_dir: cd.state_dir.clone(),
            dir,
            share_dir,
            log_dir,
            client,
            channel,
            cgroup_root,
            cpu,
            node_name: NODE_NAME.to_owned(),
            host_ip: host_ip(),
            exits,
        });
        Ok(Node {
            shared,
            containerd: Mutex::new(Some(cd)),
            snapshotter,
            containerd_bin: opts.containerd_bin,
            runc: opts.runc,
            version,
            _dir_guard: dir_guard,
        })
    }

    /// The CRI (and containerd) socket.
    pub fn socket(&self) -> &Path {
        &self.shared.socket
    }

    /// The exitorder share the pods' mounts come from (give it to the agent as `--share-dir`).
    pub fn share_dir(&self) -> &Path {
        &self.shared.share_dir
    }

    /// The host directory the agent installs the entrypoint in (give it to the agent as
    /// `--bin-dir`); pods naming `/var/lib/exitorder-bin` get this one.
    pub fn bin_dir(&self) -> PathBuf {
        self.shared.bin_dir()
    }

    /// The kubelet's root directory, laid out as the kubelet lays it out: each pod's
    /// `emptyDir` volumes are under its `pods/<uid>/volumes/kubernetes.io~empty-dir/` (give
    /// it to the agent as `--kubelet-root-dir`).
    pub fn kubelet_root(&self) -> PathBuf {
        self.shared.dir.join(KUBELET_ROOT)
    }

    /// Where the kubelet keeps pod `uid`'s `emptyDir` volume `volume` on this node.
    pub fn empty_dir(&self, uid: &str, volume: &str) -> PathBuf {
        self.kubelet_root()
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~empty-dir")
            .join(volume)
    }

    /// The node's private directory (containerd's root, state, config and log).
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// What the runtime answered to `Version`.
    pub fn version(&self) -> &VersionResponse {
        &self.version
    }

    /// What the pods run on this node share with it (the kubelet's handle).
    pub(crate) fn shared(&self) -> Arc<NodeShared> {
        Arc::clone(&self.shared)
    }

    /// A CRI client on the node's socket.
    pub fn client(&self) -> RuntimeServiceClient<Channel> {
        self.shared.client()
    }

    /// Imports the traffic benchmark's image ([`TRAFFIC_IMAGE`]: haproxy and rsyslog from
    /// the host's Debian packages), built on first use.
    pub fn import_traffic_image(&self) -> Result<(), TestbedError> {
        let archive = traffic_image::archive()?;
        let path = self.shared.dir.join("traffic-image.tar");
        std::fs::write(&path, archive.as_slice())
            .map_err(|e| TestbedError::io("write", &path, e))?;
        let res = self.import_image(&path);
        let _ = std::fs::remove_file(&path);
        res
    }

    /// Imports an image archive (docker-archive or OCI) into the node's store.
    pub fn import_image(&self, archive: &Path) -> Result<(), TestbedError> {
        let cd = match self.containerd.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Some(cd) = cd.as_ref() else {
            return Err(TestbedError::Task("the node is shut down".into()));
        };
        let bins =
            containerd::Binaries::find(self.containerd_bin.as_deref(), self.runc.as_deref())?;
        cd.import(&bins, archive, &self.snapshotter)
    }

    /// Kills containerd with SIGKILL, as a crashing runtime: the shims and the containers
    /// they hold go on running, and every CRI call fails until
    /// [`restart_containerd`](Self::restart_containerd).
    pub fn kill_containerd(&self) {
        let mut guard = match self.containerd.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(cd) = guard.as_mut() {
            cd.kill();
        }
    }

    /// Starts containerd again on the same root and state, as systemd restarts it: it finds
    /// its shims and the containers' exits that happened while it was gone.
    pub async fn restart_containerd(&self, timeout: Duration) -> Result<(), TestbedError> {
        let bins =
            containerd::Binaries::find(self.containerd_bin.as_deref(), self.runc.as_deref())?;
        let mut cd = containerd::Containerd::spawn(&bins, &self.shared.dir, &self.snapshotter)?;
        let ready = cd.wait_ready(timeout).await;
        let mut guard = match self.containerd.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        // The killed one, if any, is reaped; the new one is stopped by teardown as before.
        *guard = Some(cd);
        ready.map(|_| ())
    }

    /// Tears the node down: every pod sandbox stopped and removed, their shims gone,
    /// containerd stopped, cgroups and the directory removed. Reports what could not be
    /// cleaned up.
    pub async fn shutdown(self) -> Result<(), TestbedError> {
        let mut problems = self.teardown_with_runtime().await;
        if let Err(e) = dirs::remove_tree(&self.shared.dir) {
            problems.push(e);
        }
        // Drop finds containerd stopped and the directory gone.
        drop(self);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(TestbedError::Teardown(problems))
        }
    }

    async fn teardown_with_runtime(&self) -> Vec<String> {
        let cd = match self.containerd.lock() {
            Ok(mut g) => g.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some(cd) = cd else {
            return Vec::new();
        };
        cleanup::teardown(&self.shared, cd).await
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let cd = match self.containerd.lock() {
            Ok(mut g) => g.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some(cd) = cd else {
            return;
        };
        // Drop may run inside an async runtime (a test's, while it unwinds) that cannot be
        // blocked on; the CRI calls of the teardown get a thread and a runtime of their own.
        let shared = Arc::clone(&self.shared);
        let worker = std::thread::Builder::new()
            .name("exitorder-testbed-teardown".to_owned())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt.block_on(cleanup::teardown(&shared, cd)),
                    Err(e) => {
                        let mut cd = cd;
                        cd.stop();
                        vec![format!("no runtime for the teardown: {e}")]
                    }
                }
            });
        let problems = match worker.map(|h| h.join()) {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => vec!["teardown thread panicked".to_owned()],
            Err(e) => vec![format!("cannot start the teardown thread: {e}")],
        };
        if !problems.is_empty() {
            eprintln!(
                "exitorder testbed: teardown of node {} left things behind: {}",
                self.shared.id,
                problems.join("; ")
            );
        }
    }
}

/// The node's address: the one its default route leaves from, else loopback. Connecting a
/// UDP socket sends nothing; it only picks the route.
fn host_ip() -> String {
    let routed = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|()| s))
        .and_then(|s| s.local_addr());
    match routed {
        Ok(a) if !a.ip().is_unspecified() => a.ip().to_string(),
        _ => "127.0.0.1".to_owned(),
    }
}

/// Five lowercase letters and digits, as the API server appends to `generateName`.
pub fn random_suffix() -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    random_bytes::<5>()
        .iter()
        .map(|b| char::from(CHARS[usize::from(*b) % CHARS.len()]))
        .collect()
}

/// A random version 4 UUID, as the API server gives pods.
pub fn random_uuid() -> String {
    let mut b = random_bytes::<16>();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// `N` random bytes from the kernel; if /dev/urandom cannot be read, from std's randomly keyed
/// hasher (good enough for names, which is all they are used for).
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    use std::hash::{BuildHasher, Hasher};
    use std::io::Read;
    let mut out = [0u8; N];
    let from_kernel = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut out));
    if from_kernel.is_err() {
        for (i, chunk) in out.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            let v = h.finish().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    out
}

/// A port nothing listens on, as the kernel hands one out (the pods and the agent run on the
/// host's network, so each listener needs a port of its own). Taken on every address, so it is
/// free on the loopback too.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("0.0.0.0:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_version_4_and_parse_as_pod_uids() {
        let a = random_uuid();
        let b = random_uuid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'), "{a}");
        assert!(matches!(&parts[3][..1], "8" | "9" | "a" | "b"), "{a}");
        assert!(exitorder::pod::PodUid::parse(&a).is_ok());
    }
}
