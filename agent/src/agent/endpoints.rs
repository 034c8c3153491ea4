//! Endpoints first, on the decision loop's side: the hold of a pod's apps for its endpoints,
//! from its annotations and what the follow of its EndpointSlices told (see
//! [`crate::decide::endpoints`] and [`crate::cluster::endpoints`]).

use crate::agent::Agent;
use crate::cluster::podwatch::ApiPod;
use crate::decide;
use crate::pod::PodUid;

impl Agent {
    /// The hold of the pod's apps for its endpoints, when it asked for one: followed while
    /// the API server shows it deleted; else nothing can tell (no API server, or a kill of the
    /// kubelet's own, which withdraws no endpoint: kubernetes#116965).
    pub(super) fn endpoints_gate(
        &mut self,
        pod: &PodUid,
        policy: Result<Option<decide::endpoints::Policy>, decide::endpoints::PolicyError>,
        api: Option<&ApiPod>,
    ) -> Option<decide::endpoints::Gate> {
        use decide::endpoints::{Gate, Untold, Withdrawal};
        let policy = match policy {
            Ok(p) => p?,
            Err(e) => {
                self.warn_once(
                    pod,
                    &e,
                    "bad endpoints annotation; the pod's apps do not wait for its endpoints",
                );
                return None;
            }
        };
        let current = self.api.pods.as_ref().is_some_and(|p| p.is_current());
        // A follow under way goes on telling while the pod watch re-lists: its word is the
        // slices', not the pod watch's.
        // An agent (re)started during the kill did not see the wait begin: the deletion's
        // request is the earliest the hook can have started.
        let began_by = self
            .waits
            .pending
            .get(pod)
            .filter(|p| p.found_at_start)
            .and_then(|_| api?.deletion_requested)
            .and_then(|s| decide::bounds::instant_of_unix(s, std::time::Instant::now()));
        if let Some(w) = self.api.followed.get(pod) {
            return Some(Gate {
                policy,
                withdrawal: *w,
                began_by,
            });
        }
        let withdrawal = match api {
            Some(a) if current && a.deleting => self.api.endpoints(pod, &a.namespace),
            Some(_) if current => Withdrawal::Untold(Untold::NotDeleted),
            _ => Withdrawal::Untold(Untold::NoApi),
        };
        Some(Gate {
            policy,
            withdrawal,
            began_by,
        })
    }
}
