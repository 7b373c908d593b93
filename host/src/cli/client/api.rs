//! What the client commands send to the agent: one request, its JSON answer or the API's
//! error message, a file's bytes, and a streamed body for followed logs, over the one HTTP
//! client ([`crate::rpc::transport`]).
//!
//! It knows the API's error shape (`{"error": ...}`) and nothing of any endpoint.

use crate::rpc::transport::{AgentApi, AgentPool, Unanswered, error_message, read_body};
use anyhow::{Context, bail};
use axum::body::Body;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use serde_json::Value;
use std::time::Duration;

/// How long one command's request may take: the API answers at once (a command that waits
/// for allocs asks again and again).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The most a command reads of one answer: an alloc's file or log, a long list of allocs.
const MAX_ANSWER_BYTES: usize = 256 << 20;

/// An HTTP client for the agent's API.
pub struct Api {
    api: AgentApi,
    verbose: bool,
}

impl Api {
    /// A client of the agent at `addr` (`http://HOST:PORT`, or `https://` on a TLS pool),
    /// on `pool`, sending `token` if given; refuses an address of another form, naming it.
    pub fn new(pool: &AgentPool, addr: &str, token: Option<String>) -> anyhow::Result<Self> {
        Ok(Api {
            api: pool.agent(addr, token)?,
            verbose: false,
        })
    }

    /// With `verbose`, a refusal also says the HTTP status it came with (`--verbose`); the
    /// message alone says what is wrong, and the exit status that the command failed.
    pub fn verbose(self, verbose: bool) -> Self {
        Api { verbose, ..self }
    }

    /// A refusal's line: the API's message, and the status with `--verbose`.
    fn refused(&self, message: &str, status: StatusCode) -> anyhow::Error {
        if self.verbose {
            anyhow::anyhow!("{message} (HTTP {})", status.as_u16())
        } else {
            anyhow::anyhow!("{message}")
        }
    }

    /// How a command says it got no answer: an agent that could not be reached gets a hint
    /// on how to start or find one; one that was reached and did not answer in time, or
    /// whose answer could not be read, is named with what went wrong.
    fn unreachable(&self, error: Unanswered) -> anyhow::Error {
        if error.timed_out || error.reason.starts_with("reading the answer") {
            return anyhow::anyhow!("the Caravan agent at {}: {}", self.api.base(), error.reason);
        }
        anyhow::anyhow!(
            "cannot reach the Caravan agent at {} ({}); start one with `caravan agent --dev`, or set CARAVAN_ADDR",
            self.api.base(),
            error.reason
        )
    }

    fn method(method: &str) -> anyhow::Result<Method> {
        Method::from_bytes(method.as_bytes()).with_context(|| format!("no HTTP method {method}"))
    }

    /// Sends one request and reads its whole answer.
    async fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(hyper::StatusCode, bytes::Bytes)> {
        let body = body.map(|b| Body::from(b.to_string())).unwrap_or_default();
        self.api
            .exchange(
                Self::method(method)?,
                path,
                body,
                CALL_TIMEOUT,
                MAX_ANSWER_BYTES,
            )
            .await
            .map_err(|error| self.unreachable(error))
    }

    /// Sends one request; returns the JSON body of a 2xx answer, or the API's error message.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let (status, bytes) = self.exchange(method, path, body).await?;
        if !status.is_success() {
            return Err(self.refused(&error_message(&bytes), status));
        }
        Ok(serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())))
    }

    /// Makes sure the agent has the runner component at `path` (a file on this machine) in
    /// its runner store: asks whether it has the build, and uploads the file when it does
    /// not. Returns the build's SHA-256 (hex).
    pub async fn upload_runner(&self, path: &std::path::Path) -> anyhow::Result<String> {
        let max = crate::runner_store::MAX_BUILD_BYTES;
        let size = std::fs::metadata(path)
            .with_context(|| format!("cannot read runner {}", path.display()))?
            .len();
        if size > max {
            bail!(
                "runner {} is {size} bytes, over the limit of {max}",
                path.display()
            );
        }
        let file = path.to_path_buf();
        let bytes = tokio::task::spawn_blocking(move || std::fs::read(&file))
            .await?
            .with_context(|| format!("cannot read runner {}", path.display()))?;
        let sha256 = crate::runner_store::sha256_hex(&bytes);
        let at = format!("/v1/runner/{sha256}");
        let (status, _) = self
            .api
            .exchange(Method::HEAD, &at, Body::empty(), CALL_TIMEOUT, 0)
            .await
            .map_err(|error| self.unreachable(error))?;
        if status.is_success() {
            return Ok(sha256);
        }
        // The upload would be refused the same way, and answered before its body was read:
        // said now, from the HEAD's status (a HEAD answer has no body to quote).
        let refusal = match status {
            StatusCode::UNAUTHORIZED => Some("the agent needs a token: --token or CARAVAN_TOKEN"),
            StatusCode::FORBIDDEN => {
                Some("the agent refused this token (unknown, expired, or its role falls short)")
            }
            _ => None,
        };
        if let Some(refusal) = refusal {
            let message = format!("uploading runner {}: {refusal}", path.display());
            return Err(self.refused(&message, status));
        }
        let (status, answer) = self
            .api
            .exchange(
                Method::PUT,
                &at,
                Body::from(bytes),
                CALL_TIMEOUT,
                MAX_ANSWER_BYTES,
            )
            .await
            .map_err(|error| self.unreachable(error))?;
        if !status.is_success() {
            let message = format!(
                "uploading runner {}: {}",
                path.display(),
                error_message(&answer)
            );
            return Err(self.refused(&message, status));
        }
        Ok(sha256)
    }

    /// Sends a GET and returns the body of a 2xx answer as it is (a file, say), or the
    /// API's error message.
    pub async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let (status, bytes) = self.exchange("GET", path, None).await?;
        if !status.is_success() {
            return Err(self.refused(&error_message(&bytes), status));
        }
        Ok(bytes.to_vec())
    }

    /// Sends a GET and copies the body to stdout as it arrives (for followed logs).
    pub async fn stream_to_stdout(&self, path: &str) -> anyhow::Result<()> {
        use std::io::Write;
        let mut stdout = std::io::stdout();
        self.stream(path, |data| {
            stdout.write_all(data)?;
            stdout.flush()
        })
        .await
    }

    /// GETs `path` and hands each chunk of the body to `sink` as it arrives, for as long as
    /// the agent sends (only the answer's head is timed).
    pub async fn stream(
        &self,
        path: &str,
        mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> anyhow::Result<()> {
        let response = self
            .api
            .send(Method::GET, path, Body::empty(), CALL_TIMEOUT)
            .await
            .map_err(|error| self.unreachable(error))?;
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = read_body(body, MAX_ANSWER_BYTES)
                .await
                .map_err(anyhow::Error::msg)?;
            return Err(self.refused(&error_message(&bytes), status));
        }
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.context("reading the agent's answer")?.into_data() {
                sink(&data)?;
            }
        }
        Ok(())
    }
}
