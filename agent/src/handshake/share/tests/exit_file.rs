//! The exit file: its round trip, the exchange of `allow`, and what is refused unread.

use super::*;

#[test]
fn exit_file_round_trip() {
    let (_t, s) = setup();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    assert_eq!(s.read_exit(&k).unwrap(), ExitState::Absent);
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(s.read_exit(&k).unwrap(), ExitState::Absent);
    std::fs::write(dir.join("exit"), "").unwrap();
    assert_eq!(s.read_exit(&k).unwrap(), ExitState::Waiting);
    std::fs::write(dir.join("exit"), "wait\n").unwrap();
    assert_eq!(s.read_exit(&k).unwrap(), ExitState::Waiting);
    assert_eq!(s.waiting_in(&k.pod).unwrap(), vec![k.clone()]);
    s.write_allow(&k).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("exit")).unwrap(),
        "allow\n"
    );
    assert_eq!(s.read_exit(&k).unwrap(), ExitState::Allowed);
    // Only `exit` is left: the temp file took its place, and the replaced one is removed.
    eventually("the replaced exit file removed", || {
        std::fs::read_dir(&dir).unwrap().count() == 1
    });
    std::fs::write(dir.join("exit"), "x".repeat(1000)).unwrap();
    match s.read_exit(&k).unwrap() {
        ExitState::Unexpected(text) => assert_eq!(text.len(), MAX_EXIT_BYTES),
        other => panic!("{other:?}"),
    }
}

#[test]
fn allow_takes_the_place_of_exit_and_the_replaced_file_goes_off_the_writers_path() {
    use std::os::unix::fs::MetadataExt;
    let (_t, s) = setup();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    std::fs::create_dir_all(&dir).unwrap();
    // The exchange itself: the new file takes `exit`'s name, the old one the temp name.
    std::fs::write(dir.join("exit"), "wait\n").unwrap();
    let dir_fd = rfs::open(&dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let tmp = at::swap_in(&dir_fd, &dir, EXIT_FILE, b"allow\n", 0o644)
        .unwrap()
        .expect("exchanged, not renamed over");
    assert_eq!(
        std::fs::read_to_string(dir.join("exit")).unwrap(),
        "allow\n"
    );
    assert_eq!(std::fs::read_to_string(dir.join(&tmp)).unwrap(), "wait\n");
    std::fs::remove_file(dir.join(&tmp)).unwrap();

    std::fs::write(dir.join("exit"), "wait\n").unwrap();
    let old = std::fs::File::open(dir.join("exit")).unwrap();
    s.write_allow(&k).unwrap();
    // `exit` is a new file holding the answer; the waiter's one is left whole (exchanged,
    // not written over), then unlinked by the share's own thread.
    assert_eq!(
        std::fs::read_to_string(dir.join("exit")).unwrap(),
        "allow\n"
    );
    assert_ne!(
        std::fs::metadata(dir.join("exit")).unwrap().ino(),
        old.metadata().unwrap().ino()
    );
    assert_eq!(std::io::read_to_string(&old).unwrap(), "wait\n");
    eventually("the replaced exit file unlinked", || {
        old.metadata().unwrap().nlink() == 0
    });
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);

    // No `exit` (withdrawn meanwhile): the answer is still put there, as before, and nothing
    // else is left.
    std::fs::remove_file(dir.join("exit")).unwrap();
    s.write_allow(&k).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("exit")).unwrap(),
        "allow\n"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);

    // A directory a container put in `exit`'s place is its own: moved aside, never removed.
    std::fs::remove_file(dir.join("exit")).unwrap();
    std::fs::create_dir(dir.join("exit")).unwrap();
    std::fs::write(dir.join("exit").join("keep"), "x").unwrap();
    s.write_allow(&k).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("exit")).unwrap(),
        "allow\n"
    );
    let aside = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != "exit")
            .map(|e| e.path())
            .collect::<Vec<_>>()
    };
    // Given the thread its turn: a removal it would make is made by then.
    let marker = key(UID, "marker");
    std::fs::create_dir_all(s.container_path(&marker)).unwrap();
    let held = s.container_path(&marker).join("exit");
    std::fs::write(&held, "wait\n").unwrap();
    let held = std::fs::File::open(held).unwrap();
    s.write_allow(&marker).unwrap();
    eventually("the marker's replaced file unlinked", || {
        held.metadata().unwrap().nlink() == 0
    });
    let left = aside();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(std::fs::read_to_string(left[0].join("keep")).unwrap(), "x");
    // Every removal was the share's thread's, none on the writer's path.
    assert_eq!(retire::tests::removed_elsewhere(), 0);
}

