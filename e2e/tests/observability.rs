//! The chart's observability, rendered by a real helm: the Grafana dashboard, the alerting
//! rules (checked by a real `promtool check rules`, from Debian's prometheus package) and the
//! PodMonitors. Every metric the dashboard and the rules name is one the agent or the webhook
//! exports, with the label values they match on; the rules find the agents and the webhook
//! by the `job` labels the chart's PodMonitors give them.
//!
//! Needs helm and promtool (`scripts/test` fetches both); without them each test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where they are mandatory.

use exitorder_e2e::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use exitorder_testbed::install::{tool_candidates, tools_dir, Helm, CHART_IN_TREE, NAMESPACE};
use exitorder_testbed::manifest;
use serde_json::Value;
use support::skip_or_fail;

/// What the rules may name besides the agent's and the webhook's metrics: Prometheus' own
/// scrape health, and kube-state-metrics' DaemonSet status (an agent missing on a node
/// exports nothing).
const EXTERNAL: [&str; 3] = [
    "up",
    "kube_daemonset_status_desired_number_scheduled",
    "kube_daemonset_status_number_available",
];

/// Labels that targets carry (the PodMonitors' and kube-state-metrics'), not the exporters.
const TARGET_LABELS: [&str; 5] = ["job", "node", "namespace", "pod", "daemonset"];

const EVERYTHING_ON: [(&str, &str); 5] = [
    ("podMonitor.enabled", "true"),
    ("grafanaDashboard.enabled", "true"),
    ("prometheusRule.enabled", "true"),
    ("webhook.enabled", "true"),
    ("webhook.podMonitor.enabled", "true"),
];

fn root() -> &'static Path {
    exitorder_e2e::repo()
}

/// The chart rendered (after `helm lint --strict`) with `values`.
fn render(values: &[(&str, &str)]) -> Option<Vec<Value>> {
    let helm = match Helm::find() {
        Ok(h) => h,
        Err(e) => {
            skip_or_fail(&format!("the chart tests need helm: {e}"));
            return None;
        }
    };
    let values: Vec<(String, String)> = values
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let chart = root().join(CHART_IN_TREE);
    helm.lint(&chart, &values)
        .unwrap_or_else(|e| panic!("helm lint: {e}"));
    let text = helm
        .template(&chart, NAMESPACE, &values)
        .unwrap_or_else(|e| panic!("{e}"));
    Some(manifest::documents(&text).unwrap_or_else(|e| panic!("{e}")))
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// `EXITORDER_PROMTOOL`, else `promtool` on PATH, else the one `scripts/test` unpacks.
fn promtool() -> Option<PathBuf> {
    let candidates = tool_candidates(
        "EXITORDER_PROMTOOL",
        "promtool",
        tools_dir().join("prometheus/usr/bin/promtool"),
    );
    for c in candidates {
        let works = Command::new(&c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if works {
            return Some(c);
        }
    }
    skip_or_fail("the rules need promtool: `. scripts/tools.sh && ensure_promtool`");
    None
}

/// `promtool <what> <file>`: whether it passed, and what it said.
fn run_promtool(promtool: &Path, what: &[&str], file: &Path) -> (bool, String) {
    let out = Command::new(promtool)
        .args(what)
        .arg(file)
        .output()
        .expect("promtool runs");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

/// Every metric family the agent and the webhook export, with the `label="value"` pairs
/// their samples carry (every closed set of series is exported from the start, zero or not).
fn exported() -> (BTreeSet<String>, BTreeSet<String>) {
    use exitorder::serve::openmetrics::render;
    let text = render::<exitorder::stats::Stats>(&Arc::default())
        + &render::<exitorder::webhook::server::WebhookStats>(&Arc::default());
    let mut names = BTreeSet::new();
    let mut pairs = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            // OpenMetrics names the family; its samples carry the suffixes.
            let suffixes: &[&str] = match kind {
                "histogram" => &["", "_bucket", "_sum", "_count"],
                "counter" => &["_total"],
                _ => &[""],
            };
            for suffix in suffixes {
                names.insert(format!("{name}{suffix}"));
            }
        } else if let Some((_, labels)) = line.split_once('{') {
            let labels = labels.split('}').next().unwrap_or_default();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                pairs.insert(pair.to_owned());
            }
        }
    }
    (names, pairs)
}

/// One selector of a PromQL expression: the metric's name and its label matchers
/// (`(label, op, value)`).
#[derive(Debug)]
struct Selector {
    metric: String,
    matchers: Vec<(String, String, String)>,
}

