//! The real `caravan` binary: `caravan run` on each example runner, text and JSON logs, exit
//! statuses, bad input, and Ctrl-C; and the library `run` under each shutdown stage, driven
//! without signals.

use crate::support::{LogCapture, eventually, run_caravan, stderr_lines, wait_for_line, within};
use caravan_host::model::structs::ClientStatus;
use caravan_host::run::{RunOptions, run};
use caravan_host::shutdown::{Shutdown, Stage};
use caravan_test_artifacts::{FIXTURE_WRONG_WORLD, MINIMAL, SLEEPER, STATEFUL};
use serde_json::Value;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn caravan(args: &[&str]) -> Output {
    run_caravan(args, None)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn caravan_run_shows_the_sleepers_logs_and_exits_0_when_complete() {
    let output = caravan(&["run", SLEEPER, "--task", "web", "--config", "run_for=200ms"]);
    assert_eq!(output.status.code(), Some(0));
    let stderr = text(&output.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("task web started; runs for 200ms"))
        .expect("guest line");
    assert!(
        line.contains("INFO") && line.contains("alloc_id="),
        "{line}"
    );
    assert!(text(&output.stdout).contains("complete: All tasks have completed"));
}

#[test]
fn with_log_json_every_line_host_and_guest_is_json() {
    let output = caravan(&[
        "run",
        STATEFUL,
        "--log-json",
        "--config",
        "tick_every=10",
        "--config",
        "stop_after=3",
    ]);
    assert_eq!(output.status.code(), Some(0));
    let summary: Value = serde_json::from_slice(&output.stdout).expect("a JSON summary on stdout");
    assert_eq!(summary["client_status"], "complete");
    let lines: Vec<Value> = text(&output.stderr)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect();
    let tick = lines
        .iter()
        .find(|l| l["fields"]["message"] == "tick 3")
        .expect("the guest's tick line");
    assert_eq!(tick["level"], "INFO");
    assert_eq!(tick["span"]["alloc_id"], summary["alloc_id"]);
    assert!(
        lines.iter().any(|l| l["target"] != "caravan::guest"),
        "host lines are JSON too"
    );
}

#[test]
fn a_failed_alloc_exits_1_and_prints_its_description() {
    let output = caravan(&[
        "run",
        SLEEPER,
        "--config",
        "run_for=10ms",
        "--config",
        "exit_code=2",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stdout).contains("failed: Failed tasks: main"));
}

#[test]
fn bad_input_gets_one_clear_line_and_exit_2() {
    let missing = caravan(&["run", "/no/such.wasm"]);
    assert_eq!(missing.status.code(), Some(2));
    assert_eq!(
        text(&missing.stderr).trim(),
        "error: runner component /no/such.wasm does not exist"
    );

    let wrong = caravan(&["run", FIXTURE_WRONG_WORLD]);
    assert_eq!(wrong.status.code(), Some(2));
    assert!(text(&wrong.stderr).contains("does not export `caravan:runner/runner@0.1.0`"));
    assert!(text(&wrong.stderr).contains("it exports: wasi:cli/run@0.2.0"));

    let bad_limit = caravan(&["run", MINIMAL, "--limit", "memory=lots"]);
    assert_eq!(bad_limit.status.code(), Some(2));
    assert!(text(&bad_limit.stderr).contains("--limit memory=lots"));
}

#[test]
fn ctrl_c_kills_the_minimal_runner_and_exits_with_its_final_state() {
    let mut child = crate::support::caravan_command()
        .args(["run", MINIMAL])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("caravan starts");
    let lines_rx = stderr_lines(&mut child);
    let is_running = |line: &str| {
        line.contains("alloc status changed") && line.contains("client_status=running")
    };
    let (running, mut seen) = wait_for_line(&lines_rx, "running", is_running);
    seen.push(running);
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(child.wait_with_output());
    });
    let output = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("caravan exits after Ctrl-C")
        .unwrap();
    seen.extend(lines_rx.try_iter());
    assert_eq!(output.status.code(), Some(0), "{seen:#?}");
    assert!(
        text(&output.stdout).contains("complete: killed"),
        "{}",
        text(&output.stdout)
    );
    assert!(
        seen.iter()
            .any(|l| l.contains("interrupted: killing the alloc")),
        "{seen:#?}"
    );
}

