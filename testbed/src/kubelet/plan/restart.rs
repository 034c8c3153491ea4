//! Whether the test bed's kubelet starts a container again after it exited, as the kubelet
//! decides it, written here apart from the agent's own reading of the same fields (the two
//! are checked against one table from upstream, `kubelet-rules/restart.tsv`):
//!
//! - `pkg/kubelet/container/helpers.go` `ShouldContainerBeRestarted`: without the
//!   `ContainerRestartRules` gate, the pod's `restartPolicy` (Never: never; OnFailure: on a
//!   non-zero exit; Always or unset: always).
//! - With the gate (KEP-5307: alpha 1.34, on by default from 1.35), `pkg/api/v1/pod/util.go`
//!   `ContainerShouldRestart`: only for a container that sets its own `restartPolicy`, the
//!   first of its `restartPolicyRules` whose exit codes match (`FindMatchingContainerRestartRule`:
//!   `In` the values, or `NotIn` them) decides; `Restart` and, with
//!   `RestartAllContainersOnContainerExits` (KEP-5532: alpha 1.35, on by default from 1.36),
//!   `RestartAllContainers` restart it. Without a match its own policy decides; the pod's
//!   only when it has none.
//!
//! The API server's validation (`validateContainerRestartPolicy`) is played too: rules need
//! the container's own policy, every rule its `exitCodes`, at most 20 rules of 255 values.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, ContainerRestartRule};

/// A pod's or a container's `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// A pod's `restartPolicy`: unset is Always (the API server's default).
    pub fn of_pod(value: Option<&str>) -> Result<RestartPolicy, String> {
        RestartPolicy::named(value.unwrap_or("Always"))
    }

    fn named(value: &str) -> Result<RestartPolicy, String> {
        match value {
            "Always" => Ok(RestartPolicy::Always),
            "OnFailure" => Ok(RestartPolicy::OnFailure),
            "Never" => Ok(RestartPolicy::Never),
            other => Err(format!(
                "{:?}: Always, OnFailure or Never",
                other.escape_debug().to_string()
            )),
        }
    }

    fn restarts_after(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// What follows one exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Not started again.
    Done,
    /// This container starts again.
    Restart,
    /// Every container of the pod starts again, in place (KEP-5532).
    RestartAll,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    restart_all: bool,
    not_in: bool,
    values: BTreeSet<i32>,
}

/// One container's restart fields as the kubelet reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restarts {
    pod: RestartPolicy,
    own: Option<RestartPolicy>,
    rules: Vec<Rule>,
}

/// A field the API server would refuse: (its name under the container, why).
pub type FieldError = (&'static str, String);

impl Restarts {
    /// The pod's policy alone.
    pub fn pod(pod: RestartPolicy) -> Restarts {
        Restarts {
            pod,
            own: None,
            rules: Vec::new(),
        }
    }

    /// A container's, in a pod whose policy is `pod`.
    pub fn of(pod: RestartPolicy, c: &Container) -> Result<Restarts, FieldError> {
        let own = c
            .restart_policy
            .as_deref()
            .map(RestartPolicy::named)
            .transpose()
            .map_err(|e| ("restartPolicy", e))?;
        let rules = c.restart_policy_rules.as_deref().unwrap_or_default();
        if own.is_none() && !rules.is_empty() {
            return Err((
                "restartPolicy",
                "must specify restartPolicy when restart rules are used".into(),
            ));
        }
        if rules.len() > 20 {
            return Err(("restartPolicyRules", "more than 20 rules".into()));
        }
        let rules = rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule(i, r).map_err(|e| ("restartPolicyRules", e)))
            .collect::<Result<_, _>>()?;
        Ok(Restarts { pod, own, rules })
    }

    /// What the kubelet does after an exit with `exit_code`.
    pub fn after(&self, exit_code: i32) -> Then {
        let Some(own) = self.own else {
            return self.by_policy(self.pod, exit_code);
        };
        let matched = self
            .rules
            .iter()
            .find(|r| r.values.contains(&exit_code) != r.not_in);
        match matched {
            Some(r) if r.restart_all => Then::RestartAll,
            Some(_) => Then::Restart,
            None => self.by_policy(own, exit_code),
        }
    }

    fn by_policy(&self, policy: RestartPolicy, exit_code: i32) -> Then {
        if policy.restarts_after(exit_code) {
            Then::Restart
        } else {
            Then::Done
        }
    }
}

