use std::io::Write;
use std::process::ExitCode;

use exitorder_entrypoint::cli::{self, Command};
use exitorder_entrypoint::{log, prestop};

fn main() -> ExitCode {
    let env = cli::Env::from_process();
    match cli::parse(std::env::args_os().skip(1), &env) {
        Ok(Command::Help) => {
            let _ = std::io::stdout().lock().write_all(cli::USAGE.as_bytes());
            ExitCode::SUCCESS
        }
        Ok(Command::Wait(args)) => prestop::run(&args),
        Err(err) => {
            log!("{err}");
            let _ = std::io::stderr().lock().write_all(cli::USAGE.as_bytes());
            ExitCode::from(cli::EX_USAGE)
        }
    }
}
