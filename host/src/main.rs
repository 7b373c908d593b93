//! The `caravan` command: parses the command line and hands it to [`caravan_host::cli`],
//! which runs it and decides the exit status; and picks the process's allocator. Nothing else
//! belongs here.

use clap::Parser;
use std::process::ExitCode;

/// mimalloc, not glibc's malloc: see the workspace's Cargo.toml for why. The benches in
/// `benches/common` set the same, so that they measure what the agent runs.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    caravan_host::cli::Cli::parse().execute()
}
