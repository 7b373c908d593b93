//! The client core: the alloc map, the server watch, alloc sync and garbage collection.
//!
//! Layout:
//! - [`sync`]: batched, paced state updates to the server.
//! - [`gc`]: the garbage collector and its [`gc::GcConfig`].
//! - [`metrics`]: the counters the agent exposes.
//! - [`persist`]: saving allocs, states and checkpoints to the state store.
//! - `restore`: at start, gives every saved alloc its runner back (its own invariants).
//! - `runners`: each runner built and started (or its alloc failed), updated, pruned; the
//!   state updater through which runners report.
//! - `watch`: registers the node, watches the server and applies each answer (its own
//!   invariants).
//!
//! Invariants of the alloc map, each kept from the Nomad client for the reason given:
//! - The map holds every runner, running or already collected, until the server stops
//!   listing the alloc; only then is it pruned. A collected alloc's status stays answerable.
//! - A factory error fails that alloc alone (reported `failed` with the error), remembers
//!   its id and ignores later updates for it: one bad runner must not take the node down.
//! - A server removal prunes the alloc and forces its collection at once, still under the
//!   destroy limit; a running alloc is killed by that destroy before it is freed.
//! - Runner methods are never called with the map locked: runners report synchronously into
//!   the client, which locks the map.
//!
//! The client talks to the server only through [`crate::rpc::ServerApi`], builds runners only
//! through the [`AllocRunnerFactory`] it was given, and saves only through its
//! [`crate::state::StateDb`].

pub mod gc;
mod leftovers;
pub mod metrics;
pub mod migrate;
pub mod persist;
mod restore;
mod runners;
pub mod sync;
mod watch;

pub use watch::{AllocDiff, diff_allocs};

use runners::{alloc_dir_in, check_alloc_id};

use crate::alloc_logs::AllocLogs;
use crate::allocrunner::{AllocRunner, AllocRunnerFactory, NotRunningReason, TaskActionError};
use crate::model::node::NodeInfo;
use crate::model::structs::{Alloc, AllocState, ClientStatus, Limits};
use crate::rpc::ServerApi;
use crate::state::{MemoryStateDb, StateDb};
use crate::util::determinism::HashMap;
use crate::util::locks::LockUnpoisoned;
use gc::{GarbageCollector, GcConfig, GcError, StatsSource};
use metrics::{Metrics, MetricsSnapshot};
use persist::Persister;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
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
    /// Where the allocs' guest output is written (by default under `<data_dir>/logs`).
    pub alloc_logs: AllocLogs,
    /// What the node says of itself when it registers (capacity and attributes, for
    /// placement): nothing by default.
    pub node_info: NodeInfo,
}

impl ClientConfig {
    /// Defaults for node `node_id` with data under `data_dir`.
    pub fn new(node_id: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        ClientConfig {
            node_id: node_id.into(),
            alloc_logs: AllocLogs::under_data_dir(&data_dir),
            data_dir,
            limits: Limits::default(),
            gc: GcConfig::default(),
            watch_wait: Duration::from_secs(300),
            node_info: NodeInfo::default(),
        }
    }
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
    /// Set by [`Client::shutdown_all`]: no runner starts after it.
    stopping: std::sync::atomic::AtomicBool,
    /// Where the checkpoints of allocs moved here from other nodes come from (`migrate`).
    checkpoint_source: Mutex<Option<migrate::CheckpointSource>>,
    /// Allocs evicted to move elsewhere, whose final checkpoint this node serves once they
    /// stopped (see `migrate`).
    moved: Mutex<HashMap<String, migrate::Leaving>>,
    /// Allocs moved here whose checkpoint is being fetched, each at the newest version the
    /// server sent: their runner starts after, as that version says (`migrate`).
    arriving: Mutex<HashMap<String, Arc<Alloc>>>,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        for task in self.tasks.lock_unpoisoned().drain(..) {
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
        let inner = Arc::new({
            let on_destroyed = {
                let persister = persister.clone();
                Box::new(move |alloc_id: &str| persister.mark_collected(alloc_id))
            };
            let on_acked = {
                let persister = persister.clone();
                Box::new(move |alloc_id: &str, state: &Arc<AllocState>| {
                    persister.save_acked(alloc_id, state.clone())
                })
            };
            ClientInner {
                gc: Arc::new(GarbageCollector::new(
                    config.gc.clone(),
                    stats,
                    on_destroyed,
                    metrics.clone(),
                )),
                sync: Arc::new(AllocSync::new(metrics.clone(), on_acked)),
                persister,
                config,
                server,
                factory,
                runners: Mutex::new(HashMap::default()),
                runnerless: Mutex::new(HashMap::default()),
                metrics,
                tasks: Mutex::new(Vec::new()),
                stopping: std::sync::atomic::AtomicBool::new(false),
                checkpoint_source: Mutex::new(None),
                moved: Mutex::new(Default::default()),
                arriving: Mutex::new(Default::default()),
            }
        });
        Client { inner }
    }

