//! `allow` written -> waiter returned, for waiters run as host processes: each waits in its
//! own share directory, the benchmark answers the way the agent does (the share's temp file
//! and rename) and a thread blocked in `wait()` times the process's end.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exitorder::handshake::share::{ContainerName, ExitKey, Share, ShareError, EXIT_FILE, WAIT};
use exitorder::pod::PodUid;

/// How long a waiter may take to post its `exit` file.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a waiter may take to return after `allow` before it counts as stuck.
const RETURN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ReturnsError {
    #[error(transparent)]
    Share(#[from] ShareError),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Tells [`measure`] to stop before its next batch.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// A guard that cancels when dropped.
    pub fn on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }
}

pub struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Runs that give no delay, by why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReturnAnomalies {
    /// The waiter never said `wait` (it failed to start or ended first).
    pub not_posted: usize,
    /// It failed, or did not return within 10 s of the answer.
    pub failed: usize,
    /// Its end was seen before the answer's write began: a clock or bench error, never the
    /// waiter's.
    pub returned_before_answer: usize,
}

impl ReturnAnomalies {
    pub fn total(&self) -> usize {
        self.not_posted + self.failed + self.returned_before_answer
    }
}

/// The delays of one kind of waiter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Returns {
    pub runs: usize,
    pub delays_ms: Vec<f64>,
    pub anomalies: ReturnAnomalies,
}

/// A waiter process with a thread blocked in its `wait()`. Dropped unfinished, the process is
/// killed, so an error part-way through a batch leaves nothing waiting forever.
struct Waiter {
    key: ExitKey,
    dir: PathBuf,
    pid: u32,
    ended: Option<JoinHandle<(Instant, std::io::Result<ExitStatus>)>>,
}

