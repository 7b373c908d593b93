//! [`Runner`]: the event loop every runner needs, with hooks for what differs.

use crate::{Alloc, ClientStatus, Event, RunnerError, SignalRequest, State, host};
use std::time::Duration;

/// A runner written as event handlers. Export it with [`crate::export_runner!`].
///
/// The loop ([`run`]) calls [`Runner::start`], reports the state, then waits for events and
/// calls the matching `on_*` method, reporting the state after each. It returns from `run`
/// when the state becomes terminal, after `kill` (default: [`State::kill_all`]), or after
/// `shutdown` (having saved [`Runner::checkpoint`]). A handler's `Err` ends the alloc as
/// `failed` with the error as description.
///
/// Everything runs on the one thread of your component; handlers should return promptly and
/// use [`Runner::next_wakeup`] instead of sleeping, so that `kill` is answered in time.
///
/// # The loop's rules
///
/// 1. [`Runner::start`]; an `Err` ends the alloc `failed` with it. If the status is still
///    `pending` afterwards, it becomes `running` ("Runner started"). The state is reported.
/// 2. While the state is not terminal, it waits for an event for at most
///    [`Runner::next_wakeup`] (for ever on `None`), then:
///    - no event in time: [`Runner::on_wakeup`];
///    - `update`: [`Runner::on_update`] with the new alloc (a `kill` follows when it is to
///      stop);
///    - `signal`: [`Runner::on_signal`] (default: a `Signaling` event);
///    - `restart-task`: [`Runner::on_restart_task`] (default: a restart counted);
///    - `kill`: [`Runner::on_kill`] (default: every task killed, the alloc `complete`);
///    - `shutdown`: [`Runner::checkpoint`] is saved when it returns bytes, and `run` returns
///      at once, leaving the state as it is: the alloc resumes after the agent's restart.
///
///    After each handler the state is reported (only when it changed).
/// 3. It returns when the state is terminal: after `kill`, or when your tasks all ended, or
///    when you set a terminal status. A handler's `Err` ends the alloc `failed` with it.
///
/// A batch runner does its work in handlers (or in `start`) and ends its tasks with
/// [`State::task_finished`]; the loop then returns and the alloc is `complete` (or `failed`).
/// A service runner keeps its tasks running until `kill`.
///
/// ```no_run
/// use caravan_guest::{Alloc, Runner, RunnerError, State, TaskConfig};
/// use std::time::{Duration, Instant};
///
/// /// Ends its one task after `run_for`: a batch runner.
/// struct Timer { ends_at: Instant }
///
/// impl Runner for Timer {
///     fn start(alloc: &Alloc, _restored: Option<Vec<u8>>, state: &mut State)
///         -> Result<Self, RunnerError>
///     {
///         let task = alloc.tasks.first().ok_or(RunnerError::InvalidConfig("no task".into()))?;
///         let run_for = TaskConfig::of(task).duration("run_for")?.unwrap_or(Duration::from_secs(1));
///         state.task_started(&task.name);
///         Ok(Timer { ends_at: Instant::now() + run_for })
///     }
///
///     fn next_wakeup(&self) -> Option<Duration> {
///         caravan_guest::wakeup_for([self.ends_at])
///     }
///
///     fn on_wakeup(&mut self, state: &mut State) -> Result<(), RunnerError> {
///         let names: Vec<String> = state.snapshot().task_states.iter().map(|t| t.name.clone()).collect();
///         for name in names {
///             state.task_finished(&name, false, "ran for its time");
///         }
///         Ok(())
///     }
/// }
///
/// caravan_guest::export_runner!(Timer);
/// ```
pub trait Runner: Sized {
    /// Starts the alloc: check its config, start its tasks (`state.task_started`). `restored`
    /// is your last checkpoint when the alloc resumes after an agent restart.
    ///
    /// If the status is still `pending` when this returns, the loop reports `running`.
    fn start(
        alloc: &Alloc,
        restored: Option<Vec<u8>>,
        state: &mut State,
    ) -> Result<Self, RunnerError>;

    /// How long to wait for an event before [`Runner::on_wakeup`]; `None` waits for ever.
    fn next_wakeup(&self) -> Option<Duration> {
        None
    }

    /// Called when [`Runner::next_wakeup`] passed without an event.
    fn on_wakeup(&mut self, _state: &mut State) -> Result<(), RunnerError> {
        Ok(())
    }

