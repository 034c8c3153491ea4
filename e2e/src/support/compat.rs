//! The previous release, for the version-skew tests: its agent and its static entrypoint,
//! built from its commit (`e2e/compat/previous`) out of the repository's own history, once
//! per machine and compiler: kept outside the clone, in
//! `<cache>/previous/<commit>-<rustc version>/` (the cache as `scripts/tools.sh` says), so a
//! fresh clone reuses it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use exitorder::handshake::elf::check_static_executable;
use exitorder_testbed::install::cache_dir;

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
    let cache = cache_dir().join("previous");
    std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let out = cache.join(format!("{commit}-{}", rustc_key()?));
    // Test processes build it at once (nextest runs each test in its own): one builds, the
    // others wait and find it built.
    let _lock = lock(&cache.join(format!("{commit}.lock")))?;
    let agent = out.join("exitorder");
    let entrypoint = out.join("exitorder-entrypoint");
    if agent.is_file() && entrypoint.is_file() {
        return Ok(Previous {
            commit,
            agent,
            entrypoint,
        });
    }
    // Whatever an earlier build left (an unpacking cut short, a failed build) is not trusted:
    // the build starts from the commit again.
    let work = out.join("build");
    let _ = std::fs::remove_dir_all(&work);
    let src = work.join("src");
    extract(root, &commit, &src)?;
    let manifest = src.join("Cargo.toml");
    let manifest = manifest.to_string_lossy();
    let target = work.join("target");
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
    let static_target = work.join("static");
    let static_target = static_target.to_string_lossy();
    build_static_entrypoint(
        "the previous release's entrypoint build",
        Some(&manifest),
        &static_target,
    )?;
    let built_entrypoint = work.join("static/release/exitorder-entrypoint");
    check_static_executable(&built_entrypoint)
        .map_err(|e| format!("{}: {e}", built_entrypoint.display()))?;
    // The binaries are what is kept; the sources and build trees (a few GiB) go.
    copy(&work.join("target/debug/exitorder"), &agent)?;
    copy(&built_entrypoint, &entrypoint)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(Previous {
        commit,
        agent,
        entrypoint,
    })
}

/// The compiler's version and commit, from `rustc -V` ("rustc 1.95.0 (59807616e 2026-04-14)"
/// is `1.95.0-59807616e`): a build by another compiler is another entry of the cache.
fn rustc_key() -> Result<String, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-V")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", rustc.to_string_lossy()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text
        .split_whitespace()
        .skip(1)
        .take(2)
        .map(|w| w.trim_start_matches('('))
        .collect();
    let key = words.join("-");
    if !out.status.success()
        || key.is_empty()
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    {
        return Err(format!(
            "`rustc -V` said {text:?}: no version to key the cache with"
        ));
    }
    Ok(key)
}

/// An exclusive lock on `path`, held until the file is dropped.
fn lock(path: &Path) -> Result<File, String> {
    let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("locking {}: {e}", path.display()))?;
    Ok(file)
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

/// Copies `from` to `to` by way of a temporary file beside it: a process that finds `to`
/// finds it whole.
fn copy(from: &Path, to: &Path) -> Result<(), String> {
    let tmp = to.with_extension("tmp");
    std::fs::copy(from, &tmp)
        .and_then(|_| std::fs::rename(&tmp, to))
        .map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))
}
