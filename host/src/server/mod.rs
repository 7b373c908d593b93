//! The embedded server: jobs, placement of their allocs onto nodes, job updates and stops,
//! replacement of failed service allocs, and server-side garbage collection. It implements
//! the client's [`ServerApi`], so a client in the same process talks to it as it would to a
//! remote one.
//!
//! Rules kept from Nomad's scheduler, each for the reason given:
//! - A job update that changes only the count scales: up adds allocs, down stops the newest
//!   (the oldest have proven themselves). Any other change replaces every alloc, since their
//!   runner or config no longer matches the job.
//! - Stopping a job sets desired status `stop` on its allocs; the client kills them and
//!   reports them terminal. The server never deletes a non-terminal alloc, so nothing is
//!   dropped that a client still runs.
//! - A failed service alloc is replaced by a new one, up to the job's restart limit, so a
//!   crash-looping runner does not churn for ever.
//! - Terminal allocs of stopped or finished jobs, and terminal allocs that were stopped or
//!   replaced (a scale-down, a deploy), are garbage collected after `job_gc_threshold` (or at
//!   once when forced), so server state does not grow with every deploy; a purged job goes
//!   when its last alloc does.
//!
//! Every change is saved to the [`StateDb`] the server was opened on (the client's store, in
//! the agent) before clients are woken to see it, and a client's updates are acknowledged
//! only once saved; [`EmbeddedServer::open`] reads it all back. Each change writes only the jobs
//! and allocs it touched (tracked in the state as it mutates), plus the small metadata record.
//! Placement is a separate function ([`place`]) so more nodes fit without touching the rest.

use crate::jobspec::{JobSpec, JobType};
use crate::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError, wait_for_index};
use crate::state::{MemoryStateDb, ServerTable, StateDb, StateError, Write, blocking};
use crate::structs::{Alloc, AllocState, DesiredStatus};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The server's knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// How long terminal allocs of stopped or finished jobs are kept (`job_gc_threshold`,
    /// default 4h).
    pub job_gc_threshold: Duration,
    /// How many times a failed service alloc is replaced, per job (default 3).
    pub restart_limit: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            job_gc_threshold: Duration::from_secs(4 * 3600),
            restart_limit: 3,
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
    /// No alloc with that id.
    #[error("allocation {0:?} not found")]
    AllocNotFound(String),
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
}

/// A job as the server holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRecord {
    /// The spec last registered.
    pub spec: JobSpec,
    /// Bumped by every change that replaces allocs.
    pub version: u64,
    /// True after `stop`.
    pub stopped: bool,
    /// True after `stop --purge`: removed with its last alloc.
    pub purged: bool,
    /// Failed allocs replaced so far.
    pub restarts: u32,
}

/// An alloc as the server holds it.
#[derive(Debug, Clone)]
pub struct AllocRecord {
    /// The alloc as sent to clients.
    pub alloc: Arc<Alloc>,
    /// The node it is placed on; `None` until a node registers.
    pub node_id: Option<String>,
    /// The state its client last reported.
    pub client_state: Option<AllocState>,
    /// The job version it was made for.
    pub job_version: u64,
    /// Creation order across the server (orders allocs oldest first, even within one
    /// registration).
    pub sequence: u64,
    /// When its client first reported it terminal.
    pub terminal_since: Option<Instant>,
    /// True once a replacement was made for it (a failed service alloc).
    pub replaced: bool,
}

impl AllocRecord {
    fn is_terminal(&self) -> bool {
        self.client_state
            .as_ref()
            .is_some_and(|s| s.client_status.is_terminal())
    }

    /// Desired to run, not terminal, not replaced: counts toward the job's count.
    fn is_wanted(&self) -> bool {
        self.alloc.desired_status == DesiredStatus::Run && !self.is_terminal() && !self.replaced
    }
}

