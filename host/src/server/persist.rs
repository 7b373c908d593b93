//! Saving and restoring the embedded server's state on its [`StateDb`]: reading every record
//! back at open, and writing after each change only what it touched.
//!
//! Invariants, each for the reason given:
//! - Every mutation of a job or alloc goes through the tracked accessors here, which mark it
//!   dirty (removed ones too): a change then writes only the records it touched plus the
//!   small metadata record, so a save costs the size of the change, not of the cluster.
//! - Dirty marks are cleared only once their write is committed. A failed save reads the
//!   state back instead (`forget_unsaved_changes`), so a change refused to its caller is not
//!   written by the next one; only a store that cannot be read back (cluster mode's) leaves
//!   the marks for the next change to write.
//! - A record that cannot be read is skipped with a WARN naming it; a store that cannot be
//!   read is an error: one bad record must not keep the agent from starting, and a store this
//!   build cannot read is the operator's to look at.
//! - The index read back is at least every alloc's modify index, so a client watching from
//!   an index it was given before the restart sees every later change.

use super::State;
use super::drain::NodeSchedule;
use super::placement::Nodes;
use super::records::{
    AllocRecord, JobRecord, META_KEY, NODE_SCHEDULES_KEY, NODES_KEY, SavedAllocRecord, SavedMeta,
    encode,
};
use crate::model::node::NodeInfo;
use crate::state::{ServerTable, StateDb, StateError, Write, call_store};
use std::collections::BTreeSet;

/// The registered nodes' record: each with what it said of itself, or, as saved before
/// nodes described themselves, their names alone.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum SavedNodes {
    Described(Nodes),
    Named(BTreeSet<String>),
}

impl SavedNodes {
    fn into_nodes(self) -> Nodes {
        match self {
            SavedNodes::Described(nodes) => nodes,
            SavedNodes::Named(names) => names
                .into_iter()
                .map(|name| (name, NodeInfo::default()))
                .collect(),
        }
    }
}

impl State {
    /// Everything `db` holds for the server (see the module docs for what is skipped).
    pub(super) fn load(db: &dyn StateDb) -> Result<State, StateError> {
        let mut state = State::default();
        let records = |table| call_store(db, || db.server_records(table));
        let mut nodes_record = None;
        let mut names_in_meta = BTreeSet::new();
        for (key, bytes) in records(ServerTable::Meta)? {
            let read = if key == NODES_KEY {
                serde_json::from_slice::<SavedNodes>(&bytes).map(|nodes| {
                    nodes_record = Some(nodes.into_nodes());
                })
            } else if key == NODE_SCHEDULES_KEY {
                serde_json::from_slice(&bytes).map(|schedules| state.schedules = schedules)
            } else {
                serde_json::from_slice::<SavedMeta>(&bytes).map(|meta| {
                    state.index = meta.index;
                    state.next_sequence = meta.next_sequence;
                    names_in_meta = meta.nodes;
                })
            };
            if let Err(error) = read {
                tracing::warn!(key, error = %error, "skipping unreadable server metadata");
            }
        }
        match nodes_record {
            Some(nodes) => state.nodes = nodes,
            // A state file from before the nodes had their own record has them in the
            // counters, which the next save writes without them: save them apart then.
            // (Cluster mode's live nodes come this way too, and register again at takeover
            // with what they say of themselves.)
            None => {
                state.nodes = names_in_meta
                    .into_iter()
                    .map(|name| (name, NodeInfo::default()))
                    .collect();
                state.dirty_nodes = !state.nodes.is_empty();
            }
        }
        let names: Vec<String> = state.nodes.keys().cloned().collect();
        for node in names {
            state.refresh_placeable(&node);
        }
        for (job_id, bytes) in records(ServerTable::Jobs)? {
            match serde_json::from_slice::<JobRecord>(&bytes) {
                Ok(job) => {
                    state.jobs.insert(job_id, job);
                }
                Err(error) => {
                    tracing::warn!(job_id, error = %error, "skipping unreadable saved job")
                }
            }
        }
        for (alloc_id, bytes) in records(ServerTable::Allocs)? {
            match serde_json::from_slice::<SavedAllocRecord>(&bytes) {
                Ok(saved) => {
                    let record = saved.into_record();
                    state.index = state.index.max(record.alloc.modify_index);
                    if record.node_id.is_none() && !record.is_terminal() {
                        state.waiting.insert(alloc_id.clone());
                    }
                    if record.disconnected_unix_ms.is_some() {
                        state.unknown.insert(alloc_id.clone());
                    }
                    state.allocs.insert(alloc_id, record);
                }
                Err(error) => {
                    tracing::warn!(alloc_id, error = %error, "skipping unreadable saved allocation")
                }
            }
        }
        state.saved_index = state.index;
        state.node_allocs = super::node_watch::NodeAllocIndex::build(&state.allocs, state.index);
        // Allocs left waiting by the last run are tried again at the first change.
        state.room_made = !state.waiting.is_empty();
        tracing::debug!(
            jobs = state.jobs.len(),
            allocs = state.allocs.len(),
            index = state.index,
            "server state restored"
        );
        Ok(state)
    }