#[test]
fn exit_content_is_trimmed_as_the_entrypoint_trims_it() {
    assert_eq!(ExitState::parse(b" allow\r\n"), ExitState::Allowed);
    assert_eq!(ExitState::parse(b"\twait\x0c"), ExitState::Waiting);
    assert_eq!(ExitState::parse(b"\n\n"), ExitState::Waiting);
    for (content, shown) in [
        (&b"\x0ballow"[..], "\u{b}allow"),
        (b"allow\xc2\x85", "allow\u{85}"),
        (b"\xc2\xa0wait", "\u{a0}wait"),
    ] {
        assert_eq!(
            ExitState::parse(content),
            ExitState::Unexpected(shown.to_owned()),
            "{content:?}"
        );
    }
}

#[test]
fn links_are_never_followed() {
    let (t, s) = setup();
    let outside = t.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("exit"), "wait").unwrap();
    // A symlinked exit file is refused, and the allow replaces the link, not its target.
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    std::fs::create_dir_all(&dir).unwrap();
    symlink(outside.join("exit"), dir.join("exit")).unwrap();
    assert!(s.read_exit(&k).is_err());
    s.write_allow(&k).unwrap();
    assert_eq!(
        std::fs::read_to_string(outside.join("exit")).unwrap(),
        "wait"
    );
    // A symlinked container or pod directory is refused.
    let k2 = key(UID, "other");
    symlink(&outside, s.container_path(&k2)).unwrap();
    assert!(s.read_exit(&k2).is_err());
    assert!(s.write_allow(&k2).is_err());
    assert!(s.prepare_container_dir(&k2).is_err());
    let uid2 = "11111111-2222-3333-4444-555555555555";
    symlink(&outside, s.pods_path().join(uid2)).unwrap();
    assert!(s.write_allow(&key(uid2, "proxy")).is_err());
    assert!(!s.pods().unwrap().iter().any(|p| p.as_str() == uid2));
    // Removing the pod removes links, never what they point to.
    assert_eq!(
        s.remove_pod(&k.pod, &mut Budget::new(u64::MAX)).unwrap(),
        Removal::Removed
    );
    assert!(outside.join("exit").exists());
    assert!(!s.pod_path(&k.pod).exists());
}

#[test]
fn fifo_exit_file_does_not_block() {
    let (_t, s) = setup();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    std::fs::create_dir_all(&dir).unwrap();
    rfs::mknodat(
        rfs::CWD,
        dir.join("exit").as_path(),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    assert!(matches!(s.read_exit(&k), Err(ShareError::NotAFile { .. })));
}

/// The kernel state of this process's thread named `name` (`S` while it sleeps).
fn thread_state(name: &str) -> Option<char> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            return stat.rsplit_once(") ")?.1.chars().next();
        }
    }
    None
}

/// A thread opening `fifo` for writing, returned once it sleeps in that open: it stays
/// there until something opens the FIFO for reading, even for an instant.
fn blocked_fifo_writer(fifo: &Path, name: &str) -> std::thread::JoinHandle<()> {
    let f = fifo.to_owned();
    let writer = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = std::fs::OpenOptions::new().write(true).open(&f);
        })
        .unwrap();
    eventually("the writer blocked", || thread_state(name) == Some('S'));
    writer
}

