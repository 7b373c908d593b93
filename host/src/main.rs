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
        /// Keep compiled components here, so the next run does not compile them again.
        #[arg(long, env = "CARAVAN_CACHE_DIR", value_name = "DIR")]
        cache_dir: Option<PathBuf>,
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
    /// Tools for runner authors.
    Runner {
        #[command(subcommand)]
        command: RunnerCommand,
    },
    /// Jobs on the agent at CARAVAN_ADDR.
    Job {
        #[command(subcommand)]
        command: JobCommand,
        #[command(flatten)]
        remote: Remote,
    },
    /// Allocations on the agent at CARAVAN_ADDR.
    Alloc {
        #[command(subcommand)]
        command: AllocCommand,
        #[command(flatten)]
        remote: Remote,
    },
    /// Nodes known to the agent at CARAVAN_ADDR.
    Node {
        #[command(subcommand)]
        command: NodeCommand,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cluster-wide operations on the agent at CARAVAN_ADDR.
    System {
        #[command(subcommand)]
        command: SystemCommand,
        #[command(flatten)]
        remote: Remote,
    },
}

/// How client commands reach the agent.
#[derive(Debug, clap::Args)]
struct Remote {
    /// The agent's address.
    #[arg(long, global = true, env = "CARAVAN_ADDR", default_value = caravan_host::commands::DEFAULT_ADDR)]
    address: String,
    /// The agent's ACL token, if it has one.
    #[arg(long, global = true, env = "CARAVAN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum RunnerCommand {
    /// Drive a runner through the contract and print one line per check. Exits 0 only when
    /// every required check passes.
    Check {
        /// The runner component (`.wasm`).
        component: PathBuf,
        /// How long `kill` and `shutdown` may take.
        #[arg(long, default_value = "5s", value_parser = caravan_host::units::parse_duration)]
        kill_timeout: std::time::Duration,
        /// Keep compiled components here, so the next check or run does not compile them
        /// again.
        #[arg(long, env = "CARAVAN_CACHE_DIR", value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Register a job from a TOML file (or update it when its id exists), then wait until its
    /// new allocs run. Exits non-zero if any fails.
    Run {
        /// The job file.
        file: PathBuf,
        /// Return once the job is registered, without waiting.
        #[arg(long)]
        detach: bool,
    },
    /// List jobs, or show one job and its allocs.
    Status {
        /// A job id.
        id: Option<String>,
    },
    /// Stop a job's allocs.
    Stop {
        /// The job id.
        id: String,
        /// Also remove the job once its allocs are collected.
        #[arg(long)]
        purge: bool,
    },
    /// Change a job's count.
    Scale {
        /// The job id.
        id: String,
        /// The new count.
        count: i64,
    },
}

#[derive(Debug, Subcommand)]
enum AllocCommand {
    /// Show one alloc, with its tasks and their events.
    Status {
        /// An alloc id or a unique prefix of one.
        id: String,
    },
    /// Stop one alloc.
    Stop {
        /// An alloc id or a unique prefix of one.
        id: String,
    },
    /// Send a signal to the alloc's tasks (what it means is up to the runner).
    Signal {
        /// An alloc id or a unique prefix of one.
        id: String,
        /// The signal, such as SIGHUP or SIGUSR1 (SIGKILL when not given, as Nomad does).
        #[arg(short = 's', long, default_value = caravan_host::allocrunner::DEFAULT_SIGNAL)]
        signal: String,
        /// Only this task (default: every task of the alloc).
        #[arg(long)]
        task: Option<String>,
    },
    /// Restart the alloc's tasks in place.
    Restart {
        /// An alloc id or a unique prefix of one.
        id: String,
        /// Only this task (default: every task of the alloc).
        #[arg(long)]
        task: Option<String>,
    },
    /// Print what the alloc's runner logged (its guest lines, as kept in the alloc's log file).
    Logs {
        /// An alloc id or a unique prefix of one.
        id: String,
        /// Keep printing new lines until the alloc stops.
        #[arg(short = 'f', long)]
        follow: bool,
    },
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// List nodes.
    Status,
}

#[derive(Debug, Subcommand)]
enum SystemCommand {
    /// Run the server's garbage collection now.
    Gc,
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
            cache_dir,
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
                cache_dir,
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
                let mut interrupts = caravan_host::run::Interrupts::listen()?;
                let agent = Agent::start(agent_config).await?;
                interrupts.next().await;
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
        Command::Runner {
            command:
                RunnerCommand::Check {
                    component,
                    kill_timeout,
                    cache_dir,
                },
        } => {
            // Only the checks' own lines: the runner's logs are checked, not shown.
            let level = cli.log_level.unwrap_or_else(|| "off".into());
            if let Err(error) = caravan_host::telemetry::init(&level, cli.log_json) {
                eprintln!("error: {error:#}");
                return ExitCode::from(2);
            }
            match runtime.block_on(caravan_host::check::check(
                &component,
                kill_timeout,
                cache_dir,
            )) {
                Ok(results) => {
                    for result in &results {
                        println!("{}", result.line());
                    }
                    let failed = results.iter().filter(|r| r.required && !r.passed).count();
                    if failed == 0 {
                        println!("{}: every required check passed", component.display());
                        ExitCode::SUCCESS
                    } else {
                        println!("{}: {failed} required check(s) failed", component.display());
                        ExitCode::from(1)
                    }
                }
                Err(error) => {
                    eprintln!("error: {error:#}");
                    ExitCode::from(2)
                }
            }
        }
        command => match runtime.block_on(remote_command(command)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error:#}");
                ExitCode::from(1)
            }
        },
    }
}

