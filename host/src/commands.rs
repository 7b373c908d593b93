//! The CLI's client commands (`caravan job ...`, `alloc ...`, `node status`, `system gc`):
//! each one HTTP request (or a few) to the agent at `CARAVAN_ADDR`, printed as a table or,
//! with `--json`, as the API's JSON.
//!
//! This module talks to the agent over HTTP only; it never links the server or the client.

use crate::jobspec;
use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// How long `job run` waits for new allocs to leave `pending`.
const JOB_RUN_WAIT: Duration = Duration::from_secs(300);

/// Where the agent is when `CARAVAN_ADDR` is not set.
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:4646";

/// An HTTP client for the agent's API.
pub struct Api {
    addr: String,
    token: Option<String>,
    http: HttpClient<HttpConnector, Full<Bytes>>,
}

impl Api {
    /// A client of the agent at `addr` (`http://HOST:PORT`), sending `token` if given.
    pub fn new(addr: &str, token: Option<String>) -> Self {
        let http = HttpClient::builder(TokioExecutor::new()).build_http();
        Api {
            addr: addr.trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
            http,
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.addr));
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = request
            .header("Content-Type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .with_context(|| format!("invalid agent address {:?}", self.addr))?;
        self.http.request(request).await.map_err(|error| {
            anyhow::anyhow!(
                "cannot reach the Caravan agent at {} ({}); start one with `caravan agent --dev`, or set CARAVAN_ADDR",
                self.addr,
                root_cause(&error)
            )
        })
    }

    /// Sends one request; returns the JSON body of a 2xx answer, or the API's error message.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let response = self.send(method, path, body).await?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .context("reading the agent's answer")?
            .to_bytes();
        let value: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        if !status.is_success() {
            let message = value["error"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            bail!("{message} ({})", status.as_u16());
        }
        Ok(value)
    }

    /// Sends a GET and copies the body to stdout as it arrives (for followed logs).
    pub async fn stream_to_stdout(&self, path: &str) -> anyhow::Result<()> {
        use std::io::Write;
        let response = self.send("GET", path, None).await?;
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = body
                .collect()
                .await
                .context("reading the agent's answer")?
                .to_bytes();
            let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            bail!(
                "{} ({})",
                value["error"].as_str().unwrap_or("request failed"),
                status.as_u16()
            );
        }
        let mut stdout = std::io::stdout();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.context("reading the agent's answer")?.into_data() {
                stdout.write_all(&data)?;
                stdout.flush()?;
            }
        }
        Ok(())
    }
}

fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// Reads and checks a job file, and returns it as the API's JSON document. A relative runner
/// path is taken relative to the job file, so `job run` works from any directory.
pub fn job_document(path: &Path) -> anyhow::Result<(String, Value)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read job file {}", path.display()))?;
    let spec =
        jobspec::parse_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut document: Value =
        serde_json::to_value(toml::from_str::<toml::Table>(&text).context("job file")?)?;
    let runner = Path::new(&spec.runner);
    if runner.is_relative() {
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let absolute =
            std::path::absolute(base.join(runner)).context("resolving the runner path")?;
        document["job"]["runner"] = Value::String(absolute.display().to_string());
    }
    Ok((spec.id, document))
}

/// Prints rows as a table with a header, columns padded to fit.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn short(id: &Value) -> String {
    text(id).chars().take(8).collect()
}

/// Prints allocs as Nomad's `job status` does.
pub fn print_allocs(allocs: &Value) {
    let rows: Vec<Vec<String>> = allocs
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            vec![
                short(&a["id"]),
                text(&a["job_id"]),
                text(&a["node_id"]),
                text(&a["desired_status"]),
                text(&a["client_status"]),
                text(&a["description"]),
            ]
        })
        .collect();
    print_table(
        &["ID", "Job", "Node", "Desired", "Status", "Description"],
        &rows,
    );
}

/// Prints jobs as a table.
pub fn print_jobs(jobs: &Value) {
    let rows: Vec<Vec<String>> = jobs
        .as_array()
        .into_iter()
        .flatten()
        .map(|j| {
            let allocs = j["allocs"].as_object().map(|m| {
                m.iter()
                    .map(|(status, n)| format!("{status}={n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            vec![
                text(&j["id"]),
                text(&j["type"]),
                text(&j["count"]),
                text(&j["status"]),
                allocs.unwrap_or_default(),
            ]
        })
        .collect();
    print_table(&["ID", "Type", "Count", "Status", "Allocs"], &rows);
}

/// `job run`: registers the job, then waits until every alloc it placed is running or
/// finished, printing progress. Fails when any of them failed.
pub async fn job_run(api: &Api, path: &Path, json: bool, detach: bool) -> anyhow::Result<()> {
    let (job_id, document) = job_document(path)?;
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
        println!(
            "job {job_id} {verb}: {} allocs placed, {} stopped",
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
        if pending == 0 {
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
        if started.elapsed() > JOB_RUN_WAIT {
            bail!(
                "gave up after {} s waiting for the allocs of {job_id} to start; see `caravan job status {job_id}`",
                JOB_RUN_WAIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