#[test]
fn a_fifo_exit_file_is_never_opened() {
    let (_t, s) = setup();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("exit");
    rfs::mknodat(
        rfs::CWD,
        fifo.as_path(),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let writer = blocked_fifo_writer(&fifo, "eo-fifo-probe");
    for _ in 0..3 {
        let e = s.read_exit(&k).unwrap_err();
        assert_eq!(e.rejection(), Some(Rejection::NotAFile), "{e}");
    }
    // Opening it to read, even without blocking, would have woken the writer at once.
    assert_eq!(thread_state("eo-fifo-probe"), Some('S'));
    assert!(!writer.is_finished());
    assert!(s.waiting_in(&k.pod).unwrap().is_empty());
    // Released by a reader of our own.
    let _reader = rfs::open(
        fifo.as_path(),
        OFlags::RDONLY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .unwrap();
    writer.join().unwrap();
}

#[test]
fn sockets_devices_and_hard_links_are_refused_unread() {
    let (t, s) = setup();
    let outside = t.path().join("outside-secret");
    std::fs::write(&outside, "wait\n").unwrap();
    let hard = key(UID, "hard");
    std::fs::create_dir_all(s.container_path(&hard)).unwrap();
    std::fs::hard_link(&outside, s.container_path(&hard).join("exit")).unwrap();
    let e = s.read_exit(&hard).unwrap_err();
    assert_eq!(e.rejection(), Some(Rejection::Link), "{e}");
    // Not a live wait: the pod's directory can go, the other name of the file stays.
    assert!(s.waiting_in(&hard.pod).unwrap().is_empty());

    let sock = key(UID, "sock");
    std::fs::create_dir_all(s.container_path(&sock)).unwrap();
    let _listener =
        std::os::unix::net::UnixListener::bind(s.container_path(&sock).join("exit")).unwrap();
    let e = s.read_exit(&sock).unwrap_err();
    assert_eq!(e.rejection(), Some(Rejection::NotAFile), "{e}");

    let dir_exit = key(UID, "direxit");
    std::fs::create_dir_all(s.container_path(&dir_exit).join("exit")).unwrap();
    let e = s.read_exit(&dir_exit).unwrap_err();
    assert_eq!(e.rejection(), Some(Rejection::NotAFile), "{e}");

    // /dev/zero's numbers: reading it would never end. Creating a device needs root.
    let dev = key(UID, "dev");
    std::fs::create_dir_all(s.container_path(&dev)).unwrap();
    match rfs::mknodat(
        rfs::CWD,
        s.container_path(&dev).join("exit").as_path(),
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rfs::makedev(1, 5),
    ) {
        Ok(()) => {
            let e = s.read_exit(&dev).unwrap_err();
            assert_eq!(e.rejection(), Some(Rejection::NotAFile), "{e}");
        }
        Err(rustix::io::Errno::PERM) => {}
        Err(e) => panic!("mknod: {e}"),
    }

    assert_eq!(
        s.remove_pod(&hard.pod, &mut Budget::new(u64::MAX)).unwrap(),
        Removal::Removed
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "wait\n");
}

#[test]
fn refusals_say_what_they_are() {
    let (t, s) = setup();
    let outside = t.path().join("outside");
    std::fs::create_dir_all(outside.join("proxy")).unwrap();
    std::fs::write(outside.join("proxy/exit"), "wait").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A pod entry that is a link, or a file.
    let linked = PodUid::parse("11111111-2222-3333-4444-555555555555").unwrap();
    symlink(&outside, s.pod_path(&linked)).unwrap();
    let e = s.check_pod_dir(&linked).unwrap_err();
    assert_eq!(e.rejection(), Some(Rejection::Link), "{e}");
    let k = ExitKey {
        pod: linked.clone(),
        container: ContainerName::parse("proxy").unwrap(),
        place: Place::Share,
    };
    assert_eq!(
        s.read_exit(&k).unwrap_err().rejection(),
        Some(Rejection::Link)
    );
    assert_eq!(
        s.prepare_container_dir(&k).unwrap_err().rejection(),
        Some(Rejection::Link)
    );
    let file = PodUid::parse("22222222-2222-3333-4444-555555555555").unwrap();
    std::fs::write(s.pod_path(&file), "x").unwrap();
    let e = s.check_pod_dir(&file).unwrap_err();
    assert_eq!(e.rejection(), Some(Rejection::NotADirectory), "{e}");
    // A container entry that is a link to another pod's directory, or a FIFO.
    let victim = key(UID, "proxy");
    std::fs::create_dir_all(s.container_path(&victim)).unwrap();
    std::fs::write(s.container_path(&victim).join("exit"), "wait").unwrap();
    let thief = key("33333333-2222-3333-4444-555555555555", "proxy");
    std::fs::create_dir_all(s.pod_path(&thief.pod)).unwrap();
    symlink(s.container_path(&victim), s.container_path(&thief)).unwrap();
    assert_eq!(
        s.read_exit(&thief).unwrap_err().rejection(),
        Some(Rejection::Link)
    );
    assert_eq!(
        s.write_allow(&thief).unwrap_err().rejection(),
        Some(Rejection::Link)
    );
    let fifo = key(UID, "fifo");
    rfs::mknodat(
        rfs::CWD,
        s.container_path(&fifo).as_path(),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    assert_eq!(
        s.prepare_container_dir(&fifo).unwrap_err().rejection(),
        Some(Rejection::NotADirectory)
    );
    assert_eq!(
        s.read_exit(&fifo).unwrap_err().rejection(),
        Some(Rejection::NotADirectory)
    );
    // Nothing outside or in the other pod changed; an I/O error is no refusal.
    assert_eq!(
        std::fs::read_to_string(s.container_path(&victim).join("exit")).unwrap(),
        "wait"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("proxy/exit")).unwrap(),
        "wait"
    );
    let mode = std::fs::metadata(&outside).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
    assert_eq!(
        ShareError::io("read", "/x", io::Error::other("eio")).rejection(),
        None
    );
    assert!(
        ShareError::BadName {
            kind: "pod uid",
            name: "x".into()
        }
        .rejection()
            == Some(Rejection::BadName)
    );
}

#[test]
fn the_presence_file_is_the_contracts_and_its_states_differ_in_size() {
    use exitorder_contract::handshake::{
        holds_endpoints, presence, Presence, AGENT_VERSION, HOLDS_ENDPOINTS, STATE_SERVING,
        STATE_UNINSTALLED,
    };
    for (state, tail) in [
        (
            PresenceState::Serving,
            format!("state={STATE_SERVING}\n{HOLDS_ENDPOINTS}\n"),
        ),
        (
            PresenceState::Uninstalled,
            format!("state={STATE_UNINSTALLED}\n"),
        ),
    ] {
        assert_eq!(state.content(), format!("version={AGENT_VERSION}\n{tail}"));
    }
    assert!(holds_endpoints(PresenceState::Serving.content().as_bytes()));
    assert!(!holds_endpoints(b"version=1\nstate=serving\n"));
    assert!(!holds_endpoints(
        b"version=1\nstate=serving\nendpoints=10\n"
    ));
    assert_eq!(
        presence(PresenceState::Uninstalled.content().as_bytes()),
        Presence::Uninstalled
    );
    // A mark checks the size only: a change of state must change it.
    assert_ne!(
        PresenceState::Serving.content().len(),
        PresenceState::Uninstalled.content().len()
    );
}

#[test]
fn a_file_swapped_in_has_its_whole_mode_whatever_the_umask_took() {
    use std::os::unix::fs::PermissionsExt;
    let (_t, s) = setup();
    let k = key(UID, "proxy");
    let dir = s.container_path(&k);
    std::fs::create_dir_all(&dir).unwrap();
    let dir_fd = rfs::open(&dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    // The test's umask (022 as a rule) takes write from group and others: set again whole.
    for mode in [0o666, 0o644] {
        at::swap_in(&dir_fd, &dir, EXIT_FILE, b"allow\n", mode).unwrap();
        let made = std::fs::metadata(dir.join("exit"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(made, mode, "{mode:o}");
    }
}
