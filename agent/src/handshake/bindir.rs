//! The host directory the entrypoint is installed in (`--bin-dir`), apart from the share:
//! pods that take the entrypoint from the node mount it read-only and only the agent writes
//! it, so no pod can replace what the sidecars of other pods run. (The share is writable by
//! every pod that mounts its own directory of it: earlier agents kept the entrypoint there.)

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, Mode, OFlags};

use crate::handshake::share::{ShareError, ENTRYPOINT_NAME};

/// Installs `src` as `<dir>/exitorder-entrypoint` and `<dir>/exitorder-entrypoint-v2` (each a
/// temp file, fsync, rename; mode 0555), so a container starting at the same moment runs
/// either the old or the new binary, never a partial one. Creates `dir` (0755) when missing.
/// The second name is the one hooks that use `mark` run: an earlier agent that a rollback
/// brings back writes only the first, so those hooks keep an entrypoint that knows `mark`.
pub fn install(dir: &Path, src: &Path) -> Result<PathBuf, ShareError> {
    let bytes = std::fs::read(src).map_err(|e| ShareError::io("read", src, e))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| ShareError::io("create directory", dir, e))?;
    let fd = rfs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ShareError::io("open directory", dir, e))?;
    // The second name first: once the first name holds this release, so does the second.
    for name in exitorder_contract::share::ENTRYPOINT_NAMES.iter().rev() {
        crate::handshake::share::write_replace(&fd, dir, name, &bytes, 0o555, true)?;
    }
    Ok(dir.join(ENTRYPOINT_NAME))
}

/// Whether a share holds the `bin/` of an earlier agent: pods injected before the upgrade may
/// still run the entrypoint from it, so it is left as it is (nothing writes it any more).
pub fn legacy_in_share(share_root: &Path) -> Option<PathBuf> {
    let legacy = share_root.join(exitorder_contract::share::LEGACY_BIN_DIR);
    legacy
        .symlink_metadata()
        .is_ok_and(|m| m.is_dir())
        .then_some(legacy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn installs_atomically_read_only_and_replaces() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src-bin");
        std::fs::write(&src, b"\x7fELF-binary").unwrap();
        let dir = t.path().join("host/bin");
        let dst = install(&dir, &src).unwrap();
        assert_eq!(dst, dir.join("exitorder-entrypoint"));
        assert_eq!(std::fs::read(&dst).unwrap(), b"\x7fELF-binary");
        let mode = std::fs::metadata(&dst).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o555);
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode & 0o022,
            0,
            "the directory is writable by its owner only"
        );
        std::fs::write(&src, b"v2").unwrap();
        install(&dir, &src).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"v2");
        assert_eq!(
            std::fs::read(dir.join("exitorder-entrypoint-v2")).unwrap(),
            b"v2",
            "the name hooks with `mark` run holds the same binary"
        );
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        assert!(install(&dir, &t.path().join("missing")).is_err());
    }

    #[test]
    fn a_legacy_bin_is_found_and_a_link_is_not_one() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(legacy_in_share(t.path()), None);
        std::os::unix::fs::symlink("/", t.path().join("bin")).unwrap();
        assert_eq!(legacy_in_share(t.path()), None);
        std::fs::remove_file(t.path().join("bin")).unwrap();
        std::fs::create_dir(t.path().join("bin")).unwrap();
        assert_eq!(legacy_in_share(t.path()), Some(t.path().join("bin")));
    }
}
