//! The sim runner: Nomad's task events, failure and log rates from task config, draws that
//! replay from a seed, and a checkpoint that carries a task's remaining time over a restart.

use crate::support::*;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::structs::{Alloc, AllocState, ClientStatus};
use caravan_test_artifacts::SIM;
use std::time::Duration;

const TASKS: [&str; 8] = ["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"];

fn seeded(seed: &str, config: &[(&str, &str)]) -> Alloc {
    Alloc {
        meta: vec![("sim_seed".into(), seed.into())],
        ..alloc(SIM, &TASKS, config)
    }
}

/// Every task's events as `kind: message`, without their times.
fn events(state: &AllocState) -> Vec<Vec<String>> {
    state
        .task_states
        .iter()
        .map(|task| {
            let events = task.events.iter();
            events
                .map(|e| format!("{}: {}", e.kind, e.message))
                .collect()
        })
        .collect()
}

/// Runs `alloc` to its end on paused time; returns its final state, how long it ran, and
/// the guest's log lines in order.
async fn run_to_end(alloc: Alloc) -> (AllocState, Duration, Vec<String>) {
    let logs = LogCapture::start();
    let begun = tokio::time::Instant::now();
    let started = start(alloc, None);
    let state = started.stopped().await;
    let lines = logs
        .lines()
        .iter()
        .filter(|line| line["target"] == "caravan::guest")
        .map(|line| message(line).to_string())
        .collect();
    (state, begun.elapsed(), lines)
}

const RANDOM_RUNS: [(&str, &str); 4] = [
    ("run_for", "1s"),
    ("run_jitter", "2s"),
    ("fail_ratio", "0.5"),
    ("log_every", "250ms"),
];

#[tokio::test(start_paused = true)]
async fn the_same_seed_replays_the_same_events_and_logs() {
    let (first, first_took, first_logs) = run_to_end(seeded("42", &RANDOM_RUNS)).await;
    let (again, again_took, again_logs) = run_to_end(seeded("42", &RANDOM_RUNS)).await;
    assert_eq!(events(&first), events(&again));
    assert_eq!(first_logs, again_logs);
    assert_eq!(first_took, again_took);
    assert_eq!(first.client_status, again.client_status);

    let task_events = &events(&first)[0];
    assert_eq!(
        task_events[..3],
        [
            "Received: Task received by client",
            "Task Setup: Building Task Directory",
            "Started: Task started by client"
        ]
    );
    assert!(
        task_events[3].starts_with("Terminated: Exit Code: "),
        "{task_events:?}"
    );
    let failed = first.task_states.iter().filter(|t| t.failed).count();
    assert!(
        (1..TASKS.len()).contains(&failed),
        "a fail ratio of 0.5 over 8 tasks fails some, not all: {failed}"
    );
    assert!(
        first_logs.iter().any(|l| l.ends_with("progress 1")),
        "{first_logs:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn another_seed_draws_other_outcomes() {
    let (first, _, _) = run_to_end(seeded("42", &RANDOM_RUNS)).await;
    let (other, _, _) = run_to_end(seeded("7", &RANDOM_RUNS)).await;
    let outcomes =
        |state: &AllocState| -> Vec<bool> { state.task_states.iter().map(|t| t.failed).collect() };
    assert_ne!(outcomes(&first), outcomes(&other));
}

#[tokio::test(start_paused = true)]
async fn a_fail_ratio_of_one_fails_every_task_and_the_alloc() {
    let (state, took, _) =
        run_to_end(seeded("1", &[("run_for", "500ms"), ("fail_ratio", "1")])).await;
    assert_eq!(state.client_status, ClientStatus::Failed, "{state:?}");
    assert!(state.task_states.iter().all(|t| t.failed));
    assert_eq!(took, Duration::from_millis(500));
}

/// A zero wait is an answer now, not a timer: a timer of zero milliseconds would wait for
/// the timer wheel's next millisecond tick, holding the alloc's instance meanwhile (what
/// bounded how fast short allocs came and went).
#[tokio::test(start_paused = true)]
async fn a_task_with_no_run_time_ends_without_waiting_on_the_clock() {
    // Between two ticks of the timer wheel, where a real clock nearly always is: on a tick,
    // a zero timer is due at once.
    tokio::time::advance(Duration::from_micros(500)).await;
    let (state, took, _) = run_to_end(seeded("1", &[("run_for", "0s")])).await;
    assert_eq!(state.client_status, ClientStatus::Complete, "{state:?}");
    assert_eq!(took, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn bad_config_fails_the_alloc_naming_the_key() {
    for (alloc, named) in [
        (seeded("1", &[("fail_ratio", "2")]), "fail_ratio"),
        (seeded("1", &[("run_for", "soon")]), "run_for"),
        (seeded("-3", &[]), "sim_seed"),
    ] {
        let (state, _, _) = run_to_end(alloc).await;
        assert_eq!(state.client_status, ClientStatus::Failed);
        assert!(
            state.description.starts_with("invalid config:") && state.description.contains(named),
            "{}",
            state.description
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_restored_task_runs_only_what_was_left_of_its_time() {
    let _logs = LogCapture::start();
    let alloc = seeded("5", &[("run_for", "10s")]);
    let started = start(alloc.clone(), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    started.runner.shutdown();
    within("shutdown", started.runner.shutdown_done().wait()).await;
    let checkpoint = started.recorder.last_checkpoint().expect("a checkpoint");

    let begun = tokio::time::Instant::now();
    let restored = start(alloc, Some(checkpoint));
    let state = restored.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Complete, "{state:?}");
    assert_eq!(
        begun.elapsed(),
        Duration::from_secs(6),
        "the 6s left of 10s"
    );
    assert!(events(&state)[0].contains(&"Restored: Task restored from a checkpoint".to_string()));
}
