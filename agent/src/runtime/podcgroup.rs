//! Which containers a pod has started, as its cgroup shows them: a look that answers in
//! microseconds where a listing of the pod waits on the runtime (seconds on a node busy with
//! a burst of deletions).
//!
//! runc gives every started container a cgroup inside its pod's, named after the container's
//! id (`<pod cgroup>/<id>` with cgroupfs, `cri-containerd-<id>.scope` or `crio-<id>.scope`
//! with systemd), the sandbox's pause container included. So if every container cgroup in
//! the pod's is one the node view knows, no attempt the view has not heard of was started:
//! what a listing asked at the same moment would have shown. The pod's cgroup is learnt from
//! `/proc/<pid>/cgroup` of a container's first process, read anyway by the kernel exit
//! source, and looked at through a cgroup mount of this process that shows it (the host's
//! hierarchy: on a node, the chart mounts it read-only; an agent that has only its own
//! subtree mounted sees no other pod, and listings settle instead).
//!
//! A process that moves itself to another cgroup (it needs CAP_SYS_ADMIN and a writable
//! cgroupfs) can only mislead this about its own pod; a cgroup of anything but a known
//! container, or one that cannot be read, sends the pod back to a listing.

use std::collections::HashMap;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};

/// More entries than a pod has containers by far: beyond it, a listing decides.
const MAX_ENTRIES: usize = 256;

/// The cgroup hierarchies this process has mounted: cgroup v2's, and v1's by controller.
#[derive(Debug, Clone, Default)]
pub struct CgroupMounts {
    v2: Option<Mount>,
    v1: HashMap<String, Mount>,
}

/// A cgroup mount: where it is, and which cgroup it shows at its top, as this process's
/// cgroup namespace names it (`/`, a subtree such as a container's own cgroup, or, for a mount
/// of the host's hierarchy seen from inside a cgroup namespace, `/../..`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    root: String,
    at: PathBuf,
}

impl Mount {
    /// Where cgroup `path` (as `/proc/<pid>/cgroup` names it, in the same namespace) is under
    /// this mount, if the mount shows it.
    fn dir_of(&self, path: &str) -> Option<PathBuf> {
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        for top in self.root.split('/').filter(|p| !p.is_empty()) {
            if parts.next() != Some(top) {
                return None;
            }
        }
        let rest: Vec<&str> = parts.collect();
        // Only the namespace's way up may climb: below the mount's top, a path goes down.
        if rest.iter().any(|p| *p == ".." || *p == ".") {
            return None;
        }
        Some(rest.iter().fold(self.at.clone(), |dir, p| dir.join(p)))
    }
}

impl CgroupMounts {
    /// This process's mounts, from `/proc/self/mountinfo`.
    pub fn read() -> CgroupMounts {
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|t| CgroupMounts::parse(&t))
            .unwrap_or_default()
    }

    /// The cgroup mounts in a mountinfo text that show their hierarchy from its root.
    pub fn parse(mountinfo: &str) -> CgroupMounts {
        let mut m = CgroupMounts::default();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mut r = right.split(' ');
            let (Some(fs_type), Some(_source), Some(options)) = (r.next(), r.next(), r.next())
            else {
                continue;
            };
            let mut l = left.split(' ');
            let (Some(root), Some(mount)) = (l.nth(3), l.next()) else {
                continue;
            };
            let mount = Mount {
                root: unescape_mount_path(root).to_string_lossy().into_owned(),
                at: unescape_mount_path(mount),
            };
            match fs_type {
                // The widest mount of the hierarchy, where there are several.
                "cgroup2"
                    if m.v2
                        .as_ref()
                        .is_none_or(|old| depth(&mount.root) < depth(&old.root)) =>
                {
                    m.v2 = Some(mount);
                }
                "cgroup" => {
                    // The controllers are among the super options (with flags such as `rw`,
                    // never named in /proc/<pid>/cgroup, so harmless to keep).
                    for opt in options.split(',') {
                        let name = opt.strip_prefix("name=").unwrap_or(opt);
                        let slot = m.v1.entry(name.to_owned()).or_insert_with(|| mount.clone());
                        if depth(&mount.root) < depth(&slot.root) {
                            *slot = mount.clone();
                        }
                    }
                }
                _ => {}
            }
        }
        m
    }

    /// The directory of the pod cgroup holding container `id`, from a `/proc/<pid>/cgroup`
    /// text of its process: the parent of the first cgroup named after the id that one of
    /// these mounts shows.
    pub fn pod_dir(&self, proc_cgroup: &str, id: &str) -> Option<PathBuf> {
        if id.len() < 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        container_cgroups(proc_cgroup, id)
            .find_map(|(controllers, path)| self.dir(controllers, path.rsplit_once('/')?.0))
    }

    /// Where cgroup `path` of the hierarchy of `controllers` (as a `/proc/<pid>/cgroup` line
    /// names both: a comma-separated list for cgroup v1, empty for v2) is in these mounts.
    pub fn dir(&self, controllers: &str, path: &str) -> Option<PathBuf> {
        if controllers.is_empty() {
            self.v2.as_ref()?.dir_of(path)
        } else {
            controllers
                .split(',')
                .filter_map(|c| self.v1.get(c.strip_prefix("name=").unwrap_or(c)))
                .find_map(|m| m.dir_of(path))
        }
    }
}

