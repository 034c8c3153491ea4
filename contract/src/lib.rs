//! The names exitorder's parts agree on, defined once: the agent, the entrypoint (`no_std`),
//! the webhook and the test bed all read them from here. They are a contract with users too
//! (annotations, env, mount paths): changing one breaks pods that rely on it.
#![no_std]
#![forbid(unsafe_code)]

/// The host share and what is in it.
pub mod share {
    use core::ffi::CStr;

    /// The share's default location on a node.
    pub const DEFAULT_DIR: &str = "/var/lib/exitorder";
    /// `pods/<pod-uid>/<container>/`: one directory per container.
    pub const PODS_DIR: &str = "pods";
    /// `bin/`: where earlier agents installed the entrypoint. Nothing is installed there
    /// any more (the share is writable by pods, and the entrypoint is run by every sidecar);
    /// an agent that finds one leaves it to pods injected before the upgrade and says so.
    pub const LEGACY_BIN_DIR: &str = "bin";
    /// The entrypoint's file name, in the host's bin directory, in the agent's image and in a
    /// pod's `exitorder-bin` volume, as the entrypoint hands it to the C library.
    pub const ENTRYPOINT_C: &CStr = c"exitorder-entrypoint";
    /// The same name as text.
    pub const ENTRYPOINT: &str = match ENTRYPOINT_C.to_str() {
        Ok(s) => s,
        Err(_) => panic!("the entrypoint's name is UTF-8"),
    };
    /// The entrypoint's second name in the host's bin directory, run by the hooks that use a
    /// verb the first release's entrypoint does not know (`mark`). The agent installs the
    /// entrypoint under both names; an earlier agent, after a rollback, rewrites only the
    /// first and leaves this one, so a pod admitted before the rollback keeps an entrypoint
    /// that knows its hook, and its own hook after it runs.
    pub const ENTRYPOINT_V2: &str = "exitorder-entrypoint-v2";
    /// Every name the entrypoint has in the host's bin directory.
    pub const ENTRYPOINT_NAMES: [&str; 2] = [ENTRYPOINT, ENTRYPOINT_V2];
}

/// The host directory the agent installs the entrypoint in (`--bin-dir`), apart from the
/// share: pods that take the entrypoint from the node (the webhook's hostPath mode,
/// hand-written pods) mount it read-only, and only the agent writes it.
pub mod bin {
    /// Its default location on a node.
    pub const DEFAULT_DIR: &str = "/var/lib/exitorder-bin";
}

/// The exit handshake in a container's directory.
pub mod handshake {
    /// The file a waiting preStop creates.
    pub const EXIT_FILE: &str = "exit";
    /// The file a container's preStop creates, without waiting, as the kubelet starts to stop
    /// it (`exitorder-entrypoint mark`, which every container of an injected pod runs before
    /// its own hook): the agent takes it (removes it) as the node's own word that this
    /// container is being stopped now. A pod kill runs every container's preStop at once, a
    /// restart only the restarted one's, so the marks of the others tell the two apart.
    pub const MARK_FILE: &str = "stopping";
    /// What the agent leaves in a mark's place once it took it: `seen=<Unix ns>`, when it saw
    /// it, so that an agent started later (a restart, an upgrade) still knows the container
    /// was being stopped then. The entrypoint never reads it.
    pub const MARK_SEEN_FILE: &str = "stopping.seen";
    /// Its content while it waits.
    pub const WAIT: &str = "wait";
    /// Its content once the agent allows the exit.
    pub const ALLOW: &str = "allow";
    /// The agent's presence in a container's directory: written when the agent first
    /// serves the directory, so a waiting sidecar can tell an agent that is briefly away
    /// (restarting, upgraded: the file stays, the wait goes on) from none at all (no file:
    /// the sidecar proceeds after its short `--presence` wait) or from exitorder uninstalled
    /// (`state=uninstalled`: it proceeds at once). Lines of `key=value`; a reader ignores
    /// keys it does not know, so later agents can say more.
    pub const AGENT_FILE: &str = "agent";
    /// The version of the presence file's format, its `version=` line.
    pub const AGENT_VERSION: u32 = 1;
    /// `state=` of an agent serving the directory.
    pub const STATE_SERVING: &str = "serving";
    /// `state=` once exitorder was uninstalled from the node: no agent will answer.
    pub const STATE_UNINSTALLED: &str = "uninstalled";

