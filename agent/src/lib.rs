//! exitorder: sidecar containers leave a Kubernetes pod after the containers they serve.
//!
//! The node agent answers the exit handshake: a sidecar's preStop creates
//! `pods/<uid>/<name>/exit` in the host share, and the agent writes `allow` once every
//! lower-priority container of the pod has exited (or the grace deadline comes).

// The agent serves every tenant of its node as root: nothing a pod or the runtime sends may
// panic it. These keep panicking operations out of its code (tests may use them).
#![cfg_attr(
    not(test),
    deny(
        clippy::arithmetic_side_effects,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic,
        clippy::unreachable,
        clippy::todo
    )
)]

// One folder per role; each folder's module doc lists its parts.
pub mod agent; // the decision loop: waits in, answers out
pub mod app; // the agent's tasks, started and stopped together
pub mod backoff;
pub mod cli; // the command line, `exitorder explain`, manifests
pub mod cluster; // the API server: pod watch, Events
pub mod config;
pub mod decide; // the pure decision: facts, priorities, stop order, restarts
#[cfg(feature = "fault-hooks")]
pub mod faults; // faults the tests inject into the real binary
pub mod handshake; // the share on the node: layout, waits, inotify, guards
pub mod jobs; // Jobs that finish: completion rules, sidecar shutdown
pub mod kubelet; // the agent's model of the kubelet: kills, their Events, their grace
pub mod pod; // a pod's identity, checked where it enters
pub mod podspec; // which containers a pod spec has, and which are ordered
pub mod presets; // the sidecars people run, as data
pub mod runtime; // the container runtime: CRI client, exit sources, cgroups
pub mod serve; // HTTP: the one server helper, the agent's metrics endpoint
pub mod stats;
pub mod telemetry;
pub mod view; // the node view and the reads that keep it current
pub mod webhook; // admission: the mutation, its review, TLS, Pod Security

/// Generated from proto/runtime/v1/api.proto: the CRI v1 subset exitorder calls.
#[allow(clippy::all, clippy::pedantic)]
pub mod cri {
    tonic::include_proto!("runtime.v1");
}

/// Generated from proto/containerd/: containerd's event service and task events.
#[allow(clippy::all, clippy::pedantic)]
pub mod containerd {
    pub mod events {
        tonic::include_proto!("containerd.events");
    }
    pub mod services {
        pub mod events {
            pub mod v1 {
                tonic::include_proto!("containerd.services.events.v1");
            }
        }
    }
}
