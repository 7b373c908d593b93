//! What the checks run runners with: one runtime and data dir for every run, an observer of
//! each run's reports, and each run's guest log, shown under a failing check.

use crate::alloc_logs::AllocLogs;
use crate::allocrunner::{
    AllocRunner, AllocRunnerConfig, CheckpointSaved, StateUpdater, alloc_span, checkpoint_kept,
};
use crate::model::structs::{Alloc, AllocState, ClientStatus, Limits, Task};
use crate::runtime::{WasmAllocRunner, WasmAllocRunnerFactory};
use crate::util::locks::LockUnpoisoned;
use crate::util::units::format_duration;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// How many of a run's last log lines a failing check shows.
pub(super) const LOG_LINES_SHOWN: usize = 20;

/// Records every state and checkpoint of one run.
#[derive(Default)]
pub(super) struct Observer {
    states: watch::Sender<Vec<AllocState>>,
    pub(super) checkpoint: Mutex<Option<Vec<u8>>>,
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

    /// Waits up to `timeout` for a `running` report; a runner that stops first ends the
    /// wait. `Err` says what happened instead.
    pub(super) async fn wait_running(
        &self,
        runner: &WasmAllocRunner,
        timeout: std::time::Duration,
    ) -> Result<(), String> {
        let mut states = self.states.subscribe();
        let stopped = runner.wait();
        let reported =
            states.wait_for(|s| s.iter().any(|s| s.client_status == ClientStatus::Running));
        tokio::select! {
            _ = tokio::time::timeout(timeout, reported) => {}
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
            format_duration(timeout)
        ))
    }
}

/// One run: its runner, what it reported, and its number (for its log).
pub(super) struct Run {
    pub(super) runner: Arc<WasmAllocRunner>,
    pub(super) observer: Arc<Observer>,
    pub(super) number: usize,
}

/// The runtime, data dir and factory the checks share.
pub(super) struct Harness {
    pub(super) factory: WasmAllocRunnerFactory,
    pub(super) data_dir: crate::util::fs_tree::TempTree,
    pub(super) alloc_logs: AllocLogs,
    pub(super) runner_path: String,
    pub(super) tasks: Vec<Task>,
    /// Every run started, to stop them all at the end.
    pub(super) started: Vec<Arc<WasmAllocRunner>>,
    pub(super) limits: Limits,
}

impl Harness {
    /// Starts a new run of the runner, from `restored` when given.
    pub(super) fn start(&mut self, restored: Option<Vec<u8>>) -> anyhow::Result<Run> {
        let number = self.started.len() + 1;
        let alloc = Arc::new(Alloc::new(
            Self::alloc_id(number),
            "runner-check",
            self.runner_path.clone(),
            self.tasks.clone(),
        ));
        let observer = Arc::new(Observer::default());
        let config = AllocRunnerConfig {
            span: alloc_span(&alloc),
            alloc_dir: self.data_dir.path().join(&alloc.id),
            log_writer: Some(self.alloc_logs.writer(&alloc.id)),
            alloc,
            state_updater: observer.clone(),
            limits: self.limits,
            restoring: restored.is_some(),
            restored,
            last_state: None,
        };
        let runner = self.factory.build(config)?;
        self.started.push(runner.clone());
        runner.run();
        Ok(Run {
            runner,
            observer,
            number,
        })
    }

    /// Kills every run still going and waits for each, at most its kill timeout and a
    /// second: the host tears down one that does not return by then.
    pub(super) async fn stop_all(&self, kill_timeout: std::time::Duration) {
        for runner in &self.started {
            runner.kill();
        }
        for runner in &self.started {
            let _ = tokio::time::timeout(
                kill_timeout + std::time::Duration::from_secs(1),
                runner.wait().wait(),
            )
            .await;
        }
    }

    fn alloc_id(run: usize) -> String {
        format!("check-{run}")
    }

    /// The last lines run `number`'s guest wrote (its log file: stdout, stderr, logging).
    pub(super) async fn log_of(&self, number: usize) -> Vec<String> {
        let text = self
            .alloc_logs
            .read(&Self::alloc_id(number))
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        let first = lines.len().saturating_sub(LOG_LINES_SHOWN);
        lines[first..].iter().map(|l| l.to_string()).collect()
    }

    /// Lines in the log files of every run so far, each written before the call.
    pub(super) async fn log_lines(&self) -> usize {
        let mut lines = 0;
        for run in 1..=self.started.len() {
            let text = self.alloc_logs.read(&Self::alloc_id(run)).await;
            lines += String::from_utf8_lossy(&text.unwrap_or_default())
                .lines()
                .count();
        }
        lines
    }
}
