//! The node's private containerd: its configuration, its process, its readiness.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use exitorder::cri::runtime_service_client::RuntimeServiceClient;
use exitorder::cri::{VersionRequest, VersionResponse};

use super::TestbedError;

pub(crate) const LOG_FILE: &str = "containerd.log";
const CONFIG_FILE: &str = "containerd.toml";
const SOCKET: &str = "c.sock";
/// The sandbox ("pause") image containerd's CRI starts pods with; the test bed imports it
/// (the busybox layer, running `sleep infinity`, see `image`).
pub const PAUSE_IMAGE: &str = "exitorder.local/pause:1";

/// What containerd logs when a plugin does not load: `failed to load plugin
/// io.containerd.grpc.v1.cri` on 1.x; `failed to load plugin` with `id=...` on 2.x.
const PLUGIN_LOAD_FAILED: &str = "failed to load plugin";
/// The CRI's plugins: 1.x has one; 2.x (its config version 3) splits it into the runtime and
/// images plugins, with `io.containerd.grpc.v1.cri` left as the gRPC service over them.
const CRI_PLUGINS: &[&str] = &[
    "io.containerd.cri.v1.runtime",
    "io.containerd.cri.v1.images",
    "io.containerd.grpc.v1.cri",
];
/// The containerd versions the test bed runs on: `1.6` is the machine's (Debian bookworm's,
/// on PATH), the others are unpacked by `scripts/tools.sh`'s `ensure_containerd`.
pub const RUNTIMES: &[&str] = &["1.6", "1.7", "2.1"];
/// The CRI keeps kubelet-managed containers in this containerd namespace.
pub(crate) const NAMESPACE: &str = "k8s.io";

/// Where the tools live; root's PATH usually has the sbin directories, other users' may not.
const FALLBACK_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// The variable naming the directory of containerd `version`'s binaries, as `scripts/test`
/// exports it: `EXITORDER_CONTAINERD_1_7` for `1.7`.
pub fn runtime_env_var(version: &str) -> String {
    format!("EXITORDER_CONTAINERD_{}", version.replace(['.', '-'], "_"))
}

