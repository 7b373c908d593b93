//! A guest that traps fails its alloc with the trap and where it happened.

use crate::support::*;
use caravan_host::structs::ClientStatus;
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
}
