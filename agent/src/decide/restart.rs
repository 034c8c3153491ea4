//! Whether the kubelet starts a container again after it exited: from the pod's
//! `restartPolicy`, the container's own (KEP-5307, Kubernetes 1.34+: it overrides the pod's)
//! and its `restartPolicyRules` (the first rule whose exit codes match decides; without a
//! match, the container's policy does). A rule's action is `Restart` (this container) or
//! `RestartAllContainers` (KEP-5532, 1.35+: every container of the pod, in place, whatever
//! their own policies say): either way this container starts again. Pure: one answer for Job
//! completion and the test bed's kubelet.
//!
//! Everything here comes from a pod spec, which any tenant writes: rules and values are
//! bounded (the API server allows 20 rules of 255 values), and what this version does not
//! know (an action, an operator) is an error, never a guess.

use std::collections::{BTreeMap, BTreeSet};

use exitorder_contract::annotation::RESTARTS;
use k8s_openapi::api::core::v1::{Container, ContainerRestartRule, PodSpec};
use serde::{Deserialize, Serialize};

/// The API server's own limits, kept here for a spec from elsewhere.
const MAX_RULES: usize = 20;
const MAX_VALUES: usize = 255;
/// The largest [`RestartRecord`] the agent reads: a handful of containers with a few rules
/// each take well under 1 KiB, and the agent reads the record again on every change of a
/// completing pod. The webhook writes none larger (and says so).
pub const MAX_RECORD_BYTES: usize = 16 * 1024;

/// A restart policy, of a pod or a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Always,
    OnFailure,
    Never,
}

impl Policy {
    /// A pod's `restartPolicy` (`None`: the default, Always).
    pub fn parse(s: Option<&str>) -> Result<Policy, RestartError> {
        match s {
            None | Some("Always") => Ok(Policy::Always),
            Some("OnFailure") => Ok(Policy::OnFailure),
            Some("Never") => Ok(Policy::Never),
            Some(other) => Err(RestartError::Policy(other.escape_debug().to_string())),
        }
    }

    fn restarts(self, exit_code: i32) -> bool {
        match self {
            Policy::Always => true,
            Policy::OnFailure => exit_code != 0,
            Policy::Never => false,
        }
    }
}

/// Exit codes a rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitCodes {
    In(BTreeSet<i32>),
    NotIn(BTreeSet<i32>),
}

impl ExitCodes {
    fn matches(&self, code: i32) -> bool {
        match self {
            ExitCodes::In(v) => v.contains(&code),
            ExitCodes::NotIn(v) => !v.contains(&code),
        }
    }
}

/// What a matching rule makes the kubelet do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `Restart`: this container starts again.
    Restart,
    /// `RestartAllContainers` (KEP-5532): the kubelet kills every container of the pod at
    /// once (no preStop hook, no grace period), removes them all and runs the pod again from
    /// its first init container, in the same sandbox with the same volumes.
    RestartAllContainers,
}

/// One of a container's `restartPolicyRules`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub action: Action,
    pub codes: ExitCodes,
}

/// What follows one exit of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The container is done for good.
    Done,
    /// The container starts again (its policy, or a `Restart` rule).
    Restart,
    /// Every container of the pod starts again, in place (a `RestartAllContainers` rule).
    RestartAll,
}

/// How the kubelet treats one container's exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    pub policy: Policy,
    /// The container's rules, in order: the first whose exit codes match decides.
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestartError {
    #[error("restartPolicy {0:?}: Always, OnFailure or Never")]
    Policy(String),
    #[error("restartPolicyRules: more than {MAX_RULES} rules")]
    TooManyRules,
    #[error("restartPolicyRules[{0}]: action {1:?} (Restart or RestartAllContainers)")]
    Action(usize, String),
    #[error("restartPolicyRules[{0}]: no exitCodes")]
    NoExitCodes(usize),
    #[error("restartPolicyRules[{0}].exitCodes: operator {1:?} (In or NotIn)")]
    Operator(usize, String),
    #[error("restartPolicyRules[{0}].exitCodes: more than {MAX_VALUES} values")]
    TooManyValues(usize),
}

