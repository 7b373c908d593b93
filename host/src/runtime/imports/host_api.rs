//! The `caravan:runner/host` import of one alloc: events in, state reports and checkpoints out.
//!
//! [`HostApi`] lives in the alloc's store; [`StateCell`] is shared with the runner that owns
//! the store, which reads the latest state and writes the final one. Guest mistakes (a report
//! after a terminal one, an unknown task, an oversized checkpoint) come back to the guest as
//! WIT errors and are logged; nothing here traps. It may touch only its alloc's own state:
//! never another alloc, the client or the state store (checkpoints go through the
//! runner's `StateUpdater`).

use crate::allocrunner::{Latch, StateUpdater};
use crate::model::structs::{Alloc, AllocState, ClientStatus, Limits, TaskLifecycle, TaskState};
use crate::runtime::imports::bindings::{self, Event, HostImports, WitAllocState, WitEvent};
use crate::runtime::imports::event_queue::EventReceiver;
use crate::runtime::sandbox::token_bucket::TokenBucket;
use crate::util::locks::LockUnpoisoned;
use crate::util::text::{cut, cut_in_place};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Events kept per task (the newest), as Nomad does.
pub const MAX_EVENTS_PER_TASK: usize = 10;
/// Longest task event kind kept, in bytes (kinds are words such as `Started`).
pub const MAX_EVENT_KIND_BYTES: usize = 64;
/// Most of a guest's task name quoted back in a refusal.
const MAX_QUOTED_NAME_BYTES: usize = 64;
/// What the smallest checkpoint counts for against the checkpoint rate: a commit costs the
/// store about this much, however few bytes it holds.
const MIN_CHECKPOINT_COST: u64 = 4096;
/// At most one refusal of each alloc is logged per interval (see `HostApi::refuse`).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The latest state of one alloc, shared by its host import and its runner.
pub struct StateCell {
    alloc_id: String,
    /// Longest description or event message kept (the alloc's `description_size`).
    description_bytes: usize,
    state: Mutex<CellState>,
    updater: Arc<dyn StateUpdater>,
}

struct CellState {
    current: AllocState,
    /// Set by [`StateCell::finish`]: the run is over and the guest's reports are refused, so a
    /// guest torn down mid-report cannot overwrite the final state.
    closed: bool,
    /// The tasks as they were when the host last restarted the runner: their restarts and
    /// events go on under what the new guest reports, which knows nothing of them.
    before_restart: Vec<TaskState>,
    /// Reports taken with status `running` or `complete`, all runs together: a run that adds
    /// none never got its alloc going (an upgrade's new build that fails so is rolled back).
    reports_running: u64,
    /// Set while an upgrade's new build has not reported `running` or `complete`: a
    /// `failed` report is refused then, so that the server never sees the alloc fail for a
    /// build that is about to be rolled back.
    on_probation: bool,
}

impl StateCell {
    /// A cell starting at `initial` (pending for a new alloc, the saved state for a restored
    /// one), cutting reported texts to `description_bytes`. A terminal `initial` closes the
    /// cell at once: the alloc has finished.
    pub fn new(
        alloc_id: String,
        description_bytes: usize,
        updater: Arc<dyn StateUpdater>,
        initial: AllocState,
    ) -> Self {
        let cell = CellState {
            closed: initial.client_status.is_terminal(),
            current: initial,
            before_restart: Vec::new(),
            reports_running: 0,
            on_probation: false,
        };
        StateCell {
            alloc_id,
            description_bytes,
            state: Mutex::new(cell),
            updater,
        }
    }

    pub fn get(&self) -> AllocState {
        self.lock().current.clone()
    }

    /// The current client status, read without a copy of the state.
    pub fn client_status(&self) -> ClientStatus {
        self.lock().current.client_status
    }

