//! Finished Jobs' sidecars, shut down (the rules are in [`completion`]).
//!
//! The decision loop sends a snapshot of a completing pod whenever the runtime or the API
//! server changes it; one task, off the decision path, reads exit codes, shuts sidecars down
//! (the entrypoint's `shutdown --post URL` run in the sidecar with CRI ExecSync, or CRI
//! StopContainer) and reports sidecars that exit with a failure status. Each shutdown that
//! took effect is written to the share (`jobs/<pod-uid>`, a directory no pod mounts), so an
//! agent restarted in between does not repeat it, and one that did not take effect (the agent
//! stopped before it) is done by the next agent.
//!
//! What the task keeps of a pod goes once its Job is done, or, for a pod deleted before that,
//! when garbage collection finds the pod gone from the runtime (and removes its record).
//!
//! Parts:
//! - [`completion`]: the rules of a finishing Job, pure;
//! - `shutdown`: one sidecar shut down, and the runtime's word on exits;
//! - `records`: what was done, written to the share so that no agent repeats it.

pub mod completion;
mod records;
mod shutdown;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;
use tracing::{debug, info, warn, Instrument};

use crate::cluster::recorder::{EventSink, PodRef, ShutdownNotice};
use crate::decide::restart::Restart;
use crate::decide::RunState;
use crate::jobs::completion::{Completes, InPlace, Member, Step};
use crate::pod::PodUid;
use crate::runtime::{ExitStatus, Runtime};
use crate::stats::Stats;
pub use records::stale_records;
use records::{append, load, records_dir};
use shutdown::{exit_code, how, shut_down, Shutdown};

/// Where the shutdown records are, under the share.
pub const JOBS_DIR: &str = "jobs";

/// One container of a completing pod's spec (its newest attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapMember {
    pub name: String,
    /// The runtime's id; `None` before the kubelet created it.
    pub id: Option<String>,
    pub priority: u8,
    pub state: RunState,
    /// When the agent learnt that it exited (its newest attempt).
    pub exit_seen: Option<Instant>,
    /// Whether the kubelet starts it again after an exit.
    pub restart: Restart,
}

/// What the task needs to know of a completing pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSnapshot {
    pub uid: PodUid,
    pub pod: PodRef,
    pub policy: Completes,
    /// The pod's grace period: StopContainer's.
    pub grace: Duration,
    pub members: Vec<SnapMember>,
    /// The containers whose exits can restart every container in place (KEP-5532).
    pub triggers: Vec<SnapMember>,
    pub urls: BTreeMap<String, String>,
}

/// What the decision loop tells the task.
enum JobMsg {
    Snapshot(JobSnapshot),
    /// Only these pods still exist: what the task keeps of others goes.
    Keep(BTreeSet<PodUid>),
}

/// The decision loop's side.
#[derive(Clone)]
pub struct JobLink {
    tx: mpsc::UnboundedSender<JobMsg>,
}

impl JobLink {
    /// Lets the task forget the pods that are gone: it keeps a little per completing pod
    /// (the attempts shut down, exit codes read), which must not outlive the pod on a node
    /// that runs thousands of Jobs.
    pub fn keep_only(&self, pods: BTreeSet<PodUid>) {
        let _ = self.tx.send(JobMsg::Keep(pods));
    }

    /// Hands the task the latest state of a completing pod.
    pub(crate) fn snapshot(&self, snap: JobSnapshot) {
        let _ = self.tx.send(JobMsg::Snapshot(snap));
    }
}

/// Starts nothing: the task runs when `run` is awaited.
pub fn start(
    runtime: Runtime,
    share_dir: &Path,
    events: Option<EventSink>,
    stats: Arc<Stats>,
) -> (JobLink, JobsTask) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        JobLink { tx },
        JobsTask {
            rx,
            runtime,
            dir: share_dir.join(JOBS_DIR),
            events,
            stats,
            pods: HashMap::new(),
        },
    )
}

#[derive(Default)]
struct PodJob {
    /// Container ids (attempts) shut down: a sidecar the kubelet restarted (OnFailure) is a
    /// new attempt, shut down again.
    asked: BTreeSet<String>,
    /// Exit codes read, by container id.
    codes: HashMap<String, i32>,
    /// Container ids whose exit after a shutdown was reported.
    reported: BTreeSet<String>,
    /// Container ids whose exit restarts every container in place, said.
    restarts_seen: BTreeSet<String>,
    /// Container ids of the current attempts that the runtime no longer has.
    gone: BTreeSet<String>,
    /// Sidecars (container ids) left running because their shutdown would restart the pod.
    held_back: BTreeSet<String>,
    /// The container (name, id of the attempt) whose exit restarts the pod in place, until
    /// a newer attempt of it shows.
    restarting: Option<(String, String)>,
}

