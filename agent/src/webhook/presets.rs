//! Containers known by their image only: a preset's image under a name of the pod's own. The
//! agent sees a container's name in the runtime, not its image (the kubelet hands the runtime
//! the image's ID), so the webhook writes what the preset gives into the pod, where the pod's
//! own settings leave room: the priority as the container's env, the Job shutdown endpoint
//! into the shutdown annotation. The pod's annotation and env always win.

use std::collections::BTreeMap;

use exitorder_contract::{annotation, env};
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use crate::decide::priority::{self, PodPriorities};
use crate::presets;

/// Writes the presets of main containers known by image only into `pod`. None when they are
/// every main container of the pod: a pod of nothing but such images runs them as its work
/// (a standalone proxy), not as sidecars.
pub fn write(pod: &mut Pod, named: Option<&PodPriorities>) {
    let mut shutdown: BTreeMap<String, String> = BTreeMap::new();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let by_image = |c: &Container| {
        presets::by_name(&c.name)
            .is_none()
            .then(|| c.image.as_deref().and_then(presets::by_image))
            .flatten()
    };
    // A malformed env is refused by the mutation's own reading, after this.
    let literal = |c: &Container| priority::from_spec_env(c).ok().flatten();
    let works = spec
        .containers
        .iter()
        .any(|c| by_image(c).is_none() && priority::resolve(&c.name, named, literal(c)) == 0);
    if !works {
        return;
    }
    // Job shutdown only for pods that complete: a Deployment's annotation would only grow.
    let completes = matches!(spec.restart_policy.as_deref(), Some("Never" | "OnFailure"));
    for c in spec.containers.iter_mut() {
        let Some(preset) = by_image(c) else {
            continue;
        };
        // A priority from `envFrom` is the agent's to read in the runtime; a literal env
        // written here would override it.
        let own = has_priority_env(c) || c.env_from.as_ref().is_some_and(|e| !e.is_empty());
        if named.is_none_or(|n| !n.contains_key(&c.name)) && !own {
            c.env.get_or_insert_with(Vec::new).push(EnvVar {
                name: env::PRIORITY.to_owned(),
                value: Some(preset.priority.to_string()),
                ..EnvVar::default()
            });
        }
        let args = args_of(c);
        let served = preset
            .shutdown
            .filter(|e| completes && e.served(&annotations, Some(&args)));
        if let Some(e) = served {
            shutdown.insert(c.name.clone(), e.url.to_owned());
        }
    }
    if shutdown.is_empty() {
        return;
    }
    let current = annotations.get(annotation::SIDECAR_SHUTDOWN);
    let mut urls: BTreeMap<String, String> = match current {
        None => BTreeMap::new(),
        Some(v) => match serde_json::from_str(v) {
            Ok(urls) => urls,
            // The agent reports a malformed annotation; it is the pod's, left as it is.
            Err(_) => return,
        },
    };
    let before = urls.len();
    for (name, url) in shutdown {
        urls.entry(name).or_insert(url);
    }
    if urls.len() == before && current.is_some() {
        return;
    }
    if let Ok(value) = serde_json::to_string(&urls) {
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(annotation::SIDECAR_SHUTDOWN.to_owned(), value);
    }
}

/// A container's command and args, as the endpoints' flags are looked for.
pub fn args_of(c: &Container) -> Vec<&str> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .map(String::as_str)
        .collect()
}

