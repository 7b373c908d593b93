//! `caravan alloc ...`: look at and act on one alloc. Each subcommand is one variant of
//! [`AllocCommand`] and one function here.

use super::Remote;
use super::table::{print_table, short, text};

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
    /// List a directory of the alloc's files, or print a file (as Nomad's `alloc fs`).
    ///
    /// PATH is relative to the alloc dir, or starts with /alloc as the runner sees it
    /// (default: the alloc dir). A file is printed as it is when stdout is not a terminal;
    /// on a terminal its control characters are escaped.
    Fs {
        /// An alloc id or a unique prefix of one.
        id: String,
        /// A file or directory in the alloc dir.
        path: Option<String>,
    },
    /// Print what the alloc's runner logged (its guest lines, as kept in the alloc's log file);
    /// with --json, one object per line: time, level, source, message.
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
            AllocCommand::Fs { id, path } => fs(remote, &id, path.as_deref().unwrap_or("")).await,
        }
    }
}

/// How many of the alloc log's last lines `alloc status` shows.
const RECENT_LOG_LINES: usize = 5;

/// The limits `alloc status` shows (every one is in its JSON).
const SHOWN_LIMITS: [&str; 6] = [
    "memory",
    "cpu",
    "cpu_share",
    "disk",
    "kill_timeout",
    "wall_time",
];

/// `alloc status ID`: the alloc as Nomad shows one (its ids, where it runs, its status and
/// why), what its agent adds (its dir, its limits, its last log lines), then each task's
/// state and events.
async fn status(remote: &Remote, id: &str) -> anyhow::Result<()> {
    let alloc = remote
        .api
        .call("GET", &format!("/v1/allocation/{id}"), None)
        .await?;
    if remote.json {
        remote.print(&alloc, |_| {});
        return Ok(());
    }
    // In a cluster the agent asked may not run the alloc: the one that does adds what only
    // it knows (the request is routed to it).
    let local = if alloc["local"].is_object() || !alloc["node_id"].is_string() {
        alloc["local"].clone()
    } else {
        let path = format!("/v1/client/allocation/{}", text(&alloc["id"]));
        remote
            .api
            .call("GET", &path, None)
            .await
            .unwrap_or_default()
    };
    let local = &local;
    // The log is only on the agent whose client runs the alloc; elsewhere there is none.
    let recent_log = if local.is_object() {
        let path = format!("/v1/client/allocation/{}/logs", text(&alloc["id"]));
        remote.api.get_bytes(&path).await.ok()
    } else {
        None
    };
    let mut rows = vec![
        ("ID", text(&alloc["id"])),
        (
            "Job ID",
            format!(
                "{} (version {})",
                text(&alloc["job_id"]),
                text(&alloc["job_version"])
            ),
        ),
        ("Node ID", text(&alloc["node_id"])),
        (
            "Runner",
            runner_line(&alloc["runner"], &local["runner_sha256"]),
        ),
        ("Desired Status", text(&alloc["desired_status"])),
        ("Client Status", text(&alloc["client_status"])),
        ("Client Description", text(&alloc["description"])),
    ];
    let reschedule = &alloc["reschedule"];
    if reschedule.is_object() {
        let previous = short(&reschedule["previous_alloc_id"]);
        rows.push((
            "Replaces",
            format!(
                "alloc {previous} (reschedule {}, not before {})",
                text(&reschedule["attempt"]),
                local_time(&reschedule["start_after_unix_ms"])
            ),
        ));
    }
    if local.is_object() {
        // A runner that reaches no files has no dir (and `alloc fs` says so).
        if local["alloc_dir"].is_string() {
            rows.push(("Alloc Dir", text(&local["alloc_dir"])));
        }
        let limits: Vec<String> = local["limits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|pair| SHOWN_LIMITS.iter().any(|key| pair[0] == *key))
            .map(|pair| format!("{}={}", text(&pair[0]), text(&pair[1])))
            .collect();
        rows.push(("Limits", limits.join(", ")));
        if let (Some(cpu_us), Some(memory)) = (
            local["cpu_used_us"].as_u64(),
            local["memory_peak_bytes"].as_u64(),
        ) {
            let cpu = std::time::Duration::from_micros(cpu_us);
            rows.push(("CPU Used", format!("{cpu:.1?}")));
            rows.push((
                "Memory Peak",
                crate::util::units::format_bytes_approx(memory),
            ));
        }
        let upgrade = &local["upgrade"];
        if upgrade.is_object() {
            rows.push(("Last Upgrade", upgrade_line(upgrade)));
        }
    }
    let width = rows.iter().map(|(key, _)| key.len()).max().unwrap_or(0);
    for (key, value) in rows {
        println!("{key:<width$} = {value}");
    }
    if let Some(log) = recent_log {
        let log = String::from_utf8_lossy(&log);
        let lines: Vec<&str> = log.lines().collect();
        println!("\nRecent Log Lines:");
        for line in &lines[lines.len().saturating_sub(RECENT_LOG_LINES)..] {
            println!("{}", crate::util::text::escape_controls(line));
        }
    }
    for task in alloc["task_states"].as_array().into_iter().flatten() {
        let failed = if task["failed"] == true {
            "failed, "
        } else {
            ""
        };
        println!(
            "\nTask {:?} is {:?} ({failed}{} restarts)",
            text(&task["name"]),
            text(&task["state"]),
            text(&task["restarts"])
        );
        let rows: Vec<Vec<String>> = task["events"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                vec![
                    local_time(&e["time_unix_ms"]),
                    e["kind"].as_str().unwrap_or("").into(),
                    e["message"].as_str().unwrap_or("").into(),
                ]
            })
            .collect();
        print_table(&["Time", "Type", "Description"], &rows);
    }
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

/// `alloc logs [-f] ID`: the log as it is kept, line by line; with `--json`, each line as an
/// object (`time`, `level`, `source`, `message`).
async fn logs(remote: &Remote, id: &str, follow: bool) -> anyhow::Result<()> {
    let path = format!("/v1/client/allocation/{id}/logs?follow={follow}");
    if !remote.json {
        return remote.api.stream_to_stdout(&path).await;
    }
    let mut stdout = std::io::stdout();
    let mut partial: Vec<u8> = Vec::new();
    remote
        .api
        .stream(&path, |chunk| {
            partial.extend_from_slice(chunk);
            let Some(end) = partial.iter().rposition(|&b| b == b'\n') else {
                return Ok(());
            };
            let complete: Vec<u8> = partial.drain(..=end).collect();
            print_log_lines_as_json(&mut stdout, &complete)
        })
        .await?;
    // A last line without its newline (the file cut short) is a line all the same.
    print_log_lines_as_json(&mut stdout, &partial)?;
    Ok(())
}

/// Each line of `text` (lines of an alloc log file) as one JSON object.
fn print_log_lines_as_json(out: &mut impl std::io::Write, text: &[u8]) -> std::io::Result<()> {
    for line in String::from_utf8_lossy(text).lines() {
        // Every line of the file parses; anything else is passed on whole.
        let object = match crate::alloc_logs::parse_line(line) {
            Some(parsed) => serde_json::to_string(&parsed),
            None => serde_json::to_string(&serde_json::json!({ "message": line })),
        }
        .map_err(std::io::Error::other)?;
        writeln!(out, "{object}")?;
    }
    out.flush()
}

/// `alloc fs ID [PATH]`: a directory's entries as a table, or a file's bytes.
async fn fs(remote: &Remote, id: &str, path: &str) -> anyhow::Result<()> {
    let query = query_value(path);
    let stat = remote
        .api
        .call("GET", &format!("/v1/client/fs/ls/{id}?path={query}"), None)
        .await?;
    if stat["kind"] == "file" && !remote.json {
        let bytes = remote
            .api
            .get_bytes(&format!("/v1/client/fs/cat/{id}?path={query}"))
            .await?;
        return print_file(&bytes);
    }
    remote.print(&stat, |s| {
        let rows: Vec<Vec<String>> = s["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                vec![
                    text(&e["kind"]),
                    e["size"].to_string(),
                    local_time(&e["modified_unix_ms"]),
                    text(&e["name"]),
                ]
            })
            .collect();
        print_table(&["Kind", "Size", "Modified", "Name"], &rows);
        if let Some(more) = s["entries_not_listed"].as_u64().filter(|n| *n > 0) {
            println!("({more} more entries not listed)");
        }
    });
    Ok(())
}

