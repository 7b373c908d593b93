//! Fetching a build this agent lacks from the cluster's other agents, by hash.
//!
//! The peers are asked one at a time, in the order the agent's peer list gives (the leader
//! first: it has every build a job was registered with), with `GET /v1/runner/{sha256}`. The
//! bytes are written to the store only when their SHA-256 is the one asked for, so a peer that
//! serves the wrong bytes (a bad disk, a hostile agent) costs a retry with the next one, never
//! an alloc started from them. When no peer has it, the error names the build and every agent
//! tried with its answer.

use super::{PutError, RunnerStore};
use crate::rpc::transport::{AgentPool, error_message, read_body};
use futures_util::future::BoxFuture;
use http_body_util::BodyDataStream;
use hyper::{Method, StatusCode};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The other agents' APIs (`http://HOST:PORT`), the one to ask first first: asked anew for
/// each fetch, since the cluster's membership changes.
pub type PeerList = Arc<dyn Fn() -> BoxFuture<'static, Vec<String>> + Send + Sync>;

/// A peer list that never changes: `peers`, in this order (one agent for simulated nodes,
/// a test's or a bench's fixed set).
pub fn fixed_peers(peers: Vec<String>) -> PeerList {
    Arc::new(move || {
        let peers = peers.clone();
        Box::pin(async move { peers })
    })
}

/// How long a peer may take to start answering.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one peer may take to send a whole build: 256 MiB at a slow 1 MiB/s.
pub(super) const TRANSFER_TIMEOUT: Duration = Duration::from_secs(300);

/// The most of an error answer read, to quote it.
const MAX_ERROR_BYTES: usize = 4096;

/// A build no agent could give, and what each one tried answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("runner build sha256:{sha256} is not on this agent{}", tried_text(.tried))]
pub struct FetchError {
    /// The build asked for.
    pub sha256: String,
    /// Each agent asked, with why it did not give the build, in the order asked.
    pub tried: Vec<(String, String)>,
}

fn tried_text(tried: &[(String, String)]) -> String {
    if tried.is_empty() {
        return ", and there is no other agent to fetch it from".into();
    }
    let answers: Vec<String> = tried
        .iter()
        .map(|(agent, why)| format!("{agent}: {why}"))
        .collect();
    // One line, bounded: it becomes an alloc's description.
    let answers = crate::util::text::cut(&answers.join("; "), MAX_TRIED_TEXT).into_owned();
    format!(", and no agent gave it (tried {answers})")
}

/// The most of the agents' answers a fetch error quotes.
const MAX_TRIED_TEXT: usize = 2048;

/// The most peers one fetch asks, the leader first: past a handful, a build no agent gives
/// is not worth minutes of a node's start.
pub const MAX_PEERS_ASKED: usize = 16;

/// Who to ask, and how.
#[derive(Clone)]
pub(super) struct Peers {
    list: PeerList,
    token: Option<String>,
    pool: AgentPool,
}

impl Peers {
    pub(super) fn new(list: PeerList, token: Option<String>, pool: AgentPool) -> Peers {
        Peers { list, token, pool }
    }

    /// Asks each peer in turn for build `sha256` and stores the first that hashes right;
    /// `tried` is what was asked before them (a registry). The caller holds the build's
    /// turn.
    pub(super) async fn fetch(
        &self,
        store: &RunnerStore,
        sha256: &str,
        mut tried: Vec<(String, String)>,
    ) -> Result<PathBuf, FetchError> {
        for peer in (self.list)().await.into_iter().take(MAX_PEERS_ASKED) {
            match self.fetch_from(store, &peer, sha256).await {
                Ok(path) => {
                    tracing::info!(
                        runner_sha256 = %&sha256[..12],
                        from = %peer,
                        "fetched runner build from another agent"
                    );
                    return Ok(path);
                }
                Err(why) => {
                    tracing::debug!(peer = %peer, why = %why, "a peer did not give the build");
                    tried.push((crate::util::text::cut(&peer, 128).into_owned(), why));
                }
            }
        }
        Err(FetchError {
            sha256: sha256.to_string(),
            tried,
        })
    }

    async fn fetch_from(
        &self,
        store: &RunnerStore,
        peer: &str,
        sha256: &str,
    ) -> Result<PathBuf, String> {
        let agent = self
            .pool
            .agent(peer, self.token.clone())
            .map_err(|e| e.to_string())?;
        let path = format!("/v1/runner/{sha256}");
        let transfer = async {
            let response = agent
                .send(
                    Method::GET,
                    &path,
                    axum::body::Body::empty(),
                    ANSWER_TIMEOUT,
                )
                .await
                .map_err(|e| e.reason)?;
            match response.status() {
                StatusCode::OK => {}
                StatusCode::NOT_FOUND => return Err("does not have it".to_string()),
                status => {
                    let body = read_body(response.into_body(), MAX_ERROR_BYTES)
                        .await
                        .unwrap_or_default();
                    let said = error_message(&body);
                    let said = crate::util::text::cut(&said, 200);
                    return Err(format!(
                        "answered {status}: {}",
                        crate::util::text::escape_controls(&said)
                    ));
                }
            }
            store
                .write_build(sha256, BodyDataStream::new(response.into_body()))
                .await
                .map_err(|error| match error {
                    PutError::Mismatch { actual, .. } => {
                        format!("served other bytes (sha256 {actual}); not used")
                    }
                    other => other.to_string(),
                })
        };
        match tokio::time::timeout(TRANSFER_TIMEOUT, transfer).await {
            Ok(Ok(())) => store
                .path(sha256)
                .ok_or_else(|| "stored, then gone".to_string()),
            Ok(Err(why)) => Err(why),
            Err(_) => Err(format!(
                "did not send it within {}s",
                TRANSFER_TIMEOUT.as_secs()
            )),
        }
    }
}
