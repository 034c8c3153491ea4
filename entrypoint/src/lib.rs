//! exitorder-entrypoint: the in-pod half of exitorder.
//!
//! Runs as a sidecar's preStop hook and holds the sidecar's shutdown until
//! the exitorder agent on the node says the containers it serves have exited
//! (`wait`); also as a postStart hook that holds the next container back
//! until a sidecar is ready (`await`), and as the agent's way to stop a mesh
//! proxy in a finished Job (`shutdown`); and as the init container that
//! copies the binary into a pod's own volume, where the pod's other
//! containers run it from (`install`).
//! The binary is copied into arbitrary images and has to be small and fully
//! static, so the crate does without Rust's std: `core` and `alloc`, over the
//! C library (linked statically into the shipped binary), see [`sys`].

#![no_std]

extern crate alloc;
// The unit tests run under libtest, which needs std.
#[cfg(test)]
extern crate std;

pub mod cli;
pub mod duration;
pub mod endpoint;
pub mod exec;
pub mod http;
pub mod install;
pub mod log;
pub mod lossy;
pub mod prestop;
pub mod sys;
pub mod url;
pub mod wait;
