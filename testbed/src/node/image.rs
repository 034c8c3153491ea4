//! Container images without a registry: a docker-archive tarball built by hand (one layer
//! holding a static busybox and its applet links) with three tags, a shell image and a pause
//! image, imported into each node with `ctr images import`.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use super::containerd::{run_command, PAUSE_IMAGE};
use super::dirs::{make_temp_dir, DirGuard};
use super::TestbedError;

/// The image every test container runs: busybox, `sh` by default.
pub const BUSYBOX_IMAGE: &str = "exitorder.local/busybox:1";
/// The same image under the name users' pods give it (`image: busybox:1.36`).
pub const BUSYBOX_USER_IMAGE: &str = "docker.io/library/busybox:1.36";
/// The same image under a preset sidecar's image name (istio's proxy): pods whose sidecar
/// exitorder knows by its image only run on the bed.
pub const PRESET_STAND_IN_IMAGE: &str = "docker.io/istio/proxyv2:exitorder-stand-in";

const BUSYBOX_PATHS: &[&str] = &["/bin/busybox", "/usr/bin/busybox"];

/// An image archive built once per process, on first use; each node gets a copy in its own
/// directory. A build that failed is tried again by the next caller.
pub(crate) struct Cached(Mutex<Option<Arc<Vec<u8>>>>);

impl Cached {
    pub(crate) const fn new() -> Self {
        Cached(Mutex::new(None))
    }

    pub(crate) fn get(
        &self,
        build: impl FnOnce() -> Result<Vec<u8>, TestbedError>,
    ) -> Result<Arc<Vec<u8>>, TestbedError> {
        let mut cached = match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(a) = cached.as_ref() {
            return Ok(Arc::clone(a));
        }
        let built = Arc::new(build()?);
        *cached = Some(Arc::clone(&built));
        Ok(built)
    }
}

static ARCHIVE: Cached = Cached::new();

/// The image archive, built on first use.
pub(crate) fn archive() -> Result<Arc<Vec<u8>>, TestbedError> {
    ARCHIVE.get(build)
}

/// The host's static busybox (what the images are built from; also a shell for host-side
/// helpers such as the benchmark's polling waiter).
pub fn find_busybox() -> Result<PathBuf, TestbedError> {
    let path = BUSYBOX_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or(TestbedError::BinaryMissing {
            name: "busybox",
            hint: "install it with `apt-get install -y busybox-static`",
        })?;
    match exitorder::handshake::elf::is_static_elf(&path) {
        Ok(true) => Ok(path),
        Ok(false) => Err(TestbedError::BadBinary {
            path,
            problem: "dynamically linked; the images need a static busybox \
                      (`apt-get install -y busybox-static`)"
                .to_owned(),
        }),
        Err(e) => Err(TestbedError::BadBinary {
            problem: e.to_string(),
            path,
        }),
    }
}

fn docker_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// Creates `path` (and parents) with exactly `mode`.
pub(crate) fn mkdir(path: &Path, mode: u32) -> Result<(), TestbedError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|e| TestbedError::io("create", path, e))?;
    // The umask may have narrowed the mode (it matters for /tmp's sticky 1777).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| TestbedError::io("chmod", path, e))
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), TestbedError> {
    std::fs::write(path, bytes).map_err(|e| TestbedError::io("write", path, e))
}

/// A root file system holding the static busybox and its applets, in `root`.
pub(crate) fn busybox_rootfs(root: &Path) -> Result<(), TestbedError> {
    let busybox = find_busybox()?;
    for (dir, mode) in [
        ("bin", 0o755),
        ("etc", 0o755),
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("root", 0o700),
        ("tmp", 0o1777),
        ("var/run", 0o755),
    ] {
        mkdir(&root.join(dir), mode)?;
    }
    let bin = root.join("bin");
    let dst = bin.join("busybox");
    std::fs::copy(&busybox, &dst).map_err(|e| TestbedError::io("copy", &busybox, e))?;
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| TestbedError::io("chmod", &dst, e))?;
    let list = run_command(Command::new(&busybox).arg("--list"))?;
    for applet in String::from_utf8_lossy(&list).lines().map(str::trim) {
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        let link = bin.join(applet);
        std::os::unix::fs::symlink("busybox", &link)
            .map_err(|e| TestbedError::io("symlink", &link, e))?;
    }
    write(
        &root.join("etc/passwd"),
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
    )?;
    write(&root.join("etc/group"), b"root:x:0:\nnogroup:x:65534:\n")
}

