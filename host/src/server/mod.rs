//! The embedded server: jobs, placement of their allocs onto nodes, job updates and stops,
//! replacement of failed service allocs, and server-side garbage collection. It implements
//! [`crate::rpc::ServerApi`], so a client in the same process talks to it as it would to a
//! remote one. It must not know the client: the two share only [`crate::rpc`].
//!
//! Layout, decisions apart from effects:
//! - [`records`]: what the server holds about each job and alloc, and their saved form.
//! - [`placement`], [`reconcile`], [`gc`]: the scheduler's decisions, pure functions from
//!   plain data (jobs, nodes, allocs, and the time when it matters) to what to create, stop,
//!   replace or forget. Each keeps its own rules, listed at its top; a distributed scheduler
//!   calls the same functions.
//! - `persist`: reading the state back at open, and saving what each change touched.
//! - `api`: the [`crate::rpc::ServerApi`] impl, the clients' side of the server; `intake`
//!   takes the nodes' registrations and reports in groups, one save per group.
//! - `node_ops`: what operators see and set of nodes (details, drains, eligibility) and the
//!   tick that moves drains and disconnected allocs on.
//! - This module: [`EmbeddedServer`], its lock, and applying each decision with its effects
//!   (alloc ids, indexes, saving, waking clients).
//!
//! Invariants of the embedded server, each for the reason given:
//! - Every change is saved to the [`StateDb`] the server was opened on (the client's store,
//!   in the agent) before clients are woken to see it, and a client's updates are
//!   acknowledged only once saved: a client never acts on, or forgets, what a restart would
//!   undo. [`EmbeddedServer::open`] reads it all back.
//! - Changes are made and saved under one lock, each with the next index, so saves land in
//!   index order and a watcher woken at an index sees every change up to it.
//! - Decisions are taken on the state as the lock holds it, and applied before it is
//!   released: two registrations of one job never plan against the same allocs.

mod api;
mod apply;
pub mod drain;
pub mod gc;
mod intake;
mod liveness;
mod metrics;
mod node_ops;
mod node_watch;
mod persist;
pub mod placement;
pub mod reconcile;
pub mod records;
#[cfg(test)]
mod testkit;

pub use node_ops::{DrainRequest, NodeDetails};
pub use records::{AllocRecord, JobAllocCounts, JobRecord};

use crate::model::jobspec::JobSpec;
use crate::model::node::NodeInfo;
use crate::model::structs::ClientStatus;
use crate::state::{MemoryStateDb, StateDb, StateError, blocking, call_store};
use crate::util::determinism::HashSet;
use crate::util::locks::LockUnpoisoned;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The most nodes a server registers; more are refused (each holds memory, an entry in the
/// saved node list, and a connection for its watch).
pub const MAX_NODES: usize = 50_000;

/// The server's knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// How long terminal allocs of stopped or finished jobs are kept (`job_gc_threshold`,
    /// default 4h).
    pub job_gc_threshold: Duration,
    /// The `attempts` of a service job without a `[job.reschedule]` block: replacements of a
    /// failed alloc within an hour, per chain (default 3; see [`crate::model::reschedule`]).
    pub reschedule_limit: u32,
    /// How long a node may go without a watch open before it is down (`node_ttl`, default
    /// 30s); see [`EmbeddedServer::down_silent_nodes`].
    pub node_ttl: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            job_gc_threshold: Duration::from_secs(4 * 3600),
            reschedule_limit: 3,
            node_ttl: Duration::from_secs(30),
        }
    }
}

