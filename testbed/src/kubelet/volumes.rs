//! Volumes as the kubelet sets them up before a container starts: hostPath checked (or
//! created) by its type, emptyDir created for the pod, subPath directories created inside the
//! volume; the result is a host path for each of a container's mounts.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::plan::{HostPathType, PodPlan, Volume};

#[derive(Debug, thiserror::Error)]
#[error("volume {volume:?} ({path}): {problem}")]
pub struct VolumeError {
    pub volume: String,
    pub path: PathBuf,
    pub problem: String,
}

/// A host path the pod names, and where it really is on the test bed (the chart's share path
/// is the node's share, for instance).
#[derive(Debug, Clone)]
pub struct PathMap {
    pub pod_path: String,
    pub host_path: PathBuf,
}

/// `path` with the first mapping whose pod path it lies under applied, compared as the kernel
/// resolves both (`/var/lib//exitorder/` is the share too).
pub fn map_path(path: &str, maps: &[PathMap]) -> PathBuf {
    let resolved = format!(
        "/{}",
        exitorder::handshake::hostpath::components(path).join("/")
    );
    let path = resolved.as_str();
    for m in maps {
        let base = m.pod_path.trim_end_matches('/');
        if path == base {
            return m.host_path.clone();
        }
        if let Some(rest) = path.strip_prefix(base).and_then(|r| r.strip_prefix('/')) {
            return m.host_path.join(rest);
        }
    }
    PathBuf::from(path)
}

fn mkdir(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)?;
    Ok(())
}

/// Prepares the pod's volumes under `pod_dir` (emptyDirs) and the mapped host paths; returns
/// each container's mount sources, in the order of its mounts, and the emptyDir root to remove
/// with the pod.
pub fn prepare(
    plan: &PodPlan,
    pod_dir: &Path,
    maps: &[PathMap],
) -> Result<HashMap<String, Vec<String>>, VolumeError> {
    let mut bases: HashMap<&str, PathBuf> = HashMap::new();
    for (name, v) in &plan.volumes {
        let err = |path: &Path, problem: String| VolumeError {
            volume: name.clone(),
            path: path.to_owned(),
            problem,
        };
        let base = match v {
            Volume::HostPath { path, kind } => {
                let host = map_path(path, maps);
                check_host_path(&host, *kind).map_err(|p| err(&host, p))?;
                host
            }
            Volume::EmptyDir | Volume::Tmpfs { .. } => {
                let dir = pod_dir.join("volumes/kubernetes.io~empty-dir").join(name);
                mkdir(&dir, 0o777).map_err(|e| err(&dir, e.to_string()))?;
                // emptyDir is world-writable, as the kubelet makes it, whatever the umask.
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
                    .map_err(|e| err(&dir, e.to_string()))?;
                // `medium: Memory`: a tmpfs over the directory just made (its root is the
                // tmpfs's own, 1777, as on a node).
                if let Volume::Tmpfs { size } = v {
                    crate::node::dirs::tmpfs(&dir, *size).map_err(|e| err(&dir, e.to_string()))?;
                }
                dir
            }
        };
        bases.insert(name.as_str(), base);
    }
    let mut out = HashMap::new();
    for c in plan.all() {
        let mut sources = Vec::with_capacity(c.mounts.len());
        for m in &c.mounts {
            let Some(base) = bases.get(m.volume.as_str()) else {
                return Err(VolumeError {
                    volume: m.volume.clone(),
                    path: PathBuf::new(),
                    problem: "not declared".into(),
                });
            };
            let source = match &m.sub_path {
                Some(sub) => {
                    let full = base.join(sub);
                    // The kubelet creates a missing subPath directory (root's, 0750) before the
                    // container starts.
                    if std::fs::symlink_metadata(&full).is_err() {
                        mkdir(&full, 0o750).map_err(|e| VolumeError {
                            volume: m.volume.clone(),
                            path: full.clone(),
                            problem: format!("subPath of container {}: {e}", c.name),
                        })?;
                    }
                    full
                }
                None => base.clone(),
            };
            sources.push(source.to_string_lossy().into_owned());
        }
        out.insert(c.name.clone(), sources);
    }
    Ok(out)
}

