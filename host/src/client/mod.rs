//! The client core: the alloc map, the server watch, alloc sync and garbage collection.
//!
//! Layout:
//! - [`sync`]: batched, paced state updates to the server.
//! - [`gc`]: the garbage collector and its [`gc::GcConfig`].
//! - [`metrics`]: the counters the agent exposes.
//! - [`persist`]: saving allocs, states and checkpoints to the state store.
//!
//! Invariants of the alloc map, each kept from the Nomad client for the reason given:
//! - The map holds every runner, running or already collected, until the server stops
//!   listing the alloc; only then is it pruned. A collected alloc's status stays answerable.
//! - Each watch result is diffed by modify index into added, updated, removed and ignored:
//!   the server is the source of truth and a stale or repeated answer changes nothing.
//! - A factory error fails that alloc alone (reported `failed` with the error), remembers
//!   its id and ignores later updates for it: one bad runner must not take the node down.
//! - Restore (at start, before the watch) gives every saved alloc its runner back:
//!   non-terminal ones run again from their last checkpoint, terminal ones keep their final
//!   state and are never run again, collected ones stay collected. A record that cannot be
//!   read fails that alloc alone; an alloc with no usable record is dropped with a WARN.
//! - A server removal prunes the alloc and forces its collection at once, still under the
//!   destroy limit; a running alloc is killed by that destroy before it is freed.
//! - Runner methods are never called with the map locked: runners report synchronously into
//!   the client, which locks the map.
//!
//! The client talks to the server only through [`crate::rpc::ServerApi`], builds runners only
//! through the [`AllocRunnerFactory`] it was given, and saves only through its
//! [`crate::state::StateDb`].

pub mod gc;
pub mod metrics;
pub mod persist;
pub mod sync;

use crate::allocrunner::{
    AllocRunner, AllocRunnerConfig, AllocRunnerFactory, CheckpointSaved, NotRunningReason,
    StateUpdater, TaskActionError, alloc_span,
};
use crate::rpc::{NodeAllocs, ServerApi, ServerError};
use crate::state::{MemoryStateDb, SavedAlloc, StateDb, StateError};
use crate::structs::{Alloc, AllocState, ClientStatus, Limits};
use gc::{GarbageCollector, GcConfig, GcError, StatsSource};
use metrics::{Metrics, MetricsSnapshot};
use persist::Persister;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use sync::AllocSync;

/// What a client needs to know about itself.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// This node's id, as the server knows it.
    pub node_id: String,
    /// Alloc directories go under `<data_dir>/allocs/<alloc id>`.
    pub data_dir: PathBuf,
    /// Default limits for every alloc.
    pub limits: Limits,
    /// The garbage collector's knobs.
    pub gc: GcConfig,
    /// How long one watch call may wait for a change.
    pub watch_wait: Duration,
}

impl ClientConfig {
    /// Defaults for node `node_id` with data under `data_dir`.
    pub fn new(node_id: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        ClientConfig {
            node_id: node_id.into(),
            data_dir: data_dir.into(),
            limits: Limits::default(),
            gc: GcConfig::default(),
            watch_wait: Duration::from_secs(300),
        }
    }
}

/// How an alloc diff sorts the server's answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AllocDiff {
    /// On the server, not on the client.
    pub added: Vec<String>,
    /// On both, with a higher modify index on the server.
    pub updated: Vec<String>,
    /// On the client, no longer on the server.
    pub removed: Vec<String>,
    /// On both, unchanged (or failed on the client and so ignored).
    pub ignored: Vec<String>,
}

