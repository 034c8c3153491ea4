//! In-place updates of a running pod's spec: a container's image changed through the API
//! (`kubectl set image pod/...`, the one container field besides a few others that a Pod's
//! update may change). The kubelet's next sync finds the container's hash changed and kills
//! it ("definition changed", its preStop hook and the pod's grace period), then starts it
//! again from the new spec (`kuberuntime_manager.go` `computePodActions`).

use tokio::sync::oneshot;

use super::plan::Kind;
use super::{worker, Command, RunningPod};
use crate::node::TestbedError;

impl RunningPod {
    /// Changes `container`'s image in the pod's spec, as an update through the API does: the
    /// pod's worker kills the container (Killing "Container NAME definition changed, will be
    /// restarted", or "Init container NAME definition changed" for a native sidecar) and
    /// starts its next attempt with `image` at once. Returns once the worker took the change;
    /// wait on the status (`attempt`, `running`) for the restart. A container that finished
    /// for good is not started again, as with the kubelet.
    pub async fn update_image(&self, container: &str, image: &str) -> Result<(), TestbedError> {
        let Some(c) = self.ctx.plan.container(container) else {
            return Err(TestbedError::BadSpec(format!(
                "pod {} has no container {container}",
                self.name()
            )));
        };
        if c.kind == Kind::Init {
            // An init container that ran to completion is never run again: the kubelet acts
            // on the hash of running containers only.
            return Err(TestbedError::BadSpec(format!(
                "container {container} of pod {} is an init container: the test bed updates \
                 main containers and native sidecars",
                self.name()
            )));
        }
        // Nothing is pulled on the test bed: the new image must be in the node's store.
        if worker::image_status(&self.ctx.node, image).await?.is_none() {
            return Err(TestbedError::ImageMissing {
                pod: self.name().to_owned(),
                container: container.to_owned(),
                image: image.to_owned(),
            });
        }
        let (done, rx) = oneshot::channel();
        self.commands
            .send(Command::UpdateImage {
                container: container.to_owned(),
                image: image.to_owned(),
                done,
            })
            .await
            .map_err(|_| TestbedError::Task("the pod's worker is gone".into()))?;
        rx.await
            .map_err(|_| TestbedError::Task("the pod's worker ended during the update".into()))
    }
}