/// The directory holding containerd `version`'s `containerd`, `containerd-shim-runc-v2` and
/// `ctr`, from [`runtime_env_var`] (set by `scripts/test`, or from `ensure_containerd VERSION`
/// of `scripts/tools.sh`); `None` when it is unset or empty. Give it to
/// [`NodeOptions::containerd_bin`](super::NodeOptions::containerd_bin).
pub fn runtime_from_env(version: &str) -> Option<PathBuf> {
    std::env::var_os(runtime_env_var(version))
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The variable naming a runc with idmapped mounts, as `scripts/test` exports it.
pub const RUNC_IDMAP_ENV: &str = "EXITORDER_RUNC_IDMAP";

/// A runc with idmapped mounts (`ensure_runc_idmap` of `scripts/tools.sh`), from
/// [`RUNC_IDMAP_ENV`]; `None` when it is unset or empty. Give it to
/// [`NodeOptions::runc`](super::NodeOptions::runc).
pub fn runc_from_env() -> Option<PathBuf> {
    std::env::var_os(RUNC_IDMAP_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    pub containerd: PathBuf,
    pub ctr: PathBuf,
    /// PATH for containerd: it finds the shim, and the shim finds runc, through it.
    pub path_env: String,
    /// The runc the shim runs instead of PATH's.
    pub runc: Option<PathBuf>,
}

fn find(name: &'static str, hint: &'static str) -> Result<PathBuf, TestbedError> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .filter(|d| !d.is_empty())
        .chain(FALLBACK_DIRS.iter().copied())
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or(TestbedError::BinaryMissing { name, hint })
}

impl Binaries {
    /// containerd, its runc shim and ctr from `bin_dir` (`None`: from PATH, the machine's);
    /// runc from PATH either way.
    pub(crate) fn find(bin_dir: Option<&Path>, runc: Option<&Path>) -> Result<Self, TestbedError> {
        const APT: &str = "install it with `apt-get install -y containerd runc busybox-static`";
        let runc = match runc {
            None => {
                find("runc", APT)?;
                None
            }
            Some(r) => Some(
                std::fs::canonicalize(r).map_err(|e| TestbedError::BadBinary {
                    path: r.to_owned(),
                    problem: format!("the runc given: {e}"),
                })?,
            ),
        };
        let mut path_env = std::env::var("PATH").unwrap_or_default();
        for d in FALLBACK_DIRS {
            if !path_env.split(':').any(|p| p == *d) {
                if !path_env.is_empty() {
                    path_env.push(':');
                }
                path_env.push_str(d);
            }
        }
        let Some(dir) = bin_dir else {
            let containerd = find("containerd", APT)?;
            let ctr = find("ctr", APT)?;
            find("containerd-shim-runc-v2", APT)?;
            return Ok(Binaries {
                containerd,
                ctr,
                path_env,
                runc,
            });
        };
        let bad = |problem: String| TestbedError::BadBinary {
            path: dir.to_owned(),
            problem,
        };
        let dir = std::fs::canonicalize(dir)
            .map_err(|e| bad(format!("the containerd binaries' directory: {e}")))?;
        for name in ["containerd", "containerd-shim-runc-v2", "ctr"] {
            if !dir.join(name).is_file() {
                return Err(bad(format!(
                    "the containerd binaries' directory holds no {name} (`ensure_containerd \
                     VERSION` of scripts/tools.sh unpacks one)"
                )));
            }
        }
        // First in PATH: containerd starts the shim found there, not the machine's.
        match dir.to_str() {
            Some(d) if !d.contains(':') => path_env = format!("{d}:{path_env}"),
            _ => {
                return Err(bad(
                    "cannot be put in PATH (not UTF-8, or holds a ':')".to_owned()
                ))
            }
        }
        Ok(Binaries {
            containerd: dir.join("containerd"),
            ctr: dir.join("ctr"),
            path_env,
            runc,
        })
    }
}

/// overlayfs where the directory's filesystem can carry overlay upper layers; an overlay root
/// (a container running this test bed) or a kernel without overlay gets `native`.
pub(crate) fn default_snapshotter(dir: &Path) -> &'static str {
    let has_overlay = std::fs::read_to_string("/proc/filesystems")
        .map(|s| s.lines().any(|l| l.trim_end().ends_with("overlay")))
        .unwrap_or(false);
    if has_overlay && fs_type_of(dir).as_deref() != Some("overlay") {
        "overlayfs"
    } else {
        "native"
    }
}

/// The filesystem type of the mount holding `path`, from /proc/self/mountinfo.
fn fs_type_of(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let (left, right) = line.split_once(" - ")?;
        let mount_point = unescape_mount_path(left.split(' ').nth(4)?);
        let fs_type = right.split(' ').next()?.to_owned();
        if path.starts_with(&mount_point) {
            let len = mount_point.as_os_str().len();
            if best.as_ref().is_none_or(|(l, _)| len >= *l) {
                best = Some((len, fs_type));
            }
        }
    }
    best.map(|(_, t)| t)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
pub(crate) use exitorder::runtime::podcgroup::unescape_mount_path;

/// Where Debian's `containernetworking-plugins` puts the CNI plugins.
const CNI_PLUGINS: &[&str] = &["/usr/lib/cni", "/opt/cni/bin"];
/// The plugins the pod network needs (containerd sets up every pod's loopback itself).
const CNI_NEEDED: [&str; 3] = ["ptp", "host-local", "loopback"];
/// The node's one CNI network, in its `cni/conf`.
const CNI_CONF: &str = "10-exitorder-testbed.conflist";
/// Host-local IPAM's leases, shared by every node on the machine so that nodes running side
/// by side never hand out one address twice.
const CNI_IPAM_DIR: &str = "/run/exitorder-testbed/ipam";

