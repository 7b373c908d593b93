//! The contract checker behind `caravan runner check`: drives a runner component through
//! the contract of `wit/runner.wit` and says, check by check, what it does right and wrong.
//!
//! A runner is judged as one of two kinds. A service runner keeps its alloc running until it
//! is killed. A batch runner does its work and ends on its own; it is judged so when asked
//! (`batch`), or when it ends `complete` on its own, without crashing, during the check.
//!
//! Required checks: it loads (the world matches); it reports `running` (or, a batch runner,
//! ends first); a service stays up for `duration` through an `update`, a `signal` and a
//! `restart-task` sent at random times (seeded: the same seed sends them at the same
//! times), and a batch runner ends `complete` or `failed` with a description, by returning,
//! within `duration`, the same events sent while it runs; it answers `kill` with a terminal
//! state within the kill timeout (for a batch runner that ends before it can be killed,
//! this is not checked). Optional checks: it saves a checkpoint on `shutdown` and resumes
//! from it, and its log lines arrive. A failing check carries the last lines its run logged.
//! The runs use the same factory as the client, so what passes here behaves the same under
//! an agent.
//!
//! It is a library module rather than part of `cli/` because the integration tests (and
//! any other tool) call [`check`] directly, with no process, stdout or signals. It returns
//! results and never prints, exits or handles signals: `cli::check` does that.

use crate::allocrunner::AllocRunner;
use crate::model::structs::{Alloc, ClientStatus, Limits, Task};
use crate::runtime::{Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use crate::util::locks::LockUnpoisoned;
use crate::util::units::format_duration;
use harness::{Harness, Run};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

mod harness;

/// How long a runner may take to report `running`.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// What `runner check` is asked to do.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// How long `kill` and `shutdown` may take.
    pub kill_timeout: Duration,
    /// Where compiled components are kept, if anywhere.
    pub cache_dir: Option<PathBuf>,
    /// The alloc's tasks and their config (default: one task, `main`, no config).
    pub tasks: Vec<Task>,
    /// Judge the runner as a batch runner whatever it does (otherwise: one that ends
    /// `complete` on its own is).
    pub batch: bool,
    /// How long a service must stay up, and a batch runner has to end.
    pub duration: Duration,
    /// Chooses when the events are sent; the same seed, the same times.
    pub seed: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            kill_timeout: Duration::from_secs(5),
            cache_dir: None,
            tasks: vec![Task::named("main")],
            batch: false,
            duration: Duration::from_secs(3),
            seed: 1,
        }
    }
}

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
    /// When it failed: the last lines the run it looked at logged (its guest's own words).
    pub log: Vec<String>,
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

fn result(name: &'static str, required: bool, outcome: Result<String, String>) -> CheckResult {
    let (passed, detail) = match outcome {
        Ok(detail) => (true, detail),
        Err(detail) => (false, detail),
    };
    CheckResult {
        name,
        required,
        passed,
        detail,
        log: Vec::new(),
    }
}

/// [`result`], with `run`'s log when it failed.
async fn result_of(
    harness: &Harness,
    run: &Run,
    name: &'static str,
    required: bool,
    outcome: Result<String, String>,
) -> CheckResult {
    let mut checked = result(name, required, outcome);
    if !checked.passed {
        checked.log = harness.log_of(run.number).await;
    }
    checked
}

/// An event the checks send a running runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Poke {
    Update,
    Signal,
    RestartTask,
}

impl Poke {
    fn name(self) -> &'static str {
        match self {
            Poke::Update => "`update`",
            Poke::Signal => "`signal` (SIGHUP)",
            Poke::RestartTask => "`restart-task`",
        }
    }

    /// Sends it; a runner that is stopping refuses, which the watch then sees.
    fn send(self, run: &Run) {
        let runner = &run.runner;
        match self {
            Poke::Update => {
                let alloc = runner.alloc();
                runner.update(Arc::new(Alloc {
                    modify_index: alloc.modify_index + 1,
                    ..Alloc::clone(&alloc)
                }));
            }
            Poke::Signal => {
                let _ = runner.signal(None, "SIGHUP");
            }
            Poke::RestartTask => {
                let first = runner.alloc().tasks.first().map(|t| t.name.clone());
                let _ = runner.restart_task(first.as_deref());
            }
        }
    }
}

