//! The clients' side of the embedded server: its [`ServerApi`] impl. It translates calls into
//! changes of the server's state and must not decide anything itself: placement and
//! replacement are the scheduler's (see [`super::reconcile`]).
//!
//! Invariants, for the reasons given:
//! - An update is acknowledged only once saved, and a failed save is
//!   [`ServerError::Unavailable`], so the client keeps the update and sends it again.
//! - A terminal alloc never turns non-terminal: no client runs a finished alloc again, so
//!   such a report is a stale one delivered late (a restarted node's request still in
//!   flight is one way; the nodesim test once waited in vain for its last `complete` under
//!   load, which this would explain).

use super::{EmbeddedServer, MAX_NODES};
use crate::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use crate::structs::Alloc;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

#[async_trait::async_trait]
impl ServerApi for EmbeddedServer {
    async fn register_node(&self, node_id: &str) -> Result<(), ServerError> {
        self.liveness.seen(node_id);
        // Registering again (after an error, or a restart) changes nothing: no save.
        if self.lock().nodes.contains(node_id) {
            return Ok(());
        }
        let (added, saved) = self.change(|state, index| {
            // Each node costs the server memory and a longer node list to save.
            if state.nodes.len() >= MAX_NODES {
                return false;
            }
            if state.add_node(node_id) {
                state.place_unplaced(index);
            }
            true
        });
        saved.map_err(|e| ServerError::Unavailable(format!("cannot save server state: {e}")))?;
        if !added {
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
        // watches (see `down_silent_nodes`) is back, and allocs may be placed on it again.
        if !self.lock().nodes.contains(node_id) {
            self.register_node(node_id).await?;
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
        let restart_limit = self.config.restart_limit;
        let now_unix_ms = crate::timestamp::unix_ms_now();
        let mut reporting_nodes = std::collections::BTreeSet::new();
        let (accepted, saved) = self.change(|state, index| {
            let mut accepted = Vec::new();
            for update in updates {
                let Some(record) = state.alloc_mut(&update.alloc_id) else {
                    continue;
                };
                if let Some(node) = &record.node_id {
                    reporting_nodes.insert(node.clone());
                }
                // A terminal alloc stays terminal. A lost one until its node, back, reports
                // how it ended; a finished one for good: its client never runs it again
                // (restore keeps it finished), so a later non-terminal report is a stale one,
                // delivered late (a restarted node's request still in flight), and taking it
                // would bring the alloc back to life on the server alone.
                let terminal = record
                    .client_state
                    .as_ref()
                    .is_some_and(|s| s.client_status.is_terminal());
                if terminal && !update.state.client_status.is_terminal() {
                    accepted.push(update.alloc_id.clone());
                    continue;
                }
                if update.state.client_status.is_terminal() && record.terminal_since.is_none() {
                    record.terminal_since = Some(Instant::now());
                }
                record.client_state = Some(update.state.clone());
                accepted.push(update.alloc_id.clone());
                state.replace_if_failed(&update.alloc_id, restart_limit, now_unix_ms, index);
            }
            accepted
        });
        // Not acknowledged unless on disk: the client keeps them and sends them again.
        saved.map_err(|e| ServerError::Unavailable(format!("cannot save server state: {e}")))?;
        self.metrics.updates_taken(accepted.len());
        // A node busy starting its allocs may be a while between two watches; its reports
        // show it is there all the same.
        for node in &reporting_nodes {
            self.liveness.seen(node);
        }
        Ok(accepted)
    }
}
