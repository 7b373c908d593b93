//! Which allocs each node holds, and the index at which that set last changed: what a node's
//! blocking query waits on and answers with. It is derived from the server's alloc table
//! after each saved change, never saved itself, and decides nothing.
//!
//! Invariants, each for the reason given:
//! - A node's watcher is woken only when an alloc of that node is added, removed or given a
//!   new modify index (a client's status report changes none of these): with thousands of
//!   nodes, waking every watcher on every change, each to scan every alloc, made the
//!   server's cost grow with nodes times allocs per update.
//! - A node's index only grows and is never above the server's: a client passes it back as
//!   the index to wait past, and an index the server has given can never come back.
//! - A node first seen (after a restart, say) starts at the server's last saved index, at
//!   least any index the server gave before: a client watching from an index an earlier
//!   run gave it waits for the next change, as it would have, and is never handed an index
//!   a restart could give again (a change that failed to save took one).

use super::records::AllocRecord;
use crate::util::determinism::{HashMap, HashSet};
use std::collections::BTreeMap;
use tokio::sync::watch;
use tokio::time::Instant;

/// Node id -> its allocs, kept in step with the alloc table by [`NodeAllocIndex::publish`].
#[derive(Default)]
pub(super) struct NodeAllocIndex {
    /// Alloc id -> (node, modify index), as last published.
    placed: HashMap<String, (String, u64)>,
    nodes: HashMap<String, NodeEntry>,
}

struct NodeEntry {
    /// Alloc id -> modify index.
    allocs: HashMap<String, u64>,
    /// The server index at which `allocs` last changed.
    changed: watch::Sender<u64>,
    /// When they last changed, for the watch lag.
    changed_at: Instant,
}

impl NodeEntry {
    fn new(index: u64) -> Self {
        NodeEntry {
            allocs: HashMap::default(),
            changed: watch::channel(index).0,
            changed_at: Instant::now(),
        }
    }
}

impl NodeAllocIndex {
    /// The index of every placed alloc in `allocs`, each node starting at `index`.
    pub(super) fn build(allocs: &BTreeMap<String, AllocRecord>, index: u64) -> Self {
        let mut nodes = NodeAllocIndex::default();
        nodes.publish(allocs, allocs.keys(), index);
        for entry in nodes.nodes.values() {
            entry.changed.send_replace(index);
        }
        nodes
    }

    /// Brings the index in step with `allocs` for the allocs in `touched` (changed or removed
    /// at `index`), and wakes the watchers of every node whose set changed. Returns how many
    /// allocs were placed on a node they were not on (new ones, and replacements).
    pub(super) fn publish<'a>(
        &mut self,
        allocs: &BTreeMap<String, AllocRecord>,
        touched: impl IntoIterator<Item = &'a String>,
        index: u64,
    ) -> usize {
        let mut changed_nodes = HashSet::default();
        let mut placed = 0;
        for alloc_id in touched {
            let now = allocs.get(alloc_id).and_then(|record| {
                let node = record.node_id.clone()?;
                Some((node, record.alloc.modify_index))
            });
            if self.placed.get(alloc_id) == now.as_ref() {
                continue;
            }
            let was_on = self.placed.remove(alloc_id).map(|(node, _)| node);
            if let Some(node) = was_on.clone() {
                if let Some(entry) = self.nodes.get_mut(&node) {
                    entry.allocs.remove(alloc_id);
                }
                changed_nodes.insert(node);
            }
            if let Some((node, modify_index)) = now {
                placed += usize::from(was_on.as_ref() != Some(&node));
                self.nodes
                    .entry(node.clone())
                    .or_insert_with(|| NodeEntry::new(index))
                    .allocs
                    .insert(alloc_id.clone(), modify_index);
                self.placed
                    .insert(alloc_id.clone(), (node.clone(), modify_index));
                changed_nodes.insert(node);
            }
        }
        let now = Instant::now();
        for node in changed_nodes {
            if let Some(entry) = self.nodes.get_mut(&node) {
                entry.changed_at = now;
                entry.changed.send_replace(index);
            }
        }
        placed
    }

    /// `node`'s allocs (id -> modify index), the index they are as of, and when they last
    /// changed.
    pub(super) fn allocs_of(
        &mut self,
        node: &str,
        server_index: u64,
    ) -> (u64, HashMap<String, u64>, Instant) {
        let entry = self.entry(node, server_index);
        let index = *entry.changed.borrow();
        (index, entry.allocs.clone(), entry.changed_at)
    }

    /// A receiver that sees `node`'s index change.
    pub(super) fn subscribe(&mut self, node: &str, server_index: u64) -> watch::Receiver<u64> {
        self.entry(node, server_index).changed.subscribe()
    }

    fn entry(&mut self, node: &str, server_index: u64) -> &NodeEntry {
        self.nodes
            .entry(node.to_string())
            .or_insert_with(|| NodeEntry::new(server_index))
    }
}

