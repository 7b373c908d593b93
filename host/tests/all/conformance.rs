//! The four SDKs behave the same (issue 15, part 1): the sleeper and the batch runner of each
//! language (Rust on `caravan-guest`, Python on `caravan_runner`, JavaScript on
//! `caravan-runner.js`, C on `caravan_runner.h`) are driven through one scenario each, under
//! paused time, and what each reports (every state, times left out) and logs must be what the
//! Rust one does, line for line; a checkpoint written by any of them resumes in every other.

use crate::support::*;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::structs::{Alloc, AllocState, ClientStatus, Task};
use caravan_host::runtime::{Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use caravan_test_artifacts::{
    BATCH, OTHER_LANGUAGES, SLEEPER, TEST_CACHE_DIR, other_language_runner,
};
use std::sync::OnceLock;

/// A runtime keeping compiled components in the test cache: a Python or JavaScript runner
/// takes seconds to compile, once per machine.
fn caching_runtime() -> Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            Runtime::new(&RuntimeConfig {
                cache_dir: Some(TEST_CACHE_DIR.into()),
                ..RuntimeConfig::default()
            })
            .expect("runtime")
        })
        .clone()
}

/// `name` (`sleeper` or `batch`) in every language, Rust's first.
fn every_language(name: &str, rust: &str) -> Vec<(&'static str, String)> {
    let mut runners = vec![("rust", rust.to_string())];
    for language in OTHER_LANGUAGES {
        let (path, build) = other_language_runner(language, name);
        assert!(
            std::path::Path::new(&path).is_file(),
            "{path} is missing: build it with `{build}` (./run-tests does)"
        );
        runners.push((language, path));
    }
    runners
}