    /// What a presence file says.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Presence {
        /// An agent serves the directory (or a later one says something this reader does
        /// not know, which errs toward the order).
        Serving,
        /// exitorder was uninstalled: nothing will answer.
        Uninstalled,
    }

    /// Reads a presence file leniently: the `state=` line decides, unknown keys and lines
    /// are ignored, and anything but [`STATE_UNINSTALLED`] reads as [`Presence::Serving`].
    pub fn presence(content: &[u8]) -> Presence {
        for line in content.split(|b| *b == b'\n') {
            let line = line.trim_ascii();
            if let Some(state) = line.strip_prefix(b"state=") {
                if state.trim_ascii() == STATE_UNINSTALLED.as_bytes() {
                    return Presence::Uninstalled;
                }
            }
        }
        Presence::Serving
    }

    /// The presence file's line by which an agent says it holds an app's wait until the pod's
    /// endpoints are withdrawn ([`super::annotation::WAIT_FOR_ENDPOINTS`]). An entrypoint let
    /// go by an agent that does not say it (a release before the feature) waits the settle
    /// time itself: a pod's own entrypoint (its `emptyDir` copy) on a node whose agent is a
    /// release behind still waits as long as the sleep it replaces.
    pub const HOLDS_ENDPOINTS: &str = "endpoints=1";

    /// Whether a presence file says [`HOLDS_ENDPOINTS`].
    pub fn holds_endpoints(content: &[u8]) -> bool {
        content
            .split(|b| *b == b'\n')
            .any(|line| line.trim_ascii() == HOLDS_ENDPOINTS.as_bytes())
    }
}

/// Where a sidecar sees the share.
pub mod mount {
    use core::ffi::CStr;

    /// The container's own directory (`subPathExpr: pods/$(POD_UID)/<name>`), as the
    /// entrypoint hands it to the C library.
    pub const EXIT_DIR_C: &CStr = c"/var/run/exitorder";
    /// The same directory as text.
    pub const EXIT_DIR: &str = match EXIT_DIR_C.to_str() {
        Ok(s) => s,
        Err(_) => panic!("the exit directory is UTF-8"),
    };
    /// The share's `bin/`, read-only.
    pub const BIN_DIR: &str = "/var/run/exitorder-bin";
    /// The entrypoint as a sidecar runs it.
    pub const ENTRYPOINT: &str = "/var/run/exitorder-bin/exitorder-entrypoint";
    /// The entrypoint as a hook that uses `mark` runs it from the host's bin directory (see
    /// [`super::share::ENTRYPOINT_V2`]).
    pub const ENTRYPOINT_V2: &str = "/var/run/exitorder-bin/exitorder-entrypoint-v2";
    /// Every path a container runs the entrypoint by.
    pub const ENTRYPOINTS: [&str; 2] = [ENTRYPOINT, ENTRYPOINT_V2];
}

/// Pod annotations.
pub mod annotation {
    /// `{"container": N}`, N in 0..=255; larger exits later.
    pub const PRIORITY: &str = "exitorder.io/container-exit-priority";
    /// The OpenKruise proposal's name for [`PRIORITY`].
    pub const PRIORITY_KRUISE: &str = "kruise.io/container-exit-priority";
    /// `"true"`: the webhook injects the share, env and preStop.
    pub const INJECT: &str = "exitorder.io/inject";
    /// The OpenKruise proposal's name for [`INJECT`].
    pub const INJECT_KRUISE: &str = "container-exit-priority.kruise.io/auto-inject-prestop";
    /// `"true"`: main containers start only after every sidecar is ready.
    pub const AWAIT_SIDECARS: &str = "exitorder.io/await-sidecars";
    /// `"false"`: no Job sidecar shutdown.
    pub const TERMINATE_ON_COMPLETION: &str = "exitorder.io/terminate-sidecars-on-completion";
    /// `{"container": "URL"}`: the HTTP shutdown of a sidecar.
    pub const SIDECAR_SHUTDOWN: &str = "exitorder.io/sidecar-shutdown";
    /// `["name", ...]`: the pod's native sidecars (init containers with `restartPolicy:
    /// Always`) in declaration order, written by the webhook. The kubelet copies pod
    /// annotations to the sandbox, so the agent knows the kubelet's stop order without the
    /// API server.
    pub const NATIVE_SIDECARS: &str = "exitorder.io/native-sidecars";
    /// `{"restartPolicy": "Never", "containers": [{"name": "worker", "restartPolicy":
    /// "OnFailure", "restartPolicyRules": [...]}, ...]}`: a completing pod's restart policy
    /// and its main containers' own, in declaration order, written by the webhook. With
    /// [`NATIVE_SIDECARS`], all Job completion needs from the spec, so an agent without the
    /// API server completes the pod's Job as one with it.
    pub const RESTARTS: &str = "exitorder.io/restart-policy";
    /// `"true"`: the app containers' preStop (priority 0) is held until no EndpointSlice
    /// lists the pod as ready, then for [`ENDPOINTS_SETTLE`], at most
    /// [`ENDPOINTS_MAX_WAIT`] and never past the grace deadline (see [`super::endpoints`]).
    pub const WAIT_FOR_ENDPOINTS: &str = "exitorder.io/wait-for-endpoints";
    /// A duration (`2s`, `1500ms`): how long after the withdrawal the consumers of the
    /// pod's endpoints (kube-proxy, ingress controllers, mesh balancers) are given to
    /// reprogram; also the whole wait when nothing can tell the withdrawal (no agent, no
    /// API server, the kubelet's own kills).
    pub const ENDPOINTS_SETTLE: &str = "exitorder.io/endpoints-settle";
    /// A duration: the longest the withdrawal is waited for, from the app's preStop.
    pub const ENDPOINTS_MAX_WAIT: &str = "exitorder.io/endpoints-max-wait";
}

