//! [`ServerApi`] over HTTP: the node routes' paths and bodies, which the agent serves (see
//! `agent::http`), and the client side, [`HttpServer`] and a [`HttpServerApi`] per node,
//! through which nodes in another process talk to an agent's embedded server as its own
//! client does in process.
//!
//! The routes, each answered with JSON:
//! - `PUT /v1/node/<node>/register`
//! - `GET /v1/node/<node>/allocations?index=<n>&wait=<duration>`: a blocking query, answered
//!   with [`NodeAllocs`] once the node's index is past `index`, or when `wait` (at most
//!   [`MAX_WAIT`]) has passed.
//! - `POST /v1/node/<node>/allocations/fetch` with [`FetchRequest`]: the node's allocs among
//!   those asked for, as a list.
//! - `POST /v1/node/<node>/allocations/update` with [`UpdateRequest`]: [`UpdateResponse`];
//!   updates for allocs that are not the node's are dropped, not accepted.
//!
//! Every call carries the agent's ACL token, the watch too (it registers the node). Errors keep the API's shape
//! (`{"error": ...}`): a 5xx, a 429 or no answer at all is [`ServerError::Unavailable`], any
//! other refusal [`ServerError::Refused`]; the client retries both.

use super::transport::{AgentApi, AgentPool, error_message};
use super::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use crate::model::node::NodeInfo;
use crate::model::structs::Alloc;
use axum::body::Body;
use hyper::body::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// The most alloc ids (to fetch) or updates one request may carry; [`HttpServerApi`] splits
/// larger calls.
pub const MAX_ITEMS_PER_CALL: usize = 512;

/// The longest a blocking query waits; a longer `wait` is shortened to it.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// The largest answer [`HttpServerApi`] reads: well over [`MAX_ITEMS_PER_CALL`] allocs.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// How long a call may take beyond the wait it asked for, before it counts as unanswered.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The path that registers `node`.
pub fn register_path(node: &str) -> String {
    format!("/v1/node/{node}/register")
}

/// The path of `node`'s blocking query.
pub fn watch_path(node: &str, min_index: u64, wait: Duration) -> String {
    format!(
        "/v1/node/{node}/allocations?index={min_index}&wait={}ms",
        wait.as_millis()
    )
}

/// Where `node` fetches its allocs by id.
pub fn fetch_path(node: &str) -> String {
    format!("/v1/node/{node}/allocations/fetch")
}

/// Where `node` sends its allocs' client states.
pub fn update_path(node: &str) -> String {
    format!("/v1/node/{node}/allocations/update")
}

/// The body of a fetch: the ids wanted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FetchRequest {
    /// At most [`MAX_ITEMS_PER_CALL`].
    pub ids: Vec<String>,
}

/// The body of an update: the client states.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateRequest {
    /// At most [`MAX_ITEMS_PER_CALL`].
    pub updates: Vec<AllocUpdate>,
}

/// The answer to an update: the ids the server took.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateResponse {
    /// The allocs the server accepted; the others it no longer has.
    pub accepted: Vec<String>,
}

/// A connection to an agent's HTTP API: one connection pool that any number of nodes share
/// through [`HttpServer::node`]. Cheap to clone.
#[derive(Clone)]
pub struct HttpServer {
    api: AgentApi,
}

/// One node's [`ServerApi`] over an [`HttpServer`]: fetches and updates name the node, so
/// the agent answers only for that node's allocs.
pub struct HttpServerApi {
    server: HttpServer,
    node: String,
}

impl HttpServer {
    /// A server at `addr` (`http://HOST:PORT`, `https://` on a TLS pool), dialled on
    /// `pool`, sending `token` with every call if given.
    pub fn new(pool: &AgentPool, addr: &str, token: Option<String>) -> anyhow::Result<Self> {
        Ok(HttpServer {
            api: pool.agent(addr, token)?,
        })
    }

    /// The [`ServerApi`] of node `node`.
    pub fn node(&self, node: &str) -> Arc<HttpServerApi> {
        Arc::new(HttpServerApi {
            server: self.clone(),
            node: node.to_string(),
        })
    }

