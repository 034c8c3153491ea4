//! The answers carried out: `allow` written in place, logged with where its time went,
//! counted, and told as a Kubernetes Event; a write that fails is tried again.

use std::time::{Duration, Instant, SystemTime};

use tracing::{debug, info, warn};

use crate::agent::Agent;
use crate::backoff::Backoff;
use crate::cluster::recorder::{ExitNotice, PodRef};
use crate::decide::bounds::Later as _;
use crate::decide::Reason;
use crate::handshake::share::ExitKey;
use crate::kubelet::kills::{Kill, PodKill};

/// A failed write of `allow` is tried again after this, doubling up to the cap: soon enough
/// that freed space answers the preStop at once, rare enough not to spin on a full disk.
const WRITE_RETRY_START: Duration = Duration::from_millis(100);
const WRITE_RETRY_MAX: Duration = Duration::from_secs(2);

impl Agent {
    /// Writes `allow`; `tell` (what still ran) asks for a Kubernetes Event about it.
    pub(super) fn allow(
        &mut self,
        key: &ExitKey,
        reason: Reason,
        tell: Option<Vec<String>>,
        names: Option<(String, String)>,
    ) {
        let Some(since) = self
            .waits
            .pending
            .get(&key.pod)
            .and_then(|p| p.waiting.get(&key.container))
            .map(|w| w.since)
        else {
            return;
        };
        let waited = since.elapsed();
        // The agent's own share of the delay: from the later of the exit file and the last
        // exit the runtime reported in the pod, to the answer.
        let last = self.view.pod(&key.pod).and_then(|p| {
            p.containers
                .values()
                .filter_map(|c| {
                    c.exit_seen
                        .map(|at| (at, c.exit_by_kernel.then_some(c.kernel_exit).flatten()))
                })
                .max_by_key(|(at, _)| *at)
        });
        let heard = last.map_or(since, |(e, _)| e.max(since));
        // Which source told the view of that exit first; when the kernel did, the moment the
        // loop woke for it, before the view took it in.
        let (told_by, kernel_woke) = match last {
            None => ("none", None),
            Some((_, Some(woke))) => ("kernel", Some(woke)),
            Some((_, None)) => ("runtime", None),
        };
        let writing = Instant::now();
        let written = match self.place(key.place) {
            Some(share) => share.write_allow(key),
            // The place is no longer served (the kubelet's root went): nothing to answer in.
            None => return,
        };
        // Both up to `allow` in place (renamed), the second the write alone.
        let decided = heard.elapsed();
        let write = writing.elapsed();
        // Only when the decision rests on the kernel's word: from the loop's wake by the kernel
        // to `allow` in place (`decided_us` and this apart: the exit taken into the view).
        let kernel_us = kernel_woke
            .filter(|_| heard > since)
            .map(|w| w.elapsed().as_micros() as u64);
        match written {
            Ok(()) => {
                self.stats.allowed(reason, waited);
                let (kill, evidence) = self.waits.pending.get(&key.pod).map_or(
                    (Kill::Pod(PodKill::Unknown), "none"),
                    |p| {
                        let c = key.container.as_str();
                        (
                            p.confirm.kill_of(c, reason),
                            p.confirm.evidence_of(c, reason),
                        )
                    },
                );
                self.stats.allowed_in(kill);
                info!(
                    event = "allow",
                    pod = %key.pod,
                    container = %key.container,
                    reason = %reason,
                    kill = %kill,
                    evidence,
                    waited_ms = waited.as_millis() as u64,
                    waited_us = waited.as_micros() as u64,
                    decided_us = decided.as_micros() as u64,
                    write_us = write.as_micros() as u64,
                    exit_told_by = told_by,
                    kernel_us,
                    "exit allowed"
                );
                if let (Some(still_running), Some(names)) = (tell, names) {
                    self.tell(key, reason, waited, still_running, (kill, evidence), names);
                }
            }
            Err(e) if e.is_not_found() => debug!(container = %key, "container directory gone"),
            // Nobody behind this wait (the container or its pod is gone): nothing to retry.
            Err(e) if reason == Reason::Unknown => {
                self.stats.share_error();
                warn!(container = %key, error = %e, "cannot write allow for a container that is gone");
            }
            Err(e) => {
                // A full disk or a read-only remount passes; the preStop still waits for its
                // answer (until its own timeout), so the wait stays and is answered again.
                self.stats.share_error();
                if let Some(p) = self.waits.pending.get_mut(&key.pod) {
                    let Some(w) = p.waiting.get_mut(&key.container) else {
                        return;
                    };
                    w.write_failures = w.write_failures.saturating_add(1);
                    let delay =
                        Backoff::after(WRITE_RETRY_START, WRITE_RETRY_MAX, w.write_failures);
                    let at = Instant::now().later(delay);
                    w.retry_at = Some(at);
                    // Said at the 1st, 2nd, 4th, 8th... failure: a disk that stays full must
                    // not fill the log every two seconds per wait.
                    if w.write_failures.is_power_of_two() {
                        warn!(
                            event = "allow_failed",
                            pod = %key.pod,
                            container = %key.container,
                            error = %e,
                            failures = w.write_failures,
                            retry_in_ms = delay.as_millis() as u64,
                            "cannot write allow; trying again"
                        );
                    }
                    p.wake = Some(p.wake.map_or(at, |t| t.min(at)));
                    return;
                }
            }
        }
        self.waits.drop_waiter(key);
    }

    /// Queues a Kubernetes Event about an allow, when there is an API server.
    fn tell(
        &self,
        key: &ExitKey,
        reason: Reason,
        waited: Duration,
        still_running: Vec<String>,
        (kill, evidence): (Kill, &'static str),
        (namespace, name): (String, String),
    ) {
        let Some(sink) = &self.api.events else {
            return;
        };
        sink.emit(ExitNotice {
            pod: PodRef {
                namespace,
                name,
                uid: key.pod.clone(),
            },
            container: key.container.as_str().to_owned(),
            reason,
            waited,
            still_running,
            kill,
            evidence,
            at: SystemTime::now(),
        });
    }
}
