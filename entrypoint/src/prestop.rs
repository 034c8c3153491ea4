//! The `wait` subcommand: ask for exit permission, wait for it, then do
//! what the sidecar's preStop hook did before: run the wrapped command, GET
//! a URL, or sleep.
//!
//! Every failure here fails open. The hook runs inside the pod's grace
//! period, so an agent that is down, a missing mount or a read-only
//! directory must cost at most the timeout, never the whole grace period
//! and a SIGKILL of the sidecar.
//!
//! SIGTERM, SIGINT and SIGHUP while waiting (the kubelet sends none to an
//! exec hook, but a runtime may stop the exec) end the wait at once: the
//! `exit` file is removed, so a restarted container does not find a stale
//! request, and the process exits 128 + the signal's number, as a shell
//! reports a process killed by it, without running the command. SIGKILL
//! cannot be caught: it leaves `exit` behind, which the agent answers like
//! any other request (`unknown` once the container is gone) and removes
//! with the pod's directory, and which the next `wait` in a restarted
//! container replaces before it asks.

use core::ffi::c_int;

use crate::cli::{Then, WaitArgs};
use crate::duration;
use crate::endpoint;
use crate::exec;
use crate::log;
use crate::lossy::Lossy;
use crate::sys::{self, Instant, SignalFd};
use crate::wait::{ExitRequest, Outcome, POLL_FALLBACK};

/// The signals that end a wait early, after removing `exit`.
const SIGNALS: [c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Runs the wait and then what follows it; returns only when there is no
/// command to run in this process's place or it could not be started, with
/// the exit status to use.
pub fn run(args: &WaitArgs) -> u8 {
    let started = Instant::now();
    let waited = wait_for_permission(args);
    if let Some(signal) = waited.signal {
        return signal_status(signal);
    }
    if let Some(settle) = args.settle {
        // An app's wait for its endpoints' withdrawal that no agent held (none answered, or
        // one of a release that does not hold such waits): the settle time alone, as the
        // sleep this wait replaces would have.
        if waited.owes_settle {
            log!(
                "no agent held this exit until the pod's endpoints were withdrawn; \
                 waiting the settle time ({}) instead",
                duration::show(settle)
            );
            // Never past the hook's own bound: the pod's grace less the reserve.
            let bound = started.saturating_add(args.timeout);
            let until = Instant::now().saturating_add(settle);
            sys::sleep_until(if until < bound { until } else { bound });
        }
    }
    then(args)
}

/// How a wait for permission ended, as far as what follows goes.
struct Waited {
    /// The signal that ended it.
    signal: Option<c_int>,
    /// An app's wait for its endpoints (`--settle`) still owes the settle time: no agent
    /// that holds such waits let it go, and the wait did not already last its whole timeout.
    owes_settle: bool,
}

/// `mark`: says the container is being stopped, then runs what follows at once. A mark that
/// cannot be made is said and passed over: the hook the container had must run whatever
/// happens (the agent then errs toward the order for the pod's sidecars, never against it,
/// as long as the kubelet's own kill of the whole pod is told by the others' marks).
pub fn run_marked(args: &WaitArgs) -> u8 {
    if let Err(err) = crate::wait::mark(&args.dir) {
        log!("{err}; the agent will not know this container is being stopped");
    }
    then(args)
}

/// What the hook did before exitorder wrapped it.
fn then(args: &WaitArgs) -> u8 {
    match &args.then {
        Then::Nothing => 0,
        Then::Exec(command) => exec::replace_process(command),
        Then::HttpGet(url) => endpoint::hook_get(url),
        Then::Sleep(duration) => {
            sys::sleep_until(Instant::now().saturating_add(*duration));
            0
        }
    }
}

/// Waits, and says how it ended.
fn wait_for_permission(args: &WaitArgs) -> Waited {
    let started = Instant::now();
    let dir = Lossy(args.dir.to_bytes());
    let timeout = duration::show(args.timeout);
    // Before the request exists, so a signal can never find it unguarded.
    let signals = match SignalFd::open(&SIGNALS) {
        Ok(signals) => Some(signals),
        Err(err) => {
            log!("cannot catch SIGTERM ({err}); a kill while waiting would leave {dir}/exit");
            None
        }
    };
    let request = match ExitRequest::post(&args.dir) {
        Ok(request) => request,
        Err(err) => {
            log!("{err}; proceeding without exit permission");
            return Waited {
                signal: None,
                owes_settle: true,
            };
        }
    };
    if let Some(err) = request.polling() {
        log!(
            "cannot watch {dir} with inotify ({err}; raise fs.inotify.max_user_instances \
             on the node); checking every {}ms instead",
            POLL_FALLBACK.as_millis()
        );
    }
    for flag in &args.ignored {
        log!(
            "ignoring {} (not known to this entrypoint; from a later exitorder?)",
            Lossy(flag.to_bytes())
        );
    }
    log!("waiting up to {timeout} for exit permission in {dir}");
    let mut signalled = None;
    let mut owes_settle = true;
    match request.wait(args.timeout, args.presence, signals.as_ref()) {
        Ok(Outcome::Allowed) => {
            log!("exit allowed after {}ms", started.elapsed().as_millis());
            owes_settle = args.settle.is_some() && !request.agent_holds_endpoints();
        }
        Ok(Outcome::TimedOut) => {
            log!(
                "no exit permission after {timeout}; proceeding \
                 (is the exitorder agent running on this node?)"
            );
            // The whole bound is spent: no settle time on top of it.
            owes_settle = false;
        }
        Ok(Outcome::DirectoryGone) => {
            log!("{dir} was removed or unmounted while waiting; proceeding");
        }
        Ok(Outcome::ExitFileGone) => log!(
            "{dir}/exit was removed by someone else while waiting \
             (the agent never removes it); proceeding"
        ),
        Ok(Outcome::NoAgent) => log!(
            "no exitorder agent serves {dir} (none said so within {}); proceeding",
            duration::show(args.presence.unwrap_or_default())
        ),
        Ok(Outcome::Uninstalled) => {
            log!("exitorder was uninstalled from this node; proceeding");
        }
        Ok(Outcome::Signalled(signal)) => {
            log!(
                "{} while waiting for exit permission; withdrawing the request and exiting",
                signal_name(signal)
            );
            signalled = Some(signal);
        }
        Err(err) => log!("waiting for exit permission in {dir} failed: {err}; proceeding"),
    }
    if let Err(err) = request.withdraw() {
        log!("cannot remove {dir}/exit: {err}");
    }
    request.finish();
    // Only now are the signals let through again: one that came after the
    // wait ended takes its default action, with `exit` already gone.
    drop(signals);
    Waited {
        signal: signalled,
        owes_settle,
    }
}

fn signal_status(signal: c_int) -> u8 {
    u8::try_from(signal).map_or(u8::MAX, |signal| signal.saturating_add(128))
}

fn signal_name(signal: c_int) -> &'static str {
    match signal {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}
