//! Signals and task restarts, from the runner seam's contract up to the operator's commands:
//! `AllocRunner::signal` / `restart_task` on the empty and wasm runners, the client's
//! `signal_alloc` / `restart_alloc`, and `caravan alloc signal` / `alloc restart` against a
//! real agent running the sleeper.

use crate::support::*;
use caravan_host::agent::Agent;
use caravan_host::agent::config::AgentConfig;
use caravan_host::allocrunner::{
    AllocRunner, AllocRunnerConfig, AllocRunnerFactory, EmptyAllocRunner, NotRunningReason,
    TaskActionError, alloc_span,
};
use caravan_host::client::gc::StatvfsStats;
use caravan_host::client::{Client, ClientConfig};
use caravan_host::model::structs::{Alloc, ClientStatus, Limits};
use caravan_host::runtime::MAX_QUEUED_TASK_ACTIONS;
use caravan_host::testing::InMemoryServer;
use caravan_test_artifacts::{FIXTURE_SPIN_LOOP, SLEEPER};
use serde_json::Value;
use std::sync::Arc;

fn empty_runner(alloc: &Arc<Alloc>) -> EmptyAllocRunner {
    EmptyAllocRunner::new(AllocRunnerConfig {
        alloc: alloc.clone(),
        span: alloc_span(alloc),
        state_updater: Recorder::new(),
        limits: Limits::default(),
        alloc_dir: std::env::temp_dir(),
        restored: None,
        restoring: false,
        last_state: None,
        log_writer: None,
    })
}

fn not_running(alloc: &Alloc, reason: NotRunningReason) -> Result<(), TaskActionError> {
    Err(TaskActionError::NotRunning {
        alloc_id: alloc.id.clone(),
        reason,
    })
}

#[tokio::test]
async fn the_empty_runner_takes_signals_and_restarts_only_while_running() {
    let alloc = Arc::new(alloc("native", &["web", "db"], &[]));
    let runner = empty_runner(&alloc);
    let not_started = not_running(&alloc, NotRunningReason::NotStarted);
    assert_eq!(runner.signal(None, "SIGHUP"), not_started);
    assert_eq!(runner.restart_task(Some("web")), not_started);

    runner.run();
    assert_eq!(runner.signal(None, "SIGUSR1"), Ok(()));
    assert_eq!(runner.signal(Some("db"), "sighup"), Ok(()), "any case");
    assert_eq!(runner.restart_task(None), Ok(()));
    assert_eq!(
        runner.signal(Some("cache"), "SIGHUP"),
        Err(TaskActionError::UnknownTask {
            alloc_id: alloc.id.clone(),
            task: "cache".into(),
            known: "web, db".into(),
        })
    );
    assert_eq!(
        runner.signal(None, "SIGNOPE"),
        Err(TaskActionError::UnknownSignal("SIGNOPE".into()))
    );

    runner.destroy();
    within("destroy", runner.destroyed().wait()).await;
    assert_eq!(
        runner.restart_task(None),
        not_running(&alloc, NotRunningReason::Finished(ClientStatus::Complete))
    );
    assert_eq!(
        runner
            .signal(Some("cache"), "SIGHUP")
            .unwrap_err()
            .to_string(),
        format!(
            "alloc {} has no task named \"cache\"; its tasks are: web, db",
            alloc.id
        ),
        "a bad request is answered as such whatever the runner's state"
    );

    let shut_down = empty_runner(&alloc);
    shut_down.run();
    shut_down.shutdown();
    assert_eq!(
        shut_down.signal(None, "SIGHUP"),
        not_running(&alloc, NotRunningReason::Stopping)
    );
}

