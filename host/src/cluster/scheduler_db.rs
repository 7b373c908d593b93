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
//! Saves run on a thread of their own, with its own runtime and etcd connection: the server
//! saves under its lock, which the agent's tasks take from its runtime's workers, so a save
//! that needed those workers (the etcd client's background tasks run there) could wait for
//! ever on workers that wait on the lock. In a simulation that thread is part of it, in
//! lockstep (`util::determinism::runtime_for_thread`): the simulation's one thread waits,
//! blocked, while the writer works, so a save takes no simulated time.
//!
//! It holds only the server's tables: the client's records stay in each agent's own state
//! file. Any failure to save (the fence lost, etcd unreachable past the retries) deposes the
//! leader ([`EtcdSchedulerDb::deposed`]): the next leader starts again from what etcd holds,
//! rather than this one guessing which of its writes landed.

use super::keys;
use super::lease::{Fence, FencedOp, FencedWriter, MAX_FENCED_OPS};
use super::member::MemberRecord;
use super::store::{EtcdStore, KeyValue, StoreError};
use crate::model::node::NodeInfo;
use crate::model::structs::{AllocState, ClientStatus};
use crate::server::records::{
    META_KEY, NODE_SCHEDULES_KEY, NODES_KEY, SavedAllocRecord, SavedMeta, encode,
};
use crate::state::{SavedAlloc, ServerTable, StateDb, StateError, Write};
use crate::util::locks::LockUnpoisoned;
use std::collections::{BTreeMap, HashMap};
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
    /// Live nodes (those whose `live/` key exists), with what each says of itself.
    pub live: BTreeMap<String, NodeInfo>,
}

/// The server's tables on etcd, written under a [`Fence`]. See the module docs.
pub struct EtcdSchedulerDb {
    writer: Writer,
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
        // Never the scheduler's: tokens are kept apart, by `crate::cluster::EtcdTokens`.
        ServerTable::AclTokens => "acl",
    }
}

/// What a new leader reads, as ranges read at once: every prefix it loads, and the status
/// keys, as many as the allocs, in two halves of the alloc ids' hex (with the alloc keys, the
/// bulk of a cluster: three streams that etcd's members serve side by side); and its two
/// records.
fn takeover_ranges() -> Vec<(Vec<u8>, Vec<u8>)> {
    let whole = |prefix: String| {
        let end = super::store::prefix_end(prefix.as_bytes());
        (prefix.into_bytes(), end)
    };
    let one_key = |key: String| {
        let mut end = key.clone().into_bytes();
        end.push(0);
        (key.into_bytes(), end)
    };
    let status = keys::status_prefix();
    let status_middle = format!("{status}8").into_bytes();
    let status_end = super::store::prefix_end(status.as_bytes());
    vec![
        whole(keys::allocs_prefix()),
        (status.clone().into_bytes(), status_middle.clone()),
        (status_middle, status_end),
        whole(keys::jobs_prefix()),
        whole(keys::unplaced_prefix()),
        whole(keys::live_prefix()),
        one_key(keys::node_schedules_key()),
        one_key(keys::scheduler_meta_key()),
    ]
}

/// Where an alloc record lives: under its node, or unplaced.
fn alloc_location(record: &SavedAllocRecord) -> String {
    match &record.node_id {
        Some(node) => keys::alloc_key(node, &record.alloc.id),
        None => keys::unplaced_key(&record.alloc.id),
    }
}

/// An alloc record as its key holds it: without the client's state, unless the scheduler
/// decided it (lost, or unknown while its node is away).
fn as_stored(mut record: SavedAllocRecord) -> SavedAllocRecord {
    let lost = record
        .client_state
        .as_ref()
        .is_some_and(|s| matches!(s.client_status, ClientStatus::Lost | ClientStatus::Unknown));
    if !lost {
        record.client_state = None;
    }
    record
}

