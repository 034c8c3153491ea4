//! What exitorder's integration and end-to-end tests share (each test file in `tests/` is its
//! own binary, and its own doc says what it tests).
//!
//! Parts:
//! - [`support`]: a test-bed node with the real agent on it, the static entrypoint and the
//!   agent built once per process, assertions on deletion timelines;
//! - [`fakecri`]: a CRI runtime served over a Unix socket, whose state a test sets;
//! - [`rig`]: the agent run in-process against them.
//!
//! The fake API server is the test bed's (`exitorder_testbed::fakeapi`, re-exported here as
//! `fakeapi`): the benchmark runs the agent against it too.

pub use exitorder_testbed::fakeapi;
pub mod fakecri;
pub mod rig;
pub mod support;

use std::path::Path;

/// The repository's root: the chart, examples, pods and tools the tests read are there.
pub fn repo() -> &'static Path {
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR"));
    e2e.parent().unwrap_or(e2e)
}