#[tokio::test(start_paused = true)]
async fn the_client_finds_the_runner_by_alloc_id_and_says_when_it_has_none() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let factory: AllocRunnerFactory =
        Arc::new(|config| Ok(Arc::new(EmptyAllocRunner::new(config)) as Arc<dyn AllocRunner>));
    let data_dir = tempfile::tempdir().unwrap();
    let mut config = ClientConfig::new("node-1", data_dir.path());
    config.gc = gc_ignoring_this_disk();
    let stats = Arc::new(StatvfsStats::new(data_dir.path()));
    let client = Client::new(config, server.clone(), factory, stats);
    client.start();
    let alloc = alloc("native", &["web"], &[]);
    server.place("node-1", alloc.clone());
    eventually("running", || {
        client.alloc_state(&alloc.id).map(|s| s.client_status) == Some(ClientStatus::Running)
    })
    .await;

    assert_eq!(
        client.signal_alloc(&alloc.id, Some("web"), "SIGUSR1"),
        Ok(())
    );
    assert_eq!(client.restart_alloc(&alloc.id, None), Ok(()));
    assert_eq!(
        client.restart_alloc("nope", None),
        Err(TaskActionError::UnknownAlloc("nope".into()))
    );
    assert_eq!(
        client
            .signal_alloc(&alloc.id, None, "HUP")
            .unwrap_err()
            .to_string(),
        "\"HUP\" is not a signal name; expected one such as SIGHUP, SIGINT, SIGTERM, SIGUSR1"
    );
}

#[tokio::test(start_paused = true)]
async fn the_sleeper_logs_a_signal_and_counts_a_restart() {
    let logs = LogCapture::start();
    let started = start(alloc(SLEEPER, &["web", "worker"], &[]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    started.runner.signal(Some("web"), "sigusr1").unwrap();
    started.runner.restart_task(None).unwrap();
    let restarted = started
        .recorder
        .wait_for("both tasks restarted", |state| {
            state.task_states.iter().all(|t| t.restarts == 1)
        })
        .await;
    let web = &restarted.task_states[0];
    let kinds: Vec<&str> = web.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Received",
            "Started",
            "Signaling",
            "Restart Signaled",
            "Restarting",
            "Started"
        ]
    );
    assert_eq!(web.events[2].message, "Task being sent signal SIGUSR1");
    assert_eq!(
        logs.with_message("received signal SIGUSR1 for task web")
            .len(),
        1
    );
    assert!(logs.with_message("for task worker").is_empty(), "only web");
    assert_eq!(
        logs.with_message("task worker restarted (restart 1)").len(),
        1
    );

    started.runner.kill();
    let state = started.stopped().await;
    assert_eq!(
        started.runner.signal(None, "SIGHUP"),
        not_running(
            &started.alloc,
            NotRunningReason::Finished(state.client_status)
        )
    );
}

