//! Command-line parsing into a typed [`Command`].
//!
//! Two spellings lead to the same wait:
//! - `wait [--dir DIR] [--timeout DURATION] [-- CMD ARGS... | --http-get URL
//!   | --sleep DURATION]`, the native form;
//! - `-wait-container-exit [-entrypoint CMD] [-- ARGS...]`, the form of the
//!   OpenKruise SidecarExitPriority proposal, parsed with Go `flag` package
//!   rules (one or two dashes, `-flag=value`, flags end at the first
//!   non-flag argument) so pod specs written for it keep working.
//!
//! Two more subcommands speak HTTP to the pod's own loopback:
//! - `shutdown --post URL [--timeout DURATION]`, a mesh proxy's shutdown;
//! - `await --http-get URL [--timeout DURATION]`, a postStart hook that
//!   holds the next container back until a sidecar is ready.
//!
//! URLs are checked here (see [`crate::url`]), so a bad one is a usage
//! error before anything waits or connects.
//!
//! And one puts the binary where a pod's containers find it:
//! - `install DIR`, what the init container `exitorder-install` runs.
//!
//! Parts:
//! - `kruise`: the OpenKruise proposal's spelling, read by Go `flag` rules.

mod kruise;

use alloc::ffi::CString;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::ffi::CStr;
use core::fmt;
use core::time::Duration;

use crate::url::{self, Url};
use crate::{duration, sys};

/// Directory the agent shares with the container when nothing else is said.
pub const DEFAULT_DIR: &CStr = exitorder_contract::mount::EXIT_DIR_C;
/// Just under Kubernetes' default 30 s termination grace period, so the
/// wrapped command still gets a few seconds before kubelet's SIGKILL.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(25);
/// Overrides [`DEFAULT_DIR`]; `--dir` overrides it in turn.
pub const ENV_DIR: &str = "EXITORDER_DIR";
/// Overrides [`DEFAULT_TIMEOUT`]; `--timeout` overrides it in turn.
pub const ENV_TIMEOUT: &str = "EXITORDER_WAIT_TIMEOUT";
/// How long `wait` gives an agent to show it serves the directory: long enough for an
/// agent that sees the directory only when the request is made (it marks every directory
/// it watches as soon as it watches it), short enough that a pod on a node with no agent
/// pays next to nothing.
pub const DEFAULT_PRESENCE: Duration = Duration::from_secs(1);
/// Overrides [`DEFAULT_PRESENCE`]; `--presence` overrides it in turn.
pub const ENV_PRESENCE: &str = "EXITORDER_PRESENCE";

/// How long `shutdown` keeps retrying and `await` keeps polling, and the
/// bound of `wait --http-get`'s request.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(120);

/// Exit status when an HTTP request failed, `await` timed out or `install` failed.
pub const EX_FAILED: u8 = 1;
/// Exit status for bad usage (`EX_USAGE` from sysexits.h).
pub const EX_USAGE: u8 = 64;

pub const USAGE: &str = "\
usage: exitorder-entrypoint wait [--dir DIR] [--timeout DURATION] [--presence DURATION]
                                 [--settle DURATION]
                                 [-- CMD [ARGS...] | --http-get URL | --sleep DURATION]
       exitorder-entrypoint mark [--dir DIR]
                                 [-- CMD [ARGS...] | --http-get URL | --sleep DURATION]
       exitorder-entrypoint -wait-container-exit [-entrypoint CMD] [-- ARGS...]
       exitorder-entrypoint shutdown --post URL [--timeout DURATION]
       exitorder-entrypoint await --http-get URL [--timeout DURATION]
       exitorder-entrypoint install DIR

