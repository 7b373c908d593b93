//! [`InMemoryServer`]: a [`ServerApi`] in memory, for tests and simulators that drive a client
//! directly: allocs placed by hand, client states recorded, failures injectable. It touches
//! nothing but its own state.

use crate::model::structs::{Alloc, AllocState};
use crate::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use crate::util::locks::LockUnpoisoned;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// A server in memory: allocs placed by hand, client states recorded, failures injectable.
pub struct InMemoryServer {
    state: Mutex<ServerState>,
    index: watch::Sender<u64>,
}

#[derive(Default)]
struct ServerState {
    index: u64,
    nodes: Vec<String>,
    allocs: HashMap<String, (String, Arc<Alloc>)>,
    /// Shared with the updates that brought them, as the client shares them with its queue.
    client_states: HashMap<String, Arc<AllocState>>,
    update_batches: Vec<Vec<AllocUpdate>>,
    failing_updates: usize,
    unavailable: bool,
}

impl Default for InMemoryServer {
    fn default() -> Self {
        InMemoryServer {
            state: Mutex::new(ServerState::default()),
            index: watch::channel(0).0,
        }
    }
}

impl InMemoryServer {
    /// An empty server.
    pub fn new() -> Arc<Self> {
        Arc::new(InMemoryServer::default())
    }

    fn change(&self, change: impl FnOnce(&mut ServerState)) {
        let index = {
            let mut state = self.lock();
            change(&mut state);
            state.index += 1;
            state.index
        };
        self.index.send_replace(index);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ServerState> {
        self.state.lock_unpoisoned()
    }

    /// Places `alloc` on `node_id`, or replaces it (keep its id, raise its modify index).
    pub fn place(&self, node_id: &str, alloc: Alloc) {
        self.change(|state| {
            state
                .allocs
                .insert(alloc.id.clone(), (node_id.to_string(), Arc::new(alloc)));
        });
    }

    /// Places several allocs on `node_id` in one change, so a watcher sees them together.
    pub fn place_many(&self, node_id: &str, allocs: impl IntoIterator<Item = Alloc>) {
        self.change(|state| {
            for alloc in allocs {
                state
                    .allocs
                    .insert(alloc.id.clone(), (node_id.to_string(), Arc::new(alloc)));
            }
        });
    }

    /// Forgets an alloc, as server-side garbage collection does.
    pub fn remove(&self, alloc_id: &str) {
        self.change(|state| {
            state.allocs.remove(alloc_id);
        });
    }

    /// The alloc as the server has it.
    pub fn alloc(&self, alloc_id: &str) -> Option<Arc<Alloc>> {
        self.lock()
            .allocs
            .get(alloc_id)
            .map(|(_, alloc)| alloc.clone())
    }

    /// The last state the client sent for an alloc.
    pub fn client_state(&self, alloc_id: &str) -> Option<AllocState> {
        self.lock()
            .client_states
            .get(alloc_id)
            .map(|state| AllocState::clone(state))
    }

    /// Every batch of updates received, in order.
    pub fn update_batches(&self) -> Vec<Vec<AllocUpdate>> {
        self.lock().update_batches.clone()
    }

    /// Nodes registered so far.
    pub fn nodes(&self) -> Vec<String> {
        self.lock().nodes.clone()
    }

    /// Makes the next `count` calls of `update_allocs` fail.
    pub fn fail_next_updates(&self, count: usize) {
        self.lock().failing_updates = count;
    }

    /// Makes every call fail (or succeed again), as a server that is down.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.lock().unavailable = unavailable;
    }

    fn check_available(&self) -> Result<(), ServerError> {
        match self.lock().unavailable {
            true => Err(ServerError::Unavailable(
                "the in-memory server is set unavailable".into(),
            )),
            false => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl ServerApi for InMemoryServer {
    async fn register_node(
        &self,
        node_id: &str,
        _info: &crate::model::node::NodeInfo,
    ) -> Result<(), ServerError> {
        self.check_available()?;
        let mut state = self.lock();
        if !state.nodes.iter().any(|n| n == node_id) {
            state.nodes.push(node_id.to_string());
        }
        Ok(())
    }

    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError> {
        self.check_available()?;
        let mut receiver = self.index.subscribe();
        let _ = tokio::time::timeout(wait, receiver.wait_for(|index| *index > min_index)).await;
        self.check_available()?;
        let state = self.lock();
        let allocs = state
            .allocs
            .iter()
            .filter(|(_, (node, _))| node == node_id)
            .map(|(id, (_, alloc))| (id.clone(), alloc.modify_index))
            .collect();
        Ok(NodeAllocs {
            index: state.index,
            allocs,
        })
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        self.check_available()?;
        let state = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| state.allocs.get(id).map(|(_, alloc)| alloc.clone()))
            .collect())
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        self.check_available()?;
        let mut state = self.lock();
        if state.failing_updates > 0 {
            state.failing_updates -= 1;
            return Err(ServerError::Unavailable("injected update failure".into()));
        }
        state.update_batches.push(updates.to_vec());
        let mut accepted = Vec::new();
        for update in updates {
            if state.allocs.contains_key(&update.alloc_id) {
                state
                    .client_states
                    .insert(update.alloc_id.clone(), update.state.clone());
                accepted.push(update.alloc_id.clone());
            }
        }
        Ok(accepted)
    }
}