/// Gives the node a pod network, for the pods that need a network namespace of their own
/// (a user-namespaced pod: containerd pins its user namespace there): a veth pair per pod to
/// the host (`ptp`), addresses from 10.249.0.0/16, no NAT and no iptables rule. Whether it
/// could (the CNI plugins are installed).
fn pod_network(dir: &Path) -> Result<bool, TestbedError> {
    let Some(plugins) = CNI_PLUGINS
        .iter()
        .map(Path::new)
        .find(|d| CNI_NEEDED.iter().all(|p| d.join(p).is_file()))
    else {
        return Ok(false);
    };
    let bin = dir.join("cni/bin");
    for p in CNI_NEEDED {
        let link = bin.join(p);
        if !link.exists() {
            std::os::unix::fs::symlink(plugins.join(p), &link)
                .map_err(|e| TestbedError::io("link", &link, e))?;
        }
    }
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "exitorder-testbed",
        "plugins": [{
            "type": "ptp",
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.249.0.0/16"}]],
                "dataDir": CNI_IPAM_DIR,
            },
        }],
    });
    let path = dir.join("cni/conf").join(CNI_CONF);
    std::fs::write(&path, conf.to_string()).map_err(|e| TestbedError::io("write", &path, e))?;
    Ok(true)
}

/// Whether the node in `dir` has a pod network (see [`pod_network`]).
pub(crate) fn has_pod_network(dir: &Path) -> bool {
    dir.join("cni/conf").join(CNI_CONF).is_file()
}

fn config_text(dir: &Path, snapshotter: &str, runc: Option<&Path>) -> String {
    let d = dir.display();
    let binary_name = runc
        .map(|r| format!("\n        BinaryName = {:?}", r.display().to_string()))
        .unwrap_or_default();
    // restrict_oom_score_adj: without CAP_SYS_RESOURCE (VMs, nested containers) runc cannot
    // lower the sandbox's oom_score_adj and every RunPodSandbox fails with "can't get final
    // child's PID from pipe: EOF". Private runc root, opt dir and CNI dirs keep this
    // containerd's state apart from any other on the machine; host-network pods need no CNI,
    // and the one network there (see `pod_network`) is for user-namespaced pods. Stream port 0
    // lets several nodes run at once.
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{d}/{SOCKET}"

[ttrpc]
  address = "{d}/{SOCKET}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  disable_hugetlb_controller = true
  disable_tcp_service = true
  systemd_cgroup = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"{binary_name}

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
"#,
        pause = PAUSE_IMAGE,
    )
}

pub(crate) struct Containerd {
    child: Option<Child>,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    dir: PathBuf,
    config: PathBuf,
}

