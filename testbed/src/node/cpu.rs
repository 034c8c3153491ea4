//! The node's CPU weights, laid out as the kubelet lays them out (cgroupfs driver), so that a
//! saturated test node shares its CPU the way a real one does.
//!
//! Under the node's cgroup root:
//! - `system`: containerd, and through it its shims and every runc it runs (a node's
//!   `system.slice`), weight 1024;
//! - `kubepods`: the pods, weighted as the node's allocatable CPU (all of it here);
//!   - `kubepods/burstable`: pods that request CPU, the tier weighted by the sum of their
//!     requests; each pod's own cgroup by its own;
//!   - `kubepods/besteffort`: pods that request nothing, the whole tier weighted 2.
//!
//! The agent runs as the chart's DaemonSet pod would: a Burstable pod with the chart's CPU
//! request ([`AGENT_CPU_REQUEST_MILLI`]). Without these weights every process on the test node
//! weighs the same and a burst of pod deletions starves the agent in a way no kubelet-run node
//! would (and none that a node's real weights would cure either: a measurement against the
//! wrong scheduler).
//!
//! cgroup v1 (`cpu.shares`) and v2 (`cpu.weight`, converted as the kubelet converts) alike. A
//! host without a mounted cpu controller gets no weights: said once, and the node runs flat.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The chart's `resources.requests.cpu` for the agent (`deploy/helm/exitorder/values.yaml`),
/// in millicores; `e2e/tests/install.rs` checks the two agree.
pub const AGENT_CPU_REQUEST_MILLI: u64 = 100;

const SYSTEM: &str = "system";
const KUBEPODS: &str = "kubepods";
const BURSTABLE: &str = "kubepods/burstable";
const BESTEFFORT: &str = "kubepods/besteffort";
/// A node's system.slice weight: the default.
const SYSTEM_SHARES: u64 = 1024;
/// The kubelet's weight for the BestEffort tier (MinShares).
const MIN_SHARES: u64 = 2;
const MAX_SHARES: u64 = 262_144;