/// The lines of a `/proc/<pid>/cgroup` text whose cgroup is container `id`'s own (named after
/// the id, not its pod's): each one's controllers (empty for cgroup v2) and cgroup path.
pub fn container_cgroups<'a>(
    proc_cgroup: &'a str,
    id: &'a str,
) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    proc_cgroup.lines().filter_map(move |line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let last = path.rsplit('/').next()?;
        (id_of(last) == Some(id)).then_some((controllers, path))
    })
}

/// The first `max` bytes of a small file the kernel makes (`/proc/<pid>/cgroup`, a cgroup's
/// counters): what a process could make long is not read beyond that.
pub fn read_head(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(max)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// How far below the namespace's top (negative: above it) a mount's top cgroup is.
fn depth(root: &str) -> i64 {
    root.split('/')
        .filter(|p| !p.is_empty())
        .map(|p| if p == ".." { -1 } else { 1 })
        .sum()
}

/// The container id a cgroup's name carries: the name itself, or the 64 hex digits a systemd
/// scope ends with (`cri-containerd-<id>.scope`, `crio-<id>.scope`).
pub fn id_of(name: &str) -> Option<&str> {
    let stem = name.strip_suffix(".scope").unwrap_or(name);
    let id = stem.rsplit(['-', ':']).next()?;
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// Whether the pod cgroup `dir` holds a container `known` does not know (`None`: it cannot be
/// told: unreadable, or too large to be a pod's). Entries that name no container (a
/// controller's own files) are not containers.
pub fn strangers(dir: &Path, known: impl Fn(&str) -> bool) -> Option<bool> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut seen = 0usize;
    for entry in entries {
        let entry = entry.ok()?;
        seen = seen.saturating_add(1);
        if seen > MAX_ENTRIES {
            return None;
        }
        if !entry.file_type().ok()?.is_dir() {
            continue;
        }
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Some(true);
        };
        // Another container, or a cgroup that is no container's (systemd's or another
        // agent's own): nothing to vouch for.
        if !id_of(name).is_some_and(&known) {
            return Some(true);
        }
    }
    Some(false)
}

