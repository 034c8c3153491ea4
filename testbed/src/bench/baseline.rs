//! The prior art, built the way the OpenKruise "SidecarExitPriority" proposal describes it, so
//! the benchmark compares designs rather than implementations:
//!
//! - its daemon wakes every second, scans the share for `exit` files that say `wait`, lists
//!   each such pod's containers over the CRI and writes `allow` when every container of lower
//!   priority has exited;
//! - its in-container waiter polls the file once a second (a shell loop here).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tonic::transport::Channel;

use exitorder::cri::runtime_service_client::RuntimeServiceClient;
use exitorder::cri::{
    ContainerFilter, ContainerState, ListContainersRequest, ListPodSandboxRequest, PodSandboxFilter,
};
use exitorder::handshake::share::{ExitKey, ExitState, Share, ShareError};
use exitorder::pod::PodUid;
use exitorder::runtime::{LABEL_CONTAINER_NAME, LABEL_POD_UID};

use crate::priorities::{from_annotations, resolve, Named};

/// The proposal's daemon scan period.
pub const KRUISE_SCAN: Duration = Duration::from_secs(1);
/// What each CRI call may take before the scan gives the pod up until the next round.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How often [`SH_POLLER`] reads its exit file.
pub const SH_POLL_PERIOD: Duration = Duration::from_secs(1);
/// The proposal's waiter: create `exit` saying `wait`, then read it once a second until the
/// daemon's answer is there.
pub const SH_POLLER: &str =
    r#"echo wait > exit; while [ "$(cat exit)" != allow ]; do sleep 1; done; rm -f exit"#;

#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error(transparent)]
    Share(#[from] ShareError),
    #[error("CRI {call}: {status}")]
    Cri {
        call: &'static str,
        #[source]
        status: Box<tonic::Status>,
    },
}

/// A shell running [`SH_POLLER`] in `dir`.
pub fn sh_poller(busybox: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(busybox);
    cmd.arg("sh").arg("-c").arg(SH_POLLER).current_dir(dir);
    cmd
}

/// A container of the pod, as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub attempt: u32,
    pub created_at: i64,
    pub exited: bool,
}

/// Whether every container of lower priority than `me` has exited, judged on the newest
/// attempt of each name.
pub fn lower_exited(me: &str, priorities: Option<&Named>, containers: &[Listed]) -> bool {
    let mut newest: BTreeMap<&str, &Listed> = BTreeMap::new();
    for c in containers {
        let slot = newest.entry(c.name.as_str()).or_insert(c);
        if (c.attempt, c.created_at) > (slot.attempt, slot.created_at) {
            *slot = c;
        }
    }
    let mine = resolve(me, priorities, None, false);
    newest
        .values()
        .filter(|c| c.name != me && resolve(&c.name, priorities, None, false) < mine)
        .all(|c| c.exited)
}

/// One allow the daemon wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaselineAllow {
    /// Wall clock right after the write (Unix ns).
    pub at_ns: i64,
    /// `ordered`, `unknown` (the runtime does not know the pod) or `unordered` (its
    /// priority annotation does not parse).
    pub reason: &'static str,
    /// When the waiter wrote `exit` (from its mtime), Unix ns.
    pub wait_since_ns: Option<i64>,
}

pub type Allows = Arc<Mutex<HashMap<ExitKey, BaselineAllow>>>;

/// The proposal's daemon, reading the same share and runtime as the agent.
pub struct KruiseDaemon {
    share: Share,
    client: RuntimeServiceClient<Channel>,
    period: Duration,
    allows: Allows,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_nanos()).ok())
        .unwrap_or(0)
}

fn cri(call: &'static str) -> impl FnOnce(tonic::Status) -> BaselineError {
    move |status| BaselineError::Cri {
        call,
        status: Box::new(status),
    }
}

fn request<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(CALL_TIMEOUT);
    req
}

/// What the runtime says about one pod.
struct PodView {
    priorities: Result<Option<Named>, String>,
    containers: Vec<Listed>,
}

impl KruiseDaemon {
    pub fn new(
        share_dir: &Path,
        client: RuntimeServiceClient<Channel>,
        period: Duration,
    ) -> Result<Self, BaselineError> {
        Ok(KruiseDaemon {
            share: Share::open(share_dir)?,
            client,
            period,
            allows: Arc::default(),
        })
    }

    /// The allows written so far, by container.
    pub fn allows(&self) -> Allows {
        Arc::clone(&self.allows)
    }

