//! The clients' side of the embedded server: its [`ServerApi`] impl. It translates calls into
//! changes of the server's state and must not decide anything itself: placement and
//! replacement are the scheduler's (see [`super::reconcile`]).
//!
//! Invariants, for the reasons given:
//! - An update is acknowledged only once saved, and a failed save is
//!   [`ServerError::Unavailable`], so the client keeps the update and sends it again
//!   (`intake` takes updates in groups, one save each; `apply`'s `take_updates` says what
//!   an update does).

use super::{EmbeddedServer, MAX_NODES};
use crate::model::node::NodeInfo;
use crate::model::structs::Alloc;
use crate::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use std::sync::Arc;
use std::time::Duration;

#[async_trait::async_trait]
impl ServerApi for EmbeddedServer {
    async fn register_node(&self, node_id: &str, info: &NodeInfo) -> Result<(), ServerError> {
        self.liveness.seen(node_id);
        // Taken in a group with the requests that wait beside it: one save for them all (and
        // none for a node registering again, which changes nothing). Not looked up first:
        // the server's lock is held while a save runs, and a node must be able to queue then.
        if !self.take_registration(node_id, info.clone()).await? {
            return Err(ServerError::Refused(format!(
                "the server has {MAX_NODES} nodes registered, its most; node {node_id:?} is refused"
            )));
        }
        Ok(())
    }

    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError> {
        let _open = self.liveness.watching(node_id);
        // A node that watches is registered: one taken down while it was between two
        // watches (see `down_silent_nodes`) is back with what it said of itself, and allocs
        // may be placed on it again. One the server knows nothing of (it restarted since,
        // and what departed nodes said is kept in memory only) is told to register: taking
        // it back as saying nothing would place on it as if it had no class, pool, meta or
        // limits, until it happened to register again.
        let departed = {
            let state = self.lock();
            (!state.nodes.contains_key(node_id)).then(|| state.departed.get(node_id).cloned())
        };
        match departed {
            Some(Some(info)) => self.register_node(node_id, &info).await?,
            Some(None) => {
                return Err(ServerError::Unavailable(format!(
                    "node {node_id:?} is not registered with this server: register it again"
                )));
            }
            None => {}
        }
        let mut changed = {
            let mut state = self.lock();
            let saved_index = state.saved_index;
            state.node_allocs.subscribe(node_id, saved_index)
        };
        // Only this node's changes wake it; a timeout answers with the set unchanged. The
        // wait is kept under half the node TTL: a node whose connection died without a word
        // (a partition, a power cut) holds no watch open for long.
        let wait = wait.min(self.config.node_ttl / 2);
        let _ = tokio::time::timeout(wait, changed.wait_for(|index| *index > min_index)).await;
        let mut state = self.lock();
        let server_index = state.saved_index;
        let (index, allocs, changed_at) = state.node_allocs.allocs_of(node_id, server_index);
        // A first watch (index 0) is a full sync, not a change seen late.
        if index > min_index && min_index > 0 {
            self.metrics.watch_answered_after(changed_at.elapsed());
        }
        Ok(NodeAllocs { index, allocs })
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        let state = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| state.allocs.get(id).map(|a| a.alloc.clone()))
            .collect())
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        // Taken in a group with the reports that wait beside it: one save for them all.
        self.take_report(updates).await
    }
}