impl Containerd {
    pub(crate) fn spawn(
        bins: &Binaries,
        dir: &Path,
        snapshotter: &str,
    ) -> Result<Containerd, TestbedError> {
        for sub in ["root", "state", "runc", "opt", "cni/bin", "cni/conf"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(|e| TestbedError::io("create", &p, e))?;
        }
        pod_network(dir)?;
        let config = dir.join(CONFIG_FILE);
        std::fs::write(&config, config_text(dir, snapshotter, bins.runc.as_deref()))
            .map_err(|e| TestbedError::io("write", &config, e))?;
        let log_path = dir.join(LOG_FILE);
        let log = File::create(&log_path).map_err(|e| TestbedError::io("create", &log_path, e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| TestbedError::io("open", &log_path, e))?;
        // Its own process group: a Ctrl-C at the terminal must reach only the test bed,
        // which then tears the pods down through this containerd before stopping it.
        let child = Command::new(&bins.containerd)
            .process_group(0)
            .arg("--config")
            .arg(&config)
            .env("PATH", &bins.path_env)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| TestbedError::io("start", &bins.containerd, e))?;
        Ok(Containerd {
            child: Some(child),
            socket: dir.join(SOCKET),
            state_dir: dir.join("state"),
            dir: dir.to_owned(),
            config,
        })
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn log_tail(&self) -> String {
        log_tail(&self.dir.join(LOG_FILE), 30)
    }

    /// Waits until the CRI answers `Version`. containerd serves its own API before the CRI
    /// plugin is up, and a CRI plugin that failed to load answers UNIMPLEMENTED for good, so
    /// that answer is given a short while and then reported with the log.
    pub(crate) async fn wait_ready(
        &mut self,
        timeout: Duration,
    ) -> Result<VersionResponse, TestbedError> {
        let start = Instant::now();
        let mut unimplemented_since: Option<Instant> = None;
        let mut last = String::from("socket not created yet");
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    let log_tail = self.log_tail();
                    if config_rejected(&log_tail) {
                        return Err(TestbedError::ConfigRejected {
                            config: self.config.clone(),
                            log_tail,
                        });
                    }
                    return Err(TestbedError::ContainerdExited {
                        status: status.to_string(),
                        log_tail,
                    });
                }
            }
            if self.socket.exists() {
                match self.version().await {
                    Ok(v) => return Ok(v),
                    Err(status) => {
                        last = status.to_string();
                        if status.code() == tonic::Code::Unimplemented {
                            let since = *unimplemented_since.get_or_insert_with(Instant::now);
                            if since.elapsed() > Duration::from_secs(2) {
                                let log_tail = self.log_tail();
                                let why = cri_load_error(&log_tail)
                                    .unwrap_or_else(|| "see the log".to_owned());
                                return Err(TestbedError::NotReady {
                                    waited: start.elapsed(),
                                    last: format!("{last}; the CRI plugin did not load: {why}"),
                                    log_tail,
                                });
                            }
                        }
                    }
                }
            }
            if start.elapsed() > timeout {
                return Err(TestbedError::NotReady {
                    waited: start.elapsed(),
                    last,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn version(&self) -> Result<VersionResponse, tonic::Status> {
        let channel = exitorder::runtime::unix_channel(&self.socket)
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut req = tonic::Request::new(VersionRequest {
            version: "v1".to_owned(),
        });
        req.set_timeout(Duration::from_secs(1));
        Ok(RuntimeServiceClient::new(channel)
            .version(req)
            .await?
            .into_inner())
    }

    /// Imports a docker-archive tarball into the CRI's namespace, unpacked for its snapshotter.
    pub(crate) fn import(
        &self,
        bins: &Binaries,
        archive: &Path,
        snapshotter: &str,
    ) -> Result<(), TestbedError> {
        let mut cmd = Command::new(&bins.ctr);
        cmd.arg("--address")
            .arg(&self.socket)
            .args([
                "-n",
                NAMESPACE,
                "images",
                "import",
                "--snapshotter",
                snapshotter,
            ])
            .arg(archive);
        run_command(&mut cmd).map(drop).map_err(|e| match e {
            TestbedError::Command {
                command,
                status,
                output,
            } => TestbedError::Command {
                command,
                status,
                output: format!("{output}\ncontainerd's log ends with:\n{}", self.log_tail()),
            },
            other => other,
        })
    }

    /// SIGKILL, nothing else: the shims it started are left running.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops containerd: TERM, a moment to exit, then KILL. Only ever the process started here.
    pub(crate) fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether containerd's log says it refused its configuration. 2.x's own notice that it
/// migrated the version 2 file, or ignored a key of it, is a warning and no refusal.
fn config_rejected(log_tail: &str) -> bool {
    log_tail.lines().any(|l| {
        !l.contains("level=warning")
            && !l.contains("level=info")
            && (l.contains("TOML") || l.contains("failed to load config"))
    })
}

/// Why the CRI plugin did not load, from containerd's log: the `error` of the first
/// "failed to load plugin" line naming one of the CRI's plugins (1.x in the message, 2.x as
/// `id=`), which on 2.x is the root cause and the later lines its consequences.
fn cri_load_error(log_tail: &str) -> Option<String> {
    let line = log_tail
        .lines()
        .find(|l| l.contains(PLUGIN_LOAD_FAILED) && CRI_PLUGINS.iter().any(|p| l.contains(p)))?;
    let (_, rest) = line.split_once("error=")?;
    let Some(quoted) = rest.strip_prefix('"') else {
        return Some(rest.split(' ').next().unwrap_or(rest).to_owned());
    };
    // logrus quotes the value: up to the first quote that is not escaped.
    let mut out = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            '"' => return Some(out),
            c => out.push(c),
        }
    }
    Some(out)
}

/// Runs a command to completion; its combined output on failure.
pub(crate) fn run_command(cmd: &mut Command) -> Result<Vec<u8>, TestbedError> {
    let shown = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| TestbedError::io("run", cmd.get_program(), e))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(TestbedError::Command {
            command: shown,
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .trim()
            .to_owned(),
        })
    }
}

/// The last `lines` lines of a log file (at most its last 64 KiB are read).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_load_failures_of_1_x_and_2_x() {
        // containerd 1.6/1.7.
        let v1 = r#"time="t" level=info msg="loading plugin \"io.containerd.grpc.v1.cri\"..." type=io.containerd.grpc.v1
