//! A job's restart policy (`[job.restart]`): a crashed runner is started again in place, in a
//! fresh sandbox, after its delay and from its last checkpoint, up to its attempts; then the
//! alloc fails. Real runners under paused tokio time: the delays are observed, not slept.

use crate::support::*;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::reschedule::DelayFunction;
use caravan_host::model::restart::{RestartMode, RestartPolicy};
use caravan_host::model::structs::{AllocState, ClientStatus, TaskLifecycle};
use caravan_test_artifacts::{SLEEPER, STATEFUL};
use std::time::Duration;

fn policy(attempts: u32, delay_secs: u64) -> RestartPolicy {
    RestartPolicy {
        attempts,
        interval: Duration::from_secs(30 * 60),
        delay: Duration::from_secs(delay_secs),
        delay_function: DelayFunction::Constant,
        max_delay: Duration::from_secs(delay_secs),
        mode: RestartMode::Fail,
        ..RestartPolicy::block_default()
    }
}

/// Whether the runner ever waited to restart.
fn ever_restarting(started: &Started) -> bool {
    started
        .recorder
        .history
        .lock()
        .unwrap()
        .iter()
        .any(restarting)
}

fn restarting(state: &AllocState) -> bool {
    state.client_status == ClientStatus::Pending && state.description.starts_with("restarting")
}

#[tokio::test(start_paused = true)]
async fn a_crashing_runner_is_restarted_after_its_delay_until_its_attempts_are_used() {
    let logs = LogCapture::start();
    let alloc = caravan_host::model::structs::Alloc {
        restart: Some(policy(2, 5)),
        ..alloc(SLEEPER, &["web"], &[("crash_after", "50ms")])
    };
    let begun = tokio::time::Instant::now();
    let started = start(alloc, None);
    let state = started.stopped().await;

    assert_eq!(state.client_status, ClientStatus::Failed, "{state:?}");
    assert!(
        state.description.ends_with(
            "task web crashed on purpose (crash_after 50ms) (restart limit reached: 2 in 30m)"
        ),
        "{}",
        state.description
    );
    let task = &state.task_states[0];
    assert_eq!(
        (task.state, task.failed, task.restarts),
        (TaskLifecycle::Dead, true, 2)
    );
    let kinds: Vec<&str> = task.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "Restarting").count(),
        2,
        "{kinds:?}"
    );
    // Two waits of 5 s, not a tight loop: three runs in all.
    assert!(
        begun.elapsed() >= Duration::from_secs(10),
        "{:?}",
        begun.elapsed()
    );
    assert_eq!(
        logs.with_message("task web started; runs until killed")
            .len(),
        3
    );
    let waits: Vec<String> = started
        .recorder
        .history
        .lock()
        .unwrap()
        .iter()
        .filter(|s| restarting(s))
        .map(|s| s.description.clone())
        .collect();
    assert_eq!(waits.len(), 2, "{waits:#?}");
    assert!(
        waits[0].starts_with("restarting in 5s (restart 1, at most 2 in 30m) after: wasm trap"),
        "{waits:#?}"
    );
    assert!(waits[1].starts_with("restarting in 5s (restart 2, at most 2 in 30m)"));
}

#[tokio::test(start_paused = true)]
async fn a_restarted_runner_resumes_from_its_last_checkpoint() {
    let logs = LogCapture::start();
    let alloc = caravan_host::model::structs::Alloc {
        restart: Some(policy(1, 2)),
        ..alloc(
            STATEFUL,
            &["main"],
            &[
                ("tick_every", "100"),
                ("crash_at", "3"),
                ("stop_after", "5"),
            ],
        )
    };
    let started = start(alloc, None);
    let state = started.stopped().await;

    assert_eq!(state.client_status, ClientStatus::Complete, "{state:?}");
    assert_eq!(state.description, "counted to 5");
    assert_eq!(state.task_states[0].restarts, 1);
    assert_eq!(
        logs.with_message("resuming from checkpoint at count 3")
            .len(),
        1,
        "the second run starts from the first one's checkpoint"
    );
    assert_eq!(
        started.recorder.last_checkpoint().as_deref(),
        Some(&b"5"[..])
    );
}

#[tokio::test(start_paused = true)]
async fn a_kill_during_the_wait_stops_the_alloc_without_another_run() {
    let logs = LogCapture::start();
    let alloc = caravan_host::model::structs::Alloc {
        restart: Some(policy(3, 30)),
        ..alloc(SLEEPER, &["web"], &[("crash_after", "50ms")])
    };
    let started = start(alloc, None);
    started
        .recorder
        .wait_for("the first restart's wait", restarting)
        .await;
    // Nothing runs to take a signal or a task restart meanwhile: refused, as for an alloc
    // that is not running.
    let refused = started.runner.signal(None, "SIGHUP").unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("its runner crashed and waits to be restarted"),
        "{refused}"
    );
    started.runner.kill();
    let state = started.stopped().await;

    assert_eq!(state.client_status, ClientStatus::Complete, "{state:?}");
    assert_eq!(
        state.description,
        "alloc was stopped while its runner waited to restart"
    );
    let task = &state.task_states[0];
    assert_eq!(
        (task.state, task.failed, task.restarts),
        (TaskLifecycle::Dead, false, 1)
    );
    assert_eq!(
        logs.with_message("task web started; runs until killed")
            .len(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_policy_a_crash_fails_the_alloc_at_once() {
    let started = start(alloc(SLEEPER, &["web"], &[("crash_after", "50ms")]), None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed, "{state:?}");
    assert_eq!(state.task_states[0].restarts, 0);
    assert!(!ever_restarting(&started));
}

#[tokio::test]
async fn a_spent_cpu_budget_is_final_whatever_the_policy() {
    let _logs = LogCapture::start();
    let mut spinning = caravan_host::model::structs::Alloc {
        restart: Some(RestartPolicy {
            mode: RestartMode::Delay,
            ..policy(5, 1)
        }),
        ..alloc(caravan_test_artifacts::FIXTURE_SPIN_LOOP, &["main"], &[])
    };
    spinning.limits.cpu = Some(Duration::from_millis(200));
    let started = start(spinning, None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed, "{state:?}");
    assert!(
        state.description.starts_with("CPU budget exhausted"),
        "{}",
        state.description
    );
    assert_eq!(
        state.task_states[0].restarts, 0,
        "the budget is the alloc's"
    );
    assert!(!ever_restarting(&started));
}
