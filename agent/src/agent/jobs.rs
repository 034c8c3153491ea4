//! The decision loop's side of Jobs that finish: a completing pod's state, read from the node
//! view and the pod's spec, handed to the Job task ([`crate::jobs`]) whenever it changes.

use tracing::{debug, info, warn};

use super::Agent;
use crate::cluster::podwatch::ApiPod;
use crate::cluster::recorder::PodRef;
use crate::decide::restart::RestartError;
use crate::decide::stoporder::StopOrder;
use crate::decide::{self, RunState};
use crate::jobs::completion::{self, Participation};
use crate::jobs::{JobSnapshot, SnapMember};
use crate::pod::PodUid;
use crate::view::facts;
use crate::view::PodEntry;

/// The containers whose exits can restart the whole pod, as the runtime shows them: each
/// one's newest attempt; or the container whose rules cannot be read, and why.
fn snapshot_triggers(
    pod: &PodEntry,
    api: &ApiPod,
) -> Result<Vec<SnapMember>, (String, RestartError)> {
    let newest = facts::newest(pod);
    api.restart_all
        .iter()
        .map(|(name, restart)| {
            let restart = restart.clone().map_err(|e| (name.clone(), e))?;
            let c = newest.get(name.as_str());
            Ok(SnapMember {
                name: name.clone(),
                id: c.map(|c| c.info.id.clone()),
                priority: 0,
                state: c.map_or(RunState::Created, |c| c.info.state),
                exit_seen: c.and_then(|c| c.exit_seen),
                restart,
            })
        })
        .collect()
}

/// The spec's main containers as the runtime shows them: each one's newest attempt, with
/// the priority resolved for that attempt (an older one has no env read), and whether the
/// kubelet starts it again; or the container whose restart rules cannot be read, and why.
fn snapshot_members(
    pod: &PodEntry,
    api: &ApiPod,
    ordered: &facts::Ordered,
) -> Result<Vec<SnapMember>, (String, RestartError)> {
    let newest = facts::newest(pod);
    let attempts = decide::newest_attempts(&ordered.attempts);
    api.containers
        .iter()
        .map(|name| {
            let c = newest.get(name.as_str());
            let restart = api.restart_of(name).map_err(|e| (name.clone(), e))?;
            Ok(SnapMember {
                name: name.clone(),
                id: c.map(|c| c.info.id.clone()),
                priority: attempts
                    .iter()
                    .find(|a| &a.name == name)
                    .map_or(0, |a| a.priority),
                state: c.map_or(RunState::Created, |c| c.info.state),
                exit_seen: c.and_then(|c| c.exit_seen),
                restart,
            })
        })
        .collect()
}

