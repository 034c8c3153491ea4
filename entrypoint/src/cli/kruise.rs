//! `-wait-container-exit [-entrypoint CMD] [-- ARGS...]`, the spelling of the OpenKruise
//! SidecarExitPriority proposal, read with Go `flag` package rules (one or two dashes,
//! `-flag=value`, flags end at the first non-flag argument) so that pod specs written for it
//! keep working.

use alloc::ffi::CString;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::ffi::CStr;

use super::{
    command_from, dir_value, finish, timeout_value, unexpected, usage_error, Command, Env, Flag,
    Flags, Then, UsageError,
};

pub(super) fn parse(
    mut args: impl Iterator<Item = CString>,
    env: &Env,
) -> Result<Command, UsageError> {
    let mut wait_flag = None;
    let mut entrypoint = None;
    let mut dir = None;
    let mut timeout = None;
    let mut positional = Vec::new();
    while let Some(arg) = args.next() {
        if arg.as_bytes() == b"--" {
            positional.extend(args.by_ref());
            break;
        }
        let Some(flag) = Flag::split(&arg) else {
            // Go's flag package stops at the first non-flag argument; the
            // rest, this one included, are positional.
            positional.push(arg);
            positional.extend(args.by_ref());
            break;
        };
        let shown = format!("-{}", flag.name);
        match flag.name {
            "h" | "help" if flag.value.is_none() => return Ok(Command::Help),
            "wait-container-exit" => wait_flag = Some(go_bool(flag.value, &shown)?),
            "entrypoint" => {
                let program = flag.value(&shown, &mut args)?;
                if program.is_empty() {
                    return Err(usage_error("-entrypoint needs a command"));
                }
                entrypoint = Some(program);
            }
            "dir" => dir = Some(dir_value(flag.value(&shown, &mut args)?, &shown)?),
            "timeout" => timeout = Some(timeout_value(flag.value(&shown, &mut args)?, &shown)?),
            _ => return Err(unexpected(&arg)),
        }
    }
    if wait_flag != Some(true) {
        return Err(usage_error(
            "-wait-container-exit is required (running a command without the wait is not supported)",
        ));
    }
    let then = command_from(entrypoint, positional).map_or(Then::Nothing, Then::Exec);
    let flags = Flags {
        dir,
        timeout,
        presence: None,
        settle: None,
        ignored: Vec::new(),
    };
    finish(flags, then, env)
}

/// Go's `strconv.ParseBool` spellings, as `-wait-container-exit=true` is a
/// valid Go `flag` spelling.
fn go_bool(value: Option<&CStr>, shown: &str) -> Result<bool, UsageError> {
    let Some(value) = value else { return Ok(true) };
    match value.to_bytes() {
        b"1" | b"t" | b"T" | b"true" | b"TRUE" | b"True" => Ok(true),
        b"0" | b"f" | b"F" | b"false" | b"FALSE" | b"False" => Ok(false),
        _ => Err(usage_error(format!(
            "{shown} takes true or false, not {:?}",
            String::from_utf8_lossy(value.to_bytes())
        ))),
    }
}
