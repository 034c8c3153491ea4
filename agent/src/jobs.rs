//! Finished Jobs' sidecars, shut down (the rules are in [`completion`]).
//!
//! The decision loop sends a snapshot of a completing pod whenever the runtime or the API
//! server changes it; one task, off the decision path, reads exit codes, shuts sidecars down
//! (the entrypoint's `shutdown --post URL` run in the sidecar with CRI ExecSync, or CRI
//! StopContainer) and reports sidecars that exit with a failure status. Each shutdown that
//! took effect is written to the share (`jobs/<pod-uid>`, a directory no pod mounts), so an
//! agent restarted in between does not repeat it, and one that did not take effect (the agent
//! stopped before it) is done by the next agent.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tracing::{debug, info, warn, Instrument};

use crate::agent::Agent;
use crate::completion::{self, Completes, Member, Step};
use crate::decide::RunState;
use crate::facts;
use crate::recorder::{EventSink, PodRef, ShutdownNotice};
use crate::runtime::Runtime;
use crate::share::PodUid;
use crate::stats::Stats;
use crate::stoporder::StopOrder;

/// Where the shutdown records are, under the share.
pub const JOBS_DIR: &str = "jobs";
/// How long a sidecar's HTTP shutdown may take.
const HTTP_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an announced exit may take to show in the runtime's container status.
const EXIT_CODE_WAIT: Duration = Duration::from_secs(2);
/// A record lists container names; nothing valid is this large.
const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// One container of a completing pod's spec (its newest attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapMember {
    pub name: String,
    /// The runtime's id; `None` before the kubelet created it.
    pub id: Option<String>,
    pub priority: u8,
    pub state: RunState,
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
    pub urls: BTreeMap<String, String>,
}

/// The decision loop's side.
#[derive(Clone)]
pub struct JobLink {
    tx: mpsc::UnboundedSender<JobSnapshot>,
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
    asked: BTreeSet<String>,
    /// Exit codes read, by container id.
    codes: HashMap<String, i32>,
    /// Container ids whose exit was reported.
    reported: BTreeSet<String>,
}

