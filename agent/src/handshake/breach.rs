//! Whose exit directories a container can write in, as the runtime mounted it.
//!
//! Admission keeps pods to their own directory (the webhook's guard); this checks again at run
//! time, from each container's mounts as the runtime reports them (once per container, from
//! the status the view reads anyway), for clusters without the guard, pods admitted before
//! it, and what admission cannot see (a hostPath through a link on the node). Mounts are
//! compared by what they point at (device and inode), not by name: a subPath mount is reported
//! by the runtime as the kubelet's bind target under `<kubelet root>/pods/<uid>/volume-subpaths/`.
//!
//! A pod may only harm its own order, so a breach is a writable mount that reaches another
//! pod's exit directory, or all of them (the share, its `pods/`, the kubelet's `pods/`, or a
//! parent of those). The agent reports it (log, `exitorder_share_breaches_total`, Events on
//! both pods; `agent/share.rs`); the victim's waits go on being answered in order.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::handshake::hostpath::components;
use crate::handshake::share::{Place, Share};
use crate::pod::PodUid;

/// How many writable mounts of one container are looked at: more than any pod declares.
pub const MAX_MOUNTS: usize = 256;
/// How many directories one index holds: every pod's and container's of a full node, many
/// times over.
const MAX_INDEXED: usize = 200_000;

/// A container's writable mounts, by their host paths as the runtime reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountCheck {
    pub id: String,
    pub pod_uid: PodUid,
    pub container: String,
    pub writable: Vec<String>,
}

/// What a writable mount reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reached {
    /// Every pod's exit directories in a place (its root, or a parent of it).
    Every(Place),
    /// One pod's exit directories.
    Pod(Place, PodUid),
    /// One container's exit directory.
    Container(Place, PodUid, String),
}

impl Reached {
    /// The pod it reaches, when it is one pod.
    pub fn pod(&self) -> Option<&PodUid> {
        match self {
            Reached::Every(_) => None,
            Reached::Pod(_, uid) | Reached::Container(_, uid, _) => Some(uid),
        }
    }

    fn place(&self) -> Place {
        match self {
            Reached::Every(p) | Reached::Pod(p, _) | Reached::Container(p, _, _) => *p,
        }
    }
}

impl std::fmt::Display for Reached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match self.place() {
            Place::Share => "the share",
            Place::PodLocal => "the kubelet's pods",
        };
        match self {
            Reached::Every(_) => write!(f, "every pod's exit directories in {place}"),
            Reached::Pod(_, uid) => write!(f, "the exit directories of pod {uid} in {place}"),
            Reached::Container(_, uid, name) => write!(
                f,
                "the exit directory of container {name} of pod {uid} in {place}"
            ),
        }
    }
}

/// A container that can write where it must not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    pub id: String,
    pub pod_uid: PodUid,
    pub container: String,
    pub host_path: String,
    pub reached: Reached,
}

/// The guarded directories by identity, and the roots by path.
#[derive(Debug, Default)]
pub struct Index {
    ids: HashMap<(u64, u64), Reached>,
    /// Each place's root (components), with the place: a host path that is one of them or a
    /// parent of one reaches everything there.
    roots: Vec<(Vec<String>, Place)>,
}

impl Index {
    /// Every exit directory, pod directory and root in `places`, as they are now. Entries
    /// are looked at without following links: a link a pod made in its own directory must
    /// not make another pod's directory look like its own.
    pub fn build(places: &[&Share]) -> Index {
        let mut index = Index::default();
        for share in places {
            let place = share.place();
            let mut roots = vec![share.pods_path()];
            if place == Place::Share {
                roots.push(share.root().to_owned());
            }
            for root in roots {
                index.insert(&root, Reached::Every(place));
                let parts = components(&root.to_string_lossy())
                    .into_iter()
                    .map(str::to_owned)
                    .collect();
                index.roots.push((parts, place));
            }
            for pod in share.pods().unwrap_or_default() {
                index.insert(&share.pod_path(&pod), Reached::Pod(place, pod.clone()));
                index.insert(&share.exits_path(&pod), Reached::Pod(place, pod.clone()));
                for key in share.containers_in(&pod).unwrap_or_default() {
                    let name = key.container.as_str().to_owned();
                    index.insert(
                        &share.container_path(&key),
                        Reached::Container(place, pod.clone(), name),
                    );
                }
            }
        }
        index
    }