fn run_options(component: &str) -> RunOptions {
    RunOptions {
        component: component.into(),
        tasks: vec![],
        config: vec![],
        limits: vec![],
        meta: vec![],
        job_id: "run".into(),
        data_dir: None,
        keep: false,
        cache_dir: None,
        watch: false,
    }
}

/// Whether the alloc has reported `running` in the captured log.
fn reported_running(logs: &LogCapture) -> bool {
    logs.with_message("alloc status changed")
        .iter()
        .any(|line| line["fields"]["client_status"] == "running")
}

#[tokio::test]
async fn a_stop_asked_before_the_alloc_starts_starts_nothing() {
    let shutdown = Shutdown::new();
    shutdown.advance_to(Stage::Stopping);
    let error = within("the run", run(run_options(MINIMAL), shutdown.listener()))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "interrupted before the alloc started");
}

#[tokio::test]
async fn stopping_kills_the_alloc_and_returns_its_final_state() {
    let logs = LogCapture::start();
    let shutdown = Shutdown::new();
    let stop_once_running = async {
        eventually("the alloc reports running", || reported_running(&logs)).await;
        shutdown.escalate();
    };
    let (outcome, ()) = within("the run", async {
        tokio::join!(
            run(run_options(MINIMAL), shutdown.listener()),
            stop_once_running
        )
    })
    .await;
    let (_, state) = outcome.expect("a killed alloc is an outcome, not an error");
    assert_eq!(state.client_status, ClientStatus::Complete);
    assert!(state.description.contains("killed"), "{state:?}");
    assert_eq!(logs.with_message("interrupted: killing the alloc").len(), 1);
}

#[tokio::test]
async fn abandoning_stops_waiting_for_the_killed_alloc() {
    let logs = LogCapture::start();
    let shutdown = Shutdown::new();
    let abandon_once_running = async {
        eventually("the alloc reports running", || reported_running(&logs)).await;
        shutdown.advance_to(Stage::Abandoning);
    };
    let (outcome, ()) = within("the run", async {
        tokio::join!(
            run(run_options(MINIMAL), shutdown.listener()),
            abandon_once_running
        )
    })
    .await;
    assert_eq!(
        outcome.unwrap_err().to_string(),
        "interrupted again: stopped without waiting for the runner"
    );
}

#[test]
fn output_into_a_reader_that_left_ends_the_command_quietly() {
    // `caravan ... | head`: the reader is gone before the command prints anything.
    let closed_stdout = |args: &[&str]| {
        let mut child = crate::support::caravan_command()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("caravan starts");
        drop(child.stdout.take());
        child.wait_with_output().unwrap()
    };
    use std::os::unix::process::ExitStatusExt;
    // A command that only prints ends as Unix tools do: by SIGPIPE.
    let check = closed_stdout(&["runner", "check", MINIMAL, "--kill-timeout", "1s"]);
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.signal(), Some(libc::SIGPIPE), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // `caravan run` finishes its alloc and says how it ended in its exit status.
    let run = closed_stdout(&["run", SLEEPER, "--config", "run_for=10ms"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn caravan_run_says_where_a_runners_alloc_dir_is_and_keep_keeps_it() {
    // A Python runner reaches files (componentize-py imports wasi:filesystem), so it is
    // given an alloc dir.
    let (runner, _) = caravan_test_artifacts::other_language_runner("python", "batch");
    let kept = caravan(&["run", &runner, "--keep"]);
    assert_eq!(kept.status.code(), Some(0), "{}", text(&kept.stderr));
    let line = text(&kept.stderr)
        .lines()
        .find(|l| l.contains("the alloc dir is kept at"))
        .unwrap_or_else(|| panic!("no line says where: {}", text(&kept.stderr)))
        .to_string();
    let dir = line
        .split("(remove ")
        .nth(1)
        .and_then(|rest| rest.split(" when done)").next())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(std::path::Path::new(dir).is_dir(), "kept: {line}");
    std::fs::remove_dir_all(dir).unwrap();

    let removed = caravan(&["run", &runner]);
    assert_eq!(removed.status.code(), Some(0), "{}", text(&removed.stderr));
    assert!(
        text(&removed.stderr).contains("is removed at exit (--keep keeps it"),
        "{}",
        text(&removed.stderr)
    );
}
