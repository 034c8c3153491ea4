//! `exitorder-entrypoint install DIR`, the real binary as a process: what the init container
//! `exitorder-install` runs to put the entrypoint in the pod's `emptyDir`.

mod common;

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{assert_code, stderr, BIN};
use exitorder_contract::{podlocal, share};

/// The user the injected init container runs as.
fn install_uid() -> u32 {
    u32::try_from(podlocal::INSTALL_UID).expect("a uid")
}

fn install(dir: &Path) -> Output {
    Command::new(BIN)
        .arg("install")
        .arg(dir)
        .output()
        .expect("run the entrypoint")
}

fn install_as(dir: &Path, uid: u32) -> Output {
    Command::new(BIN)
        .arg("install")
        .arg(dir)
        .uid(uid)
        .gid(uid)
        .output()
        .expect("run the entrypoint")
}

/// Whether this process runs as root (`/proc/self` is owned by the effective user).
fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A temporary directory that the init container's user can reach (tempfile makes them
/// 0700, which would stop that user at the door rather than at what a test means).
fn reachable_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// Runs the install as a user who is not root: the init container's user when the tests
/// run as root, else the tests' own.
fn install_as_non_root(dir: &Path) -> Output {
    if is_root() {
        install_as(dir, install_uid())
    } else {
        install(dir)
    }
}

fn the_binary() -> Vec<u8> {
    std::fs::read(BIN).expect("the binary")
}

/// Everything in `dir` but `keep`.
fn others(dir: &Path, keep: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != keep)
        .collect()
}

#[test]
fn the_copy_is_the_binary_runnable_by_anyone_and_changeable_by_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = install(dir.path());
    assert_code(&out, 0);
    let binary = the_binary();
    let copy = dir.path().join(share::ENTRYPOINT);
    assert_eq!(
        stderr(&out),
        format!(
            "exitorder-entrypoint: installed {}/{} ({} bytes, mode 0555)\n",
            dir.path().display(),
            share::ENTRYPOINT,
            binary.len()
        )
    );
    assert_eq!(std::fs::read(&copy).expect("the copy"), binary);
    let meta = std::fs::metadata(&copy).expect("stat");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o555);
    assert_eq!(meta.nlink(), 1);
    let help = Command::new(&copy)
        .arg("--help")
        .output()
        .expect("run the copy");
    assert_code(&help, 0);
    assert!(String::from_utf8_lossy(&help.stdout).contains("install DIR"));
    assert_eq!(others(dir.path(), share::ENTRYPOINT), Vec::<String>::new());
}

#[test]
fn a_second_install_replaces_the_first_by_a_rename_and_clears_debris() {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join(share::ENTRYPOINT);
    std::fs::write(&copy, "an older entrypoint").expect("older");
    // A container that started the older copy keeps running what it started: the file
    // is replaced, never written over.
    let mut running = std::fs::File::open(&copy).expect("open the older copy");
    // What an install killed half-way leaves behind.
    std::fs::write(dir.path().join(".exitorder-entrypoint.new"), "half").expect("debris");
    assert_code(&install(dir.path()), 0);
    assert_code(&install(dir.path()), 0);
    assert_eq!(std::fs::read(&copy).expect("the copy"), the_binary());
    let mut older = String::new();
    running.read_to_string(&mut older).expect("read");
    assert_eq!(older, "an older entrypoint");
    assert_eq!(others(dir.path(), share::ENTRYPOINT), Vec::<String>::new());
}

#[test]
fn installs_at_the_same_time_take_turns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let children: Vec<_> = (0..8)
        .map(|_| {
            Command::new(BIN)
                .arg("install")
                .arg(dir.path())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run the entrypoint")
        })
        .collect();
    for child in children {
        assert_code(&child.wait_with_output().expect("wait"), 0);
    }
    assert_eq!(
        std::fs::read(dir.path().join(share::ENTRYPOINT)).expect("the copy"),
        the_binary()
    );
    assert_eq!(others(dir.path(), share::ENTRYPOINT), Vec::<String>::new());
}

