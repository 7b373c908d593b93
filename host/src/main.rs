//! The `caravan` command: parses the command line and hands it to [`caravan_host::cli`],
//! which runs it and decides the exit status. Nothing else belongs here.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    caravan_host::cli::Cli::parse().execute()
}
