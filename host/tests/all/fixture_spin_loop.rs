//! A guest that computes for ever: it yields at every epoch tick, so other allocs carry on,
//! and it fails when its CPU budget runs out; a kill it cannot answer ends at the kill timeout.
//! No test here depends on how fast the machine is: the neighbour's test gives the spinner a
//! budget it cannot reach, and checks that it was still spinning.

use crate::support::*;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::structs::ClientStatus;
use caravan_test_artifacts::{FIXTURE_SPIN_LOOP, MINIMAL};
use std::time::Duration;

#[tokio::test]
async fn a_spinning_guest_exhausts_its_cpu_budget() {
    let _logs = LogCapture::start();
    let mut spinning = alloc(FIXTURE_SPIN_LOOP, &["main"], &[]);
    spinning.limits.cpu = Some(Duration::from_millis(500));
    let state = start(spinning, None).stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(
        state.description,
        "CPU budget exhausted: used 500ms of computing time"
    );
}

#[tokio::test]
async fn a_spinning_guests_neighbour_starts_runs_and_stops_on_the_same_thread() {
    let _logs = LogCapture::start();
    // Load both components first: compiling takes the thread.
    runtime().load_file(std::path::Path::new(MINIMAL)).unwrap();
    // A budget the test never reaches, however loaded the machine: the spinner is still
    // spinning when the neighbour is done, which the test checks rather than assumes.
    let mut spinning = alloc(FIXTURE_SPIN_LOOP, &["main"], &[]);
    spinning.limits.cpu = Some(Duration::from_secs(3600));
    spinning.limits.kill_timeout = Some(Duration::from_millis(200));
    let spinner = start(spinning, None);

    // This test's runtime has one thread, which the spinner is using: the neighbour can only
    // start, run and be killed because the spinner yields at every epoch tick. The check runs
    // as a task of its own so it is scheduled as fairly as the spinner.
    let neighbour_done = tokio::spawn(async move {
        spinner
            .recorder
            .wait_for_status(ClientStatus::Running)
            .await;
        let neighbour = start(alloc(MINIMAL, &["main"], &[]), None);
        neighbour
            .recorder
            .wait_for_status(ClientStatus::Running)
            .await;
        neighbour.runner.kill();
        assert_eq!(
            neighbour.stopped().await.client_status,
            ClientStatus::Complete
        );
        assert!(
            !spinner.runner.wait().is_set(),
            "the spinner was still running meanwhile"
        );
        spinner
    });
    let spinner = within("the neighbour's run", neighbour_done).await.unwrap();
    spinner.runner.destroy();
    within("the spinner's destroy", spinner.runner.destroyed().wait()).await;
}

#[tokio::test]
async fn a_guest_over_its_cpu_share_is_paused_not_failed_until_its_budget_is_spent() {
    let _logs = LogCapture::start();
    // A tenth of a core: past its first 100 ms of credit, every 10 ms of computing costs
    // 100 ms of pause, so its 150 ms budget lasts about half a second of wall time.
    let mut spinning = alloc(FIXTURE_SPIN_LOOP, &["main"], &[]);
    spinning.limits.cpu = Some(Duration::from_millis(150));
    spinning.limits.cpu_share = Some(10);
    let state = start(spinning, None).stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert!(
        state
            .description
            .starts_with("CPU budget exhausted: used 150ms of computing time; paused ")
            && state
                .description
                .ends_with(" to keep it to its CPU share of 10%"),
        "{}",
        state.description
    );
}

#[tokio::test]
async fn a_guest_that_ignores_kill_is_torn_down_after_the_kill_timeout() {
    let _logs = LogCapture::start();
    let mut spinning = alloc(FIXTURE_SPIN_LOOP, &["main"], &[]);
    spinning.limits.kill_timeout = Some(Duration::from_millis(200));
    let spinner = start(spinning, None);
    spinner
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    spinner.runner.destroy();
    within("destroy", spinner.runner.destroyed().wait()).await;
    let state = spinner.runner.alloc_state();
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(
        state.description,
        "runner did not stop within the kill timeout of 200ms"
    );
}