time="t" level=warning msg="failed to load plugin io.containerd.grpc.v1.cri" error="invalid plugin config: no runtime for `default_runtime_name = \"nope\"`"
time="t" level=info msg="containerd successfully booted in 0.02s""#;
        assert_eq!(
            cri_load_error(v1).as_deref(),
            Some(r#"invalid plugin config: no runtime for `default_runtime_name = "nope"`"#)
        );
        // containerd 2.1: the runtime plugin's own failure first, its dependants after.
        let v2 = r#"time="t" level=warning msg="Configuration migrated from version 2, use `containerd config migrate` to avoid migration" t="9us"
time="t" level=warning msg="failed to load plugin" error="skip: no such differ" id=io.containerd.differ.v1.erofs type=io.containerd.differ.v1
time="t" level=warning msg="failed to load plugin" error="invalid plugin config: no runtime" id=io.containerd.cri.v1.runtime type=io.containerd.cri.v1
time="t" level=warning msg="failed to load plugin" error="unable to load CRI runtime service plugin dependency: invalid plugin config: no runtime" id=io.containerd.grpc.v1.cri type=io.containerd.grpc.v1"#;
        assert_eq!(
            cri_load_error(v2).as_deref(),
            Some("invalid plugin config: no runtime")
        );
        assert_eq!(
            cri_load_error("level=info msg=\"starting cri plugin\""),
            None
        );
    }

    #[test]
    fn config_refusals_of_1_x_and_2_x() {
        assert!(config_rejected(
            "containerd: failed to load TOML: c.toml: (3, 2): unexpected token"
        ));
        assert!(config_rejected(
            r#"time="t" level=error msg="Failure unmarshaling TOML" column=6 error="toml: expected ']'" row=3
containerd: failed to unmarshal TOML at row 3 column 6: toml: expected ']'"#
        ));
        // 2.x migrating the version 2 file and ignoring a key of it refuses nothing.
        assert!(!config_rejected(
            r#"time="t" level=warning msg="Configuration migrated from version 2, use `containerd config migrate` to avoid migration"
time="t" level=warning msg="Ignoring unknown key in TOML for plugin" error="strict mode" key=systemd_cgroup plugin=io.containerd.cri.v1.runtime
time="t" level=fatal msg="failed to create listener" error="address in use""#
        ));
    }

    #[test]
    fn runtime_env_vars() {
        assert_eq!(runtime_env_var("1.7"), "EXITORDER_CONTAINERD_1_7");
        assert_eq!(runtime_env_var("2.1"), "EXITORDER_CONTAINERD_2_1");
    }

    #[test]
    fn a_bin_dir_goes_first_in_path_and_must_hold_the_binaries() {
        if find("runc", "").is_err() {
            return; // runc is looked for first, wherever containerd comes from
        }
        let dir = std::env::temp_dir().join(format!("eo-bins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        match Binaries::find(Some(&dir), None) {
            Err(TestbedError::BadBinary { problem, .. }) => {
                assert!(problem.contains("holds no containerd"), "{problem}")
            }
            other => panic!(
                "an empty directory was taken: {:?}",
                other.map(|b| b.path_env)
            ),
        }
        for name in ["containerd", "containerd-shim-runc-v2", "ctr"] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let b = Binaries::find(Some(&dir), None).unwrap();
        let first = b.path_env.split(':').next().unwrap_or_default();
        assert_eq!(Path::new(first), dir.canonicalize().unwrap());
        assert_eq!(b.containerd, dir.canonicalize().unwrap().join("containerd"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn config_keeps_state_private() {
        let text = config_text(Path::new("/tmp/eo-x"), "overlayfs", None);
        assert!(!text.contains("BinaryName"));
        let text = config_text(
            Path::new("/tmp/eo-x"),
            "overlayfs",
            Some(Path::new("/r/runc")),
        );
        assert!(text.contains(r#"BinaryName = "/r/runc""#), "{text}");
        assert!(text.contains("restrict_oom_score_adj = true"));
        assert!(text.contains(r#"Root = "/tmp/eo-x/runc""#));
        assert!(text.contains(r#"address = "/tmp/eo-x/c.sock""#));
        assert!(text.contains(r#"snapshotter = "overlayfs""#));
    }
}