#[cfg(test)]
mod tests {
    use crate::model::jobspec::JobType;
    use crate::model::structs::{AllocState, ClientStatus};
    use crate::rpc::{AllocUpdate, ServerApi};
    use crate::server::testkit::spec;
    use crate::server::{EmbeddedServer, ServerConfig};
    use std::time::Duration;
    use tokio::time::Instant;

    /// Under half the default node TTL, which caps every wait.
    const WAIT: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn a_node_is_woken_only_by_changes_to_its_own_allocs() {
        let server = EmbeddedServer::new(ServerConfig::default());
        server
            .register_node("n1", &Default::default())
            .await
            .unwrap();
        server
            .register_node("n2", &Default::default())
            .await
            .unwrap();
        server
            .register_job(spec("web", JobType::Service, 2))
            .unwrap();
        let alloc_on = |node: &str| {
            let allocs = server.allocs().into_iter();
            let mut on_node = allocs.filter(|a| a.node_id.as_deref() == Some(node));
            on_node.next().unwrap().alloc.id.clone()
        };
        let (n1_alloc, n2_alloc) = (alloc_on("n1"), alloc_on("n2"));
        let first = server.watch_allocs("n1", 0, WAIT).await.unwrap();
        assert_eq!(first.allocs.keys().collect::<Vec<_>>(), [&n1_alloc]);

        // n2's client reporting its alloc running changes nothing n1 holds.
        let running = AllocUpdate {
            alloc_id: n2_alloc.clone(),
            state: AllocState {
                client_status: ClientStatus::Running,
                ..AllocState::pending()
            }
            .into(),
        };
        server.update_allocs(&[running]).await.unwrap();
        let started = Instant::now();
        let unchanged = server.watch_allocs("n1", first.index, WAIT).await.unwrap();
        assert_eq!(started.elapsed(), WAIT, "n1 waited its whole wait");
        assert_eq!(unchanged, first);

        // Stopping n1's alloc gives it a new modify index: n1 is answered at once.
        server.stop_alloc(&n1_alloc).unwrap();
        let started = Instant::now();
        let changed = server.watch_allocs("n1", first.index, WAIT).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert!(changed.index > first.index);
        assert!(changed.allocs[&n1_alloc] > first.allocs[&n1_alloc]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reopened_server_takes_a_watch_from_before_where_it_was() {
        let db = std::sync::Arc::new(crate::state::MemoryStateDb::new());
        let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
        server
            .register_node("n1", &Default::default())
            .await
            .unwrap();
        server
            .register_job(spec("web", JobType::Service, 1))
            .unwrap();
        let before = server.watch_allocs("n1", 0, WAIT).await.unwrap();
        drop(server);
        let reopened = EmbeddedServer::open(ServerConfig::default(), db).unwrap();

        // Nothing changed: the watch waits, then answers with the same set.
        let started = Instant::now();
        let after = reopened
            .watch_allocs("n1", before.index, WAIT)
            .await
            .unwrap();
        assert_eq!(started.elapsed(), WAIT);
        assert_eq!(after.allocs, before.allocs);
        assert!(after.index >= before.index);

        // A change after the restart wakes it at once.
        reopened
            .register_job(spec("web", JobType::Service, 2))
            .unwrap();
        let started = Instant::now();
        let woken = reopened
            .watch_allocs("n1", after.index, WAIT)
            .await
            .unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(woken.allocs.len(), 2);
    }
}
