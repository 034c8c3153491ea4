//! Hostile share contents on a real containerd, while a real pod's exits are being answered.
//!
//! Every opted-in pod can write into its own container directory of the share, and the agent
//! runs as root: links at every level (to files and directories outside the share, to another
//! pod's directory, hard links), FIFOs, sockets, devices, huge and sparse files, names that
//! are no pod UIDs or container names, ten thousand junk directories, and directories renamed
//! under the agent while it answers them. The agent must not write, chmod, list or read
//! anything outside the share through them, nor block on them; it keeps answering the real
//! pod in order, counts each refusal by reason, and its garbage collection removes links
//! without following them.
//!
//! Needs root and `containerd runc busybox-static`; without them the test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use exitorder_e2e::support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::{self, File, FileTimes};
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use exitorder_testbed::{random_uuid, AgentOptions, AgentProcess};
use support::{assert_exited_after, example, http_get, parse_metrics, set_grace, until, Bed};

/// Owner and times given to everything outside the share: any change shows.
const OUTSIDE_UID: u32 = 4321;
const OUTSIDE_GID: u32 = 8765;
/// 2020-01-01: atime and mtime of everything outside. Under relatime (the default mount
/// option), any read of a file or listing of a directory moves an atime older than a day.
const OUTSIDE_TIME: Duration = Duration::from_secs(1_577_836_800);
/// Every reason the agent counts, as its metric labels them.
const REASONS: [&str; 5] = [
    "link",
    "not_a_file",
    "not_a_directory",
    "bad_name",
    "unexpected_content",
];
const JUNK_DIRS: usize = 10_000;
const RENAMES: usize = 100;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The node and an agent that collects pod directories every 500 ms, but only those changed
/// more than an hour ago: the stale pod below is dated back, the hostile ones stay to be
/// looked at again and again.
async fn start_bed() -> Option<Bed> {
    let node = support::node_or_skip().await?;
    let mut agent_opts =
        AgentOptions::new(support::agent_bin(), &node, support::static_entrypoint());
    agent_opts.grace_reserve = secs(3);
    agent_opts
        .env
        .push(("EXITORDER_GC_INTERVAL".into(), "500ms".into()));
    agent_opts
        .env
        .push(("EXITORDER_GC_MIN_AGE".into(), "1h".into()));
    let agent = AgentProcess::start(&agent_opts)
        .await
        .unwrap_or_else(|e| panic!("agent did not start: {e}"));
    agent
        .wait_for("the containerd event source", secs(10), |l| {
            l.says("exit source connected", &[("source", "containerd_events")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Some(Bed {
        agent,
        agent_opts,
        node,
    })
}

/// `exitorder_share_rejected_total` by reason, from the agent's /metrics.
async fn rejections(addr: SocketAddr) -> BTreeMap<String, f64> {
    let (code, body) = http_get(&addr.to_string(), "/metrics").await;
    assert_eq!(code, 200, "{body}");
    parse_metrics(&body)
        .into_iter()
        .filter_map(|(series, value)| {
            let reason = series
                .strip_prefix("exitorder_share_rejected_total{reason=\"")?
                .strip_suffix("\"}")
                .expect("one label");
            Some((reason.to_owned(), value))
        })
        .collect()
}

/// What is known of one entry outside the share, read without reading its content first.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    atime: (i64, i64),
    content: Option<Vec<u8>>,
}

/// Every entry at or below `root`, links not followed; each stat'ed before its content is
/// read or its directory listed, so the walk itself moves no atime it records.
fn inventory(root: &Path) -> BTreeMap<PathBuf, Seen> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_owned()];
    while let Some(p) = todo.pop() {
        let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_file() {
            "file"
        } else if ft.is_symlink() {
            "symlink"
        } else {
            "other"
        };
        let mut seen = Seen {
            kind,
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            atime: (m.atime(), m.atime_nsec()),
            content: None,
        };
        if ft.is_file() {
            seen.content = Some(fs::read(&p).expect("read outside file"));
        } else if ft.is_dir() {
            for e in fs::read_dir(&p).expect("list outside directory") {
                todo.push(e.expect("entry").path());
            }
        }
        out.insert(p.strip_prefix(root).expect("below root").to_owned(), seen);
    }
    out
}

/// Mode, owner and times of one outside entry.
fn settle(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
    std::os::unix::fs::chown(p, Some(OUTSIDE_UID), Some(OUTSIDE_GID)).expect("chown");
    set_old_times(p);
}

fn set_old_times(p: &Path) {
    let t = SystemTime::UNIX_EPOCH + OUTSIDE_TIME;
    File::open(p)
        .and_then(|f| f.set_times(FileTimes::new().set_accessed(t).set_modified(t)))
        .unwrap_or_else(|e| panic!("times of {}: {e}", p.display()));
}

/// The files and directories the share's links point to.
struct Outside {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Outside {
    /// Under /tmp, the share's filesystem: hard links and renames between the two work.
    fn create() -> Outside {
        let dir = tempfile::Builder::new()
            .prefix("eo-hostile-outside-")
            .tempdir_in("/tmp")
            .expect("outside dir");
        let root = dir.path().to_owned();
        let files: &[(&str, &str)] = &[
            ("secret-sym", "wait\n"),
            ("secret-hard", "wait\n"),
            ("gc-exit", "wait\n"),
            ("gc-hard", "wait\n"),
            ("pod-target/proxy/exit", "wait\n"),
            ("pod-target/proxy/data", "keep"),
            ("container-target/exit", "wait\n"),
            ("container-target/data", "keep"),
            ("gc-target/file", "keep"),
            ("gc-target/sub/file", "keep"),
        ];
        for (rel, content) in files {
            let p = root.join(rel);
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(&p, content).expect("write");
            settle(&p, 0o640);
        }
        // Directories last, deepest first: their times are set after their last change.
        let mut dirs: Vec<PathBuf> = inventory(&root)
            .into_iter()
            .filter(|(_, s)| s.kind == "dir")
            .map(|(p, _)| root.join(p))
            .collect();
        dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for d in dirs {
            settle(&d, 0o750);
        }
        Outside { _dir: dir, root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// What is outside, as a reference: taken, then every time set back, since taking it
    /// read the files and listed the directories.
    fn reference(&self) -> BTreeMap<PathBuf, Seen> {
        // Twice: the first reads what creating it left with new times.
        let mut seen = BTreeMap::new();
        for _ in 0..2 {
            seen = inventory(&self.root);
            for p in seen.keys() {
                set_old_times(&self.root.join(p));
            }
        }
        seen
    }

    /// Inode numbers of every directory outside, to look for in the agent's inotify watches.
    fn dir_inodes(&self) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        let mut todo = vec![self.root.clone()];
        while let Some(p) = todo.pop() {
            let m = fs::symlink_metadata(&p).expect("stat");
            if m.is_dir() {
                out.insert(m.ino());
                for e in fs::read_dir(&p).expect("list") {
                    todo.push(e.expect("entry").path());
                }
            }
        }
        out
    }
}

/// The kernel state of this process's thread named `name` (`S` while it sleeps).
fn thread_state(name: &str) -> Option<char> {
    for task in fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let stat = fs::read_to_string(task.path().join("stat")).ok()?;
            return stat.rsplit_once(") ")?.1.chars().next();
        }
    }
    None
}

const PROBE_THREAD: &str = "eo-hostile-fifo";

/// A thread opening the FIFO `fifo` for writing, returned once it sleeps in that open. It
/// stays there until something opens the FIFO for reading, even for an instant and without
/// blocking: if it ever wakes, the agent opened the FIFO.
async fn blocked_fifo_writer(fifo: &Path) -> std::thread::JoinHandle<()> {
    let f = fifo.to_owned();
    let writer = std::thread::Builder::new()
        .name(PROBE_THREAD.to_owned())
        .spawn(move || {
            let _ = fs::OpenOptions::new().write(true).open(&f);
        })
        .expect("spawn the FIFO writer");
    until("the FIFO writer blocking in its open", secs(10), || {
        std::future::ready(thread_state(PROBE_THREAD) == Some('S'))
    })
    .await;
    writer
}

fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap_or_else(|e| panic!("mkfifo {}: {e}", p.display()));
}

