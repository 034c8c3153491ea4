//! Pod-local handshakes on a real containerd: the sidecar's exit directory is a sub-directory
//! of the pod's own `emptyDir` volume, with no hostPath for it in the pod; the agent finds it
//! where the kubelet keeps the volume, under `<kubelet root>/pods/<uid>/volumes/`.
//!
//! Needs root and `containerd runc busybox-static`; without them the test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use exitorder_e2e::support;

use std::time::Duration;

use support::Bed;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test]
async fn a_sidecar_waiting_in_its_pods_own_volume_leaves_after_the_app() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    bed.agent
        .wait_for("pod-local directories served", secs(10), |l| {
            l.says("serving pod-local exit directories", &[])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let running = bed.run_ready(&support::pod_local("pod-local")).await;
    let uid = running.uid().to_owned();
    let volume = bed.node.empty_dir(&uid, "exitorder").join("proxy");
    assert!(volume.is_dir(), "{} is not there", volume.display());
    let d = running.delete().await.expect("delete pod");
    bed.show("pod_local", &d);
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    // Nothing of this pod's went through the host share.
    assert!(
        !bed.node.share_dir().join("pods").join(&uid).exists(),
        "the pod has a directory in the share"
    );
    bed.finish().await;
}

#[tokio::test]
async fn a_link_in_a_pods_own_volume_is_refused_and_its_neighbour_still_ordered() {
    let Some(bed) = Bed::start(secs(3)).await else {
        return;
    };
    let outside = tempfile::tempdir().expect("temp dir");
    std::fs::write(outside.path().join("exit"), "wait").expect("outside exit");
    let running = bed.run_ready(&support::pod_local("linked")).await;
    let uid = running.uid().to_owned();
    // Another container of the pod mounting the whole volume could put a link beside its
    // sidecars' directories: it must lead the agent nowhere.
    let volume = bed.node.empty_dir(&uid, "exitorder");
    std::os::unix::fs::symlink(outside.path(), volume.join("logs")).expect("plant link");
    let d = running.delete().await.expect("delete pod");
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    assert_eq!(
        std::fs::read_to_string(outside.path().join("exit")).expect("outside exit"),
        "wait",
        "an answer was written through the link"
    );
    assert!(
        bed.agent
            .find(|l| l.is("allow", &[("pod", &uid), ("container", "logs")]))
            .is_none(),
        "the linked directory was answered"
    );
    bed.finish().await;
}