    /// A new version of the alloc arrived. A `kill` follows if it is to stop.
    fn on_update(&mut self, _alloc: Alloc, _state: &mut State) -> Result<(), RunnerError> {
        Ok(())
    }

    /// A signal for one task (or all, when `request.task` is `None`); the host has checked
    /// that the task is the alloc's and that the signal is a known name, in upper case.
    /// Default: a `Signaling` event on the task(s), nothing else.
    fn on_signal(&mut self, request: SignalRequest, state: &mut State) -> Result<(), RunnerError> {
        let names: Vec<String> = match request.task {
            Some(task) => vec![task],
            None => state
                .snapshot()
                .task_states
                .iter()
                .map(|t| t.name.clone())
                .collect(),
        };
        for name in names {
            state.task_signaled(&name, &request.signal);
        }
        Ok(())
    }

    /// A request to restart task `task` (the host sends one per task when the operator names
    /// none, and only names tasks of the alloc). Default: counts the restart and marks it
    /// running.
    fn on_restart_task(&mut self, task: String, state: &mut State) -> Result<(), RunnerError> {
        state.task_restarted(&task, "User requested task to restart");
        Ok(())
    }

    /// The alloc is being stopped for good. Default: [`State::kill_all`].
    fn on_kill(&mut self, state: &mut State) {
        state.kill_all("alloc was stopped");
    }

    /// What to save when the agent shuts down, given back as `restored` on the next start.
    /// Default: nothing.
    fn checkpoint(&self) -> Option<Vec<u8>> {
        None
    }
}

/// The default event loop; [`crate::export_runner!`] calls it from `run`.
///
/// It first installs a panic hook that writes a panic as one line to stderr, `panicked at
/// src/lib.rs:24:5: the message`: the host quotes a trapped runner's last stderr lines in
/// the alloc's description, and Rust's own hook spreads a panic over three lines, one of them
/// advice to set `RUST_BACKTRACE`, which a sandbox cannot. A hook the runner sets in
/// [`Runner::start`] replaces it.
pub fn run<R: Runner>(alloc: Alloc, restored: Option<Vec<u8>>) -> Result<(), RunnerError> {
    static PANIC_HOOK: std::sync::Once = std::sync::Once::new();
    PANIC_HOOK.call_once(|| std::panic::set_hook(Box::new(report_panic)));
    let mut state = State::new(&alloc);
    let outcome = drive::<R>(&alloc, restored, &mut state);
    if let Err(error) = &outcome {
        // Worded as the host words it, so the description does not change when the host
        // applies its own rule for `err`.
        let description = match error {
            RunnerError::InvalidConfig(message) => format!("invalid config: {message}"),
            RunnerError::Failed(message) => message.clone(),
        };
        state.set_status(ClientStatus::Failed, description);
        // The host fails the alloc with our error anyway; this report only adds task states.
        let _ = state.report();
    }
    outcome
}

/// Writes a panic as one line on stderr: where, then what.
fn report_panic(info: &std::panic::PanicHookInfo<'_>) {
    let message = info
        .payload_as_str()
        .unwrap_or("(a panic without a message)");
    match info.location() {
        Some(at) => eprintln!(
            "panicked at {}:{}:{}: {message}",
            at.file(),
            at.line(),
            at.column()
        ),
        None => eprintln!("panicked: {message}"),
    }
}

fn drive<R: Runner>(
    alloc: &Alloc,
    restored: Option<Vec<u8>>,
    state: &mut State,
) -> Result<(), RunnerError> {
    let mut runner = R::start(alloc, restored, state)?;
    if state.client_status() == ClientStatus::Pending {
        state.set_status(ClientStatus::Running, "Runner started");
    }
    report(state)?;
    while !state.is_terminal() {
        match host::next_event(runner.next_wakeup()) {
            None => runner.on_wakeup(state)?,
            Some(Event::Update(alloc)) => runner.on_update(alloc, state)?,
            Some(Event::Signal(request)) => runner.on_signal(request, state)?,
            Some(Event::RestartTask(task)) => runner.on_restart_task(task, state)?,
            Some(Event::Kill) => runner.on_kill(state),
            Some(Event::Shutdown) => {
                if let Some(bytes) = runner.checkpoint() {
                    host::checkpoint(&bytes).map_err(RunnerError::Failed)?;
                }
                return Ok(());
            }
        }
        report(state)?;
    }
    Ok(())
}

fn report(state: &mut State) -> Result<(), RunnerError> {
    state
        .report()
        .map_err(|refusal| RunnerError::Failed(format!("host refused state: {refusal}")))
}