    /// After a failed save: the state becomes what `db` holds again, but for what is kept
    /// in memory only and is still true: the nodes' alloc index (only a save moves it, so it
    /// already is what `db` holds, and the nodes' watches wait on it) and what departed
    /// nodes said of themselves. When `db` cannot be read back, `reload_pending` says so:
    /// nothing is saved until a later attempt succeeds (see `EmbeddedServer::change`).
    /// A store that does not read back (cluster mode's) keeps the change in memory.
    pub(super) fn forget_unsaved_changes(&mut self, db: &dyn StateDb) {
        if !db.reads_back_saved_state() {
            return;
        }
        match call_store(db, || State::load(db)) {
            Ok(mut saved) => {
                std::mem::swap(&mut saved.node_allocs, &mut self.node_allocs);
                saved.departed = std::mem::take(&mut self.departed);
                // A node the forgotten change took down is a node again.
                saved
                    .departed
                    .retain(|node, _| !saved.nodes.contains_key(node));
                *self = saved;
            }
            Err(error) => {
                tracing::error!(
                    error = %error,
                    "cannot read the server state back after a failed save; nothing is saved until it can be"
                );
                self.reload_pending = true;
            }
        }
    }

    pub(super) fn job_mut(&mut self, job_id: &str) -> Option<&mut JobRecord> {
        self.dirty_jobs.insert(job_id.to_string());
        self.jobs.get_mut(job_id)
    }

    pub(super) fn insert_job(&mut self, job_id: String, job: JobRecord) {
        self.dirty_jobs.insert(job_id.clone());
        self.jobs.insert(job_id, job);
    }

    pub(super) fn remove_job(&mut self, job_id: &str) {
        self.dirty_jobs.insert(job_id.to_string());
        self.jobs.remove(job_id);
    }

    pub(super) fn alloc_mut(&mut self, alloc_id: &str) -> Option<&mut AllocRecord> {
        self.dirty_allocs.insert(alloc_id.to_string());
        self.allocs.get_mut(alloc_id)
    }

    pub(super) fn insert_alloc(&mut self, record: AllocRecord) {
        self.dirty_allocs.insert(record.alloc.id.clone());
        if record.node_id.is_none() {
            self.waiting.insert(record.alloc.id.clone());
        }
        self.allocs.insert(record.alloc.id.clone(), record);
    }

    pub(super) fn remove_alloc(&mut self, alloc_id: &str) {
        self.dirty_allocs.insert(alloc_id.to_string());
        self.waiting.remove(alloc_id);
        self.unknown.remove(alloc_id);
        self.allocs.remove(alloc_id);
    }

