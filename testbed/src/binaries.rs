//! The agent and the static entrypoint the test bed runs: given on the command line, or
//! found beside this executable (a build tree's `target/<profile>/`), and checked before use.

use std::path::PathBuf;

use anyhow::bail;

/// The agent and the static entrypoint a demo or benchmark runs.
pub struct Binaries {
    pub agent: PathBuf,
    pub entrypoint: PathBuf,
}

/// The binaries the agent runs from, as a process on the test node.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BinaryArgs {
    /// The static exitorder-entrypoint the agent installs for the pods' preStop hooks
    /// (default: beside this executable).
    #[arg(long, env = "EXITORDER_ENTRYPOINT_BINARY")]
    pub entrypoint_binary: Option<PathBuf>,
    /// The `exitorder` agent binary (default: beside this executable).
    #[arg(long, env = "EXITORDER_AGENT_BINARY")]
    pub agent_binary: Option<PathBuf>,
}

/// The static entrypoint given (default: beside this executable), refused with the command
/// that builds it when it is missing or dynamically linked (busybox containers run it).
pub fn static_entrypoint(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = given.unwrap_or_else(|| {
        exitorder::cli::beside_this_executable(exitorder::handshake::share::ENTRYPOINT_NAME)
    });
    const BUILD: &str = "build it with scripts/static entrypoint (scripts/demo and \
                         scripts/bench do)";
    match exitorder::handshake::elf::check_static_executable(&path) {
        Ok(()) => Ok(path),
        Err(e) => bail!("entrypoint {}: {e}; {BUILD}", path.display()),
    }
}

/// The agent binary given (default: `exitorder` beside this executable).
pub fn agent_binary(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = given.unwrap_or_else(|| exitorder::cli::beside_this_executable("exitorder"));
    if path.is_file() {
        Ok(path)
    } else {
        bail!(
            "agent binary {} not found; build it with `scripts/static agent` (scripts/demo and \
             scripts/bench do) or give --agent-binary",
            path.display()
        )
    }
}