    /// Applies a guest's report: refuses what breaks the rules, tidies what is merely long,
    /// lists left-out tasks as pending, skips what changes nothing, and passes the rest to the
    /// updater. The updater is called under the cell's lock, so reports reach it in order.
    pub fn report(&self, alloc: &Alloc, mut new: AllocState) -> Result<(), String> {
        tidy(&mut new, self.description_bytes);
        check_tasks(alloc, &new)?;
        add_missing_tasks(alloc, &mut new);
        let mut cell = self.lock();
        if cell.closed {
            return Err("the run has ended; the host no longer takes reports".into());
        }
        if cell.current.client_status.is_terminal() {
            return Err(format!(
                "the alloc is already {}; a terminal status is final",
                cell.current.client_status
            ));
        }
        if cell.on_probation && new.client_status == ClientStatus::Failed {
            return Err("a new build must report running before it reports failed; \
                 an upgrade whose new build fails first is rolled back"
                .into());
        }
        if matches!(
            new.client_status,
            ClientStatus::Running | ClientStatus::Complete
        ) {
            cell.reports_running += 1;
            cell.on_probation = false;
        }
        carry_restarts(&mut new, &cell.before_restart);
        if cell.current != new {
            cell.current = new;
            self.updater
                .alloc_state_updated(&self.alloc_id, &cell.current);
        }
        Ok(())
    }

    /// Puts the next reports on probation (an upgrade's new build starts) or ends it.
    pub fn set_probation(&self, on: bool) {
        self.lock().on_probation = on;
    }

    /// How many reports the guests have made with status `running` or `complete`.
    pub fn reports_running(&self) -> u64 {
        self.lock().reports_running
    }

    /// Sets the state of a runner about to be started again in a fresh store, after a crash
    /// or for an upgrade (not terminal), which the next guest's reports then build on (their
    /// tasks' restarts and events carry on from it). A cell already closed by
    /// [`StateCell::finish`] stays as it is.
    pub fn restart(&self, mut restarting: AllocState) {
        tidy(&mut restarting, self.description_bytes);
        let mut cell = self.lock();
        if cell.closed {
            return;
        }
        cell.before_restart = restarting.task_states.clone();
        if cell.current != restarting {
            cell.current = restarting;
            self.updater
                .alloc_state_updated(&self.alloc_id, &cell.current);
        }
    }

    /// Sets the state the host decided on, closes the cell to the guest, and reports the
    /// state if it changed.
    pub fn finish(&self, final_state: AllocState) {
        let mut cell = self.lock();
        cell.closed = true;
        if cell.current != final_state {
            cell.current = final_state;
            self.updater
                .alloc_state_updated(&self.alloc_id, &cell.current);
        }
    }

    /// As [`StateCell::finish`] with the final state made from the current one, unless the
    /// current one is terminal already (then nothing changes). One lock for the look and the
    /// change: a final state the run recorded meanwhile is never overwritten.
    pub fn finish_unless_terminal(&self, final_state: impl FnOnce(&AllocState) -> AllocState) {
        let mut cell = self.lock();
        if cell.current.client_status.is_terminal() {
            return;
        }
        let final_state = final_state(&cell.current);
        cell.closed = true;
        if cell.current != final_state {
            cell.current = final_state;
            self.updater
                .alloc_state_updated(&self.alloc_id, &cell.current);
        }
    }

