//! The elected scheduler: what the leading agent runs while it holds the leader key.
//!
//! It opens an [`EmbeddedServer`] on [`EtcdSchedulerDb`] (the whole cluster, read at one
//! revision), publishes it for the HTTP API, and keeps it in step with what only etcd
//! knows, from that revision on:
//! - `live/`: a node whose key appears is placed on (and gets the allocs waiting for a
//!   node); a node whose key is deleted (its lease expired) is down at once: its allocs are
//!   lost and replaced ([`EmbeddedServer::node_down`]). A node that holds allocs but was not
//!   live when this leader took over gets one TTL to show up, as Nomad gives every node a
//!   fresh heartbeat after a leader election: a whole cluster restarting must not lose every
//!   alloc to the first agent that wins. The previous leader's node gets none: its lease
//!   expired, which is what let this agent win.
//! - `status/`: each client state a node wrote is fed to the server as that node's update,
//!   so failures are replaced as in a single agent.
//! - A timer collects terminal allocs of stopped or finished jobs past `job_gc_threshold`.
//! - A task of its own compacts etcd's history (`history`), so that etcd's database stays
//!   bounded under churn.
//!
//! At takeover it replaces each failed alloc nobody replaced, as its job's reschedule policy
//! says (the failure may have been reported between two leaders), and gives every running
//! job the allocs it lacks, so a deploy its predecessor died in the middle of is completed
//! (the predecessor's transactions were fenced one by one, not all or nothing); failed
//! allocs past the reschedule limit and completed batch allocs keep their places
//! ([`EmbeddedServer::complete_deploys`]).
//!
//! It ends, and unpublishes the server, when its caller says leadership is gone or when a
//! save fails (the fence lost, or etcd unreachable): the next leader starts from etcd.

use super::history::{HistoryStats, compact_every};
use super::keys;
use super::lease::Fence;
use super::member::{MemberRecord, MemberView};
use super::scheduler_db::EtcdSchedulerDb;
use super::store::{EtcdStore, StoreError};
use super::watch::{Change, PrefixWatch};
use crate::model::node::NodeInfo;
use crate::model::structs::AllocState;
use crate::rpc::{AllocUpdate, ServerApi};
use crate::server::{EmbeddedServer, ServerConfig};
use crate::util::backoff::Backoff;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Where the leader's server is published, for the HTTP API: `None` while this agent does
/// not lead.
pub type ServerSlot = watch::Sender<Option<Arc<EmbeddedServer>>>;

/// The scheduler's knobs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Placement, replacement and GC rules, as for a single agent.
    pub server: ServerConfig,
    /// Nodes' lease TTL: how long a node that was not live at takeover gets to show up.
    pub node_ttl: Duration,
    /// How often terminal allocs past `job_gc_threshold` are looked for.
    pub gc_interval: Duration,
    /// How often etcd's history is compacted while this agent leads (`None`: never, for an
    /// etcd that compacts itself with `--auto-compaction-retention`).
    pub compact_interval: Option<Duration>,
    /// What the compactions did, for the agent's metrics.
    pub history: Arc<HistoryStats>,
}

/// A prefix's changes, followed by a task of their own so that waiting for several at once
/// never cancels a watch half-way.
struct Followed {
    changes: mpsc::Receiver<Result<Vec<Change>, StoreError>>,
    task: tokio::task::JoinHandle<()>,
}