/// `path` for a query string: every byte but unreserved ones percent-encoded.
fn query_value(path: &str) -> String {
    path.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A guest's file on stdout: as it is into a pipe or file, escaped for a terminal.
fn print_file(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let mut stdout = std::io::stdout();
    if stdout.is_terminal() {
        let text = String::from_utf8_lossy(bytes);
        for line in text.split_inclusive('\n') {
            let body = line.strip_suffix('\n');
            write!(
                stdout,
                "{}",
                crate::util::text::escape_controls(body.unwrap_or(line))
            )?;
            if body.is_some() {
                writeln!(stdout)?;
            }
        }
    } else {
        stdout.write_all(bytes)?;
    }
    stdout.flush()?;
    Ok(())
}

/// Milliseconds since the epoch as a local date and time, to the second, with the offset.
/// The runner as a path, and which build runs when its agent says:
/// `/jobs/sleeper.wasm (sha256 1a2b3c4d5e6f)`.
fn runner_line(path: &serde_json::Value, sha256: &serde_json::Value) -> String {
    match sha256.as_str() {
        Some(hash) => format!(
            "{} (sha256 {})",
            text(path),
            crate::allocrunner::short_hash(hash)
        ),
        None => text(path),
    }
}

/// `done: 0123456789ab -> ba9876543210 (at TIME)`, or with `failed` the reason.
fn upgrade_line(upgrade: &serde_json::Value) -> String {
    // `to` is the runner's path when its build could not be loaded: shown whole.
    let short_hash = |value: &serde_json::Value| {
        let full = text(value);
        match full.chars().all(|c| c.is_ascii_hexdigit()) {
            true => crate::allocrunner::short_hash(&full).to_string(),
            false => full,
        }
    };
    let mut line = format!(
        "{}: {} -> {} (asked {})",
        text(&upgrade["status"]).replace('_', " "),
        short_hash(&upgrade["from_sha256"]),
        short_hash(&upgrade["to"]),
        local_time(&upgrade["asked_unix_ms"])
    );
    if let Some(reason) = upgrade["reason"].as_str() {
        line.push_str(&format!(": {}", crate::util::text::escape_controls(reason)));
    }
    line
}

fn local_time(unix_ms: &serde_json::Value) -> String {
    let Some(ms) = unix_ms.as_i64().and_then(|ms| u64::try_from(ms).ok()) else {
        return "-".into();
    };
    let mut text = String::new();
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    let _ = crate::util::timestamp::write_local(&mut text, at);
    text
}
