//! The share's file operations, each relative to a directory already open and none following
//! a link: what a container may have planted in its own directory (links, FIFOs, devices,
//! huge files, deep trees) is refused or taken apart without the agent leaving the tree.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};

use super::{
    Budget, Removal, ShareError, EXIT_FILE, MAX_EXIT_BYTES, MAX_LISTED, MAX_REMOVE_DEPTH, TEMP_SEQ,
};

fn temp_name(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        ".{prefix}.{}.{}.{nanos}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

pub(super) fn open_dir_at<Fd: AsFd, N: rustix::path::Arg + Copy>(
    dir: Fd,
    name: N,
    path: &Path,
) -> Result<OwnedFd, ShareError> {
    match rfs::openat(&dir, name, dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(fd),
        // O_DIRECTORY refuses anything else before opening it (a FIFO or a device named like
        // a directory is never opened), and a symbolic link with O_NOFOLLOW too: ENOTDIR for
        // both (ELOOP on some kernels for the link), told apart by what the name is.
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                    Err(ShareError::Link { path: path.into() })
                }
                _ => Err(ShareError::NotADirectory { path: path.into() }),
            }
        }
        Err(e) => Err(ShareError::io("open directory", path, e)),
    }
}

pub(super) fn mkdir_at<Fd: AsFd>(
    dir: Fd,
    name: &str,
    path: &Path,
    mode: u32,
) -> Result<(), ShareError> {
    match rfs::mkdirat(dir, name, Mode::from_raw_mode(mode)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(ShareError::io("create directory", path, e)),
    }
}

/// Writes `bytes` to a new temp file in `dir` and renames it to `name`.
pub(crate) fn write_replace(
    dir: &OwnedFd,
    dir_path: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
    durable: bool,
) -> Result<(), ShareError> {
    let tmp = write_temp(dir, dir_path, name, bytes, mode, durable)?;
    rename_temp(dir, dir_path, &tmp, name)?;
    if durable {
        rfs::fsync(dir).map_err(|e| ShareError::io("fsync", dir_path, e))?;
    }
    Ok(())
}

/// Puts `bytes` in place of `name` in one step, as [`write_replace`] does, by exchanging a
/// new file with the one there (`RENAME_EXCHANGE`). Returns the temp name that now holds the
/// replaced file, for the caller to remove off its own path; `None` when there was nothing
/// to exchange with, or the file system cannot exchange, and the new file was renamed over.
///
/// Why not rename over it: the replaced file's last link then goes inside the rename, and
/// with it the file's blocks, which a file system mounted with `discard` (ext4 on most cloud
/// disks) hands back to the device synchronously (1 to 5 ms on a node busy with pod
/// deletions, as long as a container likes with a file it made large); and ext4 flushes the
/// new file's data inside a rename over another (`auto_da_alloc`). An exchange does neither.
pub(crate) fn swap_in(
    dir: &OwnedFd,
    dir_path: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
) -> Result<Option<String>, ShareError> {
    let tmp = write_temp(dir, dir_path, name, bytes, mode, false)?;
    match rfs::renameat_with(dir, tmp.as_str(), dir, name, rfs::RenameFlags::EXCHANGE) {
        Ok(()) => Ok(Some(tmp)),
        // Nothing to exchange with (the file went), or no exchange here (EINVAL: the file
        // system does not support it): a plain rename does what it always did.
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
            rename_temp(dir, dir_path, &tmp, name).map(|()| None)
        }
        Err(e) => {
            let _ = rfs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
            Err(ShareError::io("rename", dir_path.join(name), e))
        }
    }
}

