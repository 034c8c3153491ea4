//! The share's waits kept current: inotify's events, rescans when events were lost, the
//! flooded pods polled, each wait read, its mark taken, and the refusals counted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use tracing::{debug, warn};

use crate::decide::bounds::Later as _;

use super::marks::Mark;
use super::waits::{Confirmation, PendingPod, Waiter, Waits, CHURN_WINDOW};
use crate::handshake::share::{
    ContainerName, ExitKey, ExitState, Place, PresenceState, Rejection, Share, ShareEntry,
    ShareError,
};
use crate::handshake::watch::{FsEvent, ShareWatcher, WatchError};
use crate::pod::PodUid;

/// The places of exit directories, their watcher and the waits found in them.
pub struct ShareSync<'a> {
    /// The host share.
    pub share: &'a Share,
    /// The kubelet's directory of pods, for pod-local handshakes, when the agent serves them.
    pub local: Option<&'a Share>,
    pub watcher: &'a mut ShareWatcher,
    pub waits: &'a mut Waits,
    pub stats: &'a dyn super::ShareTally,
}

impl<'a> ShareSync<'a> {
    fn at(&self, place: Place) -> Option<&'a Share> {
        match place {
            Place::Share => Some(self.share),
            Place::PodLocal => self.local,
        }
    }

    fn places(&self) -> impl Iterator<Item = &'a Share> {
        std::iter::once(self.share).chain(self.local)
    }

    pub fn on_event(&mut self, ev: FsEvent, dirty: &mut BTreeSet<PodUid>) {
        match ev {
            FsEvent::Changed(paths) => {
                for path in paths {
                    for share in self.places() {
                        match share.classify(&path) {
                            Ok(Some(ShareEntry::Pod(pod))) => self.sync_pod(share, &pod, dirty),
                            Ok(Some(ShareEntry::Container(key))) => {
                                self.sync_container(&key, dirty)
                            }
                            Ok(Some(ShareEntry::ExitFile(key))) => self.sync_exit(&key, dirty),
                            Ok(Some(ShareEntry::MarkFile(key))) => {
                                self.take_mark(&key, dirty);
                            }
                            Ok(None) => continue,
                            Err(e) => {
                                self.count(&e);
                                debug!(error = %e, "ignoring share entry");
                            }
                        }
                        break;
                    }
                }
            }
            FsEvent::Rescan => {
                warn!("file events were lost; rescanning the share");
                self.rescan(dirty);
                dirty.extend(self.waits.pending.keys().cloned());
            }
            FsEvent::Error(e) => {
                self.stats.share_error();
                warn!(error = %e, "share watch error");
            }
        }
    }

    /// Walks every place: watches every pod and container directory and picks up every
    /// exit file waiting.
    pub fn rescan(&mut self, dirty: &mut BTreeSet<PodUid>) {
        // Watches of pod directories that are gone, when the events of their removal were
        // lost (a full inotify queue): the kernel has dropped them; so does the set.
        for share in self.places() {
            let root = share.pods_path();
            for name in self.watcher.watched_below(&root) {
                let dir = root.join(name);
                if std::fs::symlink_metadata(&dir)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
                {
                    self.watcher.forget(&dir);
                }
            }
        }
        for share in self.places() {
            match share.pods() {
                Ok(pods) => {
                    for pod in pods {
                        self.sync_pod(share, &pod, dirty);
                    }
                }
                Err(e) => {
                    self.stats.share_error();
                    warn!(dir = %share.pods_path().display(), error = %e, "cannot list pods");
                }
            }
        }
        // Waits whose directory vanished (or is no directory any more).
        let gone: Vec<(Place, PodUid)> = self
            .waits
            .pending
            .iter()
            .flat_map(|(pod, p)| p.waiting.values().map(move |w| (w.place, pod.clone())))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|(place, pod)| {
                self.at(*place)
                    .is_none_or(|share| share.check_pod_dir(pod).is_err())
            })
            .collect();
        for (place, pod) in gone {
            match self.at(place) {
                Some(share) => self.sync_pod(share, &pod, dirty),
                None => self.waits.drop_pod_at(&pod, place),
            }
        }
    }

    /// Reads a polled pod's exit directories named `names` (at most twice
    /// [`crate::handshake::budget::POLL_NAMES`]), and those of its pending waits, with no
    /// watch.
    pub fn poll_pod(
        &mut self,
        place: Place,
        pod: &PodUid,
        names: &[String],
        dirty: &mut BTreeSet<PodUid>,
    ) {
        let waiting: Vec<String> = self
            .waits
            .pending
            .get(pod)
            .map(|p| p.waiting.keys().map(|c| c.as_str().to_owned()).collect())
            .unwrap_or_default();
        let all: BTreeSet<&str> = names
            .iter()
            .take(crate::handshake::budget::POLL_NAMES.saturating_mul(2))
            .chain(&waiting)
            .map(String::as_str)
            .collect();
        for name in all {
            if let Ok(container) = ContainerName::parse(name) {
                let key = ExitKey {
                    pod: pod.clone(),
                    container,
                    place,
                };
                self.sync_container(&key, dirty);
            }
        }
    }

    /// Counts a refused entry by its kind, or an I/O error that says nothing about the entry.
    fn count(&self, e: &ShareError) {
        match e.rejection() {
            Some(why) => self.stats.share_rejected(why),
            None => self.stats.share_error(),
        }
    }

    fn sync_pod(&mut self, share: &Share, pod: &PodUid, dirty: &mut BTreeSet<PodUid>) {
        let path = share.pod_path(pod);
        // Opened without following a link first: inotify follows one and would watch its
        // target. (Only the kubelet, as root, can swap the directory between the two.)
        // Watched before listing, level by level: the kubelet creates what is below right
        // after, and what is created between a listing and its watch would go unseen.
        let watcher = &mut *self.watcher;
        match share.walk_pod(pod, |dir, fd| watcher.watch_at(dir, fd)) {
            Ok(Ok(true)) => match share.containers_in(pod) {
                Ok(keys) => {
                    for key in keys {
                        self.sync_container(&key, dirty);
                    }
                }
                Err(e) => {
                    self.stats.share_error();
                    warn!(pod = %pod, error = %e, "cannot list pod directory");
                }
            },
            // The kubelet has not made the rest yet: the last level's watch tells when it does.
            Ok(Ok(false)) => {}
            Ok(Err(WatchError::Budget { .. })) => {}
            Ok(Err(e)) => {
                self.stats.share_error();
                warn!(error = %e, "cannot watch pod directory");
            }
            Err(e) if e.is_not_found() => self.watcher.forget(&path),
            Err(e) => {
                self.count(&e);
                warn!(pod = %pod, error = %e, "skipping pod directory");
                self.watcher.forget(&path);
            }
        }
        // Waits recorded for containers whose directory is gone are re-read (and dropped).
        let place = share.place();
        let known: Vec<ExitKey> = self
            .waits
            .pending
            .get(pod)
            .map(|p| {
                p.waiting
                    .iter()
                    .filter(|(_, w)| w.place == place)
                    .map(|(c, _)| ExitKey {
                        pod: pod.clone(),
                        container: c.clone(),
                        place,
                    })
                    .collect()
            })
            .unwrap_or_default();
        for key in known {
            self.sync_exit(&key, dirty);
        }
    }

    fn sync_container(&mut self, key: &ExitKey, dirty: &mut BTreeSet<PodUid>) {
        let Some(share) = self.at(key.place) else {
            return;
        };
        match share.prepare_container_dir(key) {
            Ok(dir) => {
                use std::os::fd::AsFd as _;
                let watched = match self
                    .watcher
                    .watch_at(&share.container_path(key), dir.as_fd())
                {
                    Ok(()) => true,
                    // Past its share of watches: the pod is polled (the watcher tells the loop).
                    Err(WatchError::Budget { .. }) => false,
                    Err(e) => {
                        self.stats.share_error();
                        warn!(container = %key, error = %e, "cannot watch container directory");
                        false
                    }
                };
                // Marked as watched, so within the pod's share of watches: a pod that makes
                // thousands of directories gets no more marks than watches (its real
                // sidecars' are marked when they ask, in `sync_exit`). Not counted as a share
                // error: what stands in the way (a directory named `agent`) is the
                // container's own doing, and costs only its own preStop.
                if watched || self.watcher.polling().is_some() {
                    if let Err(e) = share.mark_presence(&dir, key, PresenceState::Serving) {
                        debug!(container = %key, error = %e, "cannot mark the agent's presence");
                    }
                }
            }
            Err(e) if e.is_not_found() => {
                self.watcher.forget(&share.container_path(key));
                return self.sync_exit(key, dirty);
            }
            Err(e) => {
                self.count(&e);
                warn!(container = %key, error = %e, "skipping container directory");
                if e.rejection().is_some() {
                    // No wait lives in what is no directory of the pod's own; reading its
                    // exit file would only refuse (and count) it a second time.
                    self.watcher.forget(&share.container_path(key));
                    self.waits.drop_waiter(key);
                    self.stats.set_pending(self.waits.count());
                    return;
                }
            }
        }
        // A mark made before the directory was watched (or whose event was lost) is taken
        // now: it is one no agent has taken yet, so it is new. Else what an agent took before
        // (this one, or the one before a restart or an upgrade) is recalled.
        if !self.take_mark(key, dirty) {
            self.recall_mark(key, dirty);
        }
        self.sync_exit(key, dirty);
    }

    /// Takes the container's mark, if it made one: noted on the agent's clock, and the pod's
    /// waits decided again with it; whether there was one.
    fn take_mark(&mut self, key: &ExitKey, dirty: &mut BTreeSet<PodUid>) -> bool {
        let Some(share) = self.at(key.place) else {
            return false;
        };
        let now = Instant::now();
        let clock = crate::decide::bounds::WallClock::at(now);
        let made_ns = match share.take_mark(key, clock.ns(now)) {
            Ok(made) => made,
            Err(e) => {
                self.count(&e);
                debug!(container = %key, error = %e, "cannot take the container's mark");
                None
            }
        };
        let Some(made_ns) = made_ns else {
            return false;
        };
        let made = clock.instant(made_ns);
        debug!(event = "marked", pod = %key.pod, container = %key.container, made_ms_ago = now.saturating_duration_since(made).as_millis(), "the container is being stopped");
        self.noted(key, Mark { seen: now, made }, dirty);
        true
    }

    /// What an agent noted of the container's last mark, taken before this one ran (or before
    /// the events that said so were lost).
    fn recall_mark(&mut self, key: &ExitKey, dirty: &mut BTreeSet<PodUid>) {
        let Some(share) = self.at(key.place) else {
            return;
        };
        let Ok(Some(seen_ns)) = share.mark_seen(key) else {
            return;
        };
        let now = Instant::now();
        let clock = crate::decide::bounds::WallClock::at(now);
        // A note from the future (a clock stepped back, or the container's own writing) is
        // taken as now: it errs toward a pod kill, the container's own pod's loss.
        let at = clock.instant(seen_ns.min(clock.ns(now)));
        self.noted(key, Mark::at(at), dirty);
    }

    fn noted(&mut self, key: &ExitKey, at: Mark, dirty: &mut BTreeSet<PodUid>) {
        self.waits.marks.note(&key.pod, &key.container, at);
        if self.waits.pending.contains_key(&key.pod) {
            dirty.insert(key.pod.clone());
        }
    }

    fn sync_exit(&mut self, key: &ExitKey, dirty: &mut BTreeSet<PodUid>) {
        let Some(share) = self.at(key.place) else {
            self.waits.drop_waiter(key);
            return;
        };
        let (state, file) = match share.read_request(key) {
            Ok(s) => s,
            Err(e) => {
                self.count(&e);
                warn!(container = %key, error = %e, "skipping unreadable exit file");
                (ExitState::Absent, None)
            }
        };
        match state {
            ExitState::Waiting => {
                let waits = &mut *self.waits;
                let now = Instant::now();
                let mut rerun = false;
                if let Some(p) = waits.pending.get_mut(&key.pod) {
                    match p.waiting.get_mut(&key.container) {
                        Some(w) if w.file.is_none() || w.file == file || file.is_none() => {
                            w.file = w.file.or(file);
                            return;
                        }
                        // The same wait asked again: its hook ran again.
                        Some(_) => rerun = true,
                        None => rerun = p.removed.remove(&key.container),
                    }
                }
                // The agent's own sight of the file starts the wait: the file's times are the
                // pod's to set (see `Decisions::deletion_and_clock` for a file found at start).
                let since = now;
                // A wait says its container is being stopped, as a mark does.
                waits.marks.note(&key.pod, &key.container, Mark::at(now));
                let found_at_start = waits.starting;
                let churning = waits.seen(key, now);
                let pod = waits
                    .pending
                    .entry(key.pod.clone())
                    .or_insert_with(|| PendingPod {
                        first_seen: since,
                        waiting: BTreeMap::new(),
                        wake: None,
                        confirm: Confirmation::default(),
                        checking: false,
                        checked: false,
                        found_at_start,
                        rerun_at: None,
                        removed: BTreeSet::new(),
                    });
                pod.first_seen = pod.first_seen.min(since);
                let mut waiter = Waiter::new(since, key.place);
                waiter.file = file;
                // A wait in a directory the agent had not marked (the container removed the
                // mark, or asked before the agent saw its directory): marked now, well within
                // the sidecar's short wait for it.
                if let Err(e) = share.mark_presence_of(key, PresenceState::Serving) {
                    debug!(container = %key, error = %e, "cannot mark the agent's presence");
                }
                pod.waiting.insert(key.container.clone(), waiter);
                if rerun {
                    debug!(container = %key, "exit file made again: the kubelet started the pod's kill over");
                    pod.rerun_at = Some(now);
                    // Its kill is new: what was known of the last one is not known of this one.
                    pod.confirm.restarting.remove(key.container.as_str());
                    pod.confirm.alone.remove(key.container.as_str());
                }
                debug!(event = "waiting", pod = %key.pod, container = %key.container, "exit file waiting");
                if churning {
                    // Decided at the end of the window, with whatever came meanwhile: a
                    // container remaking its exit file in a loop is a rerun each time, and
                    // would otherwise cost a decision (and a runtime listing) per write.
                    self.stats.exit_churn();
                    let at = now.later(CHURN_WINDOW);
                    pod.wake = Some(pod.wake.map_or(at, |w| w.min(at)));
                } else {
                    dirty.insert(key.pod.clone());
                }
            }
            ExitState::Unexpected(text) => {
                self.stats.share_rejected(Rejection::UnexpectedContent);
                // Debug-quoted: the content is the pod's, and a line break in it must not
                // forge a log line of the agent's own.
                warn!(container = %key, content = ?text, "exit file has unexpected content; ignored");
                self.waits.drop_waiter(key);
            }
            ExitState::Absent => {
                let pending = self
                    .waits
                    .pending
                    .get(&key.pod)
                    .and_then(|p| p.waiting.get(&key.container))
                    .is_some_and(|w| w.place == key.place);
                if pending {
                    // Gone unanswered: the entrypoint gave up on the agent (or was stopped).
                    self.stats.wait_withdrawn();
                }
                self.waits.drop_removed(key);
            }
            ExitState::Allowed => self.waits.drop_waiter(key),
        }
        self.stats.set_pending(self.waits.count());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::waits::HISTORY_MAX;
    use crate::stats::Stats;
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::Duration;

    const UID: &str = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";

    struct Fixture {
        dir: tempfile::TempDir,
        share: Share,
        watcher: ShareWatcher,
        waits: Waits,
        stats: Arc<Stats>,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let share = Share::open(&dir.path().join("share")).unwrap();
            Fixture {
                watcher: ShareWatcher::new(
                    Arc::new(crate::handshake::fsqueue::FsQueue::default()),
                    vec![crate::handshake::watch::Root {
                        pods: share.pods_path(),
                        container_depth: 2,
                    }],
                )
                .unwrap(),
                share,
                waits: Waits::default(),
                stats: Arc::new(Stats::default()),
                dir,
            }
        }

        fn pods(&self) -> PathBuf {
            self.share.pods_path()
        }

        fn outside(&self) -> PathBuf {
            self.dir.path().join("outside")
        }

        /// What the watcher would report for `path`.
        fn changed(&mut self, path: &Path) -> BTreeSet<PodUid> {
            let mut dirty = BTreeSet::new();
            ShareSync {
                share: &self.share,
                local: None,
                watcher: &mut self.watcher,
                waits: &mut self.waits,
                stats: &*self.stats,
            }
            .on_event(FsEvent::Changed(vec![path.to_owned()]), &mut dirty);
            dirty
        }

        fn rejected(&self) -> Vec<(Rejection, u64)> {
            Rejection::ALL
                .iter()
                .map(|r| (*r, self.stats.share_rejections(*r)))
                .filter(|(_, n)| *n > 0)
                .collect()
        }
    }

    fn fifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
    }

    #[test]
    fn a_wait_is_dated_by_the_agents_sight_never_by_the_files_times() {
        let mut f = Fixture::new();
        let dir = f.pods().join(UID).join("proxy");
        std::fs::create_dir_all(&dir).unwrap();
        let exit = dir.join("exit");
        std::fs::write(&exit, "wait\n").unwrap();
        // Written "an hour ago", as a pod can claim with utimensat: believed, it would put
        // the wait past its deadline at once.
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&exit)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        let before = Instant::now();
        f.changed(&exit);
        let pod = f.waits.get(&PodUid::parse(UID).unwrap()).unwrap();
        assert!(pod.first_seen >= before, "dated from the file's mtime");
        assert!(!pod.found_at_start);
        assert!(pod.waiting.values().all(|w| w.since >= before));
    }

    /// The entrypoint's way of asking again: the old file removed, a new one made.
    fn ask_again(exit: &Path) {
        std::fs::remove_file(exit).unwrap();
        std::fs::write(exit, "wait\n").unwrap();
    }

    #[test]
    fn a_wait_that_asks_again_starts_the_kill_over() {
        let mut f = Fixture::new();
        let uid = PodUid::parse(UID).unwrap();
        let exits: Vec<PathBuf> = ["proxy", "logs"]
            .iter()
            .map(|c| {
                let dir = f.pods().join(UID).join(c);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join("exit"), "wait\n").unwrap();
                f.changed(&dir.join("exit"));
                dir.join("exit")
            })
            .collect();
        let first = f.waits.get(&uid).unwrap().first_seen;
        // Seen again unchanged (a later event of the same file): the same wait.
        f.changed(&exits[0]);
        assert_eq!(f.waits.get(&uid).unwrap().rerun_at, None);

        // Removed and made anew, the events coalesced before the agent read: another file.
        std::thread::sleep(std::time::Duration::from_millis(5));
        ask_again(&exits[0]);
        let before = Instant::now();
        f.changed(&exits[0]);
        let pod = f.waits.get(&uid).unwrap();
        let rerun = pod.rerun_at.expect("a rerun");
        assert!(rerun >= before && pod.first_seen == first);

        // Removed and read while gone, then made anew: a rerun too, while another waits.
        std::fs::remove_file(&exits[1]).unwrap();
        f.changed(&exits[1]);
        assert_eq!(f.waits.count(), 1);
        std::fs::write(&exits[1], "wait\n").unwrap();
        let before = Instant::now();
        f.changed(&exits[1]);
        let pod = f.waits.get(&uid).unwrap();
        assert!(pod.rerun_at.is_some_and(|r| r >= before));
        assert_eq!(f.waits.count(), 2);
    }

    /// A container remaking its exit file in a loop: each remade file is a rerun, decided at
    /// the end of the churn window rather than at once (a decision, and a runtime listing, per
    /// write); a rerun after the window is decided at once.
    #[test]
    fn a_wait_remade_within_the_churn_window_is_decided_at_its_end() {
        let mut f = Fixture::new();
        let uid = PodUid::parse(UID).unwrap();
        let dir = f.pods().join(UID).join("proxy");
        std::fs::create_dir_all(&dir).unwrap();
        let exit = dir.join("exit");
        std::fs::write(&exit, "wait\n").unwrap();
        assert!(
            f.changed(&exit).contains(&uid),
            "a first wait is decided at once"
        );

        // Removed and made anew at once, the events coalesced before the agent read.
        std::thread::sleep(Duration::from_millis(5));
        ask_again(&exit);
        let before = Instant::now();
        let dirty = f.changed(&exit);
        let pod = f.waits.get(&uid).unwrap();
        assert!(pod.rerun_at.is_some(), "a rerun");
        assert!(
            !dirty.contains(&uid),
            "decided at the window's end, not at once"
        );
        assert!(
            pod.wake
                .is_some_and(|w| w >= before && w <= Instant::now() + CHURN_WINDOW),
            "woken at the window's end: {:?}",
            pod.wake
        );

        std::thread::sleep(CHURN_WINDOW + Duration::from_millis(20));
        ask_again(&exit);
        assert!(
            f.changed(&exit).contains(&uid),
            "a rerun after the window is decided at once"
        );
        assert!(f
            .waits
            .get(&uid)
            .unwrap()
            .rerun_at
            .is_some_and(|r| r > before));
    }

    #[test]
    fn each_refusal_is_counted_once_by_its_kind() {
        let mut f = Fixture::new();
        let pods = f.pods();
        std::fs::create_dir_all(f.outside().join("proxy")).unwrap();
        std::fs::write(f.outside().join("proxy/exit"), "wait").unwrap();
        let real = pods.join(UID).join("proxy");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("exit"), "wait\n").unwrap();
        assert!(f
            .changed(&real.join("exit"))
            .contains(&PodUid::parse(UID).unwrap()));
        assert_eq!(f.waits.count(), 1);

        std::fs::create_dir_all(pods.join("NOT-A-UID")).unwrap();
        f.changed(&pods.join("NOT-A-UID"));
        std::fs::create_dir_all(pods.join(UID).join("Bad_Name")).unwrap();
        f.changed(&pods.join(UID).join("Bad_Name"));
        // A pod entry that links out is neither listed nor watched.
        let watches = f.watcher.len();
        let linked_pod = pods.join("11111111-2222-3333-4444-555555555555");
        symlink(f.outside(), &linked_pod).unwrap();
        f.changed(&linked_pod);
        assert_eq!(f.watcher.len(), watches);
        f.changed(&linked_pod.join("proxy").join("exit"));
        // A container entry that links to another pod's directory: refused once, not twice.
        let other = pods.join("22222222-2222-3333-4444-555555555555");
        std::fs::create_dir_all(&other).unwrap();
        symlink(&real, other.join("proxy")).unwrap();
        f.changed(&other.join("proxy"));
        std::fs::write(pods.join("33333333-2222-3333-4444-555555555555"), "x").unwrap();
        f.changed(&pods.join("33333333-2222-3333-4444-555555555555"));
        std::fs::create_dir_all(pods.join(UID).join("fifo")).unwrap();
        fifo(&pods.join(UID).join("fifo/exit"));
        f.changed(&pods.join(UID).join("fifo/exit"));
        std::fs::create_dir_all(pods.join(UID).join("odd")).unwrap();
        std::fs::write(pods.join(UID).join("odd/exit"), "x\nevent=allow").unwrap();
        f.changed(&pods.join(UID).join("odd/exit"));

        assert_eq!(
            f.rejected(),
            [
                (Rejection::Link, 3),
                (Rejection::NotAFile, 1),
                (Rejection::NotADirectory, 1),
                (Rejection::BadName, 2),
                (Rejection::UnexpectedContent, 1),
            ]
        );
        assert_eq!(f.stats.share_errors(), 0);
        // Only the real wait is one; nothing outside was made writable.
        assert_eq!(f.waits.count(), 1);
        assert_eq!(f.stats.pending(), 1);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(f.outside().join("proxy"))
            .unwrap()
            .permissions()
            .mode();
        assert_ne!(mode & 0o777, 0o777);
    }

    #[test]
    fn the_churn_history_is_bounded() {
        let mut w = Waits::default();
        let key = |i: usize| ExitKey {
            pod: PodUid::parse(UID).unwrap(),
            container: ContainerName::parse(&format!("c{i}")).unwrap(),
            place: Place::Share,
        };
        let t0 = Instant::now();
        for i in 0..HISTORY_MAX {
            assert!(!w.seen(&key(i), t0));
        }
        assert!(w.seen(&key(0), t0 + Duration::from_millis(1)), "churn");
        // Full of recent ones: all forgotten, the newest remembered.
        assert!(!w.seen(&key(HISTORY_MAX), t0 + Duration::from_millis(2)));
        assert_eq!(w.history_len(), 1);
        // Full of old ones and one recent: the old ones make room, the recent one stays.
        let later = t0 + CHURN_WINDOW * 20;
        for i in 0..HISTORY_MAX - 2 {
            w.seen(&key(i), t0 + Duration::from_millis(3));
        }
        w.seen(&key(HISTORY_MAX + 2), later);
        assert_eq!(w.history_len(), HISTORY_MAX);
        assert!(!w.seen(&key(HISTORY_MAX + 1), later));
        assert_eq!(w.history_len(), 2);
    }

    #[test]
    fn a_wait_whose_directory_turns_into_a_link_is_dropped() {
        let mut f = Fixture::new();
        let dir = f.pods().join(UID).join("proxy");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("exit"), "wait\n").unwrap();
        f.changed(&dir.join("exit"));
        assert_eq!(f.waits.count(), 1);
        // Moved away, a link to a directory with a waiting exit file in its place.
        std::fs::create_dir_all(f.outside()).unwrap();
        std::fs::rename(&dir, f.outside().join("moved")).unwrap();
        symlink(f.outside().join("moved"), &dir).unwrap();
        f.changed(&dir);
        assert_eq!(f.waits.count(), 0);
        assert_eq!(f.stats.pending(), 0);
        assert_eq!(f.rejected(), [(Rejection::Link, 1)]);
        // A rescan finds no wait there either.
        let mut dirty = BTreeSet::new();
        ShareSync {
            share: &f.share,
            local: None,
            watcher: &mut f.watcher,
            waits: &mut f.waits,
            stats: &*f.stats,
        }
        .rescan(&mut dirty);
        assert_eq!(f.waits.count(), 0);
    }

    #[test]
    fn a_mark_is_taken_once_and_recalled_by_a_later_agent() {
        let mut f = Fixture::new();
        let dir = f.pods().join(UID).join("app");
        std::fs::create_dir_all(&dir).unwrap();
        f.changed(&dir);
        std::fs::write(dir.join("stopping"), "").unwrap();
        let before = Instant::now();
        f.changed(&dir.join("stopping"));
        let pod = PodUid::parse(UID).unwrap();
        let seen: Vec<(String, Mark)> = f
            .waits
            .marks
            .of(&pod)
            .map(|(c, t)| (c.to_owned(), t))
            .collect();
        assert_eq!(seen.len(), 1);
        // Seen after the write, made when the file was (its inode's change time).
        assert!(seen[0].1.seen >= before, "{seen:?}");
        assert!(seen[0].1.made <= before, "{seen:?}");
        // Taken: gone, and noted in its place.
        assert!(!dir.join("stopping").exists());
        let note = std::fs::read_to_string(dir.join("stopping.seen")).unwrap();
        assert!(note.starts_with("seen="), "{note}");
        // The same event again (a rescan) takes nothing new.
        f.changed(&dir.join("stopping"));
        assert_eq!(f.waits.marks.of(&pod).count(), 1);
        // A later agent (a restart, an upgrade) knows of it from the note, seen when it was.
        f.waits = Waits::default();
        f.changed(&dir);
        let recalled: Vec<Instant> = f.waits.marks.of(&pod).map(|(_, t)| t.seen).collect();
        assert_eq!(recalled.len(), 1);
        let sight = seen[0].1.seen;
        let apart = recalled[0]
            .max(sight)
            .saturating_duration_since(recalled[0].min(sight));
        assert!(apart < Duration::from_millis(5), "{apart:?}");
        // A note from the future is taken as now; a note of junk as nothing.
        std::fs::write(dir.join("stopping.seen"), format!("seen={}", i64::MAX)).unwrap();
        f.waits = Waits::default();
        let now = Instant::now();
        f.changed(&dir);
        assert!(f.waits.marks.of(&pod).all(|(_, t)| t.seen >= now));
        std::fs::write(dir.join("stopping.seen"), "junk").unwrap();
        f.waits = Waits::default();
        f.changed(&dir);
        assert_eq!(f.waits.marks.of(&pod).count(), 0);
    }
}
