//! [`EmptyAllocRunner`]: a native runner that does nothing, for tests and simulators.

use super::{
    AllocRunner, AllocRunnerConfig, Latch, LatchTrigger, NotRunningReason, StateUpdater,
    TaskActionError, signal_name, target_tasks,
};
use crate::model::structs::{Alloc, AllocState, ClientStatus};
use crate::util::locks::LockUnpoisoned;
use std::sync::{Arc, Mutex};

/// Reports `running` when started and stays there until killed (`complete`) or shut down;
/// it holds no sandbox, so a simulator can run tens of thousands of them. Its state and
/// latches behave as the [`AllocRunner`] contract says, which makes it the reference for
/// what the client may rely on.
pub struct EmptyAllocRunner {
    alloc: Mutex<Arc<Alloc>>,
    state: Mutex<AllocState>,
    state_updater: Arc<dyn StateUpdater>,
    stopped: LatchTrigger,
    destroyed: LatchTrigger,
}

impl EmptyAllocRunner {
    /// A runner for `config.alloc`; nothing happens until [`AllocRunner::run`].
    /// A restored terminal alloc starts stopped, in its final state.
    pub fn new(config: AllocRunnerConfig) -> Self {
        let state = config.last_state.unwrap_or_else(AllocState::pending);
        let stopped = Latch::new().0;
        if state.client_status.is_terminal() {
            stopped.set();
        }
        EmptyAllocRunner {
            alloc: Mutex::new(config.alloc),
            state: Mutex::new(state),
            state_updater: config.state_updater,
            stopped,
            destroyed: Latch::new().0,
        }
    }

    fn set_status(&self, status: ClientStatus, description: &str) {
        let state = {
            let mut state = self.state.lock_unpoisoned();
            if state.client_status.is_terminal() || state.client_status == status {
                return;
            }
            state.client_status = status;
            state.description = description.to_string();
            state.clone()
        };
        let alloc_id = self.alloc().id.clone();
        self.state_updater.alloc_state_updated(&alloc_id, &state);
    }

    fn kill(&self) {
        self.set_status(ClientStatus::Complete, "alloc was stopped");
        self.stopped.set();
    }

    /// Answers a signal or a restart for `task` as the contract says; an accepted one is
    /// dropped, as there is no task to deliver it to.
    fn task_action(&self, task: Option<&str>) -> Result<(), TaskActionError> {
        let alloc = self.alloc();
        target_tasks(&alloc, task)?;
        let status = self.alloc_state().client_status;
        let reason = if status.is_terminal() {
            NotRunningReason::Finished(status)
        } else if self.stopped.is_set() {
            NotRunningReason::Stopping
        } else if status == ClientStatus::Pending {
            NotRunningReason::NotStarted
        } else {
            return Ok(());
        };
        Err(TaskActionError::NotRunning {
            alloc_id: alloc.id.clone(),
            reason,
        })
    }
}

impl AllocRunner for EmptyAllocRunner {
    fn alloc(&self) -> Arc<Alloc> {
        self.alloc.lock_unpoisoned().clone()
    }

    fn run(&self) {
        if self.alloc().desired_status.is_stop() {
            self.kill();
        } else if !self.stopped.is_set() {
            self.set_status(ClientStatus::Running, "Tasks are running");
        }
    }

    fn update(&self, alloc: Arc<Alloc>) {
        let stop = {
            let mut current = self.alloc.lock_unpoisoned();
            if alloc.modify_index <= current.modify_index {
                return;
            }
            *current = alloc;
            current.desired_status.is_stop()
        };
        if stop {
            self.kill();
        }
    }

    fn shutdown(&self) {
        self.stopped.set();
    }

    fn signal(&self, task: Option<&str>, signal: &str) -> Result<(), TaskActionError> {
        signal_name(signal)?;
        self.task_action(task)
    }

    fn restart_task(&self, task: Option<&str>) -> Result<(), TaskActionError> {
        self.task_action(task)
    }

    fn destroy(&self) {
        self.kill();
        self.destroyed.set();
    }

    fn alloc_state(&self) -> AllocState {
        self.state.lock_unpoisoned().clone()
    }

    fn is_destroyed(&self) -> bool {
        self.destroyed.is_set()
    }

    fn wait(&self) -> Latch {
        self.stopped.latch()
    }

    fn shutdown_done(&self) -> Latch {
        self.stopped.latch()
    }

    fn destroyed(&self) -> Latch {
        self.destroyed.latch()
    }
}