#[test]
fn a_temporary_name_taken_by_a_link_is_never_written_through() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let target = outside.path().join("victim");
    std::fs::write(&target, "keep").expect("victim");
    std::os::unix::fs::symlink(&target, dir.path().join(".exitorder-entrypoint.new"))
        .expect("link");
    assert_code(&install(dir.path()), 0);
    assert_eq!(std::fs::read_to_string(&target).expect("victim"), "keep");
    assert_eq!(others(dir.path(), share::ENTRYPOINT), Vec::<String>::new());
}

#[test]
fn a_non_root_user_installs_into_its_own_directory() {
    let dir = reachable_tempdir();
    let own = dir.path().join("bin");
    std::fs::create_dir(&own).expect("mkdir");
    let user = if is_root() {
        std::os::unix::fs::chown(&own, Some(install_uid()), Some(install_uid())).expect("chown");
        install_uid()
    } else {
        std::fs::metadata("/proc/self").expect("stat").uid()
    };
    let out = install_as_non_root(&own);
    assert_code(&out, 0);
    let copy = own.join(share::ENTRYPOINT);
    assert_eq!(std::fs::read(&copy).expect("the copy"), the_binary());
    let meta = std::fs::metadata(&copy).expect("stat");
    assert_eq!(meta.uid(), user);
    assert_eq!(meta.permissions().mode() & 0o7777, 0o555);
    let help = Command::new(&copy)
        .arg("--help")
        .uid(user)
        .gid(user)
        .output()
        .expect("run the copy");
    assert_code(&help, 0);
}

#[test]
fn a_directory_it_cannot_use_fails_saying_why_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("file");
    std::fs::write(&file, "x").expect("file");
    let real = dir.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("link");
    let missing = dir.path().join("missing");
    let mut link_slash = link.clone().into_os_string();
    link_slash.push("/");
    for (target, says) in [
        (
            missing.clone(),
            "open the directory: No such file or directory",
        ),
        (file.clone(), "open the directory: Not a directory"),
        (link.clone(), "a symbolic link, not followed"),
        // A trailing slash would have open(2) follow the link.
        (link_slash.into(), "a symbolic link, not followed"),
    ] {
        let out = install(&target);
        assert_code(&out, 1);
        let said = stderr(&out);
        assert!(
            said.starts_with("exitorder-entrypoint: cannot install into ") && said.contains(says),
            "{}: {said}",
            target.display()
        );
    }
    assert!(!missing.exists(), "created");
    assert_eq!(std::fs::read_to_string(&file).expect("file"), "x");
    assert_eq!(
        others(&real, ""),
        Vec::<String>::new(),
        "written through the link"
    );
}

#[test]
fn a_directory_the_user_may_not_write_in_fails_and_leaves_nothing() {
    let dir = reachable_tempdir();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).expect("mkdir");
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let out = install_as_non_root(&ro);
    assert_code(&out, 1);
    assert!(
        stderr(&out).contains("create the temporary file: Permission denied"),
        "{}",
        stderr(&out)
    );
    assert_eq!(others(&ro, ""), Vec::<String>::new());
}

#[test]
fn a_write_that_fails_part_way_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join(share::ENTRYPOINT);
    std::fs::write(&copy, "an older entrypoint").expect("older");
    // A file size limit of 32 KiB fails the write once that much is written, as a full
    // disk would; ignoring SIGXFSZ makes it an error rather than the end of the process.
    let out = Command::new("sh")
        .args([
            "-c",
            "ulimit -f 64; trap '' XFSZ; exec \"$0\" install \"$1\"",
            BIN,
        ])
        .arg(dir.path())
        .output()
        .expect("run the entrypoint");
    assert_code(&out, 1);
    assert!(
        stderr(&out).contains("write: File too large"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&copy).expect("the older copy"),
        "an older entrypoint"
    );
    assert_eq!(others(dir.path(), share::ENTRYPOINT), Vec::<String>::new());
}

#[test]
fn usage_errors_name_the_problem() {
    for (args, says) in [
        (vec!["install"], "DIR is required"),
        (vec!["install", "/a", "/b"], "unexpected argument"),
        (vec!["install", "--force"], "unknown flag"),
    ] {
        let out = Command::new(BIN).args(&args).output().expect("run");
        assert_code(&out, 64);
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}
