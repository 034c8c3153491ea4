//! The previous release, for the version-skew tests: its agent and its static entrypoint,
//! built from its commit (`e2e/compat/previous`) out of the repository's own history, once
//! per machine (kept under `target/compat/<commit>/`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use exitorder::handshake::elf::check_static_executable;

use super::{build_static_entrypoint, cargo};

/// The previous release's binaries.
#[derive(Debug)]
pub struct Previous {
    pub commit: String,
    pub agent: PathBuf,
    /// Static, as the image ships it.
    pub entrypoint: PathBuf,
}

/// The previous release, built on first use; `Err` says why it cannot be had (its commit
/// missing from a shallow clone, a build that fails).
pub fn previous() -> Result<&'static Previous, String> {
    static BUILT: OnceLock<Result<Previous, String>> = OnceLock::new();
    BUILT.get_or_init(build).as_ref().map_err(Clone::clone)
}

fn build() -> Result<Previous, String> {
    let root = crate::repo();
    let file = root.join("e2e/compat/previous");
    let commit = std::fs::read_to_string(&file)
        .map_err(|e| format!("{}: {e}", file.display()))?
        .trim()
        .to_owned();
    let out = root.join("target/compat").join(&commit);
    let agent = out.join("exitorder");
    let entrypoint = out.join("exitorder-entrypoint");
    if agent.is_file() && entrypoint.is_file() {
        return Ok(Previous {
            commit,
            agent,
            entrypoint,
        });
    }
    let src = out.join("src");
    if !src.join("Cargo.toml").is_file() {
        extract(root, &commit, &src)?;
    }
    let manifest = src.join("Cargo.toml");
    let manifest = manifest.to_string_lossy();
    let target = out.join("target");
    let target = target.to_string_lossy();
    cargo(
        "the previous release's agent build",
        &[
            "build",
            "--manifest-path",
            &manifest,
            "-p",
            "exitorder",
            "--bin",
            "exitorder",
            "--target-dir",
            &target,
        ],
    )?;
    let static_target = out.join("static");
    let static_target = static_target.to_string_lossy();
    build_static_entrypoint(
        "the previous release's entrypoint build",
        Some(&manifest),
        &static_target,
    )?;
    copy(&out.join("target/debug/exitorder"), &agent)?;
    copy(
        &out.join("static/release/exitorder-entrypoint"),
        &entrypoint,
    )?;
    check_static_executable(&entrypoint).map_err(|e| format!("{}: {e}", entrypoint.display()))?;
    Ok(Previous {
        commit,
        agent,
        entrypoint,
    })
}

/// The tree of `commit`, from the repository's history (`git archive`), into `dir`.
fn extract(root: &Path, commit: &str, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let archive = dir.with_extension("tar");
    let status = Command::new("git")
        .current_dir(root)
        .args(["archive", "--format=tar", "-o"])
        .arg(&archive)
        .arg(commit)
        .status()
        .map_err(|e| format!("git: {e}"))?;
    if !status.success() {
        return Err(format!(
            "git archive {commit} failed ({status}): the previous release's commit must be in \
             the clone's history (not a shallow clone)"
        ));
    }
    let status = Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(dir)
        .status()
        .map_err(|e| format!("tar: {e}"))?;
    let _ = std::fs::remove_file(&archive);
    if status.success() {
        Ok(())
    } else {
        Err(format!("unpacking {commit} failed ({status})"))
    }
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))
}