/// An [`AllocRecord`] as saved: the time it turned terminal as wall-clock milliseconds, since
/// an `Instant` means nothing to the next process.
#[derive(Serialize, Deserialize)]
struct SavedAllocRecord {
    alloc: Alloc,
    node_id: Option<String>,
    client_state: Option<AllocState>,
    job_version: u64,
    sequence: u64,
    terminal_since_unix_ms: Option<u64>,
    replaced: bool,
}

/// The server's counters and node list, saved as one record.
#[derive(Default, Serialize, Deserialize)]
struct SavedMeta {
    index: u64,
    next_sequence: u64,
    nodes: BTreeSet<String>,
}

const META_KEY: &str = "server";

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Plain derived data: serializing to JSON cannot fail.
    serde_json::to_vec(value).expect("server records serialize to JSON")
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl SavedAllocRecord {
    fn from_record(record: &AllocRecord) -> Self {
        let (now, unix_now) = (Instant::now(), unix_ms_now());
        SavedAllocRecord {
            alloc: Alloc::clone(&record.alloc),
            node_id: record.node_id.clone(),
            client_state: record.client_state.clone(),
            job_version: record.job_version,
            sequence: record.sequence,
            terminal_since_unix_ms: record
                .terminal_since
                .map(|since| unix_now.saturating_sub(now.duration_since(since).as_millis() as u64)),
            replaced: record.replaced,
        }
    }

    fn into_record(self) -> AllocRecord {
        let (now, unix_now) = (Instant::now(), unix_ms_now());
        AllocRecord {
            alloc: Arc::new(self.alloc),
            node_id: self.node_id,
            client_state: self.client_state,
            job_version: self.job_version,
            sequence: self.sequence,
            terminal_since: self.terminal_since_unix_ms.map(|since| {
                let age = Duration::from_millis(unix_now.saturating_sub(since));
                now.checked_sub(age).unwrap_or(now)
            }),
            replaced: self.replaced,
        }
    }
}

#[derive(Default)]
struct State {
    index: u64,
    next_sequence: u64,
    nodes: BTreeSet<String>,
    jobs: BTreeMap<String, JobRecord>,
    allocs: BTreeMap<String, AllocRecord>,
    /// Jobs and allocs changed since the last save (removed ones too).
    dirty_jobs: BTreeSet<String>,
    dirty_allocs: BTreeSet<String>,
}

/// The server, in process. Cheap to share as `Arc<EmbeddedServer>`.
pub struct EmbeddedServer {
    config: ServerConfig,
    state: Mutex<State>,
    index: watch::Sender<u64>,
    db: Arc<dyn StateDb>,
}

/// Chooses a node for each of `count` new allocs: the least loaded first, ties by name, so
/// allocs spread evenly. Returns `None`s when there is no node yet.
pub fn place(load: &BTreeMap<String, usize>, count: usize) -> Vec<Option<String>> {
    let mut load = load.clone();
    (0..count)
        .map(|_| {
            let node = load
                .iter()
                .min_by_key(|(name, n)| (**n, (*name).clone()))
                .map(|(name, _)| name.clone());
            if let Some(node) = &node {
                *load.get_mut(node).expect("chosen from the map") += 1;
            }
            node
        })
        .collect()
}

impl EmbeddedServer {
    /// An empty server that keeps its state in memory only.
    pub fn new(config: ServerConfig) -> Arc<Self> {
        Arc::new(EmbeddedServer {
            config,
            state: Mutex::new(State::default()),
            index: watch::channel(0).0,
            db: Arc::new(MemoryStateDb::new()),
        })
    }

