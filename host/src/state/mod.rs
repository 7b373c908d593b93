//! The state store: what the client and the embedded server save so that a restart, clean or
//! `kill -9`, loses nothing.
//!
//! [`StateDb`] is the seam, with three implementations:
//! - [`RedbStateDb`]: durable, one crash-safe transactional file (`state.db` under the data
//!   dir), the role BoltDB plays for Nomad.
//! - [`MemoryStateDb`]: the same semantics in memory, for tests and `caravan run`.
//! - `FaultyStateDb` (feature `testing` only, re-exported by `testing`): wraps another store
//!   and fails its writes or reads on demand, for tests of what the client does when saving
//!   fails.
//!
//! Every implementation keeps and returns the same bytes: the typed writes are turned into
//! rows of named tables by one function (`rows_of`), each row's bytes are made by one other
//! (`RowValue::into_bytes`; the memory store makes them when a row is read, not when it is
//! written) and rows are read back by a third (`assemble_client_allocs`), so the stores
//! cannot drift apart in what they keep.
//!
//! This module knows the plain data in [`crate::model::structs`] and nothing of the client, the server
//! or wasmtime; it may touch only its own file. The server's records are opaque bytes here;
//! the server encodes them.

#[cfg(any(test, feature = "testing"))]
mod faulty;
mod memory;
mod redb_db;

#[cfg(any(test, feature = "testing"))]
pub use faulty::FaultyStateDb;
pub use memory::MemoryStateDb;
pub use redb_db::{RedbStateDb, STATE_FILE};

use crate::model::structs::{Alloc, AllocState};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The schema this build reads and writes. Bump it, and add a migration, whenever the meaning
/// or encoding of a table changes.
pub const SCHEMA_VERSION: u32 = 1;

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file is not a state store this build can use; nothing was written to it.
    #[error("state store {path}: {reason}")]
    Refused {
        /// The file.
        path: String,
        /// What is wrong with it, and what this build supports.
        reason: String,
    },
    /// Reading or writing failed.
    #[error("state store: {0}")]
    Io(String),
    /// A failure injected by `FaultyStateDb` (the `testing` feature).
    #[error("injected failure: {0}")]
    Injected(String),
}

/// One change to the store. A batch of them is applied atomically by [`StateDb::apply`].
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Saves a client alloc (a new one, or a new version of it), replacing the old record.
    PutAlloc(Arc<Alloc>),
    /// Saves the state its runner last reported.
    PutAllocState {
        /// The alloc.
        alloc_id: String,
        /// Its state, shared with the queue that saves it (a report is copied once).
        state: Arc<AllocState>,
    },
    /// Saves the state the server last acknowledged.
    PutAckedState {
        /// The alloc.
        alloc_id: String,
        /// The state the server took.
        state: Arc<AllocState>,
    },
    /// Saves the runner's checkpoint, replacing the previous one.
    PutCheckpoint {
        /// The alloc.
        alloc_id: String,
        /// Opaque bytes from the guest.
        data: Vec<u8>,
    },
    /// The alloc was collected: its checkpoint is deleted and it is marked collected, so a
    /// restart keeps answering for it but never runs it again. Its other records stay until
    /// [`Write::DeleteAlloc`].
    MarkCollected(String),
    /// Deletes every record of a client alloc (the server dropped it). Deleting what is not
    /// there is not an error.
    DeleteAlloc(String),
    /// Saves one server record under `key`, replacing any old one.
    PutServer {
        /// Which server table.
        table: ServerTable,
        /// The record's key (a job or alloc id, or a fixed name for metadata).
        key: String,
        /// The record, encoded by the server.
        value: Vec<u8>,
    },
    /// Deletes one server record; deleting what is not there is not an error.
    DeleteServer {
        /// Which server table.
        table: ServerTable,
        /// The record's key.
        key: String,
    },
}

/// The server's tables. Their records are opaque to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServerTable {
    /// Jobs by id.
    Jobs,
    /// Allocs by id.
    Allocs,
    /// Indexes and the node list.
    Meta,
    /// ACL tokens by their secret's digest (`crate::acl`), and the bootstrap marker.
    AclTokens,
}

