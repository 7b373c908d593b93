//! [`WasmAllocRunner`]: the [`AllocRunner`] whose logic is a WebAssembly component.
//!
//! One store per run (`store`, `guest_run`), built when the runner starts and dropped when
//! `run` returns, traps, hits a limit, or outlives its kill timeout. An alloc may get more
//! than one run: after a crash its restart policy allows, its runner starts again in a fresh
//! store (see `restarts`), and a new build of its runner takes over in place (see `upgrade`).
//! The final state is decided in one place, [`final_state`], from the guest's last report and
//! how the last run ended.

use crate::alloc_logs::AllocLogWriter;
use crate::allocrunner::{
    AllocRunner, AllocRunnerConfig, AllocUsage, Latch, LatchTrigger, NotRunningReason,
    TaskActionError, UpgradeReport, signal_name, target_tasks,
};
use crate::model::admission::Admission;
use crate::model::structs::{Alloc, AllocState, ClientStatus, Limits};
use crate::runner_store::RunnerStore;
use crate::runtime::imports::bindings::Event;
use crate::runtime::imports::event_queue::{EventReceiver, EventSender, event_queue};
use crate::runtime::imports::host_api::StateCell;
use crate::runtime::runner::lifecycle::{Lifecycle, Phase, StopStep};
use crate::runtime::runner::outcome::{
    RunOutcome, add_unreported_tasks, end_unfinished_tasks, final_state,
};
use crate::runtime::sandbox::alloc_dir::remove_alloc_files;
use crate::runtime::sandbox::store_limits::UsageGauges;
use crate::runtime::{LoadedComponent, Runtime};
use crate::util::locks::LockUnpoisoned;
use crate::util::units::format_duration;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tracing::Instrument;

mod factory;
mod guest_run;
mod restarts;
mod store;
mod upgrade;
pub use factory::WasmAllocRunnerFactory;
use restarts::Restarts;
use upgrade::Upgrades;

/// A checkpoint's bytes, shared: what the run loop (`restarts`) starts each run from and an
/// upgrade (`upgrade`) hands from the old build to the new one.
type Checkpoint = Arc<[u8]>;

/// How many signals and task restarts may wait for one guest to take them: enough for any
/// operator, few enough that a guest which never calls `next-event` holds little host memory
/// however often the API is called.
pub const MAX_QUEUED_TASK_ACTIONS: usize = 64;

/// Runs one alloc in its own store.
pub struct WasmAllocRunner {
    shared: Arc<Shared>,
}

struct Shared {
    runtime: Runtime,
    /// Where the builds an upgrade names are loaded from (see [`Runtime::load_for_alloc`]).
    store: Option<RunnerStore>,
    /// The build that runs the alloc, one waiting to take over, the last upgrade.
    upgrades: Upgrades,
    admission: Admission,
    config: RunnerConfig,
    /// The alloc's limits; its stores share them.
    limits: Arc<Limits>,
    alloc: Mutex<Arc<Alloc>>,
    state: Arc<StateCell>,
    events: EventSender,
    receiver: Mutex<Option<EventReceiver>>,
    lifecycle: Mutex<Lifecycle>,
    /// Signals and task restarts sent and not yet taken by the guest (it decrements).
    queued_task_actions: Arc<AtomicUsize>,
    /// What the store's meters have counted, for [`AllocRunner::usage`].
    usage: Arc<UsageGauges>,
    run_task: Mutex<Option<tokio::task::AbortHandle>>,
    /// The restart policy's tracker and the last checkpoint, for in-place restarts.
    restarts: Restarts,
    /// Set when a kill or a shutdown is asked of a started runner: a restart waiting for its
    /// delay gives up.
    stop_asked: LatchTrigger,
    /// Set when `kill` is sent to the guest (see `EndingLatches`).
    kill_sent: LatchTrigger,
    /// How the last run ended, once it has.
    ending: Mutex<Option<RunEnding>>,
    /// Set while a crashed runner waits to be restarted: signals and task restarts are
    /// refused then, as for a runner that is not running.
    restarting: std::sync::atomic::AtomicBool,
    /// When the alloc's `wall_time` runs out: set by its first run, kept by the restarts.
    wall_deadline: Mutex<Option<tokio::time::Instant>>,
    stopped: LatchTrigger,
    destroyed: LatchTrigger,
    /// Whether the alloc's directory may exist: a restored alloc's may (an earlier run of the
    /// agent made it), and so may that of a runner any of whose stores could reach files.
    /// When it cannot, and the alloc has no log file either, destroy needs no disk at all.
    alloc_dir_may_exist: std::sync::atomic::AtomicBool,
}

