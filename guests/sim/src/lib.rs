//! Sim: a runner for testing a scheduler or a client at scale. Each task walks through
//! Nomad's events (`Received`, `Task Setup`, `Started`, then `Terminated` when it has a run
//! time), fails at a configured rate, and logs at a configured pace, all decided from a seed
//! so that a run can be replayed.
//!
//! Task config (all optional):
//! - `run_for`: how long the task runs, such as `500ms`, `5s`, `2m` (default: until killed).
//! - `run_jitter`: up to this much longer, drawn from the seed (default: none).
//! - `fail_ratio`: the chance, from 0 to 1, that the task exits 1 when its run ends (default 0).
//! - `log_every`: log a progress line this often while running (default: never; a task
//!   logs nothing else until it ends).
//!
//! Alloc meta `sim_seed` (a whole number) seeds the draws; without it the alloc id does, so
//! every alloc differs and the same alloc always draws the same. Each task draws from its own
//! stream (the seed mixed with its name), so adding a task changes no other task's draws.
//!
//! On `shutdown` it checkpoints each task's remaining time and its drawn outcome; restored,
//! a task carries on where it was, with a `Restored` event.

use caravan_guest::{Alloc, Runner, RunnerError, State, TaskConfig, info, wakeup_for, warn};
use std::time::{Duration, Instant};

struct Sim {
    tasks: Vec<SimTask>,
}

struct SimTask {
    name: String,
    /// When its run ends; `None` runs until killed.
    ends_at: Option<Instant>,
    fails: bool,
    log_every: Option<Duration>,
    next_log: Option<Instant>,
    logged: u64,
    done: bool,
}

impl Runner for Sim {
    fn start(
        alloc: &Alloc,
        restored: Option<Vec<u8>>,
        state: &mut State,
    ) -> Result<Self, RunnerError> {
        let seed = match alloc.meta.iter().find(|(key, _)| key == "sim_seed") {
            Some((_, value)) => value.trim().parse::<u64>().map_err(|_| {
                RunnerError::InvalidConfig(format!(
                    "meta sim_seed: {value:?} is not a whole number"
                ))
            })?,
            None => fnv1a(alloc.id.as_bytes()),
        };
        let saved = restored
            .as_deref()
            .map(Checkpoint::parse)
            .unwrap_or_default();
        let now = Instant::now();
        let mut tasks = Vec::new();
        for task in &alloc.tasks {
            let config = TaskConfig::of(task);
            let run_for = config.duration("run_for")?;
            let run_jitter = config.duration("run_jitter")?.unwrap_or_default();
            let log_every = config.duration("log_every")?.filter(|d| !d.is_zero());
            let fail_ratio = match config.get("fail_ratio") {
                None => 0.0,
                Some(text) => match text.trim().parse::<f64>() {
                    Ok(ratio) if (0.0..=1.0).contains(&ratio) => ratio,
                    _ => {
                        return Err(
                            config.invalid("fail_ratio", format!("{text:?} is not from 0 to 1"))
                        );
                    }
                },
            };
            let mut draws = SplitMix::new(seed ^ fnv1a(task.name.as_bytes()));
            let fails = draws.unit() < fail_ratio;
            let jitter_bound = u64::try_from(run_jitter.as_millis()).unwrap_or(u64::MAX);
            let jitter = Duration::from_millis(draws.below(jitter_bound.saturating_add(1)));
            let (remaining, fails, done) = match saved.task(&task.name) {
                Some(saved) => {
                    state.task_event(&task.name, "Restored", "Task restored from a checkpoint");
                    (saved.remaining, saved.fails, saved.done)
                }
                None => {
                    state.task_event(&task.name, "Task Setup", "Building Task Directory");
                    (run_for.map(|d| d.saturating_add(jitter)), fails, false)
                }
            };
            if done {
                state.task_finished(&task.name, fails, exit_message(fails));
            } else {
                // No log line: a task logs only at its `log_every` and when it ends, so ten
                // thousand quiet allocs open no log file (each open one is a descriptor).
                state.task_started(&task.name);
            }
            tasks.push(SimTask {
                name: task.name.clone(),
                // A run too long for the clock never ends: it runs until killed.
                ends_at: remaining.and_then(|d| now.checked_add(d)),
                fails,
                log_every,
                next_log: log_every.and_then(|d| now.checked_add(d)),
                logged: 0,
                done,
            });
        }
        Ok(Sim { tasks })
    }