fn task(name: &str, config: &[(&str, &str)]) -> Task {
    Task {
        name: name.into(),
        config: config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn start_runner(runner: &str, tasks: Vec<Task>, restored: Option<Vec<u8>>) -> Started {
    let alloc = Alloc::new("conformance-alloc", "conformance", runner, tasks);
    start_with(
        WasmAllocRunnerFactory::new(caching_runtime()),
        alloc,
        restored,
    )
}

/// A state as text, its times left out: what must be the same in every language.
fn without_times(state: &AllocState) -> String {
    let mut text = format!("{} {:?}", state.client_status, state.description);
    for task in &state.task_states {
        text.push_str(&format!(
            "\n  {} {:?} failed={} restarts={}",
            task.name, task.state, task.failed, task.restarts
        ));
        for event in &task.events {
            text.push_str(&format!("\n    {}: {}", event.kind, event.message));
        }
    }
    text
}

/// Everything a run reported, times left out.
fn reports(started: &Started) -> Vec<String> {
    let history = started.recorder.history.lock().unwrap();
    history.iter().map(without_times).collect()
}

/// What the runner logged, as `LEVEL context: message` lines.
fn guest_lines(logs: &LogCapture) -> Vec<String> {
    logs.lines()
        .iter()
        .filter(|line| line["target"] == "caravan::guest")
        .map(|line| {
            format!(
                "{} {}: {}",
                line["level"].as_str().unwrap_or_default(),
                line["fields"]["context"].as_str().unwrap_or_default(),
                message(line)
            )
        })
        .collect()
}

/// Asserts every language's `observed` equals Rust's, showing the first difference.
fn assert_all_alike(what: &str, observed: &[(&str, Vec<String>)]) {
    let (_, rust) = &observed[0];
    for (language, lines) in &observed[1..] {
        if lines != rust {
            let at = rust.iter().zip(lines).position(|(a, b)| a != b);
            panic!(
                "{what} of {language} differ from Rust's (first at {at:?}):\n--- rust\n{}\n--- {language}\n{}",
                rust.join("\n"),
                lines.join("\n")
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_sleepers_report_and_log_alike_through_signals_restarts_and_a_failed_task() {
    let mut reported = Vec::new();
    let mut logged = Vec::new();
    for (language, runner) in every_language("sleeper", SLEEPER) {
        let logs = LogCapture::start();
        let tasks = vec![
            task("web", &[("run_for", "3s"), ("log_every", "1s")]),
            task("worker", &[("run_for", "2s"), ("exit_code", "3")]),
        ];
        let started = start_runner(&runner, tasks, None);
        started
            .recorder
            .wait_for_status(ClientStatus::Running)
            .await;
        started.runner.signal(Some("web"), "SIGUSR1").unwrap();
        started
            .recorder
            .wait_for("the signal's event", |s| {
                s.task_states[0]
                    .events
                    .iter()
                    .any(|e| e.kind == "Signaling")
            })
            .await;
        started.runner.restart_task(Some("worker")).unwrap();
        let state = started.stopped().await;
        assert_eq!(
            state.client_status,
            ClientStatus::Failed,
            "{language}: {state:?}"
        );
        assert_eq!(state.description, "Failed tasks: worker", "{language}");
        reported.push((language, reports(&started)));
        logged.push((language, guest_lines(&logs)));
    }
    assert_all_alike("the reported states", &reported);
    assert_all_alike("the log lines", &logged);
}

#[tokio::test(start_paused = true)]
async fn the_sleepers_refuse_bad_config_and_answer_kill_alike() {
    let mut reported = Vec::new();
    for (language, runner) in every_language("sleeper", SLEEPER) {
        let bad = start_runner(&runner, vec![task("web", &[("exit_code", "3x")])], None);
        let state = bad.stopped().await;
        assert_eq!(
            state.description,
            "invalid config: task \"web\": exit_code: \"3x\" is not a whole number",
            "{language}"
        );
        // Quoted as Rust's `{:?}` quotes: the same bytes in every language.
        let odd = vec![task("we\"b", &[("exit_code", "é\"\n\u{1b}\u{85}3")])];
        let state = start_runner(&runner, odd, None).stopped().await;
        assert_eq!(
            state.description,
            r#"invalid config: task "we\"b": exit_code: "é\"\n\u{1b}\u{85}3" is not a whole number"#,
            "{language}"
        );
        for (run_for, why) in [
            ("18446744073709551615h", "is too long"),
            (
                "18446744073709551616ms",
                "is not a duration such as 500ms, 5s or 2m",
            ),
        ] {
            let state = start_runner(&runner, vec![task("web", &[("run_for", run_for)])], None)
                .stopped()
                .await;
            assert_eq!(
                state.description,
                format!("invalid config: task \"web\": run_for: \"{run_for}\" {why}"),
                "{language}"
            );
        }
        let killed = start_runner(&runner, vec![task("web", &[])], None);
        killed.recorder.wait_for_status(ClientStatus::Running).await;
        killed.runner.kill();
        let state = killed.stopped().await;
        assert_eq!(state.client_status, ClientStatus::Complete, "{language}");
        reported.push((language, [reports(&bad), reports(&killed)].concat()));
    }
    assert_all_alike("the reported states", &reported);
}

/// The checkpoint of a batch that has summed 1..1000 of task `a`.
fn batch_checkpoint_at_1001() -> Vec<u8> {
    let sum: u64 = (1..=1000u64).map(|n| n * n).sum();
    format!("caravan-checkpoint v1\na\t1001\t{sum}\n").into_bytes()
}

#[tokio::test(start_paused = true)]
async fn the_batch_runners_compute_report_and_log_alike() {
    let mut reported = Vec::new();
    let mut logged = Vec::new();
    for (language, runner) in every_language("batch", BATCH) {
        let logs = LogCapture::start();
        let tasks = vec![
            task("a", &[("numbers", "2500"), ("chunk", "100")]),
            task("b", &[("numbers", "10")]),
        ];
        let started = start_runner(&runner, tasks, None);
        let state = started.stopped().await;
        assert_eq!(
            state.client_status,
            ClientStatus::Complete,
            "{language}: {state:?}"
        );
        let a = &state.task_states[0];
        assert_eq!(
            a.events.last().unwrap().message,
            "Computed the sum of squares of 1..2500: 5211458750",
            "{language}"
        );
        let bad = start_runner(&runner, vec![task("a", &[("chunk", "0")])], None);
        assert_eq!(
            bad.stopped().await.description,
            "invalid config: task \"a\": chunk: 0 is not at least 1",
            "{language}"
        );
        reported.push((language, [reports(&started), reports(&bad)].concat()));
        logged.push((language, guest_lines(&logs)));
    }
    assert_all_alike("the reported states", &reported);
    assert_all_alike("the log lines", &logged);
}

#[tokio::test(start_paused = true)]
async fn a_batch_checkpoint_written_in_any_language_resumes_in_every_other() {
    let batches = every_language("batch", BATCH);
    for (writer, writer_path) in &batches {
        // Shut down before the first chunk: the checkpoint says where each task was.
        let started = start_runner(writer_path, vec![task("a", &[("numbers", "2000")])], None);
        started.runner.shutdown();
        started.stopped().await;
        let written = started
            .recorder
            .last_checkpoint()
            .unwrap_or_else(|| panic!("{writer}: no checkpoint on shutdown"));
        assert_eq!(
            written,
            b"caravan-checkpoint v1\na\t1\t0\n",
            "{writer}: {}",
            String::from_utf8_lossy(&written)
        );
        for (reader, reader_path) in &batches {
            for checkpoint in [written.clone(), batch_checkpoint_at_1001()] {
                let logs = LogCapture::start();
                let tasks = vec![task("a", &[("numbers", "2000")])];
                let resumed = start_runner(reader_path, tasks, Some(checkpoint.clone()));
                let state = resumed.stopped().await;
                assert_eq!(
                    state.task_states[0].events.last().unwrap().message,
                    "Computed the sum of squares of 1..2000: 2668667000",
                    "{reader} from {writer}'s {}",
                    String::from_utf8_lossy(&checkpoint)
                );
                assert_eq!(logs.with_message("task a resumed at").len(), 1, "{reader}");
            }
        }
    }
    for (language, path) in &batches {
        for (checkpoint, why) in [
            (
                &b"7"[..],
                "the restored checkpoint has no caravan-checkpoint header",
            ),
            (
                b"caravan-checkpoint v4294967296\n",
                "the restored checkpoint has no caravan-checkpoint header",
            ),
            (
                b"caravan-checkpoint v4294967295\n",
                "checkpoint version 4294967295 is not one this runner reads",
            ),
            (
                b"caravan-checkpoint v1\na\t1\n",
                "the restored checkpoint's progress cannot be read",
            ),
            (
                b"caravan-checkpoint v1\na\t-5\t0\n",
                "the restored checkpoint's progress cannot be read",
            ),
        ] {
            let refused = start_runner(path, vec![task("a", &[])], Some(checkpoint.to_vec()));
            assert_eq!(
                refused.stopped().await.description,
                why,
                "{language} given {}",
                String::from_utf8_lossy(checkpoint)
            );
        }
        let no_tasks = start_runner(path, vec![], None).stopped().await;
        assert_eq!(
            (no_tasks.client_status, no_tasks.description.as_str()),
            (ClientStatus::Complete, "All tasks have completed"),
            "{language}: a batch of nothing is done"
        );
    }
}

/// The file-writing batch (issue 44, part 1): each language writes its result through its
/// own way to the alloc dir (Rust's `std::fs`, Python's `open`, C's stdio, JavaScript's
/// `caravan-files.js` in the `file-runner` world), reads it back, and the files, the reports
/// and the log lines are the same bytes in every language.
#[tokio::test(start_paused = true)]
async fn the_batch_runners_write_their_results_to_the_alloc_dir_alike() {
    let mut reported = Vec::new();
    let mut logged = Vec::new();
    for (language, runner) in every_language("batch", BATCH) {
        let logs = LogCapture::start();
        let tasks = vec![
            task("a", &[("result_file", "/alloc/out/deep/result.json")]),
            task("b", &[("numbers", "7"), ("result_file", "/alloc/b.json")]),
        ];
        let started = start_runner(&runner, tasks, None);
        let state = started.stopped().await;
        let alloc_dir = started.data_dir.path().join(&started.alloc.id);
        let read = |path: &str| std::fs::read_to_string(alloc_dir.join(path));
        assert_eq!(
            state.client_status,
            ClientStatus::Complete,
            "{language}: {state:?}\n{}",
            guest_lines(&logs).join("\n")
        );
        assert_eq!(
            read("out/deep/result.json").ok().as_deref(),
            Some("{\"numbers\":1000,\"sum\":333833500}\n"),
            "{language}"
        );
        assert_eq!(
            read("b.json").ok().as_deref(),
            Some("{\"numbers\":7,\"sum\":140}\n"),
            "{language}"
        );

        // Refused alike before anything is written: outside /alloc/, not plainly named, or
        // too long to be said back whole.
        let long = format!("/alloc/{}", "x".repeat(122));
        let mut refusals = Vec::new();
        for (path, why) in [
            (
                "/etc/passwd",
                r#""/etc/passwd" is not a file under /alloc/"#,
            ),
            ("/alloc/", r#""/alloc/" is not a file under /alloc/"#),
            (
                "/alloc/x/../y",
                r#""/alloc/x/../y" is not a file under /alloc/"#,
            ),
            ("/alloc//y", r#""/alloc//y" is not a file under /alloc/"#),
            (
                "/alloc/\u{0}y",
                r#""/alloc/\0y" is not a file under /alloc/"#,
            ),
            (&long, "is longer than 128 bytes"),
        ] {
            let refused = start_runner(&runner, vec![task("a", &[("result_file", path)])], None);
            assert_eq!(
                refused.stopped().await.description,
                format!(r#"invalid config: task "a": result_file: {why}"#),
                "{language}"
            );
            refusals.extend(reports(&refused));
        }
        // Writes that fail fail their task, with the same reason in every language: a
        // directory where the file should be, a file where a directory should be.
        let blocked = vec![
            task("a", &[("numbers", "3"), ("result_file", "/alloc/x/y.json")]),
            task("b", &[("numbers", "3"), ("result_file", "/alloc/x")]),
            task(
                "c",
                &[("numbers", "3"), ("result_file", "/alloc/x/y.json/z")],
            ),
        ];
        let blocked = start_runner(&runner, blocked, None);
        let state = blocked.stopped().await;
        let ends: Vec<&str> = state
            .task_states
            .iter()
            .map(|t| t.events.last().unwrap().message.as_str())
            .collect();
        assert_eq!(
            ends,
            [
                "Computed the sum of squares of 1..3: 14",
                "Cannot write /alloc/x: is-directory",
                "Cannot write /alloc/x/y.json/z: exist",
            ],
            "{language}: {state:?}"
        );
        assert_eq!(state.description, "Failed tasks: b, c", "{language}");
        reported.push((
            language,
            [reports(&started), refusals, reports(&blocked)].concat(),
        ));
        logged.push((language, guest_lines(&logs)));
    }
    assert_all_alike("the reported states", &reported);
    assert_all_alike("the log lines", &logged);
}
