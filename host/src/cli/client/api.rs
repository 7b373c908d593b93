//! The HTTP client the client commands share: one request to the agent, its JSON answer or
//! the API's error message, and a streamed body for followed logs.
//!
//! It knows the API's error shape (`{"error": ...}`) and nothing of any endpoint.

use crate::rpc::http::root_cause;
use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

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
        let (status, bytes) = self.exchange(method, path, body).await?;
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

    /// Sends a GET and returns the body of a 2xx answer as it is (a file, say), or the
    /// API's error message.
    pub async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let (status, bytes) = self.exchange("GET", path, None).await?;
        if !status.is_success() {
            bail!("{} ({})", error_message(&bytes), status.as_u16());
        }
        Ok(bytes.to_vec())
    }

    /// Sends one request and reads its whole answer.
    async fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(hyper::StatusCode, bytes::Bytes)> {
        let response = self.send(method, path, body).await?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .context("reading the agent's answer")?
            .to_bytes();
        Ok((status, bytes))
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

    /// GETs `path` and hands each chunk of the body to `sink` as it arrives.
    pub async fn stream(
        &self,
        path: &str,
        mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> anyhow::Result<()> {
        let response = self.send("GET", path, None).await?;
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = body
                .collect()
                .await
                .context("reading the agent's answer")?
                .to_bytes();
            bail!("{} ({})", error_message(&bytes), status.as_u16());
        }
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.context("reading the agent's answer")?.into_data() {
                sink(&data)?;
            }
        }
        Ok(())
    }
}

/// The `error` of an API error body.
fn error_message(body: &[u8]) -> String {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    value["error"]
        .as_str()
        .unwrap_or("request failed")
        .to_string()
}