fn check_host_path(path: &Path, kind: HostPathType) -> Result<(), String> {
    let meta = std::fs::metadata(path);
    let want = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(format!(
                "hostPath type check failed: {} is not a {what}",
                path.display()
            ))
        }
    };
    match kind {
        HostPathType::Unchecked => Ok(()),
        HostPathType::DirectoryOrCreate => match meta {
            Ok(m) => want(m.is_dir(), "directory"),
            Err(_) => mkdir(path, 0o755).map_err(|e| e.to_string()),
        },
        HostPathType::FileOrCreate => match meta {
            Ok(m) => want(m.is_file(), "file"),
            Err(_) => std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(path)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        },
        other => {
            let m =
                meta.map_err(|e| format!("hostPath type check failed: {}: {e}", path.display()))?;
            let t = m.file_type();
            match other {
                HostPathType::Directory => want(t.is_dir(), "directory"),
                HostPathType::File => want(t.is_file(), "file"),
                HostPathType::Socket => want(t.is_socket(), "socket"),
                HostPathType::CharDevice => want(t.is_char_device(), "character device"),
                HostPathType::BlockDevice => want(t.is_block_device(), "block device"),
                _ => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_mapped_by_prefix_on_component_boundaries() {
        let maps = [PathMap {
            pod_path: "/var/lib/exitorder".into(),
            host_path: PathBuf::from("/tmp/node/share"),
        }];
        assert_eq!(
            map_path("/var/lib/exitorder", &maps),
            PathBuf::from("/tmp/node/share")
        );
        assert_eq!(
            map_path("/var/lib/exitorder/bin", &maps),
            PathBuf::from("/tmp/node/share/bin")
        );
        assert_eq!(
            map_path("/var/lib//exitorder/./pods/", &maps),
            PathBuf::from("/tmp/node/share/pods")
        );
        assert_eq!(
            map_path("/var/lib/exitorder-other", &maps),
            PathBuf::from("/var/lib/exitorder-other")
        );
    }

    #[test]
    fn host_path_types_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let file = d.join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(check_host_path(d, HostPathType::Directory).is_ok());
        assert!(check_host_path(&file, HostPathType::Directory)
            .unwrap_err()
            .contains("not a directory"));
        assert!(check_host_path(&d.join("absent"), HostPathType::Directory).is_err());
        check_host_path(&d.join("new/dir"), HostPathType::DirectoryOrCreate).unwrap();
        assert!(d.join("new/dir").is_dir());
        check_host_path(&d.join("made"), HostPathType::FileOrCreate).unwrap();
        assert!(d.join("made").is_file());
        assert!(check_host_path(&file, HostPathType::Socket)
            .unwrap_err()
            .contains("not a socket"));
        assert!(check_host_path(&d.join("absent"), HostPathType::Unchecked).is_ok());
    }

    /// A `medium: Memory` emptyDir is a tmpfs of its `sizeLimit` over the directory, the
    /// subPath made inside it, and the pod's teardown unmounts it before removing the tree.
    #[test]
    fn a_memory_emptydir_is_a_tmpfs_of_its_size_and_is_torn_down() {
        use crate::kubelet::plan::{plan, Placement};
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
            "spec": {"hostNetwork": true,
                     "containers": [{"name": "proxy", "image": "busybox:1.36",
                                     "volumeMounts": [{"name": "exitorder", "mountPath": "/var/run/exitorder", "subPath": "proxy"}]}],
                     "volumes": [{"name": "exitorder", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]}});
        let place = Placement::example();
        let plan = plan(&pod, &place).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pod_dir = dir.path().join("pods").join(&place.uid);
        let sources = prepare(&plan, &pod_dir, &[]).unwrap();
        let vol = pod_dir.join("volumes/kubernetes.io~empty-dir/exitorder");
        assert_eq!(
            sources["proxy"],
            [vol.join("proxy").to_string_lossy().into_owned()]
        );
        let fs = rustix::fs::statfs(&vol).unwrap();
        // TMPFS_MAGIC, 1 MiB in blocks of its own size.
        assert_eq!(fs.f_type, 0x0102_1994, "{}", vol.display());
        assert_eq!(fs.f_blocks as u64 * fs.f_bsize as u64, 1 << 20);
        assert!(vol.join("proxy").is_dir());
        crate::node::dirs::remove_tree(&pod_dir).unwrap();
        assert!(!pod_dir.exists());
    }
}
