//! The contract checker behind `caravan runner check`: drives a runner component through
//! the contract of `wit/runner.wit` and says, check by check, what it does right and wrong.
//!
//! Required checks: it loads (the world matches), it reports `running`, it survives an
//! `update` and a `signal`, and it answers `kill` with a terminal state within the kill
//! timeout. Optional checks: it saves a checkpoint on `shutdown` and resumes from it, and
//! its log lines arrive. The runs use the same factory as the client, so what passes here
//! behaves the same under an agent.
//!
//! It is a library module rather than part of `cli/` because the integration tests (and
//! any other tool) call [`check`] directly, with no process, stdout or signals. It returns
//! results and never prints, exits or handles signals: `cli::check` does that.

use crate::alloc_logs::AllocLogs;
use crate::allocrunner::{
    AllocRunner, AllocRunnerConfig, CheckpointSaved, StateUpdater, alloc_span, checkpoint_kept,
};
use crate::locks::LockUnpoisoned;
use crate::runtime::{Runtime, RuntimeConfig, WasmAllocRunner, WasmAllocRunnerFactory};
use crate::structs::{Alloc, AllocState, ClientStatus, Limits, Task};
use crate::units::format_duration;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How long a runner may take to report `running`.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a runner must stay up after an update and a signal to have survived them.
const SURVIVE_WINDOW: Duration = Duration::from_millis(300);

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// What was checked, as printed.
    pub name: &'static str,
    /// Required checks decide the exit status; optional ones only inform.
    pub required: bool,
    /// Passed or not.
    pub passed: bool,
    /// What happened (on failure: what was expected and what happened instead).
    pub detail: String,
}

impl CheckResult {
    /// The line printed for this check.
    pub fn line(&self) -> String {
        let verdict = match (self.passed, self.required) {
            (true, _) => "PASS",
            (false, true) => "FAIL",
            (false, false) => "SKIP",
        };
        let kind = if self.required { "" } else { " (optional)" };
        format!("{verdict}  {}{kind}: {}", self.name, self.detail)
    }
}

/// Records every state and checkpoint of one run.
#[derive(Default)]
struct Observer {
    states: watch::Sender<Vec<AllocState>>,
    checkpoint: Mutex<Option<Vec<u8>>>,
}

impl StateUpdater for Observer {
    fn alloc_state_updated(&self, _alloc_id: &str, state: &AllocState) {
        self.states.send_modify(|states| states.push(state.clone()));
    }

    fn checkpoint_saved(&self, _alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        *self.checkpoint.lock_unpoisoned() = Some(data.to_vec());
        checkpoint_kept()
    }
}

impl Observer {
    fn reported_running(&self) -> bool {
        self.states
            .borrow()
            .iter()
            .any(|s| s.client_status == ClientStatus::Running)
    }

    async fn wait_running(&self, runner: &WasmAllocRunner) -> Result<(), String> {
        let mut states = self.states.subscribe();
        let stopped = runner.wait();
        let reported =
            states.wait_for(|s| s.iter().any(|s| s.client_status == ClientStatus::Running));
        tokio::select! {
            _ = tokio::time::timeout(START_TIMEOUT, reported) => {}
            _ = stopped.wait() => {}
        }
        // A runner may report `running` and stop at once: what it reported is what counts.
        if self.reported_running() {
            return Ok(());
        }
        if runner.wait().is_set() {
            let state = runner.alloc_state();
            return Err(format!(
                "expected a `running` report; the runner stopped first: {} ({})",
                state.client_status, state.description
            ));
        }
        Err(format!(
            "expected a `running` report within {}; none came",
            format_duration(START_TIMEOUT)
        ))
    }
}

/// The runtime, data dir and factory the checks share.
struct Harness {
    factory: WasmAllocRunnerFactory,
    data_dir: crate::fs_tree::TempTree,
    alloc_logs: AllocLogs,
    runner_path: String,
    runs: usize,
    limits: Limits,
}

impl Harness {
    fn start(
        &mut self,
        restored: Option<Vec<u8>>,
    ) -> anyhow::Result<(Arc<WasmAllocRunner>, Arc<Observer>)> {
        self.runs += 1;
        let alloc = Arc::new(Alloc::new(
            Self::alloc_id(self.runs),
            "runner-check",
            self.runner_path.clone(),
            vec![Task::named("main")],
        ));
        let observer = Arc::new(Observer::default());
        let config = AllocRunnerConfig {
            span: alloc_span(&alloc),
            alloc_dir: self.data_dir.path().join(&alloc.id),
            log_writer: Some(self.alloc_logs.writer(&alloc.id)),
            alloc,
            state_updater: observer.clone(),
            limits: self.limits,
            restored,
            last_state: None,
        };
        let runner = self.factory.build(config)?;
        runner.run();
        Ok((runner, observer))
    }

    fn alloc_id(run: usize) -> String {
        format!("check-{run}")
    }

    /// Lines in the log files of every run so far, each written before the call.
    async fn log_lines(&self) -> usize {
        let mut lines = 0;
        for run in 1..=self.runs {
            let text = self.alloc_logs.read(&Self::alloc_id(run)).await;
            lines += String::from_utf8_lossy(&text.unwrap_or_default())
                .lines()
                .count();
        }
        lines
    }
}