fn mknod_char(p: &Path, major: u32, minor: u32) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(major, minor),
    )
    .unwrap_or_else(|e| panic!("mknod {}: {e}", p.display()));
}

fn mkdirs(p: &Path) {
    fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
}

/// A container directory `name` of pod directory `pod`, made for one hostile `exit`.
fn container(pod: &Path, name: &str) -> PathBuf {
    let d = pod.join(name);
    mkdirs(&d);
    d
}

/// One hostile container directory: what its `exit` is, to check it is still that.
struct Planted {
    exit: PathBuf,
    kind: &'static str,
    size: u64,
    ino: u64,
}

impl Planted {
    fn record(exit: PathBuf) -> Planted {
        let m = fs::symlink_metadata(&exit).unwrap_or_else(|e| panic!("{}: {e}", exit.display()));
        let ft = m.file_type();
        let kind = if ft.is_symlink() {
            "symlink"
        } else if ft.is_file() {
            "file"
        } else if ft.is_dir() {
            "dir"
        } else {
            "special"
        };
        Planted {
            size: m.size(),
            ino: m.ino(),
            kind,
            exit,
        }
    }

    /// Still the same entry: never answered (an allow takes its place), never truncated.
    fn assert_untouched(&self) {
        let again = Planted::record(self.exit.clone());
        assert_eq!(
            (again.kind, again.size, again.ino),
            (self.kind, self.size, self.ino),
            "{} was replaced or changed",
            self.exit.display()
        );
    }
}