wait: waits until the exitorder agent on this node allows this container to
exit, then runs CMD with ARGS in its place, or GETs URL (exit 0 on any
answer), or sleeps, or exits 0. Meant for a sidecar's preStop hook. If the
agent does not answer, it proceeds anyway.
mark: says in DIR that this container is being stopped (the file `stopping`),
then does what wait does after its wait, without waiting: what every container
of an injected pod runs as its preStop, so the agent can tell a kill of the
whole pod (every container marks at once) from one container's restart.
shutdown: POSTs an empty body to URL (a mesh proxy's shutdown endpoint),
retrying refused connections; exit 0 on a 2xx answer.
await: GETs URL until it answers 2xx (a postStart hook that holds the next
container back until this one is ready).
install: copies this binary into DIR as exitorder-entrypoint, mode 0555, by a
rename (a reader sees the old file or the new one, never a part); what an
init container runs to give the pod's other containers the entrypoint. DIR
must be a directory, not a link to one.
URLs: http:// to 127.x.y.z, localhost or [::1] only.

options:
  --dir DIR            directory shared with the agent
                       (env EXITORDER_DIR, default /var/run/exitorder)
  --timeout DURATION   wait: proceed without permission after DURATION
                       (env EXITORDER_WAIT_TIMEOUT, default 25s);
                       shutdown, await: give up after DURATION (default 2m);
                       DURATION is 500ms, 30s, 2m, 1h or plain seconds
  --presence DURATION  wait: proceed after DURATION when no agent has ever
                       said it serves DIR (env EXITORDER_PRESENCE, default
                       1s; 0 waits for the timeout whatever); an agent that
                       said so is waited for while it restarts, and an
                       uninstall lets the wait go at once
  --settle DURATION    wait: an app's wait for its endpoints' withdrawal
                       (the pod's exitorder.io/wait-for-endpoints): when no
                       agent that holds such waits let it go, sleep DURATION
                       before going on, as a sleep preStop would
  --http-get URL       wait: GET URL after the wait, as an httpGet hook would;
                       await: the URL to poll
  --sleep DURATION     wait: sleep after the wait, as a sleep hook would
  --post URL           shutdown: the URL to POST to
  -entrypoint CMD      (with -wait-container-exit) command to run after the
                       wait; without it, the arguments after -- are the command
  -h, --help           show this help
  -V, --version        show the version

exit status: 0 done; 1 the HTTP request failed (or await timed out, or
install failed);
64 usage; 126 CMD cannot run; 127 CMD not found; 128+N signal N while
waiting; otherwise CMD's own.
";

/// What the invocation asks for.
///
/// New subcommands get a variant here and an arm in `main`'s dispatcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Print usage on stdout and exit 0.
    Help,
    /// Print the name and version on stdout and exit 0 (`--version`, as the agent's).
    Version,
    /// Wait for exit permission, then do what the hook did before.
    Wait(WaitArgs),
    /// Say that this container is being stopped (without waiting), then do what the hook did
    /// before. Takes `wait`'s arguments; only `--dir` and what follows matter.
    Mark(WaitArgs),
    /// POST to a shutdown endpoint.
    Shutdown(HttpArgs),
    /// Poll a readiness endpoint until it answers 2xx.
    Await(HttpArgs),
    /// Copy this binary into a directory.
    Install(InstallArgs),
}

/// Arguments of `install`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallArgs {
    pub dir: CString,
}

/// Arguments of the wait, with environment and defaults already applied.
///
/// Arguments, paths and environment values are kept as the C strings they
/// arrive as: any bytes but NUL, not necessarily UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitArgs {
    pub dir: CString,
    pub timeout: Duration,
    /// How long an agent has to show it serves the directory before the wait gives up on
    /// it; `None` waits for the timeout whatever (`--presence 0`).
    pub presence: Option<Duration>,
    /// `--settle`: this wait is an app's, held for its pod's endpoints; when no agent that
    /// holds such waits answers, this long is slept instead.
    pub settle: Option<Duration>,
    pub then: Then,
    /// Flags this entrypoint does not know (`--name` or `--name=value`), from a later
    /// release's webhook or manifests: skipped with a warning rather than failing the hook.
    pub ignored: Vec<CString>,
}

/// What `wait` does once the wait is over: the sidecar's original preStop
/// hook, in exec form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Then {
    /// Exit 0.
    Nothing,
    /// Replace this process with a command (an `exec` hook).
    Exec(Exec),
    /// GET the URL (an `httpGet` hook).
    HttpGet(Url),
    /// Sleep (a `sleep` hook).
    Sleep(Duration),
}

/// Arguments of `shutdown` and `await`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpArgs {
    pub url: Url,
    pub timeout: Duration,
}

/// The command that replaces this process once the wait is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    pub program: CString,
    pub args: Vec<CString>,
}

/// The environment variables parsing looks at, passed in so tests need not
/// touch the process environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    pub dir: Option<CString>,
    pub timeout: Option<CString>,
    pub presence: Option<CString>,
}

impl Env {
    /// Reads the variables from the process environment. An empty value counts
    /// as unset: templating tools often render a missing value as `""`.
    pub fn from_process() -> Self {
        let get = |name| sys::getenv(name).filter(|value| !value.is_empty());
        Env {
            dir: get(ENV_DIR),
            timeout: get(ENV_TIMEOUT),
            presence: get(ENV_PRESENCE),
        }
    }
}

/// An invocation that cannot be carried out; main prints it with [`USAGE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for UsageError {}

fn usage_error(message: impl Into<String>) -> UsageError {
    UsageError(message.into())
}

