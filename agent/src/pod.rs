//! A pod's identity: its UID, checked once where it enters the agent.
//!
//! Pod UIDs arrive from the runtime's labels (`io.kubernetes.pod.uid`, which any CRI client
//! can set), the API server's objects and directory names in the share, each written by
//! someone the agent does not trust, and from `--pod-uid` (the agent's own pod). Each is
//! parsed into a [`PodUid`] where it arrives; past that point a pod is a `PodUid` everywhere
//! (the node view, the reader's messages, the pod watch, the waits, the share), so a UID that
//! is no UID never reaches a map key, a log field or a path.

use std::fmt;

/// A pod UID as the kubelet names pod directories: an RFC 4122 UUID for API pods, a 32-digit
/// hex hash for static pods. 8 to 64 bytes of lowercase hex and dashes, never starting with a
/// dash: safe as one path component, a log field and a CRI label selector's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(String);

/// Text that is no pod UID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod uid {0:?} is not valid")]
pub struct BadPodUid(pub String);

impl PodUid {
    pub fn parse(s: &str) -> Result<Self, BadPodUid> {
        let ok = (8..=64).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
            && !s.starts_with('-');
        if ok {
            Ok(PodUid(s.to_owned()))
        } else {
            Err(BadPodUid(s.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A UID the unit tests know to be one.
#[cfg(test)]
pub(crate) fn test_uid(s: &str) -> PodUid {
    PodUid::parse(s).expect("a pod uid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_and_static_pod_hashes_only() {
        for ok in [
            "0f5c7a1e-8d2b-4c3e-9f00-123456789abc",
            "6e8b2b7fbd6c3a3f1d7e1b3e4c5d6a7b",
        ] {
            assert_eq!(PodUid::parse(ok).map(|u| u.to_string()), Ok(ok.to_owned()));
        }
        for bad in [
            "",
            "u",
            "..",
            "abc",
            "-0f5c7a1e",
            "0F5C7A1E-8D2B",
            "../../etc",
            "0f5c7a1e/8d2b",
            "0f5c7a1e 8d2b",
            &"a".repeat(65),
        ] {
            assert_eq!(
                PodUid::parse(bad),
                Err(BadPodUid(bad.to_owned())),
                "{bad:?}"
            );
        }
    }
}
