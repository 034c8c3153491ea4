//! Whether a container was held back by its own limits: the kernel's counters of its cgroup,
//! so that a silence from it is not taken for proof that its preStop hook never ran.
//!
//! The kubelet runs an exec hook inside the container (`runc exec` joins the container's
//! cgroups before the hook's first instruction), so the hook's start is charged to the
//! container's limits: at its CPU quota, `runc init` and the hook wait for the next period;
//! at its memory limit they wait on reclaim, or are killed; at its `pids.max` the exec fails
//! before it starts. In each case the kernel counts it in the container's cgroup:
//! - CPU: `cpu.stat` `nr_throttled` against `nr_periods`, the periods in which the cgroup ran
//!   out of its quota among those it ran in (cgroup v1's cpu controller and v2 alike); only a
//!   container throttled in at least half of them counts, not one meeting its quota in bursts;
//! - memory: v2's `memory.events` `oom` and `oom_kill`, v1's `memory.oom_control` `oom_kill`
//!   (hitting the limit alone, `max` or `failcnt`, is what any container whose page cache
//!   fills its limit does all the time: not counted);
//! - PIDs: `pids.events` `max`, the forks refused at `pids.max` (v1 and v2).
//!
//! A count that rose while a wait's window ran says the container's hook may be late or
//! may have failed: its silence then proves nothing. What the counters cannot show: an exec
//! that fails for another reason (an entrypoint that does not know `mark`, a runtime that
//! cannot start the exec), and a hook slowed by the node as a whole rather than by the
//! container's limits (see `docs/architecture.md`, "Why a container stops").
//!
//! [`Dirs`] says where a container's counters are, from its process's `/proc/<pid>/cgroup`,
//! and reads them into a [`Strain`] (the view's: what the node showed at one moment).

use std::path::{Path, PathBuf};

use crate::runtime::podcgroup::{container_cgroups, read_head, CgroupMounts};
pub use crate::view::Strain;

/// How much of one counters file is read: a few short lines.
const MAX_FILE: u64 = 4096;

/// Where one container's counters are: its own cgroup's directories (cgroup v2's one, or v1's
/// per controller), as this process's cgroup mounts show them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dirs {
    cpu: Option<PathBuf>,
    memory: Option<(PathBuf, Version)>,
    pids: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

impl Dirs {
    /// The directories of container `id`'s cgroups, from a `/proc/<pid>/cgroup` text of its
    /// process: only the lines whose cgroup is named after the id (the container's own, not
    /// its pod's), that one of `mounts` shows.
    pub fn of(mounts: &CgroupMounts, proc_cgroup: &str, id: &str) -> Dirs {
        let mut dirs = Dirs::default();
        for (controllers, path) in container_cgroups(proc_cgroup, id) {
            let Some(dir) = mounts.dir(controllers, path) else {
                continue;
            };
            if controllers.is_empty() {
                // cgroup v2: one cgroup for every controller (a v1 one, where both are
                // mounted, is kept for its controller).
                dirs.cpu.get_or_insert_with(|| dir.clone());
                dirs.memory
                    .get_or_insert_with(|| (dir.clone(), Version::V2));
                dirs.pids.get_or_insert(dir);
                continue;
            }
            for c in controllers.split(',') {
                match c {
                    "cpu" if dirs.cpu.is_none() => dirs.cpu = Some(dir.clone()),
                    "memory" if dirs.memory.is_none() => {
                        dirs.memory = Some((dir.clone(), Version::V1));
                    }
                    "pids" if dirs.pids.is_none() => dirs.pids = Some(dir.clone()),
                    _ => {}
                }
            }
        }
        dirs
    }

    /// Whether no counter can be read here.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none() && self.pids.is_none()
    }

    /// The counters now; a file that cannot be read counts nothing.
    pub fn read(&self) -> Strain {
        let cpu = self
            .cpu
            .as_deref()
            .map(|d| read(&d.join("cpu.stat")))
            .unwrap_or_default();
        let memory = match &self.memory {
            None => 0,
            Some((d, Version::V2)) => {
                let text = read(&d.join("memory.events"));
                field(&text, "oom").saturating_add(field(&text, "oom_kill"))
            }
            Some((d, Version::V1)) => field(&read(&d.join("memory.oom_control")), "oom_kill"),
        };
        let pids = self
            .pids
            .as_deref()
            .map_or(0, |d| field(&read(&d.join("pids.events")), "max"));
        Strain {
            cpu_periods: field(&cpu, "nr_periods"),
            cpu_throttled: field(&cpu, "nr_throttled"),
            memory,
            pids,
        }
    }
}

/// A counters file's text, or nothing.
fn read(path: &Path) -> String {
    read_head(path, MAX_FILE).unwrap_or_default()
}