/// Why a server request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No job with that id.
    #[error("job {0:?} not found")]
    JobNotFound(String),
    /// The job is stopped; registering it again starts it.
    #[error("job {0:?} is stopped; run it again to start it")]
    JobStopped(String),
    /// Another namespace's job has this id: ids are unique in the cluster.
    #[error("job {job:?} exists in namespace {namespace:?}: job ids are unique across namespaces")]
    JobInOtherNamespace {
        /// The job id.
        job: String,
        /// The namespace that holds it.
        namespace: String,
    },
    /// No alloc with that id.
    #[error("allocation {0:?} not found")]
    AllocNotFound(String),
    /// No registered node by that name.
    #[error("node {0:?} not found")]
    NodeNotFound(String),
    /// The node is draining: it cannot be made eligible until its drain ends or is
    /// disabled.
    #[error("node {0:?} is draining; disable its drain first (caravan node drain --disable)")]
    NodeDraining(String),
    /// The change could not be saved (in cluster mode: this agent no longer leads, or etcd
    /// is unreachable); retry.
    #[error("the change could not be saved: {0}")]
    NotSaved(String),
}

/// What registering a job did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// True when the job did not exist (or had been purged).
    pub created: bool,
    /// Allocs created by this registration.
    pub placed: Vec<String>,
    /// Allocs asked to stop by this registration.
    pub stopped: Vec<String>,
    /// Allocs upgraded in place by this registration (see [`reconcile::JobChange`]).
    pub upgraded: Vec<String>,
}

#[derive(Default)]
struct State {
    index: u64,
    /// The index of the last change saved: what a node first seen starts at (a change that
    /// failed to save took an index a restart will hand out again).
    saved_index: u64,
    next_sequence: u64,
    /// The nodes allocs are placed on, with what each said of itself.
    nodes: placement::Nodes,
    /// What nodes taken down last said of themselves: a node that watches again is back
    /// with it (it registers only after an error).
    departed: BTreeMap<String, NodeInfo>,
    /// A save failed and the saved state could not be read back since: memory may hold
    /// changes refused to their callers, so nothing is saved until it is read back.
    reload_pending: bool,
    /// What operators set for nodes (eligibility, drains) by name; defaults are not kept.
    schedules: BTreeMap<String, drain::NodeSchedule>,
    /// The registered nodes new allocs may go to: `nodes` less the ineligible and
    /// draining ones (kept by `persist`'s accessors).
    placeable: placement::Nodes,
    /// The schedules changed since the last save.
    dirty_schedules: bool,
    jobs: BTreeMap<String, JobRecord>,
    allocs: BTreeMap<String, AllocRecord>,
    /// Jobs and allocs changed since the last save (removed ones too).
    dirty_jobs: BTreeSet<String>,
    dirty_allocs: BTreeSet<String>,
    /// The node list changed since the last save.
    dirty_nodes: bool,
    /// Each node's allocs as of the last saved change: what its watch answers.
    node_allocs: node_watch::NodeAllocIndex,
    /// Allocs waiting for a node (none could hold them, or none was registered), kept up to
    /// date by `persist`'s accessors so that looking for them costs nothing when there are
    /// none.
    waiting: BTreeSet<String>,
    /// Set by a change that may have made room (an alloc ended, a node came or changed):
    /// the waiting allocs are tried again before the change is saved.
    room_made: bool,
    /// Allocs `unknown` while their node is away (see [`crate::model::disconnect`]), kept
    /// by the changes that make and end them, so that finding them costs nothing when
    /// there are none.
    unknown: BTreeSet<String>,
}

/// The server, in process. Cheap to share as `Arc<EmbeddedServer>`.
pub struct EmbeddedServer {
    config: ServerConfig,
    state: Mutex<State>,
    db: Arc<dyn StateDb>,
    liveness: liveness::Liveness,
    metrics: metrics::ServerMetrics,
    intake: intake::Intake,
}

impl EmbeddedServer {
    /// An empty server that keeps its state in memory only.
    pub fn new(config: ServerConfig) -> Arc<Self> {
        Arc::new(EmbeddedServer {
            config,
            state: Mutex::new(State::default()),
            db: Arc::new(MemoryStateDb::new()),
            liveness: Default::default(),
            metrics: Default::default(),
            intake: Default::default(),
        })
    }

