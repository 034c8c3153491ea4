//! The benchmark's result: a table for people, one JSON object for tools.
//!
//! Parts:
//! - `table`: the table for people, every row of the report.

use std::collections::BTreeMap;

use serde::Serialize;

use super::measure::{Outcome, Tally};
use super::returns::{ReturnAnomalies, Returns};
use super::summary::{figures, round3};

/// What the run was asked to do and how, so the figures can be read and reproduced.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub deletions: usize,
    pub batch: usize,
    pub stagger_ms: u64,
    pub app_drain_ms: u64,
    pub pod_grace_seconds: u64,
    pub agent_poll_interval_ms: u64,
    pub kruise_scan_ms: u64,
    pub returns: usize,
    pub poller_batch: usize,
    pub idle_seconds: f64,
    pub idle_pods: usize,
    pub burst_pods: usize,
    pub start_concurrency: usize,
    pub reviews: usize,
    pub churn_pods: usize,
    pub churn_concurrency: usize,
    pub churn_sample_every: usize,
    /// Measured beside a disk writer with fdatasync and a CPU hog per core (`--busy`).
    pub busy: bool,
}

/// Exit of the app -> `allow` written, for one way of detecting it.
#[derive(Debug, Clone, Serialize)]
pub struct DetectRow {
    /// What detected the exits (as the agent reported it, for the agent).
    pub source: String,
    pub deletions: usize,
    pub samples: usize,
    pub detect_to_allow_p50_ms: Option<f64>,
    pub detect_to_allow_p99_ms: Option<f64>,
    pub detect_to_allow_max_ms: Option<f64>,
    /// Of each ordered allow, the agent's own part: from the later of the exit file and the
    /// runtime's report of the exit, to `allow` (the rest is the runtime's event delivery).
    /// None for the baseline daemon, which does not say.
    pub agent_part_p50_ms: Option<f64>,
    pub agent_part_p99_ms: Option<f64>,
    /// Ordered allows whose wait began only after the app had exited (their trigger is the
    /// exit file's appearance).
    pub late_waits: usize,
    /// Ordered allows a little ahead of the test bed's stamp of the exit (counted 0 ms).
    pub ahead_of_clock: usize,
    /// Of the ordered allows, how many were answered on each source's word of the exit, as
    /// the agent logged it (`kernel`, `runtime`); empty for the baseline daemon.
    pub exit_told_by: BTreeMap<String, usize>,
    /// Of the ordered allows, where the time went; `None` for the baseline daemon, which
    /// does not say.
    pub stages: Option<super::stages::Stages>,
    /// Deletions whose app stamped its own exit (the trigger); the others are timed from the
    /// kernel's or the runtime's word.
    pub exits_stamped_by_app: usize,
    /// Where every deletion counted, exactly once.
    pub tally: Tally,
    /// The machine's own wake-up lateness while the row ran (see [`super::floor`]).
    pub floor: Option<super::floor::Floor>,
}