/// Everything saved about one client alloc. A record that is present but does not decode is
/// `Some(Err(reason))`: the caller decides what that costs (one alloc, never the agent).
#[derive(Debug, Clone, PartialEq)]
pub struct SavedAlloc {
    /// The alloc's id (the key every record is saved under).
    pub alloc_id: String,
    /// The alloc itself.
    pub alloc: Option<Result<Alloc, String>>,
    /// The state its runner last reported.
    pub state: Option<Result<AllocState, String>>,
    /// The state the server last acknowledged.
    pub acked: Option<Result<AllocState, String>>,
    /// The runner's last checkpoint.
    pub checkpoint: Option<Vec<u8>>,
    /// True once the alloc was collected ([`Write::MarkCollected`]).
    pub collected: bool,
}

/// Where client and server state is kept.
///
/// # Semantics
/// - [`apply`](StateDb::apply) is atomic: every write of the batch lands, in order, or none
///   does. When it returns `Ok`, the durable store has the batch on disk.
/// - Reads see every batch that returned `Ok` before they began, and no part of any other.
/// - "Not found" is never an error: a missing alloc is absent from
///   [`client_allocs`](StateDb::client_allocs), a missing record is `None`, and deleting
///   something absent succeeds.
///
/// # Concurrency
/// Every method may be called from any thread. Batches are applied one at a time; a caller
/// that needs an order between two batches must wait for the first before sending the second.
/// Methods block the calling thread for the store's I/O (a disk sync for [`RedbStateDb`]),
/// unless [`waits_on_io`](StateDb::waits_on_io) says the store has none.
pub trait StateDb: Send + Sync + 'static {
    /// Applies `writes` in one transaction (see the trait docs).
    fn apply(&self, writes: Vec<Write>) -> Result<(), StateError>;

    /// Every client alloc with at least one record, ordered by id.
    fn client_allocs(&self) -> Result<Vec<SavedAlloc>, StateError>;

    /// Every record of one server table, ordered by key.
    fn server_records(&self, table: ServerTable) -> Result<Vec<(String, Vec<u8>)>, StateError>;

    /// The last checkpoint saved for client alloc `alloc_id` (`None`: it saved none, or is
    /// unknown). Read once per alloc moved off a drained node; the default reads every
    /// client alloc, which a store may do better.
    fn client_checkpoint(&self, alloc_id: &str) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self
            .client_allocs()?
            .into_iter()
            .find(|saved| saved.alloc_id == alloc_id)
            .and_then(|saved| saved.checkpoint))
    }

    /// Whether [`StateDb::server_records`] reads what was saved every time it is called, so
    /// that the server can read its state back after a save fails (and forget the change
    /// that failed). Stores opt in: one that hands its records over once (cluster mode's,
    /// whose failed save ends the leadership anyway) must not be read twice. Fixed for the
    /// store's life.
    fn reads_back_saved_state(&self) -> bool {
        false
    }

    /// Whether a call may wait on I/O. Callers on an async worker hand such calls to
    /// [`call_store`]; a store that never waits (one held in memory) is called in place,
    /// which spares each commit a hand-over of the worker to another thread. Fixed for the
    /// store's life.
    fn waits_on_io(&self) -> bool {
        true
    }

    /// How long a commit of the client's persister takes on tokio's clock before it is
    /// applied: zero for every real store, whose commits take their time inside
    /// [`apply`](StateDb::apply). A store standing in for a slow disk in a simulation, where
    /// `apply` takes no time, returns one; the persister holds the batch in flight that long
    /// while the client's other tasks go on, as they do beside a real slow commit.
    fn commit_delay(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// The tables rows live in. One row is (table, key) -> value ([`RowValue`]: bytes, or a record
/// that becomes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Table {
    Allocs,
    AllocStates,
    AckedStates,
    Checkpoints,
    Collected,
    Server(ServerTable),
}

impl Table {
    const CLIENT: [Table; 5] = [
        Table::Allocs,
        Table::AllocStates,
        Table::AckedStates,
        Table::Checkpoints,
        Table::Collected,
    ];

    /// The table's name in the durable file.
    fn name(self) -> &'static str {
        match self {
            Table::Allocs => "client_allocs",
            Table::AllocStates => "client_alloc_states",
            Table::AckedStates => "client_acked_states",
            Table::Checkpoints => "client_checkpoints",
            Table::Collected => "client_collected",
            Table::Server(ServerTable::Jobs) => "server_jobs",
            Table::Server(ServerTable::Allocs) => "server_allocs",
            Table::Server(ServerTable::Meta) => "server_meta",
            Table::Server(ServerTable::AclTokens) => "acl_tokens",
        }
    }
}