    /// Saves `data` as the alloc's checkpoint, through the updater (the client's store).
    pub fn checkpoint(&self, data: &[u8]) -> crate::allocrunner::CheckpointSaved {
        self.updater.checkpoint_saved(&self.alloc_id, data)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CellState> {
        self.state.lock_unpoisoned()
    }
}

/// Adds to each reported task the restarts counted and the events kept before the runner's
/// last restart, the newest events kept within the per-task limit.
fn carry_restarts(report: &mut AllocState, before_restart: &[TaskState]) {
    for task in &mut report.task_states {
        let Some(before) = before_restart.iter().find(|b| b.name == task.name) else {
            continue;
        };
        task.restarts = task.restarts.saturating_add(before.restarts);
        let mut events = before.events.clone();
        events.append(&mut task.events);
        let over = events.len().saturating_sub(MAX_EVENTS_PER_TASK);
        events.drain(..over);
        task.events = events;
    }
}

/// Cuts every string of a report to its limit (with a marker) and keeps the newest events:
/// the one place a guest's report is bounded before it is stored, logged or shown.
fn tidy(state: &mut AllocState, text_bytes: usize) {
    cut_in_place(&mut state.description, text_bytes);
    for task in &mut state.task_states {
        if task.events.len() > MAX_EVENTS_PER_TASK {
            task.events.drain(..task.events.len() - MAX_EVENTS_PER_TASK);
        }
        for event in &mut task.events {
            cut_in_place(&mut event.message, text_bytes);
            cut_in_place(&mut event.kind, MAX_EVENT_KIND_BYTES);
            // A guest's clock is its own: a time past what calendars show is brought back.
            event.time_unix_ms = event.time_unix_ms.min(LATEST_EVENT_TIME_UNIX_MS);
        }
    }
}

/// The last millisecond of the year 9999: the latest time an RFC 3339 date can name.
const LATEST_EVENT_TIME_UNIX_MS: u64 = 253_402_300_799_999;

fn add_missing_tasks(alloc: &Alloc, state: &mut AllocState) {
    for task in &alloc.tasks {
        if !state.task_states.iter().any(|t| t.name == task.name) {
            state.task_states.push(TaskState {
                name: task.name.clone(),
                state: TaskLifecycle::Pending,
                failed: false,
                restarts: 0,
                events: Vec::new(),
            });
        }
    }
}

fn check_tasks(alloc: &Alloc, state: &AllocState) -> Result<(), String> {
    let mut seen = HashSet::new();
    for task in &state.task_states {
        if !alloc.tasks.iter().any(|t| t.name == task.name) {
            return Err(format!(
                "task-state names {:?}, which is not a task of this alloc",
                cut(&task.name, MAX_QUOTED_NAME_BYTES)
            ));
        }
        if !seen.insert(task.name.as_str()) {
            return Err(format!(
                "task-state for {:?} appears more than once",
                cut(&task.name, MAX_QUOTED_NAME_BYTES)
            ));
        }
    }
    Ok(())
}

/// What, besides its event queue, tells a run to end: each `next-event` looks at them.
pub struct EndingLatches {
    /// Set when an upgrade in place asks this run to end: delivered as `shutdown`. Each run
    /// has its own, so an upgrade asked of one run never reaches the next.
    pub upgrade_asked: Latch,
    /// Set (for every run of the alloc) once `kill` was sent: a run that was given
    /// `shutdown` is handed `kill` from then on, without the queue being searched for it.
    pub kill_sent: Latch,
}

/// The host import of one alloc's store.
pub struct HostApi {
    alloc: Arc<Alloc>,
    events: EventReceiver,
    /// Signals and task restarts queued and not yet taken: the runner counts them up to its
    /// bound, this counts them down as the guest takes them.
    queued_task_actions: Arc<AtomicUsize>,
    /// `kill` or `shutdown`, once delivered: repeated to every later `next-event`.
    final_event: Option<Event>,
    /// What asks this run to end besides its queue: see [`EndingLatches`].
    ending: EndingLatches,
    state: Arc<StateCell>,
    span: tracing::Span,
    last_refusal_logged: Option<tokio::time::Instant>,
    /// Refusals since the last one logged.
    unlogged_refusals: u64,
    /// Largest checkpoint accepted (the alloc's `checkpoint_size`).
    checkpoint_bytes: u64,
    /// Checkpoint bytes per second (the alloc's `checkpoint_rate`): every checkpoint is a
    /// commit to the node's state store, and a runner saving in a loop must not take the
    /// store's disk and CPU from its neighbours.
    checkpoint_rate: u64,
    /// Checkpoint bytes this alloc may still save now: refilled at the checkpoint rate, with
    /// a burst of two of its largest checkpoints.
    checkpoint_allowance: TokenBucket,
}

impl HostApi {
    pub fn new(
        alloc: Arc<Alloc>,
        events: EventReceiver,
        queued_task_actions: Arc<AtomicUsize>,
        state: Arc<StateCell>,
        span: tracing::Span,
        limits: &Limits,
        ending: EndingLatches,
    ) -> Self {
        HostApi {
            alloc,
            events,
            queued_task_actions,
            final_event: None,
            ending,
            state,
            span,
            last_refusal_logged: None,
            unlogged_refusals: 0,
            checkpoint_bytes: limits.checkpoint_bytes,
            checkpoint_rate: limits.checkpoint_bytes_per_second,
            checkpoint_allowance: TokenBucket::new(
                limits.checkpoint_bytes_per_second as f64,
                2.0 * limits.checkpoint_bytes as f64,
            ),
        }
    }

