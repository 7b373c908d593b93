//! A guest that traps fails its alloc with the trap, where it happened and its last words,
//! and its task ends dead and failed.

use crate::support::*;
use caravan_host::model::structs::{ClientStatus, TaskLifecycle};
use caravan_test_artifacts::FIXTURE_TRAP;

#[tokio::test]
async fn a_trap_fails_the_alloc_naming_the_trap_and_the_guest_function() {
    let logs = LogCapture::start();
    let started = start(alloc(FIXTURE_TRAP, &["main"], &[]), None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert!(
        state
            .description
            .starts_with("wasm trap: wasm `unreachable` instruction executed in fixture_trap::"),
        "{}",
        state.description
    );
    let panic_line = logs.with_message("the trap fixture panics on purpose");
    assert_eq!(
        panic_line.len(),
        1,
        "the panic message reaches the log from stderr"
    );
    assert_eq!(panic_line[0]["fields"]["stream"], "stderr");
    assert_eq!(panic_line[0]["level"], "WARN");
    let (_, last_words) = state
        .description
        .split_once("; its last words: ")
        .unwrap_or_else(|| panic!("no last words: {}", state.description));
    // The SDK's panic hook writes the panic as one line: where, then what.
    assert!(
        last_words.starts_with("panicked at fixtures/trap/src/lib.rs:")
            && last_words.ends_with(": the trap fixture panics on purpose"),
        "{last_words}"
    );
    let main = &state.task_states[0];
    assert_eq!(
        (main.state, main.failed),
        (TaskLifecycle::Dead, true),
        "{main:?}"
    );
    assert_eq!(main.events.last().unwrap().kind, "Terminated");
}

/// A runner that traps before its first report still leaves every task of its alloc: dead,
/// failed, with a `Terminated` event naming the trap (an alloc that ended with no tasks at all
/// misled its operator).
#[tokio::test]
async fn a_trap_before_any_report_ends_every_task_dead_naming_the_trap() {
    let _logs = LogCapture::start();
    let started = start(
        alloc(FIXTURE_TRAP, &["main", "sidecar"], &[("when", "start")]),
        None,
    );
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    let tasks: Vec<_> = state
        .task_states
        .iter()
        .map(|t| (t.name.as_str(), t.state, t.failed))
        .collect();
    assert_eq!(
        tasks,
        [
            ("main", TaskLifecycle::Dead, true),
            ("sidecar", TaskLifecycle::Dead, true)
        ]
    );
    for task in &state.task_states {
        let event = task.events.last().expect("a Terminated event");
        assert_eq!(event.kind, "Terminated");
        assert!(event.message.starts_with("wasm trap"), "{}", event.message);
    }
}