impl Restart {
    /// A regular container's rules in a pod whose `restartPolicy` is `pod_policy`.
    pub fn of(pod_policy: Option<&str>, container: &Container) -> Result<Restart, RestartError> {
        Restart::from_fields(
            pod_policy,
            container.restart_policy.as_deref(),
            container.restart_policy_rules.as_deref(),
        )
    }

    /// From the pod's policy and the container's own policy and rules, wherever they were
    /// read (a spec, or the webhook's [`RestartRecord`]).
    fn from_fields(
        pod_policy: Option<&str>,
        own_policy: Option<&str>,
        rules: Option<&[ContainerRestartRule]>,
    ) -> Result<Restart, RestartError> {
        let policy = match own_policy {
            Some(own) => Policy::parse(Some(own))?,
            None => Policy::parse(pod_policy)?,
        };
        let rules = rules.unwrap_or_default();
        if rules.len() > MAX_RULES {
            return Err(RestartError::TooManyRules);
        }
        let rules = rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule(i, r))
            .collect::<Result<_, _>>()?;
        Ok(Restart { policy, rules })
    }

    /// The pod's policy alone (no rules of the container's own).
    pub fn pod(policy: Policy) -> Restart {
        Restart {
            policy,
            rules: Vec::new(),
        }
    }

    /// What the kubelet does after the container exited with `exit_code`.
    pub fn on_exit(&self, exit_code: i32) -> Outcome {
        match self.rules.iter().find(|r| r.codes.matches(exit_code)) {
            Some(Rule {
                action: Action::Restart,
                ..
            }) => Outcome::Restart,
            Some(Rule {
                action: Action::RestartAllContainers,
                ..
            }) => Outcome::RestartAll,
            None if self.policy.restarts(exit_code) => Outcome::Restart,
            None => Outcome::Done,
        }
    }

    /// Whether the kubelet starts the container again after it exited with `exit_code`
    /// (alone, or with every other container of the pod).
    pub fn restarts(&self, exit_code: i32) -> bool {
        self.on_exit(exit_code) != Outcome::Done
    }

    /// Whether the answer depends on the exit code (else any code will do).
    pub fn needs_exit_code(&self) -> bool {
        !self.rules.is_empty() || self.policy == Policy::OnFailure
    }
}

/// What Job completion needs from a pod's spec, which the runtime does not carry: the pod's
/// `restartPolicy`; for each main container in declaration order, its own policy and rules;
/// and the init containers (native sidecars among them) whose rules can restart the pod. The
/// webhook records it on a completing pod as the annotation [`RESTARTS`]; the kubelet copies
/// pod annotations to the sandbox, so an agent without the API server decides as one with it. The fields are the spec's own (immutable
/// once the pod exists); everything in it is as hostile as the spec it came from.
///
/// Read leniently: a field this agent does not know (a later webhook's) is kept aside in
/// [`Self::later`] and said, not a reason to refuse the record. Agents before this one refused
/// unknown fields, so the webhook adds none (a version among them) while those may still run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    pub containers: Vec<RecordedContainer>,
    /// Init containers and native sidecars with a `RestartAllContainers` rule: their exits
    /// can restart every container of the pod (KEP-5532).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<RecordedContainer>,
    /// Fields of a later webhook's record, unknown here.
    #[serde(flatten, skip_serializing)]
    pub later: BTreeMap<String, serde_json::Value>,
}

/// One container's restart fields, as in its spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedContainer {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy_rules: Option<Vec<ContainerRestartRule>>,
    /// Fields of a later webhook's record, unknown here.
    #[serde(flatten, skip_serializing)]
    pub later: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("annotation {RESTARTS} is larger than {MAX_RECORD_BYTES} bytes")]
    TooLarge,
    #[error("annotation {RESTARTS}: {0}")]
    Json(String),
}