/// Endpoints first: the defaults and bounds of [`annotation::WAIT_FOR_ENDPOINTS`].
pub mod endpoints {
    /// The default settle time, ms. kube-proxy applies an EndpointSlice change at most
    /// `minSyncPeriod` after the previous sync (1 s by default in iptables and nftables mode,
    /// `pkg/proxy/apis/config/v1alpha1/defaults.go`), and a sync of a large node's rules
    /// takes up to about another second: 2 s covers both with the watch's delivery.
    pub const DEFAULT_SETTLE_MS: u64 = 2_000;
    /// The default longest wait for the withdrawal, ms: a controller-manager that has not
    /// withdrawn the pod by then is not about to.
    pub const DEFAULT_MAX_WAIT_MS: u64 = 15_000;
    /// The largest settle time or maximum a pod may ask for, ms; the grace deadline bounds
    /// every wait anyway.
    pub const LIMIT_MS: u64 = 300_000;
    /// The label the EndpointSlice controller puts on each slice: its Service's name.
    pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
}

/// Container env.
pub mod env {
    /// A container's own exit priority; the annotation wins.
    pub const PRIORITY: &str = "EXITORDER_EXIT_PRIORITY";
    /// The OpenKruise proposal's name for [`PRIORITY`].
    pub const PRIORITY_KRUISE: &str = "KRUISE_EXIT_PRIORITY";
    /// The pod's UID, from the downward API: what `subPathExpr` expands.
    pub const POD_UID: &str = "POD_UID";
}

/// The kubelet's CRI labels and annotations, how the agent finds pods in the runtime.
pub mod kubelet {
    pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
    pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
    pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
    /// On each container: the pod's terminationGracePeriodSeconds.
    pub const ANNOTATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
    pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
    pub const ANNOTATION_HASH: &str = "io.kubernetes.container.hash";
    pub const ANNOTATION_PRESTOP: &str = "io.kubernetes.container.preStopHandler";
    pub const ANNOTATION_PORTS: &str = "io.kubernetes.container.ports";
}

/// The pod-local handshake: each sidecar's exit directory is a sub-directory of the pod's own
/// `emptyDir` volume, which the kubelet keeps on the node at
/// `<kubelet root>/pods/<pod uid>/volumes/kubernetes.io~empty-dir/<volume>/<container>/`
/// (pkg/volume/emptydir), where the agent finds it.
pub mod podlocal {
    /// Where kubeadm, k3s, rke2 and OpenShift keep the kubelet's state.
    pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";
    /// The kubelet's directory of pods, under its root.
    pub const PODS_DIR: &str = "pods";
    /// From a pod's directory to the volume: the kubelet's volumes, the emptyDir plugin's.
    pub const VOLUME_PATH: [&str; 2] = ["volumes", "kubernetes.io~empty-dir"];
    /// The pod's volume that holds its sidecars' exit directories.
    pub const VOLUME: &str = "exitorder";
    /// Its medium: a tmpfs, so the handshake's renames never wait for a disk's journal on a
    /// busy node. What the pod writes there counts against its own memory.
    pub const VOLUME_MEDIUM: &str = "Memory";
    /// Its size: the handshake's files are bytes (a page each in a tmpfs), a few per
    /// container; the kubelet mounts the tmpfs with this size.
    pub const VOLUME_SIZE_LIMIT: &str = "1Mi";
    /// The pod's volume the entrypoint is copied into, mounted read-only at `mount::BIN_DIR`.
    pub const BIN_VOLUME: &str = "exitorder-bin";
    /// The init container that copies it there, from the project's image.
    pub const INSTALL_CONTAINER: &str = "exitorder-install";
    /// The entrypoint in the project's image.
    pub const IMAGE_ENTRYPOINT: &str = "/usr/local/bin/exitorder-entrypoint";
    /// The user the install container runs as: no user of the image (it has none), not root.
    pub const INSTALL_UID: i64 = 65532;
}

#[cfg(test)]
mod tests {
    use super::handshake::{presence, Presence};

    #[test]
    fn presence_reads_the_state_line_and_ignores_the_rest() {
        assert_eq!(
            presence(b"version=1\nstate=uninstalled\n"),
            Presence::Uninstalled
        );
        assert_eq!(
            presence(b"version=9\nnew-key=x\n state=uninstalled \r\n"),
            Presence::Uninstalled
        );
        assert_eq!(presence(b"version=1\nstate=serving\n"), Presence::Serving);
        // Unknown states, garbage and nothing at all err toward the order.
        assert_eq!(presence(b"state=draining\n"), Presence::Serving);
        assert_eq!(presence(b"\xff\x00"), Presence::Serving);
        assert_eq!(presence(b""), Presence::Serving);
    }
}
