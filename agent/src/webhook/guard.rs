//! The share's guard, for every pod and ephemeral container, opted in or not: what may reach
//! the node's share through a hostPath. Pure, like the mutation.
//!
//! The share holds every hostPath-mode sidecar's exit directory, so a container that can write
//! in it could answer another pod's wait (its sidecar leaves early). A pod may reach it only as
//! the webhook's hostPath mode mounts it: a container's own directory (`subPathExpr:
//! pods/$(POD_UID)/<its name>`, `POD_UID` the pod's own UID, from the downward API, defined
//! once), or read-only. The host's bin directory holds the entrypoint that sidecars of every
//! pod run: a pod may mount it read-only, never writable. Paths are
//! compared component by component after `//`, `.` and `..` are resolved, so no spelling of a
//! path gets around it; ancestors of the share (a hostPath of `/var/lib`, or `/`) reach it
//! too. Symbolic links on the node cannot be seen from here: the share's path should be
//! free of them.

use exitorder_contract::{env, mount, share};

use crate::handshake::hostpath::components;
use k8s_openapi::api::core::v1::{EnvVar, Pod, VolumeMount};
use serde_json::Value;

/// Refuses `object` (a Pod, as the API server sent it) when one of its containers could write
/// in the share otherwise than in its own directory; says which, and how to fix it.
pub fn check(object: &Value, share_dir: &str, bin_dir: &str) -> Result<(), String> {
    // Only pods with a hostPath volume are sent (the webhook configuration's matchConditions),
    // so refusing what cannot be read costs no other pod anything: fail closed.
    let pod: Pod = serde_json::from_value(object.clone())
        .map_err(|e| format!("the object is not a valid Pod: {e}"))?;
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let share = components(share_dir);
    let bin = components(bin_dir);
    // The pod's hostPath volumes that reach the share or the bin directory, and whether each
    // is the share itself (the one that may be mounted as a container's own directory).
    let reaching: Vec<(&str, bool)> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let host = components(&v.host_path.as_ref()?.path);
            let reaches = |guarded: &[&str]| {
                host.starts_with(guarded) || guarded.starts_with(host.as_slice())
            };
            (reaches(&share) || reaches(&bin)).then_some((v.name.as_str(), host == share))
        })
        .collect();
    if reaching.is_empty() {
        return Ok(());
    }
    let regular = crate::podspec::containers(spec).map(|c| {
        (
            c.name.as_str(),
            c.volume_mounts.as_deref(),
            c.env.as_deref(),
            false,
        )
    });
    let ephemeral = spec.ephemeral_containers.iter().flatten().map(|c| {
        (
            c.name.as_str(),
            c.volume_mounts.as_deref(),
            c.env.as_deref(),
            true,
        )
    });
    for (name, mounts, envs, is_ephemeral) in regular.chain(ephemeral) {
        for m in mounts.unwrap_or_default() {
            let Some(&(volume, is_share)) = reaching.iter().find(|(v, _)| *v == m.name) else {
                continue;
            };
            if m.read_only == Some(true)
                || (is_share && !is_ephemeral && own_directory(name, m, envs))
            {
                continue;
            }
            return Err(format!(
                "{} {name:?} mounts volume {volume:?}, a hostPath that reaches the exitorder \
                 share ({share_dir}) or its bin directory ({bin_dir}), writable at {}: a \
                 container may only mount its own directory of the share (subPathExpr \
                 {}/$({})/{name}, {} from the pod's metadata.uid), or mount them readOnly",
                if is_ephemeral {
                    "ephemeral container"
                } else {
                    "container"
                },
                m.mount_path,
                share::PODS_DIR,
                env::POD_UID,
                env::POD_UID,
            ));
        }
    }
    Ok(())
}