    /// Scans every period until `stop` says so (or its sender is gone).
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
                _ = tick.tick() => self.scan().await,
            }
        }
    }

    async fn scan(&mut self) {
        let Ok(keys) = self.share.containers() else {
            return;
        };
        let mut waiting: BTreeMap<PodUid, Vec<ExitKey>> = BTreeMap::new();
        for key in keys {
            if matches!(self.share.read_exit(&key), Ok(ExitState::Waiting)) {
                waiting.entry(key.pod.clone()).or_default().push(key);
            }
        }
        for (pod, keys) in waiting {
            // A runtime error leaves the pod for the next round, as the proposal's daemon does.
            let Ok(view) = self.pod(&pod).await else {
                continue;
            };
            for key in keys {
                let reason = match &view {
                    None => "unknown",
                    Some(PodView {
                        priorities: Err(_), ..
                    }) => "unordered",
                    Some(PodView {
                        priorities: Ok(p),
                        containers,
                    }) => {
                        if !lower_exited(key.container.as_str(), p.as_ref(), containers) {
                            continue;
                        }
                        "ordered"
                    }
                };
                let wait_since_ns = self
                    .share
                    .exit_age(&key)
                    .and_then(|age| i64::try_from(age.as_nanos()).ok())
                    .map(|age| now_ns() - age);
                if self.share.write_allow(&key).is_ok() {
                    let at_ns = now_ns();
                    let mut allows = match self.allows.lock() {
                        Ok(g) => g,
                        Err(poisoned) => poisoned.into_inner(),
                    };
                    allows.entry(key).or_insert(BaselineAllow {
                        at_ns,
                        reason,
                        wait_since_ns,
                    });
                }
            }
        }
    }

    /// The pod's newest sandbox annotations and its containers; `None` when the runtime
    /// knows neither.
    async fn pod(&self, pod: &PodUid) -> Result<Option<PodView>, BaselineError> {
        let selector: HashMap<String, String> =
            [(LABEL_POD_UID.to_owned(), pod.as_str().to_owned())].into();
        let mut client = self.client.clone();
        let sandboxes = client
            .list_pod_sandbox(request(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    label_selector: selector.clone(),
                    ..Default::default()
                }),
            }))
            .await
            .map_err(cri("ListPodSandbox"))?
            .into_inner()
            .items;
        let containers = client
            .list_containers(request(ListContainersRequest {
                filter: Some(ContainerFilter {
                    label_selector: selector,
                    ..Default::default()
                }),
            }))
            .await
            .map_err(cri("ListContainers"))?
            .into_inner()
            .containers;
        if sandboxes.is_empty() && containers.is_empty() {
            return Ok(None);
        }
        let annotations = sandboxes
            .into_iter()
            .max_by_key(|s| s.created_at)
            .map(|s| s.annotations)
            .unwrap_or_default();
        let annotations: BTreeMap<String, String> = annotations.into_iter().collect();
        let priorities = from_annotations(&annotations);
        let containers = containers
            .into_iter()
            .filter_map(|c| {
                Some(Listed {
                    name: c.labels.get(LABEL_CONTAINER_NAME)?.clone(),
                    attempt: c.metadata.as_ref().map_or(0, |m| m.attempt),
                    created_at: c.created_at,
                    exited: c.state == ContainerState::ContainerExited as i32,
                })
            })
            .collect();
        Ok(Some(PodView {
            priorities,
            containers,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, attempt: u32, exited: bool) -> Listed {
        Listed {
            name: name.to_owned(),
            attempt,
            created_at: i64::from(attempt),
            exited,
        }
    }

    #[test]
    fn waits_for_every_lower_priority_container() {
        let prio: Named = [("proxy".to_owned(), 1), ("logs".to_owned(), 2)].into();
        let p = Some(&prio);
        let running = [
            c("app", 0, false),
            c("proxy", 0, false),
            c("logs", 0, false),
        ];
        assert!(!lower_exited("proxy", p, &running));
        // Higher priority containers running do not hold a lower one.
        let app_gone = [c("app", 0, true), c("proxy", 0, false), c("logs", 0, false)];
        assert!(lower_exited("proxy", p, &app_gone));
        assert!(!lower_exited("logs", p, &app_gone));
        let both_gone = [c("app", 0, true), c("proxy", 0, true), c("logs", 0, false)];
        assert!(lower_exited("logs", p, &both_gone));
        // The newest attempt counts: a restarted app runs again.
        let restarted = [c("app", 0, true), c("app", 1, false), c("proxy", 0, false)];
        assert!(!lower_exited("proxy", p, &restarted));
        // Without priorities everyone is 0: nothing holds anyone.
        assert!(lower_exited("proxy", None, &running));
    }

    #[test]
    fn poller_script_answers_allow_only() {
        let cmd = sh_poller(Path::new("/bin/busybox"), Path::new("/tmp"));
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args[..2], ["sh", "-c"]);
        assert!(SH_POLLER.contains(&format!("sleep {};", SH_POLL_PERIOD.as_secs())));
        assert_eq!(cmd.get_current_dir(), Some(Path::new("/tmp")));
    }
}
