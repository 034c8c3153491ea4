//! The arm64 build, as arm64 nodes get it: the image archive `scripts/image` writes is one
//! index of linux/amd64 and linux/arm64, and the arm64 binaries run, under Debian's
//! qemu-user-static: both answer `--version`, the arm64 entrypoint waits for its `allow`, and
//! the arm64 agent orders a real pod's exits on the test bed's containerd.
//!
//! Needs the archive and the arm64 binaries (`scripts/image`), qemu-aarch64-static, root and
//! `containerd runc busybox-static`; without them each test prints "SKIPPED: <reason>" and
//! passes, except in CI (`CI` set), where they are mandatory.

use exitorder_e2e::support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use exitorder_testbed::AgentOptions;
use serde_json::Value;
use support::{skip_or_fail, Bed};

const ARM64: &str = "target/static/aarch64-unknown-linux-gnu/release";

fn root() -> &'static Path {
    exitorder_e2e::repo()
}

/// qemu-aarch64-static and the arm64 build of `bin`, or why not.
fn arm64(bin: &str) -> Option<(PathBuf, PathBuf)> {
    let qemu = Command::new("qemu-aarch64-static")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !qemu {
        skip_or_fail("qemu-aarch64-static is missing (Debian's qemu-user-static)");
        return None;
    }
    let path = root().join(ARM64).join(bin);
    if !path.is_file() {
        skip_or_fail(&format!(
            "{} is missing: scripts/image builds it",
            path.display()
        ));
        return None;
    }
    Some((PathBuf::from("qemu-aarch64-static"), path))
}

/// A file of the OCI archive.
fn from_archive(archive: &Path, name: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(name)
        .output()
        .expect("tar runs");
    assert!(
        out.status.success(),
        "{name} is not in {}",
        archive.display()
    );
    out.stdout
}

fn blob(archive: &Path, digest: &str) -> Value {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    serde_json::from_slice(&from_archive(archive, &format!("blobs/sha256/{hex}")))
        .expect("a JSON blob")
}

#[test]
fn the_image_is_one_index_of_amd64_and_arm64() {
    let archive = root().join("target/image/exitorder.tar");
    if !archive.is_file() {
        skip_or_fail("target/image/exitorder.tar is missing: scripts/image writes it");
        return;
    }
    let top: Value = serde_json::from_slice(&from_archive(&archive, "index.json")).expect("JSON");
    // The archive's index names the image (its tag); its one entry is the image index.
    let entries = top["manifests"].as_array().expect("manifests");
    assert_eq!(entries.len(), 1, "{top}");
    let index = blob(&archive, entries[0]["digest"].as_str().expect("a digest"));
    let mut platforms: Vec<String> = index["manifests"]
        .as_array()
        .expect("an image index")
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap_or_default(),
                m["platform"]["architecture"].as_str().unwrap_or_default()
            )
        })
        .collect();
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{index}");
    // Each platform's image holds that platform's binaries: its config says so.
    for m in index["manifests"].as_array().expect("manifests") {
        let manifest = blob(&archive, m["digest"].as_str().expect("a digest"));
        let config = blob(
            &archive,
            manifest["config"]["digest"].as_str().expect("a config"),
        );
        assert_eq!(config["architecture"], m["platform"]["architecture"]);
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/usr/local/bin/exitorder"])
        );
    }
}

#[test]
fn the_arm64_binaries_run() {
    for bin in ["exitorder", "exitorder-entrypoint"] {
        let Some((qemu, path)) = arm64(bin) else {
            return;
        };
        let out = Command::new(qemu)
            .arg(&path)
            .arg("--version")
            .output()
            .expect("qemu runs");
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{bin} --version: {out:?}");
        assert!(said.starts_with(bin), "{bin} --version said {said:?}");
        // Static, for the image's empty root: no ELF interpreter.
        let elf = Command::new("readelf")
            .arg("-lh")
            .arg(&path)
            .output()
            .expect("readelf runs");
        let elf = String::from_utf8_lossy(&elf.stdout).into_owned();
        assert!(elf.contains("AArch64"), "{bin}: {elf}");
        assert!(!elf.contains("INTERP"), "{bin} is dynamically linked");
    }
}

/// The arm64 entrypoint's side of the exit handshake: it makes `exit` saying `wait`, and
/// returns once it says `allow` (written as the agent writes it: a new file taking its place).
#[test]
fn the_arm64_entrypoint_waits_for_its_allow() {
    let Some((qemu, path)) = arm64("exitorder-entrypoint") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // The agent's presence, as it marks every directory it serves.
    std::fs::write(dir.path().join("agent"), "version=1\nstate=serving\n").expect("presence");
    let mut child = Command::new(qemu)
        .arg(&path)
        .args(["wait", "--timeout", "60s", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu starts");
    let exit = dir.path().join("exit");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&exit).map_or(true, |s| s.trim() != "wait") {
        assert!(Instant::now() < deadline, "no exit file within 30 s");
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the entrypoint ended before its wait"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let tmp = dir.path().join(".allow");
    std::fs::write(&tmp, "allow\n").expect("write");
    std::fs::rename(&tmp, &exit).expect("rename");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the allow was not seen within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut said = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut said);
    }
    assert!(status.success(), "{status}: {said}");
    assert!(said.contains("exit allowed"), "{said}");
}

/// The arm64 agent, under qemu on the test bed's containerd, orders the two-level example:
/// the proxy leaves after the app. The pods' containers here are amd64, so their preStop runs
/// the amd64 entrypoint, put into the node's bin directory as the agent puts its own; the
/// emulated agent, which takes itself for an arm64 node, rightly refuses to install that one
/// (an arm64 node's pods run the arm64 entrypoint of the arm64 image).
#[tokio::test]
async fn the_arm64_agent_orders_a_pod() {
    let Some((qemu, agent)) = arm64("exitorder") else {
        return;
    };
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // The test bed starts the agent as a program: this one runs the arm64 build under qemu.
    let wrapper = dir.path().join("exitorder-arm64");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} {} \"$@\"\n",
            qemu.display(),
            agent.display()
        ),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    exitorder::handshake::bindir::install(&node.bin_dir(), support::static_entrypoint())
        .unwrap_or_else(|e| panic!("the amd64 entrypoint into the bin directory: {e}"));
    let mut opts = AgentOptions::new(&wrapper, &node, support::static_entrypoint());
    // Emulated, it starts slower than natively.
    opts.ready_timeout = Duration::from_secs(120);
    let bed = Bed::with_agent(node, opts).await;
    bed.agent
        .wait_for(
            "the amd64 entrypoint refused",
            Duration::from_secs(30),
            |l| l.is("entrypoint_refused", &[]),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let pod = support::example("two-level");
    let running = bed.run_ready(&pod).await;
    let uid = running.uid().to_owned();
    let d = running.delete().await.expect("the deletion");
    bed.assert_ordered(&d, &uid, "proxy", "app").await;
    bed.finish().await;
}