impl EtcdSchedulerDb {
    /// Reads everything under the key prefix in one consistent read, for a leader that won
    /// `fence`. Saves block the thread that makes them until etcd answers: call them from a
    /// multi-threaded runtime through `state::blocking` (or from a simulation's one thread).
    pub async fn load(
        store: &EtcdStore,
        fence: Fence,
    ) -> Result<(EtcdSchedulerDb, Snapshot), StoreError> {
        let listing = std::time::Instant::now();
        let (entries, revision) = store.list_ranges(&takeover_ranges()).await?;
        tracing::info!(
            keys = entries.len(),
            bytes = entries.iter().map(|kv| kv.value.len()).sum::<usize>(),
            list_ms = listing.elapsed().as_millis() as u64,
            "read the cluster's keys"
        );
        let mut by_prefix: BTreeMap<&str, Vec<KeyValue>> = BTreeMap::new();
        let prefixes = [
            ("jobs", keys::jobs_prefix()),
            ("allocs", keys::allocs_prefix()),
            ("unplaced", keys::unplaced_prefix()),
            ("status", keys::status_prefix()),
            ("live", keys::live_prefix()),
        ];
        let mut meta = SchedulerMeta::default();
        let mut schedules = None;
        for kv in entries {
            if kv.key == keys::node_schedules_key() {
                schedules = Some(kv.value);
                continue;
            }
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
        let live: BTreeMap<String, NodeInfo> = take("live", &mut by_prefix)
            .into_iter()
            .filter_map(|kv| {
                let node = kv.key.strip_prefix(&keys::live_prefix())?.to_string();
                Some((node, MemberRecord::node_info_in(&kv.key, &kv.value)))
            })
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
            nodes: live.keys().cloned().collect(),
        };
        let loaded = BTreeMap::from([
            ("jobs", jobs),
            ("allocs", allocs),
            (
                "meta",
                std::iter::once((META_KEY.to_string(), encode(&meta_record)))
                    .chain(schedules.map(|bytes| (NODE_SCHEDULES_KEY.to_string(), bytes)))
                    .collect(),
            ),
        ]);
        let db = EtcdSchedulerDb {
            writer: Writer::start(store.clone(), fence).await?,
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

    /// The etcd writes that save `writes`, one group per record (an alloc moved to its node
    /// is a delete and a put: never split between two transactions, or a leader dying in
    /// between would lose it), and the alloc keys they leave behind.
    ///
    /// The alloc groups go in the order of their keys, so node by node: a node's allocs of
    /// one save reach its watch in one or two transactions (when they fit in one,
    /// [`MAX_FENCED_OPS`]), and it starts them and reports their states together, in one
    /// status write, rather than in one for each of the transactions they were spread over
    /// in the server's order (its alloc ids'). That takes what the server's saves are: each
    /// alloc written at most once, and the allocs in one run, after the jobs.
    fn plan(&self, writes: Vec<Write>) -> Result<(Vec<Group>, SavedChanges), StateError> {
        // What the save changes, beside what is written: never a copy of every alloc's key
        // (a copy per save made each save cost as much as the whole cluster's allocs).
        let current = self.written.lock_unpoisoned();
        let mut after = Changes {
            allocs: HashMap::new(),
            meta: current.meta,
            current: &current.allocs,
        };
        let mut ops = Vec::new();
        // The alloc groups by the key that places them, to go where the first one came.
        let mut alloc_groups: Vec<(String, Group)> = Vec::new();
        let mut allocs_at = None;
        let mut counters = None;
        for write in writes {
            match write {
                Write::PutServer {
                    table: ServerTable::Jobs,
                    key,
                    value,
                } => ops.push(vec![FencedOp::Put {
                    key: keys::job_key(&key),
                    value,
                }]),
                Write::DeleteServer {
                    table: ServerTable::Jobs,
                    key,
                } => ops.push(vec![FencedOp::Delete {
                    key: keys::job_key(&key),
                }]),
                Write::PutServer {
                    table: ServerTable::Allocs,
                    key,
                    value,
                } => {
                    debug_assert!(!after.allocs.contains_key(&key), "alloc {key} twice");
                    let record: SavedAllocRecord = serde_json::from_slice(&value)
                        .map_err(|e| StateError::Io(format!("alloc record {key}: {e}")))?;
                    let record = as_stored(record);
                    let location = alloc_location(&record);
                    let value = encode(&record);
                    let mut group = Vec::with_capacity(2);
                    match after.get(&key) {
                        Some((old, bytes)) if *old == location && *bytes == value => continue,
                        Some((old, _)) if *old != location => {
                            group.push(FencedOp::Delete { key: old.clone() })
                        }
                        _ => {}
                    }
                    group.push(FencedOp::Put {
                        key: location.clone(),
                        value: value.clone(),
                    });
                    allocs_at.get_or_insert(ops.len());
                    alloc_groups.push((location.clone(), group));
                    after.allocs.insert(key, Some((location, value)));
                }
                Write::DeleteServer {
                    table: ServerTable::Allocs,
                    key,
                } => {
                    debug_assert!(!after.allocs.contains_key(&key), "alloc {key} twice");
                    let mut group = vec![FencedOp::Delete {
                        key: keys::status_key(&key),
                    }];
                    let mut placed_at = None;
                    if let Some((old, _)) = after.get(&key) {
                        group.push(FencedOp::Delete { key: old.clone() });
                        placed_at = Some(old.clone());
                    }
                    allocs_at.get_or_insert(ops.len());
                    alloc_groups.push((placed_at.unwrap_or_else(|| keys::status_key(&key)), group));
                    after.allocs.insert(key, None);
                }
                // Cluster nodes are known from their live keys, not from a saved list.
                Write::PutServer {
                    table: ServerTable::Meta,
                    key,
                    ..
                } if key == NODES_KEY => {}
                Write::PutServer {
                    table: ServerTable::Meta,
                    key,
                    value,
                } if key == NODE_SCHEDULES_KEY => ops.push(vec![FencedOp::Put {
                    key: keys::node_schedules_key(),
                    value,
                }]),
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
                        counters = Some(vec![FencedOp::Put {
                            key: keys::scheduler_meta_key(),
                            value: encode(&meta),
                        }]);
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
        if let Some(at) = allocs_at {
            alloc_groups.sort_by(|a, b| a.0.cmp(&b.0));
            ops.splice(at..at, alloc_groups.into_iter().map(|(_, group)| group));
        }
        // First: a save cut short must not let the next leader reuse sequence numbers.
        if let Some(counters) = counters {
            ops.insert(0, counters);
        }
        Ok((ops, after.into_owned()))
    }
}

/// A save's changes to [`Written`], over the keys as they were before it: each alloc put
/// (`Some`) or deleted (`None`), and the counters after it.
struct Changes<'a> {
    allocs: HashMap<String, Option<(String, Vec<u8>)>>,
    meta: SchedulerMeta,
    current: &'a HashMap<String, (String, Vec<u8>)>,
}

impl Changes<'_> {
    /// Where alloc `key` is written, and its bytes, once the changes so far are made.
    fn get(&self, key: &str) -> Option<&(String, Vec<u8>)> {
        match self.allocs.get(key) {
            Some(changed) => changed.as_ref(),
            None => self.current.get(key),
        }
    }

    fn into_owned(self) -> SavedChanges {
        SavedChanges {
            allocs: self.allocs,
            meta: self.meta,
        }
    }
}

/// [`Changes`] once planned, to make in [`Written`] when the save lands.
struct SavedChanges {
    allocs: HashMap<String, Option<(String, Vec<u8>)>>,
    meta: SchedulerMeta,
}

impl Written {
    fn apply(&mut self, changes: SavedChanges) {
        for (key, change) in changes.allocs {
            match change {
                Some(written) => self.allocs.insert(key, written),
                None => self.allocs.remove(&key),
            };
        }
        self.meta = changes.meta;
    }
}

/// Writes that land in one transaction or not at all.
type Group = Vec<FencedOp>;

/// One save: its writes, and where to say how it went.
type Save = (Vec<Group>, std::sync::mpsc::Sender<Result<(), StateError>>);

/// The thread that makes the saves (see the module docs); it ends when its sender is
/// dropped.
struct Writer {
    saves: tokio::sync::mpsc::UnboundedSender<Save>,
}

impl Writer {
    /// `like`: the store whose cluster and access the writer's own connection copies (made
    /// on the writer's thread's runtime, which its calls must run on).
    async fn start(like: EtcdStore, fence: Fence) -> Result<Writer, StoreError> {
        let (saves, mut pending) = tokio::sync::mpsc::unbounded_channel::<Save>();
        // The answer, and a wake-up for an async wait on it (see below).
        let (connected, connection) = std::sync::mpsc::sync_channel(1);
        let (answered, answer_sent) = tokio::sync::oneshot::channel::<()>();
        let joined = like.endpoints();
        let unreachable = |reason: String| StoreError::Unreachable {
            endpoints: joined.clone(),
            reason,
        };
        let runtime = crate::util::determinism::runtime_for_thread()
            .map_err(|e| StoreError::Local(format!("cannot start the scheduler's writer: {e}")))?;
        let spawned = std::thread::Builder::new()
            .name("caravan-scheduler-writer".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let sequence_key = keys::scheduler_sequence_key();
                    let started = match like.connect_again().await {
                        Ok(store) => FencedWriter::start(&store, fence, &sequence_key).await,
                        Err(error) => Err(error),
                    };
                    let mut writer = match started {
                        Ok(writer) => {
                            let _ = connected.send(Ok(()));
                            let _ = answered.send(());
                            writer
                        }
                        Err(error) => {
                            let _ = connected.send(Err(error));
                            let _ = answered.send(());
                            return;
                        }
                    };
                    while let Some((ops, answer)) = pending.recv().await {
                        let _ = answer.send(write(&mut writer, &ops).await);
                    }
                })
            });
        if let Err(error) = spawned {
            return Err(StoreError::Local(format!(
                "cannot start the scheduler's writer: {error}"
            )));
        }
        // In a simulation, waited for here, blocking its one thread, so that the writer's
        // first calls to etcd happen at this point of its run and at no other; otherwise
        // awaited, a worker free meanwhile (and nothing left waiting if this is canceled).
        if !crate::util::determinism::blocking_work_runs_in_place() {
            let _ = answer_sent.await;
        }
        connection
            .recv()
            .unwrap_or_else(|_| Err(unreachable("the scheduler's writer stopped".into())))?;
        Ok(Writer { saves })
    }

    /// Makes `ops` and waits for the answer, blocking this thread.
    fn save(&self, ops: Vec<Group>) -> Result<(), StateError> {
        let (answer, answered) = std::sync::mpsc::channel();
        self.saves
            .send((ops, answer))
            .map_err(|_| StateError::Io("the scheduler's writer stopped".into()))?;
        answered
            .recv()
            .unwrap_or_else(|_| Err(StateError::Io("the scheduler's writer stopped".into())))
    }
}

