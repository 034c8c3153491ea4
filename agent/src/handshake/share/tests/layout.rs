//! Names, paths, the share's and the pod-local layout.

use super::*;

#[test]
fn names() {
    // Pod UIDs: `pod` unit tests.
    assert!(ContainerName::parse("linkerd-proxy").is_ok());
    for bad in ["", "-a", "a-", "A", "a_b", "a.b", "..", &"a".repeat(64)] {
        assert!(ContainerName::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn classify_paths() {
    let (_t, s) = setup();
    let p = s.pods_path();
    assert_eq!(
        s.classify(&p.join(UID).join("proxy").join("exit")).unwrap(),
        Some(ShareEntry::ExitFile(key(UID, "proxy")))
    );
    assert_eq!(
        s.classify(&p.join(UID).join("proxy")).unwrap(),
        Some(ShareEntry::Container(key(UID, "proxy")))
    );
    assert_eq!(
        s.classify(&p.join(UID)).unwrap(),
        Some(ShareEntry::Pod(PodUid::parse(UID).unwrap()))
    );
    assert_eq!(
        s.classify(&p.join(UID).join("proxy").join(".tmp")).unwrap(),
        None
    );
    assert_eq!(s.classify(Path::new("/elsewhere/exit")).unwrap(), None);
    assert!(s
        .classify(&p.join("not-a-uid!").join("proxy").join("exit"))
        .is_err());
    assert!(s
        .classify(&p.join(UID).join("Bad_Name").join("exit"))
        .is_err());
}

/// A kubelet root with one pod's `exitorder` emptyDir holding `proxy/`.
fn kubelet() -> (tempfile::TempDir, Share, ExitKey) {
    let t = tempfile::tempdir().unwrap();
    let dir = t
        .path()
        .join("pods")
        .join(UID)
        .join("volumes/kubernetes.io~empty-dir/exitorder/proxy");
    std::fs::create_dir_all(&dir).unwrap();
    let s = Share::open_kubelet(t.path()).unwrap();
    let k = ExitKey {
        pod: PodUid::parse(UID).unwrap(),
        container: ContainerName::parse("proxy").unwrap(),
        place: Place::PodLocal,
    };
    (t, s, k)
}

#[test]
fn pod_local_exit_directories_are_where_the_kubelet_keeps_emptydirs() {
    let (t, s, k) = kubelet();
    let pod = t.path().join("pods").join(UID);
    let volume = pod.join("volumes/kubernetes.io~empty-dir/exitorder");
    assert_eq!(s.container_path(&k), volume.join("proxy"));
    let pod_entry = Some(ShareEntry::Pod(k.pod.clone()));
    for on_the_way in [
        pod.clone(),
        pod.join("volumes"),
        pod.join("volumes/kubernetes.io~empty-dir"),
        volume.clone(),
    ] {
        assert_eq!(
            s.classify(&on_the_way).unwrap(),
            pod_entry,
            "{}",
            on_the_way.display()
        );
    }
    assert_eq!(
        s.classify(&volume.join("proxy")).unwrap(),
        Some(ShareEntry::Container(k.clone()))
    );
    assert_eq!(
        s.classify(&volume.join("proxy/exit")).unwrap(),
        Some(ShareEntry::ExitFile(k.clone()))
    );
    // The kubelet's other files and the pod's other volumes are none of the agent's.
    for other in [
        pod.join("etc-hosts"),
        pod.join("volumes/kubernetes.io~secret"),
        pod.join("volumes/kubernetes.io~empty-dir/cache"),
        pod.join("volumes/kubernetes.io~empty-dir/cache/proxy/exit"),
        volume.join("proxy/junk"),
    ] {
        assert_eq!(s.classify(&other).unwrap(), None, "{}", other.display());
    }
    assert!(s.classify(&volume.join("Bad_Name")).is_err());
    let mut walked = Vec::new();
    let complete = s
        .walk_pod(&k.pod, |p, _| {
            walked.push(p.to_owned());
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
    assert!(complete);
    assert_eq!(walked.last(), Some(&volume));
    assert_eq!(walked.len(), Place::PodLocal.container_depth() - 1);
    assert_eq!(s.containers_in(&k.pod).unwrap(), std::slice::from_ref(&k));
    std::fs::write(volume.join("proxy/exit"), "wait").unwrap();
    assert_eq!(s.read_exit(&k).unwrap(), ExitState::Waiting);
    assert_eq!(s.waiting_in(&k.pod).unwrap(), std::slice::from_ref(&k));
    s.write_allow(&k).unwrap();
    assert_eq!(s.read_exit(&k).unwrap(), ExitState::Allowed);
    // The kubelet removes its pods' directories, never the agent.
    assert_eq!(
        s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
        Removal::Waiting
    );
    assert!(volume.is_dir());
}

#[test]
fn a_pod_local_walk_stops_where_the_kubelet_has_not_made_the_rest() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("pods").join(UID).join("volumes")).unwrap();
    let s = Share::open_kubelet(t.path()).unwrap();
    let pod = PodUid::parse(UID).unwrap();
    let mut walked = 0;
    let complete = s
        .walk_pod(&pod, |_, _| {
            walked += 1;
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
    assert!(!complete);
    assert_eq!(walked, 2);
    assert_eq!(s.containers_in(&pod).unwrap(), []);
}

#[test]
fn links_on_the_way_to_pod_local_directories_are_refused() {
    for level in ["volumes", "volumes/kubernetes.io~empty-dir/exitorder"] {
        let (t, s, k) = kubelet();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("kubernetes.io~empty-dir/exitorder/proxy")).unwrap();
        std::fs::create_dir_all(outside.join("proxy")).unwrap();
        std::fs::write(outside.join("proxy/exit"), "wait").unwrap();
        let at = t.path().join("pods").join(UID).join(level);
        std::fs::remove_dir_all(&at).unwrap();
        symlink(&outside, &at).unwrap();
        let e = s.read_exit(&k).unwrap_err();
        assert_eq!(e.rejection(), Some(Rejection::Link), "{level}: {e}");
        assert!(s.write_allow(&k).is_err(), "{level}");
        assert!(s
            .walk_pod(&k.pod, |_, _| Ok::<(), ()>(()))
            .is_err_and(|e| e.rejection() == Some(Rejection::Link)));
        assert_eq!(
            std::fs::read_to_string(outside.join("proxy/exit")).unwrap(),
            "wait"
        );
    }
}

#[test]
fn the_kubelets_root_is_opened_never_made() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("kubelet");
    assert!(Share::open_kubelet(&root).is_err());
    assert!(!root.exists());
}

#[test]
fn prepare_opens_container_dir_to_its_user() {
    let (_t, s) = setup();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    s.prepare_container_dir(&k).unwrap();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o777);
    assert_eq!(s.containers().unwrap(), vec![k]);
}

#[test]
fn a_share_replaced_under_it_is_no_longer_current() {
    let (t, s) = setup();
    assert!(s.is_current());
    // Moved away and made again: same names, other directories.
    std::fs::rename(t.path().join("pods"), t.path().join("pods.old")).unwrap();
    assert!(!s.is_current());
    std::fs::create_dir(t.path().join("pods")).unwrap();
    assert!(!s.is_current());
    let again = Share::open(t.path()).unwrap();
    assert!(again.is_current());
    // A link where `pods/` was is not the directory opened either.
    std::fs::remove_dir(t.path().join("pods")).unwrap();
    std::os::unix::fs::symlink(t.path().join("pods.old"), t.path().join("pods")).unwrap();
    assert!(!again.is_current());
}