/// A new temp file in `dir` holding `bytes` with `mode`, closed; its name. Removed again
/// when it cannot be written whole.
fn write_temp(
    dir: &OwnedFd,
    dir_path: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
    durable: bool,
) -> Result<String, ShareError> {
    let tmp = temp_name(name);
    let tmp_path = dir_path.join(&tmp);
    let fd = rfs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(|e| ShareError::io("create", &tmp_path, e))?;
    let result = (|| {
        let mut done = 0usize;
        while let Some(rest) = bytes.get(done..).filter(|r| !r.is_empty()) {
            match rustix::io::write(&fd, rest) {
                Ok(n) => done = done.saturating_add(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(ShareError::io("write", &tmp_path, e)),
            }
        }
        // The umask (or a default ACL of the directory) may have narrowed the mode given to
        // openat. Changed only then: a chmod is one more metadata change, and on a busy node
        // each can wait for the disk's journal (the stat reads the inode in memory).
        let made = rfs::fstat(&fd).map_err(|e| ShareError::io("stat", &tmp_path, e))?;
        if made.st_mode & 0o7777 != mode {
            rfs::fchmod(&fd, Mode::from_raw_mode(mode))
                .map_err(|e| ShareError::io("chmod", &tmp_path, e))?;
        }
        if durable {
            rfs::fsync(&fd).map_err(|e| ShareError::io("fsync", &tmp_path, e))?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = rfs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
            Err(e)
        }
    }
}

/// Renames temp file `tmp` to `name`, removing it when that fails.
fn rename_temp(dir: &OwnedFd, dir_path: &Path, tmp: &str, name: &str) -> Result<(), ShareError> {
    rfs::renameat(dir, tmp, dir, name).map_err(|e| {
        let _ = rfs::unlinkat(dir, tmp, AtFlags::empty());
        ShareError::io("rename", dir_path.join(name), e)
    })
}

/// Opens the exit file in `dir` for reading, and nothing else: the name is first opened as a
/// path only (`O_PATH` runs no driver's open, so a FIFO cannot block and a device cannot
/// act), checked to be a regular file with no other hard link, and only then reopened for
/// reading through `/proc/self/fd`, which reopens that very inode: a file swapped in between
/// the check and the read is never opened. `None` when there is no exit file.
pub(super) fn open_exit_file(dir: &OwnedFd, path: &Path) -> Result<Option<OwnedFd>, ShareError> {
    open_checked(dir, EXIT_FILE, path)
}

/// [`open_exit_file`] for the file `name` of the directory (`path` is that file's).
pub(super) fn open_checked(
    dir: &OwnedFd,
    name: &str,
    path: &Path,
) -> Result<Option<OwnedFd>, ShareError> {
    let handle = match rfs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(ShareError::io("open", path, e)),
    };
    let checked = rfs::fstat(&handle).map_err(|e| ShareError::io("stat", path, e))?;
    check_exit_file(&checked, path)?;
    // O_NOCTTY: a terminal must never become the agent's; O_NONBLOCK: nothing may wait.
    let read = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let proc_path = format!("/proc/self/fd/{}", handle.as_raw_fd());
    match rfs::open(proc_path.as_str(), read, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        // Without /proc (a chroot), by name again; what was opened is checked once more.
        Err(rustix::io::Errno::NOENT) => {
            let fd = match rfs::openat(dir, name, read | OFlags::NOFOLLOW, Mode::empty()) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(rustix::io::Errno::LOOP) => return Err(ShareError::Link { path: path.into() }),
                Err(e) => return Err(ShareError::io("open", path, e)),
            };
            let opened = rfs::fstat(&fd).map_err(|e| ShareError::io("stat", path, e))?;
            check_exit_file(&opened, path)?;
            Ok(Some(fd))
        }
        Err(e) => Err(ShareError::io("reopen", path, e)),
    }
}

/// An exit file the agent may read: a regular file that no other name shares. The entrypoint
/// creates it with `O_EXCL` and the agent replaces it by a rename, so it never has a second
/// hard link; one that does may be any file of the node's, and its content would be read
/// and logged.
fn check_exit_file(st: &rfs::Stat, path: &Path) -> Result<(), ShareError> {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile if st.st_nlink > 1 => Err(ShareError::Link { path: path.into() }),
        FileType::RegularFile => Ok(()),
        FileType::Symlink => Err(ShareError::Link { path: path.into() }),
        _ => Err(ShareError::NotAFile { path: path.into() }),
    }
}

/// Reads an opened file of a container's directory into `buf` (sized [`MAX_EXIT_BYTES`]: the
/// handshake's files are words; whatever a container writes beyond that is not read) and
/// returns how many bytes it holds. The caller's buffer, on its stack: this is on the
/// decision's path, once per exit file read, and allocates nothing.
pub(super) fn read_capped(
    fd: &OwnedFd,
    path: &Path,
    buf: &mut [u8; MAX_EXIT_BYTES],
) -> Result<usize, ShareError> {
    let mut len = 0usize;
    while let Some(rest) = buf.get_mut(len..).filter(|r| !r.is_empty()) {
        match rustix::io::read(fd, rest) {
            Ok(0) => break,
            Ok(n) => len = len.saturating_add(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(ShareError::io("read", path, e)),
        }
    }
    Ok(len)
}

/// Names of the real (not symlinked) subdirectories of `dir`.
pub(super) fn subdirs(dir: &OwnedFd, path: &Path) -> Result<Vec<OsString>, ShareError> {
    let mut out = Vec::new();
    for name in entries(dir, path)? {
        let st = match rfs::statat(dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(ShareError::io("stat", path.join(&name), e)),
        };
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            out.push(name);
        }
    }
    Ok(out)
}

