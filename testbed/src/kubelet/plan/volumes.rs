//! A pod's volumes, as the test bed supports them: `hostPath` (with its type checked as the
//! kubelet checks it) and `emptyDir` on the node's disk.

use std::collections::BTreeMap;

use super::PlanError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Volume {
    HostPath { path: String, kind: HostPathType },
    EmptyDir,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathType {
    Unchecked,
    DirectoryOrCreate,
    Directory,
    FileOrCreate,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

impl HostPathType {
    pub(super) fn parse(s: Option<&str>) -> Option<Self> {
        Some(match s {
            None | Some("") => HostPathType::Unchecked,
            Some("DirectoryOrCreate") => HostPathType::DirectoryOrCreate,
            Some("Directory") => HostPathType::Directory,
            Some("FileOrCreate") => HostPathType::FileOrCreate,
            Some("File") => HostPathType::File,
            Some("Socket") => HostPathType::Socket,
            Some("CharDevice") => HostPathType::CharDevice,
            Some("BlockDevice") => HostPathType::BlockDevice,
            Some(_) => return None,
        })
    }
}

/// The pod's `spec.volumes`, each checked, by name.
pub(super) fn plan<E: Fn(&str, String) -> PlanError>(
    specs: Vec<k8s_openapi::api::core::v1::Volume>,
    err: &E,
) -> Result<BTreeMap<String, Volume>, PlanError> {
    let mut volumes = BTreeMap::new();
    for (i, v) in specs.into_iter().enumerate() {
        let field = format!("spec.volumes[{i}]");
        let vol = match (v.host_path, v.empty_dir) {
            (Some(hp), None) => {
                let kind = HostPathType::parse(hp.type_.as_deref()).ok_or_else(|| {
                    err(
                        &format!("{field}.hostPath.type"),
                        format!("{:?} is not a hostPath type", hp.type_),
                    )
                })?;
                if !hp.path.starts_with('/') {
                    return Err(err(
                        &format!("{field}.hostPath.path"),
                        "must be absolute".into(),
                    ));
                }
                Volume::HostPath {
                    path: hp.path,
                    kind,
                }
            }
            (None, Some(ed)) => {
                if ed.medium.as_deref().is_some_and(|m| !m.is_empty()) {
                    return Err(err(
                        &format!("{field}.emptyDir.medium"),
                        "only the node's disk is supported (medium \"\")".into(),
                    ));
                }
                Volume::EmptyDir
            }
            _ => return Err(err(&field, "one of hostPath or emptyDir is needed".into())),
        };
        if volumes.insert(v.name.clone(), vol).is_some() {
            return Err(err(
                &format!("{field}.name"),
                format!("volume {:?} declared twice", v.name),
            ));
        }
    }
    Ok(volumes)
}