/// The selectors of `expr`: each name written right before `{`, and any bare name of ours
/// (`exitorder_...`, which no label is called). Enough PromQL for the chart's own queries,
/// not a parser.
fn selectors(expr: &str) -> Vec<Selector> {
    let mut out = braced(expr);
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    for word in expr.split(|c: char| !ident(c)) {
        if word.starts_with("exitorder_") && !out.iter().any(|s| s.metric == word) {
            out.push(Selector {
                metric: word.to_owned(),
                matchers: Vec::new(),
            });
        }
    }
    out
}

fn braced(expr: &str) -> Vec<Selector> {
    let bytes = expr.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        let mut start = i;
        while start > 0 && ident(bytes[start - 1]) {
            start -= 1;
        }
        let metric = &expr[start..i];
        let end = expr[i..].find('}').map_or(expr.len(), |e| i + e);
        // `by (..) {` never happens; an empty name is a grouping brace of a template.
        if !metric.is_empty() && !metric.starts_with(|c: char| c.is_ascii_digit()) {
            let matchers = expr[i + 1..end]
                .split(',')
                .filter_map(|m| {
                    let m = m.trim();
                    let at = m.find(['=', '!'])?;
                    let (label, rest) = m.split_at(at);
                    let op_len = rest
                        .chars()
                        .take_while(|c| matches!(c, '=' | '!' | '~'))
                        .count();
                    let (op, value) = rest.split_at(op_len);
                    Some((
                        label.trim().to_owned(),
                        op.to_owned(),
                        value.trim().trim_matches('"').to_owned(),
                    ))
                })
                .collect();
            out.push(Selector {
                metric: metric.to_owned(),
                matchers,
            });
        }
        i = end;
    }
    out
}

/// Every query of the dashboard (panels' targets and template variables).
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().expect("a target's expr").to_owned());
        }
    }
    for v in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(q) = v["query"]["query"].as_str() {
            out.push(q.to_owned());
        }
    }
    out
}

fn the_dashboard(docs: &[Value]) -> Value {
    let maps: Vec<&Value> = of_kind(docs, "ConfigMap")
        .into_iter()
        .filter(|m| m["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect();
    assert_eq!(maps.len(), 1, "one ConfigMap for Grafana's sidecar");
    let json = maps[0]["data"]["exitorder.json"]
        .as_str()
        .expect("the dashboard's JSON");
    serde_json::from_str(json).unwrap_or_else(|e| panic!("the dashboard is not JSON: {e}"))
}

/// Every alerting rule: (alert name, expression).
fn alerts(docs: &[Value]) -> Vec<(String, String)> {
    let rules = of_kind(docs, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    let mut out = Vec::new();
    for g in rules[0]["spec"]["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            out.push((
                r["alert"].as_str().expect("an alert").to_owned(),
                r["expr"].as_str().expect("an expr").to_owned(),
            ));
        }
    }
    out
}

#[test]
fn nothing_of_it_is_rendered_by_default() {
    let Some(docs) = render(&[("webhook.enabled", "true")]) else {
        return;
    };
    for kind in ["PrometheusRule", "PodMonitor"] {
        assert!(
            of_kind(&docs, kind).is_empty(),
            "{kind} rendered by default"
        );
    }
    assert!(
        of_kind(&docs, "ConfigMap")
            .iter()
            .all(|m| m["metadata"]["labels"]["grafana_dashboard"].is_null()),
        "a dashboard rendered by default"
    );
}

#[test]
fn the_dashboard_and_the_rules_name_only_what_is_exported() {
    let Some(docs) = render(&EVERYTHING_ON) else {
        return;
    };
    let dashboard = the_dashboard(&docs);
    assert_eq!(dashboard["uid"], "exitorder");
    let mut queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 10, "{queries:?}");
    let rules = alerts(&docs);
    queries.extend(rules.iter().map(|(_, e)| e.clone()));
    let (names, pairs) = exported();
    let mut used = BTreeSet::new();
    for q in &queries {
        let found = selectors(q);
        assert!(!found.is_empty(), "no metric found in {q:?}");
        for s in found {
            used.insert(s.metric.clone());
            if EXTERNAL.contains(&s.metric.as_str()) {
                continue;
            }
            assert!(
                names.contains(&s.metric),
                "{} is not exported by the agent or the webhook (in {q:?})",
                s.metric
            );
            for (label, op, value) in &s.matchers {
                if TARGET_LABELS.contains(&label.as_str()) || op != "=" {
                    continue;
                }
                assert!(
                    pairs.contains(&format!("{label}=\"{value}\"")),
                    "no exported series has {label}=\"{value}\" (in {q:?})"
                );
            }
        }
    }
    // What the issue's dashboard asks for is there.
    for metric in [
        "exitorder_allow_latency_seconds_bucket",
        "exitorder_allows_total",
        "exitorder_pending_exits",
        "exitorder_share_breaches_total",
        "exitorder_event_source",
        "exitorder_ready",
        "exitorder_webhook_review_seconds_bucket",
        "exitorder_webhook_reviews_total",
    ] {
        assert!(used.contains(metric), "nothing shows {metric}");
    }
}