impl DetectRow {
    pub fn new(source: impl Into<String>, deletions: usize, outcome: &Outcome) -> Self {
        let f = figures(&outcome.delays_ms);
        let agent = figures(&outcome.decided_ms);
        DetectRow {
            source: source.into(),
            deletions,
            samples: outcome.delays_ms.len(),
            detect_to_allow_p50_ms: f.p50,
            detect_to_allow_p99_ms: f.p99,
            detect_to_allow_max_ms: f.max,
            agent_part_p50_ms: agent.p50,
            agent_part_p99_ms: agent.p99,
            late_waits: outcome.late_waits,
            ahead_of_clock: outcome.ahead_of_clock,
            exit_told_by: outcome.told_by.clone(),
            stages: outcome.stages.figures(),
            exits_stamped_by_app: outcome.stamped_by_app,
            tally: outcome.tally.clone(),
            floor: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DetectSection {
    pub containerd_events: DetectRow,
    /// The same, the exit directories in each pod's tmpfs (the webhook's pod-local layout).
    pub containerd_events_pod_local: DetectRow,
    pub poll: DetectRow,
    pub kruise_daemon: DetectRow,
}

/// `allow` written -> waiter returned, for one kind of waiter.
#[derive(Debug, Clone, Serialize)]
pub struct ReturnRow {
    pub waiter: String,
    pub runs: usize,
    pub samples: usize,
    pub allow_to_return_p50_ms: Option<f64>,
    pub allow_to_return_p99_ms: Option<f64>,
    pub allow_to_return_max_ms: Option<f64>,
    pub anomalies: ReturnAnomalies,
}

impl ReturnRow {
    pub fn new(waiter: impl Into<String>, r: &Returns) -> Self {
        let f = figures(&r.delays_ms);
        ReturnRow {
            waiter: waiter.into(),
            runs: r.runs,
            samples: r.delays_ms.len(),
            allow_to_return_p50_ms: f.p50,
            allow_to_return_p99_ms: f.p99,
            allow_to_return_max_ms: f.max,
            anomalies: r.anomalies,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ReturnSection {
    pub entrypoint: ReturnRow,
    pub sh_poll: ReturnRow,
}

/// The agent with pods running and nothing to do.
#[derive(Debug, Clone, Serialize)]
pub struct IdleRow {
    pub pods: usize,
    pub seconds: f64,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
    pub cpu_seconds: f64,
    /// Time the agent was runnable but waited for a CPU (its threads' schedstat run_delay).
    pub cpu_wait_seconds: f64,
}

impl IdleRow {
    pub fn new(pods: usize, seconds: f64, usage: Usage) -> Self {
        IdleRow {
            pods,
            seconds: round3(seconds),
            rss_mib: round3(usage.rss_mib),
            peak_rss_mib: round3(usage.peak_rss_mib),
            cpu_seconds: round3(usage.cpu_seconds),
            cpu_wait_seconds: round3(usage.cpu_wait_seconds),
        }
    }
}

/// The agent while every pod on the node is deleted at once.
#[derive(Debug, Clone, Serialize)]
pub struct BurstRow {
    pub pods_asked: usize,
    pub pods_started: usize,
    pub pods_deleted: usize,
    /// From the first deletion sent to the last one done.
    pub seconds: f64,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
    pub cpu_seconds: f64,
    /// Time the agent was runnable but waited for a CPU: a saturated node's share of its
    /// delays.
    pub cpu_wait_seconds: f64,
    /// The latest allow's delay after its app's exit.
    pub latest_allow_after_trigger_ms: Option<f64>,
    pub detect_to_allow_p50_ms: Option<f64>,
    pub detect_to_allow_p99_ms: Option<f64>,
    /// The agent's own part of each ordered allow's delay (see [`DetectRow`]).
    pub agent_part_p50_ms: Option<f64>,
    pub agent_part_p99_ms: Option<f64>,
    pub samples: usize,
    pub late_waits: usize,
    /// Where every deleted pod counted, exactly once.
    pub tally: Tally,
    /// The runtime's ListContainers latency during the burst, sampled twice a second: how
    /// busy the runtime itself was.
    pub runtime_list_p50_ms: Option<f64>,
    pub runtime_list_max_ms: Option<f64>,
}

/// Memory and CPU of one phase, as read from /proc.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
    pub cpu_seconds: f64,
    pub cpu_wait_seconds: f64,
}

impl BurstRow {
    pub fn new(
        (pods_asked, pods_started, pods_deleted): (usize, usize, usize),
        seconds: f64,
        usage: Usage,
        outcome: &Outcome,
    ) -> Self {
        let f = figures(&outcome.delays_ms);
        let agent = figures(&outcome.decided_ms);
        BurstRow {
            pods_asked,
            pods_started,
            pods_deleted,
            seconds: round3(seconds),
            rss_mib: round3(usage.rss_mib),
            peak_rss_mib: round3(usage.peak_rss_mib),
            cpu_seconds: round3(usage.cpu_seconds),
            cpu_wait_seconds: round3(usage.cpu_wait_seconds),
            latest_allow_after_trigger_ms: f.max,
            detect_to_allow_p50_ms: f.p50,
            detect_to_allow_p99_ms: f.p99,
            agent_part_p50_ms: agent.p50,
            agent_part_p99_ms: agent.p99,
            samples: outcome.delays_ms.len(),
            late_waits: outcome.late_waits,
            tally: outcome.tally.clone(),
            runtime_list_p50_ms: None,
            runtime_list_max_ms: None,
        }
    }

    pub fn set_runtime_list(&mut self, latencies_ms: &[f64]) {
        let f = figures(latencies_ms);
        self.runtime_list_p50_ms = f.p50;
        self.runtime_list_max_ms = f.max;
    }
}

/// Everything measured; parts not run (`--only`) are null.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub runtime: String,
    pub cpus: usize,
    /// How the node weighed the agent, the runtime and the pods for CPU (`None`: all alike,
    /// the host had no cpu controller).
    pub cpu_weights: Option<String>,
    pub total_seconds: f64,
    pub settings: Settings,
    pub detect_to_allow: Option<DetectSection>,
    pub allow_to_return: Option<ReturnSection>,
    pub agent_idle: Option<IdleRow>,
    pub agent_burst: Option<BurstRow>,
    pub webhook: Option<super::webhook::WebhookRow>,
    pub agent_churn: Option<super::churn::ChurnRow>,
    pub traffic: Option<super::traffic::TrafficSection>,
    pub kill_skew: Option<super::skew::SkewRow>,
}

impl Report {
    /// A report with no part measured yet.
    pub fn new(runtime: String, settings: Settings) -> Report {
        Report {
            runtime,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_weights: None,
            total_seconds: 0.0,
            settings,
            detect_to_allow: None,
            allow_to_return: None,
            agent_idle: None,
            agent_burst: None,
            webhook: None,
            agent_churn: None,
            traffic: None,
            kill_skew: None,
        }
    }
}

mod table;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::measure::Outcome;

    fn settings() -> Settings {
        Settings {
            deletions: 4,
            batch: 2,
            stagger_ms: 100,
            app_drain_ms: 300,
            pod_grace_seconds: 30,
            agent_poll_interval_ms: 25,
            kruise_scan_ms: 1000,
            returns: 3,
            poller_batch: 3,
            idle_seconds: 1.0,
            idle_pods: 2,
            burst_pods: 3,
            start_concurrency: 4,
            reviews: 8,
            churn_pods: 4,
            churn_concurrency: 2,
            churn_sample_every: 2,
            busy: false,
        }
    }

    fn outcome(delays: &[f64]) -> Outcome {
        Outcome {
            delays_ms: delays.to_vec(),
            ..Outcome::default()
        }
    }

    fn report() -> Report {
        let mut missing = outcome(&[1.0, 2.0, 3.0]);
        missing.tally.no_allow = 1;
        Report {
            runtime: "containerd 1.6.20".into(),
            cpus: 2,
            cpu_weights: None,
            total_seconds: 12.5,
            settings: settings(),
            detect_to_allow: Some(DetectSection {
                containerd_events: DetectRow::new(
                    "containerd_events",
                    4,
                    &outcome(&[1.0, 2.123_456_7, 3.0, 4.0]),
                ),
                containerd_events_pod_local: DetectRow::new(
                    "containerd_events",
                    4,
                    &outcome(&[1.0, 2.0, 3.0, 4.0]),
                ),
                poll: DetectRow::new("poll", 4, &missing),
                kruise_daemon: DetectRow::new("kruise_daemon", 4, &outcome(&[])),
            }),
            allow_to_return: Some(ReturnSection {
                entrypoint: ReturnRow::new(
                    "exitorder-entrypoint wait (inotify)",
                    &Returns {
                        runs: 3,
                        delays_ms: vec![0.2, 0.3, 0.4],
                        anomalies: ReturnAnomalies::default(),
                    },
                ),
                sh_poll: ReturnRow::new(
                    "sh loop polling every 1 s",
                    &Returns {
                        runs: 3,
                        delays_ms: vec![500.0, 900.0],
                        anomalies: ReturnAnomalies {
                            failed: 1,
                            ..ReturnAnomalies::default()
                        },
                    },
                ),
            }),
            agent_idle: Some(IdleRow::new(
                2,
                1.0,
                Usage {
                    rss_mib: 9.5,
                    peak_rss_mib: 10.25,
                    cpu_seconds: 0.0,
                    cpu_wait_seconds: 0.0,
                },
            )),
            agent_burst: Some({
                let mut b = BurstRow::new(
                    (3, 3, 3),
                    2.5,
                    Usage {
                        rss_mib: 10.0,
                        peak_rss_mib: 11.0,
                        cpu_seconds: 0.12,
                        cpu_wait_seconds: 0.01,
                    },
                    &outcome(&[5.0, 7.0, 9.0]),
                );
                b.set_runtime_list(&[1.0, 30.0, 2.0]);
                b
            }),
            webhook: Some(super::super::webhook::WebhookRow {
                reviews: 8,
                samples: 8,
                review_p50_ms: Some(0.4),
                review_p99_ms: Some(0.9),
                review_max_ms: Some(0.9),
                patched: 6,
                unchanged: 2,
                denied: 0,
                rss_mib: 6.5,
                cpu_seconds: 0.02,
            }),
            agent_churn: Some(super::super::churn::ChurnRow {
                pods_asked: 4,
                pods_cycled: 4,
                failures: 0,
                first_failure: None,
                concurrency: 2,
                seconds: 2.0,
                pods_per_second: 2.0,
                rss_start_mib: 9.0,
                rss_peak_mib: 9.5,
                rss_end_mib: 9.25,
                rss_high_water_mib: 9.75,
                rss_slope_kib_per_1000_pods: Some(64.0),
                rss_slope_second_half_kib_per_1000_pods: Some(0.0),
                cpu_seconds: 0.5,
                allows: [("ordered".to_owned(), 4)].into(),
                agent_state_at_end: [("exitorder_view_pods".to_owned(), 1.0)].into(),
                samples: vec![
                    super::super::churn::ChurnSample {
                        pods: 0,
                        seconds: 0.0,
                        rss_mib: 9.0,
                    },
                    super::super::churn::ChurnSample {
                        pods: 4,
                        seconds: 2.0,
                        rss_mib: 9.25,
                    },
                ],
            }),
            traffic: None,
            kill_skew: None,
        }
    }

    #[test]
    fn json_has_every_key() {
        let v = serde_json::to_value(report()).unwrap();
        let d = &v["detect_to_allow"]["containerd_events"];
        assert_eq!(d["detect_to_allow_p50_ms"], 2.123);
        assert_eq!(d["detect_to_allow_p99_ms"], 4.0);
        assert_eq!(d["samples"], 4);
        assert_eq!(v["detect_to_allow"]["poll"]["tally"]["no_allow"], 1);
        assert!(v["detect_to_allow"]["kruise_daemon"]["detect_to_allow_p50_ms"].is_null());
        let r = &v["allow_to_return"];
        assert_eq!(r["entrypoint"]["allow_to_return_p99_ms"], 0.4);
        assert_eq!(r["sh_poll"]["allow_to_return_p50_ms"], 500.0);
        assert_eq!(r["sh_poll"]["anomalies"]["failed"], 1);
        assert_eq!(v["agent_idle"]["peak_rss_mib"], 10.25);
        assert_eq!(v["agent_burst"]["latest_allow_after_trigger_ms"], 9.0);
        assert_eq!(v["agent_burst"]["pods_deleted"], 3);
        assert_eq!(v["agent_burst"]["runtime_list_max_ms"], 30.0);
        assert_eq!(v["webhook"]["review_p99_ms"], 0.9);
        assert_eq!(v["webhook"]["patched"], 6);
        assert_eq!(v["agent_churn"]["rss_end_mib"], 9.25);
        assert_eq!(v["agent_churn"]["samples"][1]["pods"], 4);
        assert_eq!(v["agent_churn"]["allows"]["ordered"], 4);
        assert!(report().table().contains("review p50 0.400 ms"));
        assert_eq!(v["settings"]["batch"], 2);
        // One line, so it can be the last line of the output.
        assert!(!serde_json::to_string(&report()).unwrap().contains('\n'));
    }

    #[test]
    fn parts_not_run_are_null() {
        let mut r = report();
        r.detect_to_allow = None;
        r.agent_burst = None;
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["detect_to_allow"].is_null() && v["agent_burst"].is_null());
        let t = r.table();
        assert!(!t.contains("finished_at"));
        assert!(t.contains("idle, 2 opted-in pods running"));
    }

    #[test]
    fn table_shows_every_row() {
        let t = report().table();
        for needle in [
            "containerd 1.6.20 (2 CPUs)",
            "exitorder, containerd events",
            "polling every 25 ms",
            "scan every 1000 ms",
            "1 no allow",
            "1 failed or stuck",
            "exitorder-entrypoint wait (inotify)",
            "sh loop polling every 1 s",
            "deleting 3 pods at once",
            "latest allow 9.000 ms",
            "ListContainers p50 2.000 ms, max 30.000 ms",
            "4 cycled in 2.0 s",
            "RSS MiB by pods cycled: 0 9.00, 4 9.25",
            "proxies allowed: ordered 4",
            "held at the end: exitorder_view_pods 1",
        ] {
            assert!(t.contains(needle), "{needle:?} missing from:\n{t}");
        }
        assert!(t.contains("2.123"), "{t}");
    }
}
