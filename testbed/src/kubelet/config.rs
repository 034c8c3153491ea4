//! The CRI requests the kubelet would send for a planned pod: the sandbox's and each
//! container's configuration, with the kubelet's labels and annotations, which the agent reads.

use std::collections::BTreeMap;
use std::path::Path;

use exitorder::cri::{
    security_profile::ProfileType, Capability, ContainerConfig, ContainerMetadata, IdMapping,
    ImageSpec, Int64Value, KeyValue, LinuxContainerConfig, LinuxContainerResources,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount,
    MountPropagation, NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
    SecurityProfile, UserNamespace,
};
use exitorder::runtime::{ANNOTATION_GRACE, LABEL_CONTAINER_NAME, LABEL_POD_UID};

use super::plan::{ContainerPlan, Handler, PodPlan, Seccomp, Security};

use exitorder_contract::kubelet::{
    ANNOTATION_HASH, ANNOTATION_PORTS, ANNOTATION_PRESTOP, ANNOTATION_RESTART_COUNT,
    LABEL_POD_NAME, LABEL_POD_NAMESPACE,
};

/// What the kubelet masks and makes read-only in /proc and /sys for unprivileged containers
/// (procMount Default).
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

fn namespaces(plan: &PodPlan) -> NamespaceOption {
    // A pod runs on the node's network (the test bed gives no pod a network of its own but a
    // user-namespaced one); the hostname must then stay empty, or runc refuses to set it
    // without a private UTS namespace.
    NamespaceOption {
        // A user-namespaced pod has a network namespace of its own (see `PodPlan::host_users`).
        network: if plan.userns_host_id.is_some() {
            NamespaceMode::Pod
        } else {
            NamespaceMode::Node
        } as i32,
        pid: if plan.host_pid {
            NamespaceMode::Node
        } else if plan.share_process_namespace {
            NamespaceMode::Pod
        } else {
            NamespaceMode::Container
        } as i32,
        ipc: if plan.host_ipc {
            NamespaceMode::Node
        } else {
            NamespaceMode::Pod
        } as i32,
        target_id: String::new(),
        userns_options: plan.userns_host_id.map(|host_id| UserNamespace {
            mode: NamespaceMode::Pod as i32,
            uids: id_mappings(host_id),
            gids: id_mappings(host_id),
        }),
    }
}

/// How many IDs a user-namespaced pod gets, as the kubelet gives them (its default).
pub const USERNS_LENGTH: u32 = 65_536;

/// The pod's ID mapping: the container's 0..65535 from `host_id` on. The kubelet gives the
/// same to the user namespace and to each volume's idmapped mount.
fn id_mappings(host_id: u32) -> Vec<IdMapping> {
    vec![IdMapping {
        host_id,
        container_id: 0,
        length: USERNS_LENGTH,
    }]
}

fn profile(s: Option<&Seccomp>) -> SecurityProfile {
    // Unset means Unconfined: the kubelet's default while its seccompDefault is off.
    let t = match s {
        Some(Seccomp::RuntimeDefault) => ProfileType::RuntimeDefault,
        Some(Seccomp::Unconfined) | None => ProfileType::Unconfined,
    };
    SecurityProfile {
        profile_type: t as i32,
        localhost_ref: String::new(),
    }
}

/// The pod's sandbox, as RunPodSandbox receives it.
pub fn sandbox(plan: &PodPlan, log_directory: &Path, cgroup_parent: &str) -> PodSandboxConfig {
    let mut labels = plan.labels.clone();
    labels.insert(LABEL_POD_NAME.to_owned(), plan.name.clone());
    labels.insert(LABEL_POD_NAMESPACE.to_owned(), plan.namespace.clone());
    labels.insert(LABEL_POD_UID.to_owned(), plan.uid.clone());
    // The kubelet passes the pod's annotations plus the two it adds itself.
    let mut annotations = plan.annotations.clone();
    annotations.insert("kubernetes.io/config.source".to_owned(), "api".to_owned());
    annotations.insert(
        "kubernetes.io/config.seen".to_owned(),
        humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string(),
    );
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: plan.name.clone(),
            uid: plan.uid.clone(),
            namespace: plan.namespace.clone(),
            attempt: 0,
        }),
        // The kubelet names the host after the pod where the pod has its own network (and
        // with it its own UTS namespace).
        hostname: if plan.userns_host_id.is_some() {
            plan.name.clone()
        } else {
            String::new()
        },
        log_directory: log_directory.to_string_lossy().into_owned(),
        dns_config: None,
        labels: labels.into_iter().collect(),
        annotations: annotations.into_iter().collect(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_owned(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(plan)),
                run_as_user: plan.pod_run_as_user.map(|value| Int64Value { value }),
                run_as_group: plan.pod_run_as_group.map(|value| Int64Value { value }),
                readonly_rootfs: false,
                supplemental_groups: plan.supplemental_groups.clone(),
                privileged: plan.all().any(|c| c.security.privileged),
                seccomp: Some(profile(plan.pod_seccomp.as_ref())),
            }),
            sysctls: Default::default(),
        }),
    }
}

