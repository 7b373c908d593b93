//! The client-server seam: everything a client node asks of the server that schedules it.
//!
//! [`ServerApi`] is the one contract both sides import: `client/` calls it, and every server
//! implements it (the agent's embedded server in `server/`, the etcd cluster in `cluster/`,
//! `testing::InMemoryServer` in tests). [`http`] carries it over HTTP: its wire format, and
//! [`http::HttpServerApi`], through which a client in another process (`caravan nodesim`)
//! talks to an agent's embedded server. This module is a leaf: it knows the plain data in
//! [`crate::model::structs`] and nothing of runners, the garbage collector, the state store or any
//! server's internals.
//!
//! # What every implementation promises
//! The contract is written so that a server in another process, or a store on other machines,
//! can honour it. The client is built for exactly these promises and no more:
//!
//! - **Lost connection.** Any call may fail with [`ServerError::Unavailable`] at any time,
//!   including after the server did the work (an update applied, then the answer lost). The
//!   client retries every call with backoff and re-registers its node before its next watch.
//!   No call may leave a half-applied batch behind: a batch of updates lands whole or not at
//!   all, per alloc at least (a store that cannot batch atomically must make each alloc's
//!   update atomic and answer only for the ones that landed).
//! - **Stale index.** [`ServerApi::watch_allocs`] answers with the *whole* set of the node's
//!   allocs and their modify indexes, never a delta, and the client takes each answer as the
//!   truth: an alloc left out of it is removed, which kills and collects it. So an answer
//!   must be current, never older than one the server already gave the node: a store with
//!   replicas reads at or after the index it was given (etcd's linearizable reads), never
//!   from a replica that lags. Within that, a repeated answer changes nothing (the client
//!   diffs by modify index). An index the server does not know (ahead of its own, after it
//!   restarted or lost its history) is not an error: the server answers with its current set
//!   and index, at once or after `wait`. The client always continues from the index it was
//!   last given.
//! - **Duplicate update.** Updates carry the alloc's whole client state, latest wins, so the
//!   server applies a repeated or re-ordered batch idempotently. An update for an alloc the
//!   server no longer has is dropped, not an error, and left out of the accepted ids.
//! - **Server restart.** A server may forget the node's registration (the client registers
//!   again after any error) and its watch index (see above), but never an alloc it has
//!   answered with, nor an update it has accepted: an implementation acknowledges a write only
//!   once it is durable. A restarted server's answers are a fresh, complete view.
//! - **Waiting.** No method blocks a thread; `watch_allocs` waits asynchronously for at most
//!   about `wait` (a remote implementation may add its round trip). Dropping a call's future
//!   cancels it with no effect beyond what an error would have had.

pub mod http;
pub mod transport;

use crate::model::node::NodeInfo;
use crate::model::structs::{Alloc, AllocState};
use crate::util::determinism::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Why a server call failed. The client retries every one of them with backoff: neither kind
/// is fatal to a node.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    /// The server could not be reached or did not answer.
    #[error("server unavailable: {0}")]
    Unavailable(String),
    /// The server refused the request.
    #[error("server refused the request: {0}")]
    Refused(String),
}

/// The allocs assigned to a node, as of `index`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeAllocs {
    /// The server's index when this answer was made; pass it back to wait for a change.
    pub index: u64,
    /// Alloc id -> modify index, for every alloc the server assigns to the node.
    pub allocs: HashMap<String, u64>,
}

/// One alloc's client-side state, sent to the server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AllocUpdate {
    /// The alloc.
    pub alloc_id: String,
    /// Its state as the client last saw it: shared with the client's send queue, so an
    /// update costs no copy of the state (on the wire it is the state itself).
    pub state: Arc<AllocState>,
}

/// How a client node talks to the server that schedules it. See the module docs for what an
/// implementation promises on a lost connection, a stale index, a duplicate update and a
/// restart.
///
/// Lifecycle: the client calls [`ServerApi::register_node`] first, then loops on
/// [`ServerApi::watch_allocs`]; [`ServerApi::get_allocs`] fetches what a watch answer named
/// as new or changed, and [`ServerApi::update_allocs`] runs alongside on the sync task.
/// Concurrency: every method may be called concurrently from the client's tasks, and by many
/// nodes at once on one server; none may block a thread (waiting is async). Errors are
/// transient from the client's point of view: it retries.
#[async_trait::async_trait]
pub trait ServerApi: Send + Sync {
    /// Registers (or re-registers) the node, with what it says of itself (its capacity and
    /// attributes, for placement; a registration saying something new replaces what it said
    /// before). The client calls it first and again after errors.
    async fn register_node(&self, node_id: &str, info: &NodeInfo) -> Result<(), ServerError>;

    /// The allocs assigned to `node_id`. Returns at once when the server's index is past
    /// `min_index`; otherwise waits until it is, or until `wait` has passed (then it returns
    /// the unchanged set). The answer's `index` is what to pass next.
    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError>;

    /// The allocs with these ids, each at least as new as in the last `watch_allocs` answer
    /// that named it (the embedded server's as it has them now; on etcd, as the node's watch
    /// last delivered them). Ids it no longer has are left out of the answer.
    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError>;

    /// Stores a batch of client states. Returns the ids the server accepted; the others (the
    /// server no longer knows the alloc) need not be sent again.
    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError>;
}
