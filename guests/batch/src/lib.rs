//! Batch: each task computes the sum of the squares of 1..`numbers`, `chunk` numbers at a time
//! (so `kill` and `shutdown` are answered between chunks), logs it and ends with it in the
//! task's `Terminated` event; the alloc completes when every task has. Its Python, JavaScript
//! and C twins (`guests/*/batch`) behave the same, byte for byte: the conformance suite runs
//! all four.
//!
//! Task config (all optional): `numbers` (default 1000, at most 1000000), `chunk` (default
//! 100). On `shutdown` it checkpoints each task's progress (version 1: a line
//! `name<TAB>next<TAB>sum` per task) and resumes from it, whichever language wrote it.

use caravan_guest::{
    Alloc, Runner, RunnerError, State, TaskConfig, decode_checkpoint, encode_checkpoint, info,
};
use std::time::Duration;

const CHECKPOINT_VERSION: u32 = 1;
const MAX_NUMBERS: i64 = 1_000_000;

struct Batch {
    tasks: Vec<Summing>,
}

struct Summing {
    name: String,
    numbers: i64,
    chunk: i64,
    next: i64,
    sum: u64,
    done: bool,
}

fn setting(
    config: &TaskConfig,
    key: &str,
    default: i64,
    range: (i64, i64),
) -> Result<i64, RunnerError> {
    let value = config.whole_number(key)?.unwrap_or(default);
    match range {
        (low, high) if (low..=high).contains(&value) => Ok(value),
        (low, i64::MAX) => Err(config.invalid(key, format!("{value} is not at least {low}"))),
        (low, high) => Err(config.invalid(key, format!("{value} is not between {low} and {high}"))),
    }
}

impl Batch {
    fn restore(&mut self, restored: &[u8]) -> Result<(), RunnerError> {
        let (version, data) = decode_checkpoint(restored)?;
        if version != CHECKPOINT_VERSION {
            return Err(RunnerError::Failed(format!(
                "checkpoint version {version} is not one this runner reads"
            )));
        }
        for line in String::from_utf8_lossy(data).lines() {
            let mut fields = line.split('\t');
            let (Some(name), Some(next), Some(sum)) = (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if let Some(task) = self.tasks.iter_mut().find(|t| t.name == name) {
                task.next = next.parse().unwrap_or(1);
                task.sum = sum.parse().unwrap_or(0);
                info!("task {name} resumed at {}", task.next);
            }
        }
        Ok(())
    }
}

impl Runner for Batch {
    fn start(
        alloc: &Alloc,
        restored: Option<Vec<u8>>,
        state: &mut State,
    ) -> Result<Self, RunnerError> {
        let mut tasks = Vec::new();
        for task in &alloc.tasks {
            let config = TaskConfig::of(task);
            tasks.push(Summing {
                name: task.name.clone(),
                numbers: setting(&config, "numbers", 1000, (0, MAX_NUMBERS))?,
                chunk: setting(&config, "chunk", 100, (1, i64::MAX))?,
                next: 1,
                sum: 0,
                done: false,
            });
        }
        let mut batch = Batch { tasks };
        if let Some(restored) = restored {
            batch.restore(&restored)?;
        }
        for task in &batch.tasks {
            state.task_started(&task.name);
        }
        Ok(batch)
    }

    fn next_wakeup(&self) -> Option<Duration> {
        self.tasks.iter().any(|t| !t.done).then_some(Duration::ZERO)
    }

    fn on_wakeup(&mut self, state: &mut State) -> Result<(), RunnerError> {
        for task in self.tasks.iter_mut().filter(|t| !t.done) {
            let last = task.numbers.min(task.next.saturating_add(task.chunk - 1));
            for n in task.next..=last {
                task.sum = task.sum.wrapping_add((n as u64) * (n as u64));
            }
            task.next = last + 1;
            if task.next > task.numbers {
                task.done = true;
                info!(
                    "task {} computed the sum of squares of 1..{}: {}",
                    task.name, task.numbers, task.sum
                );
                let message = format!(
                    "Computed the sum of squares of 1..{}: {}",
                    task.numbers, task.sum
                );
                state.task_finished(&task.name, false, &message);
            }
        }
        Ok(())
    }

    fn checkpoint(&self) -> Option<Vec<u8>> {
        let lines: String = self
            .tasks
            .iter()
            .map(|t| format!("{}\t{}\t{}\n", t.name, t.next, t.sum))
            .collect();
        Some(encode_checkpoint(CHECKPOINT_VERSION, lines.as_bytes()))
    }
}

caravan_guest::export_runner!(Batch);