impl RestartRecord {
    /// The record of a pod spec.
    pub fn of_spec(spec: &PodSpec) -> RestartRecord {
        let recorded = |c: &Container| RecordedContainer {
            name: c.name.clone(),
            restart_policy: c.restart_policy.clone(),
            restart_policy_rules: c.restart_policy_rules.clone(),
            later: BTreeMap::new(),
        };
        RestartRecord {
            restart_policy: spec.restart_policy.clone(),
            containers: spec.containers.iter().map(recorded).collect(),
            // Only those whose exits can restart the pod: a record that has them is refused
            // by agents older than this field, so it is kept to the pods that need it.
            init_containers: spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| names_restart_all(c.restart_policy_rules.as_deref()))
                .map(recorded)
                .collect(),
            later: BTreeMap::new(),
        }
    }

    /// The fields of a later release's record this agent reads past, by path.
    pub fn unknown_fields(&self) -> Vec<String> {
        let containers = self
            .containers
            .iter()
            .chain(&self.init_containers)
            .flat_map(|c| c.later.keys().map(move |k| format!("{}.{k}", c.name)));
        self.later.keys().cloned().chain(containers).collect()
    }

    /// The annotation's value; `None` when it would be larger than the agent reads.
    pub fn to_annotation(&self) -> Option<String> {
        serde_json::to_string(self)
            .ok()
            .filter(|s| s.len() <= MAX_RECORD_BYTES)
    }

    /// Reads the annotation's value, bounded before it is parsed.
    pub fn parse(value: &str) -> Result<RestartRecord, RecordError> {
        if value.len() > MAX_RECORD_BYTES {
            return Err(RecordError::TooLarge);
        }
        serde_json::from_str(value).map_err(|e| RecordError::Json(e.to_string()))
    }

    /// The main containers' names, in declaration order.
    pub fn names(&self) -> Vec<String> {
        self.containers.iter().map(|c| c.name.clone()).collect()
    }

    /// Whether the kubelet restarts each main container, or why that cannot be told.
    pub fn restarts(&self) -> BTreeMap<String, Result<Restart, RestartError>> {
        self.containers.iter().map(|c| self.restart(c)).collect()
    }

    /// The containers (init, native sidecar or main) with a rule whose action is
    /// `RestartAllContainers`: an exit of theirs can start the whole pod again in place.
    /// Each with its rules, or why they cannot be read.
    pub fn restart_all(&self) -> BTreeMap<String, Result<Restart, RestartError>> {
        self.init_containers
            .iter()
            .chain(&self.containers)
            .filter(|c| names_restart_all(c.restart_policy_rules.as_deref()))
            .map(|c| self.restart(c))
            .collect()
    }

    fn restart(&self, c: &RecordedContainer) -> (String, Result<Restart, RestartError>) {
        let r = Restart::from_fields(
            self.restart_policy.as_deref(),
            c.restart_policy.as_deref(),
            c.restart_policy_rules.as_deref(),
        );
        (c.name.clone(), r)
    }
}

/// Whether some of these rules (read or not) names the `RestartAllContainers` action: a
/// container whose other rules cannot be read still counts, and its error is kept.
fn names_restart_all(rules: Option<&[ContainerRestartRule]>) -> bool {
    rules
        .unwrap_or_default()
        .iter()
        .any(|r| r.action == "RestartAllContainers")
}