    /// The event queue, back from a guest whose run ended, for the next one: signals and
    /// restarts it had not taken yet wait there.
    pub fn into_events(self) -> EventReceiver {
        self.events
    }

    /// Logs a refusal: the first at once, then at most one a second with the count of those
    /// not logged, so a guest repeating a refused call in a loop cannot flood the agent's log.
    fn refuse(&mut self, what: &str, reason: &str) {
        let now = tokio::time::Instant::now();
        if self
            .last_refusal_logged
            .is_some_and(|at| now.duration_since(at) < REFUSAL_LOG_INTERVAL)
        {
            self.unlogged_refusals += 1;
            return;
        }
        self.last_refusal_logged = Some(now);
        match std::mem::take(&mut self.unlogged_refusals) {
            0 => tracing::warn!(parent: &self.span, reason, "runner's {what} was refused"),
            unlogged => tracing::warn!(
                parent: &self.span,
                reason,
                unlogged_refusals = unlogged,
                "runner's {what} was refused"
            ),
        }
    }
}

impl HostImports for HostApi {
    async fn next_event(&mut self, timeout_ms: u64) -> Option<WitEvent> {
        if self.final_event.is_none() && self.ending.upgrade_asked.is_set() {
            self.final_event = Some(Event::Shutdown);
        }
        if let Some(event) = &self.final_event {
            // A kill sent after a shutdown outranks it. The queue is left as it is: what waits
            // there is the next run's (after an upgrade) or nobody's.
            if self.ending.kill_sent.is_set() || matches!(event, Event::Kill) {
                self.final_event = Some(Event::Kill);
                return Some(bindings::event_to_wit(&Event::Kill));
            }
            return Some(bindings::event_to_wit(event));
        }
        let within = (timeout_ms != u64::MAX).then(|| Duration::from_millis(timeout_ms));
        let received = tokio::select! {
            // Events queued before the upgrade was asked are handed over first.
            biased;
            received = self.events.recv_within(within) => received.ok(),
            () = self.ending.upgrade_asked.wait() => Some(Some(Event::Shutdown)),
        };
        let Some(received) = received else {
            return None; // the timeout passed
        };
        // The sender lives as long as the runner; if it is gone, nobody wants this alloc.
        let event = received.unwrap_or(Event::Kill);
        match &event {
            Event::Update(alloc) => self.alloc = alloc.clone(),
            Event::Signal { .. } | Event::RestartTask(_) => {
                self.queued_task_actions.fetch_sub(1, Ordering::SeqCst);
            }
            event if event.is_final() => self.final_event = Some(event.clone()),
            _ => {}
        }
        Some(bindings::event_to_wit(&event))
    }

    fn update_state(&mut self, state: WitAllocState) -> Result<(), String> {
        let result = self
            .state
            .report(&self.alloc, bindings::state_from_wit(state));
        if let Err(reason) = &result {
            self.refuse("state report", reason);
        }
        result
    }