/// Runs one of the client commands against the agent.
async fn remote_command(command: Command) -> anyhow::Result<()> {
    use caravan_host::commands::{Api, job_run, print_allocs, print_jobs, print_table};
    let print = |json: bool, value: &serde_json::Value, table: &dyn Fn(&serde_json::Value)| {
        if json {
            println!("{value}");
        } else {
            table(value);
        }
    };
    match command {
        Command::Job { command, remote } => {
            let api = Api::new(&remote.address, remote.token);
            match command {
                JobCommand::Run { file, detach } => {
                    job_run(&api, &file, remote.json, detach).await?
                }
                JobCommand::Status { id: None } => print(
                    remote.json,
                    &api.call("GET", "/v1/jobs", None).await?,
                    &print_jobs,
                ),
                JobCommand::Status { id: Some(id) } => {
                    let job = api.call("GET", &format!("/v1/job/{id}"), None).await?;
                    let allocs = api
                        .call("GET", &format!("/v1/job/{id}/allocations"), None)
                        .await?;
                    if remote.json {
                        println!(
                            "{}",
                            serde_json::json!({ "job": job, "allocations": allocs })
                        );
                    } else {
                        print_jobs(&serde_json::Value::Array(vec![job]));
                        println!();
                        print_allocs(&allocs);
                    }
                }
                JobCommand::Stop { id, purge } => {
                    let answer = api
                        .call("DELETE", &format!("/v1/job/{id}?purge={purge}"), None)
                        .await?;
                    print(remote.json, &answer, &|a| {
                        println!(
                            "job {id} stopped: {} allocs asked to stop",
                            a["stopped"].as_array().map_or(0, Vec::len)
                        )
                    });
                }
                JobCommand::Scale { id, count } => {
                    let body = serde_json::json!({ "count": count });
                    let answer = api
                        .call("POST", &format!("/v1/job/{id}/scale"), Some(body))
                        .await?;
                    print(remote.json, &answer, &|a| {
                        let n = |key: &str| a[key].as_array().map_or(0, Vec::len);
                        println!(
                            "job {id} scaled to {count}: {} placed, {} stopped",
                            n("placed"),
                            n("stopped")
                        )
                    });
                }
            }
        }
        Command::Alloc { command, remote } => {
            let api = Api::new(&remote.address, remote.token);
            match command {
                AllocCommand::Status { id } => {
                    let alloc = api
                        .call("GET", &format!("/v1/allocation/{id}"), None)
                        .await?;
                    print(remote.json, &alloc, &|a| {
                        print_allocs(&serde_json::Value::Array(vec![a.clone()]));
                        for task in a["task_states"].as_array().into_iter().flatten() {
                            println!(
                                "\nTask {} is {}",
                                task["name"].as_str().unwrap_or("?"),
                                task["state"].as_str().unwrap_or("?")
                            );
                            let rows: Vec<Vec<String>> = task["events"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .map(|e| {
                                    vec![
                                        e["time_unix_ms"].to_string(),
                                        e["kind"].as_str().unwrap_or("").into(),
                                        e["message"].as_str().unwrap_or("").into(),
                                    ]
                                })
                                .collect();
                            print_table(&["Time (unix ms)", "Type", "Description"], &rows);
                        }
                    });
                }
                AllocCommand::Logs { id, follow } => {
                    api.stream_to_stdout(&format!(
                        "/v1/client/allocation/{id}/logs?follow={follow}"
                    ))
                    .await?;
                }
                AllocCommand::Signal { id, signal, task } => {
                    let body = serde_json::json!({ "signal": signal, "task": task });
                    let path = format!("/v1/client/allocation/{id}/signal");
                    let answer = api.call("POST", &path, Some(body)).await?;
                    print(remote.json, &answer, &|a| {
                        let to = task
                            .as_ref()
                            .map_or("every task".into(), |t| format!("task {t}"));
                        println!(
                            "alloc {}: sent {} to {to}",
                            a["alloc_id"].as_str().unwrap_or("?"),
                            a["signal"].as_str().unwrap_or("?")
                        )
                    });
                }
                AllocCommand::Restart { id, task } => {
                    let body = serde_json::json!({ "task": task });
                    let path = format!("/v1/client/allocation/{id}/restart");
                    let answer = api.call("POST", &path, Some(body)).await?;
                    print(remote.json, &answer, &|a| {
                        let of = task
                            .as_ref()
                            .map_or("every task".into(), |t| format!("task {t}"));
                        println!(
                            "alloc {}: asked {of} to restart",
                            a["alloc_id"].as_str().unwrap_or("?")
                        )
                    });
                }
                AllocCommand::Stop { id } => {
                    let answer = api
                        .call("POST", &format!("/v1/allocation/{id}/stop"), None)
                        .await?;
                    print(remote.json, &answer, &|a| {
                        println!(
                            "alloc {} asked to stop",
                            a["alloc_id"].as_str().unwrap_or("?")
                        )
                    });
                }
            }
        }
        Command::Node {
            command: NodeCommand::Status,
            remote,
        } => {
            let nodes = Api::new(&remote.address, remote.token)
                .call("GET", "/v1/nodes", None)
                .await?;
            print(remote.json, &nodes, &|n| {
                let rows: Vec<Vec<String>> = n
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|node| {
                        vec![
                            node["id"].as_str().unwrap_or("").into(),
                            node["status"].as_str().unwrap_or("").into(),
                            node["allocs"].to_string(),
                        ]
                    })
                    .collect();
                print_table(&["ID", "Status", "Allocs"], &rows);
            });
        }
        Command::System {
            command: SystemCommand::Gc,
            remote,
        } => {
            let answer = Api::new(&remote.address, remote.token)
                .call("PUT", "/v1/system/gc", None)
                .await?;
            print(remote.json, &answer, &|a| {
                println!(
                    "removed {} allocs",
                    a["removed"].as_array().map_or(0, Vec::len)
                )
            });
        }
        Command::Run { .. } | Command::Agent { .. } | Command::Runner { .. } => {
            unreachable!("handled in main")
        }
    }
    Ok(())
}
