//! The seam between the client and whatever runs an alloc.
//!
//! The client keeps one [`AllocRunner`] per alloc and builds each through an
//! [`AllocRunnerFactory`] it was given: the default builds WebAssembly-backed runners
//! ([`crate::runtime::WasmAllocRunnerFactory`]); tests and simulators pass their own, such as
//! [`EmptyAllocRunner`].
//!
//! This module is a leaf: it depends on the plain data in [`crate::model::structs`], the alloc log
//! writer of [`crate::alloc_logs`] and tokio's synchronisation primitives, never on the
//! client, the garbage collector, storage or wasmtime.

mod empty;
mod latch;
mod task_action;

pub use empty::EmptyAllocRunner;
pub use latch::{Latch, LatchTrigger};
pub use task_action::{
    DEFAULT_SIGNAL, NotRunningReason, SIGNAL_NAMES, TaskActionError, signal_name, target_tasks,
};

use crate::alloc_logs::AllocLogWriter;
use crate::model::structs::{Alloc, AllocState, ClientStatus, Limits};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

/// Runs one alloc. Owned by the client as `Arc<dyn AllocRunner>`.
///
/// # Lifecycle
///
/// `new` (through the factory) -> [`run`](AllocRunner::run) once -> any number of
/// [`update`](AllocRunner::update) -> either [`shutdown`](AllocRunner::shutdown) (the agent
/// stops; the alloc stays non-terminal and is restored later) or
/// [`destroy`](AllocRunner::destroy) (the alloc is gone for good). A runner may also finish by
/// itself; its state then turns terminal and [`wait`](AllocRunner::wait) completes.
///
/// # Concurrency
///
/// Every method may be called from any thread, concurrently with any other, and returns
/// promptly: the work happens on tasks the runner spawns, and the caller awaits the latches
/// ([`wait`](AllocRunner::wait), [`shutdown_done`](AllocRunner::shutdown_done),
/// [`destroyed`](AllocRunner::destroyed)) when it needs the outcome. Each latch completes
/// exactly once and never un-completes. Every method must be called inside a tokio runtime
/// (the wasm runner spawns its work there).
pub trait AllocRunner: Send + Sync {
    /// The alloc as last given to [`AllocRunner::update`] (or at construction).
    fn alloc(&self) -> Arc<Alloc>;

    /// Starts running the alloc on a spawned task and returns at once. A second call does
    /// nothing. After [`AllocRunner::destroy`] it does nothing either. An alloc whose desired
    /// status is already stop or evict (restored after the server stopped it) is not started:
    /// it is killed at once.
    fn run(&self);

    /// Hands over a new version of the alloc. Versions whose `modify_index` is not greater
    /// than the current one are ignored. A desired status of stop or evict kills the runner,
    /// as [`AllocRunner::destroy`] does minus the clean-up. A new runner (its path or its
    /// `runner_sha256`), tasks or meta ask for an upgrade in place, which a runner that runs
    /// a component carries out on its own task (see [`AllocRunner::last_upgrade`]); the
    /// others hand the version on as any other.
    fn update(&self, alloc: Arc<Alloc>);

    /// The agent is stopping: ask the runner to save a checkpoint and stop without a terminal
    /// state. [`AllocRunner::shutdown_done`] completes when it has stopped.
    fn shutdown(&self);

    /// Asks the runner to deliver `signal` to task `task`, or to every task of the alloc when
    /// `None`. Returns at once: `Ok` means the request is queued for the runner, in order with
    /// its other events, not that a task has acted on it (what a signal means is up to the
    /// runner; the host kills nothing itself, even for `SIGKILL`).
    ///
    /// Refused, changing nothing, with (checked in this order)
    /// [`TaskActionError::UnknownSignal`] when `signal` is not one of [`SIGNAL_NAMES`] (any
    /// case is accepted and passed on in upper case), [`TaskActionError::UnknownTask`] when
    /// the alloc has no task `task`, and [`TaskActionError::NotRunning`] before
    /// [`AllocRunner::run`], once a kill or a shutdown was asked for, and after the runner
    /// stopped. A request accepted just before the runner finishes by itself may go unseen.
    fn signal(&self, task: Option<&str>, signal: &str) -> Result<(), TaskActionError>;

    /// Asks the runner to restart task `task`, or every task of the alloc (one restart each,
    /// in job order) when `None`; the runner counts each in its task state's `restarts`.
    /// Returns at once; refused as [`AllocRunner::signal`] is, minus the signal check.
    fn restart_task(&self, task: Option<&str>) -> Result<(), TaskActionError>;

