//! How a run ended, and the final state it gives the alloc: the one place that decides it
//! (see the contract in `wit/runner.wit`), and that names a trap or a limit for operators.
//! Pure functions over what the run left behind; it touches no runner state.

use super::StoreData;
use super::bindings::{self, RunnerError};
use crate::limits::as_len;
use crate::structs::{AllocState, ClientStatus, Limits};
use crate::text::cut;
use crate::units::{format_bytes, format_duration};

/// How a run ended, before it is turned into a final state.
#[derive(Debug)]
pub(super) enum RunOutcome {
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
}

/// Names what ended a run that did not return: a limit first (the trap it caused is only a
/// symptom), then the trap with the guest function it happened in.
pub(super) fn describe_failure(error: &wasmtime::Error, data: &StoreData, context: &str) -> String {
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
        // `Trap`'s own text starts with "wasm trap: "; the function's name is the guest's.
        return cut(&format!("{trap}{location}"), text_bytes).into_owned();
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
/// run ended decides (see the contract in `wit/runner.wit`).
pub(super) fn final_state(
    last: AllocState,
    outcome: RunOutcome,
    shut_down: bool,
    limits: &Limits,
) -> AllocState {
    if last.client_status.is_terminal() {
        return last;
    }
    let (status, description) = match outcome {
        RunOutcome::Returned(Ok(())) | RunOutcome::NeverStarted if shut_down => return last,
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
    };
    AllocState {
        client_status: status,
        description,
        task_states: last.task_states,
    }
}