pub struct JobsTask {
    rx: mpsc::UnboundedReceiver<JobMsg>,
    runtime: Runtime,
    dir: PathBuf,
    events: Option<EventSink>,
    stats: Arc<Stats>,
    pods: HashMap<PodUid, PodJob>,
}

impl JobsTask {
    /// Runs until every link is dropped (the agent stopped). Shutdowns in flight go on in
    /// their own tasks: a StopContainer the runtime has accepted completes without us.
    pub async fn run(mut self) {
        if let Err(e) = records_dir(&self.dir) {
            warn!(dir = %self.dir.display(), error = %e, "cannot use the Job records' directory; shutdowns are not recorded");
        }
        while let Some(msg) = self.rx.recv().await {
            // Only the latest of a burst of snapshots of one pod matters.
            let mut latest: BTreeMap<PodUid, JobSnapshot> = BTreeMap::new();
            let mut next = Some(msg);
            while let Some(msg) = next.take() {
                match msg {
                    JobMsg::Snapshot(snap) => {
                        latest.insert(snap.uid.clone(), snap);
                    }
                    JobMsg::Keep(live) => {
                        self.pods.retain(|uid, _| live.contains(uid));
                        latest.retain(|uid, _| live.contains(uid));
                        self.stats.set_job_pods(self.pods.len());
                    }
                }
                next = self.rx.try_recv().ok();
            }
            for snap in latest.into_values() {
                self.handle(snap).await;
            }
            self.stats.set_job_pods(self.pods.len());
        }
    }

