//! exitorder: sidecar containers leave a Kubernetes pod after the containers they serve.
//!
//! The node agent answers the exit handshake: a sidecar's preStop creates
//! `pods/<uid>/<name>/exit` in the host share, and the agent writes `allow` once every
//! lower-priority container of the pod has exited (or the grace deadline comes).
//!
//! Parts:
//! - `agent`: the decision loop: waits in, answers out;
//! - `app`: the agent's tasks, started and stopped together within a bounded time;
//! - `backoff`: the one back-off rule for whatever is retried;
//! - `cli`: the command line, `exitorder explain`, manifests;
//! - `cluster`: the API server: pod watch, Node, Events, the agent's own DaemonSet;
//! - `config`: the agent's settings and their defaults;
//! - `decide`: the pure decision: priorities, stop order, restarts, bounded numbers;
//! - `faults`: faults the tests inject into the real binary (`fault-hooks` only);
//! - `handshake`: the share on the node: layout, waits, marks, inotify, guards;
//! - `jobs`: Jobs that finish: completion rules, sidecar shutdown;
//! - `kubelet`: the agent's model of the kubelet: kills, their Events, their grace;
//! - `pod`: a pod's identity, checked where it enters;
//! - `podspec`: which containers a pod spec has, and which are ordered;
//! - `presets`: the sidecars people run, as data;
//! - `runtime`: the container runtime: CRI client, exit sources, cgroups, the view's reads;
//! - `serve`: HTTP: the one accept loop, the metrics endpoint, the metrics encoder;
//! - `stats`: counters of the agent's own work, plain atomics;
//! - `telemetry`: log set-up and the shutdown signal;
//! - `view`: the node view, and the facts a decision reads from it;
//! - `webhook`: admission: the mutation, its review, TLS, Pod Security.
//!
//! Face: the parts the binary, the test bed, the end-to-end tests and the fuzz targets reach,
//! `pub`; the others are the crate's own (`pub(crate)`), so the compiler finds what nobody
//! uses (the agent's settings are reached as `agent::Config`, the window of the kill
//! evidence as `agent::EVIDENCE_WINDOW`). The structure test holds `lib.rs` to this list:
//! `agent`, `app`, `cli`, `cluster`, `decide`, `faults`, `handshake`, `jobs`, `pod`,
//! `presets`, `runtime`, `serve`, `stats`, `telemetry`, `view`, `webhook`, `cri`.

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
pub mod agent;
pub mod app;
pub(crate) mod backoff;
pub mod cli;
pub mod cluster;
pub(crate) mod config;
pub mod decide;
#[cfg(feature = "fault-hooks")]
pub mod faults;
pub mod handshake;
pub mod jobs;
pub(crate) mod kubelet;
pub mod pod;
pub(crate) mod podspec;
pub mod presets;
pub mod runtime;
pub mod serve;
pub mod stats;
pub mod telemetry;
pub mod view;
pub mod webhook;

/// Generated from proto/runtime/v1/api.proto: the CRI v1 subset exitorder calls.
#[allow(clippy::all, clippy::pedantic)]
pub mod cri {
    tonic::include_proto!("runtime.v1");
}

/// Generated from proto/containerd/: containerd's event service and task events.
#[allow(clippy::all, clippy::pedantic)]
pub(crate) mod containerd {
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