    async fn checkpoint(&mut self, data: Vec<u8>) -> Result<(), String> {
        if data.len() as u64 > self.checkpoint_bytes {
            let reason = format!(
                "checkpoint of {} bytes is over the limit of {} bytes (checkpoint_size)",
                data.len(),
                self.checkpoint_bytes
            );
            self.refuse("checkpoint", &reason);
            return Err(reason);
        }
        let cost = (data.len() as u64).max(MIN_CHECKPOINT_COST);
        if !self
            .checkpoint_allowance
            .take(tokio::time::Instant::now(), cost as f64)
        {
            let reason = format!(
                "checkpoint refused: more than {} of checkpoints per second (checkpoint_rate); \
                 the previous checkpoint is kept",
                crate::util::units::format_bytes(self.checkpoint_rate)
            );
            self.refuse("checkpoint", &reason);
            return Err(reason);
        }
        let saved = self.state.checkpoint(&data).await;
        if let Err(reason) = &saved {
            self.refuse("checkpoint", reason);
        }
        saved
    }
}

/// The `types` interface has no functions: the host implements it by naming it.
impl bindings::TypesHost for HostApi {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::structs::{ClientStatus, Task, TaskLifecycle, TaskState};

    #[derive(Default)]
    struct Recorder(Mutex<Vec<AllocState>>);

    impl StateUpdater for Recorder {
        fn alloc_state_updated(&self, _alloc_id: &str, state: &AllocState) {
            self.0.lock().unwrap().push(state.clone());
        }
    }

    fn alloc() -> Alloc {
        Alloc::new("a1", "job", "runner.wasm", vec![Task::named("web")])
    }

    fn state(status: ClientStatus, tasks: &[&str]) -> AllocState {
        AllocState {
            client_status: status,
            description: String::new(),
            task_states: tasks
                .iter()
                .map(|name| TaskState {
                    name: name.to_string(),
                    state: TaskLifecycle::Running,
                    failed: false,
                    restarts: 0,
                    events: vec![],
                })
                .collect(),
        }
    }

    #[test]
    fn reports_are_checked_deduplicated_and_final_once_terminal() {
        let recorder = Arc::new(Recorder::default());
        let cell = StateCell::new("a1".into(), 1024, recorder.clone(), AllocState::pending());
        let alloc = alloc();
        cell.report(&alloc, state(ClientStatus::Running, &["web"]))
            .unwrap();
        cell.report(&alloc, state(ClientStatus::Running, &["web"]))
            .unwrap();
        assert_eq!(
            recorder.0.lock().unwrap().len(),
            1,
            "an identical report is skipped"
        );

        let unknown = cell
            .report(&alloc, state(ClientStatus::Running, &["db"]))
            .unwrap_err();
        assert!(unknown.contains("\"db\""), "{unknown}");
        let twice = cell
            .report(&alloc, state(ClientStatus::Running, &["web", "web"]))
            .unwrap_err();
        assert!(twice.contains("more than once"), "{twice}");

        cell.report(&alloc, state(ClientStatus::Complete, &["web"]))
            .unwrap();
        let after = cell
            .report(&alloc, state(ClientStatus::Running, &["web"]))
            .unwrap_err();
        assert!(after.contains("already complete"), "{after}");
        assert_eq!(cell.get().client_status, ClientStatus::Complete);
    }

    #[test]
    fn long_text_is_cut_and_old_events_dropped() {
        let mut long = state(ClientStatus::Running, &["web"]);
        long.description = "x".repeat(5000);
        long.task_states[0].events = (0..15)
            .map(|i| crate::model::structs::TaskEvent {
                kind: "Tick".into(),
                message: i.to_string(),
                time_unix_ms: 0,
            })
            .collect();
        long.task_states[0].events[14].kind = "K".repeat(100);
        tidy(&mut long, 1000);
        assert_eq!(
            long.description,
            format!("{} [truncated 4000 bytes]", "x".repeat(1000))
        );
        assert_eq!(
            long.task_states[0].events[9].kind,
            format!("{} [truncated 36 bytes]", "K".repeat(MAX_EVENT_KIND_BYTES))
        );
        assert_eq!(long.task_states[0].events.len(), MAX_EVENTS_PER_TASK);
        assert_eq!(
            long.task_states[0].events[0].message, "5",
            "the newest events are kept"
        );
    }
}