#[tokio::test]
async fn signals_a_guest_never_takes_are_refused_once_the_queue_is_full() {
    let _logs = LogCapture::start();
    // Reports running, then computes without ever calling `next-event`, until its CPU budget
    // ends it.
    let mut spinning = alloc(FIXTURE_SPIN_LOOP, &["main"], &[]);
    spinning.limits.cpu = Some(std::time::Duration::from_millis(500));
    let started = start(spinning, None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    for _ in 0..MAX_QUEUED_TASK_ACTIONS {
        started.runner.signal(None, "SIGHUP").unwrap();
    }
    assert_eq!(
        started.runner.signal(None, "SIGHUP"),
        Err(TaskActionError::Busy {
            alloc_id: started.alloc.id.clone(),
            queued: MAX_QUEUED_TASK_ACTIONS,
        }),
        "the queue a busy guest never drains must stay bounded"
    );
    assert_eq!(started.stopped().await.client_status, ClientStatus::Failed);
}

/// Runs `check` until it gives a value, every 100 ms for at most a minute: the agent's
/// server hears of a new state only after the client's next sync.
fn poll<T>(what: &str, check: impl Fn() -> Option<T>) -> T {
    for _ in 0..600 {
        if let Some(found) = check() {
            return found;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).trim().to_string()
}

#[test]
fn an_operator_signals_and_restarts_a_sleeper_alloc_through_the_cli() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let job_file = dir.path().join("sleepy.toml");
    std::fs::write(
        &job_file,
        format!("[job]\nid = \"sleepy\"\ntype = \"service\"\ncount = 1\nrunner = {SLEEPER:?}\n[[job.tasks]]\nname = \"web\"\n"),
    )
    .unwrap();
    let run = agent.caravan(&["job", "run", job_file.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0), "{}", stdout(&run));
    let status = agent.caravan(&["job", "status", "sleepy", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let alloc_id = status["allocations"][0]["id"].as_str().unwrap().to_string();

    let signal = agent.caravan(&["alloc", "signal", "-s", "SIGUSR1", &alloc_id[..8]]);
    assert_eq!(signal.status.code(), Some(0), "{}", stderr(&signal));
    assert_eq!(
        stdout(&signal).trim(),
        format!("alloc {alloc_id}: sent SIGUSR1 to every task")
    );
    agent.wait_for("the guest's signal line", |line| {
        message(line) == "received signal SIGUSR1 for task web"
    });
    poll("the signal line in the alloc's logs", || {
        let logs = agent.caravan(&["alloc", "logs", &alloc_id]);
        stdout(&logs)
            .contains("INFO sleeper: received signal SIGUSR1 for task web")
            .then_some(())
    });

    let restart = agent.caravan(&["alloc", "restart", "--task", "web", &alloc_id]);
    assert_eq!(restart.status.code(), Some(0), "{}", stderr(&restart));
    assert_eq!(
        stdout(&restart).trim(),
        format!("alloc {alloc_id}: asked task web to restart")
    );
    let web = poll("restarts = 1 in alloc status", || {
        let status = agent.caravan(&["alloc", "status", "--json", &alloc_id]);
        let status: Value = serde_json::from_slice(&status.stdout).ok()?;
        let web = status["task_states"][0].clone();
        (web["restarts"] == 1).then_some(web)
    });
    assert_eq!(web["name"], "web");
    assert_eq!(web["state"], "running");
    let kinds: Vec<&str> = web["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(kinds.ends_with(&["Restarting", "Started"]), "{kinds:?}");

    let unknown_alloc = agent.caravan(&["alloc", "signal", "-s", "SIGHUP", "ffffffff"]);
    assert_eq!(unknown_alloc.status.code(), Some(1));
    assert_eq!(
        stderr(&unknown_alloc),
        "error: allocation \"ffffffff\" not found"
    );
    let unknown_task = agent.caravan(&["alloc", "restart", "--task", "db", &alloc_id]);
    assert_eq!(unknown_task.status.code(), Some(1));
    assert_eq!(
        stderr(&unknown_task),
        format!("error: alloc {alloc_id} has no task named \"db\"; its tasks are: web")
    );
    let bad_signal = agent.caravan(&["alloc", "signal", "-s", "USR1", &alloc_id]);
    assert_eq!(bad_signal.status.code(), Some(1));
    assert!(
        stderr(&bad_signal).contains("\"USR1\" is not a signal name"),
        "{}",
        stderr(&bad_signal)
    );

    assert_eq!(
        agent.caravan(&["job", "stop", "sleepy"]).status.code(),
        Some(0)
    );
    let not_running = poll("the stopped alloc to refuse a signal", || {
        let answer = agent.caravan(&["alloc", "signal", &alloc_id, "--verbose"]);
        let error = stderr(&answer);
        error
            .ends_with(" (HTTP 409)")
            .then(|| error.trim_end_matches(" (HTTP 409)").to_string())
    });
    assert!(
        not_running.starts_with(&format!("error: alloc {alloc_id} is not running: it ")),
        "{not_running}"
    );
    agent.stop();
}

#[tokio::test]
async fn the_signal_and_restart_endpoints_need_the_token_and_a_well_formed_body() {
    let _logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig {
        data_dir: data_dir.path().to_path_buf(),
        acl_token: Some("s3cret".into()),
        gc: gc_ignoring_this_disk(),
        ..AgentConfig::default()
    };
    config.bind = "127.0.0.1:0".parse().unwrap();
    let agent = Agent::start(config).await.expect("the agent starts");
    let addr = agent.addr;
    let signal = "/v1/client/allocation/ffffffff/signal";
    let restart = "/v1/client/allocation/ffffffff/restart";
    for path in [signal, restart] {
        let (status, body) = http(addr, "POST", path, Some("{}"), None).await;
        assert_eq!(status, 401, "{path}: {body}");
        let (status, body) = http(addr, "POST", path, Some("{}"), Some("wrong")).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    let token = Some("s3cret");
    let (status, body) = http(addr, "POST", signal, Some(r#"{"task":"web"}"#), token).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("signal")),
        "{body}"
    );
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("missing field `signal`"),
        "{body}"
    );
    let (status, body) = http(addr, "POST", signal, Some(r#"{"signal":"SIGHUP"}"#), token).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("allocation \"ffffffff\" not found"))
    );
    let (status, body) = http(addr, "POST", restart, None, token).await;
    assert_eq!(
        status, 404,
        "no body is every task, then the unknown alloc: {body}"
    );
    agent.stop().await;
}