impl Followed {
    fn start(store: &EtcdStore, prefix: String, from_revision: i64) -> Followed {
        let (sender, changes) = mpsc::channel(16);
        let mut watch = PrefixWatch::from_revision(store, &prefix, from_revision);
        let task = tokio::spawn(async move {
            loop {
                let next = watch.next().await;
                let failed = next.is_err();
                if sender.send(next).await.is_err() || failed {
                    return;
                }
            }
        });
        Followed { changes, task }
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Leads until `until` resolves or a save fails. See the module docs. `took_over_from` is
/// the node of the agent that led before, if this one won the key from it: its lease
/// expired, so its node gets no grace.
pub async fn lead(
    store: EtcdStore,
    fence: Fence,
    took_over_from: Option<String>,
    config: SchedulerConfig,
    slot: ServerSlot,
    until: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(until);
    let started = std::time::Instant::now();
    // Biased, here and below: an unbiased select draws from tokio's random, and a
    // simulation must replay.
    let (db, snapshot) = tokio::select! {
        biased;
        () = &mut until => return,
        loaded = EtcdSchedulerDb::load(&store, fence) => match loaded {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::warn!(%error, "the new leader cannot read the cluster; stepping down");
                return;
            }
        },
    };
    let read_ms = started.elapsed().as_millis() as u64;
    let mut deposed = db.deposed();
    let server = match EmbeddedServer::open(config.server.clone(), Arc::new(db)) {
        Ok(server) => server,
        Err(error) => {
            tracing::warn!(%error, "the new leader cannot open the cluster's state; stepping down");
            return;
        }
    };
    let open_ms = started.elapsed().as_millis() as u64 - read_ms;
    let mut leader = Leader {
        server: server.clone(),
        live: snapshot.live.clone(),
        missing_since_takeover: BTreeMap::new(),
    };
    leader
        .take_over(config.node_ttl, took_over_from.as_deref())
        .await;
    slot.send_replace(Some(server));
    tracing::info!(
        revision = snapshot.revision,
        live_nodes = snapshot.live.len(),
        took_ms = started.elapsed().as_millis() as u64,
        read_ms,
        open_ms,
        "this agent now schedules the cluster"
    );
    let compacting = config.compact_interval.map(|interval| {
        AbortOnDrop(tokio::spawn(compact_every(
            store.clone(),
            interval,
            snapshot.revision,
            config.history.clone(),
        )))
    });
    let mut live = Followed::start(&store, keys::live_prefix(), snapshot.revision + 1);
    let mut statuses = Followed::start(&store, keys::status_prefix(), snapshot.revision + 1);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut next_gc = Instant::now() + config.gc_interval;
    loop {
        tokio::select! {
            biased;
            () = &mut until => break,
            _ = wait_deposed(&mut deposed) => break,
            changes = live.changes.recv() => match changes {
                Some(Ok(changes)) => leader.nodes_changed(changes).await,
                Some(Err(error)) => {
                    tracing::warn!(%error, "the scheduler lost its watch of live nodes; stepping down");
                    break;
                }
                None => break,
            },
            changes = statuses.changes.recv() => match changes {
                Some(Ok(changes)) => leader.states_reported(changes).await,
                Some(Err(error)) => {
                    tracing::warn!(%error, "the scheduler lost its watch of client states; stepping down");
                    break;
                }
                None => break,
            },
            _ = tick.tick() => {
                leader.down_if_still_missing();
                if let Err(error) = leader.server.tick() {
                    tracing::warn!(%error, "cannot move node drains and disconnects on");
                }
                if Instant::now() >= next_gc {
                    next_gc = Instant::now() + config.gc_interval;
                    match leader.server.collect_garbage(false) {
                        Ok(removed) if !removed.is_empty() => {
                            tracing::info!(removed = removed.len(), "collected terminal allocations");
                        }
                        Ok(_) => {}
                        Err(error) => tracing::warn!(%error, "cannot collect terminal allocations"),
                    }
                }
            }
        }
    }
    drop(compacting);
    slot.send_replace(None);
    tracing::info!("this agent no longer schedules the cluster");
}

/// Runs the scheduler ([`lead`]) each time the agent whose membership `view` shows wins the
/// leadership, until it loses it; for as long as the task runs (an agent aborts it when it
/// stops, and a crash ends it with the process).
pub async fn schedule_while_leading(
    store: EtcdStore,
    mut view: watch::Receiver<MemberView>,
    config: SchedulerConfig,
    slot: ServerSlot,
) {
    loop {
        let Ok((fence, took_over_from)) = view
            .wait_for(|v| v.leading.is_some())
            .await
            .map(|v| (v.leading.clone(), v.took_over_from.clone()))
        else {
            return;
        };
        let Some(fence) = fence else {
            continue;
        };
        let mut lost = view.clone();
        let held = fence.clone();
        let until = async move {
            let _ = lost
                .wait_for(|v| v.leading.as_ref() != Some(&held))
                .await
                .map(|_| ());
        };
        lead(
            store.clone(),
            fence.clone(),
            took_over_from,
            config.clone(),
            slot.clone(),
            until,
        )
        .await;
        // Stopped leading while still holding the key (a failed save, a watch that gave up):
        // hand the key over, so that a scheduler runs somewhere, then wait for the
        // membership to see it rather than leading again on the same fence.
        // Tried until etcd answers: an agent that keeps its lease (etcd renews every lease
        // after losing quorum) would otherwise hold the key for ever and schedule nothing.
        let resign = [super::lease::FencedOp::Delete {
            key: fence.key.clone(),
        }];
        const RESIGN_BACKOFF: Backoff =
            Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut failures = 0;
        while view.borrow().leading.as_ref() == Some(&fence) {
            match store.write_fenced(&fence, &resign).await {
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(%error, "cannot hand the leadership over yet; retrying");
                    failures += 1;
                    tokio::time::sleep(RESIGN_BACKOFF.wait(failures)).await;
                }
            }
        }
        let _ = view
            .wait_for(|v| v.leading.as_ref() != Some(&fence))
            .await
            .map(|_| ());
    }
}