/// When each event is sent, from `seed`: in a random order, at random times early enough
/// that at least half a second (or half the window) is left after the last, for a crash it
/// causes to show.
fn schedule(seed: u64, duration: Duration) -> Vec<(Duration, Poke)> {
    let mut state = seed;
    // splitmix64: a few lines of well-known arithmetic, enough to spread three times.
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut pokes = [Poke::Update, Poke::Signal, Poke::RestartTask];
    for i in (1..pokes.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        pokes.swap(i, j);
    }
    let window = duration
        .saturating_sub(Duration::from_millis(500))
        .max(duration / 2);
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut times: Vec<u64> = (0..pokes.len()).map(|_| next() % window_ms).collect();
    times.sort_unstable();
    times
        .into_iter()
        .zip(pokes)
        .map(|(ms, poke)| (Duration::from_millis(ms), poke))
        .collect()
}

fn schedule_text(schedule: &[(Duration, Poke)]) -> String {
    let sent: Vec<String> = schedule
        .iter()
        .map(|(at, poke)| format!("{} at {}", poke.name(), format_duration(*at)))
        .collect();
    sent.join(", ")
}

/// How a run's window went.
enum Watched {
    /// Still running at the end.
    Running,
    /// It stopped `after` the window began, the last event sent before being `last_sent`.
    Ended {
        after: Duration,
        last_sent: Option<(Duration, Poke)>,
    },
}

/// Sends the scheduled events while the run lasts, for `duration`.
async fn watch(run: &Run, duration: Duration, schedule: &[(Duration, Poke)]) -> Watched {
    let began = Instant::now();
    let stopped = run.runner.wait();
    let mut last_sent = None;
    // A stop is looked at first, so that no event sent after it is blamed for it.
    for &(at, poke) in schedule {
        tokio::select! {
            biased;
            () = stopped.wait() => return Watched::Ended { after: began.elapsed(), last_sent },
            () = tokio::time::sleep_until(began + at) => {}
        }
        if stopped.is_set() {
            return Watched::Ended {
                after: began.elapsed(),
                last_sent,
            };
        }
        poke.send(run);
        last_sent = Some((at, poke));
    }
    tokio::select! {
        biased;
        () = stopped.wait() => Watched::Ended { after: began.elapsed(), last_sent },
        () = tokio::time::sleep_until(began + duration) => Watched::Running,
    }
}

/// How a run ended, for details: `complete (All tasks have completed)`.
fn how_it_ended(run: &Run) -> String {
    let state = run.runner.alloc_state();
    format!("{} ({})", state.client_status, state.description)
}

/// Whether a stopped run ended as a batch run does on its own: its own report made it
/// `complete`, it returned, and nobody killed it. (A runner that only returned is made
/// `complete` by the host: that is a service's loop ending too soon as often as a batch's
/// end, so it is not taken for one.)
fn ended_complete(run: &Run) -> bool {
    run.runner.ending().is_some_and(|ending| {
        ending.reported_its_end && !ending.crashed && !ending.torn_down && !ending.after_kill
    }) && run.runner.alloc_state().client_status == ClientStatus::Complete
}

/// Kills the run and judges how it answered; `None` when it had ended on its own first.
async fn judge_kill(run: &Run, kill_timeout: Duration) -> Option<Result<String, String>> {
    run.runner.kill();
    let waited = tokio::time::timeout(
        kill_timeout + Duration::from_secs(1),
        run.runner.wait().wait(),
    )
    .await;
    if waited.is_err() {
        return Some(Err(format!(
            "expected to stop within the kill timeout of {}; it did not",
            format_duration(kill_timeout)
        )));
    }
    let ending = run.runner.ending()?;
    if !ending.after_kill {
        return None;
    }
    let state = run.runner.alloc_state();
    Some(if ending.torn_down {
        Err(format!(
            "expected `run` to return within the kill timeout of {}; the host had to tear it down",
            format_duration(kill_timeout)
        ))
    } else if ending.crashed {
        Err(format!(
            "expected `run` to return after `kill`; it crashed: {}",
            how_it_ended(run)
        ))
    } else if !state.client_status.is_terminal() {
        Err(format!(
            "expected a terminal state after `kill`; it ended {}",
            state.client_status
        ))
    } else {
        Ok(format!("returned with `{}`", how_it_ended(run)))
    })
}