pub struct JobsTask {
    rx: mpsc::UnboundedReceiver<JobSnapshot>,
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
        if let Err(e) = std::fs::create_dir_all(&self.dir) {
            warn!(dir = %self.dir.display(), error = %e, "cannot create the Job records' directory; shutdowns are not recorded");
        }
        while let Some(snap) = self.rx.recv().await {
            // Only the latest of a burst of snapshots of one pod matters.
            let mut latest: BTreeMap<PodUid, JobSnapshot> = BTreeMap::new();
            latest.insert(snap.uid.clone(), snap);
            while let Ok(s) = self.rx.try_recv() {
                latest.insert(s.uid.clone(), s);
            }
            for snap in latest.into_values() {
                self.handle(snap).await;
            }
        }
    }

    async fn handle(&mut self, snap: JobSnapshot) {
        let dir = self.dir.clone();
        let job = self.pods.entry(snap.uid.clone()).or_insert_with(|| PodJob {
            asked: load(&dir, &snap.uid),
            ..PodJob::default()
        });
        // Exit codes: of sidecars that were shut down (to report a failure), and of main
        // containers when only a success finishes the pod.
        for m in &snap.members {
            let Some(id) = m.id.as_deref() else { continue };
            let wanted = job.asked.contains(&m.name)
                || (snap.policy == Completes::OnFailure && m.priority == 0);
            if m.state == RunState::Exited && wanted && !job.codes.contains_key(id) {
                match exit_code(&self.runtime, id).await {
                    Ok(Some(code)) => {
                        job.codes.insert(id.to_owned(), code);
                    }
                    Ok(None) => {
                        warn!(pod = %snap.uid, container = %m.name, "the runtime has no exit code for an exited container yet; asking again at the next change");
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
            if !job.asked.contains(&m.name) || job.reported.contains(id) {
                continue;
            }
            job.reported.insert(id.to_owned());
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
        let members: Vec<Member> = snap
            .members
            .iter()
            .map(|m| Member {
                name: m.name.clone(),
                priority: m.priority,
                state: m.state,
                exit_code: m.id.as_ref().and_then(|id| job.codes.get(id).copied()),
            })
            .collect();
        match completion::next_step(snap.policy, &members, &job.asked) {
            Step::Wait | Step::ReadExitCodes(_) => {}
            Step::Done => {
                if !job.asked.is_empty() {
                    info!(event = "job_completed", pod = %snap.uid, "every sidecar of the finished Job has exited");
                    remove(&dir, &snap.uid);
                }
                // Nothing is kept: a later snapshot finds no record, so nothing to do.
                self.pods.remove(&snap.uid);
            }
            Step::Shutdown(names) => {
                job.asked.extend(names.iter().cloned());
                for name in names {
                    let Some(id) = snap
                        .members
                        .iter()
                        .find(|m| m.name == name)
                        .and_then(|m| m.id.clone())
                    else {
                        continue;
                    };
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

/// The exit code of a container whose exit the runtime has announced. containerd's CRI
/// status says "exited" a little after its exit event: asked again for a short while.
async fn exit_code(
    runtime: &Runtime,
    id: &str,
) -> Result<Option<i32>, crate::runtime::RuntimeError> {
    let deadline = tokio::time::Instant::now() + EXIT_CODE_WAIT;
    loop {
        match runtime.exit_code(id).await? {
            Some(code) => return Ok(Some(code)),
            None if tokio::time::Instant::now() >= deadline => return Ok(None),
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

fn how(urls: &BTreeMap<String, String>, name: &str) -> String {
    match urls.get(name) {
        Some(url) => format!("HTTP shutdown {url}"),
        None => "StopContainer".to_owned(),
    }
}

/// One sidecar to shut down.
struct Shutdown {
    runtime: Runtime,
    dir: PathBuf,
    pod: PodUid,
    name: String,
    id: String,
    url: Option<String>,
    grace: Duration,
}

/// One sidecar's shutdown: its HTTP endpoint through the entrypoint in the sidecar (distroless
/// images have no client of their own), else, or when that fails, the runtime's stop. Recorded
/// once it took effect: an agent that stops before that leaves it to its successor.
async fn shut_down(s: Shutdown, stats: Arc<Stats>) {
    let (pod, name) = (&s.pod, &s.name);
    if let Some(url) = &s.url {
        let cmd = vec![
            exitorder_contract::mount::ENTRYPOINT.to_owned(),
            "shutdown".to_owned(),
            "--post".to_owned(),
            url.clone(),
        ];
        match s.runtime.exec_sync(&s.id, cmd, HTTP_SHUTDOWN_TIMEOUT).await {
            Ok((0, _)) => {
                record_done(&s.dir, pod, name, &stats);
                info!(event = "job_shutdown", pod = %pod, container = %name, how = "http", url = %url, "sidecar asked to shut down: the Job's main containers have finished");
                return;
            }
            Ok((code, out)) => {
                warn!(pod = %pod, container = %name, url = %url, exit_code = code, output = %out, "HTTP shutdown failed; stopping the sidecar through the runtime");
            }
            Err(e) => {
                stats.runtime_error(e.kind());
                warn!(pod = %pod, container = %name, url = %url, error = %e, "HTTP shutdown could not run; stopping the sidecar through the runtime");
            }
        }
    }
    // Recorded first: StopContainer returns only once the sidecar has stopped, and the
    // runtime finishes a stop it accepted whether or not the agent is still there.
    record_done(&s.dir, pod, name, &stats);
    info!(event = "job_shutdown", pod = %pod, container = %name, how = "stop", grace_seconds = s.grace.as_secs(), "stopping the sidecar: the Job's main containers have finished");
    if let Err(e) = s.runtime.stop_container(&s.id, s.grace).await {
        stats.runtime_error(e.kind());
        warn!(pod = %pod, container = %name, error = %e, "cannot stop the sidecar");
    }
}

fn record(dir: &Path, pod: &PodUid) -> PathBuf {
    dir.join(pod.as_str())
}

/// The sidecars already shut down, as recorded.
fn load(dir: &Path, pod: &PodUid) -> BTreeSet<String> {
    let path = record(dir, pod);
    let Ok(meta) = std::fs::symlink_metadata(&path) else {
        return BTreeSet::new();
    };
    if !meta.is_file() || meta.len() > MAX_RECORD_BYTES {
        warn!(file = %path.display(), "ignoring a Job record that is not a small regular file");
        return BTreeSet::new();
    }
    std::fs::read_to_string(&path)
        .map(|text| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Adds a sidecar to the pod's record: one short line appended (`O_APPEND`: the shutdowns of
/// one level, in their own tasks, never interleave), synced before the caller goes on.
fn record_done(dir: &Path, pod: &PodUid, name: &str, stats: &Stats) {
    let res = std::fs::create_dir_all(dir).and_then(|()| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(record(dir, pod))?;
        f.write_all(format!("{name}\n").as_bytes())?;
        f.sync_data()
    });
    if let Err(e) = res {
        stats.share_error();
        warn!(pod = %pod, container = %name, error = %e, "cannot record the Job's shutdown; an agent restarted now would repeat it");
    }
}

fn remove(dir: &Path, pod: &PodUid) {
    let _ = std::fs::remove_file(record(dir, pod));
}

/// Records of pods the runtime no longer has (deleted before their Job finished).
pub fn stale_records(share_dir: &Path, live: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(share_dir.join(JOBS_DIR)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            PodUid::parse(&name).is_ok() && !live(&name)
        })
        .map(|e| e.path())
        .collect()
}

impl Agent {
    /// Hands the Job task the latest state of pod `uid`, when it is a completing pod that
    /// opted in. Needs the API server: the restart policy and which containers are main
    /// containers are in the pod's spec only.
    pub(crate) fn job_check(&mut self, uid: &str) {
        let Some(link) = self.jobs.as_ref() else {
            return;
        };
        let Ok(pod) = PodUid::parse(uid) else {
            return;
        };
        let Some(api) = self.api_pod(&pod) else {
            return;
        };
        let Some(policy) = completion::completes(api.restart_policy.as_deref(), &api.annotations)
        else {
            return;
        };
        if api.deleting {
            // A deletion stops every container; its exits are ordered by the waits.
            return;
        }
        let Some(v) = self.view.pod(uid) else {
            return;
        };
        let stop = facts::stop_order(v, Some(&api.native_sidecars))
            .unwrap_or_else(|_| StopOrder::default());
        let ordered = facts::order(v, facts::pod_priorities(v, Some(&api.annotations)), &stop);
        if !ordered.unknown.is_empty() || ordered.malformed.is_some() {
            // Priorities not known yet (asked again once they are), or none that hold.
            debug!(pod = %pod, unknown = ?ordered.unknown, "completing pod: priorities not known yet");
            return;
        }
        let members = api
            .containers
            .iter()
            .map(|name| {
                let newest = v
                    .containers
                    .values()
                    .filter(|c| &c.info.name == name)
                    .max_by_key(|c| (c.info.attempt, c.info.created_at));
                let priority = ordered
                    .attempts
                    .iter()
                    .find(|a| &a.name == name)
                    .map_or(0, |a| a.priority);
                SnapMember {
                    name: name.clone(),
                    id: newest.map(|c| c.info.id.clone()),
                    priority,
                    state: newest.map_or(RunState::Created, |c| c.info.state),
                }
            })
            .collect();
        let (urls, bad) = completion::shutdown_urls(&api.annotations);
        if let Some(bad) = bad {
            let key = format!("job: {bad}");
            if self.warned.insert((pod.clone(), key)) {
                warn!(pod = %pod, problem = %bad, "sidecars without a valid shutdown URL are stopped through the runtime");
            }
        }
        let snap = JobSnapshot {
            uid: pod,
            pod: PodRef {
                namespace: api.namespace.clone(),
                name: api.name.clone(),
                uid: api.uid.clone(),
            },
            policy,
            grace: api.grace().unwrap_or(facts::DEFAULT_GRACE),
            members,
            urls,
        };
        debug!(pod = %snap.uid, members = ?snap.members, "completing pod: snapshot");
        let _ = link.tx.send(snap);
    }
}
