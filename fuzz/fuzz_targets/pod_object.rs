//! The pod watch's objects: any JSON the API server could send as a Pod of this node, read
//! as the watch reads it (`serde_json` into k8s-openapi's `Pod`), through the pod watch's
//! conversion (`ApiPod::from_pod`) and everything the agent derives from it: its grace
//! period, whether it is staying, its native sidecars, its exit priorities, every decision
//! of its waits, and its Job shutdown. Every field is the pod author's, at any int64.
//!
//! Input: the Pod's JSON.
//!
//! Oracle: no panic; an object without a pod UID is not read, any other is; the grace periods
//! are bounded (at most a year; the kubelet's at least 1 s); the native sidecars are exactly
//! the init containers with `restartPolicy: Always`, in order; the main containers are the
//! spec's, in order; and the pod (its containers in the states its status gives, their env
//! priorities from their literal env) passes the checks of `common::pod`, with and without
//! the API server's view.
#![no_main]

#[path = "common/pod.rs"]
mod pod;

use std::collections::HashMap;
use std::time::Duration;

use exitorder::cluster::podwatch::ApiPod;
use exitorder::decide::bounds::MAX_SPAN;
use exitorder::decide::priority;
use exitorder::decide::RunState;
use exitorder::pod::PodUid;
use exitorder::view::{ContainerEntry, ContainerInfo, EnvPriority, PodEntry, SandboxInfo};
use k8s_openapi::api::core::v1::{Container, ContainerState, Pod};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(object) = serde_json::from_slice::<Pod>(data) else {
        return;
    };
    let Some(api) = ApiPod::from_pod(&object) else {
        assert!(
            object
                .metadata
                .uid
                .as_deref()
                .is_none_or(|u| PodUid::parse(u).is_err()),
            "a pod with a pod UID is read"
        );
        return;
    };
    assert_eq!(Some(api.uid.as_str()), object.metadata.uid.as_deref());
    assert_eq!(api.deleting, object.metadata.deletion_timestamp.is_some());
    assert!(api.grace.is_none_or(|g| g <= MAX_SPAN));
    assert!(api.deletion_grace.is_none_or(|g| g <= MAX_SPAN));
    if let Some(g) = api.grace() {
        assert!(g >= Duration::from_secs(1) && g <= MAX_SPAN, "{g:?}");
    }
    let spec = object.spec.as_ref();
    let native: Vec<&String> = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| &c.name)
        .collect();
    assert_eq!(api.native_sidecars.iter().collect::<Vec<_>>(), native);
    let main: Vec<&Container> = spec.into_iter().flat_map(|s| s.containers.iter()).collect();
    assert_eq!(
        api.containers.iter().collect::<Vec<_>>(),
        main.iter().map(|c| &c.name).collect::<Vec<_>>()
    );

    // The pod as the node view would hold it: its main containers and native sidecars, in
    // the states its status says, with the env priorities of their literal env.
    let states: HashMap<&str, RunState> = object
        .status
        .iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .map(|s| (s.name.as_str(), run_state(s.state.as_ref())))
        .collect();
    let natives = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let entries: Vec<ContainerEntry> = main
        .iter()
        .copied()
        .chain(natives)
        .enumerate()
        .map(|(i, c)| ContainerEntry {
            info: ContainerInfo {
                id: format!("c{i}"),
                pod_uid: api.uid.clone(),
                name: c.name.clone(),
                attempt: 0,
                created_at: i64::try_from(i).unwrap_or(i64::MAX),
                state: states
                    .get(c.name.as_str())
                    .copied()
                    .unwrap_or(RunState::Running),
                grace: api.grace,
                marks: false,
            },
            env: EnvPriority::Known(priority::from_env(
                c.env
                    .iter()
                    .flatten()
                    .filter_map(|e| e.value.as_deref().map(|v| (e.name.as_str(), v))),
            )),
            exit_seen: None,
            kernel_exit: None,
            execs: Default::default(),
            exit_by_kernel: false,
        })
        .collect();
    let sandbox = SandboxInfo {
        id: "sandbox".to_owned(),
        pod_uid: api.uid.clone(),
        namespace: api.namespace.clone(),
        name: api.name.clone(),
        annotations: api.annotations.clone().into_iter().collect(),
        created_at: 0,
    };
    let v = PodEntry::new(Some(sandbox), entries);
    pod::check(&v, Some(&api));
    pod::check(&v, None);
});

fn run_state(s: Option<&ContainerState>) -> RunState {
    match s {
        Some(s) if s.terminated.is_some() => RunState::Exited,
        Some(s) if s.running.is_some() => RunState::Running,
        Some(s) if s.waiting.is_some() => RunState::Created,
        _ => RunState::Unknown,
    }
}
