//! The entrypoint's command line (`cli::parse`): what a pod spec's preStop or postStart hook
//! passes it, in both spellings (`wait ...` and the Kruise `-wait-container-exit ...`), with
//! its two environment variables, and what the init container that installs it passes.
//!
//! Input: a selector byte, then NUL-separated arguments. Selector bit 0 takes the first
//! argument as `EXITORDER_DIR`, bit 1 the next one as `EXITORDER_WAIT_TIMEOUT`, bit 2 the
//! next one as `EXITORDER_PRESENCE` (an empty value counts as unset, as the process
//! environment is read).
//!
//! Oracle: no panic; a usage error says something; a parsed command has a directory, a
//! duration that shows as it parses (`duration::show`, the form log lines use), a checked
//! loopback URL; and the command written back in the native spelling, every value explicit,
//! parses to the same command without the environment.
#![no_main]

use std::ffi::CString;

use exitorder_entrypoint::cli::{self, Command, Env, HttpArgs, Then, UsageError, WaitArgs};
use exitorder_entrypoint::duration;
use exitorder_entrypoint::url::{self, Url};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest
        .split(|&b| b == 0)
        .map(|part| CString::new(part).expect("split on NUL"));
    // The whole input with no NUL is one argument; an empty input is none.
    let mut env = Env::default();
    if selector & 1 != 0 {
        env.dir = parts.next().filter(|v| !v.is_empty());
    }
    if selector & 2 != 0 {
        env.timeout = parts.next().filter(|v| !v.is_empty());
    }
    if selector & 4 != 0 {
        env.presence = parts.next().filter(|v| !v.is_empty());
    }
    let args: Vec<CString> = if rest.is_empty() {
        Vec::new()
    } else {
        parts.collect()
    };
    let command = match cli::parse(args.clone(), &env) {
        Ok(command) => command,
        Err(UsageError(message)) => {
            assert!(!message.is_empty(), "{args:?}");
            return;
        }
    };
    match &command {
        Command::Help | Command::Version => return,
        Command::Wait(wait) | Command::Mark(wait) => check_wait(wait),
        Command::Shutdown(http) | Command::Await(http) => {
            check_duration(http.timeout);
            check_url(&http.url);
        }
        Command::Install(install) => {
            assert!(!install.dir.is_empty(), "{install:?}");
            assert_ne!(install.dir.as_bytes().first(), Some(&b'-'), "{install:?}");
        }
    }
    let again = render(&command);
    assert_eq!(
        cli::parse(again.clone(), &Env::default()).as_ref(),
        Ok(&command),
        "{args:?} with {env:?} written back as {again:?}"
    );
});

fn check_wait(wait: &WaitArgs) {
    assert!(!wait.dir.is_empty(), "{wait:?}");
    check_duration(wait.timeout);
    if let Some(p) = wait.presence {
        assert!(!p.is_zero(), "a zero presence wait is none: {wait:?}");
        check_duration(p);
    }
    for ignored in &wait.ignored {
        assert!(ignored.as_bytes().starts_with(b"--"), "{wait:?}");
    }
    match &wait.then {
        Then::Nothing | Then::Exec(_) => {}
        Then::HttpGet(url) => check_url(url),
        Then::Sleep(d) => check_duration(*d),
    }
}

fn check_duration(d: std::time::Duration) {
    let shown = duration::show(d);
    assert_eq!(duration::parse(&shown), Ok(d), "{d:?} shown as {shown}");
}

fn check_url(url: &Url) {
    let text = url.to_string();
    assert!(text.bytes().all(|b| b.is_ascii_graphic()), "{text:?}");
    assert!(url.target().starts_with('/'), "{url:?}");
    assert!(
        !url.target().contains('#'),
        "the fragment is never sent: {url:?}"
    );
    assert_ne!(url.port(), 0, "{url:?}");
    let again = CString::new(text.as_str()).expect("printable ASCII");
    assert_eq!(url::parse(&again).as_ref(), Ok(url));
}

fn arg(text: impl Into<Vec<u8>>) -> CString {
    CString::new(text).expect("from a C string or printable ASCII")
}

fn flag(name: &str, value: &[u8]) -> CString {
    arg([format!("--{name}=").as_bytes(), value].concat())
}

/// The command in the native spelling, with every value given.
fn render(command: &Command) -> Vec<CString> {
    match command {
        Command::Help => vec![arg("--help")],
        Command::Version => vec![arg("--version")],
        Command::Wait(wait) | Command::Mark(wait) => {
            let presence = wait.presence.map_or_else(|| "0".to_owned(), duration::show);
            let sub = if matches!(command, Command::Mark(_)) {
                "mark"
            } else {
                "wait"
            };
            let mut out = vec![
                arg(sub),
                flag("dir", wait.dir.as_bytes()),
                flag("timeout", duration::show(wait.timeout).as_bytes()),
                flag("presence", presence.as_bytes()),
            ];
            // A later release's flags, skipped again where they stood (before the command).
            out.extend(wait.ignored.iter().cloned());
            match &wait.then {
                Then::Nothing => {}
                Then::Exec(exec) => {
                    out.push(arg("--"));
                    out.push(exec.program.clone());
                    out.extend(exec.args.iter().cloned());
                }
                Then::HttpGet(url) => out.push(flag("http-get", url.to_string().as_bytes())),
                Then::Sleep(d) => out.push(flag("sleep", duration::show(*d).as_bytes())),
            }
            out
        }
        Command::Shutdown(HttpArgs { url, timeout }) => http("shutdown", "post", url, *timeout),
        Command::Await(HttpArgs { url, timeout }) => http("await", "http-get", url, *timeout),
        Command::Install(install) => vec![arg("install"), install.dir.clone()],
    }
}

fn http(sub: &str, url_flag: &str, url: &Url, timeout: std::time::Duration) -> Vec<CString> {
    vec![
        arg(sub),
        flag(url_flag, url.to_string().as_bytes()),
        flag("timeout", duration::show(timeout).as_bytes()),
    ]
}
