//! The node's directories: private ones under /tmp, the kubelet's root mounted shared as a
//! node's is, and their removal, which never passes through a mount left inside.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::containerd::unescape_mount_path;
use super::TestbedError;

/// A fresh private directory `/tmp/<prefix>-<8 hex>`. Under /tmp, not `$TMPDIR`: containerd's
/// socket path must stay under the 108 bytes of `sun_path`.
pub(crate) fn make_temp_dir(prefix: &str) -> Result<PathBuf, TestbedError> {
    let mut last = None;
    for _ in 0..16 {
        let suffix: String = super::random_bytes::<4>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let path = PathBuf::from(format!("/tmp/{prefix}-{suffix}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(TestbedError::io("create", path, e)),
        }
    }
    Err(TestbedError::io(
        "create",
        format!("/tmp/{prefix}-*"),
        last.unwrap_or_else(|| std::io::Error::other("no free name")),
    ))
}

/// The node's directory and its id (the directory's random suffix).
pub(crate) fn make_node_dir() -> Result<(PathBuf, String), TestbedError> {
    let dir = make_temp_dir("eo")?;
    // Others may pass through, not list, as through containerd's own /run/containerd: a
    // user-namespaced container's root is an unprivileged host uid, and runc reaches its
    // rootfs under the node's state directory as that uid.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o711))
        .map_err(|e| TestbedError::io("chmod", &dir, e))?;
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("eo-"))
        .unwrap_or("node")
        .to_owned();
    Ok((dir, id))
}

/// Removes a directory tree when dropped, never through a mount point left inside it.
pub(crate) struct DirGuard(PathBuf);

impl DirGuard {
    pub(crate) fn new(path: PathBuf) -> Self {
        DirGuard(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.0) {
            eprintln!("exitorder testbed: {e}");
        }
    }
}

/// Mount points at or below `dir`, deepest first.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    out.dedup();
    out
}

/// Removes `dir`. A containerd that died with containers running leaves rootfs and shm mounts
/// in its state directory; they are detached first, and if one cannot be, the directory is
/// kept rather than deleting through it.
pub(crate) fn remove_tree(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        return Ok(());
    }
    for m in mounts_below(dir) {
        let _ = Command::new("umount").arg("--lazy").arg(&m).output();
    }
    let left = mounts_below(dir);
    if !left.is_empty() {
        return Err(format!(
            "{} kept: mounts still inside it: {}",
            dir.display(),
            left.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    std::fs::remove_dir_all(dir).map_err(|e| format!("remove {}: {e}", dir.display()))
}

/// Makes `dir` a mount of its own with shared propagation, as a node's kubelet root is (systemd
/// makes `/` shared): a container that mounts it with `HostToContainer` (rslave) needs a
/// shared or slave source, and containerd refuses the mount otherwise. The node's teardown
/// unmounts it with the rest.
pub(crate) fn shared_mount(dir: &Path) -> Result<(), TestbedError> {
    // util-linux's mount, not the syscall: the test bed's dependencies keep the features of
    // the agent's own build (rustix's `mount` would make the demo compile the agent's tree
    // again beside the image's).
    mount(&["--bind".as_ref(), dir.as_os_str(), dir.as_os_str()], dir)?;
    mount(&["--make-shared".as_ref(), dir.as_os_str()], dir)
}

/// Mounts a tmpfs of `size` bytes (the kernel's default without) over `dir`, as the kubelet
/// sets up an emptyDir of `medium: Memory` (`setupTmpfs`: the directory first, then
/// `mount -t tmpfs -o size=<sizeLimit>`). Its removal is [`remove_tree`]'s, which unmounts
/// before it removes, as the kubelet's `TearDownAt` does.
pub(crate) fn tmpfs(dir: &Path, size: Option<u64>) -> Result<(), TestbedError> {
    use std::ffi::OsStr;
    let opts = size.map(|n| format!("size={n}"));
    let mut args: Vec<&OsStr> = vec![OsStr::new("-t"), OsStr::new("tmpfs")];
    if let Some(o) = &opts {
        args.extend([OsStr::new("-o"), OsStr::new(o)]);
    }
    args.extend([OsStr::new("tmpfs"), dir.as_os_str()]);
    mount(&args, dir)
}

fn mount(args: &[&std::ffi::OsStr], dir: &Path) -> Result<(), TestbedError> {
    let out = Command::new("mount")
        .args(args)
        .output()
        .map_err(|e| TestbedError::io("run mount for", dir, e))?;
    if out.status.success() {
        return Ok(());
    }
    let why = format!(
        "mount {}: {}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Err(TestbedError::io("mount", dir, std::io::Error::other(why)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_dirs_are_private_and_unique() {
        use std::os::unix::fs::PermissionsExt;
        let a = DirGuard::new(make_temp_dir("eo-unit").unwrap());
        let b = DirGuard::new(make_temp_dir("eo-unit").unwrap());
        assert_ne!(a.path(), b.path());
        let mode = std::fs::metadata(a.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::create_dir_all(a.path().join("x/y")).unwrap();
        let p = a.path().to_owned();
        drop(a);
        assert!(!p.exists());
    }
}
