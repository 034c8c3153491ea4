//! The table printed before the JSON line: every row of the report, for people.

use std::fmt::Write as _;

use super::super::measure::Tally;
use super::super::returns::ReturnAnomalies;
use super::Report;

/// `key value` pairs, comma-separated.
fn counts<V: std::fmt::Display>(m: &std::collections::BTreeMap<String, V>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

/// "0", or the non-zero counts with what they count.
fn listed(counts: &[(&str, usize)]) -> String {
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{n} {what}"))
        .collect();
    if parts.is_empty() {
        "0".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The anomalies, and the allows ahead of the test bed's clock (not anomalies: the kernel told
/// the agent first).
fn with_ahead(anomalies: String, ahead: usize) -> String {
    if ahead == 0 {
        anomalies
    } else {
        format!("{anomalies} ({ahead} ahead of the test bed's exit stamp, as 0 ms)")
    }
}

/// Every deletion that gave no delay, by where it counted.
fn anomalies(t: &Tally) -> String {
    listed(&[
        ("by deadline", t.deadline),
        ("preStop never waited", t.prestop_never_waited),
        ("no allow (agent)", t.no_allow),
        ("other reason (agent)", t.other_reason),
        ("allow before exit (agent)", t.allow_before_exit),
        ("no exit time", t.no_exit_time),
        ("deletion failed", t.deletion_failed),
    ])
}

fn return_anomalies(a: &ReturnAnomalies) -> String {
    listed(&[
        ("never waited", a.not_posted),
        ("failed or stuck", a.failed),
        ("returned before the write began", a.returned_before_answer),
    ])
}

impl Report {
    /// The table printed before the JSON line.
    pub fn table(&self) -> String {
        let s = &self.settings;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "exitorder bench on {} ({} CPUs), {:.0} s",
            self.runtime, self.cpus, self.total_seconds
        );
        let _ = writeln!(
            t,
            "CPU: {}",
            self.cpu_weights
                .as_deref()
                .unwrap_or("every process weighs the same (no cpu cgroup controller)")
        );
        if let Some(d) = &self.detect_to_allow {
            let _ = writeln!(
                t,
                "\nApp exit (the app's own stamp, just before it exits) -> allow written{}. {} pod deletions per source, \
                 in batches of {} (deletions {} ms apart, each batch after a random pause of up \
                 to one baseline scan, {} ms); each pod: app (drains {} ms after TERM) + proxy (priority 1, preStop \
                 exitorder-entrypoint wait), grace {} s.",
                if s.busy {
                    ", on a busy node (a disk writer syncing 256 MiB in a loop, a CPU hog per core)"
                } else {
                    ""
                },
                s.deletions,
                s.batch,
                s.stagger_ms,
                s.kruise_scan_ms,
                s.app_drain_ms,
                s.pod_grace_seconds
            );
            let _ = writeln!(
                t,
                "  {:<42} {:>9} {:>9} {:>9} {:>15} {:>8} {:>6}  anomalies",
                "source", "p50 ms", "p99 ms", "max ms", "agent p50/p99", "samples", "late"
            );
            for (label, r) in [
                ("exitorder, containerd events", &d.containerd_events),
                (
                    "  the same, exit dirs in the pod's tmpfs",
                    &d.containerd_events_pod_local,
                ),
                (
                    &*format!("exitorder, polling every {} ms", s.agent_poll_interval_ms),
                    &d.poll,
                ),
                (
                    &*format!(
                        "Kruise-proposal daemon (scan every {} ms)",
                        s.kruise_scan_ms
                    ),
                    &d.kruise_daemon,
                ),
            ] {
                let _ = writeln!(
                    t,
                    "  {:<42} {:>9} {:>9} {:>9} {:>15} {:>8} {:>6}  {}",
                    label,
                    ms(r.detect_to_allow_p50_ms),
                    ms(r.detect_to_allow_p99_ms),
                    ms(r.detect_to_allow_max_ms),
                    format!("{}/{}", ms(r.agent_part_p50_ms), ms(r.agent_part_p99_ms)),
                    r.samples,
                    r.late_waits,
                    with_ahead(anomalies(&r.tally), r.ahead_of_clock)
                );
            }
            for (label, r) in [
                ("containerd events", &d.containerd_events),
                ("events, pod's tmpfs", &d.containerd_events_pod_local),
                ("polling", &d.poll),
            ] {
                let told: Vec<String> = r
                    .exit_told_by
                    .iter()
                    .map(|(by, n)| format!("{by} {n}"))
                    .collect();
                let _ = writeln!(
                    t,
                    "  exit told first by ({label}): {}",
                    if told.is_empty() {
                        "-".to_owned()
                    } else {
                        told.join(", ")
                    }
                );
                if let Some(stages) = &r.stages {
                    let _ = writeln!(t, "  where the time goes ({label}): {}", stages.line());
                }
                if let Some(floor) = &r.floor {
                    let _ = writeln!(t, "  the machine's own floor ({label}): {}", floor.line());
                }
            }
            let _ = writeln!(
                t,
                "  (agent: its own part, from the later of the exit file and the runtime's \
                 report of the exit to allow; the rest is the runtime's delivery. late: \
                 counted allows whose wait began after the app had exited)"
            );
        }
        if let Some(r) = &self.allow_to_return {
            let _ = writeln!(
                t,
                "\nAllow written (as the agent writes it) -> waiter returned, host processes; \
                 {} runs each; the 1 s pollers {} at once, each answered at a random point of \
                 its period.",
                s.returns, s.poller_batch
            );
            let _ = writeln!(
                t,
                "  {:<42} {:>9} {:>9} {:>9} {:>8}  anomalies",
                "waiter", "p50 ms", "p99 ms", "max ms", "samples"
            );
            for row in [&r.entrypoint, &r.sh_poll] {
                let _ = writeln!(
                    t,
                    "  {:<42} {:>9} {:>9} {:>9} {:>8}  {}",
                    row.waiter,
                    ms(row.allow_to_return_p50_ms),
                    ms(row.allow_to_return_p99_ms),
                    ms(row.allow_to_return_max_ms),
                    row.samples,
                    return_anomalies(&row.anomalies)
                );
            }
        }
        if self.agent_idle.is_some() || self.agent_burst.is_some() {
            let _ = writeln!(
                t,
                "\nAgent process (containerd events source): RSS now and peak (VmHWM since \
                 start), CPU (utime+stime) during the phase."
            );
            let _ = writeln!(
                t,
                "  {:<42} {:>9} {:>9} {:>9} {:>11} {:>8}",
                "phase", "RSS MiB", "peak MiB", "CPU s", "CPU wait s", "wall s"
            );
        }
        if let Some(i) = &self.agent_idle {
            let _ = writeln!(
                t,
                "  {:<42} {:>9.2} {:>9.2} {:>9.3} {:>11.3} {:>8.1}",
                format!("idle, {} opted-in pods running", i.pods),
                i.rss_mib,
                i.peak_rss_mib,
                i.cpu_seconds,
                i.cpu_wait_seconds,
                i.seconds
            );
        }
        if let Some(b) = &self.agent_burst {
            let _ = writeln!(
                t,
                "  {:<42} {:>9.2} {:>9.2} {:>9.3} {:>11.3} {:>8.1}",
                format!("deleting {} pods at once", b.pods_deleted),
                b.rss_mib,
                b.peak_rss_mib,
                b.cpu_seconds,
                b.cpu_wait_seconds,
                b.seconds
            );
            let _ = writeln!(
                t,
                "  burst: {} pods asked, {} started, {} deleted; latest allow {} ms after its \
                 app's exit (p50 {}, p99 {}; agent's part p50 {}, p99 {}; {} samples, {} \
                 late); anomalies: {}",
                b.pods_asked,
                b.pods_started,
                b.pods_deleted,
                ms(b.latest_allow_after_trigger_ms),
                ms(b.detect_to_allow_p50_ms),
                ms(b.detect_to_allow_p99_ms),
                ms(b.agent_part_p50_ms),
                ms(b.agent_part_p99_ms),
                b.samples,
                b.late_waits,
                anomalies(&b.tally)
            );
            for (why, n) in &b.tally.never_waited {
                let _ = writeln!(t, "  preStop never waited ({n}): {why}");
            }
            let _ = writeln!(
                t,
                "  runtime meanwhile: ListContainers p50 {} ms, max {} ms",
                ms(b.runtime_list_p50_ms),
                ms(b.runtime_list_max_ms)
            );
        }
        if let Some(w) = &self.webhook {
            let _ = writeln!(
                t,
                "\nAdmission webhook: {} reviews of the example pods over HTTPS, one after another \
                 on one kept-alive connection.\n  review p50 {} ms, p99 {} ms, max {} ms; {} \
                 patched, {} unchanged, {} denied; webhook RSS {:.2} MiB, CPU {:.3} s",
                w.reviews,
                ms(w.review_p50_ms),
                ms(w.review_p99_ms),
                ms(w.review_max_ms),
                w.patched,
                w.unchanged,
                w.denied,
                w.rss_mib,
                w.cpu_seconds
            );
        }
        if let Some(tr) = &self.traffic {
            t.push_str(&tr.table());
        }
        if let Some(k) = &self.kill_skew {
            t.push_str(&k.table());
        }
        if let Some(c) = &self.agent_churn {
            let _ = writeln!(
                t,
                "\nChurn: {} pods (app + proxy, priority 1, preStop wait) created, started and \
                 deleted the kubelet's way, {} at a time, with the agent watching (containerd \
                 events, default settings).\n  {} cycled in {:.1} s ({:.1} pods/s), {} failed{}; \
                 agent RSS start {:.2} MiB, peak {:.2} (high water {:.2}), end {:.2}; slope {} \
                 KiB per 1,000 pods ({} over the second half); CPU {:.2} s\n  proxies allowed: {}",
                c.pods_asked,
                c.concurrency,
                c.pods_cycled,
                c.seconds,
                c.pods_per_second,
                c.failures,
                c.first_failure
                    .as_deref()
                    .map_or_else(String::new, |e| format!(" (first: {e})")),
                c.rss_start_mib,
                c.rss_peak_mib,
                c.rss_high_water_mib,
                c.rss_end_mib,
                ms(c.rss_slope_kib_per_1000_pods),
                ms(c.rss_slope_second_half_kib_per_1000_pods),
                c.cpu_seconds,
                counts(&c.allows)
            );
            let _ = writeln!(
                t,
                "  RSS MiB by pods cycled: {}",
                c.samples
                    .iter()
                    .map(|s| format!("{} {:.2}", s.pods, s.rss_mib))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let _ = writeln!(
                t,
                "  the agent held at the end: {}",
                counts(&c.agent_state_at_end)
            );
        }
        t
    }
}
