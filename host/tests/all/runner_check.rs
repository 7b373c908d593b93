//! `caravan runner check`: the minimal runner passes every required check, a batch runner
//! is judged as one, a late crash is caught with the runner's own lines, and each fixture
//! that breaks a rule fails the check it should.

use crate::support::*;
use caravan_host::check::{CheckOptions, CheckResult, check};
use caravan_host::model::structs::Task;
use caravan_test_artifacts::{
    FIXTURE_SPIN_LOOP, FIXTURE_TRAP, FIXTURE_WRONG_WORLD, MINIMAL, SLEEPER, STATEFUL,
};
use std::path::Path;
use std::time::Duration;

fn options() -> CheckOptions {
    CheckOptions {
        kill_timeout: Duration::from_millis(300),
        duration: Duration::from_secs(1),
        ..CheckOptions::default()
    }
}

async fn results(path: &str) -> Vec<CheckResult> {
    results_with(path, options()).await
}

async fn results_with(path: &str, options: CheckOptions) -> Vec<CheckResult> {
    within("the checks", check(Path::new(path), &options))
        .await
        .expect("the checks run")
}

/// One task, `main`, with `config`.
fn main_task(config: &[(&str, &str)]) -> Vec<Task> {
    vec![Task {
        name: "main".into(),
        config: config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }]
}

fn named<'a>(results: &'a [CheckResult], name: &str) -> &'a CheckResult {
    results
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no check {name}: {results:#?}"))
}

fn verdicts(results: &[CheckResult]) -> Vec<(&'static str, bool)> {
    results.iter().map(|r| (r.name, r.passed)).collect()
}

#[tokio::test]
async fn the_minimal_runner_passes_every_required_check() {
    let _logs = LogCapture::start();
    let results = results(MINIMAL).await;
    assert!(
        results.iter().filter(|r| r.required).all(|r| r.passed),
        "{results:#?}"
    );
    let optional: Vec<_> = results
        .iter()
        .filter(|r| !r.required)
        .map(|r| r.name)
        .collect();
    assert_eq!(optional, ["checkpoints and resumes", "logs arrive"]);
}

#[tokio::test]
async fn the_stateful_runner_also_passes_the_optional_checkpoint_check() {
    let _logs = LogCapture::start();
    let results = results(STATEFUL).await;
    assert!(results.iter().all(|r| r.passed), "{results:#?}");
}

#[tokio::test]
async fn each_fixture_fails_the_check_it_breaks() {
    let _logs = LogCapture::start();
    let wrong = results(FIXTURE_WRONG_WORLD).await;
    assert_eq!(verdicts(&wrong), [("instantiates", false)]);
    assert!(
        wrong[0]
            .detail
            .contains("does not export `caravan:runner/runner@0.1.0`"),
        "{}",
        wrong[0].detail
    );

    let trap = results(FIXTURE_TRAP).await;
    assert_eq!(
        &verdicts(&trap)[..3],
        [
            ("instantiates", true),
            ("reports running", true),
            ("stays up under events", false)
        ]
    );
    assert!(trap[2].detail.contains("wasm trap"), "{}", trap[2].detail);

    let spin = results(FIXTURE_SPIN_LOOP).await;
    let kill = spin.iter().find(|r| r.name == "answers kill").unwrap();
    assert!(
        !kill.passed && kill.detail.contains("the host had to tear it down"),
        "{kill:?}"
    );
    assert_eq!(kill.line(), format!("FAIL  answers kill: {}", kill.detail));
}

#[tokio::test]
async fn a_batch_runner_that_ends_complete_on_its_own_passes_as_one() {
    let _logs = LogCapture::start();
    let results = results_with(
        SLEEPER,
        CheckOptions {
            tasks: main_task(&[("run_for", "200ms")]),
            ..options()
        },
    )
    .await;
    assert!(
        results.iter().filter(|r| r.required).all(|r| r.passed),
        "{results:#?}"
    );
    let ends = named(&results, "ends on its own");
    assert!(
        ends.detail
            .starts_with("ended complete (All tasks have completed) on its own after"),
        "{ends:?}"
    );
    assert!(
        !results.iter().any(|r| r.name == "stays up under events"),
        "not judged as a service: {results:#?}"
    );
}

#[tokio::test]
async fn a_crash_after_the_start_fails_with_the_runners_own_lines() {
    let _logs = LogCapture::start();
    let results = results_with(
        SLEEPER,
        CheckOptions {
            tasks: main_task(&[("crash_after", "150ms")]),
            // Its `restart-task` (which restarts the sleeper's crash timer) comes at 482ms,
            // long after the crash.
            seed: 22,
            ..options()
        },
    )
    .await;
    let stays = named(&results, "stays up under events");
    assert!(!stays.passed, "{stays:?}");
    assert!(
        // Which event came last depends on the machine's speed; that it stopped does not.
        stays.detail.contains("it stopped")
            && stays
                .detail
                .contains("task main crashed on purpose (crash_after 150ms)")
            && stays.detail.contains("(seed 22)"),
        "{stays:?}"
    );
    assert!(
        stays.log.iter().any(|l| l.contains("panicked at")),
        "the guest's own lines: {:#?}",
        stays.log
    );
}

#[tokio::test]
async fn a_service_judged_as_batch_fails_for_not_ending() {
    let _logs = LogCapture::start();
    let results = results_with(
        SLEEPER,
        CheckOptions {
            batch: true,
            duration: Duration::from_millis(500),
            ..options()
        },
    )
    .await;
    let ends = named(&results, "ends on its own");
    assert!(
        !ends.passed && ends.detail.contains("it was still running"),
        "{ends:?}"
    );
    assert!(named(&results, "answers kill").passed, "{results:#?}");
}

#[test]
fn the_command_exits_0_only_when_every_required_check_passes() {
    let run = |path: &str, more: &[&str]| {
        crate::support::caravan_command()
            .args(["runner", "check", path, "--kill-timeout", "300ms"])
            .args(["--duration", "1s"])
            .args(more)
            .output()
            .unwrap()
    };
    let minimal = run(MINIMAL, &[]);
    assert_eq!(
        minimal.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&minimal.stdout)
    );
    assert!(String::from_utf8_lossy(&minimal.stdout).contains("PASS  answers kill"));
    let wrong = run(FIXTURE_WRONG_WORLD, &[]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&wrong.stdout).contains("FAIL  instantiates"));
    // A failing check shows what the runner said last; the seed replays the event times.
    let crash = run(SLEEPER, &["--config", "crash_after=150ms", "--seed", "22"]);
    let out = String::from_utf8_lossy(&crash.stdout);
    assert_eq!(crash.status.code(), Some(1), "{out}");
    assert!(out.contains("FAIL  stays up under events: "), "{out}");
    assert!(
        out.contains("      | ") && out.contains("panicked at sleeper/src/lib.rs"),
        "{out}"
    );
    assert!(out.contains("failed (events sent with --seed 22)"), "{out}");
}
