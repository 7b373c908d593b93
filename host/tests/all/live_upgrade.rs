//! Upgrades in place (issue 15, part 5): an update naming a new build of a running alloc's
//! runner shuts the old build down, takes its checkpoint and starts the new build from it,
//! same alloc; a new build that fails before it reports `running` is rolled back and the
//! alloc keeps running on the old one. Real runners under paused tokio time.

use crate::support::*;
use caravan_host::allocrunner::{AllocRunner, UpgradeOutcome, UpgradeReport};
use caravan_host::model::structs::{Alloc, ClientStatus};
use caravan_test_artifacts::{FIXTURE_TRAP, SLEEPER, STATEFUL};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The count of the runner's last checkpoint (the stateful runner saves its count as text).
fn last_count(started: &Started) -> u64 {
    started
        .recorder
        .last_checkpoint()
        .map(|bytes| String::from_utf8(bytes).unwrap().parse().unwrap())
        .unwrap_or(0)
}

async fn counted_to(started: &Started, count: u64) {
    eventually(&format!("a checkpoint of count {count}"), || {
        last_count(started) >= count
    })
    .await;
}

/// The next version of `started`'s alloc, running `runner` instead.
fn next_version(started: &Started, runner: &Path) -> Arc<Alloc> {
    let current = started.runner.alloc();
    Arc::new(Alloc {
        runner: runner.display().to_string(),
        modify_index: current.modify_index + 1,
        ..Alloc::clone(&current)
    })
}

async fn upgrade_settled(started: &Started) -> UpgradeReport {
    eventually("the upgrade to settle", || {
        started
            .runner
            .last_upgrade()
            .is_some_and(|u| u.outcome != UpgradeOutcome::InProgress)
    })
    .await;
    started.runner.last_upgrade().unwrap()
}