impl Agent {
    /// Hands the Job task the latest state of pod `pod`, when it is a completing pod that
    /// opted in. The restart policy and which containers are main containers are in the
    /// pod's spec only: read from the API server, or without one from the webhook's record
    /// on the sandbox.
    pub(super) fn job_check(&mut self, pod: &PodUid) {
        let Some(api) = self.job_pod(pod) else {
            return;
        };
        let (policy, opted_out) =
            match completion::completes(api.restart_policy.as_deref(), &api.annotations) {
                Participation::Off => return,
                Participation::OptedOut(p) => (p, true),
                Participation::On(p) => (p, false),
            };
        if api.deleting {
            // A deletion stops every container; its exits are ordered by the waits.
            return;
        }
        let Some(v) = self.view.pod(pod) else {
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
        let (members, triggers) = match snapshot_members(v, &api, &ordered)
            .and_then(|m| Ok((m, snapshot_triggers(v, &api)?)))
        {
            Ok(m) => m,
            Err((container, e)) => {
                // A rule this version cannot read: whether the work is over cannot be told,
                // and the sidecars are left to run, as without exitorder.
                if self
                    .warned
                    .first(pod, format!("job: restart rules of {container}"))
                {
                    warn!(pod = %pod, container = %container, error = %e, "cannot tell whether the kubelet restarts this container; the Job's sidecars are not shut down");
                }
                return;
            }
        };
        if opted_out {
            let done = members
                .iter()
                .filter(|m: &&SnapMember| m.priority == 0)
                .all(|m| m.state == RunState::Exited);
            if done && self.warned.first(pod, "job: left running".to_owned()) {
                info!(event = "job_left_running", pod = %pod, "main containers done; sidecars left running (exitorder.io/terminate-sidecars-on-completion: \"false\")");
            }
            return;
        }
        let (urls, bad) = completion::shutdown_urls(&api.annotations);
        if let Some(bad) = bad {
            let key = format!("job: {bad}");
            if self.warned.first(pod, key) {
                warn!(pod = %pod, problem = %bad, "sidecars without a valid shutdown URL are stopped through the runtime");
            }
        }
        let snap = JobSnapshot {
            uid: pod.clone(),
            pod: PodRef {
                namespace: api.namespace.clone(),
                name: api.name.clone(),
                uid: api.uid.clone(),
            },
            policy,
            grace: api.grace().unwrap_or(facts::DEFAULT_GRACE),
            members,
            triggers,
            urls,
        };
        debug!(pod = %snap.uid, members = ?snap.members, "completing pod: snapshot");
        self.jobs.snapshot(snap);
    }
}

impl Agent {
    /// The pod's spec as Job completion needs it: the API server's when the agent has one,
    /// else the webhook's record ([`ApiPod::from_record`]), once warned about when it cannot
    /// be read.
    fn job_pod(&mut self, pod: &PodUid) -> Option<ApiPod> {
        if self.api.pods.is_some() {
            return self.api_pod(pod);
        }
        let v = self.view.pod(pod)?;
        match ApiPod::from_record(v.sandbox.as_ref()?, v.grace())? {
            Ok(api) => Some(api),
            Err(e) => {
                if self.warned.first(pod, "job: restart record".to_owned()) {
                    warn!(pod = %pod, error = %e, "cannot read the webhook's record of the pod's restart policies; the Job's sidecars are not shut down");
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::restart::Restart;
    use crate::view::{ContainerEntry, EnvPriority};

    fn attempt(
        id: &str,
        name: &str,
        attempt: u32,
        state: RunState,
        env: Option<u8>,
    ) -> ContainerEntry {
        crate::view::facts::tests::entry(id, name, attempt, state, EnvPriority::Known(Ok(env)))
    }

    #[test]
    fn members_are_the_newest_attempts_with_their_own_priority() {
        // The sidecar's priority comes from its env, which only its newest attempt has read.
        let pod = PodEntry::new(
            Some(crate::view::facts::tests::sandbox(Default::default())),
            vec![
                attempt("a0", "app", 0, RunState::Exited, None),
                attempt("l0", "logs", 0, RunState::Exited, None),
                attempt("l1", "logs", 1, RunState::Running, Some(2)),
            ],
        );
        let ordered = facts::order(&pod, Ok(None), &StopOrder::default());
        let spec: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"uid": "0f5c7a1e-8d2b-4c3e-9f00-123456789abc"},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "app", "restartPolicy": "OnFailure"}, {"name": "logs"}, {"name": "later"}]}
        }))
        .expect("a pod");
        let api = ApiPod::from_pod(&spec).expect("a uid");
        let members = snapshot_members(&pod, &api, &ordered).expect("readable rules");
        assert_eq!(
            members[0].restart,
            Restart::pod(crate::decide::restart::Policy::OnFailure)
        );
        assert_eq!(
            members[1].restart,
            Restart::pod(crate::decide::restart::Policy::Never)
        );
        let got: Vec<(&str, Option<&str>, u8, RunState)> = members
            .iter()
            .map(|m| (m.name.as_str(), m.id.as_deref(), m.priority, m.state))
            .collect();
        assert_eq!(
            got,
            vec![
                ("app", Some("a0"), 0, RunState::Exited),
                ("logs", Some("l1"), 2, RunState::Running),
                ("later", None, 0, RunState::Created),
            ]
        );
    }
}
