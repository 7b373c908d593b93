//! Saving and restoring the embedded server's state on its [`StateDb`]: reading every record
//! back at open, and writing after each change only what it touched.
//!
//! Invariants, each for the reason given:
//! - Every mutation of a job or alloc goes through the tracked accessors here, which mark it
//!   dirty (removed ones too): a change then writes only the records it touched plus the
//!   small metadata record, so a save costs the size of the change, not of the cluster.
//! - Dirty marks are cleared only once their write is committed: a failed save leaves them
//!   for the next change to write.
//! - A record that cannot be read is skipped with a WARN naming it; a store that cannot be
//!   read is an error: one bad record must not keep the agent from starting, and a store this
//!   build cannot read is the operator's to look at.
//! - The index read back is at least every alloc's modify index, so a client watching from
//!   an index it was given before the restart sees every later change.

use super::State;
use super::records::{AllocRecord, JobRecord, META_KEY, SavedAllocRecord, SavedMeta, encode};
use crate::state::{ServerTable, StateDb, StateError, Write, blocking};

impl State {
    /// Everything `db` holds for the server (see the module docs for what is skipped).
    pub(super) fn load(db: &dyn StateDb) -> Result<State, StateError> {
        let mut state = State::default();
        let records = |table| blocking(|| db.server_records(table));
        for (key, bytes) in records(ServerTable::Meta)? {
            match serde_json::from_slice::<SavedMeta>(&bytes) {
                Ok(meta) => {
                    state.index = meta.index;
                    state.next_sequence = meta.next_sequence;
                    state.nodes = meta.nodes;
                }
                Err(error) => {
                    tracing::warn!(key, error = %error, "skipping unreadable server metadata")
                }
            }
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
                    state.allocs.insert(alloc_id, record);
                }
                Err(error) => {
                    tracing::warn!(alloc_id, error = %error, "skipping unreadable saved allocation")
                }
            }
        }
        state.node_allocs = super::node_watch::NodeAllocIndex::build(&state.allocs, state.index);
        tracing::debug!(
            jobs = state.jobs.len(),
            allocs = state.allocs.len(),
            index = state.index,
            "server state restored"
        );
        Ok(state)
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
        self.allocs.insert(record.alloc.id.clone(), record);
    }

    pub(super) fn remove_alloc(&mut self, alloc_id: &str) {
        self.dirty_allocs.insert(alloc_id.to_string());
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
                nodes: self.nodes.clone(),
            }),
        });
        writes
    }

    /// Clears the dirty marks once their writes are committed.
    pub(super) fn mark_saved(&mut self) {
        self.dirty_jobs.clear();
        self.dirty_allocs.clear();
    }
}
