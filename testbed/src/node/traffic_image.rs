//! The traffic benchmark's image: the busybox image plus a real proxy (Debian's haproxy) and
//! a real log shipper (Debian's rsyslog), each with the shared libraries it links, as no
//! registry is reachable to pull one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use super::containerd::run_command;
use super::dirs::{make_temp_dir, DirGuard};
use super::image::{busybox_rootfs, mkdir, pack, ArchiveImage, Cached};
use super::TestbedError;

/// The image the traffic benchmark's sidecars (and its app) run.
pub const TRAFFIC_IMAGE: &str = "exitorder.local/traffic:1";

pub(crate) const HAPROXY: &str = "/usr/sbin/haproxy";
const RSYSLOGD: &str = "/usr/sbin/rsyslogd";
const HINT: &str = "install them with `apt-get install -y haproxy rsyslog`";

static ARCHIVE: Cached = Cached::new();

/// The image archive, built on first use.
pub(crate) fn archive() -> Result<Arc<Vec<u8>>, TestbedError> {
    ARCHIVE.get(build)
}

/// Whether the host has what the image is built from; why not, when it does not.
pub fn available() -> Result<(), TestbedError> {
    for bin in [HAPROXY, RSYSLOGD] {
        if !Path::new(bin).is_file() {
            return Err(TestbedError::BinaryMissing {
                name: if bin == HAPROXY {
                    "haproxy"
                } else {
                    "rsyslogd"
                },
                hint: HINT,
            });
        }
    }
    rsyslog_modules().map(|_| ())
}

/// rsyslog's module directory (`/usr/lib/<multiarch>/rsyslog`): rsyslogd loads imfile and
/// omfwd's helpers from the path it was built with, so the image keeps it.
fn rsyslog_modules() -> Result<PathBuf, TestbedError> {
    let lib = Path::new("/usr/lib");
    let entries = std::fs::read_dir(lib).map_err(|e| TestbedError::io("read", lib, e))?;
    entries
        .filter_map(Result::ok)
        .map(|e| e.path().join("rsyslog"))
        .find(|d| d.join("imfile.so").is_file())
        .ok_or(TestbedError::BinaryMissing {
            name: "rsyslog's imfile module",
            hint: HINT,
        })
}

/// The shared libraries `elf` loads, the dynamic loader included, as `ldd` resolves them.
fn libraries(elf: &Path) -> Result<Vec<PathBuf>, TestbedError> {
    let out = run_command(Command::new("ldd").arg(elf))?;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Copies `file` (its content, when it is a link) to the same path under `root`.
fn copy_in(root: &Path, file: &Path) -> Result<(), TestbedError> {
    let rel = file.strip_prefix("/").unwrap_or(file);
    let dst = root.join(rel);
    if dst.exists() {
        return Ok(());
    }
    if let Some(parent) = dst.parent() {
        mkdir(parent, 0o755)?;
    }
    std::fs::copy(file, &dst).map_err(|e| TestbedError::io("copy", file, e))?;
    Ok(())
}

fn build() -> Result<Vec<u8>, TestbedError> {
    available()?;
    let work = DirGuard::new(make_temp_dir("eo-traffic-img")?);
    let root = work.path().join("rootfs");
    busybox_rootfs(&root)?;
    let modules = rsyslog_modules()?;
    let mut elves = vec![PathBuf::from(HAPROXY), PathBuf::from(RSYSLOGD)];
    let listing = std::fs::read_dir(&modules).map_err(|e| TestbedError::io("read", &modules, e))?;
    elves.extend(
        listing
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "so")),
    );
    for elf in &elves {
        copy_in(&root, elf)?;
        for lib in libraries(elf)? {
            copy_in(&root, &lib)?;
        }
    }
    pack(
        work.path(),
        &root,
        &[ArchiveImage {
            config: "traffic.json",
            entrypoint: serde_json::Value::Null,
            cmd: serde_json::json!(["sh"]),
            tags: &[TRAFFIC_IMAGE],
        }],
    )
}