fn event_kinds(started: &Started) -> Vec<String> {
    started.runner.alloc_state().task_states[0]
        .events
        .iter()
        .map(|e| e.kind.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_new_build_takes_over_from_the_checkpoint_of_the_old_one() {
    let logs = LogCapture::start();
    let builds = tempfile::tempdir().unwrap();
    let first = copy_of(STATEFUL, builds.path(), "first.wasm");
    let second = new_build_of(STATEFUL, builds.path(), "second.wasm");
    let started = start(
        alloc(first.to_str().unwrap(), &["main"], &[("tick_every", "100")]),
        None,
    );
    counted_to(&started, 3).await;
    let old_build = started.runner.runner_sha256().unwrap();

    started.runner.update(next_version(&started, &second));
    let upgrade = upgrade_settled(&started).await;

    assert_eq!(upgrade.outcome, UpgradeOutcome::Done, "{upgrade:?}");
    assert_eq!(upgrade.from_sha256, old_build);
    let new_build = started.runner.runner_sha256().unwrap();
    assert_ne!(new_build, old_build, "the alloc runs the new build");
    assert_eq!(upgrade.to, new_build);
    let resumed = logs.with_message("resuming from checkpoint at count");
    assert_eq!(
        resumed.len(),
        1,
        "the new build starts from the old one's checkpoint"
    );
    let at = count_in(message(&resumed[0]));
    assert!(at >= 3, "{}", message(&resumed[0]));
    counted_to(&started, at + 2).await;
    let state = started.runner.alloc_state();
    assert_eq!(state.client_status, ClientStatus::Running, "{state:?}");
    assert!(event_kinds(&started).contains(&"Upgrading".to_string()));
    started.runner.kill();
    assert_eq!(
        started.stopped().await.client_status,
        ClientStatus::Complete
    );
    // Same alloc, same log: the first build's lines and the second's are in one file.
    let log = started.log_file_text().await;
    assert!(
        log.contains("tick 1") && log.contains("resuming from checkpoint"),
        "{log}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_build_that_fails_before_running_is_rolled_back_and_the_alloc_runs_on() {
    let logs = LogCapture::start();
    // The trap fixture reads `when`; the stateful runner ignores it.
    let started = start(
        alloc(
            STATEFUL,
            &["main"],
            &[("tick_every", "100"), ("when", "start")],
        ),
        None,
    );
    counted_to(&started, 3).await;
    let old_build = started.runner.runner_sha256().unwrap();

    started
        .runner
        .update(next_version(&started, Path::new(FIXTURE_TRAP)));
    let upgrade = upgrade_settled(&started).await;

    let UpgradeOutcome::Failed(why) = &upgrade.outcome else {
        panic!("the upgrade did not fail: {upgrade:?}");
    };
    assert!(
        why.contains("failed before it reported running (wasm trap")
            && why.ends_with(&format!("rolled back to build {}", &old_build[..12])),
        "{why}"
    );
    assert_eq!(started.runner.runner_sha256().unwrap(), old_build);
    assert_eq!(
        logs.with_message("the trap fixture panics on purpose")
            .len(),
        1,
        "the new build ran once"
    );
    let resumed = logs.with_message("resuming from checkpoint at count");
    assert_eq!(
        resumed.len(),
        1,
        "the old build resumes from its checkpoint"
    );
    let at = count_in(message(&resumed[0]));
    counted_to(&started, at + 2).await;
    let state = started.runner.alloc_state();
    assert_eq!(state.client_status, ClientStatus::Running, "{state:?}");
    assert!(event_kinds(&started).contains(&"Upgrade Failed".to_string()));

    started.runner.kill();
    assert_eq!(
        started.stopped().await.client_status,
        ClientStatus::Complete
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_config_carried_in_place_starts_the_same_build_from_its_checkpoint() {
    let logs = LogCapture::start();
    let started = start(alloc(STATEFUL, &["main"], &[("tick_every", "100")]), None);
    counted_to(&started, 3).await;

    // What the server sends for a job with `[job.update] carry_checkpoint = true`.
    let current = started.runner.alloc();
    let at = last_count(&started);
    let stop_after = (at + 20).to_string();
    let mut tasks = current.tasks.clone();
    tasks[0]
        .config
        .push(("stop_after".into(), stop_after.clone()));
    started.runner.update(Arc::new(Alloc {
        tasks,
        modify_index: current.modify_index + 1,
        ..Alloc::clone(&current)
    }));

    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Complete, "{state:?}");
    assert_eq!(
        state.description,
        format!("counted to {stop_after}"),
        "the new config counts"
    );
    assert_eq!(
        logs.with_message("resuming from checkpoint at count").len(),
        1,
        "from the old run's checkpoint"
    );
    let upgrade = started.runner.last_upgrade().unwrap();
    assert_eq!(upgrade.outcome, UpgradeOutcome::Done);
    assert_eq!(upgrade.from_sha256, upgrade.to, "the same build");
    assert!(event_kinds(&started).contains(&"Upgrading".to_string()));
}

#[tokio::test(start_paused = true)]
async fn an_old_build_that_ignores_the_shutdown_is_torn_down_at_the_kill_timeout() {
    let logs = LogCapture::start();
    let started = start(hostile_attack("block-after-shutdown", &[]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    let begun = tokio::time::Instant::now();

    started
        .runner
        .update(next_version(&started, Path::new(SLEEPER)));
    let upgrade = upgrade_settled(&started).await;

    assert_eq!(upgrade.outcome, UpgradeOutcome::Done, "{upgrade:?}");
    assert!(
        begun.elapsed() >= std::time::Duration::from_secs(5),
        "the old build had its kill timeout: {:?}",
        begun.elapsed()
    );
    assert_eq!(
        logs.with_message("did not return within the kill timeout after the upgrade's shutdown")
            .len(),
        1
    );
    assert_eq!(
        logs.with_message("task main started; runs until killed")
            .len(),
        1,
        "the new build runs"
    );
    started.runner.kill();
    assert_eq!(
        started.stopped().await.client_status,
        ClientStatus::Complete
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_run_that_reports_failed_first_is_rolled_back_and_the_server_never_sees_it_fail() {
    let logs = LogCapture::start();
    let started = start(alloc(SLEEPER, &["web"], &[("log_every", "100ms")]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;

    // A config the runner refuses: the SDK reports `failed`, then returns the error.
    let current = started.runner.alloc();
    let mut tasks = current.tasks.clone();
    tasks[0].config = vec![("run_for".into(), "soon".into())];
    started.runner.update(Arc::new(Alloc {
        tasks,
        modify_index: current.modify_index + 1,
        ..Alloc::clone(&current)
    }));
    let upgrade = upgrade_settled(&started).await;

    let UpgradeOutcome::Failed(why) = &upgrade.outcome else {
        panic!("the upgrade did not fail: {upgrade:?}");
    };
    assert!(why.contains("run_for: \"soon\" is not a duration"), "{why}");
    eventually("the old config running again", || {
        logs.with_message("task web started; runs until killed")
            .len()
            == 2
    })
    .await;
    let history = started.recorder.history.lock().unwrap().clone();
    assert!(
        history
            .iter()
            .all(|s| s.client_status != ClientStatus::Failed),
        "the new run's failure never left the node: {history:#?}"
    );
    assert_eq!(
        started.runner.alloc_state().client_status,
        ClientStatus::Running
    );
    started.runner.kill();
    assert_eq!(
        started.stopped().await.client_status,
        ClientStatus::Complete
    );
}

#[tokio::test(start_paused = true)]
async fn a_build_that_cannot_be_loaded_never_stops_the_running_one() {
    let logs = LogCapture::start();
    let builds = tempfile::tempdir().unwrap();
    let not_a_component = builds.path().join("broken.wasm");
    std::fs::write(&not_a_component, b"not wasm").unwrap();
    let started = start(alloc(STATEFUL, &["main"], &[("tick_every", "100")]), None);
    counted_to(&started, 2).await;

    started
        .runner
        .update(next_version(&started, &not_a_component));
    let upgrade = upgrade_settled(&started).await;

    let UpgradeOutcome::Failed(why) = &upgrade.outcome else {
        panic!("the upgrade did not fail: {upgrade:?}");
    };
    assert!(why.contains("broken.wasm"), "{why}");
    let before = last_count(&started);
    counted_to(&started, before + 2).await;
    assert!(
        logs.with_message("resuming from checkpoint").is_empty(),
        "the running build was never asked to stop"
    );
    assert_eq!(
        started.runner.alloc_state().client_status,
        ClientStatus::Running
    );
    started.runner.kill();
    started.stopped().await;
}

#[tokio::test(start_paused = true)]
async fn a_stop_while_the_new_build_loads_stops_the_alloc_without_upgrading_it() {
    let _logs = LogCapture::start();
    let builds = tempfile::tempdir().unwrap();
    let second = new_build_of(STATEFUL, builds.path(), "second.wasm");
    let started = start(alloc(STATEFUL, &["main"], &[("tick_every", "100")]), None);
    counted_to(&started, 1).await;

    started.runner.update(next_version(&started, &second));
    started.runner.kill();

    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Complete, "{state:?}");
    let upgrade = upgrade_settled(&started).await;
    assert!(
        matches!(upgrade.outcome, UpgradeOutcome::Failed(_)),
        "{upgrade:?}"
    );
}

/// The operator's path, through the real binary: `job run` of the same job file after a
/// rebuild of its runner upgrades the alloc in place, and `alloc status` says so.
#[test]
fn job_run_after_a_rebuild_upgrades_the_running_alloc_and_it_counts_on() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let runner = copy_of(STATEFUL, dir.path(), "counter.wasm");
    let job_file = dir.path().join("counter.toml");
    std::fs::write(
        &job_file,
        "[job]\nid = \"counter\"\ntype = \"service\"\ncount = 1\nrunner = \"counter.wasm\"\n\
         [[job.tasks]]\nname = \"count\"\nconfig = { tick_every = \"300\" }\n",
    )
    .unwrap();
    let job_file = job_file.to_str().unwrap();
    let output = |args: &[&str]| {
        let output = agent.caravan(args);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        text
    };
    output(&["job", "run", job_file]);
    // A few counts in, so that the new build has a count to carry on from.
    agent.wait_for("tick 4", |line| message(line) == "tick 4");

    new_build_of(STATEFUL, dir.path(), "counter.wasm");
    assert_eq!(runner, dir.path().join("counter.wasm"));
    let plan = output(&["job", "plan", job_file]);
    assert!(
        plan.contains("upgraded in place") && plan.contains("upgrade 1 allocs in place"),
        "{plan}"
    );
    let run = output(&["job", "run", job_file]);
    assert!(
        run.contains("0 allocs placed, 0 stopped, 1 upgraded in place"),
        "{run}"
    );
    let (resumed, _) = agent.wait_for("the new build's resume", |line| {
        message(line).starts_with("resuming from checkpoint at count")
    });
    let at = count_in(message(&resumed));
    assert!(at >= 4, "{resumed}");
    let next_tick = format!("tick {}", at + 1);
    agent.wait_for(&next_tick, |line| message(line) == next_tick);

    let status: Value =
        serde_json::from_str(&output(&["job", "status", "counter", "--json"])).unwrap();
    let alloc = &status["allocations"][0];
    assert_eq!(alloc["job_version"], 2, "{status}");
    assert_eq!(alloc["client_status"], "running", "{status}");
    // The task event reaches the server with the client's next typical update.
    let alloc_id = alloc["id"].as_str().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let alloc_status = loop {
        let alloc_status = output(&["alloc", "status", alloc_id]);
        if alloc_status.contains("Upgrading") || std::time::Instant::now() > deadline {
            break alloc_status;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(
        alloc_status.contains("Upgrading  Runner upgraded in place from build"),
        "the task event: {alloc_status}"
    );
    assert!(
        alloc_status.contains("Last Upgrade") && alloc_status.contains("= done: "),
        "{alloc_status}"
    );
}

/// The author's loop: `caravan run --watch` upgrades the running alloc each time the
/// component file is rebuilt, from its checkpoint, and a Ctrl-C ends it as usual.
#[test]
fn run_watch_upgrades_in_place_when_the_component_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let runner = copy_of(STATEFUL, dir.path(), "counter.wasm");
    let mut child = crate::etcd::dies_with_its_parent(&mut caravan_command())
        .args([
            "run",
            runner.to_str().unwrap(),
            "--config",
            "tick_every=200",
        ])
        .args(["--watch", "--log-json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stderr_lines(&mut child);
    let is =
        |text: &'static str| move |line: &str| line.contains(&format!("\"message\":\"{text}\""));
    wait_for_line(&lines, "tick 2", is("tick 2"));

    new_build_of(STATEFUL, dir.path(), "counter.wasm");
    let (resumed, _) = wait_for_line(&lines, "the new build's resume", |line| {
        line.contains("resuming from checkpoint at count")
    });
    let resumed: Value = serde_json::from_str(&resumed).unwrap();
    let at = count_in(message(&resumed));
    assert!(at >= 2, "{resumed}");
    let next_tick = format!("\"message\":\"tick {}\"", at + 1);
    wait_for_line(&lines, "the next tick", |line| line.contains(&next_tick));

    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{summary}");
    assert!(
        summary.contains("\"client_status\":\"complete\""),
        "{summary}"
    );
}

/// A copy of the component at `path` in `dir` under `name`.
fn copy_of(path: &str, dir: &Path, name: &str) -> PathBuf {
    let copy = dir.join(name);
    std::fs::copy(path, &copy).unwrap();
    copy
}

/// Another build of the component at `path`: the same code with a custom section added (as
/// a rebuild with another timestamp or path in its debug info differs), written to `dir`
/// under `name`.
pub fn new_build_of(path: &str, dir: &Path, name: &str) -> PathBuf {
    let mut bytes = std::fs::read(path).unwrap();
    let section_name = b"caravan-test-build";
    let payload = name.as_bytes();
    let mut section = Vec::new();
    leb128(&mut section, section_name.len() as u32);
    section.extend_from_slice(section_name);
    section.extend_from_slice(payload);
    bytes.push(0); // a custom section
    leb128(&mut bytes, section.len() as u32);
    bytes.extend_from_slice(&section);
    let build = dir.join(name);
    std::fs::write(&build, bytes).unwrap();
    build
}

/// The count a line such as `resuming from checkpoint at count 7` ends with.
fn count_in(line: &str) -> u64 {
    line.rsplit(' ')
        .next()
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no count at the end of {line:?}"))
}
