//! Runtime reads, off the decision path: the decision loop asks, this task calls the runtime
//! and answers with changes for the node view. A runtime that answers in seconds (a saturated
//! node) slows the view's refresh, never a decision.
//!
//! Listings run one at a time (a request made while one runs is served by one more after
//! it); container descriptions run up to [`DESCRIBE_CONCURRENCY`] at once. While the runtime
//! is failing, it is asked for its Version every `HEALTH_RETRY` so readiness follows it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, Instrument};

use super::{Runtime, RuntimeError};
use crate::decide::bounds::Later as _;
use crate::decide::RunState;
use crate::pod::PodUid;
use crate::view::{Change, Need};

/// Container descriptions in flight at once.
pub const DESCRIBE_CONCURRENCY: usize = 16;
/// How often a failing runtime is asked whether it answers again.
const HEALTH_RETRY: Duration = Duration::from_secs(2);
/// A started container's process, not named yet by the runtime's status, is asked for
/// again after this, doubling up to [`PID_RETRY_MAX`] apart, for [`PID_RETRY_FOR`]: a node
/// starting hundreds of pods names a started container's process seconds late.
const PID_RETRY_START: Duration = Duration::from_millis(10);
const PID_RETRY_MAX: Duration = Duration::from_secs(1);
const PID_RETRY_FOR: Duration = Duration::from_secs(30);

/// What the decision loop asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// Everything on the node.
    List,
    /// One pod the view does not know.
    ListPod(PodUid),
    /// What the view needs.
    Need(Need),
    /// The first process of a container that started after it was described (its
    /// description, read while it was only created, named none), for the kernel's exit source.
    Pid(String),
}

/// What the reader answers.
#[derive(Debug)]
pub enum Reply {
    /// A change for the view.
    Change(Change),
    /// A listing of one pod is done (its change, if any, came before).
    PodChecked(PodUid),
    /// A call failed.
    Failed { read: Read, error: RuntimeError },
    /// Whether the runtime answers now (after a failure, and when it answers again).
    Health(bool),
    /// A container's writable mounts, read with its description, for the breach check.
    Mounts(crate::handshake::breach::MountCheck),
    /// A running container's first process, read with its description, for the kernel's
    /// exit source.
    Process { id: String, pid: i32 },
}

/// The handle the loop asks through.
#[derive(Clone)]
pub struct Reader {
    tx: mpsc::UnboundedSender<Read>,
}

impl Reader {
    pub fn ask(&self, read: Read) {
        let _ = self.tx.send(read);
    }
}

/// Starts the reader task; it ends when every [`Reader`] is dropped.
pub fn start(runtime: Runtime) -> (Reader, mpsc::UnboundedReceiver<Reply>, ReaderTask) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (reply_tx, replies) = mpsc::unbounded_channel();
    (
        Reader { tx },
        replies,
        ReaderTask {
            runtime,
            rx,
            replies: reply_tx,
        },
    )
}

pub struct ReaderTask {
    runtime: Runtime,
    rx: mpsc::UnboundedReceiver<Read>,
    replies: mpsc::UnboundedSender<Reply>,
}