/// A pod annotation of the test bed's own: its text is written as the containers'
/// `io.kubernetes.pod.terminationGracePeriod` in place of the pod's grace period, standing for
/// a kubelet or runtime that hands the agent any text there (the agent must survive it).
pub const RUNTIME_GRACE_ANNOTATION: &str = "testbed.exitorder.io/runtime-grace";

/// A host path for each of a container's mounts, resolved by the caller (volumes live on the
/// node), in the order of `c.mounts`.
pub fn container(
    plan: &PodPlan,
    c: &ContainerPlan,
    attempt: u32,
    host_paths: &[String],
) -> ContainerConfig {
    let labels: BTreeMap<&str, String> = [
        (LABEL_CONTAINER_NAME, c.name.clone()),
        (LABEL_POD_NAME, plan.name.clone()),
        (LABEL_POD_NAMESPACE, plan.namespace.clone()),
        (LABEL_POD_UID, plan.uid.clone()),
    ]
    .into_iter()
    .collect();
    let mut annotations: BTreeMap<&str, String> = [
        (ANNOTATION_HASH, container_hash(c)),
        (ANNOTATION_RESTART_COUNT, attempt.to_string()),
        (
            "io.kubernetes.container.terminationMessagePath",
            c.termination_message_path.clone(),
        ),
        (
            "io.kubernetes.container.terminationMessagePolicy",
            c.termination_message_policy.clone(),
        ),
        (
            ANNOTATION_GRACE,
            plan.annotations
                .get(RUNTIME_GRACE_ANNOTATION)
                .cloned()
                .unwrap_or_else(|| plan.grace_seconds.to_string()),
        ),
    ]
    .into_iter()
    .collect();
    if let Some(pre_stop) = c.spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        if let Ok(json) = serde_json::to_string(pre_stop) {
            annotations.insert(ANNOTATION_PRESTOP, json);
        }
    }
    if let Some(ports) = &c.ports_json {
        annotations.insert(ANNOTATION_PORTS, ports.clone());
    }
    let mounts = c
        .mounts
        .iter()
        .zip(host_paths)
        .map(|(m, host)| Mount {
            container_path: m.container_path.clone(),
            host_path: host.clone(),
            readonly: m.read_only,
            selinux_relabel: false,
            propagation: match m.propagation.as_deref() {
                Some("HostToContainer") => MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => MountPropagation::PropagationBidirectional,
                _ => MountPropagation::PropagationPrivate,
            } as i32,
            uid_mappings: plan.userns_host_id.map(id_mappings).unwrap_or_default(),
            gid_mappings: plan.userns_host_id.map(id_mappings).unwrap_or_default(),
        })
        .collect();
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(ImageSpec {
            image: c.image.clone(),
            user_specified_image: c.image.clone(),
            ..Default::default()
        }),
        command: c.command.clone(),
        args: c.args.clone(),
        working_dir: c.working_dir.clone(),
        envs: c
            .env
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        mounts,
        labels: labels.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        annotations: annotations
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        log_path: format!("{}/{attempt}.log", c.name),
        stdin: false,
        stdin_once: false,
        tty: false,
        linux: Some(LinuxContainerConfig {
            // A limit of 0 is none (`MilliCPUToQuota` gives no quota).
            resources: c.cpu_limit_milli.filter(|m| *m > 0).map(cpu_limit),
            security_context: Some(security(plan, &c.security)),
        }),
    }
}

/// The kernel's default CFS period, which the kubelet keeps (`cpuCFSQuotaPeriod`, 100 ms).
const CFS_PERIOD_US: i64 = 100_000;
/// The smallest quota the kernel takes, which the kubelet rounds up to (`MinQuotaPeriod`).
const MIN_QUOTA_US: i64 = 1_000;