/// One image of a docker archive: its config's file name, entrypoint and command, and tags.
pub(crate) struct ArchiveImage<'a> {
    pub config: &'a str,
    pub entrypoint: serde_json::Value,
    pub cmd: serde_json::Value,
    pub tags: &'a [&'a str],
}

/// A docker archive of `images`, each the single layer made of `root`, built in `work`.
pub(crate) fn pack(
    work: &Path,
    root: &Path,
    images: &[ArchiveImage<'_>],
) -> Result<Vec<u8>, TestbedError> {
    let layer = work.join("layer.tar");
    run_command(
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(root)
            .arg("-cf")
            .arg(&layer)
            .arg("."),
    )?;
    let digest = sha256_hex(&layer)?;
    let layer_dir = work.join(&digest);
    mkdir(&layer_dir, 0o755)?;
    std::fs::rename(&layer, layer_dir.join("layer.tar"))
        .map_err(|e| TestbedError::io("rename", &layer, e))?;
    let layer_name = format!("{digest}/layer.tar");
    let mut manifest = Vec::new();
    let mut members = vec!["manifest.json".to_owned()];
    for image in images {
        let config = serde_json::json!({
            "architecture": docker_arch(),
            "os": "linux",
            "config": {
                "Env": ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"],
                "Entrypoint": image.entrypoint,
                "Cmd": image.cmd,
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{digest}")]},
            "history": [{"created_by": "exitorder testbed"}],
        });
        write(&work.join(image.config), config.to_string().as_bytes())?;
        manifest.push(serde_json::json!(
            {"Config": image.config, "RepoTags": image.tags, "Layers": [layer_name]}
        ));
        members.push(image.config.to_owned());
    }
    members.push(digest);
    write(
        &work.join("manifest.json"),
        serde_json::Value::Array(manifest).to_string().as_bytes(),
    )?;
    let archive = work.join("images.tar");
    run_command(
        Command::new("tar")
            .arg("-C")
            .arg(work)
            .arg("-cf")
            .arg(&archive)
            .args(&members),
    )?;
    std::fs::read(&archive).map_err(|e| TestbedError::io("read", &archive, e))
}

fn build() -> Result<Vec<u8>, TestbedError> {
    let work = DirGuard::new(make_temp_dir("eo-img")?);
    let root = work.path().join("rootfs");
    busybox_rootfs(&root)?;
    pack(
        work.path(),
        &root,
        &[
            ArchiveImage {
                config: "busybox.json",
                entrypoint: serde_json::Value::Null,
                cmd: serde_json::json!(["sh"]),
                tags: &[BUSYBOX_IMAGE, BUSYBOX_USER_IMAGE, PRESET_STAND_IN_IMAGE],
            },
            ArchiveImage {
                config: "pause.json",
                entrypoint: serde_json::json!(["/bin/sleep", "infinity"]),
                cmd: serde_json::Value::Null,
                tags: &[PAUSE_IMAGE],
            },
        ],
    )
}

fn sha256_hex(path: &Path) -> Result<String, TestbedError> {
    let out = run_command(Command::new("sha256sum").arg(path))?;
    let text = String::from_utf8_lossy(&out);
    let hex = text.split_whitespace().next().unwrap_or_default();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        Err(TestbedError::Command {
            command: format!("sha256sum {}", path.display()),
            status: "unexpected output".to_owned(),
            output: text.into_owned(),
        })
    }
}
