//! Which nodes are still there: the embedded server's heartbeat. A client always has a watch
//! open (a blocking query) except for a moment between two, so a node counts as live while
//! it has a watch open, and for `node_ttl` after its last one ended or it last registered.
//! A node silent longer is down ([`super::EmbeddedServer::down_silent_nodes`]): its allocs
//! are lost and replaced, as Nomad does when a client misses its heartbeats.
//!
//! Kept in memory only, apart from the state lock: a watch starting or ending must not wait
//! on a save. A server opened on saved state gives every node it knows one TTL from then.
//! In cluster mode the scheduler learns liveness from etcd's leases instead and never asks.

use crate::util::determinism::HashMap;
use crate::util::locks::LockUnpoisoned;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Contact {
    open_watches: usize,
    last_seen: Instant,
}

/// Node id -> its last contact.
#[derive(Default)]
pub(super) struct Liveness {
    contacts: Arc<Mutex<HashMap<String, Contact>>>,
}

/// Held for as long as a watch is open; dropping it (the watch answered, or its caller
/// went away) marks the node seen now.
pub(super) struct OpenWatch {
    contacts: Arc<Mutex<HashMap<String, Contact>>>,
    node: String,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        let mut contacts = self.contacts.lock_unpoisoned();
        if let Some(contact) = contacts.get_mut(&self.node) {
            contact.open_watches = contact.open_watches.saturating_sub(1);
            contact.last_seen = Instant::now();
        }
    }
}

impl Liveness {
    /// `node` was heard from now.
    pub(super) fn seen(&self, node: &str) {
        let mut contacts = self.contacts.lock_unpoisoned();
        let contact = contacts.entry(node.to_string()).or_insert(Contact {
            open_watches: 0,
            last_seen: Instant::now(),
        });
        contact.last_seen = Instant::now();
    }

    /// `node` opened a watch, live until the returned guard is dropped.
    pub(super) fn watching(&self, node: &str) -> OpenWatch {
        self.seen(node);
        let mut contacts = self.contacts.lock_unpoisoned();
        if let Some(contact) = contacts.get_mut(node) {
            contact.open_watches += 1;
        }
        OpenWatch {
            contacts: self.contacts.clone(),
            node: node.to_string(),
        }
    }

    /// How many watches are open, over every node.
    pub(super) fn open_watches(&self) -> usize {
        let contacts = self.contacts.lock_unpoisoned();
        contacts.values().map(|c| c.open_watches).sum()
    }

    /// Whether `node` has had no watch open for longer than `ttl`. A node not heard from
    /// since the server opened (known from saved state) is given one TTL from now.
    pub(super) fn is_silent(&self, node: &str, ttl: Duration) -> bool {
        let mut contacts = self.contacts.lock_unpoisoned();
        let now = Instant::now();
        let contact = contacts.entry(node.to_string()).or_insert(Contact {
            open_watches: 0,
            last_seen: now,
        });
        contact.open_watches == 0 && now.duration_since(contact.last_seen) > ttl
    }

    /// Forgets `node`, taken down (a node that comes back is seen again when it watches).
    pub(super) fn forget(&self, node: &str) {
        self.contacts.lock_unpoisoned().remove(node);
    }
}

#[cfg(test)]
mod tests {
    use crate::model::jobspec::JobType;
    use crate::model::structs::ClientStatus;
    use crate::rpc::ServerApi;
    use crate::server::testkit::spec;
    use crate::server::{EmbeddedServer, ServerConfig};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_node_without_a_watch_for_longer_than_the_ttl_is_down_until_it_watches_again() {
        let server = EmbeddedServer::new(ServerConfig::default());
        server
            .register_node("watching", &Default::default())
            .await
            .unwrap();
        server
            .register_node("silent", &Default::default())
            .await
            .unwrap();
        // The agent's own node is never taken down, watching or not.
        server
            .register_node("local", &Default::default())
            .await
            .unwrap();
        server
            .register_job(spec("web", JobType::Service, 3))
            .unwrap();
        let watcher = {
            let server = server.clone();
            tokio::spawn(async move {
                let first = server
                    .watch_allocs("watching", 0, Duration::ZERO)
                    .await
                    .unwrap();
                let wait = Duration::from_secs(600);
                server.watch_allocs("watching", first.index, wait).await
            })
        };
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            server.down_silent_nodes("local").unwrap().is_empty(),
            "within the TTL"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(server.down_silent_nodes("local").unwrap(), ["silent"]);

        let allocs = server.job_allocs("web");
        let on = |node: &'static str| {
            let allocs = allocs.iter();
            allocs.filter(move |a| a.node_id.as_deref() == Some(node))
        };
        let lost = on("silent").map(|a| a.client_state.as_ref().map(|s| s.client_status));
        assert_eq!(lost.collect::<Vec<_>>(), [Some(ClientStatus::Lost)]);
        assert_eq!(
            on("watching").count() + on("local").count(),
            3,
            "the lost alloc replaced on a live node"
        );
        assert!(
            watcher.await.unwrap().is_ok(),
            "its allocs changed: answered"
        );

        server
            .watch_allocs("silent", 0, Duration::ZERO)
            .await
            .unwrap();
        assert!(
            server.nodes().contains(&"silent".to_string()),
            "back by watching"
        );
    }
}
