//! The exits in the demo's timeline as the kernel told them. The runtime stamps a container's
//! `finished_at` after its shim reaped the process and did its bookkeeping, while the agent
//! acts on the kernel's word (a pidfd): timed by the runtime's stamp, an allow could read as
//! written before the exit it followed. The demo awaits each container's first process on a
//! pidfd of its own, as the benchmark does, and puts that moment in the timeline, with the
//! runtime's stamp beside it where they differ.

use crate::bench::kernelclock::KernelClock;
use crate::kubelet::{Deletion, RunningPod, Timeline, What};
use crate::node::Node;

/// Below this the two stamps say the same thing to a reader of milliseconds.
const SAME_MS: i64 = 1;

/// A clock on every running container of `running`; `None` where the kernel has no pidfds.
pub(super) async fn watch(node: &Node, running: &RunningPod) -> Option<KernelClock> {
    let mut clock = KernelClock::start();
    if !clock.available() {
        return None;
    }
    let status = running.status();
    let ids: Vec<String> = running
        .plan()
        .all()
        .filter_map(|c| status.container(&c.name).and_then(|s| s.id.clone()))
        .collect();
    for id in ids {
        clock.watch(node, &id).await;
    }
    Some(clock)
}

/// Each container's last exit in `timeline` moved to when the kernel said it ended, the
/// runtime's stamp said beside it; the deletion's records (what the verdict reads) get the
/// kernel's time too, so the timeline and the verdict read one clock.
pub(super) fn restamp(timeline: &mut Timeline, d: &mut Deletion, clock: &KernelClock) {
    for r in &mut d.containers {
        if let Some(at) = clock.stamp(&r.id) {
            r.finished_at_ns = at;
            move_exit(timeline, &r.name, at);
        }
    }
}

/// `name`'s last exit in `timeline` moved to `kernel_ns` (Unix ns), when its process ended.
fn move_exit(timeline: &mut Timeline, name: &str, kernel_ns: i64) {
    let last_exit = timeline
        .events
        .iter_mut()
        .filter(|e| e.container.as_deref() == Some(name) && matches!(e.what, What::Exited { .. }))
        .max_by_key(|e| e.at_ns);
    let Some(event) = last_exit else { return };
    let later_ms = (event.at_ns - kernel_ns) / 1_000_000;
    if later_ms.abs() < SAME_MS {
        return;
    }
    event.at_ns = kernel_ns;
    if let What::Exited { reason, .. } = &mut event.what {
        let said = if later_ms > 0 {
            format!("the kernel's time; the runtime stamped it {later_ms} ms later")
        } else {
            format!(
                "the kernel's time; the runtime stamped it {} ms earlier",
                -later_ms
            )
        };
        *reason = if reason.is_empty() {
            said
        } else {
            format!("{reason}; {said}")
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn exited(reason: &str) -> What {
        What::Exited {
            attempt: 0,
            exit_code: 0,
            reason: reason.into(),
        }
    }

    #[test]
    fn an_exit_is_shown_at_the_kernels_time_with_the_runtimes_beside() {
        let mut t = Timeline::default();
        t.push(100 * MS, Some("app"), exited("Error"));
        t.push(2_000 * MS, Some("app"), exited("Completed"));
        t.push(2_010 * MS, Some("proxy"), exited("Completed"));
        t.push(
            2_001 * MS,
            Some("proxy"),
            What::Allowed {
                reason: "ordered".into(),
            },
        );
        move_exit(&mut t, "app", 1_998 * MS);
        move_exit(&mut t, "proxy", 2_010 * MS - 1);
        let app: Vec<(i64, String)> = t
            .events
            .iter()
            .filter(|e| e.container.as_deref() == Some("app"))
            .map(|e| (e.at_ns / MS, e.what.to_string()))
            .collect();
        assert_eq!(
            app,
            [
                (100, "exited with 0 (Error)".to_owned()),
                (
                    1_998,
                    "exited with 0 (Completed; the kernel's time; the runtime stamped it 2 ms later)"
                        .to_owned()
                ),
            ],
            "only the last attempt's exit moves"
        );
        let proxy = t.last("proxy", |w| matches!(w, What::Exited { .. }));
        assert_eq!(
            proxy.map(|e| (e.at_ns, e.what.to_string())),
            Some((2_010 * MS, "exited with 0 (Completed)".to_owned())),
            "within a millisecond the runtime's stamp stays"
        );
    }
}
