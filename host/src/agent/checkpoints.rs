//! Where this agent's client fetches the checkpoint of an alloc moved here off a drained
//! node: the agent of the node it ran on, found by that node's live key, asked over the
//! agents' HTTP API (`GET /v1/client/allocation/{id}/checkpoint`, with this agent's token).
//!
//! It only carries bytes: when to ask again and what to start from is the client's
//! (`client::migrate`).

use crate::client::migrate::{CheckpointFetch, CheckpointSource};
use crate::cluster::EtcdStore;
use crate::model::structs::PreviousAlloc;
use crate::rpc::transport::{AgentPool, error_message};
use hyper::{Method, StatusCode};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long the other agent may take to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The most read of an answer: the largest checkpoint a job may be allowed (the cap of
/// `checkpoint_size`), and more is refused rather than kept.
const MAX_CHECKPOINT_BYTES: usize = 16 << 20;

/// How long a read of the live agents' addresses serves: a drain brings a node hundreds of
/// arriving allocs, each asking again every quarter second until its checkpoint is final,
/// and one read of etcd's `live/` a second is enough for all of them.
const ADDRESSES_FRESH_FOR: Duration = Duration::from_secs(1);

/// Each live node's agent address, as last read, and when.
type Addresses = Option<(tokio::time::Instant, Arc<HashMap<String, String>>)>;

/// A source that finds the previous alloc's node among the cluster's live agents.
pub fn from_cluster(store: EtcdStore, token: Option<String>, pool: AgentPool) -> CheckpointSource {
    let pool = Arc::new(pool);
    let addresses: Arc<tokio::sync::Mutex<Addresses>> = Arc::default();
    Arc::new(move |previous: PreviousAlloc| {
        let (store, token, pool) = (store.clone(), token.clone(), pool.clone());
        let addresses = addresses.clone();
        Box::pin(async move {
            let mut live = live_addresses(&store, &addresses, false).await?;
            if !live.contains_key(&previous.node_id) {
                // Not as last read: read again before calling it down.
                live = live_addresses(&store, &addresses, true).await?;
            }
            let Some(api) = live.get(&previous.node_id) else {
                return Err(CheckpointFetch::Gone(format!(
                    "node {} is down",
                    previous.node_id
                )));
            };
            fetch(&pool, api, token, &previous.alloc_id).await
        })
    })
}

/// Each live node's agent address, read from etcd at most once per
/// [`ADDRESSES_FRESH_FOR`] (the callers waiting meanwhile share the read), or now when
/// `fresh`.
async fn live_addresses(
    store: &EtcdStore,
    cache: &tokio::sync::Mutex<Addresses>,
    fresh: bool,
) -> Result<Arc<HashMap<String, String>>, CheckpointFetch> {
    let mut cached = cache.lock().await;
    if let Some((read_at, addresses)) = cached.as_ref()
        && !fresh
        && read_at.elapsed() < ADDRESSES_FRESH_FOR
    {
        return Ok(addresses.clone());
    }
    let live = crate::cluster::live_records(store)
        .await
        .map_err(|e| CheckpointFetch::NotYet(format!("cannot read the live nodes: {e}")))?;
    let addresses: Arc<HashMap<String, String>> = Arc::new(
        live.into_iter()
            .map(|(member, _)| (member.node, member.api))
            .collect(),
    );
    *cached = Some((tokio::time::Instant::now(), addresses.clone()));
    Ok(addresses)
}

async fn fetch(
    pool: &AgentPool,
    api: &str,
    token: Option<String>,
    alloc_id: &str,
) -> Result<Option<Vec<u8>>, CheckpointFetch> {
    let agent = pool
        .agent(api, token)
        .map_err(|e| CheckpointFetch::Gone(format!("the agent address is not usable: {e}")))?;
    let path = format!("/v1/client/allocation/{alloc_id}/checkpoint");
    let (status, body) = agent
        .exchange(
            Method::GET,
            &path,
            axum::body::Body::empty(),
            ANSWER_TIMEOUT,
            MAX_CHECKPOINT_BYTES,
        )
        .await
        .map_err(|unanswered| CheckpointFetch::NotYet(unanswered.reason))?;
    let said = || crate::util::text::cut(&error_message(&body), 200).into_owned();
    match status {
        StatusCode::OK => Ok(Some(body.to_vec())),
        StatusCode::NO_CONTENT => Ok(None),
        StatusCode::NOT_FOUND => Err(CheckpointFetch::Gone(said())),
        StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => Err(CheckpointFetch::Gone(format!(
            "the agent at {api} refused this agent's token: {}",
            said()
        ))),
        _ => Err(CheckpointFetch::NotYet(format!("{status}: {}", said()))),
    }
}
