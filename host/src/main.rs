//! The `caravan` command.

use caravan_host::agent::Agent;
use caravan_host::agent::config::{AgentConfig, apply_file, parse_bind};
use caravan_host::run::{LIMIT_NAMES, RunOptions};
use caravan_host::structs::ClientStatus;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Caravan: WebAssembly-sandboxed alloc runners under a Nomad-style client.
#[derive(Debug, Parser)]
#[command(name = "caravan", version)]
struct Cli {
    /// Log level, or a filter such as `info,caravan::guest=debug` (default: info).
    #[arg(long, global = true, env = "CARAVAN_LOG_LEVEL")]
    log_level: Option<String>,
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
    /// Run the agent: the embedded server, one client node and the HTTP API.
    ///
    /// Stops on Ctrl-C or SIGTERM. Flags override the config file.
    Agent {
        /// A TOML config file (see the README for its keys).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Where state and alloc directories live (default ./caravan-data).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Where the HTTP API listens (default 127.0.0.1:4646).
        #[arg(long, value_name = "HOST:PORT")]
        bind: Option<String>,
        /// Use a fresh temporary data dir and destroy everything on exit.
        #[arg(long)]
        dev: bool,
        /// Require this bearer token for every write request.
        #[arg(long, env = "CARAVAN_ACL_TOKEN", value_name = "TOKEN")]
        acl_token: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
            let level = cli.log_level.unwrap_or_else(|| "info".into());
            if let Err(error) = caravan_host::telemetry::init(&level, cli.log_json) {
                eprintln!("error: {error:#}");
                return ExitCode::from(2);
            }
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
        Command::Agent {
            config,
            data_dir,
            bind,
            dev,
            acl_token,
        } => {
            let mut agent_config = AgentConfig::default();
            let flags = (|| -> Result<(), String> {
                if let Some(path) = &config {
                    let text = std::fs::read_to_string(path)
                        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
                    apply_file(&mut agent_config, &path.display().to_string(), &text)?;
                }
                if let Some(dir) = data_dir {
                    agent_config.data_dir = dir;
                }
                if let Some(bind) = bind {
                    agent_config.bind = parse_bind(&bind).map_err(|e| format!("--bind: {e}"))?;
                }
                agent_config.dev |= dev;
                if let Some(token) = acl_token.filter(|t| !t.is_empty()) {
                    agent_config.acl_token = Some(token);
                }
                if let Some(level) = cli.log_level {
                    agent_config.log_level = level;
                }
                agent_config.log_json |= cli.log_json;
                Ok(())
            })();
            if let Err(error) = flags {
                eprintln!("error: {error}");
                return ExitCode::from(2);
            }
            if let Err(error) =
                caravan_host::telemetry::init(&agent_config.log_level, agent_config.log_json)
            {
                eprintln!("error: {error:#}");
                return ExitCode::from(2);
            }
            let outcome = runtime.block_on(async {
                let agent = Agent::start(agent_config).await?;
                caravan_host::run::interrupt().await?;
                tracing::info!("interrupted: stopping the agent");
                agent.stop().await;
                anyhow::Ok(())
            });
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("error: {error:#}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