    fn next_wakeup(&self) -> Option<Duration> {
        wakeup_for(
            self.tasks
                .iter()
                .filter(|t| !t.done)
                .flat_map(|t| [t.ends_at, t.next_log])
                .flatten(),
        )
    }

    fn on_wakeup(&mut self, state: &mut State) -> Result<(), RunnerError> {
        let now = Instant::now();
        for task in self.tasks.iter_mut().filter(|t| !t.done) {
            if task.ends_at.is_some_and(|end| end <= now) {
                task.done = true;
                if task.fails {
                    warn!("task {} failed: {}", task.name, exit_message(true));
                } else {
                    info!("task {} finished: {}", task.name, exit_message(false));
                }
                state.task_finished(&task.name, task.fails, exit_message(task.fails));
            } else if let (Some(every), Some(next)) = (task.log_every, task.next_log)
                && next <= now
            {
                task.logged += 1;
                info!("task {} progress {}", task.name, task.logged);
                task.next_log = next.checked_add(every);
            }
        }
        Ok(())
    }

    fn checkpoint(&self) -> Option<Vec<u8>> {
        let now = Instant::now();
        let mut text = String::new();
        for task in &self.tasks {
            let remaining = task
                .ends_at
                .map(|end| end.saturating_duration_since(now).as_millis().to_string())
                .unwrap_or_else(|| "-".into());
            text.push_str(&format!(
                "{}\t{remaining}\t{}\t{}\n",
                task.name,
                u8::from(task.fails),
                u8::from(task.done)
            ));
        }
        Some(text.into_bytes())
    }
}

fn exit_message(failed: bool) -> &'static str {
    if failed {
        "Exit Code: 1"
    } else {
        "Exit Code: 0"
    }
}

/// What a task was when the alloc was shut down.
struct SavedTask {
    name: String,
    remaining: Option<Duration>,
    fails: bool,
    done: bool,
}

/// The checkpoint: one line per task, `name<TAB>remaining ms or -<TAB>fails<TAB>done`.
#[derive(Default)]
struct Checkpoint {
    tasks: Vec<SavedTask>,
}

impl Checkpoint {
    /// Lines that do not parse are skipped: their task starts over, as on a first start.
    fn parse(bytes: &[u8]) -> Checkpoint {
        let text = String::from_utf8_lossy(bytes);
        let tasks = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split('\t');
                let name = fields.next()?.to_string();
                let remaining = match fields.next()? {
                    "-" => None,
                    millis => Some(Duration::from_millis(millis.parse().ok()?)),
                };
                let fails = fields.next()? == "1";
                let done = fields.next()? == "1";
                Some(SavedTask {
                    name,
                    remaining,
                    fails,
                    done,
                })
            })
            .collect();
        Checkpoint { tasks }
    }

    fn task(&self, name: &str) -> Option<&SavedTask> {
        self.tasks.iter().find(|t| t.name == name)
    }
}

/// SplitMix64: small, fast, and the same on every platform, which is all a replayable
/// simulation needs (it is not for secrets).
struct SplitMix(u64);

impl SplitMix {
    fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw from [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A draw from [0, bound); 0 when `bound` is 0.
    fn below(&mut self, bound: u64) -> u64 {
        let draw = self.next();
        draw.checked_rem(bound).unwrap_or(0)
    }
}

/// FNV-1a, to turn an alloc id or a task name into a seed.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01B3)
    })
}

caravan_guest::export_runner!(Sim);