/// Parses the arguments after the program name.
pub fn parse<I>(args: I, env: &Env) -> Result<Command, UsageError>
where
    I: IntoIterator<Item = CString>,
{
    let mut args = args.into_iter();
    let Some(first) = args.next() else {
        return Err(usage_error("missing subcommand"));
    };
    match first.as_bytes() {
        b"wait" => return parse_wait(args, env),
        b"mark" => {
            return parse_wait(args, env).map(|c| match c {
                Command::Wait(args) => Command::Mark(args),
                other => other,
            })
        }
        b"shutdown" => return parse_http(args, "post", Command::Shutdown),
        b"await" => return parse_http(args, "http-get", Command::Await),
        b"install" => return parse_install(args),
        _ => {}
    }
    let kind = Flag::split(&first).map(|flag| match flag.name {
        "h" | "help" if flag.value.is_none() => Leading::Help,
        "V" | "version" if flag.value.is_none() => Leading::Version,
        "wait-container-exit" | "entrypoint" => Leading::Kruise,
        _ => Leading::Unknown,
    });
    match kind {
        Some(Leading::Help) => Ok(Command::Help),
        Some(Leading::Version) => match args.next() {
            None => Ok(Command::Version),
            Some(extra) => Err(unexpected_argument(&extra)),
        },
        Some(Leading::Kruise) => kruise::parse(core::iter::once(first).chain(args), env),
        Some(Leading::Unknown) => Err(unexpected(&first)),
        None => Err(usage_error(format!(
            "unknown subcommand {:?}",
            String::from_utf8_lossy(first.as_bytes())
        ))),
    }
}

/// What a flag-shaped first argument selects.
enum Leading {
    Help,
    Version,
    Kruise,
    Unknown,
}

/// A `-name`, `--name`, `-name=value` or `--name=value` argument.
struct Flag<'a> {
    name: &'a str,
    dashes: usize,
    value: Option<&'a CStr>,
}

impl<'a> Flag<'a> {
    /// `None` for anything that is not flag-shaped: no leading dash, a lone
    /// `-`, the `--` terminator, or a name that is not UTF-8.
    fn split(arg: &'a CStr) -> Option<Self> {
        let bytes = arg.to_bytes();
        let dashes = if bytes.starts_with(b"--") {
            2
        } else if bytes.starts_with(b"-") {
            1
        } else {
            return None;
        };
        let rest = &bytes[dashes..];
        if rest.is_empty() || rest.starts_with(b"-") {
            return None;
        }
        let (name, value) = match rest.iter().position(|&b| b == b'=') {
            Some(at) => {
                // The value runs to the end of the argument, so it keeps the
                // argument's NUL terminator and stays a C string.
                let with_nul = &arg.to_bytes_with_nul()[dashes + at + 1..];
                (&rest[..at], Some(CStr::from_bytes_with_nul(with_nul).ok()?))
            }
            None => (rest, None),
        };
        let name = core::str::from_utf8(name).ok()?;
        Some(Flag {
            name,
            dashes,
            value,
        })
    }

    /// The flag's value: inline after `=`, else the next argument.
    fn value(
        &self,
        shown: &str,
        rest: &mut impl Iterator<Item = CString>,
    ) -> Result<CString, UsageError> {
        match self.value {
            Some(value) => Ok(CString::from(value)),
            None => rest
                .next()
                .ok_or_else(|| usage_error(format!("{shown} needs a value"))),
        }
    }
}

fn parse_wait(mut args: impl Iterator<Item = CString>, env: &Env) -> Result<Command, UsageError> {
    let mut dir = None;
    let mut timeout = None;
    let mut presence = None;
    let mut settle = None;
    let mut ignored = Vec::new();
    let mut command = Vec::new();
    let mut http_get = None;
    let mut sleep = None;
    while let Some(arg) = args.next() {
        if arg.as_bytes() == b"--" {
            command.extend(args.by_ref());
            break;
        }
        let flag = Flag::split(&arg)
            .filter(|flag| flag.dashes == 2 || flag.name == "h")
            .ok_or_else(|| unexpected(&arg))?;
        match flag.name {
            "h" | "help" if flag.value.is_none() => return Ok(Command::Help),
            "dir" => dir = Some(dir_value(flag.value("--dir", &mut args)?, "--dir")?),
            "timeout" => {
                timeout = Some(timeout_value(
                    flag.value("--timeout", &mut args)?,
                    "--timeout",
                )?)
            }
            "http-get" => {
                let url = url_value(flag.value("--http-get", &mut args)?, "--http-get")?;
                once(&mut http_get, url, "--http-get")?;
            }
            "sleep" => {
                let duration = timeout_value(flag.value("--sleep", &mut args)?, "--sleep")?;
                once(&mut sleep, duration, "--sleep")?;
            }
            "presence" => {
                presence = Some(timeout_value(
                    flag.value("--presence", &mut args)?,
                    "--presence",
                )?)
            }
            "settle" => {
                settle = Some(timeout_value(
                    flag.value("--settle", &mut args)?,
                    "--settle",
                )?)
            }
            // A later release's flag: a hook that fails on it would skip the wait and the
            // sidecar's own preStop both. Later flags come as `--name=value`, so one not
            // known here takes no separate value.
            _ if flag.dashes == 2 && flag.name != "h" && flag.name != "help" => {
                // A misspelling of a flag known here (`--http_get`) would otherwise drop
                // what the hook did after the wait: refused, as before.
                if let Some(known) = misspelt(flag.name) {
                    return Err(usage_error(format!(
                        "unknown flag {} (did you mean --{known}?)",
                        String::from_utf8_lossy(arg.to_bytes())
                    )));
                }
                ignored.push(arg.clone())
            }
            _ => return Err(unexpected(&arg)),
        }
    }
    let then = match (command_from(None, command), http_get, sleep) {
        (None, None, None) => Then::Nothing,
        (Some(exec), None, None) => Then::Exec(exec),
        (None, Some(url), None) => Then::HttpGet(url),
        (None, None, Some(duration)) => Then::Sleep(duration),
        _ => {
            return Err(usage_error(
                "wait takes only one of -- CMD, --http-get URL and --sleep DURATION",
            ))
        }
    };
    finish(
        Flags {
            dir,
            timeout,
            presence,
            settle,
            ignored,
        },
        then,
        env,
    )
}

