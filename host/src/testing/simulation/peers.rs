//! How a node of the simulation fetches the checkpoint of an alloc moved to it off a drained
//! node: from that node's current client, as its agent's HTTP API serves it
//! ([`Client::migration_checkpoint`]), unless either node is cut off or the other one's
//! process is down (then: not yet, ask again). It reads the clients and changes nothing
//! but what serving a checkpoint changes (the moved alloc becomes collectable); the ledger
//! checks each checkpoint served.

use super::ledger::Ledger;
use crate::client::Client;
use crate::client::migrate::{CheckpointFetch, CheckpointSource, CheckpointUnavailable};
use crate::model::structs::PreviousAlloc;
use crate::util::locks::LockUnpoisoned;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Whether a node can be reached now (neither cut off nor behind an outage).
type Reachable = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// The clients of the nodes' current processes.
pub(super) struct Peers {
    clients: Mutex<BTreeMap<String, Client>>,
    reachable: Reachable,
    ledger: Arc<Ledger>,
}

impl Peers {
    pub(super) fn new(
        ledger: Arc<Ledger>,
        reachable: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Arc<Peers> {
        Arc::new(Peers {
            clients: Mutex::default(),
            reachable: Box::new(reachable),
            ledger,
        })
    }

    /// Node `node`'s process started `client` (restored first, as an agent's is before it
    /// serves anything): from now on it serves the checkpoints of allocs moved off it.
    pub(super) fn serving(&self, node: &str, client: &Client) {
        self.clients
            .lock_unpoisoned()
            .insert(node.to_string(), client.clone());
    }

    /// Node `node`'s process died.
    pub(super) fn down(&self, node: &str) {
        self.clients.lock_unpoisoned().remove(node);
    }

    /// Where node `fetcher`'s client fetches checkpoints from. Weak: the peers hold the
    /// clients, and each client its source.
    pub(super) fn source_for(self: &Arc<Self>, fetcher: &str) -> CheckpointSource {
        let (peers, fetcher) = (Arc::downgrade(self), fetcher.to_string());
        Arc::new(move |previous: PreviousAlloc| {
            let (peers, fetcher) = (peers.clone(), fetcher.clone());
            Box::pin(async move {
                let Some(peers) = peers.upgrade() else {
                    return Err(CheckpointFetch::NotYet("the simulation ended".into()));
                };
                peers.fetch(&fetcher, &previous).await
            })
        })
    }

    async fn fetch(
        &self,
        fetcher: &str,
        previous: &PreviousAlloc,
    ) -> Result<Option<Vec<u8>>, CheckpointFetch> {
        let node = &previous.node_id;
        let answers = (self.reachable)(fetcher) && (self.reachable)(node);
        let client = self.clients.lock_unpoisoned().get(node).cloned();
        let Some(client) = client.filter(|_| answers) else {
            return Err(CheckpointFetch::NotYet(format!("{node} does not answer")));
        };
        match client.migration_checkpoint(&previous.alloc_id).await {
            Ok(checkpoint) => {
                let served = checkpoint.as_deref();
                self.ledger.served(node, &previous.alloc_id, served);
                Ok(checkpoint)
            }
            Err(unknown @ CheckpointUnavailable::Unknown(_)) => {
                Err(CheckpointFetch::Gone(unknown.to_string()))
            }
            Err(other) => Err(CheckpointFetch::NotYet(other.to_string())),
        }
    }
}
