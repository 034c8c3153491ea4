//! Names in the share, checked before they become paths: a container's name (a pod's UID is
//! [`crate::pod::PodUid`]), which tree a wait is in, and what an exit file says.

use std::fmt;

use exitorder_contract::podlocal;

use crate::pod::PodUid;

use super::{ShareError, ALLOW, MAX_EXIT_BYTES, WAIT};

/// A container name: a DNS-1123 label, as Kubernetes requires.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerName(String);

impl ContainerName {
    pub fn parse(s: &str) -> Result<Self, ShareError> {
        let b = s.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b.first() != Some(&b'-')
            && b.last() != Some(&b'-');
        if ok {
            Ok(ContainerName(s.to_owned()))
        } else {
            Err(ShareError::BadName {
                kind: "container",
                name: s.to_owned(),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ContainerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a pod's exit directories are: the two layouts the agent serves at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    /// The host share: `<share>/pods/<uid>/<container>/`, each mounted by its container
    /// through a hostPath volume.
    Share,
    /// The pod's own `emptyDir` volume, where the kubelet keeps it:
    /// `<kubelet root>/pods/<uid>/volumes/kubernetes.io~empty-dir/exitorder/<container>/`.
    /// No hostPath in the pod; the directory and everything in it are the pod's.
    PodLocal,
}

impl Place {
    /// The directories from a pod's directory to the one holding its containers' exit
    /// directories.
    pub(super) fn between(self) -> &'static [&'static str] {
        const POD_LOCAL: [&str; 3] = [
            podlocal::VOLUME_PATH[0],
            podlocal::VOLUME_PATH[1],
            podlocal::VOLUME,
        ];
        match self {
            Place::Share => &[],
            Place::PodLocal => &POD_LOCAL,
        }
    }

    /// How many levels below `pods/` a container's exit directory is.
    pub fn container_depth(self) -> usize {
        self.between().len().saturating_add(2)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Place::Share => "share",
            Place::PodLocal => "pod_local",
        }
    }
}

/// One container's exit directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExitKey {
    pub pod: PodUid,
    pub container: ContainerName,
    pub place: Place,
}

impl fmt::Display for ExitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.pod, self.container)
    }
}

/// What a change under `pods/` was about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareEntry {
    Pod(PodUid),
    Container(ExitKey),
    ExitFile(ExitKey),
    /// The container said it is being stopped (`stopping`).
    MarkFile(ExitKey),
}

/// The state of one container's exit file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitState {
    Absent,
    Waiting,
    Allowed,
    /// Content that is neither `wait` nor `allow` (at most the first 64 bytes, lossy).
    Unexpected(String),
}

impl ExitState {
    /// What the first bytes of an existing exit file say. Anything a pod writes is accepted
    /// here: bytes that are not UTF-8 come back lossy, inside `Unexpected`.
    pub fn parse(content: &[u8]) -> ExitState {
        let text = String::from_utf8_lossy(content.get(..MAX_EXIT_BYTES).unwrap_or(content));
        // ASCII whitespace only, as the entrypoint trims its reading of the same file, so that
        // both take the same contents for `allow` (Unicode's wider set, with a vertical tab
        // or U+0085, would not).
        match text.trim_ascii() {
            "" | WAIT => ExitState::Waiting,
            ALLOW => ExitState::Allowed,
            other => ExitState::Unexpected(other.to_owned()),
        }
    }
}
