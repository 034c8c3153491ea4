//! What the process tests share: running the real binary, playing the
//! agent's part in a directory, and small HTTP servers on 127.0.0.1.
//!
//! Everything waits on conditions with generous deadlines, never on bare
//! sleeps and never asserting tight timings: CI is a busy 2-core machine.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, sleep, JoinHandle};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_exitorder-entrypoint");
/// Generous bound for things that should happen "at once", so a loaded CI
/// machine does not make the tests flaky.
pub const PROMPTLY: Duration = Duration::from_secs(10);
/// How long a hook that should be blocked must stay blocked.
pub const BLOCKED_FOR: Duration = Duration::from_millis(300);
const STEP: Duration = Duration::from_millis(5);

/// A running entrypoint, killed if the test fails before it ends. Its
/// stderr is read as it comes, so a test can wait for a line.
pub struct Hook {
    child: Option<Child>,
    stderr: Arc<Mutex<Vec<u8>>>,
    reader: Option<JoinHandle<()>>,
}

impl Hook {
    pub fn spawn(args: &[&str]) -> Hook {
        Self::spawn_with_env(args, &[])
    }

    pub fn spawn_with_env(args: &[&str], env: &[(&str, &str)]) -> Hook {
        let mut command = Command::new(BIN);
        command.args(args);
        for (name, value) in env {
            command.env(name, value);
        }
        Self::spawn_command(command)
    }

    /// Runs the hook under `umask 077`, as hardened images often do.
    pub fn spawn_with_strict_umask(args: &[&str]) -> Hook {
        let mut command = Command::new("sh");
        command
            .args(["-c", "umask 077; exec \"$0\" \"$@\"", BIN])
            .args(args);
        Self::spawn_command(command)
    }

    /// Runs `command` (the binary, or something that execs it) with the
    /// entrypoint's environment variables cleared unless the test set them.
    /// No test directory has an agent's presence file unless the test makes
    /// one, so the presence wait is off unless the test turns it on.
    pub fn spawn_command(mut command: Command) -> Hook {
        for name in [
            "EXITORDER_DIR",
            "EXITORDER_WAIT_TIMEOUT",
            "EXITORDER_PRESENCE",
        ] {
            let set_by_test = command.get_envs().any(|(key, _)| key == name);
            if !set_by_test {
                command.env_remove(name);
            }
        }
        if !command
            .get_envs()
            .any(|(key, _)| key == "EXITORDER_PRESENCE")
        {
            command.env("EXITORDER_PRESENCE", "0");
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn exitorder-entrypoint");
        let mut pipe = child.stderr.take().expect("stderr is piped");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&stderr);
        let reader = thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(read @ 1..) = pipe.read(&mut chunk) {
                sink.lock()
                    .expect("stderr lock")
                    .extend_from_slice(&chunk[..read]);
            }
        });
        Hook {
            child: Some(child),
            stderr,
            reader: Some(reader),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().expect("hook already finished").id()
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("hook already finished")
    }

    /// What the hook wrote on stderr so far.
    pub fn stderr_so_far(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("stderr lock")).into_owned()
    }

    /// Waits until the hook's stderr contains `needle`.
    pub fn wait_for_stderr(&mut self, needle: &str) {
        let until = Instant::now() + PROMPTLY;
        while !self.stderr_so_far().contains(needle) {
            if let Some(status) = self.child().try_wait().expect("try_wait") {
                let output = self.collect();
                panic!(
                    "hook exited with {status} before saying {needle:?}; stderr: {}",
                    stderr(&output)
                );
            }
            assert!(
                Instant::now() < until,
                "hook did not say {needle:?} within {PROMPTLY:?}; stderr: {}",
                self.stderr_so_far()
            );
            sleep(STEP);
        }
    }

    /// Fails if the hook exits within `period`.
    pub fn assert_blocked_for(&mut self, period: Duration) {
        let until = Instant::now() + period;
        while Instant::now() < until {
            if let Some(status) = self.child().try_wait().expect("try_wait") {
                let output = self.collect();
                panic!(
                    "hook exited with {status} while it should be waiting; stderr: {}",
                    stderr(&output)
                );
            }
            sleep(STEP);
        }
    }

    /// Waits for the hook to exit within `limit` and returns its output.
    pub fn exit_within(mut self, limit: Duration) -> Output {
        let until = Instant::now() + limit;
        while self.child().try_wait().expect("try_wait").is_none() {
            assert!(
                Instant::now() < until,
                "hook still running after {limit:?}; stderr: {}",
                self.stderr_so_far()
            );
            sleep(STEP);
        }
        self.collect()
    }

    fn collect(&mut self) -> Output {
        let mut output = self
            .child
            .take()
            .expect("hook already finished")
            .wait_with_output()
            .expect("collect hook output");
        if let Some(reader) = self.reader.take() {
            reader.join().expect("stderr reader");
        }
        output.stderr = self.stderr.lock().expect("stderr lock").clone();
        output
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + PROMPTLY;
    while !condition() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        sleep(STEP);
    }
}

pub fn exit_file(dir: &Path) -> PathBuf {
    dir.join("exit")
}

pub fn wait_for_request(dir: &Path) {
    eventually("the hook to create exit containing wait", || {
        fs::read(exit_file(dir)).is_ok_and(|content| content == b"wait\n")
    });
}

/// Writes the agent's presence file the way the agent does: a temp file renamed into place.
pub fn present(dir: &Path, content: &str) {
    let temp = dir.join(".agent.tmp");
    fs::write(&temp, content).expect("write presence");
    fs::rename(&temp, dir.join("agent")).expect("rename presence");
}