/// Whether the container sets its own priority (by value or from a source the agent reads in
/// the runtime).
fn has_priority_env(c: &Container) -> bool {
    c.env
        .iter()
        .flatten()
        .any(|e| e.name == env::PRIORITY || e.name == env::PRIORITY_KRUISE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotations: serde_json::Value, containers: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": annotations},
            "spec": {"restartPolicy": "Never", "containers": containers},
        }))
        .unwrap()
    }

    fn env_of<'a>(p: &'a Pod, name: &str) -> Vec<(&'a str, Option<&'a str>)> {
        p.spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .filter(|c| c.name == name)
            .flat_map(|c| c.env.iter().flatten())
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect()
    }

    #[test]
    fn a_preset_known_by_image_gets_its_priority_and_shutdown() {
        let mut p = pod(
            json!({}),
            json!([{"name": "app", "image": "busybox"},
                   {"name": "mesh", "image": "docker.io/istio/proxyv2:1.24.0"},
                   {"name": "istio-proxy", "image": "other"},
                   {"name": "sql", "image": "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2.14.0",
                    "args": ["--quitquitquit", "p:r:db"]},
                   {"name": "sql2", "image": "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2.14.0"}]),
        );
        write(&mut p, None);
        assert_eq!(env_of(&p, "mesh"), [(env::PRIORITY, Some("1"))]);
        assert_eq!(env_of(&p, "sql"), [(env::PRIORITY, Some("1"))]);
        // Known by name: the agent knows it too.
        assert!(env_of(&p, "istio-proxy").is_empty());
        assert!(env_of(&p, "app").is_empty());
        let urls: BTreeMap<String, String> = serde_json::from_str(
            &p.metadata.annotations.as_ref().unwrap()[annotation::SIDECAR_SHUTDOWN],
        )
        .unwrap();
        assert_eq!(
            urls.get("mesh").map(String::as_str),
            Some("http://127.0.0.1:15020/quitquitquit")
        );
        assert_eq!(
            urls.get("sql").map(String::as_str),
            Some("http://127.0.0.1:9091/quitquitquit")
        );
        // Without --quitquitquit it serves no shutdown: stopped through the runtime.
        assert_eq!(env_of(&p, "sql2"), [(env::PRIORITY, Some("1"))]);
        assert_eq!(urls.len(), 2);
        // A second pass changes nothing.
        let once = p.clone();
        write(&mut p, None);
        assert_eq!(p, once);
    }

    #[test]
    fn a_pod_of_nothing_but_such_images_is_its_own_work() {
        let mut p = pod(
            json!({}),
            json!([{"name": "sql", "image": "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2"},
                   {"name": "linkerd-proxy", "image": "x"}]),
        );
        let once = p.clone();
        write(&mut p, None);
        assert_eq!(p, once);
        // Beside an app it is a sidecar; in a Deployment, no shutdown URL is written.
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "app", "image": "a"},
                                    {"name": "sql", "image": "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2",
                                     "args": ["--quitquitquit"]}]},
        }))
        .unwrap();
        write(&mut p, None);
        assert_eq!(env_of(&p, "sql"), [(env::PRIORITY, Some("1"))]);
        assert!(p.metadata.annotations.is_none());
    }

    #[test]
    fn a_priority_from_env_from_is_left_to_the_agent() {
        let mut p = pod(
            json!({}),
            json!([{"name": "app", "image": "a"},
                   {"name": "mesh", "image": "istio/proxyv2", "restartPolicy": "Always",
                    "envFrom": [{"configMapRef": {"name": "priorities"}}]}]),
        );
        write(&mut p, None);
        assert!(env_of(&p, "mesh").is_empty());
        // Its shutdown is still known (a main container with a restart policy of its own).
        assert!(
            p.metadata.annotations.as_ref().unwrap()[annotation::SIDECAR_SHUTDOWN].contains("mesh")
        );
    }

    #[test]
    fn the_pods_own_settings_win() {
        let named: PodPriorities = [("mesh".to_owned(), 3u8)].into_iter().collect();
        let mut p = pod(
            json!({annotation::SIDECAR_SHUTDOWN: r#"{"mesh":"http://127.0.0.1:1/x"}"#}),
            json!([{"name": "mesh", "image": "istio/proxyv2"},
                   {"name": "l5d", "image": "cr.l5d.io/linkerd/proxy:stable",
                    "env": [{"name": env::PRIORITY_KRUISE, "value": "2"}]}]),
        );
        write(&mut p, Some(&named));
        assert!(env_of(&p, "mesh").is_empty(), "named by the annotation");
        assert_eq!(env_of(&p, "l5d"), [(env::PRIORITY_KRUISE, Some("2"))]);
        // Linkerd's endpoint is off unless the pod enables it; the pod's URL stays.
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[annotation::SIDECAR_SHUTDOWN],
            r#"{"mesh":"http://127.0.0.1:1/x"}"#
        );
        let mut p = pod(
            json!({annotation::SIDECAR_SHUTDOWN: "not json"}),
            json!([{"name": "mesh", "image": "istio/proxyv2"}]),
        );
        write(&mut p, None);
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[annotation::SIDECAR_SHUTDOWN],
            "not json"
        );
    }
}
