//! How a run ended, and the final state it gives the alloc: the one place that decides it
//! (see the contract in `wit/runner.wit`), and that names a trap or a limit for operators.
//! Pure functions over what the run left behind; it touches no runner state.

use crate::model::limits::as_len;
use crate::model::structs::{
    AllocState, ClientStatus, Limits, Task, TaskEvent, TaskLifecycle, TaskState,
};
use crate::runtime::StoreData;
use crate::runtime::imports::bindings::{self, RunnerError};
use crate::runtime::imports::host_api::MAX_EVENTS_PER_TASK;
use crate::util::text::cut;
use crate::util::units::{format_bytes, format_duration};

/// How a run ended, before it is turned into a final state.
#[derive(Debug)]
pub(in crate::runtime) enum RunOutcome {
    /// `run` returned.
    Returned(Result<(), RunnerError>),
    /// The guest trapped or hit a limit; the description names which.
    Failed(String),
    /// The guest did not return within the kill timeout after `kill`.
    KillTimedOut,
    /// The guest did not return within the kill timeout after `shutdown`.
    ShutdownTimedOut,
    /// Killed or shut down before `run` was ever called.
    NeverStarted,
    /// Killed or shut down while waiting to restart after a crash (see [`crate::model::restart`]).
    StoppedWhileRestarting,
}

impl RunOutcome {
    /// What a crash says of itself: the description of a trap, a limit or an error `run`
    /// returned; `None` for a run that ended without crashing.
    pub(in crate::runtime) fn crash_description(&self, limits: &Limits) -> Option<String> {
        match self {
            RunOutcome::Failed(description) => Some(description.clone()),
            RunOutcome::Returned(Err(error)) => Some(
                cut(
                    &bindings::describe_runner_error(error),
                    as_len(limits.description_bytes),
                )
                .into_owned(),
            ),
            _ => None,
        }
    }
}

/// Names what ended a run that did not return: a limit first (the trap it caused is only a
/// symptom), then the trap with the guest function it happened in and the guest's last words
/// (what it wrote to stderr or logged at ERROR just before: a panic message, an exception).
pub(in crate::runtime) fn describe_failure(
    error: &wasmtime::Error,
    data: &StoreData,
    context: &str,
) -> String {
    if let Some(limit) = data.memory.failure().or_else(|| data.cpu.failure()) {
        return limit;
    }
    let limits = &data.limits;
    let text_bytes = as_len(limits.description_bytes);
    let caused_by = |text: &str| error.chain().any(|cause| cause.to_string().contains(text));
    if caused_by(HOSTCALL_FUEL_EXHAUSTED) {
        return format!(
            "runner passed more than {} to the host in one call (the host-call limit, hostcall_size)",
            format_bytes(limits.hostcall_bytes)
        );
    }
    if caused_by(HANDLE_LIMIT_EXCEEDED) {
        return format!(
            "runner held more than {} handles at once (open files, streams and the like: the handle limit, open_files)",
            limits.open_files
        );
    }
    if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
        let location = error
            .downcast_ref::<wasmtime::WasmBacktrace>()
            .and_then(|backtrace| {
                let frames: Vec<String> = backtrace
                    .frames()
                    .iter()
                    .filter_map(|frame| frame.func_name())
                    .map(|name| format!("{:#}", rustc_demangle::demangle(name)))
                    .collect();
                let user = frames
                    .iter()
                    .find(|name| !is_runtime_frame(name))
                    .or(frames.first());
                user.map(|name| format!(" in {name}"))
            })
            .unwrap_or_default();
        let last_words = data
            .logging
            .last_words()
            .map(|words| format!("; its last words: {words}"))
            .unwrap_or_default();
        // `Trap`'s own text starts with "wasm trap: "; the function's name is the guest's.
        return cut(&format!("{trap}{location}{last_words}"), text_bytes).into_owned();
    }
    // Every cause but the backtrace, which spans many lines and means nothing to an operator
    // without the guest's sources.
    // (wasmtime attaches it as a context, so only its text tells it apart.)
    let causes: Vec<String> = error
        .chain()
        .map(ToString::to_string)
        .filter(|cause| !cause.starts_with("error while executing at wasm backtrace"))
        .collect();
    let description = format!("{context}: {}", causes.join(": "));
    cut(&description, text_bytes).into_owned()
}

/// What wasmtime says when a store holds more handles than it may.
const HANDLE_LIMIT_EXCEEDED: &str = "store handle limit exceeded";

/// What wasmtime says when a guest hands one host call more than the store's hostcall fuel
/// (its type is private, so its text is what can be matched).
const HOSTCALL_FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