/// Runs every check against the component at `path`; stops early when the component cannot
/// load. Every run it starts has stopped when it returns.
pub async fn check(path: &Path, options: &CheckOptions) -> anyhow::Result<Vec<CheckResult>> {
    let runtime = Runtime::new(&RuntimeConfig {
        max_live_allocs: 8,
        cache_dir: options.cache_dir.clone(),
        ..RuntimeConfig::default()
    })?;
    let loaded = runtime.load_file(path);
    let instantiates = result(
        "instantiates",
        true,
        loaded
            .map(|_| "exports caravan:runner/runner and its imports link".into())
            .map_err(|e| e.to_string()),
    );
    if !instantiates.passed {
        return Ok(vec![instantiates]);
    }
    let data_dir = crate::util::fs_tree::TempTree::new("caravan-check-")?;
    let mut harness = Harness {
        factory: WasmAllocRunnerFactory::new(runtime),
        alloc_logs: crate::alloc_logs::AllocLogs::under_data_dir(data_dir.path()),
        data_dir,
        runner_path: path.display().to_string(),
        tasks: options.tasks.clone(),
        started: Vec::new(),
        limits: Limits {
            kill_timeout: options.kill_timeout,
            ..Limits::default()
        },
    };
    let checked = run_checks(&mut harness, options).await;
    // However the checks ended, no run outlives them (nor their directory).
    harness.stop_all(options.kill_timeout).await;
    let mut results = vec![instantiates];
    results.extend(checked?);
    Ok(results)
}

async fn run_checks(
    harness: &mut Harness,
    options: &CheckOptions,
) -> anyhow::Result<Vec<CheckResult>> {
    let kill_timeout = options.kill_timeout;
    let duration = options.duration;
    let mut results = Vec::new();

    // Run 1: running, then the window with its events.
    let run = harness.start(None)?;
    let running = run.observer.wait_running(&run.runner, START_TIMEOUT).await;
    let quick_batch = running.is_err() && ended_complete(&run);
    let reports_running = match (&running, quick_batch) {
        (Ok(()), _) => Ok("reported `running`".to_string()),
        (Err(_), true) => Ok(format!(
            "ended {} before reporting `running`",
            how_it_ended(&run)
        )),
        (Err(why), false) => Err(why.clone()),
    };
    results.push(result_of(harness, &run, "reports running", true, reports_running).await);
    let events = schedule(options.seed, duration);
    let watched = if running.is_ok() {
        watch(&run, duration, &events).await
    } else {
        Watched::Ended {
            after: Duration::ZERO,
            last_sent: None,
        }
    };
    let batch = options.batch || ended_complete(&run);
    let sent = schedule_text(&events);
    let reported = run.runner.alloc_state();
    let window = if batch {
        let outcome = match &watched {
            Watched::Running => Err(format!(
                "expected a batch runner to end within {} (--duration); it was still running \
                 after {sent}: give it less work (--config) or more time",
                format_duration(duration)
            )),
            Watched::Ended { .. } if running.is_err() && !quick_batch => {
                Err("not checked: the runner never reported `running`".into())
            }
            Watched::Ended { after, .. }
                if run
                    .runner
                    .ending()
                    .is_some_and(|e| e.crashed || e.torn_down) =>
            {
                Err(format!(
                    "expected `run` to return; it crashed after {}: {}",
                    format_duration(*after),
                    how_it_ended(&run)
                ))
            }
            Watched::Ended { after, .. } => {
                if reported.description.trim().is_empty() {
                    Err(format!(
                        "expected a description saying how it ended; it ended {} with none",
                        reported.client_status
                    ))
                } else {
                    Ok(format!(
                        "ended {} on its own after {} (judged as a batch runner)",
                        how_it_ended(&run),
                        format_duration(*after)
                    ))
                }
            }
        };
        result_of(harness, &run, "ends on its own", true, outcome).await
    } else {
        let outcome = match &watched {
            Watched::Running if reported.client_status.is_terminal() => Err(format!(
                "it reported {} ({}) but did not return from `run`: return once the alloc is \
                 terminal",
                reported.client_status, reported.description
            )),
            Watched::Running => Ok(format!(
                "still running after {}, through {sent} (seed {})",
                format_duration(duration),
                options.seed
            )),
            Watched::Ended { .. } if running.is_err() => {
                Err("not checked: the runner never reported `running`".into())
            }
            Watched::Ended { after, last_sent } => {
                let cause = match last_sent {
                    Some((at, poke)) => {
                        format!(", after the {} at {}", poke.name(), format_duration(*at))
                    }
                    None => ", before any event".to_string(),
                };
                Err(format!(
                    "expected to keep running for {} through {sent} (seed {}); it stopped \
                     {} in{cause}: {} (a batch runner reports `complete` itself before it \
                     returns, or is checked with --batch)",
                    format_duration(duration),
                    options.seed,
                    format_duration(*after),
                    how_it_ended(&run)
                ))
            }
        };
        result_of(harness, &run, "stays up under events", true, outcome).await
    };
    results.push(window);

    // `kill`: on run 1 if it still runs; for a batch runner that ended, on a new run,
    // killed as soon as it reports `running`.
    let not_killed = |why: String| result("answers kill", false, Err(why));
    let killed = if !run.runner.wait().is_set() {
        match judge_kill(&run, kill_timeout).await {
            Some(outcome) => result_of(harness, &run, "answers kill", true, outcome).await,
            None => not_killed(format!(
                "not checked: the runner ended on its own as it was killed ({})",
                how_it_ended(&run)
            )),
        }
    } else if batch {
        let second = harness.start(None)?;
        let reported = second
            .observer
            .wait_running(&second.runner, START_TIMEOUT)
            .await;
        let judged = if reported.is_ok() {
            judge_kill(&second, kill_timeout).await
        } else {
            None
        };
        match judged {
            Some(outcome) => result_of(harness, &second, "answers kill", true, outcome).await,
            None => not_killed(format!(
                "not checked: the batch runner's second run ended before it could be killed ({})",
                how_it_ended(&second)
            )),
        }
    } else {
        not_killed(format!(
            "not checked: the runner stopped before `kill` ({})",
            how_it_ended(&run)
        ))
    };
    results.push(killed);

    results.push(checkpoints_and_resumes(harness, kill_timeout).await?);

    let lines = harness.log_lines().await;
    let logs = if lines > 0 {
        Ok(format!("{lines} log lines arrived"))
    } else {
        Err("the runner logged nothing".to_string())
    };
    results.push(result("logs arrive", false, logs));
    Ok(results)
}

