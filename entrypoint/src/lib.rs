//! exitorder-entrypoint: the in-pod half of exitorder.
//!
//! Runs as a sidecar's preStop hook and holds the sidecar's shutdown until
//! the exitorder agent on the node says the containers it serves have exited.
//! The binary is copied into arbitrary images, so it is std-only apart from
//! rustix and is built fully static.

pub mod cli;
pub mod duration;
pub mod exec;
pub mod log;
pub mod prestop;
pub mod wait;
