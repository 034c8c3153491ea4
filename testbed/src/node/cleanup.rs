//! Leaving nothing behind: sandboxes, shims and the cgroups runc leaves (the directories and
//! their mounts: `dirs`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use exitorder::cri::runtime_service_client::RuntimeServiceClient;
use exitorder::cri::{ListPodSandboxRequest, RemovePodSandboxRequest, StopPodSandboxRequest};

use super::containerd::{unescape_mount_path, Containerd, NAMESPACE};
use super::NodeShared;

/// How long a shim may take to exit once its sandbox is removed.
pub(crate) const SHIM_EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// PID of the shim serving a sandbox, from the pid file the shim writes in its bundle.
pub(crate) fn shim_pid(state_dir: &Path, sandbox_id: &str) -> Option<u32> {
    let path = state_dir
        .join("io.containerd.runtime.v2.task")
        .join(NAMESPACE)
        .join(sandbox_id)
        .join("shim.pid");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Every shim of the node that still has a bundle.
fn all_shim_pids(state_dir: &Path) -> Vec<u32> {
    let tasks = state_dir
        .join("io.containerd.runtime.v2.task")
        .join(NAMESPACE);
    let Ok(entries) = std::fs::read_dir(&tasks) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter_map(|id| shim_pid(state_dir, &id))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Whether `pid` is still a live containerd shim. A zombie, a vanished process or a PID
/// reused by something else all count as gone.
pub(crate) fn shim_alive(pid: u32) -> bool {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself hold spaces.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    if matches!(state, Some("Z" | "X")) {
        return false;
    }
    std::fs::read(proc_dir.join("cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains("containerd-shim"))
        .unwrap_or(false)
}

/// Waits until the shim is gone; false if it still runs after `timeout`.
pub(crate) async fn wait_shim_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while shim_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

fn kill(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Mount points of every cgroup hierarchy (one for cgroup v2, one per controller on v1).
fn cgroup_roots() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut roots: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fs_type = right.split(' ').next()?;
            // Only hierarchies mounted at their root: for those, a cgroup_parent maps to
            // `<mount point>/<parent>`.
            let mut fields = left.split(' ');
            let root = fields.nth(3)?;
            let mount_point = fields.next()?;
            (matches!(fs_type, "cgroup" | "cgroup2") && root == "/")
                .then(|| unescape_mount_path(mount_point))
        })
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

/// Removes the cgroup `rel` (a cgroup_parent such as `exitorder-testbed-x/pod<uid>`) and
/// everything below it in every hierarchy. runc removes the containers' own cgroups but not
/// the parents the kubelet asked for. A process still inside (a container whose runtime died)
/// is killed first: this subtree holds only what this node started.
pub(crate) async fn remove_cgroup(rel: &str) -> Vec<String> {
    let rel = rel.trim_start_matches('/');
    let mut problems = Vec::new();
    for root in cgroup_roots() {
        let dir = root.join(rel);
        if dir.is_dir() {
            if let Err(e) = remove_cgroup_dir(&dir).await {
                problems.push(e);
            }
        }
    }
    problems
}

async fn remove_cgroup_dir(dir: &Path) -> Result<(), String> {
    let children: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("list {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    for child in children {
        Box::pin(remove_cgroup_dir(&child)).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                kill(pid);
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            // EBUSY while killed processes are still being reaped.
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(format!("remove cgroup {}: {e}", dir.display())),
        }
    }
}

const TEARDOWN_CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn request<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(TEARDOWN_CALL_TIMEOUT);
    req
}

/// How many sandboxes are torn down at once: a node with hundreds of pods goes in seconds,
/// without piling hundreds of concurrent stops on containerd.
const TEARDOWN_PARALLEL: usize = 16;

async fn remove_sandboxes(
    client: &RuntimeServiceClient<tonic::transport::Channel>,
    sandboxes: Vec<exitorder::cri::PodSandbox>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for sb in sandboxes {
        if tasks.len() >= TEARDOWN_PARALLEL {
            if let Some(res) = tasks.join_next().await {
                problems.extend(res.unwrap_or_else(|e| vec![e.to_string()]));
            }
        }
        let mut client = client.clone();
        tasks.spawn(async move {
            let id = sb.id;
            let mut problems = Vec::new();
            if let Err(s) = client
                .stop_pod_sandbox(request(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }))
                .await
            {
                problems.push(format!("StopPodSandbox {id}: {}", s.message()));
            }
            if let Err(s) = client
                .remove_pod_sandbox(request(RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }))
                .await
            {
                problems.push(format!("RemovePodSandbox {id}: {}", s.message()));
            }
            problems
        });
    }
    while let Some(res) = tasks.join_next().await {
        problems.extend(res.unwrap_or_else(|e| vec![e.to_string()]));
    }
    problems
}

/// The whole node teardown. Works from any async runtime: it dials the socket afresh rather
/// than use a channel whose background task may belong to a runtime that is blocked.
pub(crate) async fn teardown(shared: &NodeShared, mut cd: Containerd) -> Vec<String> {
    let mut problems = Vec::new();
    let shims = all_shim_pids(&shared.state_dir);
    if cd.pid().is_some() {
        match exitorder::runtime::unix_channel(&shared.socket) {
            Ok(channel) => {
                let mut client = RuntimeServiceClient::new(channel);
                match client
                    .list_pod_sandbox(request(ListPodSandboxRequest { filter: None }))
                    .await
                {
                    Ok(resp) => {
                        problems.extend(remove_sandboxes(&client, resp.into_inner().items).await);
                    }
                    Err(s) => problems.push(format!("ListPodSandbox: {}", s.message())),
                }
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    let deadline = Instant::now() + SHIM_EXIT_TIMEOUT;
    for pid in shims {
        let left = deadline.saturating_duration_since(Instant::now());
        if !wait_shim_gone(pid, left).await {
            problems.push(format!("containerd-shim {pid} still ran; killed"));
            kill(pid);
        }
    }
    cd.stop();
    problems.extend(remove_cgroup(&shared.cgroup_root).await);
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_not_a_shim() {
        assert!(!shim_alive(std::process::id()));
        assert!(!shim_alive(u32::MAX));
    }
}
