//! The sleeper runner: task lifecycles, events, kill, and log routing into the agent's logger.

use crate::support::*;
use caravan_host::model::structs::{ClientStatus, TaskLifecycle};
use caravan_test_artifacts::SLEEPER;

fn event_kinds(state: &caravan_host::model::structs::AllocState, task: usize) -> Vec<String> {
    state.task_states[task]
        .events
        .iter()
        .map(|e| e.kind.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn tasks_run_for_their_configured_time_then_the_alloc_completes() {
    let _logs = LogCapture::start();
    let started = start(
        alloc(SLEEPER, &["web", "worker"], &[("run_for", "5s")]),
        None,
    );
    let begun = tokio::time::Instant::now();
    let state = started.stopped().await;

    assert_eq!(state.client_status, ClientStatus::Complete, "{state:?}");
    assert_eq!(state.description, "All tasks have completed");
    assert!(
        begun.elapsed() >= std::time::Duration::from_secs(5),
        "guest time follows tokio time"
    );
    for (i, task) in state.task_states.iter().enumerate() {
        assert_eq!(task.state, TaskLifecycle::Dead);
        assert!(!task.failed);
        assert_eq!(
            event_kinds(&state, i),
            ["Received", "Started", "Terminated"]
        );
    }
    let running = started
        .recorder
        .history
        .lock()
        .unwrap()
        .iter()
        .any(|s| s.client_status == ClientStatus::Running);
    assert!(
        running,
        "the alloc was reported running before it completed"
    );
}

#[tokio::test(start_paused = true)]
async fn guest_log_lines_arrive_with_their_level_and_alloc_id() {
    let logs = LogCapture::start();
    let started = start(
        alloc(SLEEPER, &["web"], &[("run_for", "1s"), ("exit_code", "3")]),
        None,
    );
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(state.description, "Failed tasks: web");

    let started_line = logs.with_message("task web started; runs for 1000ms");
    let failed_line = logs.with_message("task web failed: Exit Code: 3");
    assert_eq!(started_line.len(), 1, "one INFO line from the guest");
    assert_eq!(failed_line.len(), 1, "one WARN line from the guest");
    for (line, level) in [(&started_line[0], "INFO"), (&failed_line[0], "WARN")] {
        assert_eq!(line["level"], level);
        assert_eq!(line["target"], "caravan::guest");
        assert_eq!(line["fields"]["context"], "sleeper");
        assert_eq!(line["span"]["alloc_id"], started.alloc.id.as_str());
        assert_eq!(line["span"]["job"], "test-job");
        assert_eq!(
            line["span"]["runner"], "sleeper.wasm",
            "its file name, not its path"
        );
        let hash = line["span"]["runner_sha256"].as_str().unwrap_or_default();
        assert!(
            hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
            "which build runs: {line}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn kill_stops_every_running_task_and_completes_the_alloc() {
    let _logs = LogCapture::start();
    let started = start(alloc(SLEEPER, &["web"], &[]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    started.runner.kill();
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Complete);
    assert_eq!(state.description, "alloc was stopped");
    assert_eq!(
        event_kinds(&state, 0),
        ["Received", "Started", "Killing", "Killed"]
    );
}

#[tokio::test]
async fn bad_task_config_fails_the_alloc_naming_the_task_and_the_key() {
    let _logs = LogCapture::start();
    let started = start(alloc(SLEEPER, &["web"], &[("run_for", "soon")]), None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(
        state.description,
        "invalid config: task \"web\": run_for: \"soon\" is not a duration such as 500ms, 5s or 2m"
    );
}

#[tokio::test(start_paused = true)]
async fn log_lines_name_the_build_that_runs_whichever_build_the_alloc_names() {
    let logs = LogCapture::start();
    let loaded = caravan_host::runtime::component_sha256(&std::fs::read(SLEEPER).unwrap());
    let asked_for = |sha256: Option<String>| {
        let mut alloc = alloc(SLEEPER, &["web"], &[("run_for", "1s")]);
        alloc.runner_sha256 = sha256;
        alloc
    };
    // Named from the start (the span is made with it), recorded when loaded (none named),
    // and recorded over another that was named.
    for (case, sha256) in [
        ("named", Some(loaded.clone())),
        ("unnamed", None),
        ("another", Some("ab".repeat(32))),
    ] {
        let started = start(asked_for(sha256), None);
        let state = started.stopped().await;
        assert_eq!(
            state.client_status,
            ClientStatus::Complete,
            "{case}: {state:?}"
        );
        let lines = logs.with_message("task web started; runs for 1000ms");
        let line = lines
            .iter()
            .find(|line| line["span"]["alloc_id"] == started.alloc.id.as_str())
            .unwrap_or_else(|| panic!("{case}: no line of the alloc in {lines:?}"));
        assert_eq!(
            line["span"]["runner_sha256"],
            loaded[..12],
            "{case}: {line}"
        );
    }
}