/// What a runner keeps of its [`AllocRunnerConfig`] for its whole life; the rest (the node's
/// limits, the restored checkpoint, the last state) is used once, when it is built, and not
/// held by every live alloc.
struct RunnerConfig {
    span: tracing::Span,
    alloc_dir: std::path::PathBuf,
    log_writer: Option<AllocLogWriter>,
}

impl WasmAllocRunner {
    /// A runner for `config.alloc` on `component`, started only if it meets `admission`;
    /// nothing runs until [`AllocRunner::run`]. A restored terminal alloc (see
    /// [`AllocRunnerConfig::last_state`]) starts stopped and never runs.
    pub(crate) fn new(
        runtime: Runtime,
        component: Arc<LoadedComponent>,
        mut config: AllocRunnerConfig,
        admission: Admission,
        store: Option<RunnerStore>,
    ) -> Self {
        let (events, receiver) = event_queue();
        let initial = config
            .last_state
            .clone()
            .unwrap_or_else(AllocState::pending);
        let finished = initial.client_status.is_terminal();
        let limits = Arc::new(config.limits.with_overrides(&config.alloc.limits));
        // Held once, by the restarts: each run starts from a copy of the last checkpoint.
        let restarts = Restarts::new(config.alloc.restart.clone(), config.restored.take());
        let state = Arc::new(StateCell::new(
            config.alloc.id.clone(),
            crate::model::limits::as_len(limits.description_bytes),
            restarts.keeping_checkpoints(config.state_updater.clone()),
            initial,
        ));
        let stopped = Latch::new().0;
        if finished {
            stopped.set();
        }
        WasmAllocRunner {
            shared: Arc::new(Shared {
                runtime,
                store,
                upgrades: Upgrades::new(component, config.alloc.clone()),
                admission,
                alloc: Mutex::new(config.alloc.clone()),
                limits,
                config: RunnerConfig {
                    span: config.span,
                    alloc_dir: config.alloc_dir,
                    log_writer: config.log_writer,
                },
                state,
                events,
                receiver: Mutex::new(Some(receiver)),
                lifecycle: Mutex::new(Lifecycle::new(finished)),
                queued_task_actions: Arc::new(AtomicUsize::new(0)),
                usage: Arc::default(),
                run_task: Mutex::new(None),
                restarts,
                stop_asked: Latch::new().0,
                kill_sent: Latch::new().0,
                ending: Mutex::new(None),
                restarting: std::sync::atomic::AtomicBool::new(false),
                wall_deadline: Mutex::new(None),
                stopped,
                destroyed: Latch::new().0,
                alloc_dir_may_exist: std::sync::atomic::AtomicBool::new(config.restoring),
            }),
        }
    }

    /// Sends `kill` and starts the kill timeout; does not free anything.
    pub fn kill(&self) {
        self.shared.kill();
    }

    /// How its last run ended; `None` while it runs (or before it started).
    pub fn ending(&self) -> Option<RunEnding> {
        *self.shared.ending.lock_unpoisoned()
    }
}

/// How a runner's run ended, for tools that judge runners (`caravan runner check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEnding {
    /// It trapped or hit a limit, rather than returning from `run`.
    pub crashed: bool,
    /// It did not return within the kill timeout, and its store was torn down.
    pub torn_down: bool,
    /// A kill had been asked of it before it ended.
    pub after_kill: bool,
    /// Its own report had made the alloc terminal before it ended (rather than the host
    /// deciding the final state from how it ended).
    pub reported_its_end: bool,
}

impl Shared {
    fn alloc(&self) -> Arc<Alloc> {
        self.alloc.lock_unpoisoned().clone()
    }

