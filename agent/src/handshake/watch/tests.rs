use std::os::unix::fs::symlink;
use std::time::Duration;

use super::*;

#[test]
fn only_what_can_hold_a_wait_is_told() {
    let pods = &[
        Root {
            pods: "/share/pods".into(),
            container_depth: 2,
        },
        Root {
            pods: "/kubelet/pods".into(),
            container_depth: 5,
        },
    ];
    let uid = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";
    for told in [
        "/share/pods".to_owned(),
        format!("/share/pods/{uid}"),
        format!("/share/pods/{uid}/proxy"),
        format!("/share/pods/{uid}/proxy/exit"),
        "/share".to_owned(),
        format!("/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir"),
        format!("/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/exitorder/proxy"),
        format!("/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/exitorder/proxy/exit"),
    ] {
        assert!(worth_telling(pods, Path::new(&told)), "{told}");
    }
    for dropped in [
        format!("/share/pods/{uid}/proxy/junk-1"),
        format!("/share/pods/{uid}/proxy/.exit.tmp"),
        format!("/share/pods/{uid}/proxy/exit/deeper"),
        format!("/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/exitorder/proxy/junk"),
    ] {
        assert!(!worth_telling(pods, Path::new(&dropped)), "{dropped}");
    }
}

const UID: &str = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";

struct Fixture {
    dir: tempfile::TempDir,
    queue: Arc<FsQueue>,
    watcher: ShareWatcher,
}

impl Fixture {
    /// A root of pods whose exit directories are `pods/<uid>/<c>` (the share's layout).
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pods").join(UID)).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        let queue = Arc::new(FsQueue::default());
        let mut watcher = ShareWatcher::new(
            queue.clone(),
            vec![Root {
                pods: dir.path().join("pods"),
                container_depth: 2,
            }],
        )
        .unwrap();
        assert!(watcher.polling().is_none());
        watcher.watch(&dir.path().join("pods")).unwrap();
        Fixture {
            dir,
            queue,
            watcher,
        }
    }

    fn pods(&self) -> PathBuf {
        self.dir.path().join("pods")
    }

    fn pod(&self) -> PathBuf {
        self.pods().join(UID)
    }

    fn open(path: &Path) -> OwnedFd {
        rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        )
        .unwrap()
    }

    /// Every path told until `want` is, within 10 s.
    fn told_until(&self, want: &Path) -> Vec<PathBuf> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        while std::time::Instant::now() < deadline {
            let b = self.queue.take(usize::MAX);
            seen.extend(b.other);
            for p in b.pods {
                seen.extend(p.paths.unwrap_or_else(|| vec![p.pod_dir]));
            }
            if seen.iter().any(|p| p == want) {
                return seen;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("{} never told; told: {seen:?}", want.display());
    }
}

#[test]
fn a_link_swapped_in_after_the_open_is_never_watched() {
    let mut f = Fixture::new();
    let c = f.pod().join("proxy");
    std::fs::create_dir(&c).unwrap();
    let fd = Fixture::open(&c);
    // Between the agent's open and its watch, the pod puts a link to elsewhere in its place.
    let moved = f.pod().join("moved");
    std::fs::rename(&c, &moved).unwrap();
    symlink(f.dir.path().join("outside"), &c).unwrap();
    f.watcher.watch_at(&c, fd.as_fd()).unwrap();
    // What happens outside is never told; what happens in the directory opened is.
    std::fs::write(f.dir.path().join("outside/exit"), "wait").unwrap();
    std::fs::write(moved.join("exit"), "wait").unwrap();
    let told = f.told_until(&c.join("exit"));
    assert!(
        told.iter()
            .all(|p| !p.starts_with(f.dir.path().join("outside"))),
        "{told:?}"
    );
    // Exactly one watch besides the root and the pod's own level, none of it outside.
    assert_eq!(f.watcher.len(), 2, "root and the container's directory");
}

#[test]
fn a_pods_watches_never_take_the_kubelets_levels_with_them() {
    let mut f = Fixture::new();
    let c = f.pod().join("proxy");
    std::fs::create_dir(&c).unwrap();
    f.watcher.watch_at(&c, Fixture::open(&c).as_fd()).unwrap();
    // The pod's level forgotten (and the same inode added under another name and forgotten
    // again): the root still tells of new pods.
    let other = f.pod().join("other");
    std::fs::rename(&c, &other).unwrap();
    f.watcher
        .watch_at(&other, Fixture::open(&other).as_fd())
        .unwrap();
    f.watcher.forget_pod_levels(&f.pod());
    assert!(f.watcher.is_watched(&f.pods()));
    let new_pod = f.pods().join("11111111-2222-3333-4444-555555555555");
    std::fs::create_dir(&new_pod).unwrap();
    f.told_until(&new_pod);
}

#[test]
fn a_pod_gets_no_more_watches_than_its_share() {
    let mut f = Fixture::new();
    let mut refused = 0;
    for i in 0..(MAX_POD_WATCHES + 10) {
        let c = f.pod().join(format!("c{i}"));
        std::fs::create_dir(&c).unwrap();
        match f.watcher.watch_at(&c, Fixture::open(&c).as_fd()) {
            Ok(()) => {}
            Err(WatchError::Budget { limit, .. }) => {
                assert_eq!(limit, MAX_POD_WATCHES);
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(refused, 10);
    assert_eq!(f.watcher.pod_watches(&f.pod()), MAX_POD_WATCHES);
    f.watcher.forget(&f.pod());
    assert_eq!(f.watcher.pod_watches(&f.pod()), 0);
    assert_eq!(f.watcher.len(), 1, "the root");
}

#[test]
fn a_root_that_goes_is_told_lost() {
    let f = Fixture::new();
    let pods = f.pods();
    std::fs::rename(&pods, f.dir.path().join("pods.old")).unwrap();
    std::fs::remove_dir_all(f.dir.path().join("pods.old")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let b = f.queue.take(usize::MAX);
        if b.lost.contains(&pods) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never told lost");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A tmpfs mounted over a directory the agent already watches (the kubelet's `medium:
/// Memory` emptyDir, made then mounted) hides it, and inotify says nothing: the mount table's
/// change tells the pod, walking it again moves the watch onto the tmpfs, and what is made
/// inside is told. Mounting needs root, as the agent has.
#[test]
fn a_tmpfs_mounted_over_a_watched_directory_is_told_and_watched_anew() {
    let mut f = Fixture::new();
    let pod = f.pod();
    f.watcher
        .watch_at(&pod, Fixture::open(&pod).as_fd())
        .unwrap();
    let _ = f.queue.take(usize::MAX);
    let mount = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new("mount")
            .args(args)
            .output()
            .expect("util-linux mount");
        assert!(
            out.status.success(),
            "mount {args:?} (needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    mount(&[
        "-t".as_ref(),
        "tmpfs".as_ref(),
        "tmpfs".as_ref(),
        pod.as_os_str(),
    ]);
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("--lazy")
                .arg(&self.0)
                .output();
        }
    }
    let _unmount = Unmount(pod.clone());
    f.told_until(&pod);
    let before = f.watcher.len();
    f.watcher
        .watch_at(&pod, Fixture::open(&pod).as_fd())
        .unwrap();
    assert_eq!(f.watcher.len(), before, "the watch moved, not added");
    let c = pod.join("proxy");
    std::fs::create_dir(&c).unwrap();
    f.told_until(&c);
}
