//! The minimal runner: the least an implementation needs, driven through the factory.

use crate::support::*;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::structs::{Alloc, ClientStatus, DesiredStatus};
use caravan_test_artifacts::MINIMAL;
use std::sync::Arc;

#[tokio::test]
async fn the_minimum_a_runner_needs_is_to_report_running_and_answer_kill() {
    let _logs = LogCapture::start();
    let started = start(alloc(MINIMAL, &["main"], &[]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    assert!(
        !started.alloc_dir().exists(),
        "a runner that imports no wasi:filesystem is given no alloc dir"
    );

    started.runner.destroy();
    within("destroy", started.runner.destroyed().wait()).await;

    let state = started.runner.alloc_state();
    assert_eq!(state.client_status, ClientStatus::Complete);
    assert_eq!(state.description, "killed");
    assert!(started.runner.is_destroyed());
}

#[tokio::test]
async fn shutdown_stops_the_runner_but_leaves_the_alloc_running() {
    let _logs = LogCapture::start();
    let started = start(alloc(MINIMAL, &["main"], &[]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;

    started.shut_down().await;

    assert_eq!(
        started.runner.alloc_state().client_status,
        ClientStatus::Running
    );
    assert!(!started.runner.is_destroyed());
}

#[tokio::test]
async fn an_update_to_desired_status_stop_kills_the_runner() {
    let _logs = LogCapture::start();
    let started = start(alloc(MINIMAL, &["main"], &[]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;

    let stale = Alloc {
        desired_status: DesiredStatus::Stop,
        ..Alloc::clone(&started.alloc)
    };
    started.runner.update(Arc::new(stale));
    assert_eq!(
        started.runner.alloc().desired_status,
        DesiredStatus::Run,
        "same modify index: ignored"
    );

    let stop = Alloc {
        desired_status: DesiredStatus::Stop,
        modify_index: 2,
        ..Alloc::clone(&started.alloc)
    };
    started.runner.update(Arc::new(stop));
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Complete);
    assert_eq!(started.runner.alloc().modify_index, 2);
}

#[tokio::test]
async fn a_destroy_after_a_shutdown_still_ends_the_alloc_complete() {
    let _logs = LogCapture::start();
    let started = start(alloc(MINIMAL, &["main"], &[]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    started.shut_down().await;

    started.runner.destroy();
    within("destroy", started.runner.destroyed().wait()).await;
    let state = started.runner.alloc_state();
    assert_eq!(state.client_status, ClientStatus::Complete, "{state:?}");
    assert_eq!(state.description, "alloc was stopped");
}
