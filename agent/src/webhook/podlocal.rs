//! The pod-local handshake's injection: no hostPath in the pod. Each sidecar's exit directory
//! is a sub-directory of the pod's own `emptyDir` volume `exitorder` (mounted with `subPath:
//! <its name>`, which the kubelet creates), and the entrypoint comes from the `emptyDir`
//! `exitorder-bin`, filled by the init container `exitorder-install` from the project's image
//! (as Tekton's `entrypoint init` and Argo's `argoexec` do) and mounted read-only wherever it
//! runs. Every field added here meets Pod Security `restricted`, so a pod admitted there
//! before the injection still is after it.
//!
//! As the rest of the injection, each step first looks for what an earlier pass added, so a
//! second pass changes nothing.

use std::collections::BTreeMap;

use exitorder_contract::{mount, podlocal};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, PodSpec, ResourceRequirements, SeccompProfile,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Adds the two `emptyDir` volumes once; refuses a pod that already uses one of the names for
/// something else. The exit directories' volume is a small tmpfs (`medium: Memory`): the
/// handshake is a few bytes per container, and its renames must not wait behind the disk's
/// journal on a busy node; a plain one with `in_memory` off (while the agents roll out). The
/// entrypoint's stays on the node's disk: a copy of a binary there would count against the
/// pod's memory. An `emptyDir` the pod already declares under the name (an earlier pass's,
/// whatever its medium) is kept as it is.
pub fn volumes(spec: &mut PodSpec, in_memory: bool) -> Result<(), String> {
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    for name in [podlocal::VOLUME, podlocal::BIN_VOLUME] {
        match volumes.iter().find(|v| v.name == name) {
            Some(v) if is_plain_empty_dir(v) => {}
            Some(_) => {
                return Err(format!(
                    "volume {name:?} exists and is not exitorder's (an emptyDir)"
                ))
            }
            None => volumes.push(Volume {
                name: name.to_owned(),
                empty_dir: Some(if name == podlocal::VOLUME && in_memory {
                    EmptyDirVolumeSource {
                        medium: Some(podlocal::VOLUME_MEDIUM.to_owned()),
                        size_limit: Some(Quantity(podlocal::VOLUME_SIZE_LIMIT.to_owned())),
                        ..EmptyDirVolumeSource::default()
                    }
                } else {
                    EmptyDirVolumeSource::default()
                }),
                ..Volume::default()
            }),
        }
    }
    Ok(())
}

fn is_plain_empty_dir(v: &Volume) -> bool {
    v.empty_dir.is_some()
        && v.host_path.is_none()
        && v.persistent_volume_claim.is_none()
        && v.ephemeral.is_none()
}

/// The init container that copies the entrypoint into `exitorder-bin`; it must run first of
/// all, before any other init container, native sidecars included (their preStop runs the
/// entrypoint). It is appended here and moved to the front by the patch (`Some(index)`: from
/// where), so that the other init containers move whole, with any field this build does not
/// know, rather than being rewritten in place by a diff.
pub fn install_container(spec: &mut PodSpec, image: &str) -> Result<Option<usize>, String> {
    let want = install(image);
    let inits = spec.init_containers.get_or_insert_with(Vec::new);
    match inits
        .iter()
        .position(|c| c.name == podlocal::INSTALL_CONTAINER)
    {
        Some(0) if inits.first().is_some_and(|c| c.command == want.command) => Ok(None),
        Some(_) => Err(format!(
            "init container {:?} exists and is not exitorder's (first, running {})",
            podlocal::INSTALL_CONTAINER,
            podlocal::IMAGE_ENTRYPOINT
        )),
        None => {
            inits.push(want);
            Ok(Some(inits.len().saturating_sub(1)))
        }
    }
}

fn install(image: &str) -> Container {
    let quantity = |q: &str| Quantity(q.to_owned());
    Container {
        name: podlocal::INSTALL_CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(vec![
            podlocal::IMAGE_ENTRYPOINT.to_owned(),
            "install".to_owned(),
            mount::BIN_DIR.to_owned(),
        ]),
        volume_mounts: Some(vec![VolumeMount {
            name: podlocal::BIN_VOLUME.to_owned(),
            mount_path: mount::BIN_DIR.to_owned(),
            ..VolumeMount::default()
        }]),
        // A copy of under a megabyte: little to ask, and limits so that a namespace whose
        // ResourceQuota counts them admits the pod.
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), quantity("10m")),
                ("memory".to_owned(), quantity("16Mi")),
            ])),
            limits: Some(BTreeMap::from([
                ("cpu".to_owned(), quantity("100m")),
                ("memory".to_owned(), quantity("32Mi")),
            ])),
            ..ResourceRequirements::default()
        }),
        // Pod Security `restricted`, whatever the pod's own settings.
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(podlocal::INSTALL_UID),
            run_as_group: Some(podlocal::INSTALL_UID),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