    /// A server on `db`, with every job and alloc it saved before. A record that cannot be
    /// read is skipped with a WARN naming it; a store that cannot be read is an error.
    pub fn open(config: ServerConfig, db: Arc<dyn StateDb>) -> Result<Arc<Self>, StateError> {
        let state = State::load(db.as_ref())?;
        Ok(Arc::new(EmbeddedServer {
            config,
            state: Mutex::new(state),
            db,
            liveness: Default::default(),
            metrics: Default::default(),
            intake: Default::default(),
        }))
    }

    /// The state, locked. A lock another thread holds is waited for through
    /// [`blocking`]: in cluster mode the holder may be saving to etcd for up to seconds, and a
    /// runtime worker parked on a plain lock meanwhile is one the agent's other tasks (its
    /// lease renewals) cannot use.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.try_lock() {
            Ok(state) => state,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => blocking(|| self.state.lock_unpoisoned()),
        }
    }

    /// Runs `change` on the state with the next index, saves what it touched, then wakes
    /// the watchers of the nodes whose allocs it changed. Saving happens under the state lock so saves land in index order (a redb
    /// commit is a fraction of a millisecond; an etcd transaction in cluster mode a few, up
    /// to its timeout; readers wait that long).
    ///
    /// When saving fails the change is forgotten: the state is read back from the store, as
    /// a restart would find it, so a change refused to its caller is never saved by a later
    /// one (the simulator found a refused scale that landed with the next change).
    /// Watchers are not woken; they wait on the index of the last save, which did not move.
    /// The error is logged and returned for callers that can retry. When the store cannot
    /// be read back either, every change is refused unsaved until it can. A store that does
    /// not read back at all (cluster mode's, whose failed save ends the leadership) keeps
    /// the change in memory, unsaved.
    fn change<T>(&self, change: impl FnOnce(&mut State, u64) -> T) -> (T, Result<(), StateError>) {
        let mut state = self.lock();
        if state.reload_pending {
            state.reload_pending = false;
            state.forget_unsaved_changes(self.db.as_ref());
        }
        let index = state.index + 1;
        let result = change(&mut state, index);
        if state.reload_pending {
            let unsaved = StateError::Io(
                "not saved: the server's saved state cannot be read back since a save failed"
                    .into(),
            );
            return (result, Err(unsaved));
        }
        if std::mem::take(&mut state.room_made) && !state.waiting.is_empty() {
            state.place_unplaced(index);
        }
        let now = crate::util::timestamp::unix_ms_now();
        if !state.unknown.is_empty() {
            state.expire_disconnects(index, now);
        }
        if state.schedules.values().any(|s| s.drain.is_some()) {
            state.advance_drains(index, now);
        }
        if !state.has_unsaved_changes() {
            // Nothing changed (a node registering again): no index spent, no disk sync.
            return (result, Ok(()));
        }
        state.index = index;
        let writes = state.dirty_writes();
        let saved = call_store(self.db.as_ref(), || self.db.apply(writes));
        match &saved {
            Ok(()) => {
                state.saved_index = index;
                let State {
                    allocs,
                    dirty_allocs,
                    node_allocs,
                    ..
                } = &mut *state;
                let placed = node_allocs.publish(allocs, dirty_allocs.iter(), index);
                self.metrics.placed(placed);
                state.mark_saved();
            }
            Err(error) => {
                tracing::error!(error = %error, "cannot save server state");
                state.forget_unsaved_changes(self.db.as_ref());
            }
        }
        (result, saved)
    }

    /// [`Self::change`], for a request: a change that could not be saved is
    /// [`RequestError::NotSaved`], for the caller to retry.
    fn request<T>(&self, change: impl FnOnce(&mut State, u64) -> T) -> Result<T, RequestError> {
        let (result, saved) = self.change(change);
        saved.map_err(|e| RequestError::NotSaved(e.to_string()))?;
        Ok(result)
    }

    /// Registers a job, or updates it when the id exists (see [`reconcile`] for the rules).
    /// A job id is the cluster's, whatever its namespace: an id another namespace's job holds
    /// is refused (409), checked under the same lock as the registration.
    pub fn register_job(&self, spec: JobSpec) -> Result<Registration, RequestError> {
        self.request(|state, index| {
            let held = state.jobs.get(&spec.id).filter(|job| !job.purged);
            if let Some(job) = held.filter(|job| job.spec.namespace != spec.namespace) {
                return Err(RequestError::JobInOtherNamespace {
                    job: spec.id.clone(),
                    namespace: job.spec.namespace.clone(),
                });
            }
            Ok(state.register(spec, index))
        })?
    }

    /// The attempts of a service job without a reschedule policy of its own.
    pub fn reschedule_limit(&self) -> u32 {
        self.config.reschedule_limit
    }

    /// What registering `spec` would do, changing nothing: the job's current version (`None`
    /// for a new job), the plan [`Self::register_job`] would apply, and, when some of its
    /// new allocs would fit nowhere, why (see [`placement::Blocked`]).
    pub fn plan_job(&self, spec: &JobSpec) -> (Option<u64>, reconcile::JobPlan, Option<String>) {
        let state = self.lock();
        let existing = state.jobs.get(&spec.id);
        let current = existing.filter(|job| !job.purged).map(|job| job.version);
        let plan =
            reconcile::reconcile_job(existing, spec, &state.placeable, state.allocs.values());
        let unplaced = plan.plan.place.iter().filter(|n| n.is_none()).count();
        let blocked = (unplaced > 0).then(|| {
            // Why the first that fits nowhere does not: after those placed before it.
            let mut placer = placement::Placer::new(&state.placeable, state.allocs.values());
            let placed = plan.plan.place.len() - unplaced;
            placer.place(placement::Ask::new(spec, placed));
            let why = placer
                .explain(spec)
                .with_ineligible(state.ineligible_nodes());
            let allocs = if unplaced == 1 { "alloc" } else { "allocs" };
            format!("{unplaced} {allocs} would not be placed: {why}")
        });
        (current, plan, blocked)
    }

    /// Changes a job's count, as registering it again with that count would.
    /// A stopped job is not scaled (409): registering it again starts it.
    pub fn scale_job(&self, job_id: &str, count: u32) -> Result<Registration, RequestError> {
        self.request(|state, index| {
            let job = state.jobs.get(job_id).filter(|job| !job.purged);
            let job = job.ok_or_else(|| RequestError::JobNotFound(job_id.to_string()))?;
            if job.stopped {
                return Err(RequestError::JobStopped(job_id.to_string()));
            }
            let spec = JobSpec {
                count,
                ..job.spec.clone()
            };
            Ok(state.register(spec, index))
        })?
    }

    /// Stops a job: every alloc is asked to stop. With `purge`, the job is also removed once
    /// its last alloc is collected.
    pub fn stop_job(&self, job_id: &str, purge: bool) -> Result<Vec<String>, RequestError> {
        if self.lock().jobs.get(job_id).is_none_or(|job| job.purged) {
            return Err(RequestError::JobNotFound(job_id.to_string()));
        }
        self.request(|state, index| {
            let plan = reconcile::stop_job(job_id, state.allocs.values());
            let stopped = plan.stop.clone();
            if let Some(job) = state.job_mut(job_id) {
                job.stopped = true;
                job.purged |= purge;
            }
            for id in &plan.stop {
                state.stop_alloc(id, index);
            }
            state.remove_empty_purged_jobs();
            stopped
        })
    }

    /// Stops one alloc (desired status stop); a service job does not replace it.
    pub fn stop_alloc(&self, alloc_id: &str) -> Result<(), RequestError> {
        if !self.lock().allocs.contains_key(alloc_id) {
            return Err(RequestError::AllocNotFound(alloc_id.to_string()));
        }
        self.request(|state, index| state.stop_alloc(alloc_id, index))
    }

    /// Removes terminal allocs of stopped or finished jobs: those terminal for longer than
    /// `job_gc_threshold`, or all of them when `force`. Returns the ids removed.
    pub fn collect_garbage(&self, force: bool) -> Result<Vec<String>, RequestError> {
        let threshold = self.config.job_gc_threshold;
        self.request(|state, _| {
            let removed = gc::collectable_allocs(
                &state.jobs,
                state.allocs.values(),
                Instant::now(),
                threshold,
                force,
            );
            for id in &removed {
                state.remove_alloc(id);
            }
            state.remove_empty_purged_jobs();
            removed
        })
    }

    /// Every job, by id.
    pub fn jobs(&self) -> Vec<JobRecord> {
        self.lock()
            .jobs
            .values()
            .filter(|job| !job.purged)
            .cloned()
            .collect()
    }

    /// One job.
    pub fn job(&self, job_id: &str) -> Result<JobRecord, RequestError> {
        self.lock()
            .jobs
            .get(job_id)
            .filter(|job| !job.purged)
            .cloned()
            .ok_or_else(|| RequestError::JobNotFound(job_id.to_string()))
    }

    /// Every alloc, oldest first.
    pub fn allocs(&self) -> Vec<AllocRecord> {
        let mut allocs: Vec<AllocRecord> = self.lock().allocs.values().cloned().collect();
        allocs.sort_by_key(|a| a.sequence);
        allocs
    }

    /// Each job's allocs counted by what the web UI plots over time, under the server's lock
    /// and without copying a record: cheap enough to sample every few seconds.
    pub fn alloc_counts(&self) -> BTreeMap<String, JobAllocCounts> {
        let state = self.lock();
        let mut counts: BTreeMap<String, JobAllocCounts> = state
            .jobs
            .values()
            .filter(|job| !job.purged)
            .map(|job| (job.spec.id.clone(), JobAllocCounts::default()))
            .collect();
        for record in state.allocs.values() {
            let Some(count) = counts.get_mut(&record.alloc.job_id) else {
                continue;
            };
            let status = record.client_state.as_ref().map(|s| s.client_status);
            count.placed += u32::from(record.node_id.is_some());
            count.running += u32::from(status == Some(ClientStatus::Running));
            count.failed += u32::from(status == Some(ClientStatus::Failed));
            count.rescheduled += u32::from(record.alloc.reschedule.is_some());
        }
        counts
    }

    /// The allocs of one job, oldest first.
    pub fn job_allocs(&self, job_id: &str) -> Vec<AllocRecord> {
        self.allocs()
            .into_iter()
            .filter(|a| a.alloc.job_id == job_id)
            .collect()
    }

    /// One alloc.
    pub fn alloc(&self, alloc_id: &str) -> Result<AllocRecord, RequestError> {
        self.lock()
            .allocs
            .get(alloc_id)
            .cloned()
            .ok_or_else(|| RequestError::AllocNotFound(alloc_id.to_string()))
    }

    /// Of `ids`, the allocs placed on `node`: what a node in another process may fetch and
    /// report on.
    pub fn placed_on<'a>(
        &self,
        node: &str,
        ids: impl IntoIterator<Item = &'a String>,
    ) -> HashSet<String> {
        let state = self.lock();
        ids.into_iter()
            .filter(|id| {
                let record = state.allocs.get(*id);
                record.is_some_and(|r| r.node_id.as_deref() == Some(node))
            })
            .cloned()
            .collect()
    }

    /// Registered nodes.
    pub fn nodes(&self) -> Vec<String> {
        self.lock().nodes.keys().cloned().collect()
    }

    /// How many of `job_id`'s allocs wait for a node, and why (see [`placement::Blocked`]);
    /// `None` when none does.
    pub fn blocked(&self, job_id: &str) -> Option<(usize, placement::Blocked)> {
        let state = self.lock();
        let job = state.jobs.get(job_id).filter(|j| !j.purged && !j.stopped)?;
        let waiting = state
            .waiting
            .iter()
            .filter_map(|id| state.allocs.get(id))
            .filter(|a| a.alloc.job_id == job_id && a.is_wanted())
            .count();
        if waiting == 0 {
            return None;
        }
        let placer = placement::Placer::new(&state.placeable, state.allocs.values());
        let why = placer.explain(&job.spec);
        Some((waiting, why.with_ineligible(state.ineligible_nodes())))
    }

    /// Completes what a previous leader left undone (cluster mode, at takeover): each
    /// failed alloc it did not replace (its node reported the failure between two leaders,
    /// or the save of the replacement failed with the leadership) is decided now by its
    /// job's reschedule policy, as the report would have been when it failed; then each job
    /// that runs gets the allocs it lacks, and no more. Returns how many allocs were placed.
    pub fn complete_deploys(&self) -> Result<usize, RequestError> {
        let reschedule_limit = self.reschedule_limit();
        let now_unix_ms = crate::util::timestamp::unix_ms_now();
        self.request(|state, index| state.complete_takeover(reschedule_limit, now_unix_ms, index))
    }

    /// Writes the server's metrics in Prometheus' text format (see `metrics`).
    pub fn write_prometheus(&self, out: &mut String) {
        self.metrics
            .write_prometheus(self.liveness.open_watches(), out);
    }

    /// Takes every node that has had no watch open for longer than `config.node_ttl` out of
    /// placement and loses its allocs (see [`Self::node_down`]), as Nomad does with a client
    /// that misses its heartbeats; `always_live` (the agent's own node, in its process) never.
    /// For a single agent, whose other nodes (`caravan nodesim`'s) talk to it over HTTP; the
    /// agent calls it a few times per TTL. Returns the nodes taken down, or the first error
    /// after trying every silent node.
    pub fn down_silent_nodes(&self, always_live: &str) -> Result<Vec<String>, StateError> {
        let ttl = self.config.node_ttl;
        let mut downed = Vec::new();
        let mut first_error = None;
        for node in self.nodes().iter().filter(|n| *n != always_live) {
            if !self.liveness.is_silent(node, ttl) {
                continue;
            }
            // Checked again under the state lock: a watch that began since is either seen
            // here (and the node kept), or comes after and registers the node again.
            let (lost, saved) = self.change(|state, index| {
                self.liveness
                    .is_silent(node, ttl)
                    .then(|| state.node_down(node, index, crate::util::timestamp::unix_ms_now()))
            });
            match (lost, saved) {
                (_, Err(error)) => {
                    first_error.get_or_insert(error);
                }
                (None, Ok(())) => {}
                (Some(lost), Ok(())) => {
                    self.liveness.forget(node);
                    tracing::warn!(
                        node,
                        lost = lost.len(),
                        node_ttl = %crate::util::units::format_duration(ttl),
                        "node silent for longer than node_ttl: down, its allocs lost"
                    );
                    downed.push(node.clone());
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(downed),
        }
    }

    /// Takes a node that stopped answering out of placement: its allocs that
    /// were not terminal become `lost` and are asked to stop, and those their jobs still
    /// want are replaced on the other nodes. Returns the ids lost; an error when the change
    /// could not be saved (it is forgotten, as every change that cannot be saved is; the
    /// next sweep tries again).
    pub fn node_down(&self, node_id: &str) -> Result<Vec<String>, StateError> {
        let now = crate::util::timestamp::unix_ms_now();
        let (lost, saved) = self.change(|state, index| state.node_down(node_id, index, now));
        saved.map(|()| lost)
    }
}

#[cfg(test)]
mod tests;