/// Diffs the client's allocs (id -> modify index) against the server's. Ids in `failed`
/// are allocs whose runner could not be built: never updated, only removed.
pub fn diff_allocs(
    client: &HashMap<String, u64>,
    failed: &HashMap<String, u64>,
    server: &HashMap<String, u64>,
) -> AllocDiff {
    let mut diff = AllocDiff::default();
    for (id, &server_index) in server {
        match client.get(id) {
            _ if failed.contains_key(id) => diff.ignored.push(id.clone()),
            None => diff.added.push(id.clone()),
            Some(&client_index) if server_index > client_index => diff.updated.push(id.clone()),
            Some(_) => diff.ignored.push(id.clone()),
        }
    }
    for id in client.keys().chain(failed.keys()) {
        if !server.contains_key(id) {
            diff.removed.push(id.clone());
        }
    }
    for list in [
        &mut diff.added,
        &mut diff.updated,
        &mut diff.removed,
        &mut diff.ignored,
    ] {
        list.sort();
    }
    diff
}

/// One node's client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    config: ClientConfig,
    server: Arc<dyn ServerApi>,
    factory: AllocRunnerFactory,
    runners: Mutex<HashMap<String, Arc<dyn AllocRunner>>>,
    /// Allocs held without a runner, with their state: those whose runner could not be built
    /// (failed) and those restored already collected (nothing left to run or free).
    runnerless: Mutex<HashMap<String, (Arc<Alloc>, AllocState)>>,
    sync: Arc<AllocSync>,
    persister: Arc<Persister>,
    gc: Arc<GarbageCollector>,
    metrics: Arc<Metrics>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        for task in self
            .tasks
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}

impl Client {
    /// A client of `server` that builds runners with `factory`, reads disk usage from
    /// `stats`, and keeps its state in memory only. Nothing runs until [`Client::start`].
    pub fn new(
        config: ClientConfig,
        server: Arc<dyn ServerApi>,
        factory: AllocRunnerFactory,
        stats: Arc<dyn StatsSource>,
    ) -> Client {
        Client::with_state(
            config,
            server,
            factory,
            stats,
            Arc::new(MemoryStateDb::new()),
        )
    }

    /// As [`Client::new`], saving to `db`: call [`Client::restore`] before
    /// [`Client::start`] to pick up where the last run left off.
    pub fn with_state(
        config: ClientConfig,
        server: Arc<dyn ServerApi>,
        factory: AllocRunnerFactory,
        stats: Arc<dyn StatsSource>,
        db: Arc<dyn StateDb>,
    ) -> Client {
        let metrics = Arc::new(Metrics::default());
        let persister = Arc::new(Persister::new(db, metrics.clone()));
        let inner = Arc::new_cyclic(|weak: &Weak<ClientInner>| {
            let live_allocs = {
                let weak = weak.clone();
                Box::new(move || weak.upgrade().map_or(0, |client| client.live_allocs()))
            };
            let on_destroyed = {
                let persister = persister.clone();
                Box::new(move |alloc_id: &str| persister.mark_collected(alloc_id))
            };
            let on_acked = {
                let persister = persister.clone();
                Box::new(move |alloc_id: &str, state: &AllocState| {
                    persister.save_acked(alloc_id, state)
                })
            };
            ClientInner {
                gc: Arc::new(GarbageCollector::new(
                    config.gc.clone(),
                    stats,
                    live_allocs,
                    on_destroyed,
                    metrics.clone(),
                )),
                sync: Arc::new(AllocSync::new(metrics.clone(), on_acked)),
                persister,
                config,
                server,
                factory,
                runners: Mutex::new(HashMap::new()),
                runnerless: Mutex::new(HashMap::new()),
                metrics,
                tasks: Mutex::new(Vec::new()),
            }
        });
        Client { inner }
    }

    /// A client with the defaults: WebAssembly runners from `runtime`, and disk usage read
    /// from the filesystem of the data dir.
    pub fn with_wasm_runners(
        config: ClientConfig,
        server: Arc<dyn ServerApi>,
        runtime: crate::runtime::Runtime,
        db: Arc<dyn StateDb>,
    ) -> Client {
        let stats = Arc::new(gc::StatvfsStats::new(config.data_dir.clone()));
        let factory = crate::runtime::WasmAllocRunnerFactory::new(runtime).into_factory();
        Client::with_state(config, server, factory, stats, db)
    }