/// Makes `groups` in fenced transactions of at most [`MAX_FENCED_OPS`], none split.
async fn write(writer: &mut FencedWriter, groups: &[Group]) -> Result<(), StateError> {
    let mut transactions: Vec<Vec<FencedOp>> = vec![Vec::new()];
    for group in groups {
        if transactions
            .last()
            .is_some_and(|t| t.len() + group.len() > MAX_FENCED_OPS)
        {
            transactions.push(Vec::new());
        }
        if let Some(transaction) = transactions.last_mut() {
            transaction.extend(group.iter().cloned());
        }
    }
    for transaction in transactions.iter().filter(|t| !t.is_empty()) {
        let held = writer
            .write(transaction)
            .await
            .map_err(|e| StateError::Io(e.to_string()))?;
        if !held {
            return Err(StateError::Io(format!(
                "this agent no longer holds {} (another agent leads): nothing more is written",
                writer.fence().key
            )));
        }
    }
    Ok(())
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
        // The server calls this through `state::blocking`: this worker may wait.
        match self.writer.save(ops) {
            Ok(()) => {
                self.written.lock_unpoisoned().apply(after);
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

    /// The records loaded at takeover, handed over once (see `reads_back_saved_state`).
    fn server_records(&self, table: ServerTable) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        Ok(self
            .loaded
            .lock_unpoisoned()
            .remove(table_name(table))
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests;
