//! The elected scheduler's store: the embedded server's [`StateDb`] seam, on etcd, fenced.
//!
//! The leader runs the same [`crate::server::EmbeddedServer`] as a single agent, opened on
//! this store instead of the agent's state file: its decisions are the same pure functions,
//! and every change it saves becomes one or more etcd transactions, each compared against
//! the leader key it won ([`Fence`]), so that a deposed leader waking from a pause cannot
//! place or stop anything.
//!
//! How the server's records map onto the keys of `docs/cluster.md`:
//! - a job record is `jobs/<job>`;
//! - an alloc record is `allocs/<node>/<alloc>`, or `unplaced/<alloc>` while it has no node,
//!   moved (deleted and written again, in one transaction) when it is placed. Its client
//!   state is not part of it: that is `status/<alloc>`, the node's key, read back into the
//!   record at load. The only state kept in the alloc key is `lost`, which the scheduler
//!   decides itself. A save that leaves an alloc's key value unchanged writes nothing, so a
//!   client's state report does not rewrite the alloc its node watches;
//! - removing an alloc deletes its key and its `status/` key together;
//! - the server's counters are `scheduler` (only the sequence counter matters here: the
//!   index is etcd's revision, and the nodes are the live ones, read from `live/`).
//!
//! It holds only the server's tables: the client's records stay in each agent's own state
//! file. Any failure to save (the fence lost, etcd unreachable past the retries) deposes the
//! leader ([`EtcdSchedulerDb::deposed`]): the next leader starts again from what etcd holds,
//! rather than this one guessing which of its writes landed.

use super::keys;
use super::lease::{Fence, FencedOp, MAX_FENCED_OPS};
use super::store::{EtcdStore, KeyValue, StoreError};
use crate::locks::LockUnpoisoned;
use crate::server::records::{META_KEY, SavedAllocRecord, SavedMeta, encode};
use crate::state::{SavedAlloc, ServerTable, StateDb, StateError, Write};
use crate::structs::{AllocState, ClientStatus};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use tokio::sync::watch;

/// A server table's records: key and saved bytes.
type Records = Vec<(String, Vec<u8>)>;

/// The scheduler's counters, as saved in etcd.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct SchedulerMeta {
    next_sequence: u64,
}

/// What one consistent read of the cluster found, for the leader to start from.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The revision of the read: watches go on from the next one.
    pub revision: i64,
    /// Live nodes (those whose `live/` key exists).
    pub live: BTreeSet<String>,
}

/// The server's tables on etcd, written under a [`Fence`]. See the module docs.
pub struct EtcdSchedulerDb {
    store: EtcdStore,
    fence: Fence,
    handle: tokio::runtime::Handle,
    /// What the server reads back at open, once.
    loaded: Mutex<BTreeMap<&'static str, Records>>,
    /// What each alloc's key holds now (key, value), and the counters: what saves compare
    /// with, to write only what changed.
    written: Mutex<Written>,
    deposed: watch::Sender<bool>,
}

#[derive(Default)]
struct Written {
    allocs: HashMap<String, (String, Vec<u8>)>,
    meta: SchedulerMeta,
}

fn table_name(table: ServerTable) -> &'static str {
    match table {
        ServerTable::Jobs => "jobs",
        ServerTable::Allocs => "allocs",
        ServerTable::Meta => "meta",
    }
}

/// Where an alloc record lives: under its node, or unplaced.
fn alloc_location(record: &SavedAllocRecord) -> String {
    match &record.node_id {
        Some(node) => keys::alloc_key(node, &record.alloc.id),
        None => keys::unplaced_key(&record.alloc.id),
    }
}

/// An alloc record as its key holds it: without the client's state, unless the scheduler
/// decided it (lost).
fn as_stored(mut record: SavedAllocRecord) -> SavedAllocRecord {
    let lost = record
        .client_state
        .as_ref()
        .is_some_and(|s| s.client_status == ClientStatus::Lost);
    if !lost {
        record.client_state = None;
    }
    record
}