/// The value of `key` in a flat-keyed file (`key value` lines), or 0.
fn field(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn mounts(root: &Path) -> CgroupMounts {
        let r = root.display();
        CgroupMounts::parse(&format!(
            "30 25 0:26 / {r}/v1/cpu rw - cgroup cgroup rw,cpu,cpuacct\n\
             31 25 0:27 / {r}/v1/memory rw - cgroup cgroup rw,memory\n\
             32 25 0:28 / {r}/v1/pids rw - cgroup cgroup rw,pids\n\
             33 25 0:29 / {r}/v2 rw - cgroup2 cgroup2 rw\n"
        ))
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn v1_counters_are_read_from_each_controllers_own_cgroup_of_the_container() {
        let t = tempfile::tempdir().expect("tempdir");
        let pod = format!("kubepods/burstable/podx/{ID}");
        let proc_cgroup = format!(
            "12:pids:/{pod}\n11:memory:/{pod}\n4:cpu,cpuacct:/{pod}\n1:name=systemd:/{pod}\n0::/\n"
        );
        let dirs = Dirs::of(&mounts(t.path()), &proc_cgroup, ID);
        let base = |c: &str| t.path().join("v1").join(c).join(&pod);
        write(
            &base("cpu").join("cpu.stat"),
            "nr_periods 9\nnr_throttled 3\nthrottled_time 7\n",
        );
        write(&base("memory").join("memory.failcnt"), "2\n");
        write(
            &base("memory").join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        );
        write(&base("pids").join("pids.events"), "max 4\n");
        let s = dirs.read();
        assert_eq!(
            s,
            Strain {
                cpu_periods: 9,
                cpu_throttled: 3,
                memory: 1,
                pids: 4
            }
        );
        // Throttled in one period of ten since: a burst, not a container held at its quota.
        write(
            &base("cpu").join("cpu.stat"),
            "nr_periods 19\nnr_throttled 4\nthrottled_time 9\n",
        );
        assert_eq!(dirs.read().rose_since(&s), None);
        // In six of ten: held.
        write(
            &base("cpu").join("cpu.stat"),
            "nr_periods 19\nnr_throttled 9\nthrottled_time 9\n",
        );
        assert_eq!(dirs.read().rose_since(&s), Some("cpu"));
        // The limit's routine hits are not counted; a kill by the OOM killer is.
        write(
            &base("cpu").join("cpu.stat"),
            "nr_periods 9\nnr_throttled 3\nthrottled_time 7\n",
        );
        write(&base("memory").join("memory.failcnt"), "200\n");
        assert_eq!(dirs.read().rose_since(&s), None);
        write(
            &base("memory").join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        );
        assert_eq!(dirs.read().rose_since(&s), Some("memory"));
        assert_eq!(s.rose_since(&s), None);
    }

    #[test]
    fn v2_counters_are_read_from_the_containers_one_cgroup() {
        let t = tempfile::tempdir().expect("tempdir");
        let path = format!("kubepods.slice/kubepods-podx.slice/cri-containerd-{ID}.scope");
        let dirs = Dirs::of(&mounts(t.path()), &format!("0::/{path}\n"), ID);
        let dir = t.path().join("v2").join(&path);
        write(
            &dir.join("cpu.stat"),
            "usage_usec 5\nnr_periods 0\nnr_throttled 0\n",
        );
        write(
            &dir.join("memory.events"),
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        );
        write(&dir.join("pids.events"), "max 0\n");
        let before = dirs.read();
        assert_eq!(before, Strain::default());
        // Reclaim at the limit (`max`, `high`) is routine; an OOM kill is not.
        write(
            &dir.join("memory.events"),
            "low 0\nhigh 3\nmax 5\noom 0\noom_kill 0\n",
        );
        assert_eq!(dirs.read().rose_since(&before), None);
        write(
            &dir.join("memory.events"),
            "low 0\nhigh 3\nmax 5\noom 1\noom_kill 1\n",
        );
        assert_eq!(dirs.read().rose_since(&before), Some("memory"));
        write(&dir.join("pids.events"), "max 1\n");
        write(
            &dir.join("memory.events"),
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        );
        assert_eq!(dirs.read().rose_since(&before), Some("pids"));
    }

    #[test]
    fn only_the_containers_own_cgroup_is_read() {
        let t = tempfile::tempdir().expect("tempdir");
        // The pod's cgroup and another container's are not this container's.
        let other = ID.replace('0', "f");
        let text = format!("0::/kubepods/podx/{other}\n4:cpu,cpuacct:/kubepods/podx\n");
        assert!(Dirs::of(&mounts(t.path()), &text, ID).is_empty());
        // A path outside every mount shows nothing either.
        assert!(Dirs::of(&CgroupMounts::default(), &format!("0::/k/{ID}\n"), ID).is_empty());
        // Unreadable files count nothing.
        let dirs = Dirs::of(&mounts(t.path()), &format!("0::/gone/{ID}\n"), ID);
        assert!(!dirs.is_empty());
        assert_eq!(dirs.read(), Strain::default());
    }
}