    fn lifecycle(&self) -> std::sync::MutexGuard<'_, Lifecycle> {
        self.lifecycle.lock_unpoisoned()
    }

    /// When the alloc's wall time `limit` runs out, counted from its first run.
    fn wall_deadline(&self, limit: std::time::Duration) -> tokio::time::Instant {
        *self
            .wall_deadline
            .lock_unpoisoned()
            .get_or_insert_with(|| tokio::time::Instant::now() + limit)
    }

    fn kill(self: &Arc<Self>) {
        let step = {
            let mut lifecycle = self.lifecycle();
            let step = lifecycle.ask_kill();
            if step == StopStep::AskGuest {
                // Sent under the lifecycle lock, so no signal or restart passes it.
                self.events.send(Event::Kill);
                self.kill_sent.set();
                self.stop_asked.set();
            }
            step
        };
        match step {
            StopStep::AlreadyAsked => {}
            StopStep::NeverStarted => self.record_final(RunOutcome::NeverStarted),
            StopStep::AlreadyFinished => {
                // Stopped already (after a shutdown, say) but not terminal: a kill makes it so.
                // (Most are terminal, and are not copied: the GC's destroy kills every
                // finished alloc.)
                let alloc = self.alloc();
                self.state.finish_unless_terminal(|last| {
                    let description = "alloc was stopped";
                    let mut task_states = last.task_states.clone();
                    add_unreported_tasks(&mut task_states, &alloc.tasks);
                    end_unfinished_tasks(
                        &mut task_states,
                        false,
                        description,
                        crate::util::timestamp::unix_ms_now(),
                    );
                    AllocState {
                        client_status: ClientStatus::Complete,
                        description: description.into(),
                        task_states,
                    }
                });
            }
            StopStep::AskGuest => {
                tracing::info!(parent: &self.config.span, kill_timeout = %format_duration(self.limits.kill_timeout), "killing alloc");
                self.abort_after_grace(RunOutcome::KillTimedOut);
            }
        }
    }

    /// Queues `events` (signals, task restarts) for the guest while it may still receive
    /// them: started, and neither finished nor asked to stop (after that it is only ever
    /// given `kill` or `shutdown`). The check and the sending happen under the lifecycle lock,
    /// as `kill` and `shutdown` send theirs, so none of these ever follows a stop.
    fn send_task_actions(&self, events: Vec<Event>) -> Result<(), TaskActionError> {
        let alloc_id = self.alloc().id.clone();
        let known_reason = {
            let lifecycle = self.lifecycle();
            match (lifecycle.phase(), lifecycle.stop_asked()) {
                (Phase::Running, false) if self.restarting.load(Ordering::SeqCst) => {
                    Some(NotRunningReason::Restarting)
                }
                (Phase::Running, false) => {
                    let queued = self.queued_task_actions.load(Ordering::SeqCst);
                    if queued + events.len() > MAX_QUEUED_TASK_ACTIONS {
                        return Err(TaskActionError::Busy { alloc_id, queued });
                    }
                    self.queued_task_actions
                        .fetch_add(events.len(), Ordering::SeqCst);
                    for event in events {
                        self.events.send(event);
                    }
                    return Ok(());
                }
                (Phase::Finished, _) => None,
                (_, true) => Some(NotRunningReason::Stopping),
                (Phase::NotStarted, false) => Some(NotRunningReason::NotStarted),
            }
        };
        let reason = known_reason.unwrap_or_else(|| match self.state.get().client_status {
            status if status.is_terminal() => NotRunningReason::Finished(status),
            _ => NotRunningReason::Stopping,
        });
        Err(TaskActionError::NotRunning { alloc_id, reason })
    }

    fn shutdown(self: &Arc<Self>) {
        let step = {
            let mut lifecycle = self.lifecycle();
            let step = lifecycle.ask_shutdown();
            if step == StopStep::AskGuest {
                self.events.send(Event::Shutdown);
                self.stop_asked.set();
            }
            step
        };
        match step {
            StopStep::AlreadyAsked | StopStep::AlreadyFinished => {}
            StopStep::NeverStarted => self.record_final(RunOutcome::NeverStarted),
            StopStep::AskGuest => self.abort_after_grace(RunOutcome::ShutdownTimedOut),
        }
    }

    /// Gives the guest the kill timeout to return, then drops its store.
    fn abort_after_grace(self: &Arc<Self>, outcome: RunOutcome) {
        let shared = self.clone();
        tokio::spawn(async move {
            let stopped = shared.stopped.latch();
            if tokio::time::timeout(shared.limits.kill_timeout, stopped.wait())
                .await
                .is_err()
            {
                if let Some(task) = shared.run_task.lock_unpoisoned().take() {
                    task.abort();
                }
                shared.finish(outcome);
            }
        });
    }

    /// The guest's run ended: records its outcome, once whoever gets here first (the run
    /// task, or the kill timeout).
    fn finish(&self, outcome: RunOutcome) {
        let first = self.lifecycle().finish();
        if first {
            self.record_final(outcome);
        }
    }

    /// Sets the final state, then completes `wait`. Called once, by the caller whose
    /// lifecycle transition reached `Finished`.
    fn record_final(&self, outcome: RunOutcome) {
        self.upgrades.abandon(self.state.reports_running());
        let (kill_asked, shut_down_only) = {
            let lifecycle = self.lifecycle();
            (lifecycle.kill_asked(), lifecycle.shut_down_only())
        };
        // A kill sent while a shutdown was pending outranks it.
        let outcome = match outcome {
            RunOutcome::ShutdownTimedOut if kill_asked => RunOutcome::KillTimedOut,
            outcome => outcome,
        };
        let span = &self.config.span;
        let last = self.state.get();
        *self.ending.lock_unpoisoned() = Some(RunEnding {
            crashed: matches!(outcome, RunOutcome::Failed(_)),
            torn_down: matches!(
                outcome,
                RunOutcome::KillTimedOut | RunOutcome::ShutdownTimedOut
            ),
            after_kill: kill_asked,
            reported_its_end: last.client_status.is_terminal(),
        });
        match &outcome {
            RunOutcome::Failed(description) => {
                tracing::warn!(parent: span, reason = %description, "runner failed")
            }
            RunOutcome::KillTimedOut | RunOutcome::ShutdownTimedOut => tracing::warn!(
                parent: span,
                kill_timeout = %format_duration(self.limits.kill_timeout),
                "runner did not return within the kill timeout; its sandbox was torn down"
            ),
            _ => {}
        }
        let alloc = self.alloc();
        let final_state = final_state(
            last,
            outcome,
            shut_down_only,
            (&self.limits, &alloc.tasks),
            crate::util::timestamp::unix_ms_now(),
        );
        tracing::info!(
            parent: span,
            client_status = %final_state.client_status,
            description = %final_state.description,
            "runner stopped"
        );
        self.state.finish(final_state);
        self.stopped.set();
    }
}