/// The flag of `wait` that `name` spells differently (case, `_` for `-`), if any.
fn misspelt(name: &str) -> Option<&'static str> {
    const WAIT_FLAGS: [&str; 6] = ["dir", "timeout", "presence", "settle", "http-get", "sleep"];
    WAIT_FLAGS.into_iter().find(|known| {
        name.len() == known.len()
            && name
                .bytes()
                .zip(known.bytes())
                .all(|(a, b)| a.to_ascii_lowercase() == b || (a == b'_' && b == b'-'))
    })
}

/// What `wait`'s command line said, before the environment and defaults.
struct Flags {
    dir: Option<CString>,
    timeout: Option<Duration>,
    presence: Option<Duration>,
    settle: Option<Duration>,
    ignored: Vec<CString>,
}

/// `shutdown --post URL` and `await --http-get URL`, each with `--timeout`.
fn parse_http(
    mut args: impl Iterator<Item = CString>,
    url_flag: &str,
    command: fn(HttpArgs) -> Command,
) -> Result<Command, UsageError> {
    let shown_url_flag = format!("--{url_flag}");
    let mut url = None;
    let mut timeout = None;
    while let Some(arg) = args.next() {
        let flag = Flag::split(&arg)
            .filter(|flag| flag.dashes == 2 || flag.name == "h")
            .ok_or_else(|| unexpected_argument(&arg))?;
        match flag.name {
            "h" | "help" if flag.value.is_none() => return Ok(Command::Help),
            "timeout" => {
                timeout = Some(timeout_value(
                    flag.value("--timeout", &mut args)?,
                    "--timeout",
                )?)
            }
            name if name == url_flag => {
                let value = url_value(flag.value(&shown_url_flag, &mut args)?, &shown_url_flag)?;
                once(&mut url, value, &shown_url_flag)?;
            }
            _ => return Err(unexpected_argument(&arg)),
        }
    }
    let url = url.ok_or_else(|| usage_error(format!("{shown_url_flag} URL is required")))?;
    Ok(command(HttpArgs {
        url,
        timeout: timeout.unwrap_or(DEFAULT_HTTP_TIMEOUT),
    }))
}

/// `install DIR`: one directory, nothing else.
fn parse_install(mut args: impl Iterator<Item = CString>) -> Result<Command, UsageError> {
    let Some(dir) = args.next() else {
        return Err(usage_error("install: DIR is required"));
    };
    // Anything that starts like a flag is one, never a directory's name: a relative
    // directory named `-x` is given as `./-x`.
    if dir.as_bytes().first() == Some(&b'-') {
        return match Flag::split(&dir) {
            Some(flag) if matches!(flag.name, "h" | "help") && flag.value.is_none() => {
                Ok(Command::Help)
            }
            _ => Err(unexpected_argument(&dir)),
        };
    }
    if dir.is_empty() {
        return Err(usage_error("install: DIR is empty"));
    }
    if let Some(extra) = args.next() {
        return Err(unexpected_argument(&extra));
    }
    Ok(Command::Install(InstallArgs { dir }))
}

/// Sets a flag's value, refusing a second one: two URLs or two sleeps are
/// more likely a mistake than a wish for the last.
fn once<T>(slot: &mut Option<T>, value: T, shown: &str) -> Result<(), UsageError> {
    if slot.is_some() {
        return Err(usage_error(format!("{shown} given twice")));
    }
    *slot = Some(value);
    Ok(())
}

/// For subcommands that run no command: a positional argument is just
/// unexpected.
fn unexpected_argument(arg: &CStr) -> UsageError {
    let shown = String::from_utf8_lossy(arg.to_bytes());
    if Flag::split(arg).is_some() {
        usage_error(format!("unknown flag {shown}"))
    } else {
        usage_error(format!("unexpected argument {shown:?}"))
    }
}

fn unexpected(arg: &CStr) -> UsageError {
    let shown = String::from_utf8_lossy(arg.to_bytes());
    if Flag::split(arg).is_some() {
        usage_error(format!("unknown flag {shown}"))
    } else {
        usage_error(format!(
            "unexpected argument {shown:?} (put the command after --)"
        ))
    }
}

