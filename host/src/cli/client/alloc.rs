//! `caravan alloc ...`: look at and act on one alloc. Each subcommand is one variant of
//! [`AllocCommand`] and one function here.

use super::Remote;
use super::table::{print_allocs, print_table, text};
use serde_json::Value;

/// `caravan alloc`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum AllocCommand {
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
        #[arg(short = 's', long, default_value = crate::allocrunner::DEFAULT_SIGNAL)]
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

impl AllocCommand {
    /// Runs the subcommand against the agent.
    pub async fn execute(self, remote: &Remote) -> anyhow::Result<()> {
        match self {
            AllocCommand::Status { id } => status(remote, &id).await,
            AllocCommand::Stop { id } => stop(remote, &id).await,
            AllocCommand::Signal { id, signal, task } => {
                send_signal(remote, &id, &signal, task.as_deref()).await
            }
            AllocCommand::Restart { id, task } => restart(remote, &id, task.as_deref()).await,
            AllocCommand::Logs { id, follow } => logs(remote, &id, follow).await,
        }
    }
}

/// `alloc status ID`: the alloc, then each task's state and events.
async fn status(remote: &Remote, id: &str) -> anyhow::Result<()> {
    let alloc = remote
        .api
        .call("GET", &format!("/v1/allocation/{id}"), None)
        .await?;
    remote.print(&alloc, |a| {
        print_allocs(&Value::Array(vec![a.clone()]));
        for task in a["task_states"].as_array().into_iter().flatten() {
            println!("\nTask {} is {}", text(&task["name"]), text(&task["state"]));
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
    Ok(())
}

/// `alloc stop ID`.
async fn stop(remote: &Remote, id: &str) -> anyhow::Result<()> {
    let answer = remote
        .api
        .call("POST", &format!("/v1/allocation/{id}/stop"), None)
        .await?;
    remote.print(&answer, |a| {
        println!(
            "alloc {} asked to stop",
            a["alloc_id"].as_str().unwrap_or("?")
        )
    });
    Ok(())
}

/// Which tasks a request names, for the line printed.
fn tasks_named(task: Option<&str>) -> String {
    task.map_or("every task".into(), |task| format!("task {task}"))
}

/// `alloc signal [-s SIGNAL] [--task T] ID`.
async fn send_signal(
    remote: &Remote,
    id: &str,
    signal: &str,
    task: Option<&str>,
) -> anyhow::Result<()> {
    let body = serde_json::json!({ "signal": signal, "task": task });
    let path = format!("/v1/client/allocation/{id}/signal");
    let answer = remote.api.call("POST", &path, Some(body)).await?;
    remote.print(&answer, |a| {
        println!(
            "alloc {}: sent {} to {}",
            a["alloc_id"].as_str().unwrap_or("?"),
            a["signal"].as_str().unwrap_or("?"),
            tasks_named(task)
        )
    });
    Ok(())
}

/// `alloc restart [--task T] ID`.
async fn restart(remote: &Remote, id: &str, task: Option<&str>) -> anyhow::Result<()> {
    let body = serde_json::json!({ "task": task });
    let path = format!("/v1/client/allocation/{id}/restart");
    let answer = remote.api.call("POST", &path, Some(body)).await?;
    remote.print(&answer, |a| {
        println!(
            "alloc {}: asked {} to restart",
            a["alloc_id"].as_str().unwrap_or("?"),
            tasks_named(task)
        )
    });
    Ok(())
}

/// `alloc logs [-f] ID`: the log as it arrives, whatever `--json` says.
async fn logs(remote: &Remote, id: &str, follow: bool) -> anyhow::Result<()> {
    remote
        .api
        .stream_to_stdout(&format!("/v1/client/allocation/{id}/logs?follow={follow}"))
        .await
}