fn result(name: &'static str, required: bool, outcome: Result<String, String>) -> CheckResult {
    match outcome {
        Ok(detail) => CheckResult {
            name,
            required,
            passed: true,
            detail,
        },
        Err(detail) => CheckResult {
            name,
            required,
            passed: false,
            detail,
        },
    }
}

/// Runs every check against the component at `path`, giving `kill` and `shutdown`
/// `kill_timeout`; stops early when the component cannot load. Compiled code is kept in
/// `cache_dir` when given.
pub async fn check(
    path: &Path,
    kill_timeout: Duration,
    cache_dir: Option<PathBuf>,
) -> anyhow::Result<Vec<CheckResult>> {
    let runtime = Runtime::new(&RuntimeConfig {
        max_live_allocs: 8,
        cache_dir,
        ..RuntimeConfig::default()
    })?;
    let mut results = Vec::new();
    let loaded = runtime.load_file(path);
    results.push(result(
        "instantiates",
        true,
        loaded
            .map(|_| "exports caravan:runner/runner and its imports link".into())
            .map_err(|e| e.to_string()),
    ));
    if !results[0].passed {
        return Ok(results);
    }
    let data_dir = crate::fs_tree::TempTree::new("caravan-check-")?;
    let mut harness = Harness {
        factory: WasmAllocRunnerFactory::new(runtime),
        alloc_logs: AllocLogs::under_data_dir(data_dir.path()),
        data_dir,
        runner_path: path.display().to_string(),
        runs: 0,
        limits: Limits {
            kill_timeout,
            ..Limits::default()
        },
    };

    // Run 1: running, update and signal, kill.
    let (runner, observer) = harness.start(None)?;
    let running = observer.wait_running(&runner).await;
    let is_running = running.is_ok();
    results.push(result(
        "reports running",
        true,
        running.map(|()| "reported `running`".into()),
    ));
    let survived = if !is_running {
        Err("not checked: the runner never reported `running`".into())
    } else {
        let alloc = runner.alloc();
        runner.update(Arc::new(Alloc {
            modify_index: alloc.modify_index + 1,
            ..Alloc::clone(&alloc)
        }));
        // Refused only when the runner stopped meanwhile, which the wait below reports.
        let _ = runner.signal(None, "SIGHUP");
        let stopped = runner.wait();
        match tokio::time::timeout(SURVIVE_WINDOW, stopped.wait()).await {
            Err(_) => Ok("still running after an `update` and a `signal`".into()),
            Ok(()) => {
                let state = runner.alloc_state();
                Err(format!(
                    "expected to keep running after an `update` and a `signal`; it stopped: {} ({})",
                    state.client_status, state.description
                ))
            }
        }
    };
    results.push(result("survives update and signal", true, survived));
    runner.kill();
    let killed = match tokio::time::timeout(
        kill_timeout + Duration::from_secs(1),
        runner.wait().wait(),
    )
    .await
    {
        Err(_) => Err(format!(
            "expected to stop within the kill timeout of {}; it did not",
            format_duration(kill_timeout)
        )),
        Ok(()) => {
            let state = runner.alloc_state();
            if state
                .description
                .starts_with("runner did not stop within the kill timeout")
            {
                Err(format!(
                    "expected `run` to return within the kill timeout of {}; the host had to tear it down",
                    format_duration(kill_timeout)
                ))
            } else if !state.client_status.is_terminal() {
                Err(format!(
                    "expected a terminal state after `kill`; it ended {}",
                    state.client_status
                ))
            } else if !is_running {
                Err(format!(
                    "not checked: the runner stopped before `kill` ({}: {})",
                    state.client_status, state.description
                ))
            } else {
                Ok(format!(
                    "returned with `{}` ({})",
                    state.client_status, state.description
                ))
            }
        }
    };
    results.push(result("answers kill", true, killed));

    // Run 2: shutdown, checkpoint, restore.
    let (runner, observer) = harness.start(None)?;
    let resumed = if observer.wait_running(&runner).await.is_err() {
        Err("not checked: the runner never reported `running`".to_string())
    } else {
        runner.shutdown();
        let _ = tokio::time::timeout(
            kill_timeout + Duration::from_secs(1),
            runner.shutdown_done().wait(),
        )
        .await;
        let checkpoint = observer.checkpoint.lock_unpoisoned().clone();
        match checkpoint {
            None => Err(
                "no checkpoint was saved on `shutdown` (fine for a runner with nothing to resume)"
                    .to_string(),
            ),
            Some(bytes) => {
                let size = bytes.len();
                let (restored, restored_observer) = harness.start(Some(bytes))?;
                let outcome = restored_observer.wait_running(&restored).await;
                restored.kill();
                restored.wait().wait().await;
                outcome.map(|()| format!("saved {size} bytes on `shutdown` and reported `running` when given them back"))
            }
        }
    };
    results.push(result("checkpoints and resumes", false, resumed));
    runner.kill();
    runner.wait().wait().await;

    let lines = harness.log_lines().await;
    let logs = if lines > 0 {
        Ok(format!("{lines} log lines arrived"))
    } else {
        Err("the runner logged nothing".to_string())
    };
    results.push(result("logs arrive", false, logs));
    Ok(results)
}
