//! The `wait` subcommand: ask for exit permission, wait for it, then hand
//! over to the wrapped command.
//!
//! Every failure here fails open. The hook runs inside the pod's grace
//! period, so an agent that is down, a missing mount or a read-only
//! directory must cost at most the timeout, never the whole grace period
//! and a SIGKILL of the sidecar.

use crate::cli::WaitArgs;
use crate::duration;
use crate::exec;
use crate::log;
use crate::log::Lossy;
use crate::sys::Instant;
use crate::wait::{ExitRequest, Outcome};

/// Runs the wait and then the wrapped command; returns only when there is no
/// command or it could not be started, with the exit status to use.
pub fn run(args: &WaitArgs) -> u8 {
    wait_for_permission(args);
    match &args.then {
        Some(command) => exec::replace_process(command),
        None => 0,
    }
}

fn wait_for_permission(args: &WaitArgs) {
    let started = Instant::now();
    let dir = Lossy(args.dir.to_bytes());
    let timeout = duration::show(args.timeout);
    let request = match ExitRequest::post(&args.dir) {
        Ok(request) => request,
        Err(err) => {
            log!("{err}; proceeding without exit permission");
            return;
        }
    };
    log!("waiting up to {timeout} for exit permission in {dir}");
    match request.wait(args.timeout) {
        Ok(Outcome::Allowed) => {
            log!("exit allowed after {}ms", started.elapsed().as_millis());
        }
        Ok(Outcome::TimedOut) => log!(
            "no exit permission after {timeout}; proceeding \
             (is the exitorder agent running on this node?)"
        ),
        Ok(Outcome::DirectoryGone) => {
            log!("{dir} was removed or unmounted while waiting; proceeding");
        }
        Err(err) => log!("waiting for exit permission in {dir} failed: {err}; proceeding"),
    }
    if let Err(err) = request.withdraw() {
        log!("cannot remove {dir}/exit: {err}");
    }
}