/// A run asked to `shutdown` once running, then a new one given its checkpoint.
async fn checkpoints_and_resumes(
    harness: &mut Harness,
    kill_timeout: Duration,
) -> anyhow::Result<CheckResult> {
    let run = harness.start(None)?;
    let running = run.observer.wait_running(&run.runner, START_TIMEOUT).await;
    if running.is_err() || run.runner.wait().is_set() {
        return Ok(result(
            "checkpoints and resumes",
            false,
            Err(format!(
                "not checked: the runner was not running when it could be asked to `shutdown` ({})",
                how_it_ended(&run)
            )),
        ));
    }
    run.runner.shutdown();
    let _ = tokio::time::timeout(
        kill_timeout + Duration::from_secs(1),
        run.runner.shutdown_done().wait(),
    )
    .await;
    let checkpoint = run.observer.checkpoint.lock_unpoisoned().clone();
    let Some(bytes) = checkpoint else {
        return Ok(result(
            "checkpoints and resumes",
            false,
            Err(
                "no checkpoint was saved on `shutdown` (fine for a runner with nothing to resume)"
                    .to_string(),
            ),
        ));
    };
    let size = bytes.len();
    let restored = harness.start(Some(bytes))?;
    let outcome = restored
        .observer
        .wait_running(&restored.runner, START_TIMEOUT)
        .await
        .map(|()| {
            format!("saved {size} bytes on `shutdown` and reported `running` when given them back")
        });
    Ok(result("checkpoints and resumes", false, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_sends_the_same_events_at_the_same_times_within_the_window() {
        let duration = Duration::from_secs(3);
        assert_eq!(schedule(42, duration), schedule(42, duration));
        assert_ne!(schedule(42, duration), schedule(43, duration));
        for seed in 0..200 {
            let events = schedule(seed, duration);
            let mut kinds: Vec<Poke> = events.iter().map(|(_, p)| *p).collect();
            kinds.sort_by_key(|p| p.name());
            assert_eq!(kinds.len(), 3);
            kinds.dedup();
            assert_eq!(kinds.len(), 3, "each event once");
            assert!(events.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
            assert!(
                events
                    .iter()
                    .all(|(at, _)| *at < duration - Duration::from_millis(500))
            );
        }
    }
}
