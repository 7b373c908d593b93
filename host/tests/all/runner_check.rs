//! `caravan runner check`: the minimal runner passes every required check, and each fixture
//! that breaks a rule fails the check it should.

use crate::support::*;
use caravan_host::check::{CheckResult, check};
use caravan_test_artifacts::{
    FIXTURE_SPIN_LOOP, FIXTURE_TRAP, FIXTURE_WRONG_WORLD, MINIMAL, STATEFUL,
};
use std::path::Path;
use std::time::Duration;

const KILL_TIMEOUT: Duration = Duration::from_millis(300);

async fn results(path: &str) -> Vec<CheckResult> {
    within("the checks", check(Path::new(path), KILL_TIMEOUT, None))
        .await
        .expect("the checks run")
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
            ("survives update and signal", false)
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

#[test]
fn the_command_exits_0_only_when_every_required_check_passes() {
    let run = |path: &str| {
        crate::support::caravan_command()
            .args(["runner", "check", path, "--kill-timeout", "300ms"])
            .output()
            .unwrap()
    };
    let minimal = run(MINIMAL);
    assert_eq!(
        minimal.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&minimal.stdout)
    );
    assert!(String::from_utf8_lossy(&minimal.stdout).contains("PASS  answers kill"));
    let wrong = run(FIXTURE_WRONG_WORLD);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&wrong.stdout).contains("FAIL  instantiates"));
}