    /// Starts the watch, sync, GC and state-saving loops on the current tokio runtime. They
    /// stop when the last clone of the client is dropped.
    pub fn start(&self) {
        let inner = &self.inner;
        let on_saved = {
            let weak = Arc::downgrade(inner);
            Box::new(move |alloc_id: &str, state: &AllocState| {
                if let Some(client) = weak.upgrade() {
                    client.state_saved(alloc_id, state);
                }
            })
        };
        let handles = [
            tokio::spawn(inner.persister.clone().run(on_saved)).abort_handle(),
            tokio::spawn(watch_loop(Arc::downgrade(inner))).abort_handle(),
            tokio::spawn(inner.sync.clone().run(inner.server.clone())).abort_handle(),
            tokio::spawn(inner.gc.clone().run()).abort_handle(),
        ];
        inner
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(handles);
    }

    /// The ids of every alloc the client holds (collected ones included).
    pub fn alloc_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.inner.runners_lock().keys().cloned().collect();
        ids.extend(self.inner.runnerless_lock().keys().cloned());
        ids.sort();
        ids
    }

    /// The alloc's state as the client knows it.
    pub fn alloc_state(&self, alloc_id: &str) -> Option<AllocState> {
        if let Some(runner) = self.runner(alloc_id) {
            return Some(runner.alloc_state());
        }
        self.inner
            .runnerless_lock()
            .get(alloc_id)
            .map(|(_, state)| state.clone())
    }

    /// The runner of an alloc, if the client holds one.
    pub fn runner(&self, alloc_id: &str) -> Option<Arc<dyn AllocRunner>> {
        self.inner.runners_lock().get(alloc_id).cloned()
    }

    /// Asks the runner of `alloc_id` to deliver `signal` to `task` (every task when `None`);
    /// answers as [`AllocRunner::signal`] does, or [`TaskActionError::UnknownAlloc`].
    pub fn signal_alloc(
        &self,
        alloc_id: &str,
        task: Option<&str>,
        signal: &str,
    ) -> Result<(), TaskActionError> {
        self.runner_for_action(alloc_id, task)?.signal(task, signal)
    }

    /// Asks the runner of `alloc_id` to restart `task` (every task when `None`); answers as
    /// [`AllocRunner::restart_task`] does, or [`TaskActionError::UnknownAlloc`].
    pub fn restart_alloc(&self, alloc_id: &str, task: Option<&str>) -> Result<(), TaskActionError> {
        self.runner_for_action(alloc_id, task)?.restart_task(task)
    }

    /// The runner a signal or restart goes to. An alloc held without one (its runner could not
    /// be built, or it was collected before a restart) has finished: that is the answer, once
    /// the task is known to be one of its own.
    fn runner_for_action(
        &self,
        alloc_id: &str,
        task: Option<&str>,
    ) -> Result<Arc<dyn AllocRunner>, TaskActionError> {
        if let Some(runner) = self.runner(alloc_id) {
            return Ok(runner);
        }
        let (alloc, state) = self
            .inner
            .runnerless_lock()
            .get(alloc_id)
            .cloned()
            .ok_or_else(|| TaskActionError::UnknownAlloc(alloc_id.to_string()))?;
        crate::allocrunner::target_tasks(&alloc, task)?;
        Err(TaskActionError::NotRunning {
            alloc_id: alloc_id.to_string(),
            reason: NotRunningReason::Finished(state.client_status),
        })
    }

    /// Runners not yet destroyed (running ones included): what `gc_max_allocs` limits.
    pub fn live_allocs(&self) -> usize {
        self.inner.live_allocs()
    }

    /// The garbage collector, for passes on demand and its queue length.
    pub fn gc(&self) -> &Arc<GarbageCollector> {
        &self.inner.gc
    }

    /// Forced collection of one terminal alloc, whatever the thresholds, under the destroy
    /// limit. Refuses an unknown or non-terminal alloc; an already destroyed one is a no-op.
    pub async fn collect(&self, alloc_id: &str) -> Result<(), GcError> {
        if self.inner.runnerless_lock().contains_key(alloc_id) {
            // Failed before it had a runner, or collected before a restart: nothing to free.
            return Ok(());
        }
        let runner = self
            .runner(alloc_id)
            .ok_or_else(|| GcError::UnknownAlloc(alloc_id.to_string()))?;
        if runner.is_destroyed() {
            return Ok(());
        }
        let status = runner.alloc_state().client_status;
        if !status.is_terminal() {
            return Err(GcError::NotTerminal {
                alloc_id: alloc_id.to_string(),
                status: status.to_string(),
            });
        }
        self.inner.gc.collect(alloc_id, runner).await;
        // Answered once the collection is on disk, so a crash right after cannot undo it.
        self.flush_state().await;
        Ok(())
    }

    /// Forced collection of every terminal alloc, under the destroy limit; returns once the
    /// collections are on disk.
    pub async fn collect_all(&self) {
        self.inner.gc.collect_all().await;
        self.flush_state().await;
    }

    /// Where an alloc's guest output is written (`.1`, `.2` beside it are older, rotated).
    pub fn log_file(&self, alloc_id: &str) -> PathBuf {
        self.inner
            .config
            .data_dir
            .join("logs")
            .join(format!("{alloc_id}.log"))
    }

    /// Shuts every runner down (the agent is stopping, not the allocs), waits for each, and
    /// waits for their last states and checkpoints to be saved.
    pub async fn shutdown_all(&self) {
        let runners: Vec<_> = self.inner.runners_lock().values().cloned().collect();
        for runner in &runners {
            runner.shutdown();
        }
        for runner in &runners {
            runner.shutdown_done().wait().await;
        }
        self.flush_state().await;
    }

    /// Waits until every state, checkpoint and record queued so far is saved.
    pub async fn flush_state(&self) {
        if let Err(error) = self.inner.persister.flush().await {
            tracing::error!(error = %error, "client state not saved before stopping");
        }
    }

    /// Destroys every runner (a dev agent leaves nothing behind) and waits for each, under
    /// the destroy limit.
    pub async fn destroy_all(&self) {
        let runners: Vec<_> = self
            .inner
            .runners_lock()
            .iter()
            .map(|(id, runner)| (id.clone(), runner.clone()))
            .collect();
        let mut destroys = tokio::task::JoinSet::new();
        for (alloc_id, runner) in runners {
            let gc = self.inner.gc.clone();
            destroys.spawn(async move {
                gc.destroy(&alloc_id, runner, gc::GcReason::DevAgentStopping)
                    .await;
            });
        }
        while destroys.join_next().await.is_some() {}
        self.flush_state().await;
    }

    /// Gives every alloc saved by an earlier run its runner back (see the module docs) and
    /// returns how many were restored. Call once, before [`Client::start`]; a store that
    /// cannot be read at all is an error, a bad record costs only its alloc.
    pub async fn restore(&self) -> Result<usize, StateError> {
        let db = self.inner.persister.db().clone();
        let saved = crate::state::blocking(|| db.client_allocs())?;
        let count = saved.len();
        self.inner.restore(saved).await;
        Ok(count)
    }

    /// The client's counters, with allocs counted by client status now (collected ones by
    /// their final status, and once more under `allocs_destroyed`).
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
        let mut destroyed = 0;
        let runners: Vec<_> = self.inner.runners_lock().values().cloned().collect();
        for runner in runners {
            destroyed += u64::from(runner.is_destroyed());
            *by_status
                .entry(runner.alloc_state().client_status.to_string())
                .or_default() += 1;
        }
        for (_, state) in self.inner.runnerless_lock().values() {
            *by_status
                .entry(state.client_status.to_string())
                .or_default() += 1;
        }
        self.inner.metrics.snapshot(by_status, destroyed)
    }

    /// Applies one watch answer, as the watch loop does. Public so tests and simulators can
    /// feed a client answers of their own; new allocs are saved first, so the client must
    /// have been started (its state-saving loop running).
    pub async fn apply(&self, answer: &NodeAllocs) -> Result<(), ServerError> {
        self.inner.apply(answer).await
    }
}

