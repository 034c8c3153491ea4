//! A pod's directory removed: links never followed, any depth, live waits kept, budgets.

use super::*;

#[test]
fn remove_pod_never_follows_links_out() {
    let (t, s) = setup();
    let outside = t.path().join("outside");
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    std::fs::write(outside.join("sub/file"), "keep").unwrap();
    std::fs::write(outside.join("exit"), "wait").unwrap();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    std::fs::create_dir_all(dir.join("nested")).unwrap();
    symlink(&outside, dir.join("escape")).unwrap();
    symlink(&outside, dir.join("nested/escape")).unwrap();
    // A linked exit file that says `wait` is no live wait: the directory still goes.
    symlink(outside.join("exit"), dir.join("exit")).unwrap();
    let fifo = key(UID, "fifo");
    std::fs::create_dir_all(s.container_path(&fifo)).unwrap();
    rfs::mknodat(
        rfs::CWD,
        s.container_path(&fifo).join("exit").as_path(),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    assert_eq!(
        s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
        Removal::Removed
    );
    assert!(!s.pod_path(&k.pod).exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("sub/file")).unwrap(),
        "keep"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("exit")).unwrap(),
        "wait"
    );
}

#[test]
fn remove_pod_takes_any_name_and_any_depth() {
    use std::os::unix::ffi::OsStrExt;
    let (_t, s) = setup();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    // What a container may plant in its own directory.
    let mut deep = dir.clone();
    for i in 0..200 {
        deep = deep.join(format!("d{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("leaf"), "x").unwrap();
    let odd = dir.join(std::ffi::OsStr::from_bytes(b"not-utf8-\xff\xfe"));
    std::fs::create_dir_all(odd.join(std::ffi::OsStr::from_bytes(b"\xc3"))).unwrap();
    std::fs::write(odd.join("f"), "x").unwrap();
    symlink("/etc", dir.join("link-to-etc")).unwrap();
    assert_eq!(
        s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
        Removal::Removed
    );
    assert!(!s.pod_path(&k.pod).exists());
    assert!(
        std::path::Path::new("/etc/passwd").exists(),
        "a link is removed, not followed"
    );
}

#[test]
fn remove_pod_keeps_live_waits() {
    let (_t, s) = setup();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    std::fs::create_dir_all(dir.join("nested/deeper")).unwrap();
    std::fs::write(dir.join("exit"), "wait").unwrap();
    assert_ne!(
        s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
        Removal::Removed
    );
    assert!(dir.exists());
    s.write_allow(&k).unwrap();
    assert_eq!(
        s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
        Removal::Removed
    );
    assert!(!s.pod_path(&k.pod).exists());
    // Already gone: nothing to do, and nothing to refuse.
    assert_eq!(
        s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
        Removal::Removed
    );
}

#[test]
fn removal_streams_a_flooded_directory_within_its_budget() {
    let (_t, s) = setup();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..3_000 {
        std::fs::write(dir.join(format!("junk-{i}")), "").unwrap();
    }
    // Deeper than the removal descends, so moved-up directories outlive a round.
    let mut deep = dir.clone();
    for i in 0..(MAX_REMOVE_DEPTH * 3) {
        deep = deep.join(format!("d{i}"));
        std::fs::create_dir(&deep).unwrap();
        std::fs::write(deep.join("f"), "").unwrap();
    }
    let count = |p: &Path| walk(p);
    let mut rounds = 0;
    loop {
        let before = count(&s.pod_path(&k.pod));
        let mut budget = Budget::new(500);
        let r = s.remove_pod(&k.pod, &mut budget).unwrap();
        rounds += 1;
        if r == Removal::Removed {
            break;
        }
        assert_eq!(r, Removal::Unfinished);
        assert_eq!(budget.left(), 0);
        let after = count(&s.pod_path(&k.pod));
        assert!(after < before, "round {rounds}: {before} -> {after}");
        assert!(rounds < 50, "no end in sight");
    }
    assert!(!s.pod_path(&k.pod).exists());
    assert!(
        rounds >= 6,
        "3,000+ entries at 500 a round took {rounds} rounds"
    );
}

/// Entries below `p`, every level.
fn walk(p: &Path) -> usize {
    std::fs::read_dir(p)
        .map(|d| {
            d.map(|e| {
                let e = e.unwrap();
                1 + if e.file_type().unwrap().is_dir() {
                    walk(&e.path())
                } else {
                    0
                }
            })
            .sum()
        })
        .unwrap_or(0)
}