    /// A server on `db`, with every job and alloc it saved before. A record that cannot be
    /// read is skipped with a WARN naming it; a store that cannot be read is an error.
    pub fn open(config: ServerConfig, db: Arc<dyn StateDb>) -> Result<Arc<Self>, StateError> {
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
        tracing::debug!(
            jobs = state.jobs.len(),
            allocs = state.allocs.len(),
            index = state.index,
            "server state restored"
        );
        let index = state.index;
        Ok(Arc::new(EmbeddedServer {
            config,
            state: Mutex::new(state),
            index: watch::channel(index).0,
            db,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `change` on the state with the next index, saves what it touched, then wakes
    /// watchers. Saving happens under the state lock so saves land in index order (a commit
    /// is a fraction of a millisecond here; readers wait that long).
    ///
    /// When saving fails the change stays in memory, its records stay dirty for the next
    /// change to save, and watchers are not woken: clients learn of it only once it is on
    /// disk. The error is logged and returned for callers that can retry.
    fn change<T>(&self, change: impl FnOnce(&mut State, u64) -> T) -> (T, Result<(), StateError>) {
        let (result, saved, index) = {
            let mut state = self.lock();
            state.index += 1;
            let index = state.index;
            let result = change(&mut state, index);
            let writes = state.dirty_writes();
            let saved = blocking(|| self.db.apply(writes));
            match &saved {
                Ok(()) => {
                    state.dirty_jobs.clear();
                    state.dirty_allocs.clear();
                }
                Err(error) => tracing::error!(error = %error, "cannot save server state"),
            }
            (result, saved, index)
        };
        if saved.is_ok() {
            self.index.send_replace(index);
        }
        (result, saved)
    }

    /// Registers a job, or updates it when the id exists (see the module docs).
    pub fn register_job(&self, spec: JobSpec) -> Registration {
        self.change(|state, index| state.register(spec, index)).0
    }

    /// Changes a job's count, as registering it again with that count would.
    /// A stopped job is not scaled (409): registering it again starts it.
    pub fn scale_job(&self, job_id: &str, count: u32) -> Result<Registration, RequestError> {
        self.change(|state, index| {
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
        })
        .0
    }

    /// Stops a job: every alloc is asked to stop. With `purge`, the job is also removed once
    /// its last alloc is collected.
    pub fn stop_job(&self, job_id: &str, purge: bool) -> Result<Vec<String>, RequestError> {
        if self.lock().jobs.get(job_id).is_none_or(|job| job.purged) {
            return Err(RequestError::JobNotFound(job_id.to_string()));
        }
        Ok(self
            .change(|state, index| {
                let ids: Vec<String> = state
                    .job_allocs(job_id)
                    .filter(|a| a.is_wanted())
                    .map(|a| a.alloc.id.clone())
                    .collect();
                for id in &ids {
                    state.stop_alloc(id, index);
                }
                if let Some(job) = state.job_mut(job_id) {
                    job.stopped = true;
                    job.purged |= purge;
                }
                state.remove_empty_purged_jobs();
                ids
            })
            .0)
    }

    /// Stops one alloc (desired status stop); a service job does not replace it.
    pub fn stop_alloc(&self, alloc_id: &str) -> Result<(), RequestError> {
        if !self.lock().allocs.contains_key(alloc_id) {
            return Err(RequestError::AllocNotFound(alloc_id.to_string()));
        }
        let _ = self.change(|state, index| state.stop_alloc(alloc_id, index));
        Ok(())
    }

    /// Removes terminal allocs of stopped or finished jobs: those terminal for longer than
    /// `job_gc_threshold`, or all of them when `force`. Returns the ids removed.
    pub fn collect_garbage(&self, force: bool) -> Vec<String> {
        let threshold = self.config.job_gc_threshold;
        self.change(|state, _| {
            let now = Instant::now();
            let finished_jobs: BTreeSet<String> = state
                .jobs
                .iter()
                .filter(|(id, job)| {
                    job.stopped
                        || (job.spec.job_type == JobType::Batch
                            && state.job_allocs(id).all(|a| a.is_terminal()))
                })
                .map(|(id, _)| id.clone())
                .collect();
            let removed: Vec<String> = state
                .allocs
                .values()
                .filter(|a| {
                    finished_jobs.contains(&a.alloc.job_id)
                        || a.replaced
                        || a.alloc.desired_status != DesiredStatus::Run
                })
                .filter(|a| a.is_terminal())
                .filter(|a| {
                    force
                        || a.terminal_since
                            .is_some_and(|since| now.duration_since(since) >= threshold)
                })
                .map(|a| a.alloc.id.clone())
                .collect();
            for id in &removed {
                state.remove_alloc(id);
            }
            state.remove_empty_purged_jobs();
            removed
        })
        .0
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

    /// Registered nodes.
    pub fn nodes(&self) -> Vec<String> {
        self.lock().nodes.iter().cloned().collect()
    }
}

/// True when two specs produce the same allocs, counts aside.
fn same_allocs(old: &JobSpec, new: &JobSpec) -> bool {
    JobSpec {
        count: 0,
        ..old.clone()
    } == JobSpec {
        count: 0,
        ..new.clone()
    }
}

impl State {
    fn job_mut(&mut self, job_id: &str) -> Option<&mut JobRecord> {
        self.dirty_jobs.insert(job_id.to_string());
        self.jobs.get_mut(job_id)
    }

    fn insert_job(&mut self, job_id: String, job: JobRecord) {
        self.dirty_jobs.insert(job_id.clone());
        self.jobs.insert(job_id, job);
    }

    fn alloc_mut(&mut self, alloc_id: &str) -> Option<&mut AllocRecord> {
        self.dirty_allocs.insert(alloc_id.to_string());
        self.allocs.get_mut(alloc_id)
    }

    fn insert_alloc(&mut self, record: AllocRecord) {
        self.dirty_allocs.insert(record.alloc.id.clone());
        self.allocs.insert(record.alloc.id.clone(), record);
    }

    fn remove_alloc(&mut self, alloc_id: &str) {
        self.dirty_allocs.insert(alloc_id.to_string());
        self.allocs.remove(alloc_id);
    }

    /// The writes that save every dirty job and alloc (deletes for removed ones) and the
    /// metadata.
    fn dirty_writes(&self) -> Vec<Write> {
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

    fn register(&mut self, spec: JobSpec, index: u64) -> Registration {
        let existing = self.jobs.get(&spec.id).filter(|job| !job.purged).cloned();
        let created = existing.is_none();
        let same_shape = existing
            .as_ref()
            .is_some_and(|job| !job.stopped && same_allocs(&job.spec, &spec));
        let version = match &existing {
            Some(job) if same_shape => job.version,
            Some(job) => job.version + 1,
            None => 1,
        };
        let mut stopped = Vec::new();
        if !same_shape {
            // Every alloc of an older shape goes; new ones take their place.
            let old: Vec<String> = self
                .job_allocs(&spec.id)
                .filter(|a| a.is_wanted())
                .map(|a| a.alloc.id.clone())
                .collect();
            for id in old {
                self.stop_alloc(&id, index);
                stopped.push(id);
            }
        }
        let mut wanted: Vec<(u64, String)> = self
            .job_allocs(&spec.id)
            .filter(|a| a.is_wanted())
            .map(|a| (a.sequence, a.alloc.id.clone()))
            .collect();
        let count = spec.count as usize;
        let mut placed = Vec::new();
        if wanted.len() > count {
            // Scale down: the newest go.
            wanted.sort();
            for (_, id) in wanted.split_off(count) {
                self.stop_alloc(&id, index);
                stopped.push(id);
            }
        } else {
            placed = self.create_allocs(&spec, version, count - wanted.len(), index);
        }
        let restarts = existing.as_ref().map_or(0, |job| job.restarts);
        self.insert_job(
            spec.id.clone(),
            JobRecord {
                spec,
                version,
                stopped: false,
                purged: false,
                restarts,
            },
        );
        Registration {
            created,
            placed,
            stopped,
        }
    }

    fn job_allocs<'a>(&'a self, job_id: &'a str) -> impl Iterator<Item = &'a AllocRecord> + 'a {
        self.allocs
            .values()
            .filter(move |a| a.alloc.job_id == job_id)
    }

    fn stop_alloc(&mut self, alloc_id: &str, index: u64) {
        if let Some(record) = self.alloc_mut(alloc_id)
            && record.alloc.desired_status == DesiredStatus::Run
        {
            record.alloc = Arc::new(Alloc {
                desired_status: DesiredStatus::Stop,
                modify_index: index,
                ..Alloc::clone(&record.alloc)
            });
        }
    }

    fn node_load(&self) -> BTreeMap<String, usize> {
        let mut load: BTreeMap<String, usize> = self.nodes.iter().map(|n| (n.clone(), 0)).collect();
        for record in self.allocs.values().filter(|a| !a.is_terminal()) {
            if let Some(n) = record.node_id.as_ref().and_then(|node| load.get_mut(node)) {
                *n += 1;
            }
        }
        load
    }

    fn create_allocs(
        &mut self,
        spec: &JobSpec,
        version: u64,
        count: usize,
        index: u64,
    ) -> Vec<String> {
        let nodes = place(&self.node_load(), count);
        let mut ids = Vec::new();
        for node_id in nodes {
            let alloc = Alloc {
                modify_index: index,
                meta: spec.meta.clone(),
                limits: spec.limits.clone(),
                ..Alloc::new(
                    uuid::Uuid::new_v4().to_string(),
                    spec.id.clone(),
                    spec.runner.clone(),
                    spec.tasks.clone(),
                )
            };
            ids.push(alloc.id.clone());
            self.next_sequence += 1;
            let record = AllocRecord {
                alloc: Arc::new(alloc),
                node_id,
                client_state: None,
                job_version: version,
                sequence: self.next_sequence,
                terminal_since: None,
                replaced: false,
            };
            self.insert_alloc(record);
        }
        ids
    }

    fn place_unplaced(&mut self, index: u64) {
        let unplaced: Vec<String> = self
            .allocs
            .values()
            .filter(|a| a.node_id.is_none())
            .map(|a| a.alloc.id.clone())
            .collect();
        let nodes = place(&self.node_load(), unplaced.len());
        for (id, node) in unplaced.into_iter().zip(nodes) {
            if let Some(record) = self.alloc_mut(&id) {
                record.node_id = node;
                record.alloc = Arc::new(Alloc {
                    modify_index: index,
                    ..Alloc::clone(&record.alloc)
                });
            }
        }
    }

    /// Replaces a failed service alloc, within the job's restart limit.
    fn replace_if_failed(&mut self, alloc_id: &str, restart_limit: u32, index: u64) {
        let Some(record) = self.allocs.get(alloc_id) else {
            return;
        };
        let failed = record
            .client_state
            .as_ref()
            .is_some_and(|s| s.client_status == crate::structs::ClientStatus::Failed);
        if !failed || record.replaced || record.alloc.desired_status != DesiredStatus::Run {
            return;
        }
        let Some(job) = self.jobs.get(&record.alloc.job_id) else {
            return;
        };
        if job.stopped || job.spec.job_type != JobType::Service || record.job_version != job.version
        {
            return;
        }
        if job.restarts >= restart_limit {
            tracing::warn!(job = %job.spec.id, alloc_id, restart_limit, "not replacing failed allocation: restart limit reached");
            return;
        }
        let (spec, version) = (job.spec.clone(), job.version);
        if let Some(job) = self.job_mut(&spec.id) {
            job.restarts += 1;
        }
        if let Some(record) = self.alloc_mut(alloc_id) {
            record.replaced = true;
        }
        let replacement = self.create_allocs(&spec, version, 1, index);
        tracing::info!(job = %spec.id, alloc_id, replacement = %replacement[0], "replacing failed allocation");
    }

    fn remove_empty_purged_jobs(&mut self) {
        let empty: Vec<String> = self
            .jobs
            .iter()
            .filter(|(id, job)| job.purged && self.job_allocs(id).next().is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in empty {
            self.jobs.remove(&id);
            self.dirty_jobs.insert(id);
        }
    }
}

#[async_trait::async_trait]
impl ServerApi for EmbeddedServer {
    async fn register_node(&self, node_id: &str) -> Result<(), ServerError> {
        let ((), saved) = self.change(|state, index| {
            state.nodes.insert(node_id.to_string());
            state.place_unplaced(index);
        });
        saved.map_err(|e| ServerError::Unavailable(format!("cannot save server state: {e}")))
    }

    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError> {
        wait_for_index(&self.index, min_index, wait).await;
        let state = self.lock();
        let allocs = state
            .allocs
            .values()
            .filter(|a| a.node_id.as_deref() == Some(node_id))
            .map(|a| (a.alloc.id.clone(), a.alloc.modify_index))
            .collect::<HashMap<_, _>>();
        Ok(NodeAllocs {
            index: state.index,
            allocs,
        })
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        let state = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| state.allocs.get(id).map(|a| a.alloc.clone()))
            .collect())
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        let restart_limit = self.config.restart_limit;
        let (accepted, saved) = self.change(|state, index| {
            let mut accepted = Vec::new();
            for update in updates {
                let Some(record) = state.alloc_mut(&update.alloc_id) else {
                    continue;
                };
                if update.state.client_status.is_terminal() && record.terminal_since.is_none() {
                    record.terminal_since = Some(Instant::now());
                }
                record.client_state = Some(update.state.clone());
                accepted.push(update.alloc_id.clone());
                state.replace_if_failed(&update.alloc_id, restart_limit, index);
            }
            accepted
        });
        // Not acknowledged unless on disk: the client keeps them and sends them again.
        saved.map_err(|e| ServerError::Unavailable(format!("cannot save server state: {e}")))?;
        Ok(accepted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::{ClientStatus, LimitOverrides, Task};

    fn spec(id: &str, job_type: JobType, count: u32) -> JobSpec {
        JobSpec {
            id: id.into(),
            job_type,
            count,
            runner: "r.wasm".into(),
            limits: LimitOverrides::default(),
            tasks: vec![Task::named("main")],
            meta: vec![],
        }
    }

    fn wanted(server: &EmbeddedServer, job: &str) -> usize {
        server
            .job_allocs(job)
            .iter()
            .filter(|a| a.is_wanted())
            .count()
    }

    async fn report(server: &EmbeddedServer, alloc_id: &str, status: ClientStatus) {
        let state = AllocState {
            client_status: status,
            description: String::new(),
            task_states: vec![],
        };
        server
            .update_allocs(&[AllocUpdate {
                alloc_id: alloc_id.into(),
                state,
            }])
            .await
            .unwrap();
    }

    #[test]
    fn placement_spreads_allocs_over_the_least_loaded_nodes() {
        let load = BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 0)]);
        let nodes: Vec<_> = place(&load, 4).into_iter().map(Option::unwrap).collect();
        assert_eq!(nodes, ["b", "b", "a", "b"]);
        assert_eq!(
            place(&BTreeMap::new(), 2),
            [None, None],
            "no node yet: unplaced"
        );
    }

    #[tokio::test]
    async fn allocs_wait_for_a_node_then_are_placed_on_it() {
        let server = EmbeddedServer::new(ServerConfig::default());
        server.register_job(spec("web", JobType::Service, 2));
        assert!(server.allocs().iter().all(|a| a.node_id.is_none()));
        server.register_node("n1").await.unwrap();
        let seen = server.watch_allocs("n1", 0, Duration::ZERO).await.unwrap();
        assert_eq!(seen.allocs.len(), 2);
    }

    #[tokio::test]
    async fn scaling_up_adds_allocs_and_down_stops_the_newest() {
        let server = EmbeddedServer::new(ServerConfig::default());
        server.register_node("n1").await.unwrap();
        let first = server.register_job(spec("web", JobType::Service, 2));
        assert!(first.created);
        let up = server.register_job(spec("web", JobType::Service, 4));
        assert_eq!(
            (up.created, up.placed.len(), up.stopped.len()),
            (false, 2, 0)
        );
        let down = server.register_job(spec("web", JobType::Service, 1));
        assert_eq!(down.stopped.len(), 3);
        assert!(
            down.stopped
                .iter()
                .all(|id| !first.placed[..1].contains(id)),
            "the oldest stays"
        );
        assert_eq!(wanted(&server, "web"), 1);
    }

    #[tokio::test]
    async fn a_changed_runner_replaces_every_alloc() {
        let server = EmbeddedServer::new(ServerConfig::default());
        server.register_node("n1").await.unwrap();
        let first = server.register_job(spec("web", JobType::Service, 2));
        let changed = server.register_job(JobSpec {
            runner: "other.wasm".into(),
            ..spec("web", JobType::Service, 2)
        });
        assert_eq!(changed.stopped.len(), 2);
        assert_eq!(changed.placed.len(), 2);
        assert!(
            first
                .placed
                .iter()
                .all(|id| server.alloc(id).unwrap().alloc.desired_status == DesiredStatus::Stop)
        );
        assert_eq!(server.job("web").unwrap().version, 2);
    }

    #[tokio::test]
    async fn a_failed_service_alloc_is_replaced_up_to_the_restart_limit() {
        let server = EmbeddedServer::new(ServerConfig {
            restart_limit: 1,
            ..ServerConfig::default()
        });
        server.register_node("n1").await.unwrap();
        let first = server.register_job(spec("web", JobType::Service, 1)).placed[0].clone();
        report(&server, &first, ClientStatus::Failed).await;
        assert_eq!(server.job_allocs("web").len(), 2, "one replacement");
        let second = server
            .job_allocs("web")
            .into_iter()
            .find(|a| a.alloc.id != first)
            .unwrap()
            .alloc
            .id
            .clone();
        report(&server, &second, ClientStatus::Failed).await;
        assert_eq!(
            server.job_allocs("web").len(),
            2,
            "the limit is reached: no more"
        );
    }

    #[tokio::test]
    async fn stop_and_gc_remove_only_terminal_allocs_and_purge_removes_the_job_last() {
        let server = EmbeddedServer::new(ServerConfig::default());
        server.register_node("n1").await.unwrap();
        let ids = server.register_job(spec("web", JobType::Service, 2)).placed;
        assert_eq!(server.stop_job("web", true).unwrap().len(), 2);
        report(&server, &ids[0], ClientStatus::Complete).await;
        assert!(
            server.collect_garbage(false).is_empty(),
            "within job_gc_threshold: kept"
        );
        assert_eq!(
            server.collect_garbage(true),
            [ids[0].clone()],
            "forced: the terminal one goes"
        );
        assert!(
            server.alloc(&ids[1]).is_ok(),
            "a non-terminal alloc is never removed"
        );
        assert!(
            server.job("web").is_err(),
            "a purged job is gone from listings at once"
        );
        report(&server, &ids[1], ClientStatus::Complete).await;
        server.collect_garbage(true);
        assert!(server.allocs().is_empty());
        assert!(matches!(
            server.stop_job("nope", false),
            Err(RequestError::JobNotFound(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_batch_job_is_collected_after_the_threshold() {
        let server = EmbeddedServer::new(ServerConfig {
            job_gc_threshold: Duration::from_secs(60),
            ..ServerConfig::default()
        });
        server.register_node("n1").await.unwrap();
        let id = server.register_job(spec("once", JobType::Batch, 1)).placed[0].clone();
        report(&server, &id, ClientStatus::Complete).await;
        assert!(server.collect_garbage(false).is_empty());
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(server.collect_garbage(false), [id]);
    }
}