fn dir_value(value: CString, shown: &str) -> Result<CString, UsageError> {
    if value.is_empty() {
        return Err(usage_error(format!("{shown} needs a non-empty path")));
    }
    Ok(value)
}

fn url_value(value: CString, shown: &str) -> Result<Url, UsageError> {
    url::parse(&value).map_err(|err| usage_error(format!("{shown}: {err}")))
}

fn timeout_value(value: CString, shown: &str) -> Result<Duration, UsageError> {
    let text = value.to_str().unwrap_or("\u{fffd}");
    duration::parse(text).map_err(|err| usage_error(format!("{shown}: {err}")))
}

fn command_from(program: Option<CString>, mut rest: Vec<CString>) -> Option<Exec> {
    let program = match program {
        Some(program) => program,
        None if rest.is_empty() => return None,
        None => rest.remove(0),
    };
    Some(Exec {
        program,
        args: rest,
    })
}

/// Fills in what the command line left out: flag, then environment, then
/// default. The environment's timeout is only parsed when it is used, so a
/// flag can override a broken value.
fn finish(flags: Flags, then: Then, env: &Env) -> Result<Command, UsageError> {
    let dir = flags
        .dir
        .or_else(|| env.dir.clone())
        .unwrap_or_else(|| DEFAULT_DIR.into());
    let timeout = match (flags.timeout, &env.timeout) {
        (Some(timeout), _) => timeout,
        (None, Some(value)) => timeout_value(value.clone(), ENV_TIMEOUT)?,
        (None, None) => DEFAULT_TIMEOUT,
    };
    let presence = match (flags.presence, &env.presence) {
        (Some(presence), _) => presence,
        (None, Some(value)) => timeout_value(value.clone(), ENV_PRESENCE)?,
        (None, None) => DEFAULT_PRESENCE,
    };
    Ok(Command::Wait(WaitArgs {
        dir,
        timeout,
        presence: (!presence.is_zero()).then_some(presence),
        settle: flags.settle.filter(|s| !s.is_zero()),
        then,
        ignored: flags.ignored,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(text: &str) -> CString {
        CString::new(text).expect("test strings have no NUL")
    }

    fn os(args: &[&str]) -> Vec<CString> {
        args.iter().map(|arg| c(arg)).collect()
    }

    fn parse_with(args: &[&str], env: &Env) -> Result<Command, UsageError> {
        parse(os(args), env)
    }

    fn wait(args: &[&str]) -> WaitArgs {
        match parse_with(args, &Env::default()) {
            Ok(Command::Wait(wait)) => wait,
            other => panic!("{args:?} parsed as {other:?}"),
        }
    }

    fn error(args: &[&str]) -> String {
        match parse_with(args, &Env::default()) {
            Err(UsageError(message)) => message,
            Ok(command) => panic!("{args:?} should be a usage error, parsed as {command:?}"),
        }
    }

    fn exec(program: &str, args: &[&str]) -> Then {
        Then::Exec(Exec {
            program: c(program),
            args: os(args),
        })
    }

    #[test]
    fn bare_wait_uses_defaults() {
        assert_eq!(
            wait(&["wait"]),
            WaitArgs {
                dir: c("/var/run/exitorder"),
                timeout: Duration::from_secs(25),
                presence: Some(Duration::from_secs(1)),
                settle: None,
                then: Then::Nothing,
                ignored: Vec::new(),
            }
        );
    }

    #[test]
    fn an_apps_wait_carries_its_settle_time() {
        let parsed = wait(&["wait", "--settle=2s", "--", "sh", "-c", "drain"]);
        assert_eq!(parsed.settle, Some(Duration::from_secs(2)));
        assert_eq!(parsed.then, exec("sh", &["-c", "drain"]));
        assert_eq!(
            wait(&["wait", "--settle", "1500ms"]).settle,
            Some(Duration::from_millis(1500))
        );
        // 0 is no settle time: a pod that asked for none.
        assert_eq!(wait(&["wait", "--settle=0"]).settle, None);
        assert!(error(&["wait", "--settle=soon"]).contains("--settle"));
        assert!(error(&["wait", "--Settle=2s"]).contains("did you mean --settle"));
    }

    #[test]
    fn wait_flags_in_both_spellings() {
        let spaced = wait(&["wait", "--dir", "/d", "--timeout", "500ms"]);
        let inline = wait(&["wait", "--timeout=500ms", "--dir=/d"]);
        assert_eq!(spaced, inline);
        assert_eq!(spaced.dir, c("/d"));
        assert_eq!(spaced.timeout, Duration::from_millis(500));
    }

    #[test]
    fn wait_command_after_double_dash() {
        let parsed = wait(&[
            "wait",
            "--timeout",
            "3",
            "--",
            "sh",
            "-c",
            "exit 7",
            "--dir",
        ]);
        assert_eq!(parsed.timeout, Duration::from_secs(3));
        assert_eq!(parsed.then, exec("sh", &["-c", "exit 7", "--dir"]));
        assert_eq!(wait(&["wait", "--"]).then, Then::Nothing);
    }

    #[test]
    fn inline_value_may_contain_equals_and_be_non_utf8() {
        assert_eq!(wait(&["wait", "--dir=/a=b"]).dir, c("/a=b"));
        let odd = CString::new(b"/d\xff".to_vec()).expect("no NUL");
        let mut args = os(&["wait", "--dir"]);
        args.push(odd.clone());
        match parse(args, &Env::default()) {
            Ok(Command::Wait(parsed)) => assert_eq!(parsed.dir, odd),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn environment_sits_between_defaults_and_flags() {
        let env = Env {
            dir: Some(c("/env/dir")),
            timeout: Some(c("2m")),
            presence: None,
        };
        match parse_with(&["wait"], &env) {
            Ok(Command::Wait(parsed)) => {
                assert_eq!(parsed.dir, c("/env/dir"));
                assert_eq!(parsed.timeout, Duration::from_secs(120));
            }
            other => panic!("{other:?}"),
        }
        match parse_with(&["wait", "--dir", "/flag", "--timeout", "1s"], &env) {
            Ok(Command::Wait(parsed)) => {
                assert_eq!(parsed.dir, c("/flag"));
                assert_eq!(parsed.timeout, Duration::from_secs(1));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn broken_environment_timeout_is_a_usage_error_unless_overridden() {
        let env = Env {
            dir: None,
            timeout: Some(c("soon")),
            presence: None,
        };
        let message = parse_with(&["wait"], &env).unwrap_err().0;
        assert!(message.contains(ENV_TIMEOUT), "{message}");
        assert!(parse_with(&["wait", "--timeout", "1s"], &env).is_ok());
    }

    #[test]
    fn help_anywhere_before_the_command() {
        let env = Env::default();
        for args in [
            &["-h"][..],
            &["--help"],
            &["wait", "-h"],
            &["wait", "--dir", "/d", "--help"],
            &["-wait-container-exit", "-help"],
            &["--wait-container-exit", "--h"],
        ] {
            assert_eq!(parse_with(args, &env), Ok(Command::Help), "{args:?}");
        }
        // After `--`, -h belongs to the wrapped command.
        assert_eq!(
            wait(&["wait", "--", "cmd", "-h"]).then,
            exec("cmd", &["-h"])
        );
    }

    #[test]
    fn kruise_form_with_entrypoint() {
        let expected = exec("sh", &["-c", "exit 3"]);
        for args in [
            &[
                "-wait-container-exit",
                "-entrypoint",
                "sh",
                "--",
                "-c",
                "exit 3",
            ][..],
            &[
                "--wait-container-exit",
                "--entrypoint",
                "sh",
                "--",
                "-c",
                "exit 3",
            ],
            &[
                "-wait-container-exit",
                "-entrypoint=sh",
                "--",
                "-c",
                "exit 3",
            ],
            &[
                "-wait-container-exit",
                "--entrypoint=sh",
                "--",
                "-c",
                "exit 3",
            ],
            &[
                "-entrypoint",
                "sh",
                "-wait-container-exit",
                "--",
                "-c",
                "exit 3",
            ],
            &[
                "-wait-container-exit=true",
                "-entrypoint",
                "sh",
                "--",
                "-c",
                "exit 3",
            ],
        ] {
            let parsed = wait(args);
            assert_eq!(parsed.then, expected, "{args:?}");
            assert_eq!(parsed.dir.as_c_str(), DEFAULT_DIR, "{args:?}");
            assert_eq!(parsed.timeout, DEFAULT_TIMEOUT, "{args:?}");
        }
    }

    #[test]
    fn kruise_form_without_entrypoint() {
        assert_eq!(
            wait(&["-wait-container-exit", "--", "sh", "-c", "exit 3"]).then,
            exec("sh", &["-c", "exit 3"])
        );
        assert_eq!(wait(&["-wait-container-exit"]).then, Then::Nothing);
        assert_eq!(wait(&["-wait-container-exit", "--"]).then, Then::Nothing);
        assert_eq!(
            wait(&["-wait-container-exit", "-entrypoint", "/bin/true"]).then,
            exec("/bin/true", &[])
        );
        // Go flag rules: the first non-flag argument ends the flags.
        assert_eq!(
            wait(&["-wait-container-exit", "sleep", "-x", "1"]).then,
            exec("sleep", &["-x", "1"])
        );
    }

    #[test]
    fn kruise_form_takes_dir_and_timeout() {
        let parsed = wait(&[
            "-wait-container-exit",
            "-dir",
            "/d",
            "--timeout=2m",
            "-entrypoint",
            "sh",
        ]);
        assert_eq!(parsed.dir, c("/d"));
        assert_eq!(parsed.timeout, Duration::from_secs(120));
        assert_eq!(parsed.then, exec("sh", &[]));
    }

    #[test]
    fn presence_comes_from_the_flag_then_the_environment_and_zero_turns_it_off() {
        assert_eq!(
            wait(&["wait", "--presence", "250ms"]).presence,
            Some(Duration::from_millis(250))
        );
        assert_eq!(wait(&["wait", "--presence=0"]).presence, None);
        let env = Env {
            presence: Some(c("3s")),
            ..Env::default()
        };
        match parse_with(&["wait"], &env) {
            Ok(Command::Wait(parsed)) => assert_eq!(parsed.presence, Some(Duration::from_secs(3))),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_later_releases_flags_are_skipped_not_refused() {
        let parsed = wait(&[
            "wait",
            "--from-the-future=2",
            "--timeout",
            "3s",
            "--later",
            "--",
            "sh",
        ]);
        assert_eq!(parsed.ignored, [c("--from-the-future=2"), c("--later")]);
        assert_eq!(parsed.timeout, Duration::from_secs(3));
        assert!(matches!(parsed.then, Then::Exec(_)));
        // A single dash is no later flag: a typo of a known one still fails, and so does
        // a known one spelt otherwise.
        assert!(error(&["wait", "-timeout", "3s"]).contains("unknown flag"));
        assert!(
            error(&["wait", "--http_get=http://127.0.0.1/"]).contains("did you mean --http-get")
        );
        assert!(error(&["wait", "--Sleep=5s"]).contains("did you mean --sleep"));
    }

    #[test]
    fn usage_errors() {
        for (args, needle) in [
            (&[][..], "missing subcommand"),
            (&["sleep"], "unknown subcommand"),
            (&["--dir", "/d"], "unknown flag"),
            (&["wait", "-dir", "/d"], "unknown flag -dir"),
            (&["wait", "sh"], "put the command after --"),
            (&["wait", "--dir"], "--dir needs a value"),
            (&["wait", "--dir="], "non-empty"),
            (&["wait", "--timeout"], "--timeout needs a value"),
            (&["wait", "--timeout", "1.5s"], "invalid duration"),
            (&["wait", "--timeout", "-1"], "invalid duration"),
            (&["wait", "--presence", "soon"], "invalid duration"),
            (
                &["-wait-container-exit", "-entrypoint"],
                "-entrypoint needs a value",
            ),
            (&["-wait-container-exit", "-entrypoint="], "needs a command"),
            (&["-wait-container-exit", "-bogus"], "unknown flag -bogus"),
            (
                &["-wait-container-exit", "-timeout", "x"],
                "invalid duration",
            ),
            (&["-wait-container-exit=maybe"], "true or false"),
            (&["-entrypoint", "sh"], "-wait-container-exit is required"),
            (
                &["-wait-container-exit=false", "-entrypoint", "sh"],
                "is required",
            ),
        ] {
            let message = error(args);
            assert!(
                message.contains(needle),
                "{args:?}: {message:?} lacks {needle:?}"
            );
        }
    }

    fn url(text: &str) -> Url {
        url::parse(&c(text)).expect("valid URL")
    }

    #[test]
    fn wait_then_http_get_or_sleep() {
        let parsed = wait(&[
            "wait",
            "--timeout",
            "5s",
            "--http-get",
            "http://127.0.0.1:8080/stop",
        ]);
        assert_eq!(parsed.timeout, Duration::from_secs(5));
        assert_eq!(
            parsed.then,
            Then::HttpGet(url("http://127.0.0.1:8080/stop"))
        );
        assert_eq!(
            wait(&["wait", "--http-get=http://localhost/x?y=1", "--dir", "/d"]).then,
            Then::HttpGet(url("http://localhost/x?y=1"))
        );
        assert_eq!(
            wait(&["wait", "--sleep", "5"]).then,
            Then::Sleep(Duration::from_secs(5))
        );
        assert_eq!(
            wait(&["wait", "--sleep=500ms"]).then,
            Then::Sleep(Duration::from_millis(500))
        );
        // An empty command after -- is no command.
        assert_eq!(
            wait(&["wait", "--sleep", "1", "--"]).then,
            Then::Sleep(Duration::from_secs(1))
        );
    }

    #[test]
    fn shutdown_and_await() {
        let env = Env {
            dir: None,
            timeout: Some(c("5s")),
            presence: None,
        };
        assert_eq!(
            parse_with(
                &["shutdown", "--post", "http://127.0.0.1:4191/shutdown"],
                &env
            ),
            Ok(Command::Shutdown(HttpArgs {
                url: url("http://127.0.0.1:4191/shutdown"),
                // EXITORDER_WAIT_TIMEOUT is the wait's alone.
                timeout: DEFAULT_HTTP_TIMEOUT,
            }))
        );
        assert_eq!(
            parse_with(
                &[
                    "await",
                    "--timeout=30s",
                    "--http-get",
                    "http://[::1]:15021/healthz/ready"
                ],
                &env
            ),
            Ok(Command::Await(HttpArgs {
                url: url("http://[::1]:15021/healthz/ready"),
                timeout: Duration::from_secs(30),
            }))
        );
        assert_eq!(parse_with(&["await", "-h"], &env), Ok(Command::Help));
        assert_eq!(parse_with(&["shutdown", "--help"], &env), Ok(Command::Help));
    }

    #[test]
    fn http_usage_errors() {
        for (args, needle) in [
            (&["shutdown"][..], "--post URL is required"),
            (&["shutdown", "--timeout", "1s"], "--post URL is required"),
            (
                &["shutdown", "--http-get", "http://127.0.0.1/"],
                "unknown flag --http-get",
            ),
            (&["shutdown", "--post"], "--post needs a value"),
            (
                &["shutdown", "-post", "http://127.0.0.1/"],
                "unknown flag -post",
            ),
            (&["shutdown", "http://127.0.0.1/"], "unexpected argument"),
            (
                &["shutdown", "--post", "http://10.0.0.1/"],
                "not a loopback address",
            ),
            (
                &[
                    "shutdown",
                    "--post",
                    "http://127.0.0.1/",
                    "--post",
                    "http://127.0.0.1/",
                ],
                "--post given twice",
            ),
            (&["await"], "--http-get URL is required"),
            (
                &["await", "--post", "http://127.0.0.1/"],
                "unknown flag --post",
            ),
            (
                &["await", "--http-get", "https://127.0.0.1/"],
                "https is not supported",
            ),
            (
                &["await", "--http-get", "http://127.0.0.1/", "--timeout", "x"],
                "invalid duration",
            ),
            (
                &["await", "--http-get", "http://127.0.0.1/", "--", "x"],
                "unexpected argument",
            ),
            (
                &["wait", "--http-get", "localhost:80"],
                "--http-get: invalid URL",
            ),
            (&["wait", "--sleep", "1.5s"], "--sleep: invalid duration"),
            (&["wait", "--sleep"], "--sleep needs a value"),
            (
                &["wait", "--sleep", "1", "--sleep", "2"],
                "--sleep given twice",
            ),
            (
                &["wait", "--http-get", "http://127.0.0.1/", "--sleep", "1"],
                "only one of",
            ),
            (&["wait", "--sleep", "1", "--", "sh"], "only one of"),
            (
                &["wait", "--http-get", "http://127.0.0.1/", "--", "sh"],
                "only one of",
            ),
            (
                &["-wait-container-exit", "--sleep", "1"],
                "unknown flag --sleep",
            ),
        ] {
            let message = error(args);
            assert!(
                message.contains(needle),
                "{args:?}: {message:?} lacks {needle:?}"
            );
        }
    }

    #[test]
    fn version_is_asked_alone() {
        for args in [&["--version"][..], &["-V"], &["-version"]] {
            assert_eq!(
                parse_with(args, &Env::default()),
                Ok(Command::Version),
                "{args:?}"
            );
        }
        assert!(error(&["--version", "wait"]).contains("unexpected argument"));
        assert!(error(&["--version=1"]).contains("unknown flag"));
    }

    #[test]
    fn install_takes_one_directory() {
        for dir in ["/var/run/exitorder-bin", "bin/", "./-x", "relative"] {
            assert_eq!(
                parse_with(&["install", dir], &Env::default()),
                Ok(Command::Install(InstallArgs { dir: c(dir) }))
            );
        }
        for help in ["-h", "--help"] {
            assert_eq!(
                parse_with(&["install", help], &Env::default()),
                Ok(Command::Help)
            );
        }
        for (args, needle) in [
            (&["install"][..], "DIR is required"),
            (&["install", ""], "DIR is empty"),
            (&["install", "/a", "/b"], "unexpected argument"),
            (&["install", "--dir", "/a"], "unknown flag --dir"),
            (&["install", "-"], "unexpected argument \"-\""),
        ] {
            let message = error(args);
            assert!(
                message.contains(needle),
                "{args:?}: {message:?} lacks {needle:?}"
            );
        }
    }

    #[test]
    fn usage_advertises_every_subcommand() {
        for text in [
            "wait [--dir DIR]",
            "--http-get URL",
            "--sleep DURATION",
            "-wait-container-exit",
            "shutdown --post URL",
            "await --http-get URL",
            "install DIR",
            "exit status",
        ] {
            assert!(USAGE.contains(text), "{text}");
        }
    }

    #[test]
    fn mark_takes_waits_arguments() {
        match parse_with(
            &["mark", "--dir", "/d", "--", "sh", "-c", "x"],
            &Env::default(),
        ) {
            Ok(Command::Mark(m)) => {
                assert_eq!(m.dir, c("/d"));
                assert_eq!(m.then, exec("sh", &["-c", "x"]));
            }
            other => panic!("{other:?}"),
        }
        match parse_with(&["mark", "--sleep", "5s"], &Env::default()) {
            Ok(Command::Mark(m)) => assert_eq!(m.then, Then::Sleep(Duration::from_secs(5))),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_with(&["mark", "--help"], &Env::default()),
            Ok(Command::Help)
        ));
        assert!(error(&["mark", "extra"]).contains("extra"));
    }
}
