//! The native `EmptyAllocRunner` keeps the seam's contract, so simulators can rely on it.

use crate::support::*;
use caravan_host::allocrunner::{AllocRunner, AllocRunnerConfig, EmptyAllocRunner, alloc_span};
use caravan_host::model::structs::{Alloc, ClientStatus, DesiredStatus, Limits};
use std::sync::Arc;

fn empty_runner() -> (EmptyAllocRunner, Arc<Recorder>, Arc<Alloc>) {
    let recorder = Recorder::new();
    let alloc = Arc::new(alloc("none", &["main"], &[]));
    let runner = EmptyAllocRunner::new(AllocRunnerConfig {
        alloc: alloc.clone(),
        span: alloc_span(&alloc),
        state_updater: recorder.clone(),
        limits: Limits::default(),
        alloc_dir: std::env::temp_dir(),
        restored: None,
        restoring: false,
        last_state: None,
        log_writer: None,
    });
    (runner, recorder, alloc)
}

#[tokio::test]
async fn the_empty_runner_runs_until_destroyed() {
    let (runner, recorder, _) = empty_runner();
    assert_eq!(runner.alloc_state().client_status, ClientStatus::Pending);
    runner.run();
    recorder.wait_for_status(ClientStatus::Running).await;
    assert!(!runner.wait().is_set());
    runner.destroy();
    within("destroy", runner.destroyed().wait()).await;
    assert!(runner.wait().is_set() && runner.is_destroyed());
    assert_eq!(runner.alloc_state().client_status, ClientStatus::Complete);
}

#[tokio::test]
async fn the_empty_runner_stops_on_a_stop_update_and_on_shutdown() {
    let (runner, _, alloc) = empty_runner();
    runner.run();
    runner.update(Arc::new(Alloc {
        desired_status: DesiredStatus::Stop,
        modify_index: 2,
        ..Alloc::clone(&alloc)
    }));
    within("stop", runner.wait().wait()).await;
    assert_eq!(runner.alloc_state().client_status, ClientStatus::Complete);

    let (runner, _, _) = empty_runner();
    runner.run();
    runner.shutdown();
    within("shutdown", runner.shutdown_done().wait()).await;
    assert_eq!(
        runner.alloc_state().client_status,
        ClientStatus::Running,
        "shutdown is not terminal"
    );
}
