//! Tests that need what this machine may lack (root and containerd, helm, buildah,
//! promtool) say why they cannot run and pass, except in CI (`CI` set), where they fail:
//! nothing is skipped there.

use std::io::Write as _;

use crate::node::{Node, NodeOptions};

/// Whether this run must not skip: CI sets `CI`.
fn mandatory() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Says why a test cannot run here and returns, or fails it in CI, where nothing may be
/// skipped.
pub fn skip_or_fail(reason: &str) {
    if mandatory() {
        panic!("{reason} (mandatory in CI)");
    }
    // Straight to the stderr handle, past the test harness's output capture.
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {reason}\n");
}

/// A test node. `None` when this machine cannot run containerd and this is not CI: the
/// test then returns early, having said why.
pub async fn node_or_skip() -> Option<Node> {
    node_with_or_skip(NodeOptions::default()).await
}

/// A test node started with `opts`; `None` as for [`node_or_skip`].
pub async fn node_with_or_skip(opts: NodeOptions) -> Option<Node> {
    match Node::start(opts).await {
        Ok(n) => Some(n),
        Err(e) => {
            if mandatory() {
                panic!("end-to-end tests need a real containerd (mandatory in CI): {e}");
            }
            // Straight to the stderr handle, past the test harness's output capture, so the
            // skip is seen without --nocapture.
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED: no test node on this machine: {e}\n\
                 *** (run as root with `apt-get install -y containerd runc busybox-static`)\n"
            );
            None
        }
    }
}