/// The kubelet's conversion of a CPU request to `cpu.shares` (MilliCPUToShares).
pub fn shares(milli: u64) -> u64 {
    (milli.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// The kubelet's conversion of `cpu.shares` to cgroup v2's `cpu.weight`.
pub fn weight(shares: u64) -> u64 {
    let s = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + ((s - MIN_SHARES) * 9999) / (MAX_SHARES - MIN_SHARES)
}

/// Where a pod's cgroup goes: its QoS tier, from its containers' CPU requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    BestEffort,
    /// Requests this many millicores in all.
    Burstable(u64),
}

impl Tier {
    pub fn of(cpu_request_milli: Option<u64>) -> Tier {
        match cpu_request_milli {
            Some(m) => Tier::Burstable(m),
            None => Tier::BestEffort,
        }
    }

    /// The pod cgroup `pod<uid>` under the node's `root`, as the kubelet names it.
    pub fn pod_cgroup(self, root: &str, uid: &str) -> String {
        match self {
            Tier::BestEffort => format!("{root}/{BESTEFFORT}/pod{uid}"),
            Tier::Burstable(_) => format!("{root}/{BURSTABLE}/pod{uid}"),
        }
    }
}

/// The cpu controller's hierarchy.
#[derive(Debug, Clone)]
struct CpuTree {
    mount: PathBuf,
    v2: bool,
}

impl CpuTree {
    /// The mount point of the hierarchy that holds the cpu controller, where it is mounted
    /// from its top: cgroup v1's `cpu`, else cgroup v2's with `cpu` enabled.
    fn find() -> Option<CpuTree> {
        let mounts = exitorder::runtime::podcgroup::CgroupMounts::read();
        if let Some(mount) = mounts.dir("cpu", "/") {
            return Some(CpuTree { mount, v2: false });
        }
        let mount = mounts.dir("", "/")?;
        std::fs::read_to_string(mount.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpu"))
            .then_some(CpuTree { mount, v2: true })
    }

    /// Creates `rel` (and its parents) and sets its weight.
    fn ensure(&self, rel: &str, shares: u64) -> io::Result<()> {
        let dir = self.mount.join(rel);
        std::fs::create_dir_all(&dir).map_err(|e| at("create", &dir, e))?;
        if self.v2 {
            // The cpu controller must be on in every ancestor's subtree_control for the
            // weight file to exist; a parent with it on already takes the write quietly.
            let mut here = self.mount.clone();
            for part in Path::new(rel)
                .parent()
                .into_iter()
                .flat_map(Path::components)
            {
                here.push(part);
                let control = here.join("cgroup.subtree_control");
                std::fs::write(&control, "+cpu").map_err(|e| at("write", &control, e))?;
            }
            let file = dir.join("cpu.weight");
            std::fs::write(&file, weight(shares).to_string()).map_err(|e| at("write", &file, e))
        } else {
            let file = dir.join("cpu.shares");
            std::fs::write(&file, shares.to_string()).map_err(|e| at("write", &file, e))
        }
    }

    fn set(&self, rel: &str, shares: u64) -> io::Result<()> {
        let file = self
            .mount
            .join(rel)
            .join(if self.v2 { "cpu.weight" } else { "cpu.shares" });
        let value = if self.v2 { weight(shares) } else { shares };
        std::fs::write(&file, value.to_string()).map_err(|e| at("write", &file, e))
    }

    /// Moves process `pid` (all its threads) into `rel`.
    fn enter(&self, rel: &str, pid: u32) -> io::Result<()> {
        let file = self.mount.join(rel).join("cgroup.procs");
        std::fs::write(&file, pid.to_string()).map_err(|e| at("write", &file, e))
    }
}

fn at(op: &str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

/// One node's CPU weights.
#[derive(Debug)]
pub(crate) struct CpuLayout {
    tree: CpuTree,
    root: String,
    /// The Burstable pods' requests (the tier's weight), by pod cgroup.
    burstable: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl CpuLayout {
    /// Lays out `root`'s tiers and puts the runtime (`runtime_pid`) in `system`. `None` where
    /// the host has no cpu controller to weigh with.
    pub(crate) fn create(root: &str, runtime_pid: Option<u32>) -> io::Result<Option<CpuLayout>> {
        let Some(tree) = CpuTree::find() else {
            return Ok(None);
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        tree.ensure(&format!("{root}/{SYSTEM}"), SYSTEM_SHARES)?;
        tree.ensure(&format!("{root}/{KUBEPODS}"), shares(cpus * 1000))?;
        tree.ensure(&format!("{root}/{BURSTABLE}"), MIN_SHARES)?;
        tree.ensure(&format!("{root}/{BESTEFFORT}"), MIN_SHARES)?;
        if let Some(pid) = runtime_pid {
            tree.enter(&format!("{root}/{SYSTEM}"), pid)?;
        }
        Ok(Some(CpuLayout {
            tree,
            root: root.to_owned(),
            burstable: Mutex::default(),
        }))
    }

    /// Creates a pod's cgroup with its weight, before the runtime puts its sandbox there.
    pub(crate) fn add_pod(&self, tier: Tier, cgroup: &str) -> io::Result<()> {
        match tier {
            Tier::BestEffort => self.tree.ensure(cgroup, MIN_SHARES),
            Tier::Burstable(milli) => {
                self.tree.ensure(cgroup, shares(milli))?;
                let mut b = self
                    .burstable
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                b.insert(cgroup.to_owned(), milli);
                self.tree.set(
                    &format!("{}/{BURSTABLE}", self.root),
                    shares(b.values().sum()),
                )
            }
        }
    }

    /// A pod's cgroup is gone: the Burstable tier weighs its requests no more.
    pub(crate) fn remove_pod(&self, cgroup: &str) {
        let mut b = self
            .burstable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if b.remove(cgroup).is_some() {
            let _ = self.tree.set(
                &format!("{}/{BURSTABLE}", self.root),
                shares(b.values().sum()),
            );
        }
    }

    /// Runs process `pid` as a Burstable pod requesting `milli` millicores, in `pod<name>`;
    /// returns that cgroup, for [`CpuLayout::leave`] once the process is gone.
    pub(crate) fn run_as_pod(&self, name: &str, milli: u64, pid: u32) -> io::Result<String> {
        let cgroup = Tier::Burstable(milli).pod_cgroup(&self.root, name);
        self.add_pod(Tier::Burstable(milli), &cgroup)?;
        self.tree.enter(&cgroup, pid)?;
        Ok(cgroup)
    }

    /// A process run by [`CpuLayout::run_as_pod`] has ended: its cgroup goes.
    pub(crate) fn leave(&self, cgroup: &str) {
        self.remove_pod(cgroup);
        let _ = std::fs::remove_dir(self.tree.mount.join(cgroup));
    }

    /// What the layout is, for reports.
    pub(crate) fn describe(&self) -> String {
        format!(
            "CPU weights as the kubelet sets them (cgroup {}, {}): system 1024, pods by QoS tier",
            if self.tree.v2 { "v2" } else { "v1" },
            self.tree.mount.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_weigh_as_the_kubelet_weighs_them() {
        assert_eq!(shares(100), 102);
        assert_eq!(shares(1), 2);
        assert_eq!(shares(0), 2);
        assert_eq!(shares(2000), 2048);
        assert_eq!(shares(u64::MAX), MAX_SHARES);
        assert_eq!(weight(2), 1);
        assert_eq!(weight(1024), 39);
        assert_eq!(weight(MAX_SHARES), 10_000);
    }

    #[test]
    fn pods_go_to_their_tier() {
        assert_eq!(
            Tier::of(None).pod_cgroup("r", "u"),
            "r/kubepods/besteffort/podu"
        );
        assert_eq!(
            Tier::of(Some(6)).pod_cgroup("r", "u"),
            "r/kubepods/burstable/podu"
        );
    }
}
