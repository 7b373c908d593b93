//! Stateful: counts ticks, checkpoints the count, and resumes from it after a restart.
//!
//! Config (from the alloc's first task, all optional):
//! - `tick_every`: milliseconds between ticks (default 1000).
//! - `stop_after`: finish `complete` when the count reaches this (default: never).
//! - `crash_at`: panic right after checkpointing this count, as a bug would (default: never);
//!   a runner restarted in place resumes from the checkpoint and counts on past it.

use caravan_guest::{Alloc, Runner, RunnerError, State, host, info};
use std::time::Duration;

struct Stateful {
    count: u64,
    tick_every: Duration,
    stop_after: Option<u64>,
    crash_at: Option<u64>,
}

impl Runner for Stateful {
    fn start(
        alloc: &Alloc,
        restored: Option<Vec<u8>>,
        state: &mut State,
    ) -> Result<Self, RunnerError> {
        let config = alloc
            .tasks
            .first()
            .map(|t| t.config.as_slice())
            .unwrap_or_default();
        let number = |key: &str| -> Result<Option<u64>, RunnerError> {
            match config.iter().find(|(k, _)| k == key) {
                None => Ok(None),
                Some((_, v)) => v.parse().map(Some).map_err(|_| {
                    RunnerError::InvalidConfig(format!("{key}: {v:?} is not a whole number"))
                }),
            }
        };
        let tick_every = Duration::from_millis(number("tick_every")?.unwrap_or(1000).max(1));
        let stop_after = number("stop_after")?;
        let crash_at = number("crash_at")?;
        let count = match restored {
            Some(bytes) => {
                let text = String::from_utf8(bytes)
                    .map_err(|_| RunnerError::Failed("checkpoint is not UTF-8".into()))?;
                let count = text.parse().map_err(|_| {
                    RunnerError::Failed(format!("checkpoint {text:?} is not a count"))
                })?;
                info!("resuming from checkpoint at count {count}");
                count
            }
            None => 0,
        };
        for task in &alloc.tasks {
            state.task_started(&task.name);
        }
        Ok(Stateful {
            count,
            tick_every,
            stop_after,
            crash_at,
        })
    }

    fn next_wakeup(&self) -> Option<Duration> {
        Some(self.tick_every)
    }

    fn on_wakeup(&mut self, state: &mut State) -> Result<(), RunnerError> {
        self.count += 1;
        info!("tick {}", self.count);
        host::checkpoint(self.count.to_string().as_bytes()).map_err(RunnerError::Failed)?;
        if self.crash_at == Some(self.count) {
            panic!("crashed on purpose at count {}", self.count);
        }
        if self.stop_after.is_some_and(|limit| self.count >= limit) {
            // Our own status first: finishing the tasks would otherwise derive one.
            state.set_status(
                caravan_guest::ClientStatus::Complete,
                format!("counted to {}", self.count),
            );
            let names: Vec<String> = state
                .snapshot()
                .task_states
                .iter()
                .map(|t| t.name.clone())
                .collect();
            for name in names {
                state.task_finished(&name, false, "Counted to the end");
            }
        }
        Ok(())
    }

    fn checkpoint(&self) -> Option<Vec<u8>> {
        info!("shutting down at count {}", self.count);
        Some(self.count.to_string().into_bytes())
    }
}

caravan_guest::export_runner!(Stateful);
