//! The Python, JavaScript and C runners through the real binary: `caravan runner check`
//! passes for each, and a `caravan run` of each sleeper sends its guest lines through the
//! host's logger with the right level and alloc id. Every sleeper, Rust's too, takes the same
//! config, refuses bad config in the same words, and has its crash explained alike.

use crate::support::run_caravan;
use caravan_test_artifacts::{TEST_CACHE_DIR, other_language_runner};
use serde_json::Value;

fn runner(language: &str, name: &str) -> String {
    let (path, build) = other_language_runner(language, name);
    assert!(
        std::path::Path::new(&path).is_file(),
        "{path} is missing: build it with `{build}` (./run-tests does)"
    );
    path
}

fn passes_the_checks_and_logs_through_the_host(language: &str) {
    for name in ["minimal", "sleeper"] {
        let path = runner(language, name);
        let check = run_caravan(
            &[
                "runner",
                "check",
                &path,
                "--cache-dir",
                TEST_CACHE_DIR,
                "--duration",
                "1s",
            ],
            None,
        );
        assert_eq!(
            check.status.code(),
            Some(0),
            "{language} {name}: runner check"
        );
        let out = String::from_utf8_lossy(&check.stdout);
        assert!(out.contains("every required check passed"), "{out}");
    }

    let sleeper = runner(language, "sleeper");
    let run = run_caravan(
        &[
            "run",
            &sleeper,
            "--log-json",
            "--cache-dir",
            TEST_CACHE_DIR,
            "--task",
            "web",
            "--task",
            "worker",
            "--config",
            "run_for=2s",
            "--config",
            "log_every=200ms",
            "--config",
            "worker.exit_code=3",
        ],
        None,
    );
    assert_eq!(run.status.code(), Some(1), "a failed task fails the alloc");
    let result: Value = serde_json::from_slice(&run.stdout).expect("a JSON result line");
    assert_eq!(result["client_status"], "failed");
    assert_eq!(result["description"], "Failed tasks: worker");
    let alloc_id = result["alloc_id"].as_str().unwrap();

    let lines: Vec<Value> = String::from_utf8_lossy(&run.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let guest_line = |text: &str| {
        lines
            .iter()
            .find(|l| l["fields"]["message"] == text)
            .unwrap_or_else(|| panic!("{language}: no guest line {text:?}"))
    };
    for (text, level) in [
        ("task web started; runs for 2000ms", "INFO"),
        ("task web still running", "INFO"),
        ("task web finished: Exit Code: 0", "INFO"),
        ("task worker failed: Exit Code: 3", "WARN"),
    ] {
        let line = guest_line(text);
        assert_eq!(line["level"], level, "{language}: {text}");
        assert_eq!(line["span"]["alloc_id"], alloc_id, "{language}: {text}");
        assert_eq!(line["target"], "caravan::guest", "{language}: {text}");
        assert_eq!(line["fields"]["context"], "sleeper", "{language}: {text}");
    }
}

#[test]
fn python_runners_pass_the_checks_and_log_through_the_host() {
    passes_the_checks_and_logs_through_the_host("python");
}

#[test]
fn javascript_runners_pass_the_checks_and_log_through_the_host() {
    passes_the_checks_and_logs_through_the_host("js");
}

#[test]
fn c_runners_pass_the_checks_and_log_through_the_host() {
    passes_the_checks_and_logs_through_the_host("c");
}

/// `caravan run --log-json` of `runner` with one `--config` setting.
fn run_with_config(runner: &str, setting: &str) -> std::process::Output {
    let args = ["run", runner, "--log-json", "--cache-dir", TEST_CACHE_DIR];
    run_caravan(&[&args[..], &["--config", setting]].concat(), None)
}

/// The sleeper of every language: Rust's, then the others'.
fn every_sleeper() -> impl Iterator<Item = (&'static str, String)> {
    std::iter::once(("rust", caravan_test_artifacts::SLEEPER.to_string())).chain(
        caravan_test_artifacts::OTHER_LANGUAGES
            .into_iter()
            .map(|language| (language, runner(language, "sleeper"))),
    )
}

#[test]
fn a_crash_in_any_language_fails_the_alloc_with_the_runners_last_words() {
    // What each language's crash leaves on stderr that says what happened.
    let own_words = |language: &str| match language {
        // The panic hook's location line, then the message.
        "rust" => "panicked at sleeper/src/lib.rs:",
        // The traceback's last line.
        "python" => "RuntimeError: task main crashed on purpose (crash_after 20ms)",
        // componentize-js names the exception it could not return as a runner error.
        "js" => "(received `Error: task main crashed on purpose (crash_after 20ms)`)",
        _ => "task main crashed on purpose (crash_after 20ms)",
    };
    for (language, sleeper) in every_sleeper() {
        let run = run_with_config(&sleeper, "crash_after=20ms");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{language}: {stderr}");
        let result: Value = serde_json::from_slice(&run.stdout).expect("a JSON result line");
        let description = result["description"].as_str().unwrap();
        assert!(
            description.starts_with("wasm trap: wasm `unreachable` instruction executed in ")
                && description.contains("; its last words: ")
                && description.contains(own_words(language))
                && description.contains("task main crashed on purpose"),
            "{language}: {description}\nagent log:\n{stderr}"
        );
        let main = &result["task_states"][0];
        assert_eq!(
            (&main["state"], &main["failed"]),
            (&Value::from("dead"), &Value::from(true)),
            "{language}: the crashed task ends dead and failed: {main}"
        );
        let last_event = main["events"].as_array().unwrap().last().unwrap();
        assert_eq!(last_event["kind"], "Terminated", "{language}: {main}");
        assert_eq!(last_event["message"], result["description"], "{language}");
    }
}

#[test]
fn a_bad_config_gets_the_same_error_from_every_sleeper() {
    for (language, sleeper) in every_sleeper() {
        for (setting, expected) in [
            (
                "run_for=soon",
                r#"invalid config: task "main": run_for: "soon" is not a duration such as 500ms, 5s or 2m"#,
            ),
            (
                "exit_code=3x",
                r#"invalid config: task "main": exit_code: "3x" is not a whole number"#,
            ),
            (
                "crash_after=later",
                r#"invalid config: task "main": crash_after: "later" is not a duration such as 500ms, 5s or 2m"#,
            ),
        ] {
            let run = run_with_config(&sleeper, setting);
            assert_eq!(run.status.code(), Some(1), "{language} {setting}");
            let result: Value = serde_json::from_slice(&run.stdout).unwrap();
            assert_eq!(result["description"], expected, "{language} {setting}");
        }
    }
}
