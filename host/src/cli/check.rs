//! `caravan runner ...`: tools for runner authors; today `runner check`, its flags and the
//! lines it prints.
//!
//! The checks themselves are [`crate::check`], a library module so tests and other tools can
//! run them without a process; this module must not add checks, only print them.

use super::GlobalArgs;
use crate::shutdown::Shutdown;
use anyhow::{Context, bail};
use std::path::PathBuf;
use std::process::ExitCode;

/// `caravan runner`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum RunnerCommand {
    /// Drive a runner through the contract and print one line per check. Exits 0 only when
    /// every required check passes.
    Check(CheckCommand),
}

impl RunnerCommand {
    /// Runs the subcommand to its exit status.
    pub async fn execute(self, global: &GlobalArgs) -> anyhow::Result<ExitCode> {
        match self {
            RunnerCommand::Check(command) => command.execute(global).await,
        }
    }
}

/// `caravan runner check`'s flags.
#[derive(Debug, clap::Args)]
pub struct CheckCommand {
    /// The runner component (`.wasm`).
    component: PathBuf,
    /// How long `kill` and `shutdown` may take.
    #[arg(long, default_value = "5s", value_parser = crate::units::parse_duration)]
    kill_timeout: std::time::Duration,
    /// Keep compiled components here, so the next check or run does not compile them
    /// again (default: the cache the agent and `caravan run` share,
    /// ~/.cache/caravan/components).
    #[arg(long, env = "CARAVAN_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

impl CheckCommand {
    /// Prints one line per check and a verdict; exits 0 when every required check passed, 1
    /// when one failed. Errors (the checks could not run, Ctrl-C or SIGTERM) exit 2 through
    /// the caller.
    pub async fn execute(self, global: &GlobalArgs) -> anyhow::Result<ExitCode> {
        // Only the checks' own lines: the runner's logs are checked, not shown.
        global.start_logging("off")?;
        let shutdown = Shutdown::new();
        shutdown.on_signals()?;
        let mut stop = shutdown.listener();
        // A task of its own, so that a signal is heard while the checks compile the component
        // (which holds their thread for seconds for Python or JavaScript).
        let component = self.component.clone();
        let cache_dir = self
            .cache_dir
            .or_else(crate::runtime::disk_cache::shared_dir);
        let checks = tokio::spawn(async move {
            crate::check::check(&component, self.kill_timeout, cache_dir).await
        });
        let results = tokio::select! {
            results = checks => results.context("the checks stopped unexpectedly")??,
            _ = stop.stopping() => bail!("interrupted: the checks did not finish"),
        };
        for result in &results {
            println!("{}", crate::text::escape_controls(&result.line()));
        }
        let failed = results.iter().filter(|r| r.required && !r.passed).count();
        let component = self.component.display();
        if failed == 0 {
            println!("{component}: every required check passed");
            Ok(ExitCode::SUCCESS)
        } else {
            println!("{component}: {failed} required check(s) failed");
            Ok(ExitCode::from(1))
        }
    }
}