    /// The writes that save every dirty job and alloc (deletes for removed ones) and the
    /// metadata.
    pub(super) fn dirty_writes(&self) -> Vec<Write> {
        let mut writes = Vec::with_capacity(self.dirty_jobs.len() + self.dirty_allocs.len() + 1);
        for job_id in &self.dirty_jobs {
            writes.push(match self.jobs.get(job_id) {
                Some(job) => Write::PutServer {
                    table: ServerTable::Jobs,
                    key: job_id.clone(),
                    value: encode(job),
                },
                None => Write::DeleteServer {
                    table: ServerTable::Jobs,
                    key: job_id.clone(),
                },
            });
        }
        for alloc_id in &self.dirty_allocs {
            writes.push(match self.allocs.get(alloc_id) {
                Some(record) => Write::PutServer {
                    table: ServerTable::Allocs,
                    key: alloc_id.clone(),
                    value: encode(&SavedAllocRecord::from_record(record)),
                },
                None => Write::DeleteServer {
                    table: ServerTable::Allocs,
                    key: alloc_id.clone(),
                },
            });
        }
        writes.push(Write::PutServer {
            table: ServerTable::Meta,
            key: META_KEY.into(),
            value: encode(&SavedMeta {
                index: self.index,
                next_sequence: self.next_sequence,
                nodes: BTreeSet::new(),
            }),
        });
        if self.dirty_nodes {
            writes.push(Write::PutServer {
                table: ServerTable::Meta,
                key: NODES_KEY.into(),
                value: encode(&SavedNodes::Described(self.nodes.clone())),
            });
        }
        if self.dirty_schedules {
            writes.push(Write::PutServer {
                table: ServerTable::Meta,
                key: NODE_SCHEDULES_KEY.into(),
                value: encode(&self.schedules),
            });
        }
        writes
    }

    /// Whether anything is waiting to be saved: a change that leaves nothing dirty (a node
    /// registering again) needs no save.
    pub(super) fn has_unsaved_changes(&self) -> bool {
        !self.dirty_jobs.is_empty()
            || !self.dirty_allocs.is_empty()
            || self.dirty_nodes
            || self.dirty_schedules
    }

    /// Clears the dirty marks once their writes are committed.
    pub(super) fn mark_saved(&mut self) {
        self.dirty_jobs.clear();
        self.dirty_allocs.clear();
        self.dirty_nodes = false;
        self.dirty_schedules = false;
    }

    /// Adds `node` to the nodes allocs are placed on, or takes what it now says of
    /// itself; false when it was there already, saying the same.
    pub(super) fn add_node(&mut self, node: &str, info: NodeInfo) -> bool {
        if self.nodes.get(node) == Some(&info) {
            return false;
        }
        self.departed.remove(node);
        self.nodes.insert(node.to_string(), info);
        self.dirty_nodes = true;
        self.room_made = true;
        self.refresh_placeable(node);
        true
    }

    /// Takes `node` out of the nodes allocs are placed on, remembering what it said of itself.
    pub(super) fn remove_node(&mut self, node: &str) {
        if let Some(info) = self.nodes.remove(node) {
            self.dirty_nodes = true;
            // As many as could be registered: names that come and go cannot grow it for ever.
            if self.departed.len() >= super::MAX_NODES {
                self.departed.pop_first();
            }
            self.departed.insert(node.to_string(), info);
        }
        self.placeable.remove(node);
    }

    /// Sets what an operator wants of `node` (eligibility, drain); the default is not kept.
    pub(super) fn set_schedule(&mut self, node: &str, schedule: NodeSchedule) {
        if self.schedules.get(node).cloned().unwrap_or_default() == schedule {
            return;
        }
        if schedule.is_default() {
            self.schedules.remove(node);
        } else {
            self.schedules.insert(node.to_string(), schedule);
        }
        self.dirty_schedules = true;
        self.room_made = true;
        self.refresh_placeable(node);
    }

