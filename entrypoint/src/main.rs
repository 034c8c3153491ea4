//! The binary: a C `main` over the library, without Rust's std.
//!
//! std would bring its panic and backtrace machinery (a fifth of the size
//! budget of this binary, which is copied into every sidecar's image), so
//! the release build is `no_std` and starts from the C runtime's `main`;
//! runtime.rs supplies what std otherwise would. `cargo test` builds this
//! binary with unwinding panics, which only std implements, so those builds
//! link std for that alone; the code that runs is the same.
//!
//! Parts:
//! - `runtime`: what std would supply: the C library to link, an allocator,
//!   what a panic does.

#![no_std]
#![no_main]

#[cfg(panic = "unwind")]
extern crate std;

mod runtime;

use core::ffi::{c_char, c_int};

use exitorder_entrypoint::cli::{self, Command};
use exitorder_entrypoint::{endpoint, install, log, prestop, sys};

/// Called by the C runtime, with the process's arguments.
#[no_mangle]
extern "C" fn main(argc: c_int, argv: *const *const c_char) -> c_int {
    sys::init_process();
    // SAFETY: argc and argv are main's own, as the C runtime passed them.
    let args = unsafe { sys::args(argc, argv) };
    let env = cli::Env::from_process();
    let status = match cli::parse(args.into_iter().skip(1), &env) {
        Ok(Command::Help) => {
            let _ = sys::write_all(sys::STDOUT, cli::USAGE.as_bytes());
            0
        }
        Ok(Command::Version) => {
            let line = concat!("exitorder-entrypoint ", env!("CARGO_PKG_VERSION"), "\n");
            let _ = sys::write_all(sys::STDOUT, line.as_bytes());
            0
        }
        Ok(Command::Wait(args)) => prestop::run(&args),
        Ok(Command::Mark(args)) => prestop::run_marked(&args),
        Ok(Command::Shutdown(args)) => endpoint::shutdown(&args),
        Ok(Command::Await(args)) => endpoint::await_ready(&args),
        Ok(Command::Install(args)) => install::run(&args),
        Err(err) => {
            log!("{err}");
            let _ = sys::write_all(sys::STDERR, cli::USAGE.as_bytes());
            cli::EX_USAGE
        }
    };
    c_int::from(status)
}
