//! `caravan job ...`: register, list, stop and scale jobs on the agent.

use super::Remote;
use super::table::{print_allocs, print_jobs, short, text};
use crate::model::jobspec;
use anyhow::{Context, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long `job run` waits for new allocs to leave `pending`.
const JOB_RUN_WAIT: Duration = Duration::from_secs(300);

/// `caravan job`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum JobCommand {
    /// Register a job from a TOML file (or update it when its id exists), then wait until its
    /// new allocs run (a batch job's: until they finish). Exits non-zero if any fails.
    /// Ctrl-C stops the wait, not the job.
    Run {
        /// The job file.
        file: PathBuf,
        /// Return once the job is registered, without waiting.
        #[arg(long)]
        detach: bool,
    },
    /// Check a job file as `job run` would (the file, the limits and capabilities against the
    /// agent's, the runner component) and change nothing.
    Validate {
        /// The job file.
        file: PathBuf,
    },
    /// Show what `job run` of a job file would do (allocs placed, stopped or replaced, as
    /// Nomad's plan shows) and change nothing.
    Plan {
        /// The job file.
        file: PathBuf,
    },
    /// List jobs, or show one job and its allocs.
    Status {
        /// A job id.
        id: Option<String>,
        /// List only this namespace's jobs (`*`, the default: every namespace).
        #[arg(long)]
        namespace: Option<String>,
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

impl JobCommand {
    /// Runs the subcommand against the agent.
    pub async fn execute(self, remote: &Remote) -> anyhow::Result<()> {
        match self {
            JobCommand::Run { file, detach } => run(remote, &file, detach).await,
            JobCommand::Validate { file } => validate(remote, &file).await,
            JobCommand::Plan { file } => plan(remote, &file).await,
            JobCommand::Status {
                id: None,
                namespace,
            } => list(remote, namespace.as_deref()).await,
            JobCommand::Status { id: Some(id), .. } => status(remote, &id).await,
            JobCommand::Stop { id, purge } => stop(remote, &id, purge).await,
            JobCommand::Scale { id, count } => scale(remote, &id, count).await,
        }
    }
}

/// `job status`: every job, or one namespace's.
async fn list(remote: &Remote, namespace: Option<&str>) -> anyhow::Result<()> {
    let path = match namespace {
        Some(namespace) => {
            crate::model::jobspec::check_namespace(namespace)
                .or_else(|problem| {
                    if namespace == "*" {
                        Ok(())
                    } else {
                        Err(problem)
                    }
                })
                .map_err(|problem| anyhow::anyhow!("--namespace: {problem}"))?;
            format!("/v1/jobs?namespace={namespace}")
        }
        None => "/v1/jobs".to_string(),
    };
    let jobs = remote.api.call("GET", &path, None).await?;
    remote.print(&jobs, print_jobs);
    Ok(())
}

/// `job status ID`: one job and its allocs.
async fn status(remote: &Remote, id: &str) -> anyhow::Result<()> {
    let job = remote
        .api
        .call("GET", &format!("/v1/job/{id}"), None)
        .await?;
    let allocs = remote
        .api
        .call("GET", &format!("/v1/job/{id}/allocations"), None)
        .await?;
    if remote.json {
        println!(
            "{}",
            serde_json::json!({ "job": job, "allocations": allocs })
        );
    } else {
        print_jobs(&Value::Array(vec![job.clone()]));
        if let Some(recovery) = job["recovery"].as_str() {
            println!("Recovery: {}", crate::util::text::escape_controls(recovery));
        }
        if let Some(line) = blocked_line(&job) {
            println!("Placement: {line}");
        }
        println!();
        print_allocs(&allocs);
    }
    Ok(())
}

/// `job stop ID [--purge]`.
async fn stop(remote: &Remote, id: &str, purge: bool) -> anyhow::Result<()> {
    let answer = remote
        .api
        .call("DELETE", &format!("/v1/job/{id}?purge={purge}"), None)
        .await?;
    remote.print(&answer, |a| {
        let stopped = a["stopped"].as_array().map_or(0, Vec::len);
        let purge = if a["removed"] == true {
            "; purged: the job is removed"
        } else if a["purged"] == true {
            "; purged: the job is removed once its allocs are collected \
             (`caravan system gc` collects them now)"
        } else {
            ""
        };
        println!("job {id} stopped: {stopped} allocs asked to stop{purge}")
    });
    Ok(())
}

/// `job scale ID COUNT`.
async fn scale(remote: &Remote, id: &str, count: i64) -> anyhow::Result<()> {
    let body = serde_json::json!({ "count": count });
    let answer = remote
        .api
        .call("POST", &format!("/v1/job/{id}/scale"), Some(body))
        .await?;
    remote.print(&answer, |a| {
        let n = |key: &str| a[key].as_array().map_or(0, Vec::len);
        println!(
            "job {id} scaled to {count}: {} placed, {} stopped",
            n("placed"),
            n("stopped")
        )
    });
    Ok(())
}

/// Reads and checks a job file, and returns it as the API's JSON document. A relative runner
/// path is taken relative to the job file, so `job run` works from any directory.
pub fn job_document(path: &Path) -> anyhow::Result<(String, Value)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read job file {}", path.display()))?;
    let spec = jobspec::check_toml(&text).map_err(|problems| {
        // Every problem at once, in file order, as `FILE:LINE:COLUMN: field: what`.
        let lines: Vec<String> = problems
            .iter()
            .map(|problem| match problem.line {
                0 => format!("{}: {}", path.display(), problem.error),
                line => format!(
                    "{}:{line}:{}: {}",
                    path.display(),
                    problem.column,
                    problem.error
                ),
            })
            .collect();
        anyhow::anyhow!("{}", lines.join("\n"))
    })?;
    let mut document: Value =
        serde_json::to_value(toml::from_str::<toml::Table>(&text).context("job file")?)?;
    let runner = Path::new(&spec.runner);
    if runner.is_relative() && !crate::runner_store::oci::is_oci(&spec.runner) {
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let absolute =
            std::path::absolute(base.join(runner)).context("resolving the runner path")?;
        document["job"]["runner"] =
            Value::String(jobspec::normalise_path(&absolute.to_string_lossy()));
    }
    Ok((spec.id, document))
}

/// [`job_document`], with the runner sent along: when the runner is a file on this machine
/// (and the job file names no build of its own), it is uploaded to the agent's runner store
/// (unless the agent has it) and the document names its build, so the job runs these bytes
/// on every node, whatever becomes of the file. A path this machine does not have is left
/// for the agent to read on its own disk.
async fn job_with_runner(remote: &Remote, path: &Path) -> anyhow::Result<(String, Value)> {
    let (job_id, mut document) = job_document(path)?;
    let runner = document["job"]["runner"]
        .as_str()
        .map(std::path::PathBuf::from);
    if let Some(runner) = runner
        && document["job"].get("runner_sha256").is_none()
        && runner.is_file()
    {
        let sha256 = remote.api.upload_runner(&runner).await?;
        document["job"]["runner_sha256"] = Value::String(sha256);
    }
    Ok((job_id, document))
}

/// `job validate FILE`.
async fn validate(remote: &Remote, path: &Path) -> anyhow::Result<()> {
    let (job_id, document) = job_with_runner(remote, path).await?;
    let answer = remote
        .api
        .call("POST", "/v1/validate/job", Some(document))
        .await?;
    remote.print(&answer, |a| {
        println!(
            "job {job_id} is valid: runner {} (sha256 {})",
            text(&a["runner"]),
            text(&a["runner_sha256"])
        )
    });
    Ok(())
}

/// `job plan FILE`: what registering it would do, in words.
async fn plan(remote: &Remote, path: &Path) -> anyhow::Result<()> {
    let (job_id, document) = job_with_runner(remote, path).await?;
    let answer = remote
        .api
        .call("POST", &format!("/v1/job/{job_id}/plan"), Some(document))
        .await?;
    remote.print(&answer, |a| {
        let version = text(&a["version"]);
        let headline = match a["change"].as_str().unwrap_or_default() {
            "create" => format!("+ job {job_id}: new, version {version}"),
            "replace" => format!(
                "+/- job {job_id}: version {} -> {version}: its runner, tasks, meta, limits, \
                 capabilities or restart policy changed, so every alloc is replaced",
                text(&a["current_version"])
            ),
            "upgrade" => format!(
                "~ job {job_id}: version {} -> {version}: only its runner (or, with \
                 carry_checkpoint, its tasks' config or meta) changed, so its allocs are \
                 upgraded in place, keeping their checkpoints",
                text(&a["current_version"])
            ),
            "scale" => format!("+/- job {job_id}: count changed, version {version} stays"),
            _ => format!("job {job_id}: no change (version {version})"),
        };
        println!("{headline}");
        let nodes: Vec<String> = a["place_by_node"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(node, n)| format!("{n} on {}", crate::util::text::escape_controls(node)))
            .collect();
        if !nodes.is_empty() {
            println!(
                "  place {} allocs ({})",
                text(&a["place"]),
                nodes.join(", ")
            );
        }
        let stop: Vec<String> = a["stop"]
            .as_array()
            .into_iter()
            .flatten()
            .map(short)
            .collect();
        if !stop.is_empty() {
            println!("  stop {} allocs: {}", stop.len(), stop.join(", "));
        }
        let upgrade: Vec<String> = a["upgrade"]
            .as_array()
            .into_iter()
            .flatten()
            .map(short)
            .collect();
        if !upgrade.is_empty() {
            println!(
                "  upgrade {} allocs in place: {}",
                upgrade.len(),
                upgrade.join(", ")
            );
        }
        if let Some(blocked) = a["blocked"].as_str() {
            println!("  {}", crate::util::text::escape_controls(blocked));
        }
        println!(
            "runner sha256 {}; nothing was changed",
            text(&a["runner_sha256"])
        );
    });
    Ok(())
}

/// `job run` ended because allocs of the job fit on no node: the exit status is 2, as
/// Nomad's for placement failures.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlacementFailed(pub String);

/// A job view's waiting allocs as one line (`2 allocs not placed: no node has ...`).
fn blocked_line(job: &Value) -> Option<String> {
    let blocked = job.get("blocked").filter(|b| !b.is_null())?;
    let allocs = blocked["allocs"].as_u64().unwrap_or(0);
    let noun = if allocs == 1 { "alloc" } else { "allocs" };
    Some(format!(
        "{allocs} {noun} not placed: {}",
        crate::util::text::escape_controls(&text(&blocked["reason"]))
    ))
}

/// `job run`: registers the job, then waits until every alloc it placed is running or
/// finished, printing progress. Fails when any of them failed.
async fn run(remote: &Remote, path: &Path, detach: bool) -> anyhow::Result<()> {
    let Remote { api, json } = remote;
    let json = *json;
    let (job_id, document) = job_with_runner(remote, path).await?;
    // A batch job's allocs are waited for until they finish, as its result is what is run.
    let batch = document["job"]["type"] == "batch";
    let registration = api.call("POST", "/v1/jobs", Some(document)).await?;
    let placed: Vec<String> = registration["placed"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    if !json {
        let verb = if registration["created"] == true {
            "registered"
        } else {
            "updated"
        };
        let upgraded = match registration["upgraded"].as_array().map_or(0, Vec::len) {
            0 => String::new(),
            n => format!(", {n} upgraded in place"),
        };
        println!(
            "job {job_id} {verb}: {} allocs placed, {} stopped{upgraded}",
            placed.len(),
            registration["stopped"].as_array().map_or(0, Vec::len)
        );
    }
    if detach || placed.is_empty() {
        if json {
            println!("{registration}");
        }
        return Ok(());
    }
    let mut last_line = String::new();
    let started = std::time::Instant::now();
    loop {
        let allocs = api
            .call("GET", &format!("/v1/job/{job_id}/allocations"), None)
            .await?;
        let mine: Vec<&Value> = allocs
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| placed.contains(&text(&a["id"])))
            .collect();
        let count = |status: &str| mine.iter().filter(|a| a["client_status"] == status).count();
        let (pending, running, complete, failed) = (
            count("pending"),
            count("running"),
            count("complete"),
            count("failed"),
        );
        let line = format!(
            "allocs: {pending} pending, {running} running, {complete} complete, {failed} failed"
        );
        if !json && line != last_line {
            println!("{line}");
            last_line = line;
        }
        // Placed allocs that vanished (collected, scaled away) no longer hold the wait.
        if pending == 0 && (!batch || running == 0) {
            if json {
                println!("{}", Value::Array(mine.into_iter().cloned().collect()));
            }
            if failed > 0 {
                bail!(
                    "{failed} of {} allocs failed; see `caravan job status {job_id}`",
                    placed.len()
                );
            }
            return Ok(());
        }
        if pending > 0 {
            // Allocs that fit on no registered node end the wait, as Nomad's placement
            // failures do: the job stays, and they are placed once a node can hold them.
            let job = api.call("GET", &format!("/v1/job/{job_id}"), None).await?;
            if let Some(line) = blocked_line(&job)
                && job["blocked"]["nodes"].as_u64().unwrap_or(0) > 0
            {
                return Err(PlacementFailed(format!(
                    "job {job_id} is registered, but {line}; they are placed once a node can \
                     hold them (see `caravan job status {job_id}`)"
                ))
                .into());
            }
        }
        // Only a start is timed: a batch alloc may run as long as its job wants.
        if pending > 0 && started.elapsed() > JOB_RUN_WAIT {
            bail!(
                "gave up after {} s waiting for the allocs of {job_id} to start; see `caravan job status {job_id}`",
                JOB_RUN_WAIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