    /// Puts `node` in the placeable nodes when it is registered and eligible, takes it out
    /// otherwise.
    fn refresh_placeable(&mut self, node: &str) {
        let eligible = self.schedules.get(node).is_none_or(NodeSchedule::eligible);
        match self.nodes.get(node) {
            Some(info) if eligible => {
                self.placeable.insert(node.to_string(), info.clone());
            }
            _ => {
                self.placeable.remove(node);
            }
        }
    }

    /// Registered nodes that are ineligible or draining.
    pub(super) fn ineligible_nodes(&self) -> usize {
        self.nodes.len() - self.placeable.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::ServerApi;
    use crate::server::{EmbeddedServer, ServerConfig};
    use crate::state::MemoryStateDb;
    use std::sync::Arc;

    fn saved_node_list(db: &MemoryStateDb) -> Vec<Vec<u8>> {
        let records = db.server_records(ServerTable::Meta).unwrap();
        let nodes = records.into_iter().filter(|(key, _)| key == NODES_KEY);
        nodes.map(|(_, bytes)| bytes).collect()
    }

    #[tokio::test]
    async fn the_node_list_is_saved_when_it_changes_and_read_back() {
        let db = Arc::new(MemoryStateDb::new());
        let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
        let edge = NodeInfo {
            class: "edge".into(),
            ..NodeInfo::default()
        };
        server.register_node("n1", &edge).await.unwrap();
        server
            .register_node("n2", &Default::default())
            .await
            .unwrap();
        let saved: Vec<Nodes> = saved_node_list(&db)
            .iter()
            .map(|bytes| serde_json::from_slice(bytes).unwrap())
            .collect();
        assert_eq!(saved.len(), 1, "one record of the nodes");
        assert_eq!(saved[0].keys().collect::<Vec<_>>(), ["n1", "n2"]);
        let meta = db.server_records(ServerTable::Meta).unwrap();
        let (_, counters) = meta.iter().find(|(key, _)| key == META_KEY).unwrap();
        assert!(
            !String::from_utf8_lossy(counters).contains("n1"),
            "the counters record carries no node names"
        );
        drop(server);
        let reopened = EmbeddedServer::open(ServerConfig::default(), db).unwrap();
        assert_eq!(reopened.nodes(), ["n1", "n2"]);
        let details = reopened.node_details();
        assert_eq!(details[0].info, edge, "what a node said of itself is kept");
    }

    #[test]
    fn a_node_record_of_names_alone_opens_with_nodes_that_said_nothing() {
        let db = MemoryStateDb::new();
        db.apply(vec![Write::PutServer {
            table: ServerTable::Meta,
            key: NODES_KEY.into(),
            value: br#"["a","b"]"#.to_vec(),
        }])
        .unwrap();
        let state = State::load(&db).unwrap();
        assert_eq!(
            state.nodes,
            crate::server::testkit::nodes(&["a", "b"]),
            "nodes saved before they described themselves"
        );
    }

    #[tokio::test]
    async fn a_state_file_with_the_nodes_in_its_counters_still_opens_with_them() {
        let db = MemoryStateDb::new();
        let older = br#"{"index": 7, "next_sequence": 3, "nodes": ["old-node"]}"#.to_vec();
        db.apply(vec![Write::PutServer {
            table: ServerTable::Meta,
            key: META_KEY.into(),
            value: older,
        }])
        .unwrap();
        let state = State::load(&db).unwrap();
        assert_eq!(state.nodes.keys().collect::<Vec<_>>(), ["old-node"]);
        assert_eq!((state.index, state.next_sequence), (7, 3));

        // The first save moves them to their own record; they survive the next restart.
        let db = Arc::new(db);
        let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
        server
            .register_job(crate::server::testkit::spec(
                "web",
                crate::model::jobspec::JobType::Service,
                1,
            ))
            .unwrap();
        drop(server);
        let reopened = EmbeddedServer::open(ServerConfig::default(), db).unwrap();
        assert_eq!(reopened.nodes(), ["old-node"]);
    }
}