#[test]
fn the_rules_find_what_the_pod_monitors_scrape() {
    let Some(docs) = render(&EVERYTHING_ON) else {
        return;
    };
    let jobs: BTreeSet<String> = of_kind(&docs, "PodMonitor")
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["metadata"]["namespace"].as_str().expect("a namespace"),
                m["metadata"]["name"].as_str().expect("a name")
            )
        })
        .collect();
    assert_eq!(jobs.len(), 2, "the agents' and the webhook's PodMonitors");
    let mut by_alert: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (alert, expr) in alerts(&docs) {
        for s in selectors(&expr) {
            for (label, _, value) in s.matchers {
                if label == "job" {
                    by_alert.entry(alert.clone()).or_default().insert(value);
                }
            }
        }
    }
    for (alert, used) in &by_alert {
        for job in used {
            assert!(
                jobs.contains(job),
                "{alert} selects job {job:?}, not one of {jobs:?}"
            );
        }
    }
    // The agents' PodMonitor gives each agent's series its node, which the rules and the
    // dashboard group by.
    let agent = of_kind(&docs, "PodMonitor")
        .into_iter()
        .find(|m| m["spec"]["podMetricsEndpoints"][0]["port"] == "metrics")
        .expect("the agents' PodMonitor");
    let relabel = &agent["spec"]["podMetricsEndpoints"][0]["relabelings"][0];
    assert_eq!(relabel["targetLabel"], "node");
    // The webhook is scraped on its HTTPS port.
    let webhook = of_kind(&docs, "PodMonitor")
        .into_iter()
        .find(|m| m["spec"]["podMetricsEndpoints"][0]["port"] == "https")
        .expect("the webhook's PodMonitor");
    assert_eq!(webhook["spec"]["podMetricsEndpoints"][0]["scheme"], "https");
}