impl EtcdSchedulerDb {
    /// Reads everything under the key prefix in one consistent read, for a leader that won
    /// `fence`. Must be called on a multi-threaded runtime: saves block on etcd.
    pub async fn load(
        store: &EtcdStore,
        fence: Fence,
    ) -> Result<(EtcdSchedulerDb, Snapshot), StoreError> {
        let (entries, revision) = store.list(super::KEY_PREFIX).await?;
        let mut by_prefix: BTreeMap<&str, Vec<KeyValue>> = BTreeMap::new();
        let prefixes = [
            ("jobs", keys::jobs_prefix()),
            ("allocs", keys::allocs_prefix()),
            ("unplaced", keys::unplaced_prefix()),
            ("status", keys::status_prefix()),
            ("live", keys::live_prefix()),
        ];
        let mut meta = SchedulerMeta::default();
        for kv in entries {
            if kv.key == keys::scheduler_meta_key() {
                meta = serde_json::from_slice(&kv.value).unwrap_or_else(|error| {
                    tracing::warn!(%error, "the scheduler's counters in etcd cannot be read; starting them again");
                    SchedulerMeta::default()
                });
                continue;
            }
            if let Some((name, _)) = prefixes.iter().find(|(_, p)| kv.key.starts_with(p)) {
                by_prefix.entry(name).or_default().push(kv);
            }
        }
        let take = |name: &str, by_prefix: &mut BTreeMap<&str, Vec<KeyValue>>| {
            by_prefix.remove(name).unwrap_or_default()
        };
        let live: BTreeSet<String> = take("live", &mut by_prefix)
            .into_iter()
            .filter_map(|kv| Some(kv.key.strip_prefix(&keys::live_prefix())?.to_string()))
            .collect();
        let statuses: HashMap<String, AllocState> = take("status", &mut by_prefix)
            .into_iter()
            .filter_map(|kv| {
                let id = kv.key.strip_prefix(&keys::status_prefix())?.to_string();
                Some((id, serde_json::from_slice(&kv.value).ok()?))
            })
            .collect();
        let jobs = take("jobs", &mut by_prefix)
            .into_iter()
            .filter_map(|kv| {
                Some((
                    kv.key.strip_prefix(&keys::jobs_prefix())?.to_string(),
                    kv.value,
                ))
            })
            .collect();
        let mut written = Written {
            meta,
            ..Written::default()
        };
        let mut allocs = Vec::new();
        let stored = take("allocs", &mut by_prefix)
            .into_iter()
            .chain(take("unplaced", &mut by_prefix));
        for kv in stored {
            let mut record: SavedAllocRecord = match serde_json::from_slice(&kv.value) {
                Ok(record) => record,
                Err(error) => {
                    tracing::warn!(key = %kv.key, %error, "skipping an alloc in etcd that cannot be read");
                    continue;
                }
            };
            let id = record.alloc.id.clone();
            written
                .allocs
                .insert(id.clone(), (kv.key.clone(), kv.value.clone()));
            let lost = record.client_state.is_some();
            if let Some(state) = statuses.get(&id) {
                // Lost stays lost until the node reports how the alloc ended.
                if !lost || state.client_status.is_terminal() {
                    record.client_state = Some(state.clone());
                }
            }
            allocs.push((id, encode(&record)));
        }
        let meta_record = SavedMeta {
            index: revision.max(0) as u64,
            next_sequence: meta.next_sequence,
            nodes: live.clone(),
        };
        let loaded = BTreeMap::from([
            ("jobs", jobs),
            ("allocs", allocs),
            ("meta", vec![(META_KEY.to_string(), encode(&meta_record))]),
        ]);
        let db = EtcdSchedulerDb {
            store: store.clone(),
            fence,
            handle: tokio::runtime::Handle::current(),
            loaded: Mutex::new(loaded),
            written: Mutex::new(written),
            deposed: watch::channel(false).0,
        };
        Ok((db, Snapshot { revision, live }))
    }

    /// Becomes true when a save failed: the leader must step down.
    pub fn deposed(&self) -> watch::Receiver<bool> {
        self.deposed.subscribe()
    }

