//! The app's exit as the kernel sees it, stamped by the test bed: the benchmark's trigger.
//!
//! The runtime's `finished_at` comes after its own bookkeeping, and an agent that hears of the
//! exit from the kernel can answer before it: timed from `finished_at`, such an allow would be
//! "before the exit". The test bed awaits each app's first process on a pidfd of its own (the
//! agent's own machinery, used here as a clock) and stamps the moment it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use exitorder::cri::ContainerStatusRequest;
use exitorder::runtime::kernel::{Availability, KernelExits};
use exitorder::stats::Stats;

use crate::node::Node;

type Stamps = Arc<Mutex<HashMap<String, i64>>>;

/// The name of the thread that awaits the pidfds (and stamps the exits).
const KERNEL_THREAD: &str = "kernel_exit";

/// Runs this process's threads named `name` at nice -20: on a node saturated by a burst of
/// deletions, a stamp is then the kernel's moment, not when the scheduler got round to the
/// clock (the agent, in its weighted cgroup, could otherwise answer "before" the exit).
fn hurry(name: &str) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let tid = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok());
        if let Some(tid) = tid.and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::setpriority_process(Some(tid), -20);
        }
    }
}

/// Stamps of the watched containers' exits (Unix ns), by container id.
pub struct KernelClock {
    exits: KernelExits,
    stamps: Stamps,
}

impl KernelClock {
    pub fn start() -> KernelClock {
        let stamps: Stamps = Arc::default();
        let theirs = stamps.clone();
        // Stamped on the waiting thread as it wakes, before anything else is scheduled.
        let exits = KernelExits::with(
            move |id, _| {
                let at = crate::kubelet::timeline::now_ns();
                theirs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(id, at);
                true
            },
            Arc::new(Stats::default()),
        );
        hurry(KERNEL_THREAD);
        KernelClock { exits, stamps }
    }

    pub fn available(&self) -> bool {
        self.exits.available() == &Availability::Available
    }

    /// Awaits container `id`'s first process (as the runtime's verbose status names it).
    pub async fn watch(&mut self, node: &Node, id: &str) {
        let mut req = tonic::Request::new(ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: true,
        });
        req.set_timeout(std::time::Duration::from_secs(10));
        let Ok(resp) = node.client().container_status(req).await else {
            return;
        };
        let pid = resp
            .into_inner()
            .info
            .get("info")
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
            .and_then(|v| v["pid"].as_i64())
            .and_then(|p| i32::try_from(p).ok());
        if let Some(pid) = pid {
            self.exits.watch(id, pid);
        }
    }

    /// When the kernel said container `id` exited.
    pub fn stamp(&self, id: &str) -> Option<i64> {
        self.stamps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .copied()
    }
}