impl ClientInner {
    fn runners_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<dyn AllocRunner>>> {
        self.runners.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn runnerless_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<Alloc>, AllocState)>> {
        self.runnerless.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Routes a runner's report: saved first, and passed on once on disk; a report for an
    /// alloc the store does not know (its runner never existed) is passed on at once.
    fn report_state(&self, alloc_id: &str, state: &AllocState) {
        if !self.persister.save_state(alloc_id, state) {
            self.state_saved(alloc_id, state);
        }
    }

    /// A state is on disk: the server may hear it, and a terminal alloc may be collected.
    fn state_saved(&self, alloc_id: &str, state: &AllocState) {
        self.sync.put(alloc_id, state.clone());
        if state.client_status.is_terminal() {
            let runner = self.runners_lock().get(alloc_id).cloned();
            if let Some(runner) = runner {
                self.gc.mark_for_collection(alloc_id, runner);
                self.gc.trigger();
            }
        }
    }

    fn live_allocs(&self) -> usize {
        let runners: Vec<_> = self.runners_lock().values().cloned().collect();
        runners
            .iter()
            .filter(|runner| !runner.is_destroyed())
            .count()
    }

    async fn apply(self: &Arc<Self>, answer: &NodeAllocs) -> Result<(), ServerError> {
        let client: HashMap<String, u64> = {
            let runners: Vec<_> = self
                .runners_lock()
                .iter()
                .map(|(id, r)| (id.clone(), r.clone()))
                .collect();
            runners
                .into_iter()
                .map(|(id, runner)| (id, runner.alloc().modify_index))
                .collect()
        };
        let failed: HashMap<String, u64> = self
            .runnerless_lock()
            .iter()
            .map(|(id, (alloc, _))| (id.clone(), alloc.modify_index))
            .collect();
        let diff = diff_allocs(&client, &failed, &answer.allocs);
        tracing::debug!(
            added = diff.added.len(),
            updated = diff.updated.len(),
            removed = diff.removed.len(),
            ignored = diff.ignored.len(),
            "allocation updates"
        );

        let wanted: Vec<String> = diff.added.iter().chain(&diff.updated).cloned().collect();
        let fetched = if wanted.is_empty() {
            Vec::new()
        } else {
            self.server.get_allocs(&wanted).await?
        };
        // Each requested alloc once; what the server sends besides is not ours to add.
        let mut seen = std::collections::HashSet::new();
        let (mut added, mut updated) = (Vec::new(), Vec::new());
        for alloc in fetched {
            if !seen.insert(alloc.id.clone()) {
                continue;
            }
            if diff.added.contains(&alloc.id) {
                added.push(alloc);
            } else {
                updated.push(alloc);
            }
        }
        // New allocs are on disk before any runner is built: one commit for the lot.
        let (valid, invalid): (Vec<_>, Vec<_>) = added
            .into_iter()
            .partition(|alloc| check_alloc_id(&alloc.id).is_ok());
        for alloc in invalid {
            let reason = check_alloc_id(&alloc.id).unwrap_err();
            self.fail_alloc(alloc.clone(), &alloc_span(&alloc), reason);
        }
        let saved = self.persister.save_allocs(&valid).await;
        for alloc in valid {
            match &saved {
                Ok(()) => self.add_alloc(alloc, None, None).await,
                Err(error) => {
                    let reason = format!("cannot save the alloc before running it: {error}");
                    self.fail_alloc(alloc.clone(), &alloc_span(&alloc), reason);
                }
            }
        }
        for alloc in updated {
            self.persister.save_alloc_update(alloc.clone());
            self.update_alloc(alloc);
        }
        for alloc_id in &diff.removed {
            self.remove_alloc(alloc_id);
        }
        if !diff.added.is_empty() || !diff.updated.is_empty() || !diff.removed.is_empty() {
            self.gc.trigger();
        }
        Ok(())
    }

    /// Builds and starts the runner of a saved alloc (restored with its last checkpoint and
    /// state when it comes from an earlier run).
    async fn add_alloc(
        self: &Arc<Self>,
        alloc: Arc<Alloc>,
        restored: Option<Vec<u8>>,
        last_state: Option<AllocState>,
    ) {
        let config = self.runner_config(&alloc, restored, last_state);
        let span = config.span.clone();
        // A factory may read and compile a component (tens of milliseconds, seconds for some
        // languages): keep that off the async workers.
        let factory = self.factory.clone();
        let built = tokio::task::spawn_blocking(move || factory(config))
            .await
            .unwrap_or_else(|join_error| {
                Err(anyhow::anyhow!("the runner factory panicked: {join_error}"))
            });
        match built {
            Ok(runner) => self.start_runner(&alloc.id, runner),
            Err(error) => self.fail_alloc(alloc, &span, format!("{error:#}")),
        }
    }

    /// Puts a built runner in the map; runs it unless it is restored terminal, in which
    /// case it only waits for collection.
    fn start_runner(&self, alloc_id: &str, runner: Arc<dyn AllocRunner>) {
        self.runners_lock()
            .insert(alloc_id.to_string(), runner.clone());
        if runner.alloc_state().client_status.is_terminal() {
            self.gc.mark_for_collection(alloc_id, runner);
        } else {
            runner.run();
        }
    }

    fn runner_config(
        self: &Arc<Self>,
        alloc: &Arc<Alloc>,
        restored: Option<Vec<u8>>,
        last_state: Option<AllocState>,
    ) -> AllocRunnerConfig {
        AllocRunnerConfig {
            alloc: alloc.clone(),
            span: alloc_span(alloc),
            state_updater: Arc::new(ClientStateUpdater {
                client: Arc::downgrade(self),
            }),
            limits: self.config.limits,
            alloc_dir: self.config.data_dir.join("allocs").join(&alloc.id),
            restored,
            last_state,
            log_file: Some(
                self.config
                    .data_dir
                    .join("logs")
                    .join(format!("{}.log", alloc.id)),
            ),
        }
    }

    /// Fails an alloc whose runner cannot be built: reported, remembered, never retried.
    fn fail_alloc(&self, alloc: Arc<Alloc>, span: &tracing::Span, description: String) {
        tracing::warn!(parent: span, error = %description, "failed to build the alloc's runner");
        self.metrics.runner_build_failed();
        let state = AllocState::failed(description);
        self.runnerless_lock()
            .insert(alloc.id.clone(), (alloc.clone(), state.clone()));
        self.report_state(&alloc.id, &state);
    }

    /// Restores what an earlier run saved (see [`Client::restore`]).
    async fn restore(self: &Arc<Self>, saved: Vec<SavedAlloc>) {
        let mut to_build = Vec::new();
        for record in saved {
            let alloc_id = record.alloc_id.clone();
            let alloc = match record.alloc {
                Some(Ok(alloc)) if check_alloc_id(&alloc.id).is_ok() && alloc.id == alloc_id => {
                    Arc::new(alloc)
                }
                unusable => {
                    let why = match unusable {
                        Some(Err(reason)) => reason,
                        Some(Ok(_)) => "the saved alloc does not match its key".into(),
                        None => "no alloc record, only state".into(),
                    };
                    tracing::warn!(alloc_id, reason = %why, "dropping saved allocation with no usable record");
                    self.persister.delete(&alloc_id);
                    continue;
                }
            };
            let state = match record.state {
                Some(Err(reason)) => {
                    self.persister.restored(&alloc_id, None, false);
                    let span = alloc_span(&alloc);
                    self.fail_alloc(alloc, &span, format!("cannot restore the alloc: {reason}"));
                    continue;
                }
                Some(Ok(state)) => Some(state),
                None => None,
            };
            let acked = match record.acked {
                Some(Err(reason)) => {
                    // Only costs a resend of a state the server may already have.
                    tracing::warn!(alloc_id, reason = %reason, "ignoring unreadable acknowledged state");
                    None
                }
                Some(Ok(acked)) => Some(acked),
                None => None,
            };
            if let Some(acked) = &acked {
                self.sync.restore_acknowledged(&alloc_id, acked.clone());
            }
            if record.collected {
                // Nothing left to run or free; still answered for until the server drops it.
                let final_state = state.unwrap_or_else(|| AllocState {
                    client_status: ClientStatus::Complete,
                    description: "alloc was collected".into(),
                    task_states: Vec::new(),
                });
                self.persister
                    .restored(&alloc_id, Some(final_state.clone()), true);
                if acked.as_ref() != Some(&final_state) {
                    self.sync.put(&alloc_id, final_state.clone());
                }
                self.runnerless_lock()
                    .insert(alloc_id, (alloc, final_state));
                continue;
            }
            self.persister.restored(&alloc_id, state.clone(), false);
            if let Some(state) = &state
                && acked.as_ref() != Some(state)
            {
                // Saved but never acknowledged: the server has yet to hear it.
                self.sync.put(&alloc_id, state.clone());
            }
            to_build.push(self.runner_config(&alloc, record.checkpoint, state));
        }
        // One trip to the blocking pool for every runner: the factory compiles a component
        // once, then each build is cheap. A panic fails its own alloc only.
        let factory = self.factory.clone();
        let built = tokio::task::spawn_blocking(move || {
            to_build
                .into_iter()
                .map(|config| {
                    let (alloc, span) = (config.alloc.clone(), config.span.clone());
                    let last_state = config.last_state.clone();
                    let factory = &factory;
                    let result =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| factory(config)))
                            .unwrap_or_else(|_| {
                                Err(anyhow::anyhow!("the runner factory panicked"))
                            });
                    (alloc, span, last_state, result)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let (mut running, mut finished) = (0usize, 0usize);
        for (alloc, span, last_state, result) in built {
            match (result, last_state) {
                (Ok(runner), _) => {
                    if runner.alloc_state().client_status.is_terminal() {
                        finished += 1;
                    } else {
                        running += 1;
                    }
                    self.start_runner(&alloc.id, runner);
                }
                (Err(error), Some(last)) if last.client_status.is_terminal() => {
                    // Finished already: its runner is not needed to answer for it, and
                    // failing it now would rewrite history (and replace a service alloc).
                    tracing::warn!(parent: &span, error = %format!("{error:#}"), "cannot rebuild a finished alloc's runner; keeping its final state");
                    finished += 1;
                    self.runnerless_lock()
                        .insert(alloc.id.clone(), (alloc, last));
                }
                (Err(error), _) => self.fail_alloc(alloc, &span, format!("{error:#}")),
            }
        }
        tracing::info!(
            running,
            finished,
            held = self.runnerless_lock().len(),
            "restored allocations"
        );
    }

    fn update_alloc(&self, alloc: Arc<Alloc>) {
        let Some(runner) = self.runners_lock().get(&alloc.id).cloned() else {
            tracing::warn!(alloc_id = %alloc.id, "cannot update nonexistent alloc");
            return;
        };
        runner.update(alloc);
    }

    /// The server dropped the alloc: prune it, collect it if it still holds anything, then
    /// delete its records.
    fn remove_alloc(self: &Arc<Self>, alloc_id: &str) {
        self.sync.forget(alloc_id);
        if self.runnerless_lock().remove(alloc_id).is_some() {
            self.persister.delete(alloc_id);
            return;
        }
        let Some(runner) = self.runners_lock().remove(alloc_id) else {
            return;
        };
        tracing::debug!(alloc_id, "pruning allocation the server dropped");
        if runner.is_destroyed() {
            self.gc.forget(alloc_id);
            self.persister.delete(alloc_id);
            return;
        }
        // Marked now, not after the destroy: a stop of the agent before the destroy ends must
        // not restore an alloc the server has already dropped.
        self.persister.mark_collected(alloc_id);
        let (gc, persister) = (self.gc.clone(), self.persister.clone());
        let alloc_id = alloc_id.to_string();
        tokio::spawn(async move {
            gc.collect_removed(&alloc_id, runner).await;
            persister.delete(&alloc_id);
        });
    }
}

/// An alloc id names a directory on this machine, so it must be one plain path component.
fn check_alloc_id(id: &str) -> Result<(), String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if id.is_empty() || id.len() > 128 || id == "." || id == ".." || !id.chars().all(plain) {
        return Err(format!(
            "invalid alloc id {id:?}: expected 1 to 128 letters, digits, '-', '_' or '.', and not . or .."
        ));
    }
    Ok(())
}

/// Routes one runner's reports into the client: saved, then to the sync, and to the GC once
/// terminal; checkpoints are saved before the guest hears `ok`.
struct ClientStateUpdater {
    client: Weak<ClientInner>,
}

impl StateUpdater for ClientStateUpdater {
    fn alloc_state_updated(&self, alloc_id: &str, state: &AllocState) {
        if let Some(client) = self.client.upgrade() {
            client.report_state(alloc_id, state);
        }
    }

    fn checkpoint_saved(&self, alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        match self.client.upgrade() {
            Some(client) => Box::pin(client.persister.save_checkpoint(alloc_id, data)),
            None => Box::pin(std::future::ready(
                Err("the client is stopping".to_string()),
            )),
        }
    }
}

/// Registers the node, then watches the server's allocs for it and applies each change.
/// Every error is retried with backoff; the loop ends when the client is dropped.
async fn watch_loop(client: Weak<ClientInner>) {
    let mut failures = 0u32;
    let mut index = 0u64;
    let mut registered = false;
    loop {
        let Some(inner) = client.upgrade() else {
            return;
        };
        let (server, node_id, wait) = (
            inner.server.clone(),
            inner.config.node_id.clone(),
            inner.config.watch_wait,
        );
        drop(inner);
        let result = async {
            if !registered {
                server.register_node(&node_id).await?;
                registered = true;
                tracing::info!(node_id = %node_id, "node registered");
            }
            let answer = server.watch_allocs(&node_id, index, wait).await?;
            let Some(inner) = client.upgrade() else {
                return Ok(());
            };
            inner.sync.contacted();
            inner.apply(&answer).await?;
            index = answer.index;
            Ok::<(), ServerError>(())
        }
        .await;
        match result {
            Ok(()) => failures = 0,
            Err(error) => {
                failures += 1;
                // The server may have lost the node (a restart): register again.
                registered = false;
                let wait = sync::backoff(failures);
                tracing::warn!(error = %error, retry_in_ms = wait.as_millis() as u64, "error watching allocations");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, u64)]) -> HashMap<String, u64> {
        entries
            .iter()
            .map(|(id, index)| (id.to_string(), *index))
            .collect()
    }

    #[test]
    fn an_alloc_id_must_be_one_plain_path_component() {
        assert!(check_alloc_id("0b5e3c1e-9f1a-4c1e-8d1b-3f8e2a1c9d00").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "../etc",
            "/",
            "a/b",
            "a\\b",
            &"x".repeat(129),
        ] {
            assert!(check_alloc_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_diff_sorts_server_allocs_by_modify_index() {
        let client = map(&[("same", 3), ("newer", 3), ("gone", 1)]);
        let server = map(&[("same", 3), ("newer", 4), ("new", 1)]);
        let diff = diff_allocs(&client, &HashMap::new(), &server);
        assert_eq!(diff.added, ["new"]);
        assert_eq!(diff.updated, ["newer"]);
        assert_eq!(diff.removed, ["gone"]);
        assert_eq!(diff.ignored, ["same"]);
    }

    #[test]
    fn an_older_index_from_the_server_is_ignored_not_applied() {
        let diff = diff_allocs(&map(&[("a", 5)]), &HashMap::new(), &map(&[("a", 4)]));
        assert_eq!(diff.ignored, ["a"]);
        assert!(diff.updated.is_empty());
    }

    #[test]
    fn updates_for_a_failed_alloc_are_ignored_and_its_removal_is_not() {
        let failed = map(&[("bad", 1), ("dropped", 1)]);
        let diff = diff_allocs(&HashMap::new(), &failed, &map(&[("bad", 7)]));
        assert_eq!(diff.ignored, ["bad"]);
        assert_eq!(diff.removed, ["dropped"]);
        assert!(diff.added.is_empty());
    }
}
