//! How the agent leaves a node. A restart (a crash, a rolling update, a pod deleted by hand)
//! leaves every wait and every presence mark in place: the sidecars keep waiting, and the
//! next agent answers them in order. An uninstall leaves nobody to answer: every wait is let
//! go and every directory says so, so no sidecar on the node waits out its timeout for an
//! agent that will not come back.

use tracing::{debug, info, warn};

use super::Agent;
use crate::handshake::share::{ExitKey, PresenceState};

impl Agent {
    /// Lets every waiting sidecar go and marks every directory served as left for good.
    /// Pending waits first: a sidecar of an earlier release reads only its `exit`.
    pub(super) fn leave_node(&mut self) {
        let waiting: Vec<ExitKey> = self
            .waits
            .pending
            .iter()
            .flat_map(|(pod, p)| {
                p.waiting.iter().map(|(container, w)| ExitKey {
                    pod: pod.clone(),
                    container: container.clone(),
                    place: w.place,
                })
            })
            .collect();
        let (mut released, mut marked, mut failed) = (0usize, 0usize, 0usize);
        for key in &waiting {
            match self.place(key.place).map(|share| share.write_allow(key)) {
                Some(Ok(())) => {
                    released = released.saturating_add(1);
                    info!(container = %key, reason = "uninstalled", "exit allowed");
                }
                Some(Err(e)) => {
                    failed = failed.saturating_add(1);
                    debug!(container = %key, error = %e, "cannot let a waiting sidecar go");
                }
                None => {}
            }
        }
        // Pod by pod: a directory that cannot be read costs only its own marks.
        for share in self.places() {
            let pods = match share.pods() {
                Ok(pods) => pods,
                Err(e) => {
                    warn!(dir = %share.pods_path().display(), error = %e, "cannot list the exit directories to mark them left");
                    continue;
                }
            };
            for pod in pods {
                let keys = match share.containers_in(&pod) {
                    Ok(keys) => keys,
                    Err(e) => {
                        failed = failed.saturating_add(1);
                        debug!(pod = %pod, error = %e, "cannot list a pod's exit directories to mark them left");
                        continue;
                    }
                };
                for key in keys {
                    match share.mark_presence_of(&key, PresenceState::Uninstalled) {
                        Ok(_) => marked = marked.saturating_add(1),
                        Err(e) => {
                            failed = failed.saturating_add(1);
                            debug!(container = %key, error = %e, "cannot mark a directory left");
                        }
                    }
                }
            }
        }
        info!(
            event = "uninstalled",
            released,
            marked,
            failed,
            "exitorder is uninstalled from this node: every waiting sidecar was let go, and every exit directory says no agent will answer"
        );
    }
}
