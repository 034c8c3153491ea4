//! The watcher's thread: reads both inotify instances and the mount table and files each
//! event in the queue.

use std::os::unix::ffi::OsStrExt;

use rustix::fs::inotify::{self, ReadFlags};
use rustix::io::Errno;

use super::mounts::MountTable;
use super::{pod_dir_of, table, worth_telling, Inst, Shared};

/// The reading thread: both instances and the mount table until woken to end. The
/// kubelet's instance is read first at each wake; each is read a bounded number of times per
/// wake, so the pods' cannot keep the kubelet's waiting.
pub(super) fn read_events(shared: &Shared, mut mounts: Option<MountTable>) {
    use rustix::event::{poll, PollFd, PollFlags};
    // Aligned for `struct inotify_event` (the reader checks), room for many.
    let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
    loop {
        let (kube_ready, pods_ready, woken, remounted) = {
            let mut fds = vec![
                PollFd::new(&shared.kube, PollFlags::IN),
                PollFd::new(&shared.pods, PollFlags::IN),
                PollFd::new(&shared.wake, PollFlags::IN),
            ];
            if let Some(m) = &mounts {
                fds.push(PollFd::from_borrowed_fd(m.fd(), PollFlags::PRI));
            }
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(e) => {
                    shared.queue.error(format!("poll: {e}"));
                    return;
                }
            }
            let ready = |i: usize| fds.get(i).is_some_and(|f| !f.revents().is_empty());
            (ready(0), ready(1), ready(2), ready(3))
        };
        if woken {
            return;
        }
        if kube_ready {
            drain(shared, Inst::Kube, &mut buf);
        }
        if pods_ready {
            drain(shared, Inst::Pods, &mut buf);
        }
        if remounted {
            if let Some(m) = &mut mounts {
                match m.changed(&shared.roots) {
                    Ok(pods) => {
                        for pod_dir in pods {
                            shared.queue.push(Some(&pod_dir), pod_dir.clone());
                        }
                    }
                    // Unreadable now (it never is, short of memory): watched no longer, and
                    // the pods are walked as their own events come.
                    Err(e) => {
                        tracing::warn!(event = "mount_table_unavailable", error = %e, "the mount table could not be read again: mounts are no longer watched");
                        mounts = None;
                    }
                }
            }
        }
    }
}

/// Reads what one instance has (at most a few buffers), filing each event.
fn drain(shared: &Shared, inst: Inst, buf: &mut [std::mem::MaybeUninit<u8>]) {
    let fd = match inst {
        Inst::Kube => &shared.kube,
        Inst::Pods => &shared.pods,
    };
    let mut reader = inotify::Reader::new(fd, buf);
    // A bounded number of events per wake: the other instance is looked at in between.
    for _ in 0..16_384 {
        let ev = match reader.next() {
            Ok(ev) => ev,
            Err(Errno::AGAIN | Errno::INTR) => return,
            Err(e) => {
                shared.queue.error(format!("inotify read: {e}"));
                return;
            }
        };
        let flags = ev.events();
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            shared.queue.rescan();
            continue;
        }
        let key = (inst, ev.wd());
        if flags.contains(ReadFlags::IGNORED) {
            // The kernel dropped the watch (its directory went, or was unmounted); a root's
            // loss is told so it is watched again.
            let gone = table(shared).remove(&key);
            if let Some(dir) = gone {
                if shared.roots.iter().any(|r| r.pods == dir) {
                    shared.queue.lost(dir);
                } else if let Some((_, pod_dir)) = pod_dir_of(&shared.roots, &dir) {
                    // A level of a pod: the pod is walked again, which watches what is there.
                    shared.queue.push(Some(&pod_dir), pod_dir.clone());
                }
            }
            continue;
        }
        let path = {
            let t = table(shared);
            let Some(dir) = t.get(&key) else {
                continue;
            };
            match ev.file_name() {
                Some(name) if !name.to_bytes().is_empty() => {
                    dir.join(std::ffi::OsStr::from_bytes(name.to_bytes()))
                }
                _ => dir.clone(),
            }
        };
        if !worth_telling(&shared.roots, &path) {
            continue;
        }
        match pod_dir_of(&shared.roots, &path) {
            Some((_, pod_dir)) => shared.queue.push(Some(&pod_dir), path),
            None => shared.queue.push(None, path),
        }
    }
}