impl Waiter {
    fn start(share: &Share, command: &dyn Fn(&Path) -> Command) -> Result<Waiter, ReturnsError> {
        let key = ExitKey {
            pod: PodUid::parse(&crate::node::random_uuid()).map_err(ShareError::from)?,
            container: ContainerName::parse("proxy")?,
            place: exitorder::handshake::share::Place::Share,
        };
        let dir = share.container_path(&key);
        std::fs::create_dir_all(&dir).map_err(|source| ReturnsError::Io {
            op: "create",
            path: dir.clone(),
            source,
        })?;
        let mut cmd = command(&dir);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| ReturnsError::Io {
                op: "start",
                path: PathBuf::from(cmd.get_program()),
                source,
            })?;
        let pid = child.id();
        let mut waiter = Waiter {
            key,
            dir,
            pid,
            ended: None,
        };
        let ended = std::thread::Builder::new()
            .name("exitorder-bench-waiter".to_owned())
            .spawn(move || {
                let status = child.wait();
                (Instant::now(), status)
            })
            .map_err(|source| {
                // Without its thread the process would wait forever; unreaped, its pid is
                // still its own to kill.
                kill(pid);
                ReturnsError::Io {
                    op: "start a waiter thread for",
                    path: waiter.dir.clone(),
                    source,
                }
            });
        waiter.ended = Some(ended?);
        Ok(waiter)
    }

    fn has_ended(&self) -> bool {
        self.ended.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Whether `exit` says `wait`, within [`POST_TIMEOUT`]; false when the process ended.
    fn posted(&self) -> bool {
        let file = self.dir.join(EXIT_FILE);
        let deadline = Instant::now() + POST_TIMEOUT;
        while Instant::now() < deadline && !self.has_ended() {
            if std::fs::read_to_string(&file).is_ok_and(|s| s.trim() == WAIT) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// When the process returned and whether it did so successfully and in time; it is
    /// killed when it has not returned within [`RETURN_TIMEOUT`].
    fn finish(&mut self) -> Option<(Instant, bool)> {
        let deadline = Instant::now() + RETURN_TIMEOUT;
        while !self.has_ended() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let in_time = self.has_ended();
        if !in_time {
            kill(self.pid);
        }
        let (at, status) = self.ended.take()?.join().ok()?;
        Some((at, in_time && status.is_ok_and(|s| s.success())))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(ended) = self.ended.take() {
            if !ended.is_finished() {
                kill(self.pid);
            }
            let _ = ended.join();
        }
    }
}

/// SIGKILL to a child whose waiter thread has not reaped it, so its pid cannot have been
/// reused.
fn kill(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Runs `runs` waiters, `batch` at once, each made by `command(dir)`. Each is answered at a
/// random moment within `spread` after it posted its wait: a poller's answer comes at any
/// point of its period, not just as it starts to sleep (which would always cost a whole
/// period).
pub fn measure(
    share: &Share,
    cancel: &Cancel,
    runs: usize,
    batch: usize,
    spread: Duration,
    command: impl Fn(&Path) -> Command,
) -> Result<Returns, ReturnsError> {
    let mut out = Returns {
        runs,
        ..Returns::default()
    };
    let mut left = runs;
    while left > 0 && !cancel.cancelled() {
        let n = left.min(batch.max(1));
        left -= n;
        let mut waiters = Vec::with_capacity(n);
        for _ in 0..n {
            waiters.push(Waiter::start(share, &command)?);
        }
        let mut posted = Vec::with_capacity(n);
        for w in waiters {
            if w.posted() {
                let answer_at = Instant::now() + spread.mul_f64(super::random_fraction());
                posted.push((w, answer_at));
            } else {
                out.anomalies.not_posted += 1;
                let _ = share.remove_pod(
                    &w.key.pod,
                    &mut exitorder::handshake::share::Budget::new(u64::MAX),
                );
            }
        }
        posted.sort_by_key(|(_, at)| *at);
        let mut answered = Vec::with_capacity(posted.len());
        for (w, answer_at) in posted {
            std::thread::sleep(answer_at.saturating_duration_since(Instant::now()));
            // Timed before the write: the answer exists from the rename inside it, so no
            // waiter can return earlier (the delay includes the rename, a few microseconds).
            let writing = Instant::now();
            share.write_allow(&w.key)?;
            answered.push((w, writing));
        }
        for (mut w, allowed) in answered {
            match w.finish() {
                Some((returned, true)) if returned >= allowed => out
                    .delays_ms
                    .push(returned.duration_since(allowed).as_secs_f64() * 1e3),
                Some((_, true)) => out.anomalies.returned_before_answer += 1,
                _ => out.anomalies.failed += 1,
            }
            let _ = share.remove_pod(
                &w.key.pod,
                &mut exitorder::handshake::share::Budget::new(u64::MAX),
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poller(period: &'static str) -> impl Fn(&Path) -> Command {
        move |dir| {
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c")
                .arg(format!(
                    r#"echo wait > exit; while [ "$(cat exit)" != allow ]; do sleep {period}; done"#
                ))
                .current_dir(dir);
            cmd
        }
    }

    #[test]
    fn times_waiters_answered_through_the_share() {
        let tmp = tempfile::tempdir().unwrap();
        let share = Share::open(tmp.path()).unwrap();
        let out = measure(
            &share,
            &Cancel::default(),
            5,
            2,
            Duration::from_millis(20),
            poller("0.01"),
        )
        .unwrap();
        assert_eq!(out.runs, 5);
        assert_eq!(out.anomalies.total(), 0, "{out:?}");
        assert_eq!(out.delays_ms.len(), 5);
        assert!(
            out.delays_ms.iter().all(|d| (0.0..5000.0).contains(d)),
            "{out:?}"
        );
        // Every waiter's directory is gone again.
        assert!(share.pods().unwrap().is_empty());
    }

    #[test]
    fn a_waiter_that_never_posts_is_an_anomaly() {
        let tmp = tempfile::tempdir().unwrap();
        let share = Share::open(tmp.path()).unwrap();
        let out = measure(&share, &Cancel::default(), 1, 1, Duration::ZERO, |dir| {
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c").arg("exit 3").current_dir(dir);
            cmd
        })
        .unwrap();
        assert_eq!(out.delays_ms.len(), 0);
        assert_eq!(
            out.anomalies,
            ReturnAnomalies {
                not_posted: 1,
                ..ReturnAnomalies::default()
            }
        );
    }

    #[test]
    fn a_cancelled_run_starts_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let share = Share::open(tmp.path()).unwrap();
        let cancel = Cancel::default();
        drop(cancel.on_drop());
        let out = measure(&share, &cancel, 3, 1, Duration::ZERO, poller("0.01")).unwrap();
        assert!(out.delays_ms.is_empty() && out.anomalies.total() == 0);
    }
}
