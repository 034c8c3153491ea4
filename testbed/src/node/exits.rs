//! How the node's pod runner learns that a container exited: the kubelet's "PLEG" relist, one
//! ListContainers for the whole node every period, the way the kubelet does it (every 1 s)
//! rather than a watch per container. Only containers someone waits for are looked at.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exitorder::cri::runtime_service_client::RuntimeServiceClient;
use exitorder::cri::{ContainerState, ContainerStatusRequest, ListContainersRequest};
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tracing::Instrument;

/// How a container ended, as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    pub exit_code: i32,
    /// Unix ns, the runtime's clock.
    pub finished_at_ns: i64,
    pub reason: String,
}

type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<ExitInfo>>>>;

fn lock(w: &Waiters) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<ExitInfo>>> {
    match w.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The node's relister. Stops when dropped.
pub struct ExitWatch {
    waiters: Waiters,
    task: tokio::task::JoinHandle<()>,
}

impl ExitWatch {
    pub fn start(client: RuntimeServiceClient<Channel>, period: Duration) -> ExitWatch {
        let waiters: Waiters = Arc::default();
        let task = tokio::spawn(
            relist(client, Arc::clone(&waiters), period)
                .instrument(tracing::info_span!("testbed_relist")),
        );
        ExitWatch { waiters, task }
    }

    /// Resolves when container `id` has exited (or is gone from the runtime).
    pub fn watch(&self, id: &str) -> oneshot::Receiver<ExitInfo> {
        let (tx, rx) = oneshot::channel();
        lock(&self.waiters).insert(id.to_owned(), tx);
        rx
    }
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relist(mut client: RuntimeServiceClient<Channel>, waiters: Waiters, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let wanted: Vec<String> = {
            let mut w = lock(&waiters);
            w.retain(|_, tx| !tx.is_closed());
            w.keys().cloned().collect()
        };
        if wanted.is_empty() {
            continue;
        }
        let mut req = tonic::Request::new(ListContainersRequest { filter: None });
        req.set_timeout(Duration::from_secs(30));
        let Ok(list) = client.list_containers(req).await else {
            continue;
        };
        let states: HashMap<String, i32> = list
            .into_inner()
            .containers
            .into_iter()
            .map(|c| (c.id, c.state))
            .collect();
        for id in wanted {
            let ended = match states.get(&id) {
                None => Some(ExitInfo {
                    exit_code: -1,
                    finished_at_ns: crate::clock::now_ns(),
                    reason: "removed from the runtime".to_owned(),
                }),
                Some(s) if *s == ContainerState::ContainerExited as i32 => {
                    Some(status(&mut client, &id).await)
                }
                Some(_) => None,
            };
            if let Some(info) = ended {
                if let Some(tx) = lock(&waiters).remove(&id) {
                    let _ = tx.send(info);
                }
            }
        }
    }
}

/// The exit code and time of an exited container; unknown values when the runtime cannot say.
pub async fn status(client: &mut RuntimeServiceClient<Channel>, id: &str) -> ExitInfo {
    let mut req = tonic::Request::new(ContainerStatusRequest {
        container_id: id.to_owned(),
        verbose: false,
    });
    req.set_timeout(Duration::from_secs(30));
    match client.container_status(req).await {
        Ok(resp) => match resp.into_inner().status {
            Some(st) => ExitInfo {
                exit_code: st.exit_code,
                finished_at_ns: st.finished_at,
                reason: st.reason,
            },
            None => unknown("no status"),
        },
        Err(s) => unknown(s.message()),
    }
}

fn unknown(why: &str) -> ExitInfo {
    ExitInfo {
        exit_code: -1,
        finished_at_ns: crate::clock::now_ns(),
        reason: format!("unknown: {why}"),
    }
}
