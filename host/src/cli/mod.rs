//! The `caravan` command line: the flags of every command, and the one place that turns a
//! command's outcome into an exit status.
//!
//! Each command group is a clap struct in its own module with one entry point, `execute`:
//! [`run`] (`caravan run`), [`agent`] (`caravan agent`), [`nodesim`] (`caravan nodesim`),
//! [`check`] (`caravan runner check`) and [`client`] (`job`, `alloc`, `node`, `system`: requests to a running agent). The split
//! between commands that work on this machine and those that talk to an agent is in the
//! types: [`Command::Client`] holds every remote one.
//!
//! [`Cli::execute`] does what every command shares, once: it starts the async runtime, runs
//! the command, and prints an error as one `error: ...` line on stderr with the command's
//! exit status for errors ([`Command::error_exit_code`]). Logging starts in each command
//! through [`GlobalArgs::start_logging`], because its level is only known there (the agent
//! reads it from its config file; the client commands log nothing).
//!
//! This module parses and prints; the work itself is done by library modules ([`crate::run`],
//! [`crate::check`], [`crate::agent`]) that know nothing of clap, stdout or exit statuses.

pub mod agent;
pub mod check;
pub mod client;
pub mod nodesim;
pub mod run;
pub mod tls;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Caravan: WebAssembly-sandboxed alloc runners under a Nomad-style client.
#[derive(Debug, Parser)]
#[command(name = "caravan", version)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// The flags every command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct GlobalArgs {
    /// Log level, or a filter such as `info,caravan::guest=debug` (default: info).
    #[arg(long, global = true, env = "CARAVAN_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Write every log line, host and guest, as one JSON object.
    #[arg(long, global = true, env = "CARAVAN_LOG_JSON")]
    pub log_json: bool,
}

impl GlobalArgs {
    /// Starts the process's log subscriber with `--log-level`, or `default_level` when the
    /// flag is not given. Call at most once per process.
    pub fn start_logging(&self, default_level: &str) -> anyhow::Result<()> {
        let level = self.log_level.as_deref().unwrap_or(default_level);
        crate::telemetry::init(level, self.log_json)
    }
}

/// Every command `caravan` knows.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one alloc of a runner component to completion, without an agent.
    ///
    /// Exit status: 0 when the alloc ends `complete`, 1 when it ends `failed`, 2 when the
    /// arguments or the component are not usable. Ctrl-C sends `kill`; a second one stops
    /// waiting.
    Run(run::RunCommand),
    /// Run the agent: the embedded server, one client node and the HTTP API.
    ///
    /// Stops on Ctrl-C or SIGTERM. Flags override the config file.
    Agent(agent::AgentCommand),
    /// Simulate many client nodes in this process, registered with an agent's server: for
    /// testing a scheduler at scale (docs/nodesim.md).
    ///
    /// Prints a summary line every second and a report on Ctrl-C or SIGTERM, then stops.
    Nodesim(Box<nodesim::NodesimCommand>),
    /// A certificate authority and certificates for a cluster's agents, nodes and
    /// operators, as `nomad tls` makes them.
    Tls {
        /// What to make.
        #[command(subcommand)]
        command: tls::TlsCommand,
    },
    /// Tools for runner authors.
    Runner {
        /// Which tool.
        #[command(subcommand)]
        command: check::RunnerCommand,
    },
    /// The commands that talk to a running agent.
    #[command(flatten)]
    Client(client::ClientCommand),
}

impl Command {
    /// The exit status when the command fails with an error rather than an outcome: 2 (not
    /// usable) for the local commands, 1 for the client commands.
    pub fn error_exit_code(&self) -> u8 {
        match self {
            Command::Run(_)
            | Command::Agent(_)
            | Command::Nodesim(_)
            | Command::Runner { .. }
            | Command::Tls { .. } => 2,
            Command::Client(_) => 1,
        }
    }

    /// Runs the command; `Ok` carries the exit status of an outcome (such as a failed
    /// alloc), `Err` an error that [`Cli::execute`] prints.
    pub async fn execute(self, global: &GlobalArgs) -> anyhow::Result<ExitCode> {
        match self {
            Command::Run(command) => command.execute(global).await,
            Command::Agent(command) => command.execute(global).await,
            Command::Nodesim(command) => command.execute(global).await,
            Command::Runner { command } => command.execute(global).await,
            Command::Tls { command } => command.execute(),
            Command::Client(command) => command.execute().await.map(|()| ExitCode::SUCCESS),
        }
    }
}

/// Lets a command that only prints (the client commands, `runner check`) end as Unix tools
/// do when its output is piped into a reader that stops early (`caravan alloc status ID |
/// head`): killed by SIGPIPE, instead of panicking (Rust's runtime ignores SIGPIPE, so every
/// `println!` after the reader left would panic). The agent and nodesim keep ignoring it (a
/// closed connection or log pipe must not kill a server), and so does `caravan run`, which
/// runs a guest that must be killed and cleaned up whatever happens to its output.
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: restoring a signal's default disposition has no memory-safety precondition;
    // it is done before the async runtime starts any thread.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Keeps SIGPIPE from the runtime's threads, where the connections to agents and registries
/// are written: a socket its peer closed (an agent answering an upload before reading all of
/// it) fails that write with EPIPE, which the request reports, rather than killing the
/// command. Writes to sockets go through `writev`, which has no `MSG_NOSIGNAL`. Only the main
/// thread, which prints, ends on a closed pipe.
fn keep_sigpipe_from_this_thread() {
    // SAFETY: pthread_sigmask changes only this thread's signal mask, with a set built here;
    // it has no memory-safety precondition.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

impl Cli {
    /// Runs the parsed command line to its exit status.
    pub fn execute(self) -> ExitCode {
        let Cli { global, command } = self;
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.enable_all();
        if matches!(command, Command::Client(_) | Command::Runner { .. }) {
            end_quietly_on_a_closed_pipe();
            builder.on_thread_start(keep_sigpipe_from_this_thread);
        }
        let runtime = match builder.build() {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("error: cannot start the async runtime: {error}");
                return ExitCode::from(2);
            }
        };
        let error_exit_code = command.error_exit_code();
        let outcome = runtime.block_on(command.execute(&global));
        // Everything a command must finish it has awaited; what is left is work a Ctrl-C
        // abandoned (a compile on the blocking pool, say), which must not hold the exit.
        runtime.shutdown_background();
        crate::telemetry::finish();
        match outcome {
            Ok(code) => code,
            Err(error) => {
                eprintln!("error: {error:#}");
                if error.is::<client::job::PlacementFailed>() {
                    return ExitCode::from(2);
                }
                ExitCode::from(error_exit_code)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn local_commands_fail_with_2_and_client_commands_with_1() {
        let code = |args: &[&str]| Cli::parse_from(args).command.error_exit_code();
        assert_eq!(code(&["caravan", "run", "runner.wasm"]), 2);
        assert_eq!(code(&["caravan", "agent", "--dev"]), 2);
        assert_eq!(code(&["caravan", "runner", "check", "runner.wasm"]), 2);
        assert_eq!(code(&["caravan", "job", "status"]), 1);
        assert_eq!(code(&["caravan", "alloc", "logs", "-f", "abc"]), 1);
        assert_eq!(code(&["caravan", "node", "status"]), 1);
        assert_eq!(code(&["caravan", "system", "gc"]), 1);
    }
}