/// A task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn wait_deposed(deposed: &mut watch::Receiver<bool>) {
    let _ = deposed.wait_for(|deposed| *deposed).await.map(|_| ());
}

/// The leader's view of liveness, next to its server.
struct Leader {
    server: Arc<EmbeddedServer>,
    /// Live nodes, with what each says of itself.
    live: BTreeMap<String, NodeInfo>,
    /// Nodes holding allocs that were not live at takeover, and when their grace ends.
    missing_since_takeover: BTreeMap<String, Instant>,
}

impl Leader {
    async fn take_over(&mut self, grace: Duration, previous_leader: Option<&str>) {
        for (node, info) in &self.live {
            let _ = self.server.register_node(node, info).await;
        }
        let holding: BTreeSet<String> = self
            .server
            .allocs()
            .into_iter()
            .filter(|a| !a.is_terminal())
            .filter_map(|a| a.node_id)
            .collect();
        let now = Instant::now();
        for node in holding.iter().filter(|n| !self.live.contains_key(*n)) {
            let deadline = if Some(node.as_str()) == previous_leader {
                now
            } else {
                now + grace
            };
            self.missing_since_takeover.insert(node.clone(), deadline);
        }
        match self.server.complete_deploys() {
            Ok(0) => {}
            Ok(placed) => {
                tracing::info!(placed, "completed deploys the previous leader left undone")
            }
            Err(error) => tracing::warn!(%error, "cannot complete the previous leader's deploys"),
        }
    }

    /// `node` is live, saying `info` of itself: it is placed on, with what it says now.
    async fn node_up(&mut self, node: &str, info: NodeInfo) {
        self.missing_since_takeover.remove(node);
        match self.live.insert(node.to_string(), info.clone()) {
            Some(before) if before == info => return,
            Some(_) => tracing::info!(node, "node is live, saying something new of itself"),
            None => tracing::info!(node, "node is live"),
        }
        let _ = self.server.register_node(node, &info).await;
    }

    fn node_down(&mut self, node: &str) {
        self.live.remove(node);
        self.missing_since_takeover.remove(node);
        match self.server.node_down(node) {
            Ok(lost) => tracing::warn!(node, lost = lost.len(), "node is down: its lease expired"),
            Err(error) => tracing::warn!(node, %error, "cannot record a node as down"),
        }
    }

    async fn nodes_changed(&mut self, changes: Vec<Change>) {
        let prefix = keys::live_prefix();
        for change in changes {
            match change {
                Change::Put(kv) => {
                    if let Some(node) = kv.key.strip_prefix(&prefix) {
                        let info = MemberRecord::node_info_in(&kv.key, &kv.value);
                        self.node_up(node, info).await;
                    }
                }
                Change::Delete { key, .. } => {
                    if let Some(node) = key.strip_prefix(&prefix) {
                        self.node_down(node);
                    }
                }
                Change::Relisted { entries, .. } => {
                    let now: BTreeMap<String, NodeInfo> = entries
                        .iter()
                        .filter_map(|kv| {
                            let node = kv.key.strip_prefix(&prefix)?.to_string();
                            Some((node, MemberRecord::node_info_in(&kv.key, &kv.value)))
                        })
                        .collect();
                    let gone: Vec<String> = self
                        .live
                        .keys()
                        .filter(|node| !now.contains_key(*node))
                        .cloned()
                        .collect();
                    for node in gone {
                        self.node_down(&node);
                    }
                    for (node, info) in now {
                        self.node_up(&node, info).await;
                    }
                }
            }
        }
    }

    async fn states_reported(&self, changes: Vec<Change>) {
        let prefix = keys::status_prefix();
        let update = |key: &str, value: &[u8]| {
            let alloc_id = key.strip_prefix(&prefix)?.to_string();
            match serde_json::from_slice::<AllocState>(value) {
                Ok(state) => Some(AllocUpdate {
                    alloc_id,
                    state: Arc::new(state),
                }),
                Err(error) => {
                    tracing::warn!(key, %error, "skipping a client state in etcd that cannot be read");
                    None
                }
            }
        };
        let mut updates = Vec::new();
        for change in changes {
            match change {
                Change::Put(kv) => updates.extend(update(&kv.key, &kv.value)),
                Change::Relisted { entries, .. } => {
                    updates.extend(entries.iter().filter_map(|kv| update(&kv.key, &kv.value)))
                }
                Change::Delete { .. } => {}
            }
        }
        if !updates.is_empty()
            && let Err(error) = self.server.update_allocs(&updates).await
        {
            tracing::warn!(%error, "cannot apply client states");
        }
    }

    fn down_if_still_missing(&mut self) {
        let now = Instant::now();
        let expired: Vec<String> = self
            .missing_since_takeover
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(node, _)| node.clone())
            .collect();
        for node in expired {
            self.node_down(&node);
        }
    }
}