fn rule(i: usize, r: &ContainerRestartRule) -> Result<Rule, String> {
    let restart_all = match r.action.as_str() {
        "Restart" => false,
        "RestartAllContainers" => true,
        other => {
            return Err(format!(
                "[{i}].action {other:?}: Restart or RestartAllContainers"
            ))
        }
    };
    let Some(codes) = &r.exit_codes else {
        return Err(format!("[{i}].exitCodes must be specified"));
    };
    let not_in = match codes.operator.as_str() {
        "In" => false,
        "NotIn" => true,
        other => return Err(format!("[{i}].exitCodes.operator {other:?}: In or NotIn")),
    };
    let values = codes.values.as_deref().unwrap_or_default();
    if values.len() > 255 {
        return Err(format!("[{i}].exitCodes.values: more than 255"));
    }
    Ok(Rule {
        restart_all,
        not_in,
        values: values.iter().copied().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row of `kubelet-rules/restart.tsv` applied to this kubelet's rule.
    fn answer(pod: &str, own: &str, rules: &str, code: i32) -> Then {
        let pod = RestartPolicy::of_pod(Some(pod)).expect("a pod policy");
        let mut c = serde_json::json!({"name": "c"});
        if own != "-" {
            c["restartPolicy"] = own.into();
        }
        if rules != "-" {
            c["restartPolicyRules"] = rules
                .split(';')
                .map(|r| {
                    let mut f = r.split(':');
                    let (action, op, values) = (f.next(), f.next(), f.next());
                    serde_json::json!({"action": action, "exitCodes": {"operator": op,
                        "values": values.unwrap_or_default().split(',')
                            .filter_map(|v| v.parse::<i32>().ok()).collect::<Vec<_>>()}})
                })
                .collect();
        }
        let c: Container = serde_json::from_value(c).expect("a container");
        Restarts::of(pod, &c).expect("valid fields").after(code)
    }

    #[test]
    fn every_row_of_the_upstream_table_holds() {
        for row in exitorder_kubelet_rules::RESTART.rows(5) {
            let line = row.line;
            let [pod, own, rules, code, want, ..] = row.fields[..] else {
                unreachable!("rows(5)");
            };
            let want = match want {
                "done" => Then::Done,
                "restart" => Then::Restart,
                "restart-all" => Then::RestartAll,
                other => panic!("outcome {other:?} in {line:?}"),
            };
            let code = code.parse().expect("an exit code");
            assert_eq!(answer(pod, own, rules, code), want, "row {line:?}");
        }
    }

    #[test]
    fn what_the_api_server_refuses_is_refused() {
        let refused = [
            serde_json::json!({"name": "c", "restartPolicy": "Sometimes"}),
            // Rules without the container's own policy.
            serde_json::json!({"name": "c", "restartPolicyRules": [{"action": "Restart",
                "exitCodes": {"operator": "In", "values": [1]}}]}),
            serde_json::json!({"name": "c", "restartPolicy": "Never",
                "restartPolicyRules": [{"action": "Restart"}]}),
            serde_json::json!({"name": "c", "restartPolicy": "Never",
                "restartPolicyRules": [{"action": "Recreate",
                "exitCodes": {"operator": "In", "values": [1]}}]}),
            serde_json::json!({"name": "c", "restartPolicy": "Never",
                "restartPolicyRules": [{"action": "Restart",
                "exitCodes": {"operator": "Is", "values": [1]}}]}),
        ];
        for c in refused {
            let parsed: Container = serde_json::from_value(c.clone()).expect("a container");
            assert!(Restarts::of(RestartPolicy::Always, &parsed).is_err(), "{c}");
        }
    }
}
