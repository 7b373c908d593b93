//! The stateful runner: checkpoints, and restoring from them after a shutdown.

use crate::support::*;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::structs::ClientStatus;
use caravan_test_artifacts::STATEFUL;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn shutdown_then_restore_gives_the_checkpoint_back_and_the_count_goes_on() {
    let logs = LogCapture::start();
    let first = alloc(STATEFUL, &["counter"], &[("tick_every", "100")]);
    let started = start(first.clone(), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    // Three ticks of guest time (tokio's paused clock drives the guest's clock).
    tokio::time::sleep(Duration::from_millis(350)).await;

    started.runner.shutdown();
    within("shutdown", started.runner.shutdown_done().wait()).await;
    assert_eq!(
        started.runner.alloc_state().client_status,
        ClientStatus::Running,
        "shutdown is not terminal"
    );
    let checkpoint = started.recorder.last_checkpoint().expect("a checkpoint");
    assert_eq!(String::from_utf8_lossy(&checkpoint), "3");

    let restored = start(first, Some(checkpoint));
    restored
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        logs.with_message("resuming from checkpoint at count 3")
            .len(),
        1
    );
    assert_eq!(
        logs.with_message("tick 4").len(),
        1,
        "the count continues from the checkpoint"
    );
    restored.runner.kill();
    assert_eq!(
        restored.stopped().await.client_status,
        ClientStatus::Complete
    );
}

#[tokio::test(start_paused = true)]
async fn the_counter_completes_when_it_reaches_stop_after() {
    let _logs = LogCapture::start();
    let started = start(
        alloc(
            STATEFUL,
            &["counter"],
            &[("tick_every", "10"), ("stop_after", "5")],
        ),
        None,
    );
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Complete);
    assert_eq!(state.description, "counted to 5");
    assert_eq!(
        started.recorder.checkpoints.lock().unwrap().len(),
        5,
        "one checkpoint per tick"
    );
}