/// A path as `/proc/<pid>/mountinfo` writes it, with its octal escapes (`\040` for a space,
/// `\134` for a backslash) undone, byte for byte. An incomplete escape stays as written.
pub fn unescape_mount_path(s: &str) -> PathBuf {
    let mut out = Vec::with_capacity(s.len());
    let mut rest = s.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        let escaped = tail
            .split_first_chunk::<3>()
            .filter(|(digits, _)| {
                first == b'\\' && digits.iter().all(|c| (b'0'..=b'7').contains(c))
            })
            .and_then(|(digits, after)| {
                let code = digits.iter().fold(0u32, |acc, c| {
                    acc.saturating_mul(8)
                        .saturating_add(u32::from(c.saturating_sub(b'0')))
                });
                Some((u8::try_from(code).ok()?, after))
            });
        match escaped {
            Some((byte, after)) => {
                out.push(byte);
                rest = after;
            }
            None => {
                out.push(first);
                rest = tail;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const OTHER: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    #[test]
    fn whole_hierarchies_only() {
        let info = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
32 25 0:28 /kubepods/pod1/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
33 25 0:29 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
34 25 0:30 / /host\\040cg rw - cgroup2 cgroup2 rw,nsdelegate";
        let m = CgroupMounts::parse(info);
        assert_eq!(m.v1["cpu"].at, Path::new("/sys/fs/cgroup/cpu"));
        assert_eq!(m.v1["systemd"].at, Path::new("/sys/fs/cgroup/systemd"));
        assert_eq!(m.v1["memory"].root, "/kubepods/pod1/abc");
        assert_eq!(
            m.v2.as_ref().map(|v| v.at.as_path()),
            Some(Path::new("/host cg"))
        );
        // A hierarchy's own top, where its mount shows it.
        assert_eq!(m.dir("cpu", "/"), Some(PathBuf::from("/sys/fs/cgroup/cpu")));
        assert_eq!(m.dir("memory", "/"), None);

        let proc_v1 = format!("5:memory:/kubepods/pod1/{ID}\n4:cpu,cpuacct:/kubepods/pod1/{ID}\n");
        assert_eq!(
            m.pod_dir(&proc_v1, ID),
            Some(PathBuf::from("/sys/fs/cgroup/cpu/kubepods/pod1"))
        );
        let proc_v2 = format!("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(
            m.pod_dir(&proc_v2, ID),
            Some(PathBuf::from("/host cg/kubepods.slice/kubepods-pod1.slice"))
        );
        // Another container's cgroup, a path climbing out, or a short id: nothing.
        assert_eq!(m.pod_dir(&proc_v1, OTHER), None);
        assert_eq!(m.pod_dir(&format!("0::/a/../b/{ID}"), ID), None);
        assert_eq!(m.pod_dir("0::/a/abc", "abc"), None);
        // Only in a hierarchy whose mount shows a subtree that is not the pod's.
        assert_eq!(
            m.pod_dir(&format!("5:memory:/kubepods/pod2/{ID}"), ID),
            None
        );
        // No mount of the hierarchy the process is in.
        assert_eq!(CgroupMounts::default().pod_dir(&proc_v2, ID), None);
    }

    /// An agent in its own cgroup namespace (cgroup v2's default for containers) with the
    /// host's hierarchy mounted: both the mount's top and other processes' cgroups are named
    /// from its namespace, above it.
    #[test]
    fn the_hosts_hierarchy_seen_from_a_cgroup_namespace() {
        let info = "\
40 30 0:30 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw
41 30 0:30 /../../.. /host/sys/fs/cgroup ro - cgroup2 cgroup2 rw";
        let m = CgroupMounts::parse(info);
        let proc = format!("0::/../../../kubepods.slice/pod9.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(
            m.pod_dir(&proc, ID),
            Some(PathBuf::from(
                "/host/sys/fs/cgroup/kubepods.slice/pod9.slice"
            ))
        );
        // Its own namespace's mount alone shows nothing above itself.
        let own = CgroupMounts::parse("40 30 0:30 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw");
        assert_eq!(own.pod_dir(&proc, ID), None);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(
            unescape_mount_path(r"/mnt/with\040space\134x"),
            PathBuf::from(r"/mnt/with space\x")
        );
        assert_eq!(unescape_mount_path(r"/a\04"), PathBuf::from(r"/a\04"));
        assert_eq!(unescape_mount_path(r"\400"), PathBuf::from(r"\400"));
    }

    #[test]
    fn names_carry_ids() {
        assert_eq!(id_of(ID), Some(ID));
        assert_eq!(id_of(&format!("cri-containerd-{ID}.scope")), Some(ID));
        assert_eq!(id_of(&format!("crio-{ID}.scope")), Some(ID));
        assert_eq!(id_of("cpu.shares"), None);
        assert_eq!(id_of("init.scope"), None);
    }

    #[test]
    fn a_pod_cgroup_with_only_known_containers_has_no_strangers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(ID)).unwrap();
        std::fs::write(dir.path().join("cpu.shares"), "2").unwrap();
        assert_eq!(strangers(dir.path(), |id| id == ID), Some(false));
        std::fs::create_dir(dir.path().join(format!("cri-containerd-{OTHER}.scope"))).unwrap();
        assert_eq!(strangers(dir.path(), |id| id == ID), Some(true));
        assert_eq!(strangers(dir.path(), |_| true), Some(false));
        std::fs::create_dir(dir.path().join("something")).unwrap();
        assert_eq!(strangers(dir.path(), |_| true), Some(true));
        assert_eq!(strangers(&dir.path().join("gone"), |_| true), None);
    }
}