/// An `exit` in `dir` that appears whole: written under another name, then renamed. (An
/// empty `exit` is a wait that has not said so yet, and the agent answers it.)
fn put_exit(dir: &Path, fill: impl FnOnce(&mut File) -> std::io::Result<()>) -> PathBuf {
    let tmp = dir.join(".planting");
    File::create(&tmp)
        .and_then(|mut f| fill(&mut f))
        .unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    let exit = dir.join("exit");
    fs::rename(&tmp, &exit).expect("rename into place");
    exit
}

/// What every hostile pod directory holds: one container directory per hostile `exit`.
fn plant_exits(pod: &Path, outside: &Outside, planted: &mut Vec<Planted>) {
    let sym = container(pod, "sym-exit").join("exit");
    symlink(outside.path("secret-sym"), &sym).expect("symlink exit");
    let hard = container(pod, "hard-exit").join("exit");
    fs::hard_link(outside.path("secret-hard"), &hard).expect("hard link exit");
    // With no writer: an open without O_NONBLOCK would never return.
    let fifo = container(pod, "fifo").join("exit");
    mkfifo(&fifo);
    // /dev/zero: reading it would never end; /dev/null's numbers.
    let zero = container(pod, "dev-zero").join("exit");
    mknod_char(&zero, 1, 5);
    let null = container(pod, "dev-null").join("exit");
    mknod_char(&null, 1, 3);
    // The socket file stays when the listener goes.
    let sock = container(pod, "sock").join("exit");
    drop(std::os::unix::net::UnixListener::bind(&sock).expect("socket exit"));
    // 10 GiB of hole.
    let sparse = put_exit(&container(pod, "sparse"), |f| f.set_len(10 << 30));
    // 64 MiB written out, starting like a wait.
    let big = put_exit(&container(pod, "big"), |f| {
        let mut content = b"wait\n".to_vec();
        content.resize(64 << 20, b'x');
        f.write_all(&content)
    });
    let odd = put_exit(&container(pod, "odd"), |f| {
        f.write_all(b"wait\n{\"event\":\"allow\"}\r\n\x1b[2J")
    });
    let dir_exit = container(pod, "dir-exit").join("exit");
    mkdirs(&dir_exit);
    for p in [
        sym, hard, fifo, zero, null, sock, sparse, big, odd, dir_exit,
    ] {
        planted.push(Planted::record(p));
    }
    // A container entry that links out, one that is a file, one that is a FIFO.
    symlink(outside.path("container-target"), pod.join("to-outside")).expect("symlink dir");
    fs::write(pod.join("plain-file"), "wait\n").expect("file as a container");
    mkfifo(&pod.join("fifo-container"));
    // Names no container has.
    for name in [
        OsStr::new("Bad_Name"),
        OsStr::new("a.b"),
        OsStr::new("-lead"),
        OsStr::new(&"x".repeat(64)),
        OsStr::from_bytes(b"not-utf8-\xff\xfe"),
    ] {
        let d = pod.join(name);
        mkdirs(&d);
        fs::write(d.join("exit"), "wait\n").expect("exit under a bad name");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_share_contents_are_refused_while_real_exits_are_answered() {
    let started = Instant::now();
    let Some(bed) = start_bed().await else {
        return;
    };
    let pid = bed.agent.pid().expect("agent running");
    let metrics: SocketAddr = bed
        .agent
        .find(|l| l.says("metrics listening", &[]))
        .and_then(|l| l.field("addr"))
        .and_then(|a| a.parse().ok())
        .expect("the agent logs its metrics address");
    let outside = Outside::create();
    let before = outside.reference();
    let pods = bed.node.share_dir().join("pods");

    let mut p = example("two-level");
    set_grace(&mut p, 20);
    let running = bed.run_ready(&p).await;
    let uid = running.uid().to_owned();
    let real_proxy = running.container_dir("proxy");

    // Pods the runtime does not have, with valid names, so that the agent looks at them.
    let hostile = pods.join(random_uuid());
    let mut planted = Vec::new();
    plant_exits(&hostile, &outside, &mut planted);
    let probe_fifo = container(&hostile, "fifo-probe").join("exit");
    mkfifo(&probe_fifo);
    let writer = blocked_fifo_writer(&probe_fifo).await;
    // A pod directory that links out, one that is a file, one that is a FIFO.
    let linked_pod = random_uuid();
    symlink(outside.path("pod-target"), pods.join(&linked_pod)).expect("symlink pod");
    let file_pod = random_uuid();
    fs::write(pods.join(&file_pod), "x").expect("file as a pod");
    let fifo_pod = random_uuid();
    mkfifo(&pods.join(&fifo_pod));
    // A container directory that is a link to the real pod's proxy directory.
    let thief = random_uuid();
    let thief_dir = pods.join(&thief);
    mkdirs(&thief_dir);
    symlink(&real_proxy, thief_dir.join("proxy")).expect("symlink to another pod");
    // Junk inside the real pod: bad names beside its containers, links inside the proxy's.
    for name in ["Bad_Name", "UPPER", "x.y"] {
        let d = pods.join(&uid).join(name);
        mkdirs(&d);
        fs::write(d.join("exit"), "wait\n").expect("exit under a bad name");
    }
    symlink(&outside.root, real_proxy.join("escape")).expect("link in the proxy's dir");
    mkfifo(&real_proxy.join("not-exit"));

    // A stale pod (dated back past the agent's gc age) whose tree links out at every depth;
    // its exits are links and FIFOs, which are no live waits: the directory must go, and
    // nothing it points to.
    let stale = pods.join(random_uuid());
    let c = container(&stale, "c");
    symlink(outside.path("gc-target"), c.join("escape")).expect("symlink");
    mkdirs(&c.join("nested/deeper"));
    symlink(outside.path("gc-target/file"), c.join("nested/deeper/file")).expect("symlink");
    symlink(outside.path("gc-exit"), c.join("exit")).expect("symlink exit");
    fs::hard_link(outside.path("gc-hard"), container(&stale, "h").join("exit")).expect("link");
    mkfifo(&container(&stale, "f").join("exit"));
    symlink(outside.path("gc-target"), stale.join("linked-container")).expect("symlink");
    let old = SystemTime::now() - secs(2 * 3600);
    File::open(&stale)
        .and_then(|f| f.set_times(FileTimes::new().set_accessed(old).set_modified(old)))
        .expect("date the stale pod back");
    // Two looks 500 ms apart, while the runtime lists the real pod.
    until("the stale pod directory removed", secs(20), || {
        std::future::ready(fs::symlink_metadata(&stale).is_err())
    })
    .await;

    // The deletion, and more planted while the agent holds the proxy.
    let deletion = tokio::spawn(running.delete());
    bed.agent
        .wait_for("the agent holding the proxy", secs(10), |l| {
            l.is("held", &[("pod", &uid), ("container", "proxy")])
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let late = pods.join(random_uuid());
    plant_exits(&late, &outside, &mut planted);
    let junk = {
        let pods = pods.clone();
        tokio::task::spawn_blocking(move || {
            for i in 0..JUNK_DIRS {
                mkdirs(&pods.join(format!("junk-{i:05}")));
            }
            for name in [
                OsStr::new("NOT-A-UID"),
                OsStr::new("0F5C7A1E-8D2B-4C3E-9F00-123456789ABC"),
                OsStr::new("-0f5c7a1e8d2b"),
                OsStr::new("..."),
                OsStr::new(&"a".repeat(255)),
                OsStr::from_bytes(b"\xff\xfe-0f5c7a1e"),
            ] {
                mkdirs(&pods.join(name).join("proxy"));
                fs::write(pods.join(name).join("proxy/exit"), "wait\n").expect("exit");
            }
        })
    };
    // Waiting container directories renamed (to another name, or into another pod) as the
    // agent answers them: pods it does not know are answered at once, so it races the rename,
    // sooner or later by a few microseconds to two milliseconds.
    let from = pods.join(random_uuid());
    let to = pods.join(random_uuid());
    mkdirs(&from);
    mkdirs(&to);
    let renames = {
        let (from, to) = (from.clone(), to.clone());
        tokio::task::spawn_blocking(move || {
            let mut moved = Vec::new();
            for i in 0..RENAMES {
                let d = from.join(format!("c{i}"));
                mkdirs(&d);
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(d.join("exit"))
                    .and_then(|mut f| f.write_all(b"wait\n"))
                    .expect("exit");
                // Jitter only, to spread the renames over the agent's answer; nothing waits
                // on an outcome here.
                let jitter = Instant::now() + Duration::from_micros(20 * i as u64);
                while Instant::now() < jitter {
                    std::hint::spin_loop();
                }
                let dest = if i % 2 == 0 {
                    to.join(format!("m{i}"))
                } else {
                    from.join(format!("n{i}"))
                };
                fs::rename(&d, &dest).expect("rename under the agent");
                moved.push(dest);
            }
            moved
        })
    };
    let moved = renames.await.expect("renames");
    junk.await.expect("junk directories");

    let d = deletion.await.expect("delete task").expect("delete pod");
    bed.show("hostile_share", &d);

    // The real pod: the proxy left after the app, let go by the order, in bounded time.
    assert_exited_after(&bed, &d, "proxy", "app");
    bed.allowed_ordered(&uid, "proxy", &bed.context(&d)).await;
    let hook = d
        .container("proxy")
        .and_then(|c| c.prestop.as_ref())
        .expect("proxy preStop ran");
    assert!(hook.ok, "{}", bed.context(&d));
    assert!(
        hook.took() < secs(10),
        "the proxy's preStop took {:?}{}",
        hook.took(),
        bed.context(&d)
    );
    assert_eq!(d.container("proxy").map(|c| c.exit_code), Some(0));

    // Every renamed wait is answered where it went, whole: no temp file left anywhere (the
    // replaced exit files are unlinked by the agent's own thread, just after each answer).
    // Beside `exit`, only the agent's presence file (`agent`), written as it watches one.
    let names_in = |m: &PathBuf| -> Vec<std::ffi::OsString> {
        fs::read_dir(m)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name())
                    .filter(|n| n != "agent")
                    .collect()
            })
            .unwrap_or_default()
    };
    let only_exit = |m: &PathBuf| names_in(m) == ["exit"];
    until("the renamed waits answered", secs(20), || {
        std::future::ready(moved.iter().all(|m| {
            fs::read_to_string(m.join("exit")).unwrap_or_default() == "allow\n" && only_exit(m)
        }))
    })
    .await;
    for m in &moved {
        assert_eq!(names_in(m), ["exit"], "{}", m.display());
    }
    assert_eq!(fs::read_dir(&from).expect("list").count(), RENAMES / 2);

    // Each kind of refusal was counted.
    let end = Instant::now() + secs(20);
    let last = loop {
        let last = rejections(metrics).await;
        if REASONS
            .iter()
            .all(|r| last.get(*r).is_some_and(|n| *n > 0.0))
        {
            break last;
        }
        assert!(Instant::now() < end, "refusals not all counted: {last:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        last.keys().map(String::as_str).collect::<Vec<_>>(),
        {
            let mut r = REASONS.to_vec();
            r.sort_unstable();
            r
        },
        "a closed set of reasons"
    );

    // No hostile exit was answered (an allow would have replaced it), and only the real
    // proxy's own path was answered, once.
    for p in &planted {
        p.assert_untouched();
    }
    assert!(fs::symlink_metadata(thief_dir.join("proxy"))
        .expect("the thief's link")
        .file_type()
        .is_symlink());
    let hostile_pods: BTreeSet<String> = [&hostile, &late]
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .chain([linked_pod, file_pod, fifo_pod, thief.clone()])
        .collect();
    let lines = bed.agent.lines();
    let allows: Vec<_> = lines.iter().filter(|l| l.is("allow", &[])).collect();
    let wrong: Vec<_> = allows
        .iter()
        .filter(|l| l.field("pod").is_some_and(|p| hostile_pods.contains(&p)))
        .map(|l| l.text.as_str())
        .collect();
    assert!(wrong.is_empty(), "hostile entries answered:\n{wrong:#?}");
    let real = allows
        .iter()
        .filter(|l| l.field("pod").as_deref() == Some(uid.as_str()))
        .count();
    assert_eq!(real, 1, "{}", bed.context(&d));

    // The FIFO with a writer blocked in its open was never opened.
    assert_eq!(thread_state(PROBE_THREAD), Some('S'));
    assert!(!writer.is_finished(), "the agent opened a FIFO");
    // Nothing outside was written, truncated, chmodded, chowned, read or listed, and nothing
    // was created next to it (an allow, a temp file).
    let after = inventory(&outside.root);
    for (p, seen) in &before {
        assert_eq!(after.get(p), Some(seen), "{} changed", p.display());
    }
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "entries appeared or went outside the share"
    );
    // No inotify watch of the agent's reaches outside the share (listed after the
    // inventory: listing directories moves their atimes).
    let watched = exitorder_e2e::support::procfs::inotify_watched_inodes(pid);
    assert!(!watched.is_empty(), "no inotify watch found for pid {pid}");
    let leaked: Vec<_> = outside
        .dir_inodes()
        .intersection(&watched)
        .copied()
        .collect();
    assert!(leaked.is_empty(), "the agent watches outside: {leaked:?}");

    // Alive and ready after all of it.
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("agent process");
    let state = stat.rsplit_once(") ").and_then(|(_, s)| s.chars().next());
    assert!(
        matches!(state, Some('R' | 'S' | 'D')),
        "agent state {state:?}"
    );
    assert_eq!(http_get(&metrics.to_string(), "/healthz").await.0, 200);
    let (code, body) = http_get(&metrics.to_string(), "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        lines.iter().all(|l| !l.text.contains("panicked")),
        "{}",
        bed.agent.log_tail(30)
    );

    // Released by a reader of our own.
    let _reader = rustix::fs::open(
        probe_fifo.as_path(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK,
        rustix::fs::Mode::empty(),
    )
    .expect("open the probe FIFO");
    writer.join().expect("FIFO writer");
    eprintln!("hostile_share: {:?}", started.elapsed());
    bed.finish().await;
}
