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
//!
//! Parts:
//! - `cli`: the command line into a typed command, both spellings of `wait`;
//! - `prestop`: `wait`: ask for exit permission, wait, then run the old hook;
//! - `wait`: the exit-file handshake with the node agent, over inotify;
//! - `endpoint`: `await`, `shutdown` and the GET of `wait --http-get`;
//! - `install`: `install DIR`: the binary copied into a pod's own volume;
//! - `exec`: handing the process over to the wrapped command;
//! - `http`: a minimal HTTP/1.1 client, the status line only, one deadline;
//! - `url`: the loopback-only URLs the HTTP subcommands take;
//! - `duration`: durations as the webhook writes them, strictly parsed;
//! - `log`: diagnostics on stderr, few and short;
//! - `lossy`: bytes shown as text, for the diagnostics;
//! - `sys`: the little of the operating system needed, over the C library.

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