/// The entrypoint's volume (`exitorder-bin`: this pod's emptyDir, or in hostPath mode the
/// host's bin directory), read-only wherever it is mounted.
pub fn bin_mount() -> VolumeMount {
    VolumeMount {
        name: podlocal::BIN_VOLUME.to_owned(),
        mount_path: mount::BIN_DIR.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// A sidecar's own exit directory and the entrypoint, read-only.
pub fn mounts(c: &mut Container) -> Result<(), String> {
    let own = VolumeMount {
        name: podlocal::VOLUME.to_owned(),
        mount_path: mount::EXIT_DIR.to_owned(),
        sub_path: Some(c.name.clone()),
        ..VolumeMount::default()
    };
    let name = c.name.clone();
    let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    for want in [own, bin_mount()] {
        match mounts.iter().find(|m| m.mount_path == want.mount_path) {
            Some(m) if *m == want => {}
            Some(m) => {
                return Err(format!(
                    "container {name:?} mounts volume {:?} at {}, where exitorder mounts its own",
                    m.name, m.mount_path
                ))
            }
            None => mounts.push(want),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_pass_adds_nothing() {
        let mut spec = PodSpec {
            containers: vec![Container {
                name: "proxy".into(),
                ..Container::default()
            }],
            init_containers: Some(vec![Container {
                name: "istio-proxy".into(),
                restart_policy: Some("Always".into()),
                ..Container::default()
            }]),
            ..PodSpec::default()
        };
        for _ in 0..2 {
            volumes(&mut spec, true).unwrap();
            // Appended, to be moved to the front by the patch: as the patch would.
            if let Some(at) = install_container(&mut spec, "img:1").unwrap() {
                let inits = spec.init_containers.as_mut().unwrap();
                let c = inits.remove(at);
                inits.insert(0, c);
            }
            for c in spec.containers.iter_mut() {
                mounts(c).unwrap();
            }
        }
        assert_eq!(spec.volumes.as_ref().map(Vec::len), Some(2));
        let dirs: Vec<_> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| (v.name.as_str(), v.empty_dir.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            dirs,
            [
                (
                    podlocal::VOLUME,
                    EmptyDirVolumeSource {
                        medium: Some("Memory".into()),
                        size_limit: Some(Quantity("1Mi".into())),
                        ..EmptyDirVolumeSource::default()
                    }
                ),
                (podlocal::BIN_VOLUME, EmptyDirVolumeSource::default()),
            ]
        );
        let inits = spec.init_containers.as_ref().unwrap();
        assert_eq!(inits.len(), 2);
        assert_eq!(inits[0].name, podlocal::INSTALL_CONTAINER);
        assert_eq!(inits[1].name, "istio-proxy");
        assert_eq!(
            spec.containers[0].volume_mounts.as_ref().map(Vec::len),
            Some(2)
        );
        assert_eq!(
            spec.containers[0].volume_mounts.as_ref().unwrap()[0]
                .sub_path
                .as_deref(),
            Some("proxy")
        );
    }

    #[test]
    fn names_taken_by_something_else_are_refused() {
        let mut spec = PodSpec {
            volumes: Some(vec![Volume {
                name: podlocal::VOLUME.into(),
                host_path: Some(Default::default()),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        };
        assert!(volumes(&mut spec, true)
            .unwrap_err()
            .contains("\"exitorder\""));
        let mut spec = PodSpec {
            init_containers: Some(vec![Container {
                name: podlocal::INSTALL_CONTAINER.into(),
                command: Some(vec!["sh".into()]),
                ..Container::default()
            }]),
            ..PodSpec::default()
        };
        assert!(install_container(&mut spec, "img:1").is_err());
        let mut c = Container {
            name: "proxy".into(),
            volume_mounts: Some(vec![VolumeMount {
                name: "data".into(),
                mount_path: mount::EXIT_DIR.into(),
                ..VolumeMount::default()
            }]),
            ..Container::default()
        };
        assert!(mounts(&mut c).unwrap_err().contains("\"data\""));
    }
}
