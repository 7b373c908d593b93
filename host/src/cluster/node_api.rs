//! The client-server seam ([`ServerApi`]) on etcd, for the nodes of one agent: what a client
//! core calls to register, to learn its allocs and to report their states, when the state of
//! the cluster lives in etcd rather than in an embedded server.
//!
//! Keys (see `docs/cluster.md`): a node's desired allocs are `allocs/<node>/<alloc>`, written
//! by the scheduler; their client states are `status/<alloc>`, written here; the node's own
//! record is `nodes/<node>`. A node's allocs are known through one [`PrefixWatch`] per node,
//! kept by a task that mirrors them in memory (id, revision, and the alloc as the watch
//! delivered it, decoded once): a `watch_allocs` answer is that mirror's ids, whole, at the
//! revision of its last change, so answers never go back in time and a restarted agent's
//! first answer is at least as new as any it gave before (etcd's revisions only grow); a
//! `get_allocs` answer is the mirror's allocs, read from etcd no second time. An alloc's
//! modify index is its key's modify revision.
//!
//! It touches only those keys, and knows nothing of the client's runners or of scheduling.

use super::keys::{self, alloc_key, node_key, status_key};
use super::store::{EtcdStore, GuardedPut, StoreError};
use super::{PrefixWatch, watch::Change};
use crate::model::node::NodeInfo;
use crate::model::structs::Alloc;
use crate::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use crate::util::determinism::HashMap;
use crate::util::locks::LockUnpoisoned;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Most keys one transaction names: etcd refuses more than 128 operations, and an update
/// names two keys (its compare and its put).
const MAX_KEYS_PER_TXN: usize = 64;

/// What a node reads of an alloc key's value: the alloc. The scheduler keeps its own
/// bookkeeping next to it (its placement, sequence and version), which nodes ignore.
#[derive(serde::Deserialize)]
struct AllocEntry {
    alloc: Alloc,
}

/// One node's allocs as the mirror holds them: revision of the last change, each alloc's
/// modify revision, and each alloc (none for a value that cannot be read, which a fetch
/// skips).
#[derive(Debug, Default)]
struct Mirror {
    revision: u64,
    allocs: HashMap<String, u64>,
    values: HashMap<String, Arc<Alloc>>,
}

impl Mirror {
    /// Makes `edits`, in order (under one `send_modify`, so that waiters see them together).
    fn apply(&mut self, edits: Vec<Edit>) {
        for edit in edits {
            match edit {
                Edit::Put {
                    id,
                    revision,
                    alloc,
                } => {
                    self.allocs.insert(id.clone(), revision);
                    match alloc {
                        Some(alloc) => self.values.insert(id, alloc),
                        None => self.values.remove(&id),
                    };
                    self.revision = self.revision.max(revision);
                }
                Edit::Delete { id, revision } => {
                    self.allocs.remove(&id);
                    self.values.remove(&id);
                    self.revision = self.revision.max(revision);
                }
                Edit::Replace(listed) => {
                    self.allocs = listed.allocs;
                    self.values = listed.values;
                    self.revision = self.revision.max(listed.revision);
                }
            }
        }
    }
}

/// One change to a node's mirror, its alloc decoded before the mirror is locked.
enum Edit {
    Put {
        id: String,
        revision: u64,
        /// `None` for a value that cannot be read.
        alloc: Option<Arc<Alloc>>,
    },
    Delete {
        id: String,
        revision: u64,
    },
    /// A re-list: the mirror becomes this.
    Replace(Mirror),
}

impl Edit {
    /// The edit for `kv`, an alloc key under `prefix`; `None` for a key that is not one.
    fn put(prefix: &str, kv: &super::KeyValue) -> Option<Edit> {
        let id = kv.key.strip_prefix(prefix)?.to_string();
        let revision = kv.mod_revision.max(0) as u64;
        let alloc = match serde_json::from_slice::<AllocEntry>(&kv.value) {
            Ok(AllocEntry { mut alloc }) => {
                alloc.modify_index = revision;
                Some(Arc::new(alloc))
            }
            Err(error) => {
                tracing::warn!(key = %kv.key, %error, "an alloc in etcd cannot be read; skipped");
                None
            }
        };
        Some(Edit::Put {
            id,
            revision,
            alloc,
        })
    }

