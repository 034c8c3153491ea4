//! The order in which the kubelet stops a pod's native sidecars (KEP-753,
//! `kuberuntime_termination_order.go` `newTerminationOrdering`): after every main container,
//! each after the sidecar declared next after it, so in reverse order. The test bed's own
//! reading, checked against `kubelet-rules/stop-order.tsv` as the agent's is.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::sync::watch;

use super::actions::MAX_RUNTIME_SECONDS;
use super::plan::{Kind, PodPlan};

/// When each native sidecar may be stopped: after every main container, and after the
/// sidecars declared after it (the kubelet's terminationOrdering).
pub(super) struct Ordering {
    terminated: HashMap<String, watch::Sender<bool>>,
    prereqs: HashMap<String, Vec<watch::Receiver<bool>>>,
}

/// Whom each native sidecar waits for before its turn: every main container, and the
/// sidecar declared next after it. Init containers as (name, is a native sidecar), in order.
pub fn prerequisites<'a>(
    init: &[(&'a str, bool)],
    mains: &[&'a str],
) -> HashMap<&'a str, Vec<&'a str>> {
    let mut out = HashMap::new();
    let mut next_sidecar: Option<&str> = None;
    for &(name, sidecar) in init.iter().rev() {
        if sidecar {
            let mut wait = mains.to_vec();
            wait.extend(next_sidecar);
            out.insert(name, wait);
            next_sidecar = Some(name);
        }
    }
    out
}

/// Whether the kubelet begins to stop `other` only once `me` has exited: `me` is among
/// whom `other` waits for, directly or through another sidecar.
pub fn stops_after(init: &[(&str, bool)], mains: &[&str], me: &str, other: &str) -> bool {
    let prereqs = prerequisites(init, mains);
    let mut seen = BTreeSet::new();
    let mut todo = vec![other];
    while let Some(n) = todo.pop() {
        for &p in prereqs.get(n).into_iter().flatten() {
            if p == me {
                return true;
            }
            if seen.insert(p) {
                todo.push(p);
            }
        }
    }
    false
}

/// A plan's containers as [`prerequisites`] takes them.
pub fn shape(plan: &PodPlan) -> (Vec<(&str, bool)>, Vec<&str>) {
    (
        plan.init
            .iter()
            .map(|c| (c.name.as_str(), c.kind == Kind::Sidecar))
            .collect(),
        plan.containers.iter().map(|c| c.name.as_str()).collect(),
    )
}

impl Ordering {
    pub(super) fn new(plan: &PodPlan, running: &[String]) -> Ordering {
        let (init, mains) = shape(plan);
        let mut terminated = HashMap::new();
        let mut receivers = HashMap::new();
        for name in init.iter().map(|(n, _)| *n).chain(mains.iter().copied()) {
            let (tx, rx) = watch::channel(!running.iter().any(|r| r == name));
            terminated.insert(name.to_owned(), tx);
            receivers.insert(name, rx);
        }
        let prereqs = prerequisites(&init, &mains)
            .into_iter()
            .map(|(name, waits)| {
                let rx = waits
                    .iter()
                    .filter_map(|w| receivers.get(w).cloned())
                    .collect();
                (name.to_owned(), rx)
            })
            .collect();
        Ordering {
            terminated,
            prereqs,
        }
    }

    /// Waits for `name`'s turn, at most `limit`; whether it had anything to wait for.
    pub(super) async fn wait_for_turn(&self, name: &str, limit: Duration) -> bool {
        let Some(waits) = self.prereqs.get(name) else {
            return false;
        };
        let deadline = tokio::time::Instant::now()
            + limit.min(Duration::from_secs(MAX_RUNTIME_SECONDS.unsigned_abs()));
        for rx in waits {
            let mut rx = rx.clone();
            if tokio::time::timeout_at(deadline, rx.wait_for(|done| *done))
                .await
                .is_err()
            {
                break;
            }
        }
        true
    }

    pub(super) fn terminated(&self, name: &str) {
        if let Some(tx) = self.terminated.get(name) {
            let _ = tx.send(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_upstream_table_holds() {
        for row in exitorder_kubelet_rules::STOP_ORDER.rows(5) {
            let [init, mains, me, other, want, ..] = row.fields[..] else {
                unreachable!("rows(5)");
            };
            let init: Vec<(&str, bool)> = init
                .split(',')
                .filter(|n| *n != "-")
                .map(|n| (n.trim_end_matches('*'), n.ends_with('*')))
                .collect();
            let mains: Vec<&str> = mains.split(',').collect();
            let got = stops_after(&init, &mains, me, other);
            assert_eq!(got, want == "yes", "row {:?}", row.line);
        }
    }
}