    /// As [`Client::with_state`], with disk usage read from the filesystem of the data dir:
    /// the client a node runs. Which runners `factory` builds is the caller's decision (the
    /// agent passes the WebAssembly one), so the client never names a runtime.
    pub fn with_disk_stats(
        config: ClientConfig,
        server: Arc<dyn ServerApi>,
        factory: AllocRunnerFactory,
        db: Arc<dyn StateDb>,
    ) -> Client {
        let stats = Arc::new(gc::StatvfsStats::new(config.data_dir.clone()));
        Client::with_state(config, server, factory, stats, db)
    }

    /// Starts the watch, sync, GC and state-saving loops on the current tokio runtime. They
    /// stop when the last clone of the client is dropped.
    pub fn start(&self) {
        let inner = &self.inner;
        let on_saved = {
            let weak = Arc::downgrade(inner);
            Box::new(move |alloc_id: &str, state: &Arc<AllocState>| {
                if let Some(client) = weak.upgrade() {
                    client.state_saved(alloc_id, state.clone());
                }
            })
        };
        let handles = [
            tokio::spawn(inner.persister.clone().run(on_saved)).abort_handle(),
            tokio::spawn(watch::watch_loop(Arc::downgrade(inner))).abort_handle(),
            tokio::spawn(inner.sync.clone().run(inner.server.clone())).abort_handle(),
            tokio::spawn(inner.gc.clone().run()).abort_handle(),
            tokio::spawn(leftovers::sweep_loop(Arc::downgrade(inner))).abort_handle(),
        ];
        inner.tasks.lock_unpoisoned().extend(handles);
    }

