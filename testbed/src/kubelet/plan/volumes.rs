//! A pod's volumes, as the test bed supports them: `hostPath` (with its type checked as the
//! kubelet checks it), `emptyDir` on the node's disk, and `emptyDir` of `medium: Memory` (a
//! tmpfs of its `sizeLimit`).

use std::collections::BTreeMap;

use super::PlanError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Volume {
    HostPath {
        path: String,
        kind: HostPathType,
    },
    EmptyDir,
    /// `medium: Memory`: a tmpfs of `size` bytes (its `sizeLimit`), the kernel's default
    /// size without one.
    Tmpfs {
        size: Option<u64>,
    },
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
                let size = ed
                    .size_limit
                    .map(|q| bytes(&q.0))
                    .transpose()
                    .map_err(|e| err(&format!("{field}.emptyDir.sizeLimit"), e))?;
                match ed.medium.as_deref().unwrap_or("") {
                    "" => Volume::EmptyDir,
                    "Memory" => Volume::Tmpfs { size },
                    other => {
                        return Err(err(
                            &format!("{field}.emptyDir.medium"),
                            format!(
                            "{other:?}: only the node's disk (\"\") and \"Memory\" are supported"
                        ),
                        ))
                    }
                }
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

/// A byte quantity (`1Mi`, `512k`, `1048576`) as the API server reads one, in the forms a
/// `sizeLimit` is written in.
pub(super) fn bytes(q: &str) -> Result<u64, String> {
    let bad = || format!("{q:?} is not a byte quantity the test bed reads (1Mi, 512k, 1048576)");
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (digits, suffix) = q.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let scale: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(bad()),
    };
    n.checked_mul(scale).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Volume as Spec;
    use serde_json::json;

    fn planned(v: serde_json::Value) -> Result<Volume, String> {
        let spec: Spec = serde_json::from_value(v).map_err(|e| e.to_string())?;
        let err = |f: &str, problem: String| PlanError {
            pod: "web".into(),
            field: f.into(),
            problem,
        };
        plan(vec![spec], &err)
            .map_err(|e| e.to_string())?
            .into_values()
            .next()
            .ok_or_else(|| "no volume".to_owned())
    }

    #[test]
    fn an_emptydir_is_on_the_disk_or_a_tmpfs_of_its_size_limit() {
        assert_eq!(
            planned(json!({"name": "a", "emptyDir": {}})),
            Ok(Volume::EmptyDir)
        );
        assert_eq!(
            planned(json!({"name": "a", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})),
            Ok(Volume::Tmpfs {
                size: Some(1 << 20)
            })
        );
        assert_eq!(
            planned(json!({"name": "a", "emptyDir": {"medium": "Memory"}})),
            Ok(Volume::Tmpfs { size: None })
        );
        let huge = planned(json!({"name": "a", "emptyDir": {"medium": "HugePages"}}));
        assert!(huge.is_err_and(|e| e.contains("emptyDir.medium")));
        let odd =
            planned(json!({"name": "a", "emptyDir": {"medium": "Memory", "sizeLimit": "1.5Mi"}}));
        assert!(odd.is_err_and(|e| e.contains("sizeLimit")));
    }

    #[test]
    fn byte_quantities_in_their_usual_forms() {
        assert_eq!(bytes("1Mi"), Ok(1_048_576));
        assert_eq!(bytes("512k"), Ok(512_000));
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("2Gi"), Ok(2 << 30));
        assert!(bytes("Mi").is_err());
        assert!(bytes("1Xi").is_err());
        assert!(bytes("99999999999999999999Gi").is_err());
    }
}
