//! Walks of a pod spec's containers, as the webhook, `exitorder explain` and the pod watch
//! read them: one place says which containers a pod has and which of them the agent orders.

use k8s_openapi::api::core::v1::{Container, PodSpec};

/// A native sidecar (KEP-753): an init container with `restartPolicy: Always`, which starts
/// before the main containers and is stopped after them.
pub fn is_native(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Every container of `spec` as declared: the main containers, then the init containers.
/// Names are not assumed unique: the API server refuses a second, but explain and the
/// guards read whatever they are given.
pub fn containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

/// The containers the agent orders, each with whether it is a native sidecar: the main
/// containers, then the init containers with `restartPolicy: Always` (plain init containers
/// have exited before any deletion can find them).
pub fn ordered(spec: &PodSpec) -> impl Iterator<Item = (&Container, bool)> {
    let main = spec.containers.iter().map(|c| (c, false));
    let native = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_native(c))
        .map(|c| (c, true));
    main.chain(native)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PodSpec {
        serde_json::from_value(serde_json::json!({
            "containers": [{"name": "app"}, {"name": "worker"}],
            "initContainers": [
                {"name": "setup"},
                {"name": "proxy", "restartPolicy": "Always"},
                {"name": "app"},
            ],
        }))
        .expect("a pod spec")
    }

    #[test]
    fn every_container_main_then_init_as_declared() {
        let s = spec();
        let names: Vec<&str> = containers(&s).map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["app", "worker", "setup", "proxy", "app"]);
    }

    #[test]
    fn ordered_are_the_main_containers_then_native_sidecars() {
        let s = spec();
        let ordered: Vec<(&str, bool)> = ordered(&s).map(|(c, n)| (c.name.as_str(), n)).collect();
        assert_eq!(
            ordered,
            [("app", false), ("worker", false), ("proxy", true)]
        );
    }
}
