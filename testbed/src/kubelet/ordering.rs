//! The order in which the kubelet stops a pod's native sidecars (KEP-753,
//! `kuberuntime_termination_order.go`): after every main container, each after the sidecars
//! declared after it, in reverse order.

use std::collections::HashMap;
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

impl Ordering {
    pub(super) fn new(plan: &PodPlan, running: &[String]) -> Ordering {
        let mut terminated = HashMap::new();
        let mut prereqs: HashMap<String, Vec<watch::Receiver<bool>>> = HashMap::new();
        let mut channel = |name: &str| {
            let (tx, rx) = watch::channel(!running.iter().any(|r| r == name));
            terminated.insert(name.to_owned(), tx);
            rx
        };
        let mains: Vec<watch::Receiver<bool>> =
            plan.containers.iter().map(|c| channel(&c.name)).collect();
        let mut later: Option<watch::Receiver<bool>> = None;
        for c in plan.init.iter().rev() {
            let rx = channel(&c.name);
            if c.kind == Kind::Sidecar {
                let mut wait = mains.clone();
                wait.extend(later.take());
                prereqs.insert(c.name.clone(), wait);
                later = Some(rx);
            }
        }
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