#[test]
fn promtool_accepts_the_rules() {
    let Some(docs) = render(&EVERYTHING_ON) else {
        return;
    };
    let Some(promtool) = promtool() else {
        return;
    };
    let rules = of_kind(&docs, "PrometheusRule");
    let spec = &rules.first().expect("a PrometheusRule")["spec"];
    let alerts = alerts(&docs);
    for (alert, _) in &alerts {
        assert!(
            alert.starts_with("Exitorder"),
            "{alert}: every alert is named for exitorder"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rules.yaml");
    // JSON is YAML: promtool reads the groups as the operator hands them to Prometheus.
    std::fs::write(&file, serde_json::to_string_pretty(spec).expect("JSON")).expect("write");
    let (ok, said) = run_promtool(&promtool, &["check", "rules"], &file);
    assert!(ok, "promtool check rules:\n{said}");
    assert!(
        said.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{said}"
    );
}

/// Runs `promtool test rules` on `tests` (the unit-test file's `tests` list) against the
/// chart's rules; panics with promtool's words when a test fails.
fn promtool_test(docs: &[Value], tests: Value) {
    let Some(promtool) = promtool() else {
        return;
    };
    let rules = of_kind(docs, "PrometheusRule");
    let dir = tempfile::tempdir().expect("tempdir");
    let rules_file = dir.path().join("rules.yaml");
    std::fs::write(&rules_file, rules[0]["spec"].to_string()).expect("write");
    let test_file = dir.path().join("test.yaml");
    let unit = serde_json::json!({
        "rule_files": [rules_file.display().to_string()],
        "evaluation_interval": "1m",
        "tests": tests,
    });
    std::fs::write(&test_file, unit.to_string()).expect("write");
    let (ok, said) = run_promtool(&promtool, &["test", "rules"], &test_file);
    assert!(ok, "promtool test rules:\n{said}");
}

/// The expression of alert `name`.
fn expr_of(docs: &[Value], name: &str) -> String {
    alerts(docs)
        .into_iter()
        .find(|(a, _)| a == name)
        .map(|(_, e)| e)
        .unwrap_or_else(|| panic!("no alert {name}"))
}

/// What each alert's expression returns on series as the agents and the webhook export
/// them: it fires where it should, and stays quiet on a quiet node.
#[test]
fn the_alerts_fire_where_they_should() {
    let Some(docs) = render(&EVERYTHING_ON) else {
        return;
    };
    let monitors = of_kind(&docs, "PodMonitor");
    let job_of = |port: &str| {
        let m = monitors
            .iter()
            .find(|m| m["spec"]["podMetricsEndpoints"][0]["port"] == port)
            .expect("a PodMonitor");
        format!(
            "{}/{}",
            m["metadata"]["namespace"].as_str().unwrap_or_default(),
            m["metadata"]["name"].as_str().unwrap_or_default()
        )
    };
    let agent = job_of("metrics");
    let webhook = job_of("https");
    let series = |name: &str, labels: &str, values: &str| serde_json::json!({"series": format!("{name}{{{labels}}}"), "values": values});
    let allows = |node: &str, reason: &str, values: &str| {
        series(
            "exitorder_allows_total",
            &format!(r#"job="{agent}", node="{node}", reason="{reason}""#),
            values,
        )
    };
    let tests = serde_json::json!([{
        "interval": "1m",
        "input_series": [
            // Busy: half of 60 waiting exits by the deadline; many not_terminating aside.
            allows("busy", "deadline", "0+1x60"),
            allows("busy", "ordered", "0+1x60"),
            allows("busy", "not_terminating", "0+100x60"),
            // Quiet: its one waiting exit, by the deadline.
            allows("quiet", "deadline", "0 1x60"),
            allows("quiet", "ordered", "0x60"),
            // Healthy: every waiting exit in order.
            allows("healthy", "deadline", "0x60"),
            allows("healthy", "ordered", "0+5x60"),
            series("exitorder_ready", &format!(r#"job="{agent}", node="busy""#), "1x60"),
            series("exitorder_ready", &format!(r#"job="{agent}", node="stuck""#), "0x60"),
            series("exitorder_share_breaches_total", &format!(r#"job="{agent}", node="busy""#), "0x30 1x30"),
            series("exitorder_webhook_reviews_total", &format!(r#"job="{webhook}", pod="w1", outcome="invalid""#), "0x30 2x30"),
            series("exitorder_webhook_certificate_reloads_total", &format!(r#"job="{webhook}", pod="w1", result="failed""#), "0x60"),
            series("exitorder_webhook_reviews_total", &format!(r#"job="{webhook}", pod="w2", outcome="invalid""#), "0x60"),
            series("exitorder_webhook_certificate_reloads_total", &format!(r#"job="{webhook}", pod="w2", result="failed""#), "0x60"),
            series("up", &format!(r#"job="{agent}", node="busy""#), "1x60"),
        ],
        "promql_expr_test": [
            {"expr": expr_of(&docs, "ExitorderDeadlineReleases"), "eval_time": "40m",
             "exp_samples": [{"labels": r#"{node="busy"}"#, "value": 0.5}]},
            {"expr": expr_of(&docs, "ExitorderAgentNotReady"), "eval_time": "40m",
             "exp_samples": [{"labels": format!(r#"exitorder_ready{{job="{agent}", node="stuck"}}"#), "value": 0}]},
            {"expr": expr_of(&docs, "ExitorderShareBreach"), "eval_time": "35m",
             "exp_samples": [{"labels": format!(r#"{{job="{agent}", node="busy"}}"#), "value": 1.0}]},
            {"expr": expr_of(&docs, "ExitorderShareBreach"), "eval_time": "55m",
             "exp_samples": []},
            {"expr": expr_of(&docs, "ExitorderWebhookErrors"), "eval_time": "35m",
             "exp_samples": [{"labels": r#"{pod="w1"}"#, "value": 2.0}]},
            {"expr": expr_of(&docs, "ExitorderAgentsAbsent"), "eval_time": "10m",
             "exp_samples": []},
        ],
    }, {
        // Prometheus scrapes no agent at all.
        "interval": "1m",
        "input_series": [series("up", r#"job="someone-else""#, "1x20")],
        "promql_expr_test": [
            {"expr": expr_of(&docs, "ExitorderAgentsAbsent"), "eval_time": "10m",
             "exp_samples": [{"labels": format!(r#"{{job="{agent}"}}"#), "value": 1}]},
        ],
    }]);
    promtool_test(&docs, tests);
}

#[test]
fn the_rules_need_the_agents_pod_monitor_and_the_webhooks_come_with_its_own() {
    let helm = match Helm::find() {
        Ok(h) => h,
        Err(e) => {
            skip_or_fail(&format!("the chart tests need helm: {e}"));
            return;
        }
    };
    let err = helm
        .template(
            &root().join(CHART_IN_TREE),
            NAMESPACE,
            &[("prometheusRule.enabled".to_owned(), "true".to_owned())],
        )
        .expect_err("rules without the agents' PodMonitor rendered")
        .to_string();
    assert!(err.contains("needs podMonitor.enabled"), "{err}");
    let Some(docs) = render(&[
        ("podMonitor.enabled", "true"),
        ("prometheusRule.enabled", "true"),
        ("webhook.enabled", "true"),
    ]) else {
        return;
    };
    let names: Vec<String> = alerts(&docs).into_iter().map(|(a, _)| a).collect();
    assert!(names.iter().any(|a| a == "ExitorderAgentDown"), "{names:?}");
    assert!(
        !names.iter().any(|a| a.starts_with("ExitorderWebhook")),
        "webhook alerts without its PodMonitor: {names:?}"
    );
}

#[test]
fn the_selector_reader_reads_the_queries_here() {
    let s = selectors(
        r#"sum by (node) (increase(exitorder_allows_total{job="ns/x", reason="deadline"}[30m])) / up{job=~"a|b"}"#,
    );
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(s[0].metric, "exitorder_allows_total");
    assert_eq!(
        s[0].matchers,
        [
            ("job".into(), "=".into(), "ns/x".into()),
            ("reason".into(), "=".into(), "deadline".into())
        ]
    );
    assert_eq!(s[1].metric, "up");
    assert_eq!(s[1].matchers[0].1, "=~");
}

/// Prometheus, from the same package as [`promtool`] (`usr/bin/` beside it).
fn prometheus() -> Option<PathBuf> {
    let found = promtool()?.with_file_name("prometheus");
    if found.is_file() {
        return Some(found);
    }
    skip_or_fail(&format!(
        "no prometheus beside promtool at {}",
        found.display()
    ));
    None
}

/// A Prometheus scraping `target` every two seconds, killed when dropped.
struct Scraper {
    child: std::process::Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Scraper {
    /// Starts Prometheus on a free port, up to three times: the port is chosen by binding it
    /// and letting it go, so another process may take it in between.
    async fn start(binary: &Path, target: std::net::SocketAddr) -> Scraper {
        let mut said = String::new();
        for _ in 0..3 {
            let port = exitorder_testbed::node::free_port().expect("a free port");
            let dir = tempfile::tempdir().expect("tempdir");
            let config = dir.path().join("prometheus.yml");
            let yaml = format!(
                "global: {{scrape_interval: 2s, scrape_timeout: 2s}}\n\
                 scrape_configs:\n\
                 - job_name: agent\n  static_configs: [{{targets: ['{target}']}}]\n"
            );
            std::fs::write(&config, yaml).expect("write the config");
            let log = std::fs::File::create(dir.path().join("log")).expect("log file");
            let child = Command::new(binary)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(log.try_clone().expect("log file"))
                .stderr(log)
                .spawn()
                .expect("prometheus starts");
            let mut scraper = Scraper {
                child,
                addr: format!("127.0.0.1:{port}"),
                dir,
            };
            let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while std::time::Instant::now() < end {
                if let Ok(Some(_)) = scraper.child.try_wait() {
                    break;
                }
                if support::http_get(&scraper.addr, "/-/ready").await.0 == 200 {
                    return scraper;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            said = scraper.log();
        }
        panic!("prometheus did not become ready:\n{said}");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// The API's `data` at `path`, once it answers 200 with status "success".
    async fn api(&self, path: &str) -> Option<Value> {
        let (code, body) = support::http_get(&self.addr, path).await;
        let v: Value = serde_json::from_str(&body).ok()?;
        (code == 200 && v["status"] == "success").then(|| v["data"].clone())
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `Content-Type` of `/metrics` at `addr`, asked as Prometheus asks.
async fn content_type(addr: std::net::SocketAddr) -> String {
    let text = support::http_answer(
        &addr.to_string(),
        "/metrics",
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
    )
    .await
    .unwrap_or_else(|why| panic!("GET /metrics: {why}"));
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no Content-Type in:\n{head}"))
}

/// The families `text` declares, with their types (`# TYPE name type`).
fn declared(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let (name, kind) = rest.split_once(' ')?;
            Some((name.to_owned(), kind.to_owned()))
        })
        .collect()
}

/// Whether Prometheus knows every one of `families` by its type and with help, and read
/// the samples the test counted: two ordered allows, one within 5 ms and both within 50 ms.
async fn scraped(scraper: &Scraper, families: &BTreeMap<String, String>) -> Result<(), String> {
    let metadata = scraper
        .api("/api/v1/metadata")
        .await
        .ok_or("the metadata API did not answer")?;
    for (family, kind) in families {
        let known = &metadata[family][0];
        if known["type"] != **kind || known["help"].as_str().is_none_or(str::is_empty) {
            return Err(format!(
                "{family} ({kind}): Prometheus' metadata {}",
                metadata[family]
            ));
        }
    }
    let series = |data: Option<Value>| data.map(|d| d["result"].clone()).unwrap_or_default();
    let ordered = |found: &Value, le: Option<&str>| {
        found
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| {
                s["metric"]["reason"] == "ordered" && le.is_none_or(|le| s["metric"]["le"] == le)
            })
            .map(|s| s["value"][1].clone())
    };
    let allows = series(
        scraper
            .api("/api/v1/query?query=exitorder_allows_total")
            .await,
    );
    if ordered(&allows, None) != Some(Value::from("2")) {
        return Err(format!("not two ordered allows: {allows}"));
    }
    let buckets = series(
        scraper
            .api("/api/v1/query?query=exitorder_allow_latency_seconds_bucket")
            .await,
    );
    for (le, want) in [("0.005", "1"), ("0.05", "2"), ("+Inf", "2")] {
        if ordered(&buckets, Some(le)) != Some(Value::from(want)) {
            return Err(format!("ordered bucket le={le} is not {want}: {buckets}"));
        }
    }
    Ok(())
}

/// A real Prometheus scrapes the agent's `/metrics`: it asks for and reads OpenMetrics, the
/// scrape has no error, it knows every family by the type the agent declares, and samples
/// (a labelled counter, a histogram's bucket) read back as counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_every_family_with_its_type() {
    use exitorder::decide::Reason;
    use exitorder::handshake::share::Rejection;
    use exitorder::serve::{metrics, openmetrics};
    use std::time::Duration;

    let Some(binary) = prometheus() else {
        return;
    };
    let stats = Arc::new(exitorder::stats::Stats::default());
    stats.allowed(Reason::Ordered, Duration::from_millis(3));
    stats.allowed(Reason::Ordered, Duration::from_millis(40));
    stats.share_rejected(Rejection::Link);
    stats.runtime_error("list_containers");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let target = listener.local_addr().expect("address");
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(metrics::serve(listener, Arc::clone(&stats), stop.clone()));
    // Prometheus reads a scrape with the parser its Content-Type names: OpenMetrics' is the
    // strict one (`# EOF`, counters' `_total`, histograms' order).
    assert_eq!(
        content_type(target).await,
        exitorder::serve::openmetrics::CONTENT_TYPE
    );
    assert!(
        exitorder::serve::openmetrics::CONTENT_TYPE.starts_with("application/openmetrics-text;")
    );
    let scraper = Scraper::start(&binary, target).await;

    // Up once a scrape succeeded; a scrape that could not be parsed leaves it down with the
    // parser's words in lastError.
    let mut last = Value::Null;
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(t) = scraper.api("/api/v1/targets").await {
            last = t["activeTargets"][0].clone();
            if last["health"] == "up" {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < end,
            "the agent's target never came up: {last}\n{}",
            scraper.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last["lastError"], "", "{last}");

    let families = declared(&openmetrics::render(&stats));
    assert!(families.len() > 20, "{families:?}");
    // A scrape that times out on a busy machine marks the target's series stale until the
    // next one: what Prometheus read is asked again until it holds, within a deadline.
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let read = scraped(&scraper, &families).await;
        match read {
            Ok(()) => break,
            Err(why) => assert!(std::time::Instant::now() < end, "{why}\n{}", scraper.log()),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    stop.cancel();
    server.await.expect("the endpoint stops");
}