/// The mount the webhook's hostPath mode gives a sidecar: its own directory, named through
/// the pod's own UID.
fn own_directory(container: &str, m: &VolumeMount, envs: Option<&[EnvVar]>) -> bool {
    let expected = format!("{}/$({})/{container}", share::PODS_DIR, env::POD_UID);
    let mut uid = envs
        .unwrap_or_default()
        .iter()
        .filter(|e| e.name == env::POD_UID);
    // Defined once: with two, the later would win, and it could be anything.
    let pod_uid_is_own = match (uid.next(), uid.next()) {
        (Some(e), None) => {
            e.value.is_none()
                && e.value_from
                    .as_ref()
                    .and_then(|v| v.field_ref.as_ref())
                    .is_some_and(|f| f.field_path == "metadata.uid")
        }
        _ => false,
    };
    m.mount_path == mount::EXIT_DIR
        && m.sub_path.is_none()
        && m.sub_path_expr.as_deref() == Some(expected.as_str())
        && pod_uid_is_own
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SHARE: &str = "/var/lib/exitorder";
    const BIN: &str = "/var/lib/exitorder-bin";

    fn pod(volume_path: &str, mount: Value, env: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"volumes": [{"name": "s", "hostPath": {"path": volume_path}}],
                        "containers": [{"name": "proxy", "image": "x",
                                        "volumeMounts": [mount], "env": env}]}})
    }

    fn uid_env() -> Value {
        json!([{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}])
    }

    fn own() -> Value {
        json!({"name": "s", "mountPath": "/var/run/exitorder",
               "subPathExpr": "pods/$(POD_UID)/proxy"})
    }

    #[test]
    fn every_spelling_of_the_share_and_its_parents_is_caught() {
        let whole = json!({"name": "s", "mountPath": "/share"});
        for path in [
            "/var/lib/exitorder",
            "/var/lib//exitorder",
            "/var/lib/exitorder/",
            "/var/lib/./exitorder",
            "/var/lib/x/../exitorder",
            "/var/lib/exitorder/bin",
            "/var/lib/exitorder/pods/0f5c7a1e-8d2b-4c3e-9f00-123456789abc/proxy",
            "/var/lib",
            "/",
            "/../var/lib/exitorder",
        ] {
            let e = check(&pod(path, whole.clone(), json!([])), SHARE, BIN).unwrap_err();
            assert!(
                e.contains("\"proxy\"") && e.contains("\"s\""),
                "{path}: {e}"
            );
        }
        for path in ["/var/lib/exitorder-other", "/var/log", "/var/lib/exitorde"] {
            assert!(
                check(&pod(path, whole.clone(), json!([])), SHARE, BIN).is_ok(),
                "{path}"
            );
        }
    }

    #[test]
    fn only_the_own_directory_or_read_only() {
        assert!(check(&pod(SHARE, own(), uid_env()), SHARE, BIN).is_ok());
        let ro = json!({"name": "s", "mountPath": "/var/run/exitorder-bin", "subPath": "bin",
                        "readOnly": true});
        assert!(check(&pod("/var/lib", ro, json!([])), SHARE, BIN).is_ok());
        let refused = [
            // Another container's directory, or another pod's.
            (
                json!({"name": "s", "mountPath": "/var/run/exitorder",
                    "subPathExpr": "pods/$(POD_UID)/app"}),
                uid_env(),
            ),
            (
                json!({"name": "s", "mountPath": "/var/run/exitorder",
                    "subPathExpr": "pods/$(POD_UID)/../victim/proxy"}),
                uid_env(),
            ),
            // POD_UID set by the pod itself, or twice.
            (
                own(),
                json!([{"name": "POD_UID", "value": "0f5c7a1e-8d2b-4c3e-9f00-123456789abc"}]),
            ),
            (
                own(),
                json!([{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                           {"name": "POD_UID", "value": "victim"}]),
            ),
            (
                own(),
                json!([{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]),
            ),
            (own(), json!([])),
            // Elsewhere, or a plain subPath.
            (
                json!({"name": "s", "mountPath": "/elsewhere", "subPathExpr": "pods/$(POD_UID)/proxy"}),
                uid_env(),
            ),
            (
                json!({"name": "s", "mountPath": "/var/run/exitorder", "subPath": "bin"}),
                uid_env(),
            ),
            (
                json!({"name": "s", "mountPath": "/var/run/exitorder", "readOnly": false}),
                uid_env(),
            ),
        ];
        for (mount, env) in refused {
            assert!(
                check(&pod(SHARE, mount.clone(), env.clone()), SHARE, BIN).is_err(),
                "{mount} {env}"
            );
        }
        // The own-directory form of a parent of the share is no own directory.
        assert!(check(&pod("/var/lib", own(), uid_env()), SHARE, BIN).is_err());
    }

    #[test]
    fn the_bin_directory_only_read_only() {
        let at = |path: &str, ro: bool| {
            pod(
                path,
                json!({"name": "s", "mountPath": "/var/run/exitorder-bin", "readOnly": ro}),
                json!([]),
            )
        };
        for path in [
            BIN,
            "/var/lib//exitorder-bin/",
            "/var/lib/exitorder-bin/x/..",
        ] {
            let e = check(&at(path, false), SHARE, BIN).unwrap_err();
            assert!(e.contains(BIN), "{path}: {e}");
            assert!(check(&at(path, true), SHARE, BIN).is_ok(), "{path}");
        }
        // Its own-directory form is no own directory: only the share has those.
        assert!(check(&pod(BIN, own(), uid_env()), SHARE, BIN).is_err());
    }

    #[test]
    fn ephemeral_containers_may_only_read() {
        let mut p = pod(SHARE, own(), uid_env());
        p["spec"]["ephemeralContainers"] = json!([{"name": "debug", "image": "x", "env": uid_env(),
                    "volumeMounts": [{"name": "s", "mountPath": "/var/run/exitorder",
                                      "subPathExpr": "pods/$(POD_UID)/debug"}]}]);
        let e = check(&p, SHARE, BIN).unwrap_err();
        assert!(e.contains("ephemeral container \"debug\""), "{e}");
        p["spec"]["ephemeralContainers"][0]["volumeMounts"] =
            json!([{"name": "s", "mountPath": "/s", "readOnly": true}]);
        assert!(check(&p, SHARE, BIN).is_ok());
    }

    #[test]
    fn pods_without_a_reaching_hostpath_pass_and_junk_is_refused() {
        let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                       "spec": {"containers": [{"name": "a", "image": "x"}],
                                "volumes": [{"name": "d", "emptyDir": {}}]}});
        assert!(check(&p, SHARE, BIN).is_ok());
        assert!(check(&json!({"spec": {"containers": "no"}}), SHARE, BIN).is_err());
    }
}
