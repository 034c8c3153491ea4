//! Manifests as users write them: the library's reader, shared with `exitorder explain`.

pub use exitorder::cli::manifest::{documents, find, pod_of, ManifestError};

impl From<ManifestError> for crate::node::TestbedError {
    fn from(e: ManifestError) -> Self {
        crate::node::TestbedError::BadSpec(e.to_string())
    }
}