    async fn handle(&mut self, snap: JobSnapshot) {
        let dir = self.dir.clone();
        let job = self.pods.entry(snap.uid.clone()).or_insert_with(|| {
            let (asked, reported) = load(&dir, &snap.uid);
            PodJob {
                asked,
                reported,
                ..PodJob::default()
            }
        });
        // An older attempt's exit code is never needed again (a restarted sidecar is a new
        // attempt): only the current attempts' are kept.
        let current: BTreeSet<&str> = snap
            .members
            .iter()
            .chain(&snap.triggers)
            .filter_map(|m| m.id.as_deref())
            .collect();
        job.codes.retain(|id, _| current.contains(id.as_str()));
        job.gone.retain(|id| current.contains(id.as_str()));
        job.restarts_seen.retain(|id| current.contains(id.as_str()));
        job.held_back.retain(|id| current.contains(id.as_str()));
        let asked =
            |m: &SnapMember, job: &PodJob| m.id.as_ref().is_some_and(|id| job.asked.contains(id));
        // Exit codes: of sidecars that were shut down (to report a failure), and of main
        // containers when only a success finishes the pod.
        let triggers: BTreeSet<&str> = snap.triggers.iter().map(|t| t.name.as_str()).collect();
        // A main container can be a trigger too: its code is asked for once.
        let mut looked: BTreeSet<&str> = BTreeSet::new();
        for m in snap.members.iter().chain(&snap.triggers) {
            let Some(id) = m.id.as_deref() else { continue };
            if !looked.insert(id) {
                continue;
            }
            let wanted = (asked(m, job) && !job.reported.contains(id))
                || (m.priority == 0 && m.restart.needs_exit_code())
                || triggers.contains(m.name.as_str());
            if m.state == RunState::Exited && wanted && !job.codes.contains_key(id) {
                match exit_code(&self.runtime, id).await {
                    Ok(ExitStatus::Exited(code)) => {
                        job.codes.insert(id.to_owned(), code);
                    }
                    Ok(ExitStatus::NotYet) => {
                        warn!(pod = %snap.uid, container = %m.name, "the runtime has no exit code for an exited container yet; asking again at the next change");
                    }
                    Ok(ExitStatus::Gone) => {
                        // Removed with its pod, most likely (what the task keeps of the pod
                        // goes with it), or by an in-place restart of the whole pod.
                        debug!(pod = %snap.uid, container = %m.name, "the container is gone from the runtime; its exit code is not known");
                        job.gone.insert(id.to_owned());
                    }
                    Err(e) => {
                        self.stats.runtime_error(e.kind());
                        warn!(pod = %snap.uid, container = %m.name, error = %e, "cannot read the exit code; asking again at the next change");
                    }
                }
            }
        }
        for m in &snap.members {
            let Some(id) = m.id.as_deref() else { continue };
            let Some(&code) = job.codes.get(id) else {
                continue;
            };
            if !asked(m, job) || job.reported.contains(id) {
                continue;
            }
            job.reported.insert(id.to_owned());
            append(&dir, &snap.uid, &format!("reported {id}"), &self.stats);
            if code == 0 {
                info!(event = "job_sidecar_exited", pod = %snap.uid, container = %m.name, exit_code = code, "sidecar exited after the Job's shutdown");
                continue;
            }
            let how = how(&snap.urls, &m.name);
            warn!(event = "job_sidecar_failed", pod = %snap.uid, container = %m.name, exit_code = code, how = %how, "sidecar exited with a failure status after the Job's shutdown");
            if let Some(events) = &self.events {
                events.emit(ShutdownNotice {
                    pod: snap.pod.clone(),
                    container: m.name.clone(),
                    exit_code: code,
                    how,
                    at: SystemTime::now(),
                });
            }
        }
        let member = |m: &SnapMember| Member {
            name: m.name.clone(),
            priority: m.priority,
            state: m.state,
            exit_code: m.id.as_ref().and_then(|id| job.codes.get(id).copied()),
            restart: m.restart.clone(),
        };
        let members: Vec<Member> = snap.members.iter().map(member).collect();
        // A trigger's exit after every main container had ended for good is the kubelet
        // stopping it at the pod's end (a native sidecar), not a restart of the pod.
        let mains: Vec<(&Member, Option<Instant>)> = members
            .iter()
            .zip(&snap.members)
            .filter(|(m, _)| m.priority == 0)
            .map(|(m, s)| (m, s.exit_seen))
            .collect();
        let restarting: Vec<Member> = snap
            .triggers
            .iter()
            .filter(|t| {
                t.exit_seen
                    .is_none_or(|at| !completion::ended_before(&mains, at))
            })
            .map(member)
            .collect();
        // Until the container that asked for the restart runs again, the pod is between its
        // kill and its next run: what the runtime shows of it (containers removed one by one)
        // is no end of the work.
        if let Some((name, old)) = &job.restarting {
            let now = snap
                .triggers
                .iter()
                .find(|t| &t.name == name)
                .and_then(|t| t.id.as_ref());
            if now.is_none_or(|id| id == old) {
                debug!(pod = %snap.uid, container = %name, "completing pod: still restarting in place");
                return;
            }
            job.restarting = None;
        }
        let trigger_id = |name: &str| {
            snap.triggers
                .iter()
                .find(|t| t.name == name)
                .and_then(|t| t.id.clone())
                .unwrap_or_default()
        };
        let (by, exit_code) = match completion::restarting_all(&restarting) {
            InPlace::No => (None, None),
            InPlace::RestartingAll { by, exit_code } => (Some(by), Some(exit_code)),
            // The newest attempt of a live pod's container leaves the runtime only when the
            // kubelet restarts the whole pod in place (its garbage collection keeps it): gone
            // before its code was read, it is taken for one.
            InPlace::ReadExitCodes(names) => match names
                .into_iter()
                .find(|n| job.gone.contains(&trigger_id(n)))
            {
                Some(gone) => (Some(gone), None),
                None => {
                    debug!(pod = %snap.uid, "completing pod: exit codes needed to tell whether every container restarts");
                    return;
                }
            },
        };
        if let Some(by) = by {
            // The kubelet kills every container and runs the pod again: the exits this
            // brings are not the end of the work. Said once per exit.
            let id = trigger_id(&by);
            job.restarting = Some((by.clone(), id.clone()));
            if job.restarts_seen.insert(id) {
                self.stats.job_restarted_in_place();
                info!(event = "job_restarting_all", pod = %snap.uid, container = %by, exit_code, "every container of the pod restarts in place (RestartAllContainers): not the end of the Job");
            }
            return;
        }
        let asked_names: BTreeSet<String> = snap
            .members
            .iter()
            .filter(|m| asked(m, job))
            .map(|m| m.name.clone())
            .collect();
        match completion::next_step(&members, &asked_names) {
            Step::Wait | Step::ReadExitCodes(_) => {}
            Step::Done => {
                if !job.asked.is_empty() {
                    info!(event = "job_completed", pod = %snap.uid, "every sidecar of the finished Job has exited");
                }
                // The record stays until the pod is gone (gc): a later snapshot finds what
                // was done and reported, and does nothing.
                self.pods.remove(&snap.uid);
            }
            Step::Shutdown(names) => {
                for name in names {
                    let Some(member) = snap.members.iter().find(|m| m.name == name) else {
                        continue;
                    };
                    let Some(id) = member.id.clone() else {
                        continue;
                    };
                    if completion::shutdown_restarts_all(&member.restart) {
                        if job.held_back.insert(id) {
                            warn!(event = "job_sidecar_left_running", pod = %snap.uid, container = %name, "not shut down: its exit would restart every container of the pod (a RestartAllContainers rule), running the Job's work again");
                        }
                        continue;
                    }
                    job.asked.insert(id.clone());
                    let action = shut_down(
                        Shutdown {
                            runtime: self.runtime.clone(),
                            dir: dir.clone(),
                            pod: snap.uid.clone(),
                            name: name.clone(),
                            id,
                            url: snap.urls.get(&name).cloned(),
                            grace: snap.grace,
                        },
                        Arc::clone(&self.stats),
                    );
                    tokio::spawn(action.instrument(tracing::info_span!(
                        "job_shutdown",
                        pod = %snap.uid,
                        container = %name
                    )));
                }
            }
        }
    }
}