/// Frames of the language runtime's panic and abort machinery, skipped when naming where a
/// trap happened.
fn is_runtime_frame(name: &str) -> bool {
    [
        "std::",
        "core::",
        "alloc::",
        "__rust",
        "rust_panic",
        "abort",
        "panic_abort",
        "wit_bindgen::",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
        || name.contains("::panicking::")
}

/// The state an alloc ends in. A terminal report from the guest stands; otherwise the way the
/// run ended decides (see the contract in `wit/runner.wit`), and every task the guest left
/// unfinished ends `dead` (failed, if the alloc failed) with a `Terminated` event at
/// `now_unix_ms` giving the reason, as Nomad's tasks do when their alloc ends: the alloc's
/// `tasks` the guest never reported too (it trapped before its first report, say), so no
/// task is missing from an alloc that ended.
pub(in crate::runtime) fn final_state(
    last: AllocState,
    outcome: RunOutcome,
    shut_down: bool,
    (limits, tasks): (&Limits, &[Task]),
    now_unix_ms: u64,
) -> AllocState {
    if last.client_status.is_terminal() {
        return last;
    }
    let (status, description) = match outcome {
        RunOutcome::Returned(Ok(()))
        | RunOutcome::NeverStarted
        | RunOutcome::StoppedWhileRestarting
            if shut_down =>
        {
            return last;
        }
        RunOutcome::Returned(Ok(())) => (ClientStatus::Complete, "runner finished".to_string()),
        // The guest's own words, bounded as every description it reports is.
        RunOutcome::Returned(Err(error)) => (
            ClientStatus::Failed,
            cut(
                &bindings::describe_runner_error(&error),
                as_len(limits.description_bytes),
            )
            .into_owned(),
        ),
        RunOutcome::Failed(description) => (ClientStatus::Failed, description),
        RunOutcome::KillTimedOut => (
            ClientStatus::Failed,
            format!(
                "runner did not stop within the kill timeout of {}",
                format_duration(limits.kill_timeout)
            ),
        ),
        RunOutcome::ShutdownTimedOut => return last,
        RunOutcome::NeverStarted => (
            ClientStatus::Complete,
            "alloc was stopped before it started".to_string(),
        ),
        RunOutcome::StoppedWhileRestarting => (
            ClientStatus::Complete,
            "alloc was stopped while its runner waited to restart".to_string(),
        ),
    };
    let mut task_states = last.task_states;
    add_unreported_tasks(&mut task_states, tasks);
    end_unfinished_tasks(
        &mut task_states,
        status == ClientStatus::Failed,
        &description,
        now_unix_ms,
    );
    AllocState {
        client_status: status,
        description,
        task_states,
    }
}

/// Adds each of the alloc's `tasks` the guest never reported, `pending`, in the alloc's
/// order after the reported ones.
pub(in crate::runtime) fn add_unreported_tasks(task_states: &mut Vec<TaskState>, tasks: &[Task]) {
    for task in tasks {
        if !task_states.iter().any(|state| state.name == task.name) {
            task_states.push(TaskState {
                name: task.name.clone(),
                state: TaskLifecycle::Pending,
                failed: false,
                restarts: 0,
                events: Vec::new(),
            });
        }
    }
}

/// The state of an alloc whose runner crashed (`why`) and starts again in `wait`, its
/// `attempt`-th restart of `limit` (`2 in 30m`): pending, every task pending again with a
/// restart counted and the events Nomad gives one (`Terminated` for a task that was still
/// running, then `Restarting`).
pub(in crate::runtime) fn restarting_state(
    last: AllocState,
    why: &str,
    wait: &str,
    attempt: u32,
    limit: &str,
    now_unix_ms: u64,
) -> AllocState {
    let mut task_states = last.task_states;
    end_unfinished_tasks(&mut task_states, true, why, now_unix_ms);
    for task in &mut task_states {
        task.state = TaskLifecycle::Pending;
        task.failed = false;
        task.restarts = task.restarts.saturating_add(1);
        push_event(
            task,
            TaskEvent {
                kind: "Restarting".into(),
                message: format!("Task restarting in {wait}"),
                time_unix_ms: now_unix_ms,
            },
        );
    }
    AllocState {
        client_status: ClientStatus::Pending,
        description: format!(
            "{}{wait} (restart {attempt}, at most {limit}) after: {why}",
            crate::model::restart::RESTARTING_DESCRIPTION_PREFIX
        ),
        task_states,
    }
}

/// Adds `event`, the task's oldest events making room within the per-task limit.
/// `state` with an event of `kind` saying `message` at `now_unix_ms` added to every task.
pub(in crate::runtime) fn with_event_on_every_task(
    mut state: AllocState,
    kind: &str,
    message: &str,
    now_unix_ms: u64,
) -> AllocState {
    for task in &mut state.task_states {
        push_event(
            task,
            TaskEvent {
                kind: kind.into(),
                message: message.into(),
                time_unix_ms: now_unix_ms,
            },
        );
    }
    state
}

fn push_event(task: &mut TaskState, event: TaskEvent) {
    let over = (task.events.len() + 1).saturating_sub(MAX_EVENTS_PER_TASK);
    task.events.drain(..over);
    task.events.push(event);
}

/// Every task not dead yet ends `dead` (`failed` as given) with a `Terminated` event at
/// `now_unix_ms` saying `why`, its oldest events making room within the per-task limit.
pub(in crate::runtime) fn end_unfinished_tasks(
    tasks: &mut [TaskState],
    failed: bool,
    why: &str,
    now_unix_ms: u64,
) {
    for task in tasks.iter_mut().filter(|t| t.state != TaskLifecycle::Dead) {
        task.state = TaskLifecycle::Dead;
        task.failed = failed;
        push_event(
            task,
            TaskEvent {
                kind: "Terminated".into(),
                message: why.to_string(),
                time_unix_ms: now_unix_ms,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(name: &str, state: TaskLifecycle, failed: bool) -> TaskState {
        TaskState {
            name: name.into(),
            state,
            failed,
            restarts: 0,
            events: Vec::new(),
        }
    }

    fn running_with(tasks: Vec<TaskState>) -> AllocState {
        AllocState {
            client_status: ClientStatus::Running,
            description: "Tasks are running".into(),
            task_states: tasks,
        }
    }

    #[test]
    fn a_trap_ends_every_unfinished_task_dead_and_failed_saying_why() {
        let last = running_with(vec![
            task("main", TaskLifecycle::Running, false),
            task("setup", TaskLifecycle::Dead, false),
            task("later", TaskLifecycle::Pending, false),
        ]);
        let outcome = RunOutcome::Failed("wasm trap: unreachable".into());
        let ended = final_state(last, outcome, false, (&Limits::default(), &[]), 42);
        assert_eq!(ended.client_status, ClientStatus::Failed);
        let summary: Vec<_> = ended
            .task_states
            .iter()
            .map(|t| (t.name.as_str(), t.state, t.failed, t.events.len()))
            .collect();
        assert_eq!(
            summary,
            [
                ("main", TaskLifecycle::Dead, true, 1),
                ("setup", TaskLifecycle::Dead, false, 0),
                ("later", TaskLifecycle::Dead, true, 1),
            ],
            "a task that had finished keeps its own ending"
        );
        let event = &ended.task_states[0].events[0];
        assert_eq!(
            (
                event.kind.as_str(),
                event.message.as_str(),
                event.time_unix_ms
            ),
            ("Terminated", "wasm trap: unreachable", 42)
        );
    }

    #[test]
    fn the_terminated_event_keeps_the_task_within_its_event_limit() {
        let mut main = task("main", TaskLifecycle::Running, false);
        main.events = (0..MAX_EVENTS_PER_TASK)
            .map(|n| TaskEvent {
                kind: "Tick".into(),
                message: n.to_string(),
                time_unix_ms: 0,
            })
            .collect();
        let ended = final_state(
            running_with(vec![main]),
            RunOutcome::Returned(Ok(())),
            false,
            (&Limits::default(), &[]),
            7,
        );
        let events = &ended.task_states[0].events;
        assert_eq!(events.len(), MAX_EVENTS_PER_TASK);
        assert_eq!(events[0].message, "1", "the oldest event made room");
        assert_eq!(
            (events[9].kind.as_str(), ended.task_states[0].failed),
            ("Terminated", false),
            "a runner that returned completes its tasks"
        );
    }

    #[test]
    fn a_terminal_report_from_the_guest_stands_as_it_is() {
        let mut last = running_with(vec![task("main", TaskLifecycle::Running, false)]);
        last.client_status = ClientStatus::Complete;
        let ended = final_state(
            last.clone(),
            RunOutcome::Failed("late trap".into()),
            false,
            (&Limits::default(), &[]),
            1,
        );
        assert_eq!(ended, last);
    }

    #[test]
    fn tasks_a_runner_never_reported_end_dead_with_a_terminated_event_too() {
        let tasks: Vec<Task> = ["main", "sidecar"]
            .iter()
            .map(|name| Task {
                name: name.to_string(),
                config: Vec::new(),
            })
            .collect();
        let never_reported = AllocState {
            client_status: ClientStatus::Pending,
            description: String::new(),
            task_states: Vec::new(),
        };
        let outcome = RunOutcome::Failed("wasm trap: unreachable".into());
        let ended = final_state(
            never_reported,
            outcome,
            false,
            (&Limits::default(), &tasks),
            9,
        );
        let summary: Vec<_> = ended
            .task_states
            .iter()
            .map(|t| {
                let event = t
                    .events
                    .last()
                    .map(|e| (e.kind.as_str(), e.message.as_str()));
                (t.name.as_str(), t.state, t.failed, event)
            })
            .collect();
        let terminated = Some(("Terminated", "wasm trap: unreachable"));
        assert_eq!(
            summary,
            [
                ("main", TaskLifecycle::Dead, true, terminated),
                ("sidecar", TaskLifecycle::Dead, true, terminated),
            ]
        );
    }
}