impl AllocRunner for WasmAllocRunner {
    fn alloc(&self) -> Arc<Alloc> {
        self.shared.alloc()
    }

    fn usage(&self) -> Option<AllocUsage> {
        Some(self.shared.usage.snapshot())
    }

    fn runner_sha256(&self) -> Option<String> {
        Some(self.shared.upgrades.current().component.hash.clone())
    }

    fn last_upgrade(&self) -> Option<UpgradeReport> {
        let reports = self.shared.state.reports_running();
        self.shared.upgrades.last(reports)
    }

    fn run(&self) {
        let shared = &self.shared;
        if shared.alloc().desired_status.is_stop() {
            // Stopped by the server before it ever ran here (a restored alloc, say).
            shared.kill();
            return;
        }
        let first = shared.lifecycle().start();
        if !first {
            return;
        }
        let Some(events) = shared.receiver.lock_unpoisoned().take() else {
            return;
        };
        let runner = shared.clone();
        let span = shared.config.span.clone();
        let task = tokio::spawn(
            async move {
                let outcome = runner.clone().run_until_done(events).await;
                runner.finish(outcome);
            }
            .instrument(span),
        );
        *shared.run_task.lock_unpoisoned() = Some(task.abort_handle());
    }

    fn update(&self, alloc: Arc<Alloc>) {
        let (stop, new_run) = {
            let mut current = self.shared.alloc.lock_unpoisoned();
            if alloc.modify_index <= current.modify_index {
                return;
            }
            let target = self.shared.upgrades.target_component();
            let new_run = upgrade::asks_for_new_run(&current, &alloc, &target);
            *current = alloc.clone();
            (alloc.desired_status.is_stop(), new_run)
        };
        if new_run && !stop {
            // The new build (or config) starts in a new run, given this version.
            self.shared.clone().upgrade_to(alloc);
            return;
        }
        self.shared.upgrades.track(alloc.clone());
        self.shared.events.send(Event::Update(alloc));
        if stop {
            self.shared.kill();
        }
    }

    fn shutdown(&self) {
        self.shared.shutdown();
    }

    fn signal(&self, task: Option<&str>, signal: &str) -> Result<(), TaskActionError> {
        let signal = signal_name(signal)?.to_string();
        target_tasks(&self.shared.alloc(), task)?;
        let task = task.map(str::to_string);
        self.shared
            .send_task_actions(vec![Event::Signal { task, signal }])
    }

    fn restart_task(&self, task: Option<&str>) -> Result<(), TaskActionError> {
        let tasks = target_tasks(&self.shared.alloc(), task)?;
        self.shared
            .send_task_actions(tasks.into_iter().map(Event::RestartTask).collect())
    }

    fn destroy(&self) {
        let shared = self.shared.clone();
        let first = shared.lifecycle().ask_destroy();
        if !first {
            return;
        }
        shared.kill();
        tokio::spawn(async move {
            shared.stopped.latch().wait().await;
            // Most short allocs have nothing on disk: no trip to the blocking pool for them.
            let log_left = match shared.config.log_writer.clone() {
                Some(log) if log.remove_if_nothing_on_disk() => None,
                log => log,
            };
            if log_left.is_some() || shared.alloc_dir_may_exist.load(Ordering::SeqCst) {
                remove_alloc_files(&shared.config.alloc_dir, log_left, &shared.config.span).await;
            }
            shared.destroyed.set();
        });
    }

    fn alloc_state(&self) -> AllocState {
        self.shared.state.get()
    }

    fn client_status(&self) -> ClientStatus {
        self.shared.state.client_status()
    }

    fn is_destroyed(&self) -> bool {
        self.shared.destroyed.is_set()
    }

    fn wait(&self) -> Latch {
        self.shared.stopped.latch()
    }

    fn shutdown_done(&self) -> Latch {
        self.shared.stopped.latch()
    }

    fn destroyed(&self) -> Latch {
        self.shared.destroyed.latch()
    }
}