    /// Kill the alloc (waiting at most its kill timeout), then free everything it holds,
    /// its alloc directory included. Idempotent. [`AllocRunner::destroyed`] completes after.
    fn destroy(&self);

    /// The alloc's current state: the runner's last report, or the final state once stopped.
    fn alloc_state(&self) -> AllocState;

    /// The client status of [`AllocRunner::alloc_state`], without copying the tasks and their
    /// events: what counting allocs by status needs. Runners that can read it cheaply should.
    fn client_status(&self) -> ClientStatus {
        self.alloc_state().client_status
    }

    /// True once [`AllocRunner::destroy`] has finished.
    fn is_destroyed(&self) -> bool;

    /// Completes when the runner has stopped running, for whatever reason.
    fn wait(&self) -> Latch;

    /// Completes when the runner has stopped after [`AllocRunner::shutdown`] (or earlier).
    fn shutdown_done(&self) -> Latch;

    /// Completes when [`AllocRunner::destroy`] has freed everything.
    fn destroyed(&self) -> Latch;

    /// What the runner has used since this agent started it, for operators; `None` from a
    /// runner that does not measure (the native ones). Cheap, and callable at any time.
    fn usage(&self) -> Option<AllocUsage> {
        None
    }

    /// The SHA-256 (hex) of the component this runner runs, telling builds of one runner
    /// apart; `None` from a runner that runs no component (the native ones). Changes only
    /// when an upgrade in place starts the new build (or rolls back from it).
    fn runner_sha256(&self) -> Option<String> {
        None
    }

    /// How the last upgrade in place went, if one was asked of this runner since it was
    /// built; `None` from the native runners, which have no component to upgrade.
    fn last_upgrade(&self) -> Option<UpgradeReport> {
        None
    }
}

/// One upgrade in place of a runner's component, as [`AllocRunner::last_upgrade`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeReport {
    /// The build that ran before (SHA-256, hex).
    pub from_sha256: String,
    /// The build asked for: its SHA-256 once loaded, else the alloc's `runner_sha256`, else
    /// its path.
    pub to: String,
    /// Where it stands.
    pub outcome: UpgradeOutcome,
    /// When it was asked for (Unix ms).
    pub asked_unix_ms: u64,
}

/// Where an upgrade in place stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeOutcome {
    /// The old build was asked to shut down, or the new one has not reported yet.
    InProgress,
    /// The new build reported `running` (or `complete`): it runs the alloc now.
    Done,
    /// It did not happen, and the alloc runs the build it ran before: why (the new build
    /// could not be loaded, or failed before reporting `running` and was rolled back).
    Failed(String),
}

/// What one alloc's runner has used, as [`AllocRunner::usage`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocUsage {
    /// CPU time spent for it: the guest's computing and the host's work on its behalf, as
    /// its `cpu` limit counts them.
    pub cpu_used: std::time::Duration,
    /// The most memory its instance held at once, all its linear memories together.
    pub memory_peak_bytes: u64,
    /// The memory its instance holds now (0 between runs): linear memory never shrinks
    /// within a run, so this is the run's own peak.
    pub memory_bytes: u64,
}

/// Receives what a runner reports. Called from the runner's own task.
///
/// Implementations must return promptly and must not call back into the runner: a report
/// arrives while the runner holds no lock, but a slow receiver slows the guest.
pub trait StateUpdater: Send + Sync {
    /// The alloc's state changed. Reports arrive in order, each replacing the previous.
    fn alloc_state_updated(&self, alloc_id: &str, state: &AllocState);

    /// The runner saved a checkpoint, replacing the previous one. The guest's `checkpoint`
    /// call waits for the returned future: `Ok` once the checkpoint is kept (durably, for the
    /// client), `Err` with the reason when it could not be. The default keeps nothing.
    fn checkpoint_saved(&self, alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        let _ = (alloc_id, data);
        checkpoint_kept()
    }
}

/// The outcome of [`StateUpdater::checkpoint_saved`], awaited by the guest's `checkpoint`.
pub type CheckpointSaved = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>>;

/// A [`CheckpointSaved`] that is already `Ok`: for updaters that keep checkpoints in memory.
pub fn checkpoint_kept() -> CheckpointSaved {
    Box::pin(std::future::ready(Ok(())))
}