    /// Stops every loop of this client now, as the death of its process would: nothing
    /// more is watched, saved, reported or collected, and no runner starts, whatever was
    /// under way (a commit not yet made is lost, as it would be). Its runners are not told,
    /// and a task it spawned for one (a delayed start, a destroy) may still call it: whoever
    /// owns the runners stops them. For simulations of a crash; an agent that stops uses
    /// [`Client::shutdown_all`].
    pub fn halt(&self) {
        self.inner
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for task in self.inner.tasks.lock_unpoisoned().drain(..) {
            task.abort();
        }
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

    /// Where the alloc's directory is (or would be) on this node.
    pub fn alloc_dir(&self, alloc_id: &str) -> std::path::PathBuf {
        alloc_dir_in(&self.inner.config.data_dir, alloc_id)
    }

    /// Each alloc whose runner measures what it uses (the wasm runners), with what it used so
    /// far: what the agent samples for its plots. One lock, no runner called but for two
    /// atomic loads each.
    pub fn runner_usages(&self) -> Vec<(String, crate::allocrunner::AllocUsage)> {
        self.inner
            .runners_lock()
            .iter()
            .filter_map(|(id, runner)| Some((id.clone(), runner.usage()?)))
            .collect()
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
        self.runner_for_action(alloc_id, task, Some(signal))?
            .signal(task, signal)
    }

    /// Asks the runner of `alloc_id` to restart `task` (every task when `None`); answers as
    /// [`AllocRunner::restart_task`] does, or [`TaskActionError::UnknownAlloc`].
    pub fn restart_alloc(&self, alloc_id: &str, task: Option<&str>) -> Result<(), TaskActionError> {
        self.runner_for_action(alloc_id, task, None)?
            .restart_task(task)
    }

    /// The runner a signal or restart goes to. An alloc held without one (its runner could not
    /// be built, or it was collected before a restart) has finished: that is the answer, once
    /// the task is known to be one of its own and the signal (if any) a signal, so the answer
    /// is the one a runner would give.
    fn runner_for_action(
        &self,
        alloc_id: &str,
        task: Option<&str>,
        signal: Option<&str>,
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
        if let Some(signal) = signal {
            crate::allocrunner::signal_name(signal)?;
        }
        crate::allocrunner::target_tasks(&alloc, task)?;
        Err(TaskActionError::NotRunning {
            alloc_id: alloc_id.to_string(),
            reason: NotRunningReason::Finished(state.client_status),
        })
    }

    /// Runners not yet destroyed (running ones included): what `gc_max_allocs` limits.
    pub fn live_allocs(&self) -> usize {
        self.inner.gc.live()
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

    /// Shuts every runner down (the agent is stopping, not the allocs), waits for each, and
    /// waits for their last states and checkpoints to be saved. From its call on the client
    /// starts no runner: an alloc whose runner was being built is left to the node's next
    /// run, which finds it in the saved state or on the server (a runner started after the
    /// list below was taken would run on beside the next run's, twice).
    pub async fn shutdown_all(&self) {
        let runners: Vec<_> = {
            let runners = self.inner.runners_lock();
            // Under the lock: a runner is either in this list or sees the flag.
            self.inner
                .stopping
                .store(true, std::sync::atomic::Ordering::SeqCst);
            runners.values().cloned().collect()
        };
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
        let gc = &self.inner.gc;
        let started: Vec<_> = runners
            .into_iter()
            .filter_map(|(alloc_id, runner)| {
                gc.start_destroy(&alloc_id, runner, gc::GcReason::DevAgentStopping)
            })
            .collect();
        for destroying in started {
            destroying.finished().await;
        }
        self.flush_state().await;
    }

    /// Allocs collected so far, over every reason: the sum of a few counters, one per
    /// reason, where [`Client::metrics`] visits every runner (which, for a watcher looking
    /// often at a big node, is not free).
    pub fn allocs_collected_total(&self) -> u64 {
        self.inner.metrics.collected_total()
    }

    /// The client's counters, with allocs counted by client status now (collected ones by
    /// their final status, and once more under `allocs_destroyed`).
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut counts: HashMap<ClientStatus, u64> = HashMap::default();
        let mut destroyed = 0;
        let runners: Vec<_> = self.inner.runners_lock().values().cloned().collect();
        for runner in runners {
            destroyed += u64::from(runner.is_destroyed());
            *counts.entry(runner.client_status()).or_default() += 1;
        }
        for (_, state) in self.inner.runnerless_lock().values() {
            *counts.entry(state.client_status).or_default() += 1;
        }
        let by_status: BTreeMap<String, u64> = counts
            .into_iter()
            .map(|(status, count)| (status.to_string(), count))
            .collect();
        self.inner.metrics.snapshot(by_status, destroyed)
    }
}

impl ClientInner {
    fn runners_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<dyn AllocRunner>>> {
        self.runners.lock_unpoisoned()
    }

    fn moved_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, migrate::Leaving>> {
        self.moved.lock_unpoisoned()
    }

    fn runnerless_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<Alloc>, AllocState)>> {
        self.runnerless.lock_unpoisoned()
    }

    /// Routes a runner's report: saved first, and passed on once on disk; a report for an
    /// alloc the store does not know (its runner never existed) is passed on at once.
    fn report_state(&self, alloc_id: &str, state: &AllocState) {
        if !self.persister.save_state(alloc_id, state) {
            self.state_saved(alloc_id, Arc::new(state.clone()));
        }
    }

    /// A state is on disk: the server may hear it, and a terminal alloc may be collected.
    fn state_saved(&self, alloc_id: &str, state: Arc<AllocState>) {
        let terminal = state.client_status.is_terminal();
        self.sync.put(alloc_id, state);
        // A moved alloc is collected once its checkpoint was served (or its hold ran out):
        // collecting it deletes the checkpoint its replacement starts from.
        if terminal && !self.holds_for_its_replacement(alloc_id) {
            let runner = self.runners_lock().get(alloc_id).cloned();
            if let Some(runner) = runner {
                self.gc.mark_for_collection(alloc_id, runner);
                self.gc.trigger();
            }
        }
    }
}