    /// Whether the agent answers over this pool's HTTP/1.1: `GET /v1/agent/health`, which
    /// needs no token. The error says why not, in the agent's words where it gave any (a TLS
    /// agent called over plain HTTP says to use HTTPS, which a caller speaking HTTP/2 could
    /// not read).
    pub async fn check_reachable(&self) -> Result<(), ServerError> {
        let path = "/v1/agent/health";
        let (status, bytes) = self
            .exchange(hyper::Method::GET, path, None, CALL_TIMEOUT)
            .await?;
        if status.is_success() {
            return Ok(());
        }
        Err(ServerError::Refused(format!(
            "{path}: {} ({})",
            error_message(&bytes),
            status.as_u16()
        )))
    }

    /// The agent's `/v1/metrics`, in Prometheus' text format (for a report: not part of
    /// the client-server seam).
    pub async fn metrics_text(&self) -> Result<String, ServerError> {
        let path = "/v1/metrics";
        let (status, bytes) = self
            .exchange(hyper::Method::GET, path, None, CALL_TIMEOUT)
            .await?;
        if !status.is_success() {
            return Err(ServerError::Refused(format!("{path}: {}", status.as_u16())));
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn exchange(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<(hyper::StatusCode, Bytes), ServerError> {
        let body = body.map(Body::from).unwrap_or_default();
        self.api
            .exchange(method, path, body, timeout, MAX_ANSWER_BYTES)
            .await
            .map_err(|unanswered| ServerError::Unavailable(unanswered.to_string()))
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<T, ServerError> {
        let unavailable =
            |why: String| ServerError::Unavailable(format!("{}: {why}", self.api.base()));
        let (status, bytes) = self.exchange(method, path, body, timeout).await?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| unavailable(format!("unreadable answer to {path}: {e}")));
        }
        let message = format!("{path}: {} ({})", error_message(&bytes), status.as_u16());
        if status.is_server_error() || status == hyper::StatusCode::TOO_MANY_REQUESTS {
            Err(unavailable(message))
        } else {
            Err(ServerError::Refused(message))
        }
    }

    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, ServerError> {
        let body = serde_json::to_vec(body)
            .map_err(|e| ServerError::Refused(format!("cannot encode a request: {e}")))?;
        self.call(hyper::Method::POST, path, Some(body), CALL_TIMEOUT)
            .await
    }
}

#[async_trait::async_trait]
impl ServerApi for HttpServerApi {
    async fn register_node(&self, node_id: &str, info: &NodeInfo) -> Result<(), ServerError> {
        let path = register_path(node_id);
        let body = serde_json::to_vec(info)
            .map_err(|e| ServerError::Refused(format!("cannot encode a request: {e}")))?;
        let _: serde_json::Value = self
            .server
            .call(hyper::Method::PUT, &path, Some(body), CALL_TIMEOUT)
            .await?;
        Ok(())
    }

    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError> {
        let wait = wait.min(MAX_WAIT);
        let path = watch_path(node_id, min_index, wait);
        self.server
            .call(hyper::Method::GET, &path, None, wait + CALL_TIMEOUT)
            .await
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        let mut allocs = Vec::with_capacity(ids.len());
        let path = fetch_path(&self.node);
        for chunk in ids.chunks(MAX_ITEMS_PER_CALL) {
            let request = FetchRequest {
                ids: chunk.to_vec(),
            };
            let fetched: Vec<Alloc> = self.server.post(&path, &request).await?;
            allocs.extend(fetched.into_iter().map(Arc::new));
        }
        Ok(allocs)
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        let mut accepted = Vec::with_capacity(updates.len());
        let path = update_path(&self.node);
        // Each chunk lands whole; a later one failing leaves the earlier ones applied, which
        // the contract allows (latest wins, so sending them again changes nothing).
        for chunk in updates.chunks(MAX_ITEMS_PER_CALL) {
            let request = UpdateRequest {
                updates: chunk.to_vec(),
            };
            let answer: UpdateResponse = self.server.post(&path, &request).await?;
            accepted.extend(answer.accepted);
        }
        Ok(accepted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_address_must_be_an_http_url() {
        assert!(HttpServer::new(&AgentPool::new(), "http://127.0.0.1:4646", None).is_ok());
        for bad in [
            "127.0.0.1:4646",
            "https://example.com",
            "http://",
            "not a url",
        ] {
            let error = HttpServer::new(&AgentPool::new(), bad, None)
                .err()
                .expect(bad)
                .to_string();
            assert!(error.contains(bad), "{error}");
        }
    }
}