/// Answers the way the agent does: write a temp file, rename it over `exit`.
pub fn answer(dir: &Path, content: &str) {
    let temp = dir.join(".exit.tmp");
    fs::write(&temp, content).expect("write answer");
    fs::rename(&temp, exit_file(dir)).expect("rename answer over exit");
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

/// The exit code, with the stderr in the message when it is not `code`.
pub fn assert_code(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "status {}; stderr: {}",
        output.status,
        stderr(output)
    );
}

pub fn signal_of(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

/// Sends `signal` (`TERM`, `INT`, ...) to a process, with the shell's kill.
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("sh")
        .args(["-c", "kill -s \"$0\" \"$1\"", signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -s {signal} {pid}: {status}");
}

/// A port on 127.0.0.1 where nothing listens (it did a moment ago, so the
/// kernel does not hand it out again soon); a later [`Server::start_on`]
/// can listen there.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("local addr").port()
}

/// How a test server answers one connection.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A complete answer with this status and an empty body.
    Status(u16),
    /// Reads the request and never answers, until the client goes away.
    Silent,
    /// Sends these bytes one at a time, `gap` apart, then waits for the
    /// client to go away.
    Dribble(Vec<u8>, Duration),
    /// Sends `prefix`, then one byte every `gap` for as long as the client
    /// listens: an answer that never ends.
    Endless(Vec<u8>, Duration),
    /// Sends these bytes, then closes.
    Raw(Vec<u8>),
}

/// What a test server received on one connection.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request line and headers, as sent.
    pub head: String,
    /// Bytes after the blank line that ended the head.
    pub body: Vec<u8>,
}

impl Received {
    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or_default()
    }

    /// A header's value, the name matched without regard to case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then_some(value.trim())
        })
    }
}

type Behaviour = dyn Fn(usize) -> Reply + Send + Sync;

/// An HTTP server on 127.0.0.1 answering each connection as `behaviour`
/// says for the connection's number (0 for the first).
pub struct Server {
    pub port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    pub fn start(behaviour: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Server {
        Self::serve(TcpListener::bind("127.0.0.1:0").expect("bind"), behaviour)
    }

    /// Listens on a port chosen before (see [`free_port`]).
    pub fn start_on(
        port: u16,
        behaviour: impl Fn(usize) -> Reply + Send + Sync + 'static,
    ) -> Server {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|err| panic!("bind 127.0.0.1:{port} again: {err}"));
        Self::serve(listener, behaviour)
    }

    /// On `[::1]`, or `None` when this machine has no IPv6 loopback.
    pub fn start_v6(behaviour: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Option<Server> {
        let listener = TcpListener::bind("[::1]:0").ok()?;
        Some(Self::serve(listener, behaviour))
    }

    fn serve(
        listener: TcpListener,
        behaviour: impl Fn(usize) -> Reply + Send + Sync + 'static,
    ) -> Server {
        let port = listener.local_addr().expect("local addr").port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let behaviour: Arc<Behaviour> = Arc::new(behaviour);
        let server = Server {
            port,
            received: Arc::clone(&received),
            stop: Arc::clone(&stop),
        };
        let connections = AtomicUsize::new(0);
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let index = connections.fetch_add(1, Ordering::SeqCst);
                let reply = behaviour(index);
                let received = Arc::clone(&received);
                thread::spawn(move || handle(stream, reply, &received));
            }
        });
        server
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The requests received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("received lock").clone()
    }

    /// Waits until at least `count` requests were received.
    pub fn wait_for_requests(&self, count: usize) -> Vec<Received> {
        eventually(&format!("{count} requests"), || {
            self.received.lock().expect("received lock").len() >= count
        });
        self.received()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Limit on what a test server reads of a request head, and how long it
/// waits for it.
const MAX_HEAD: usize = 64 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server waits for a client to go away.
const LINGER: Duration = Duration::from_secs(60);

fn handle(mut stream: TcpStream, reply: Reply, received: &Mutex<Vec<Received>>) {
    let _ = stream.set_read_timeout(Some(HEAD_TIMEOUT));
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk) {
            Ok(read @ 1..) if data.len() < MAX_HEAD => data.extend_from_slice(&chunk[..read]),
            // Closed, timed out or too long: nothing to answer.
            _ => return,
        }
    };
    received.lock().expect("received lock").push(Received {
        head: String::from_utf8_lossy(&data[..end]).into_owned(),
        body: data[end..].to_vec(),
    });
    match reply {
        Reply::Status(code) => {
            let answer = format!(
                "HTTP/1.1 {code} {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                reason(code)
            );
            let _ = stream.write_all(answer.as_bytes());
            let _ = stream.shutdown(Shutdown::Write);
            until_client_leaves(&mut stream);
        }
        Reply::Silent => until_client_leaves(&mut stream),
        Reply::Dribble(bytes, gap) => {
            for byte in bytes {
                if stream.write_all(&[byte]).is_err() {
                    return;
                }
                sleep(gap);
            }
            until_client_leaves(&mut stream);
        }
        Reply::Endless(prefix, gap) => {
            if stream.write_all(&prefix).is_err() {
                return;
            }
            while stream.write_all(b" ").is_ok() {
                sleep(gap);
            }
        }
        Reply::Raw(bytes) => {
            let _ = stream.write_all(&bytes);
        }
    }
}

fn until_client_leaves(stream: &mut TcpStream) {
    let _ = stream.set_read_timeout(Some(LINGER));
    let mut chunk = [0u8; 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(1..) => {}
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            _ => return,
        }
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        202 => "Accepted",
        204 => "No Content",
        302 => "Found",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}