    fn insert(&mut self, path: &Path, what: Reached) {
        if self.ids.len() >= MAX_INDEXED {
            return;
        }
        if let Ok(m) = path.symlink_metadata() {
            if m.is_dir() {
                self.ids.insert((m.dev(), m.ino()), what);
            }
        }
    }

    /// What `host_path` reaches: a parent of a root by its path, anything else by what it
    /// points at (as the runtime's mount did, links followed).
    pub fn reached(&self, host_path: &str) -> Option<Reached> {
        // Not a path on the host (a runtime's own mount, as a tmpfs, has none).
        if !host_path.starts_with('/') {
            return None;
        }
        let host = components(host_path);
        let is_parent = |root: &[String]| {
            root.len() >= host.len() && root.iter().zip(&host).all(|(a, b)| a == b)
        };
        if let Some((_, place)) = self.roots.iter().find(|(root, _)| is_parent(root)) {
            return Some(Reached::Every(*place));
        }
        let m = Path::new(host_path).metadata().ok()?;
        self.ids.get(&(m.dev(), m.ino())).cloned()
    }

    /// The breaches among `check`'s mounts: what reaches another pod, or every pod.
    pub fn judge(&self, check: &MountCheck) -> Vec<Breach> {
        check
            .writable
            .iter()
            .take(MAX_MOUNTS)
            .filter_map(|host_path| {
                let reached = self.reached(host_path)?;
                (reached.pod() != Some(&check.pod_uid)).then(|| Breach {
                    id: check.id.clone(),
                    pod_uid: check.pod_uid.clone(),
                    container: check.container.clone(),
                    host_path: host_path.clone(),
                    reached,
                })
            })
            .collect()
    }
}

/// The checks waiting for a round, and the round in flight (off the decision loop: it reads
/// directories).
#[derive(Default)]
pub struct Audit {
    /// The agent's own pod: it mounts the share and the kubelet's pods to serve them.
    own_pod_uid: Option<PodUid>,
    queue: Vec<MountCheck>,
    pub round: Option<tokio::task::JoinHandle<Vec<Breach>>>,
}

/// Checks queued at most: one per container, of more containers than a node runs.
const MAX_QUEUED: usize = 16_384;

impl Audit {
    pub fn new(own_pod_uid: Option<PodUid>) -> Self {
        Audit {
            own_pod_uid,
            ..Audit::default()
        }
    }

    pub fn push(&mut self, check: MountCheck) {
        if check.writable.is_empty() || self.own_pod_uid.as_ref() == Some(&check.pod_uid) {
            return;
        }
        if self.queue.len() >= MAX_QUEUED {
            tracing::warn!(
                limit = MAX_QUEUED,
                "more containers waiting for their mounts to be checked than a node runs; this one is not checked"
            );
            return;
        }
        self.queue.push(check);
    }

    /// Starts a round with what is queued, unless one is in flight.
    pub fn start(&mut self, places: Vec<std::sync::Arc<Share>>) {
        if self.round.is_some() || self.queue.is_empty() {
            return;
        }
        let checks = std::mem::take(&mut self.queue);
        let span = tracing::info_span!("breach_check", containers = checks.len());
        self.round = Some(tokio::task::spawn_blocking(move || {
            let _entered = span.enter();
            let refs: Vec<&Share> = places.iter().map(|s| &**s).collect();
            round(&refs, &checks)
        }));
    }
}