/// A CPU limit as the kubelet makes it (`kuberuntime_container_linux.go`
/// `calculateLinuxResources`, which calls `cm/helpers_linux.go` `MilliCPUToQuota`: the limit's
/// share of each 100 ms period, at least 1 ms; the period stays 100 ms unless the
/// `CPUCFSQuotaPeriod` feature gate is on).
fn cpu_limit(milli: u64) -> LinuxContainerResources {
    let milli = i64::try_from(milli).unwrap_or(i64::MAX);
    LinuxContainerResources {
        cpu_period: CFS_PERIOD_US,
        cpu_quota: (milli.saturating_mul(CFS_PERIOD_US) / 1000).max(MIN_QUOTA_US),
        ..Default::default()
    }
}

fn security(plan: &PodPlan, s: &Security) -> LinuxContainerSecurityContext {
    let (masked, readonly) = if s.privileged {
        (Vec::new(), Vec::new())
    } else {
        (
            MASKED_PATHS.iter().map(|p| (*p).to_owned()).collect(),
            READONLY_PATHS.iter().map(|p| (*p).to_owned()).collect(),
        )
    };
    LinuxContainerSecurityContext {
        capabilities: Some(Capability {
            add_capabilities: s.add_capabilities.clone(),
            drop_capabilities: s.drop_capabilities.clone(),
            add_ambient_capabilities: Vec::new(),
        }),
        privileged: s.privileged,
        namespace_options: Some(namespaces(plan)),
        run_as_user: s.run_as_user.map(|value| Int64Value { value }),
        run_as_username: String::new(),
        readonly_rootfs: s.read_only_root,
        supplemental_groups: plan.supplemental_groups.clone(),
        no_new_privs: s.no_new_privs,
        run_as_group: s.run_as_group.map(|value| Int64Value { value }),
        masked_paths: masked,
        readonly_paths: readonly,
        seccomp: Some(profile(s.seccomp.as_ref())),
    }
}

/// A stand-in for the kubelet's container hash: stable for the same container spec.
fn container_hash(c: &ContainerPlan) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    serde_json::to_string(&c.spec)
        .unwrap_or_default()
        .hash(&mut h);
    format!("{:08x}", h.finish() & 0xffff_ffff)
}

/// A handler as the timeline shows it.
pub fn describe(h: &Handler) -> String {
    match h {
        Handler::Exec(cmd) => cmd.join(" "),
        Handler::HttpGet {
            host, port, path, ..
        } => format!(
            "GET http://{}:{port}{path}",
            host.as_deref().unwrap_or("<pod>")
        ),
        Handler::TcpSocket { host, port } => {
            format!("TCP {}:{port}", host.as_deref().unwrap_or("<pod>"))
        }
        Handler::Sleep(s) => format!("sleep {s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn planned(host_users: bool) -> PodPlan {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web"},
            "spec": {"hostUsers": host_users, "hostNetwork": host_users,
                     "containers": [{"name": "a", "image": "x",
                        "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                     "volumes": [{"name": "v", "emptyDir": {}}]}});
        let place = super::super::plan::Placement::example();
        super::super::plan::plan(&pod, &place).expect("a plan")
    }

    /// As the kubelet asks for it: the pod's own user and network namespaces, and every
    /// volume an idmapped mount with the user namespace's mapping.
    #[test]
    fn a_user_namespaced_pod_is_asked_for_as_the_kubelet_asks() {
        let mut plan = planned(false);
        plan.userns_host_id = Some(3 * USERNS_LENGTH);
        let sb = sandbox(&plan, Path::new("/logs"), "/kubepods/pod1");
        let ns = sb
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .expect("namespace options");
        assert_eq!(ns.network, NamespaceMode::Pod as i32);
        let userns = ns.userns_options.expect("a user namespace");
        assert_eq!(userns.mode, NamespaceMode::Pod as i32);
        let want = vec![IdMapping {
            host_id: 196_608,
            container_id: 0,
            length: 65_536,
        }];
        assert_eq!((&userns.uids, &userns.gids), (&want, &want));
        assert_eq!(sb.hostname, "web");
        let c = container(&plan, &plan.containers[0], 0, &["/host/v".to_owned()]);
        assert_eq!(c.mounts[0].uid_mappings, want);
        assert_eq!(c.mounts[0].gid_mappings, want);
        let own = c
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .and_then(|n| n.userns_options);
        assert_eq!(own, Some(userns));
        // The node's users: none of it.
        let plan = planned(true);
        let sb = sandbox(&plan, Path::new("/logs"), "/kubepods/pod1");
        let ns = sb
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options);
        assert!(
            ns.is_some_and(
                |n| n.userns_options.is_none() && n.network == NamespaceMode::Node as i32
            )
        );
        let c = container(&plan, &plan.containers[0], 0, &["/host/v".to_owned()]);
        assert!(c.mounts[0].uid_mappings.is_empty());
    }
}