    /// The etcd writes that save `writes`, and the alloc keys they leave behind.
    fn plan(&self, writes: Vec<Write>) -> Result<(Vec<FencedOp>, Written), StateError> {
        let current = self.written.lock_unpoisoned();
        let mut after = Written {
            allocs: current.allocs.clone(),
            meta: current.meta,
        };
        drop(current);
        let mut ops = Vec::new();
        for write in writes {
            match write {
                Write::PutServer {
                    table: ServerTable::Jobs,
                    key,
                    value,
                } => ops.push(FencedOp::Put {
                    key: keys::job_key(&key),
                    value,
                }),
                Write::DeleteServer {
                    table: ServerTable::Jobs,
                    key,
                } => ops.push(FencedOp::Delete {
                    key: keys::job_key(&key),
                }),
                Write::PutServer {
                    table: ServerTable::Allocs,
                    key,
                    value,
                } => {
                    let record: SavedAllocRecord = serde_json::from_slice(&value)
                        .map_err(|e| StateError::Io(format!("alloc record {key}: {e}")))?;
                    let record = as_stored(record);
                    let location = alloc_location(&record);
                    let value = encode(&record);
                    match after.allocs.get(&key) {
                        Some((old, bytes)) if *old == location && *bytes == value => continue,
                        Some((old, _)) if *old != location => {
                            ops.push(FencedOp::Delete { key: old.clone() })
                        }
                        _ => {}
                    }
                    ops.push(FencedOp::Put {
                        key: location.clone(),
                        value: value.clone(),
                    });
                    after.allocs.insert(key, (location, value));
                }
                Write::DeleteServer {
                    table: ServerTable::Allocs,
                    key,
                } => {
                    if let Some((old, _)) = after.allocs.remove(&key) {
                        ops.push(FencedOp::Delete { key: old });
                    }
                    ops.push(FencedOp::Delete {
                        key: keys::status_key(&key),
                    });
                }
                Write::PutServer {
                    table: ServerTable::Meta,
                    value,
                    ..
                } => {
                    let saved: SavedMeta = serde_json::from_slice(&value)
                        .map_err(|e| StateError::Io(format!("server counters: {e}")))?;
                    let meta = SchedulerMeta {
                        next_sequence: saved.next_sequence,
                    };
                    if meta != after.meta {
                        ops.push(FencedOp::Put {
                            key: keys::scheduler_meta_key(),
                            value: encode(&meta),
                        });
                        after.meta = meta;
                    }
                }
                Write::DeleteServer {
                    table: ServerTable::Meta,
                    ..
                } => {}
                other => {
                    return Err(StateError::Io(format!(
                        "the cluster's store holds only the scheduler's records, not {other:?}"
                    )));
                }
            }
        }
        Ok((ops, after))
    }

    async fn write(&self, ops: &[FencedOp]) -> Result<(), StateError> {
        for chunk in ops.chunks(MAX_FENCED_OPS) {
            let held = self
                .store
                .write_fenced(&self.fence, chunk)
                .await
                .map_err(|e| StateError::Io(e.to_string()))?;
            if !held {
                return Err(StateError::Io(format!(
                    "this agent no longer holds {} (another agent leads): nothing more is written",
                    self.fence.key
                )));
            }
        }
        Ok(())
    }
}

impl StateDb for EtcdSchedulerDb {
    fn apply(&self, writes: Vec<Write>) -> Result<(), StateError> {
        if *self.deposed.borrow() {
            return Err(StateError::Io("this agent stepped down as leader".into()));
        }
        let (ops, after) = self.plan(writes)?;
        if ops.is_empty() {
            return Ok(());
        }
        // The server saves synchronously, under its lock; etcd is async. The server calls
        // this through `state::blocking`, so this worker may block on the runtime.
        let written = tokio::task::block_in_place(|| self.handle.block_on(self.write(&ops)));
        match written {
            Ok(()) => {
                *self.written.lock_unpoisoned() = after;
                Ok(())
            }
            Err(error) => {
                tracing::warn!(%error, "the scheduler cannot save to etcd; stepping down");
                self.deposed.send_replace(true);
                Err(error)
            }
        }
    }

    fn client_allocs(&self) -> Result<Vec<SavedAlloc>, StateError> {
        Ok(Vec::new())
    }

    fn server_records(&self, table: ServerTable) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        Ok(self
            .loaded
            .lock_unpoisoned()
            .remove(table_name(table))
            .unwrap_or_default())
    }
}
