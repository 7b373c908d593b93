//! The `caravan` command.

use caravan_host::run::{LIMIT_NAMES, RunOptions};
use caravan_host::structs::ClientStatus;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Caravan: WebAssembly-sandboxed alloc runners under a Nomad-style client.
#[derive(Debug, Parser)]
#[command(name = "caravan", version)]
struct Cli {
    /// Log level, or a filter such as `info,caravan::guest=debug`.
    #[arg(long, global = true, default_value = "info", env = "CARAVAN_LOG_LEVEL")]
    log_level: String,
    /// Write every log line, host and guest, as one JSON object.
    #[arg(long, global = true, env = "CARAVAN_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one alloc of a runner component to completion, without an agent.
    ///
    /// Exit status: 0 when the alloc ends `complete`, 1 when it ends `failed`, 2 when the
    /// arguments or the component are not usable. Ctrl-C sends `kill`; a second one stops
    /// waiting.
    Run {
        /// The runner component (`.wasm`).
        component: PathBuf,
        /// A task of the alloc; repeat for several. Default: one task named `main`.
        #[arg(long = "task", value_name = "NAME")]
        tasks: Vec<String>,
        /// Task config: `KEY=VALUE` for every task, `TASK.KEY=VALUE` for one.
        #[arg(long, value_name = "[TASK.]KEY=VALUE")]
        config: Vec<String>,
        /// A limit for this alloc.
        #[arg(long = "limit", value_name = "NAME=VALUE", help = format!("A limit for this alloc: {LIMIT_NAMES}"))]
        limits: Vec<String>,
        /// Alloc metadata.
        #[arg(long, value_name = "KEY=VALUE")]
        meta: Vec<String>,
        /// The job id the alloc belongs to.
        #[arg(long, default_value = "run")]
        job: String,
        /// Keep alloc directories here instead of in a temporary directory.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(error) = caravan_host::telemetry::init(&cli.log_level, cli.log_json) {
        eprintln!("error: {error:#}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Run {
            component,
            tasks,
            config,
            limits,
            meta,
            job,
            data_dir,
        } => {
            let options = RunOptions {
                component,
                tasks,
                config,
                limits,
                meta,
                job_id: job,
                data_dir,
            };
            match runtime.block_on(caravan_host::run::run(options)) {
                Ok((alloc, state)) => {
                    if cli.log_json {
                        let summary = serde_json::json!({
                            "alloc_id": alloc.id,
                            "client_status": state.client_status,
                            "description": state.description,
                        });
                        println!("{summary}");
                    } else {
                        println!(
                            "alloc {} {}: {}",
                            alloc.id, state.client_status, state.description
                        );
                    }
                    if state.client_status == ClientStatus::Complete {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(error) => {
                    eprintln!("error: {error:#}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