    /// The mirror that a listing of `prefix` at `revision` makes.
    fn replace(prefix: &str, entries: &[super::KeyValue], revision: u64) -> Edit {
        let mut listed = Mirror::default();
        listed.apply(
            entries
                .iter()
                .filter_map(|kv| Edit::put(prefix, kv))
                .collect(),
        );
        // The listing's revision, which no key's may pass.
        listed.revision = revision;
        Edit::Replace(listed)
    }
}

/// [`ServerApi`] on etcd. Cheap to share (`Arc`); mirror tasks end when it is dropped.
pub struct EtcdServerApi {
    store: EtcdStore,
    mirrors: Mutex<HashMap<String, watch::Receiver<Mirror>>>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl EtcdServerApi {
    /// The seam on `store`.
    pub fn new(store: EtcdStore) -> Arc<EtcdServerApi> {
        Arc::new(EtcdServerApi {
            store,
            mirrors: Mutex::new(HashMap::default()),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// The mirror of `node_id`'s allocs, started at its first use.
    fn mirror(&self, node_id: &str) -> watch::Receiver<Mirror> {
        let mut mirrors = self.mirrors.lock_unpoisoned();
        if let Some(mirror) = mirrors.get(node_id) {
            return mirror.clone();
        }
        let (sender, receiver) = watch::channel(Mirror::default());
        let task = tokio::spawn(keep_mirror(
            self.store.clone(),
            keys::node_allocs_prefix(node_id),
            sender,
        ));
        self.tasks.lock_unpoisoned().push(task.abort_handle());
        mirrors.insert(node_id.to_string(), receiver.clone());
        receiver
    }

    /// The node whose mirror holds each of `ids`, for the ids some mirror holds.
    fn owners<'a>(&self, ids: impl Iterator<Item = &'a str>) -> HashMap<&'a str, String> {
        let mirrors = self.mirrors.lock_unpoisoned();
        ids.filter_map(|id| {
            let (node, _) = mirrors
                .iter()
                .find(|(_, m)| m.borrow().allocs.contains_key(id))?;
            Some((id, node.clone()))
        })
        .collect()
    }
}

impl Drop for EtcdServerApi {
    fn drop(&mut self) {
        for task in self.tasks.lock_unpoisoned().drain(..) {
            task.abort();
        }
    }
}

/// Keeps `mirror` equal to the allocs under `prefix`, for as long as anyone holds it. Each
/// batch of changes the watch delivers is made in one step: a transaction's allocs share a
/// revision, and a waiter woken between them would answer that revision with part of them,
/// then wait for a change past it before it learnt of the rest.
async fn keep_mirror(store: EtcdStore, prefix: String, mirror: watch::Sender<Mirror>) {
    loop {
        let (entries, mut watch) = match PrefixWatch::start(&store, &prefix).await {
            Ok(started) => started,
            Err(error) => {
                tracing::warn!(%prefix, %error, "cannot list a node's allocs in etcd; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let listed_at = (watch.next_revision() - 1).max(0) as u64;
        let listed = Edit::replace(&prefix, &entries, listed_at);
        mirror.send_modify(|m| m.apply(vec![listed]));
        loop {
            let changes = match watch.next().await {
                Ok(changes) => changes,
                Err(error) => {
                    tracing::warn!(%prefix, %error, "a node's alloc watch failed; re-listing");
                    break;
                }
            };
            let edits: Vec<Edit> = changes
                .into_iter()
                .filter_map(|change| match change {
                    Change::Put(kv) => Edit::put(&prefix, &kv),
                    Change::Delete { key, mod_revision } => Some(Edit::Delete {
                        id: key.strip_prefix(&prefix)?.to_string(),
                        revision: mod_revision.max(0) as u64,
                    }),
                    Change::Relisted { entries, revision } => {
                        Some(Edit::replace(&prefix, &entries, revision.max(0) as u64))
                    }
                })
                .collect();
            if !edits.is_empty() {
                mirror.send_modify(|m| m.apply(edits));
            }
        }
    }
}

fn unavailable(error: StoreError) -> ServerError {
    ServerError::Unavailable(error.to_string())
}

#[async_trait::async_trait]
impl ServerApi for EtcdServerApi {
    async fn register_node(&self, node_id: &str, info: &NodeInfo) -> Result<(), ServerError> {
        // What the scheduler places by is the live key's copy (the member record); this one
        // outlives the lease, for whoever looks at a node that is gone.
        let record = serde_json::json!({ "id": node_id, "info": info }).to_string();
        self.store
            .put(&node_key(node_id), record.as_bytes())
            .await
            .map_err(unavailable)?;
        self.mirror(node_id);
        Ok(())
    }

    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError> {
        let mut mirror = self.mirror(node_id);
        // The first answer waits for the first list (revision 0 is "not listed yet").
        let _ = tokio::time::timeout(
            wait,
            mirror.wait_for(|m| m.revision > 0 && m.revision > min_index),
        )
        .await;
        let current = mirror.borrow();
        if current.revision == 0 {
            return Err(ServerError::Unavailable(format!(
                "the allocs of node {node_id} could not be listed from etcd yet"
            )));
        }
        Ok(NodeAllocs {
            index: current.revision,
            allocs: current.allocs.clone(),
        })
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        // The ids are this agent's nodes' allocs, each in the mirror of the node that holds
        // it, as the watch delivered it. An alloc no mirror holds is gone: not returned.
        let mirrors = self.mirrors.lock_unpoisoned();
        Ok(ids
            .iter()
            .filter_map(|id| {
                mirrors
                    .values()
                    .find_map(|mirror| mirror.borrow().values.get(id).cloned())
            })
            .collect())
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        // Each alloc's owner, from the mirrors: an alloc no mirror holds is gone, and its
        // state is dropped (the contract's "an update for an alloc the server no longer has").
        let owners = self.owners(updates.iter().map(|update| update.alloc_id.as_str()));
        // One put per alloc (its latest state): a transaction may not name a key twice.
        let mut latest: Vec<&AllocUpdate> = Vec::with_capacity(updates.len());
        let mut position: HashMap<&str, usize> =
            HashMap::with_capacity_and_hasher(updates.len(), Default::default());
        for update in updates {
            match position.get(update.alloc_id.as_str()) {
                Some(&at) => latest[at] = update,
                None => {
                    position.insert(&update.alloc_id, latest.len());
                    latest.push(update);
                }
            }
        }
        let mut accepted = Vec::new();
        for chunk in latest.chunks(MAX_KEYS_PER_TXN / 2) {
            // A state is stored only while its alloc exists: each put is guarded by its alloc
            // key's presence, so a retry, or a state for an alloc the scheduler removed since,
            // can never bring a removed alloc back.
            let writes: Vec<GuardedPut> = chunk
                .iter()
                .filter_map(|update| {
                    let node = owners.get(update.alloc_id.as_str())?;
                    Some(GuardedPut {
                        guard: alloc_key(node, &update.alloc_id),
                        key: status_key(&update.alloc_id),
                        value: serde_json::to_vec(&update.state).ok()?,
                    })
                })
                .collect();
            let landed = self
                .store
                .put_where_present(&writes)
                .await
                .map_err(unavailable)?;
            accepted.extend(
                chunk
                    .iter()
                    .filter(|u| landed.contains(&status_key(&u.alloc_id)))
                    .map(|u| u.alloc_id.clone()),
            );
        }
        Ok(accepted)
    }
}