/// One round: the index built once for every check queued. Blocking (it reads directories).
pub fn round(places: &[&Share], checks: &[MountCheck]) -> Vec<Breach> {
    if checks.iter().all(|c| c.writable.is_empty()) {
        return Vec::new();
    }
    let index = Index::build(places);
    checks.iter().flat_map(|c| index.judge(c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";
    const VICTIM: &str = "1a2b3c4d-0000-4c3e-9f00-123456789abc";

    struct Node {
        dir: tempfile::TempDir,
        share: Share,
        local: Share,
    }

    fn node() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let share = Share::open(&dir.path().join("share")).unwrap();
        for uid in [ME, VICTIM] {
            std::fs::create_dir_all(dir.path().join("share/pods").join(uid).join("proxy")).unwrap();
            std::fs::create_dir_all(
                dir.path()
                    .join("kubelet/pods")
                    .join(uid)
                    .join("volumes/kubernetes.io~empty-dir/exitorder/proxy"),
            )
            .unwrap();
        }
        let local = Share::open_kubelet(&dir.path().join("kubelet")).unwrap();
        Node { dir, share, local }
    }

    fn check(paths: &[std::path::PathBuf]) -> MountCheck {
        MountCheck {
            id: "c1".into(),
            pod_uid: crate::pod::test_uid(ME),
            container: "app".into(),
            writable: paths
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
        }
    }

    fn judged(n: &Node, paths: &[std::path::PathBuf]) -> Vec<Reached> {
        round(&[&n.share, &n.local], &[check(paths)])
            .into_iter()
            .map(|b| b.reached)
            .collect()
    }

    #[test]
    fn own_directories_and_unrelated_paths_are_no_breach() {
        let n = node();
        let d = n.dir.path();
        let own = [
            d.join("share/pods").join(ME).join("proxy"),
            d.join("share/pods").join(ME),
            d.join("kubelet/pods")
                .join(ME)
                .join("volumes/kubernetes.io~empty-dir/exitorder/proxy"),
            d.join("kubelet/pods")
                .join(ME)
                .join("volumes/kubernetes.io~empty-dir/exitorder"),
            d.join("elsewhere"),
            "/nonexistent/path".into(),
        ];
        std::fs::create_dir(d.join("elsewhere")).unwrap();
        assert_eq!(judged(&n, &own), vec![]);
    }

    #[test]
    fn another_pods_directory_is_reached_by_identity_whatever_the_path() {
        let n = node();
        let d = n.dir.path();
        let victim_dir = d.join("share/pods").join(VICTIM).join("proxy");
        // What a subPath bind under volume-subpaths amounts to: another name, same directory.
        let bind = d.join("bind");
        std::os::unix::fs::symlink(&victim_dir, &bind).unwrap();
        let local_victim = d
            .join("kubelet/pods")
            .join(VICTIM)
            .join("volumes/kubernetes.io~empty-dir/exitorder");
        assert_eq!(
            judged(&n, &[victim_dir.clone(), bind, local_victim]),
            vec![
                Reached::Container(Place::Share, crate::pod::test_uid(VICTIM), "proxy".into()),
                Reached::Container(Place::Share, crate::pod::test_uid(VICTIM), "proxy".into()),
                Reached::Pod(Place::PodLocal, crate::pod::test_uid(VICTIM)),
            ]
        );
    }

    #[test]
    fn roots_and_their_parents_reach_every_pod_however_spelled() {
        let n = node();
        let d = n.dir.path().to_string_lossy().into_owned();
        let spelled = [
            format!("{d}/share"),
            format!("{d}//share/"),
            format!("{d}/share/pods"),
            format!("{d}/x/../share"),
            d.clone(),
            "/".to_owned(),
            format!("{d}/kubelet/pods"),
            format!("{d}/kubelet"),
        ];
        let reached = judged(
            &n,
            &spelled
                .iter()
                .map(std::path::PathBuf::from)
                .collect::<Vec<_>>(),
        );
        assert_eq!(reached.len(), spelled.len(), "{reached:?}");
        assert!(reached.iter().all(|r| matches!(r, Reached::Every(_))));
    }

    #[test]
    fn the_agents_own_pod_and_read_only_containers_are_not_queued() {
        let mut audit = Audit::new(Some(crate::pod::test_uid(ME)));
        audit.push(check(&["/var/lib/exitorder".into()]));
        audit.push(MountCheck {
            pod_uid: crate::pod::test_uid(VICTIM),
            writable: Vec::new(),
            ..check(&[])
        });
        assert!(audit.queue.is_empty());
        audit.push(MountCheck {
            pod_uid: crate::pod::test_uid(VICTIM),
            ..check(&["/var/lib/exitorder".into()])
        });
        assert_eq!(audit.queue.len(), 1);
    }

    #[test]
    fn a_link_in_a_pods_own_directory_does_not_hide_a_victim() {
        let n = node();
        let d = n.dir.path();
        // The pod makes its own container directory name lead to the victim's: the index
        // does not follow it, so the victim's directory keeps its owner.
        let mine = d.join("share/pods").join(ME).join("sidecar");
        std::os::unix::fs::symlink(d.join("share/pods").join(VICTIM).join("proxy"), &mine).unwrap();
        assert_eq!(
            judged(&n, &[mine]),
            vec![Reached::Container(
                Place::Share,
                crate::pod::test_uid(VICTIM),
                "proxy".into()
            )]
        );
    }
}
