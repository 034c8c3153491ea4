//! The share: its layout and names, the exit file's round trip and refusals, removal.

use super::*;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};

mod exit_file;
mod layout;
mod removal;

const UID: &str = "0f5c7a1e-8d2b-4c3e-9f00-123456789abc";

fn key(uid: &str, name: &str) -> ExitKey {
    ExitKey {
        pod: PodUid::parse(uid).unwrap(),
        container: ContainerName::parse(name).unwrap(),
        place: Place::Share,
    }
}

fn setup() -> (tempfile::TempDir, Share) {
    let t = tempfile::tempdir().unwrap();
    let s = Share::open(t.path()).unwrap();
    (t, s)
}

/// Until `cond` holds, for at most 10 s (another thread's work, on a busy machine).
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < end, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