/// Everything a factory needs to build the runner of one alloc.
#[derive(Clone)]
pub struct AllocRunnerConfig {
    /// The alloc to run.
    pub alloc: Arc<Alloc>,
    /// The span every log line of this runner is emitted in: a child of the agent's span with
    /// `alloc_id`, `job`, `group` and `runner` fields. Build it with [`alloc_span`].
    pub span: tracing::Span,
    /// Where the runner's reports go.
    pub state_updater: Arc<dyn StateUpdater>,
    /// The limits the alloc runs under.
    pub limits: Limits,
    /// The alloc's own directory (created by the runner when missing, removed by destroy).
    pub alloc_dir: PathBuf,
    /// The runner's last checkpoint when the alloc is being restored.
    pub restored: Option<Vec<u8>>,
    /// The alloc comes back after the agent restarted (with or without a checkpoint or a
    /// saved state): what an earlier run left on disk, its directory, may still be there,
    /// and destroy must look for it.
    pub restoring: bool,
    /// The state saved before a restart, when the alloc is being restored. A terminal one
    /// means the alloc has finished: the runner must not run it again, only answer with this
    /// state and free what is left on destroy. A non-terminal one is the starting state.
    pub last_state: Option<AllocState>,
    /// Where the runner's guest output is also written, if anywhere: the alloc's log file,
    /// kept outside `alloc_dir` so the guest cannot touch it. Destroy removes it through
    /// [`AllocLogWriter::remove`].
    pub log_writer: Option<AllocLogWriter>,
}

/// Builds the runner of one alloc. An error fails that alloc only; its message becomes the
/// alloc's description, so it names what is wrong (a path, a missing export).
///
/// A client calls it on tokio's blocking pool, where it may block (to read and compile a
/// component), for its new allocs one after another; a panic costs that alloc only (a new
/// alloc fails; a restored one that had finished keeps its final state).
pub type AllocRunnerFactory =
    Arc<dyn Fn(AllocRunnerConfig) -> anyhow::Result<Arc<dyn AllocRunner>> + Send + Sync>;

/// The span for one alloc's runner, carrying the fields every one of its log lines needs.
/// The runner is named by its file name, not its path (the job has the path, and every line
/// would repeat it). Which build, `runner_sha256`, is the one the alloc names (the build its
/// job was submitted with) until its runner is loaded, and a factory that loads another
/// records that one instead (see [`record_loaded_build`]): the lines of an alloc whose runner
/// could not be loaded name the build that was asked for.
pub fn alloc_span(alloc: &Alloc) -> tracing::Span {
    let runner = runner_name(&alloc.runner);
    tracing::info_span!(
        "alloc",
        alloc_id = %alloc.id,
        job = %alloc.job_id,
        group = %alloc.group,
        runner = %runner,
        runner_sha256 = alloc
            .runner_sha256
            .as_deref()
            .map(|hash| tracing::field::display(short_hash(hash))),
    )
}

/// How logs name a runner: a path's file name (`web.wasm`), a registry reference's last
/// segment without its digest (`web:1.4`).
pub fn runner_name(runner: &str) -> std::borrow::Cow<'_, str> {
    if let Some(reference) = runner.strip_prefix("oci://") {
        let without_digest = reference.split('@').next().unwrap_or(reference);
        return without_digest
            .rsplit('/')
            .next()
            .unwrap_or(without_digest)
            .into();
    }
    std::path::Path::new(runner)
        .file_name()
        .map_or(runner.into(), |name| name.to_string_lossy())
}

/// How many hex digits of a runner's SHA-256 name its build in logs and statuses: enough to
/// tell builds apart, short enough to read.
pub const SHORT_HASH_DIGITS: usize = 12;

/// The first [`SHORT_HASH_DIGITS`] of a SHA-256 in hex: how logs and statuses name a build.
pub fn short_hash(sha256_hex: &str) -> &str {
    sha256_hex.get(..SHORT_HASH_DIGITS).unwrap_or(sha256_hex)
}

/// Records in the span [`alloc_span`] made for `alloc` the build of its runner that was
/// loaded, unless it is the one the alloc names, which the span carries from the start:
/// recording a field again costs a start as much as formatting the whole span.
pub fn record_loaded_build(span: &tracing::Span, alloc: &Alloc, sha256_hex: &str) {
    if alloc.runner_sha256.as_deref() != Some(sha256_hex) {
        record_runner_hash(span, sha256_hex);
    }
}

/// Records in an alloc's span which build of its runner runs (see [`short_hash`]).
pub fn record_runner_hash(span: &tracing::Span, sha256_hex: &str) {
    span.record(
        "runner_sha256",
        tracing::field::display(short_hash(sha256_hex)),
    );
}