/// The first [`MAX_LISTED`] names in `dir`, read in the kernel's batches.
fn entries(dir: &OwnedFd, path: &Path) -> Result<Vec<OsString>, ShareError> {
    let mut out = Vec::new();
    for entry in listing(dir, path)? {
        let entry = entry.map_err(|e| ShareError::io("list", path, e))?;
        if out.len() >= MAX_LISTED {
            tracing::warn!(dir = %path.display(), limit = MAX_LISTED, "directory holds more entries than any pod makes; the rest is not read");
            break;
        }
        if let Some(name) = real_name(&entry) {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// A directory's entries as the kernel hands them out, a buffer at a time: nothing is read
/// ahead of what the caller takes.
fn listing(dir: &OwnedFd, path: &Path) -> Result<rfs::Dir, ShareError> {
    // Dir::read_from reopens "." from the fd, so the listing stays on the opened directory.
    rfs::Dir::read_from(dir).map_err(|e| ShareError::io("list", path, e))
}

/// An entry's name, `.` and `..` left out.
fn real_name(entry: &rfs::DirEntry) -> Option<&OsStr> {
    let name = entry.file_name().to_bytes();
    (name != b"." && name != b"..").then(|| OsStr::from_bytes(name))
}

/// Removes directory `name` under `parent` and everything in it, whatever it holds: names
/// that are not UTF-8, and trees of any depth. Below [`MAX_REMOVE_DEPTH`] levels a directory
/// is moved up to the top of the tree being removed (a rename within it) and taken apart
/// from there on a later pass, so at most that many directories are open at once however
/// deep a container nested its own. Links are removed, never followed.
pub(super) fn remove_tree_at(
    parent: &OwnedFd,
    name: &str,
    path: &Path,
    budget: &mut Budget,
) -> Result<Removal, ShareError> {
    let top = open_dir_at(parent, name, path)?;
    loop {
        let mut deferred = false;
        if !clear_dir(&top, &top, path, 0, &mut deferred, budget)? {
            return Ok(Removal::Unfinished);
        }
        if !deferred {
            break;
        }
    }
    match rfs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(Removal::Removed),
        Err(e) => Err(ShareError::io("remove directory", path, e)),
    }
}

/// Removes what `dir` holds, streaming its listing; directories deeper than the limit are
/// moved to `top` and `deferred` is set. `false` when the budget ran out first.
fn clear_dir(
    dir: &OwnedFd,
    top: &OwnedFd,
    path: &Path,
    depth: usize,
    deferred: &mut bool,
    budget: &mut Budget,
) -> Result<bool, ShareError> {
    for entry in listing(dir, path)? {
        let entry = entry.map_err(|e| ShareError::io("list", path, e))?;
        let Some(child) = real_name(&entry) else {
            continue;
        };
        if !budget.spend() {
            return Ok(false);
        }
        let child_path = path.join(child);
        let st = match rfs::statat(dir, child, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(ShareError::io("stat", child_path, e)),
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            match rfs::unlinkat(dir, child, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(ShareError::io("remove", child_path, e)),
            }
            continue;
        }
        if depth.saturating_add(1) >= MAX_REMOVE_DEPTH {
            move_up(dir, child, top, &child_path)?;
            *deferred = true;
            continue;
        }
        let sub = open_dir_at(dir, child, &child_path)?;
        if !clear_dir(
            &sub,
            top,
            &child_path,
            depth.saturating_add(1),
            deferred,
            budget,
        )? {
            return Ok(false);
        }
        match rfs::unlinkat(dir, child, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            // Something was moved up into it meanwhile (only the top receives moves, so
            // this is the top's own child): a later pass takes it.
            Err(rustix::io::Errno::NOTEMPTY) => *deferred = true,
            Err(e) => return Err(ShareError::io("remove directory", child_path, e)),
        }
    }
    Ok(true)
}

/// Moves a too-deep directory to the top of the tree under a name nothing there has (an
/// earlier round's moves may still be there: never replace one).
fn move_up(dir: &OwnedFd, child: &OsStr, top: &OwnedFd, path: &Path) -> Result<(), ShareError> {
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for n in 0..64u32 {
        let up = format!(".exitorder-removing-{seed}-{n}");
        match rfs::renameat_with(dir, child, top, up.as_str(), rfs::RenameFlags::NOREPLACE) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(ShareError::io("move up", path, e)),
        }
    }
    Err(ShareError::io("move up", path, rustix::io::Errno::EXIST))
}

pub(super) fn utf8<'a>(s: &'a OsStr, kind: &'static str) -> Result<&'a str, ShareError> {
    s.to_str().ok_or_else(|| ShareError::BadName {
        kind,
        name: s.to_string_lossy().into_owned(),
    })
}