fn rule(i: usize, r: &ContainerRestartRule) -> Result<Rule, RestartError> {
    let action = match r.action.as_str() {
        "Restart" => Action::Restart,
        "RestartAllContainers" => Action::RestartAllContainers,
        other => return Err(RestartError::Action(i, other.escape_debug().to_string())),
    };
    let codes = r.exit_codes.as_ref().ok_or(RestartError::NoExitCodes(i))?;
    let values = codes.values.as_deref().unwrap_or_default();
    if values.len() > MAX_VALUES {
        return Err(RestartError::TooManyValues(i));
    }
    let values: BTreeSet<i32> = values.iter().copied().collect();
    let codes = match codes.operator.as_str() {
        "In" => ExitCodes::In(values),
        "NotIn" => ExitCodes::NotIn(values),
        other => return Err(RestartError::Operator(i, other.escape_debug().to_string())),
    };
    Ok(Rule { action, codes })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row of the table taken from the kubelet's source (`kubelet-rules/restart.tsv`),
    /// which the test bed's kubelet is checked against too.
    #[test]
    fn every_row_of_the_upstream_table_holds() {
        for row in exitorder_kubelet_rules::RESTART.rows(5) {
            let line = row.line;
            let [pod, own, rules, code, want, ..] = row.fields[..] else {
                unreachable!("rows(5)");
            };
            let mut c = serde_json::json!({"name": "c"});
            if own != "-" {
                c["restartPolicy"] = own.into();
            }
            if rules != "-" {
                let rules: Vec<serde_json::Value> = rules
                    .split(';')
                    .map(|r| {
                        let f: Vec<&str> = r.split(':').collect();
                        let values: Vec<i32> =
                            f[2].split(',').filter_map(|v| v.parse().ok()).collect();
                        serde_json::json!({"action": f[0],
                            "exitCodes": {"operator": f[1], "values": values}})
                    })
                    .collect();
                c["restartPolicyRules"] = rules.into();
            }
            let c: Container = serde_json::from_value(c).expect("a container");
            let code: i32 = code.parse().expect("an exit code");
            let got = Restart::of(Some(pod), &c).expect("valid").on_exit(code);
            let want = match want {
                "done" => Outcome::Done,
                "restart" => Outcome::Restart,
                "restart-all" => Outcome::RestartAll,
                other => panic!("outcome {other:?} in {line:?}"),
            };
            assert_eq!(got, want, "row {line:?}");
        }
    }

    fn container(json: serde_json::Value) -> Container {
        let mut c = json;
        c["name"] = "worker".into();
        serde_json::from_value(c).expect("a container")
    }

    /// What, the pod's policy, the container's fields, (exit code, restarted) pairs.
    type Case = (
        &'static str,
        Option<&'static str>,
        serde_json::Value,
        &'static [(i32, bool)],
    );

    #[test]
    fn the_kubelets_answer_for_each_policy_rule_and_exit_code() {
        use serde_json::json;
        let on_42 = json!({"restartPolicy": "Never", "restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]});
        let unless_0_or_3 = json!({"restartPolicy": "Always", "restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 3]}}]});
        #[rustfmt::skip]
        let table: [Case; 8] = [
            ("pod Always", Some("Always"), json!({}), &[(0, true), (1, true)]),
            ("pod default: Always", None, json!({}), &[(0, true), (137, true)]),
            ("pod OnFailure", Some("OnFailure"), json!({}), &[(0, false), (1, true)]),
            ("pod Never", Some("Never"), json!({}), &[(0, false), (1, false)]),
            ("container OnFailure in a Never pod", Some("Never"),
             json!({"restartPolicy": "OnFailure"}), &[(0, false), (1, true)]),
            ("container Never in an Always pod", Some("Always"),
             json!({"restartPolicy": "Never"}), &[(0, false), (1, false)]),
            ("rule: restart on 42, else Never", Some("Never"), on_42,
             &[(42, true), (0, false), (1, false)]),
            // No rule matches 0 or 3: the container's own policy (Always) decides.
            ("rule NotIn, else Always", Some("Never"), unless_0_or_3,
             &[(1, true), (0, true), (3, true)]),
        ];
        for (name, pod, c, codes) in table {
            let r = Restart::of(pod, &container(c)).expect(name);
            for (code, want) in codes {
                assert_eq!(r.restarts(*code), *want, "{name}: exit {code}");
            }
        }
    }

    #[test]
    fn the_exit_code_is_needed_only_where_it_decides() {
        assert!(!Restart::pod(Policy::Never).needs_exit_code());
        assert!(!Restart::pod(Policy::Always).needs_exit_code());
        assert!(Restart::pod(Policy::OnFailure).needs_exit_code());
        let r = Restart::of(
            Some("Never"),
            &container(
                serde_json::json!({"restartPolicy": "Never", "restartPolicyRules": [
                {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}),
            ),
        )
        .expect("rules");
        assert!(r.needs_exit_code());
    }

    #[test]
    fn the_record_answers_as_the_spec_does() {
        use serde_json::json;
        let spec: PodSpec = serde_json::from_value(json!({"restartPolicy": "OnFailure",
            "containers": [
                {"name": "worker", "restartPolicy": "Never", "restartPolicyRules": [
                    {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 3]}}]},
                {"name": "tests"},
                {"name": "linkerd-proxy", "restartPolicy": "Always"}]}))
        .expect("a spec");
        let value = RestartRecord::of_spec(&spec)
            .to_annotation()
            .expect("small");
        let record = RestartRecord::parse(&value).expect("reads back");
        assert_eq!(record.names(), ["worker", "tests", "linkerd-proxy"]);
        let restarts = record.restarts();
        for c in &spec.containers {
            let from_spec = Restart::of(spec.restart_policy.as_deref(), c);
            assert_eq!(restarts[&c.name], from_spec, "{}", c.name);
        }
    }

    #[test]
    fn the_first_matching_rule_decides_between_the_two_restarts() {
        use serde_json::json;
        let r = Restart::of(
            Some("Never"),
            &container(json!({"restartPolicyRules": [
                {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}},
                {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}]})),
        )
        .expect("rules");
        assert_eq!(r.on_exit(42), Outcome::Restart);
        assert_eq!(r.on_exit(88), Outcome::RestartAll);
        assert_eq!(r.on_exit(0), Outcome::Done);
        // Its own policy restarts it alone; no rule of the pod's other containers counts.
        assert_eq!(Restart::pod(Policy::Always).on_exit(88), Outcome::Restart);
    }

    #[test]
    fn the_record_names_every_container_that_can_restart_the_pod() {
        use serde_json::json;
        let all_on_88 = json!([{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}]);
        let spec: PodSpec = serde_json::from_value(json!({"restartPolicy": "Never",
            "initContainers": [
                {"name": "setup"},
                {"name": "watcher", "restartPolicy": "Always", "restartPolicyRules": all_on_88},
                {"name": "retried", "restartPolicyRules": [
                    {"action": "Restart", "exitCodes": {"operator": "In", "values": [1]}}]}],
            "containers": [
                {"name": "worker", "restartPolicy": "Never", "restartPolicyRules": all_on_88},
                {"name": "proxy"}]}))
        .expect("a spec");
        let value = RestartRecord::of_spec(&spec)
            .to_annotation()
            .expect("small");
        let record = RestartRecord::parse(&value).expect("reads back");
        // Only init containers whose exits can restart the pod are recorded (a plain
        // `Restart` rule is not); the main containers all are.
        let init: Vec<&str> = record
            .init_containers
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(init, ["watcher"]);
        assert_eq!(record.names(), ["worker", "proxy"]);
        let all = record.restart_all();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["watcher", "worker"]);
        for r in all.values() {
            assert_eq!(r.as_ref().map(|r| r.on_exit(88)), Ok(Outcome::RestartAll));
        }
        // A pod without such rules writes no init containers: the record is as before.
        let plain: PodSpec =
            serde_json::from_value(json!({"containers": [{"name": "a"}]})).expect("a spec");
        let value = RestartRecord::of_spec(&plain)
            .to_annotation()
            .expect("small");
        assert_eq!(value, r#"{"containers":[{"name":"a"}]}"#);
    }

    #[test]
    fn a_later_webhooks_fields_are_read_past_and_named() {
        let r = RestartRecord::parse(
            r#"{"v": 2, "restartPolicy": "Never", "containers": [{"name": "a", "image": "x", "restartPolicy": "OnFailure"}]}"#,
        )
        .expect("lenient");
        assert_eq!(r.restart_policy.as_deref(), Some("Never"));
        assert_eq!(r.containers[0].restart_policy.as_deref(), Some("OnFailure"));
        assert_eq!(r.unknown_fields(), ["v", "a.image"]);
        // What this agent writes carries none of them, so an agent that refuses unknown
        // fields reads it.
        assert_eq!(
            r.to_annotation().expect("small"),
            r#"{"restartPolicy":"Never","containers":[{"name":"a","restartPolicy":"OnFailure"}]}"#
        );
    }

    #[test]
    fn a_hostile_record_is_refused_before_it_is_read() {
        let big = format!(
            r#"{{"containers": [{{"name": "{}"}}]}}"#,
            "a".repeat(MAX_RECORD_BYTES)
        );
        assert_eq!(RestartRecord::parse(&big), Err(RecordError::TooLarge));
        for bad in [
            "",
            "[]",
            r#"{"containers": 1}"#,
            r#"{"containers": [], "restartPolicy": 7}"#,
            r#"{"restartPolicy": "Never"}"#,
        ] {
            assert!(
                matches!(RestartRecord::parse(bad), Err(RecordError::Json(_))),
                "{bad}"
            );
        }
        // Readable, but a policy no kubelet has: an error for that container, not a guess.
        let r = RestartRecord::parse(
            r#"{"restartPolicy": "Sometimes", "containers": [{"name": "a"}]}"#,
        )
        .expect("well-formed");
        assert_eq!(
            r.restarts()["a"],
            Err(RestartError::Policy("Sometimes".into()))
        );
    }

    #[test]
    fn what_this_version_does_not_know_is_an_error_never_a_guess() {
        use serde_json::json;
        let rule = |r: serde_json::Value| {
            Restart::of(
                Some("Never"),
                &container(json!({"restartPolicy": "Never", "restartPolicyRules": [r]})),
            )
        };
        assert_eq!(
            rule(json!({"action": "Recreate", "exitCodes": {"operator": "In", "values": [1]}})),
            Err(RestartError::Action(0, "Recreate".into()))
        );
        let all = rule(
            json!({"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [1]}}),
        );
        assert!(
            all.is_ok_and(|r| r.on_exit(1) == Outcome::RestartAll && r.on_exit(0) == Outcome::Done)
        );
        assert_eq!(
            rule(json!({"action": "Restart", "exitCodes": {"operator": "Gt", "values": [1]}})),
            Err(RestartError::Operator(0, "Gt".into()))
        );
        assert_eq!(
            rule(json!({"action": "Restart"})),
            Err(RestartError::NoExitCodes(0))
        );
        let many: Vec<i32> = (0..300).collect();
        assert_eq!(
            rule(json!({"action": "Restart", "exitCodes": {"operator": "In", "values": many}})),
            Err(RestartError::TooManyValues(0))
        );
        let rules: Vec<_> = (0..21)
            .map(|_| json!({"action": "Restart", "exitCodes": {"operator": "In", "values": [1]}}))
            .collect();
        assert_eq!(
            Restart::of(
                Some("Never"),
                &container(json!({"restartPolicy": "Never", "restartPolicyRules": rules}))
            ),
            Err(RestartError::TooManyRules)
        );
        assert_eq!(
            Restart::of(Some("Sometimes"), &container(json!({}))),
            Err(RestartError::Policy("Sometimes".into()))
        );
    }
}
