//! The benchmark (`exitorder-testbed bench`) end to end with tiny sizes on a real containerd:
//! every figure of the report is there and consistent, every deletion is counted in exactly one
//! place, and nothing counted is the agent's failure. No timing, and no count the machine's
//! load could change, is asserted: the benchmark is for measuring.
//!
//! Needs root and `containerd runc busybox-static`, like the end-to-end tests; without them it
//! prints "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use exitorder_e2e::support;

use serde_json::Value;

const DELETIONS: u64 = 6;
const RETURNS: u64 = 6;
const IDLE_PODS: u64 = 3;
const BURST_PODS: u64 = 5;
const REVIEWS: u64 = 40;

fn num(v: &Value, path: &str) -> f64 {
    let mut cur = v;
    for key in path.split('.') {
        cur = &cur[key];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {v}"))
}

/// p50 <= p99 <= max, all >= 0, when there were samples.
fn assert_ordered(v: &Value, prefix: &str, max_key: &str) {
    if num(v, "samples") == 0.0 {
        return;
    }
    let p50 = num(v, &format!("{prefix}_p50_ms"));
    let p99 = num(v, &format!("{prefix}_p99_ms"));
    let max = num(v, max_key);
    assert!(
        0.0 <= p50 && p50 <= p99 && p99 <= max,
        "{prefix}: p50 {p50}, p99 {p99}, max {max} in {v}"
    );
}

/// Every deletion is counted once, ordered ones in the samples, and none is the agent's fault.
fn assert_tally(v: &Value, deletions: f64) {
    let t = &v["tally"];
    let fields = [
        "ordered",
        "deadline",
        "other_reason",
        "prestop_never_waited",
        "no_allow",
        "allow_before_exit",
        "no_exit_time",
        "deletion_failed",
    ];
    let total: f64 = fields.iter().map(|f| num(t, f)).sum();
    assert_eq!(total, deletions, "{v}");
    assert_eq!(num(t, "ordered"), num(v, "samples"), "{v}");
    for agent in ["other_reason", "no_allow", "allow_before_exit"] {
        assert_eq!(num(t, agent), 0.0, "{agent} in {v}");
    }
    assert!(t["never_waited"].is_object(), "{v}");
}

#[tokio::test]
async fn bench_reports_every_figure() {
    // Only to know whether this machine can run a node at all (skip or fail as e2e does).
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    node.shutdown().await.expect("probe node teardown");
    let entrypoint = support::static_entrypoint();

    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: exitorder_testbed::bench::BenchArgs,
    }
    let args = Cli::try_parse_from([
        "bench",
        "--deletions",
        &DELETIONS.to_string(),
        "--batch",
        "3",
        "--returns",
        &RETURNS.to_string(),
        "--poller-batch",
        "6",
        "--idle",
        "1s",
        "--idle-pods",
        &IDLE_PODS.to_string(),
        "--burst-pods",
        &BURST_PODS.to_string(),
        "--reviews",
        &REVIEWS.to_string(),
    ])
    .expect("bench flags")
    .bench;
    let args = exitorder_testbed::bench::BenchArgs {
        binaries: exitorder_testbed::binaries::BinaryArgs {
            entrypoint_binary: Some(entrypoint.to_owned()),
            agent_binary: Some(support::agent_bin().into()),
        },
        ..args
    };
    let report = exitorder_testbed::bench::measure(&args)
        .await
        .unwrap_or_else(|e| panic!("bench failed: {e:#}"));
    eprintln!("{}", report.table());
    let r: Value = serde_json::to_value(&report).expect("report as JSON");

    assert_eq!(num(&r, "settings.deletions"), DELETIONS as f64);
    assert!(num(&r, "total_seconds") > 0.0);
    assert!(r["runtime"]
        .as_str()
        .is_some_and(|s| s.contains("containerd")));

    for (key, source) in [
        ("containerd_events", "containerd_events"),
        ("containerd_events_pod_local", "containerd_events"),
        ("poll", "poll"),
        ("kruise_daemon", "kruise_daemon"),
    ] {
        let d = &r["detect_to_allow"][key];
        assert_eq!(d["source"], source, "{d}");
        assert_eq!(num(d, "deletions"), DELETIONS as f64, "{key}");
        assert_ordered(d, "detect_to_allow", "detect_to_allow_max_ms");
        assert_tally(d, DELETIONS as f64);
        if source != "kruise_daemon" && num(d, "samples") > 0.0 {
            // The agent's own part, from its notice of the exit to the allow.
            let (p50, p99) = (num(d, "agent_part_p50_ms"), num(d, "agent_part_p99_ms"));
            assert!(0.0 <= p50 && p50 <= p99, "{key}: {d}");
        }
        if source != "kruise_daemon" {
            // Every ordered allow says which source told the agent of the app's exit.
            let told = d["exit_told_by"].as_object().expect("exit_told_by");
            assert!(
                told.keys()
                    .all(|k| ["kernel", "runtime", "none"].contains(&k.as_str())),
                "{key}: {d}"
            );
            let sum: f64 = told.values().filter_map(serde_json::Value::as_f64).sum();
            assert_eq!(sum, num(d, "samples"), "{key}: {d}");
            // Where the time went, stage by stage, for every ordered allow.
            if num(d, "samples") > 0.0 {
                for stage in [
                    "exit_to_notice",
                    "exit_to_kernel_wake",
                    "kernel_wake_to_notice",
                    "notice_to_decision",
                    "decision_to_allow",
                    "allow_to_return",
                ] {
                    let f = &d["stages"][stage];
                    let n = num(f, "samples");
                    if stage.contains("kernel") {
                        // Split only where the kernel told an exit the wait was already on.
                        let by_kernel = d["exit_told_by"]["kernel"].as_f64().unwrap_or(0.0);
                        assert!(n <= by_kernel, "{key} {stage}: {d}");
                    } else if stage == "allow_to_return" {
                        // A hook whose exec failed after its wait has no return.
                        assert!(n <= num(d, "samples"), "{key} {stage}: {d}");
                    } else {
                        assert_eq!(n, num(d, "samples"), "{key} {stage}: {d}");
                    }
                    if n > 0.0 {
                        let (p50, p99, max) =
                            (num(f, "p50_ms"), num(f, "p99_ms"), num(f, "max_ms"));
                        assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{key} {stage}: {d}");
                    }
                }
            }
            // The machine's own wake-up lateness while the row ran, beside its delays.
            let f = &d["floor"];
            assert!(num(f, "wakes") >= 1.0, "{key}: {d}");
            let (p50, p99, p999, max) = (
                num(f, "late_p50_ms"),
                num(f, "late_p99_ms"),
                num(f, "late_p999_ms"),
                num(f, "late_max_ms"),
            );
            assert!(
                0.0 <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
                "{key}: {d}"
            );
            assert!(num(f, "late_over_2ms") <= num(f, "wakes"), "{key}: {d}");
        } else {
            assert!(d["stages"].is_null(), "{d}");
            assert!(d["floor"].is_null(), "{d}");
        }
        // Every ordered allow is timed from the app's own stamp of its exit, which comes
        // before the exit: none can be ahead of it.
        assert!(
            num(d, "exits_stamped_by_app") >= num(d, "samples"),
            "{key}: {d}"
        );
        assert_eq!(num(d, "ahead_of_clock"), 0.0, "{key}: {d}");
    }

    for key in ["entrypoint", "sh_poll"] {
        let w = &r["allow_to_return"][key];
        assert_eq!(num(w, "runs"), RETURNS as f64, "{key}");
        let a = &w["anomalies"];
        assert_eq!(
            num(w, "samples") + num(a, "not_posted") + num(a, "failed"),
            RETURNS as f64,
            "{key}: {w}"
        );
        // Timed from before the answer's write: no waiter can return earlier.
        assert_eq!(num(a, "returned_before_answer"), 0.0, "{key}: {w}");
        assert_ordered(w, "allow_to_return", "allow_to_return_max_ms");
    }

    let idle = &r["agent_idle"];
    assert_eq!(num(idle, "pods"), IDLE_PODS as f64);
    assert!(num(idle, "seconds") >= 1.0, "{idle}");
    assert!(num(idle, "rss_mib") > 0.0, "{idle}");
    assert!(num(idle, "peak_rss_mib") >= num(idle, "rss_mib"), "{idle}");
    assert!(num(idle, "cpu_seconds") >= 0.0, "{idle}");
    assert!(num(idle, "cpu_wait_seconds") >= 0.0, "{idle}");

    let burst = &r["agent_burst"];
    assert_eq!(num(burst, "pods_asked"), BURST_PODS as f64, "{burst}");
    assert!(
        num(burst, "pods_deleted") <= num(burst, "pods_started"),
        "{burst}"
    );
    assert!(num(burst, "rss_mib") > 0.0, "{burst}");
    assert!(
        num(burst, "peak_rss_mib") >= num(burst, "rss_mib"),
        "{burst}"
    );
    assert!(num(burst, "cpu_seconds") >= 0.0, "{burst}");
    assert!(num(burst, "cpu_wait_seconds") >= 0.0, "{burst}");
    assert_ordered(burst, "detect_to_allow", "latest_allow_after_trigger_ms");
    assert_tally(burst, num(burst, "pods_started"));
    let (list_p50, list_max) = (
        num(burst, "runtime_list_p50_ms"),
        num(burst, "runtime_list_max_ms"),
    );
    assert!(0.0 <= list_p50 && list_p50 <= list_max, "{burst}");

    // Every review answered; the examples cycle: three opted in (patched), one not.
    let w = &r["webhook"];
    assert_eq!(num(w, "reviews"), REVIEWS as f64, "{w}");
    assert_eq!(num(w, "samples"), REVIEWS as f64, "{w}");
    assert_eq!(num(w, "patched"), (REVIEWS * 3 / 4) as f64, "{w}");
    assert_eq!(num(w, "unchanged"), (REVIEWS / 4) as f64, "{w}");
    assert_eq!(num(w, "denied"), 0.0, "{w}");
    assert!(num(w, "rss_mib") > 0.0, "{w}");
    assert_ordered(w, "review", "review_max_ms");
}
