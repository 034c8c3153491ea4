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

pub mod agent;
pub mod app;
pub mod backoff;
pub mod bindir;
pub mod bounds;
pub mod breach;
pub mod cli;
pub mod cluster;
pub mod completion;
pub mod config;
pub mod decide;
mod decisions;
pub mod elf;
pub mod explain;
pub mod facts;
mod gc;
pub mod hostpath;
pub mod jobs;
pub mod kernel;
pub mod manifest;
pub mod metrics;
pub mod podcgroup;
pub mod podwatch;
pub mod presets;
pub mod priority;
pub mod pss;
pub mod reader;
pub mod recorder;
pub mod restart;
pub mod runtime;
pub mod serve;
pub mod share;
pub mod source;
pub mod stats;
pub mod stoporder;
pub mod telemetry;
pub mod view;
pub mod waits;
pub mod watch;
pub mod webhook;

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