impl ReaderTask {
    pub async fn run(mut self) {
        let permits = Arc::new(Semaphore::new(DESCRIBE_CONCURRENCY));
        let mut calls: JoinSet<(Read, Result<Vec<Reply>, RuntimeError>)> = JoinSet::new();
        let mut listing = false;
        let mut list_again = false;
        let mut healthy = true;
        let mut health = tokio::time::interval(HEALTH_RETRY);
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                read = self.rx.recv() => {
                    let Some(read) = read else { break };
                    if read == Read::List {
                        if listing {
                            list_again = true;
                            continue;
                        }
                        listing = true;
                    }
                    self.spawn(&mut calls, read, &permits);
                }
                Some(done) = calls.join_next() => {
                    let Ok((read, result)) = done else { continue };
                    if read == Read::List {
                        listing = false;
                        if std::mem::take(&mut list_again) {
                            listing = true;
                            self.spawn(&mut calls, Read::List, &permits);
                        }
                    }
                    match result {
                        Ok(replies) => {
                            if !healthy {
                                healthy = true;
                                let _ = self.replies.send(Reply::Health(true));
                            }
                            for r in replies {
                                let _ = self.replies.send(r);
                            }
                        }
                        Err(error) => {
                            // A container that just went away answers NotFound, which is not
                            // a failure (describe says None); anything else is the runtime's.
                            // A call that took too long is the runtime's only if it does not
                            // answer Version either: a node busy with a burst of deletions
                            // answers slowly, and holding every wait then would be wrong.
                            let down =
                                !error.timed_out() || self.runtime.version().await.is_err();
                            if healthy && down {
                                healthy = false;
                                let _ = self.replies.send(Reply::Health(false));
                            }
                            // The view backs off before asking again.
                            let retry = match &read {
                                Read::Need(Need::Describe(id)) => Some(Change::DescribeFailed {
                                    id: id.clone(),
                                    now: Instant::now(),
                                }),
                                Read::Need(Need::Sandbox(uid)) => Some(Change::SandboxFailed {
                                    uid: uid.clone(),
                                    now: Instant::now(),
                                }),
                                _ => None,
                            };
                            if let Some(change) = retry {
                                let _ = self.replies.send(Reply::Change(change));
                            }
                            let _ = self.replies.send(Reply::Failed { read, error });
                        }
                    }
                }
                _ = health.tick(), if !healthy => {
                    match self.runtime.version().await {
                        Ok(_) => {
                            healthy = true;
                            let _ = self.replies.send(Reply::Health(true));
                        }
                        Err(e) => debug!(error = %e, "runtime still not answering"),
                    }
                }
            }
        }
        calls.shutdown().await;
    }

    fn spawn(
        &self,
        calls: &mut JoinSet<(Read, Result<Vec<Reply>, RuntimeError>)>,
        read: Read,
        permits: &Arc<Semaphore>,
    ) {
        let runtime = self.runtime.clone();
        let permits = Arc::clone(permits);
        let span = tracing::debug_span!("runtime_read", read = ?read);
        calls.spawn(
            async move {
                let result = match &read {
                    Read::List => runtime
                        .list(None)
                        .await
                        .map(|l| vec![Reply::Change(Change::Listed(l))]),
                    Read::ListPod(uid) => runtime.list(Some(uid)).await.map(|listing| {
                        vec![
                            Reply::Change(Change::PodListed {
                                uid: uid.clone(),
                                listing,
                            }),
                            Reply::PodChecked(uid.clone()),
                        ]
                    }),
                    Read::Need(Need::Sandbox(uid)) => {
                        runtime.list(Some(uid)).await.map(|listing| {
                            vec![Reply::Change(Change::PodListed {
                                uid: uid.clone(),
                                listing,
                            })]
                        })
                    }
                    Read::Pid(id) => process_of(&runtime, &permits, id).await.map(|pid| {
                        pid.map(|pid| Reply::Process {
                            id: id.clone(),
                            pid,
                        })
                        .into_iter()
                        .collect()
                    }),
                    Read::Need(Need::Describe(id)) => {
                        // The semaphore is never closed; an error would only mean "go on".
                        let _permit = permits.acquire_owned().await;
                        match runtime.describe(id).await {
                            Ok(Some(d)) => {
                                let mut replies = vec![Reply::Mounts(d.mount_check())];
                                if let Some(pid) = d.pid {
                                    replies.push(Reply::Process {
                                        id: d.info.id.clone(),
                                        pid,
                                    });
                                }
                                replies.push(Reply::Change(d.change()));
                                Ok(replies)
                            }
                            Ok(None) => Ok(vec![Reply::Change(Change::NotAContainer {
                                id: id.clone(),
                            })]),
                            Err(e) => Err(e),
                        }
                    }
                };
                (read, result)
            }
            .instrument(span),
        );
    }
}

/// Container `id`'s process, as the runtime's status names it. containerd tells a task's
/// start before its CRI status has the process (and a container described just before it
/// started has none yet): a container that is not known to have exited is asked about
/// again, for up to [`PID_RETRY_FOR`], without holding a read permit while it waits.
async fn process_of(
    runtime: &Runtime,
    permits: &Arc<Semaphore>,
    id: &str,
) -> Result<Option<i32>, RuntimeError> {
    let mut delay = PID_RETRY_START;
    let give_up = Instant::now().later(PID_RETRY_FOR);
    loop {
        let described = {
            // The semaphore is never closed; an error would only mean "go on".
            let _permit = Arc::clone(permits).acquire_owned().await;
            runtime.describe(id).await
        };
        let late = Instant::now() >= give_up;
        match described {
            // Busy (a burst of pods starting), not gone: asked again.
            Err(e) if e.timed_out() && !late => {}
            Err(e) => return Err(e),
            Ok(None) => return Ok(None),
            Ok(Some(d)) if d.pid.is_some() || d.info.state == RunState::Exited || late => {
                return Ok(d.pid)
            }
            Ok(Some(_)) => {}
        }
        tokio::time::sleep(delay).await;
        delay = delay.saturating_mul(2).min(PID_RETRY_MAX);
    }
}