/// One row change: a put, or a delete when the value is `None`.
type RowChange = (Table, String, Option<RowValue>);

/// A row's value as written: bytes, or a record whose bytes are made by
/// [`RowValue::into_bytes`] whenever they are needed. Records are shared and never change,
/// so their bytes are the same whenever they are made; a store held in memory keeps the
/// record and spares every state report its encoding, which only a read (a restore) needs.
#[derive(Debug, Clone)]
enum RowValue {
    Bytes(Vec<u8>),
    Alloc(Arc<Alloc>),
    State(Arc<AllocState>),
}

impl RowValue {
    /// The row's bytes, as every store keeps or returns them.
    fn into_bytes(self) -> Vec<u8> {
        match self {
            RowValue::Bytes(bytes) => bytes,
            RowValue::Alloc(alloc) => json(&*alloc),
            RowValue::State(state) => json(&*state),
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    // Our own plain data types always serialize; a failure would be a bug in a derive.
    serde_json::to_vec(value).expect("state records serialize to JSON")
}

/// The row changes a batch of writes makes, in order.
fn rows_of(writes: Vec<Write>) -> Vec<RowChange> {
    let mut rows = Vec::with_capacity(writes.len());
    for write in writes {
        match write {
            Write::PutAlloc(alloc) => {
                rows.push((
                    Table::Allocs,
                    alloc.id.clone(),
                    Some(RowValue::Alloc(alloc)),
                ));
            }
            Write::PutAllocState { alloc_id, state } => {
                rows.push((Table::AllocStates, alloc_id, Some(RowValue::State(state))));
            }
            Write::PutAckedState { alloc_id, state } => {
                rows.push((Table::AckedStates, alloc_id, Some(RowValue::State(state))));
            }
            Write::PutCheckpoint { alloc_id, data } => {
                rows.push((Table::Checkpoints, alloc_id, Some(RowValue::Bytes(data))));
            }
            Write::MarkCollected(alloc_id) => {
                rows.push((Table::Checkpoints, alloc_id.clone(), None));
                rows.push((
                    Table::Collected,
                    alloc_id,
                    Some(RowValue::Bytes(Vec::new())),
                ));
            }
            Write::DeleteAlloc(alloc_id) => {
                for table in Table::CLIENT {
                    rows.push((table, alloc_id.clone(), None));
                }
            }
            Write::PutServer { table, key, value } => {
                rows.push((Table::Server(table), key, Some(RowValue::Bytes(value))));
            }
            Write::DeleteServer { table, key } => rows.push((Table::Server(table), key, None)),
        }
    }
    rows
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("saved {what} cannot be read: {e}"))
}

/// Builds the saved allocs from the client tables' rows.
fn assemble_client_allocs(
    mut rows: impl FnMut(Table) -> Result<Vec<(String, Vec<u8>)>, StateError>,
) -> Result<Vec<SavedAlloc>, StateError> {
    let mut saved: BTreeMap<String, SavedAlloc> = BTreeMap::new();
    for table in Table::CLIENT {
        for (alloc_id, bytes) in rows(table)? {
            let entry = saved.entry(alloc_id.clone()).or_insert_with(|| SavedAlloc {
                alloc_id,
                alloc: None,
                state: None,
                acked: None,
                checkpoint: None,
                collected: false,
            });
            match table {
                Table::Allocs => entry.alloc = Some(decode("alloc", &bytes)),
                Table::AllocStates => entry.state = Some(decode("alloc state", &bytes)),
                Table::AckedStates => entry.acked = Some(decode("acknowledged state", &bytes)),
                Table::Checkpoints => entry.checkpoint = Some(bytes),
                Table::Collected => entry.collected = true,
                Table::Server(_) => {}
            }
        }
    }
    Ok(saved.into_values().collect())
}

/// Runs a store call on this thread, letting a multi-threaded tokio runtime move its other
/// tasks to another worker while the call waits for the disk. (On a current-thread runtime,
/// as in tests with paused time, it simply runs.)
pub fn blocking<T>(call: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(call),
        _ => call(),
    }
}

/// Runs `call`, a call into `db`, from an async worker: through [`blocking`] when the store
/// may wait on I/O, in place when it never does.
pub fn call_store<T>(db: &dyn StateDb, call: impl FnOnce() -> T) -> T {
    if db.waits_on_io() {
        blocking(call)
    } else {
        call()
    }
}

#[cfg(test)]
mod contract;
