//! Sleeper: each task "runs" for a configured time, then exits with a configured code.
//!
//! Task config (all optional), named after Nomad's mock driver:
//! - `run_for`: how long the task runs, such as `500ms`, `5s`, `2m` (default: until killed).
//! - `exit_code`: the code it exits with; anything but 0 fails the task (default 0).
//! - `log_every`: log a progress line this often while running (default: never).
//! - `crash_after`: crash this long after the task starts, as a bug would: the runner panics
//!   (default: never). The host fails the alloc naming the trap and the panic message.
//!
//! A signal is logged (`received signal SIGUSR1 for task web`) and shown as a `Signaling`
//! event; it changes nothing else. A restart counts in the task's `restarts`, with Nomad's
//! `Restart Signaled`, `Restarting` and `Started` events, and starts the task's run over.

use caravan_guest::{
    Alloc, Runner, RunnerError, SignalRequest, State, TaskConfig, info, wakeup_for, warn,
};
use std::time::{Duration, Instant};

struct Sleeper {
    tasks: Vec<SleepingTask>,
}

struct SleepingTask {
    name: String,
    run_for: Option<Duration>,
    ends_at: Option<Instant>,
    exit_code: i64,
    log_every: Option<Duration>,
    next_log: Option<Instant>,
    crash_after: Option<Duration>,
    crashes_at: Option<Instant>,
    done: bool,
}

impl Runner for Sleeper {
    fn start(
        alloc: &Alloc,
        _restored: Option<Vec<u8>>,
        state: &mut State,
    ) -> Result<Self, RunnerError> {
        let now = Instant::now();
        let mut tasks = Vec::new();
        for task in &alloc.tasks {
            let config = TaskConfig::of(task);
            let run_for = config.duration("run_for")?;
            let exit_code = config.whole_number("exit_code")?.unwrap_or(0);
            let log_every = config.duration("log_every")?;
            let crash_after = config.duration("crash_after")?;
            match run_for {
                Some(d) => info!("task {} started; runs for {}ms", task.name, d.as_millis()),
                None => info!("task {} started; runs until killed", task.name),
            }
            state.task_started(&task.name);
            tasks.push(SleepingTask {
                name: task.name.clone(),
                run_for,
                ends_at: run_for.map(|d| now + d),
                exit_code,
                log_every,
                next_log: log_every.map(|d| now + d),
                crash_after,
                crashes_at: crash_after.map(|d| now + d),
                done: false,
            });
        }
        Ok(Sleeper { tasks })
    }

    fn next_wakeup(&self) -> Option<Duration> {
        wakeup_for(
            self.tasks
                .iter()
                .filter(|t| !t.done)
                .flat_map(|t| [t.ends_at, t.next_log, t.crashes_at])
                .flatten(),
        )
    }

    fn on_wakeup(&mut self, state: &mut State) -> Result<(), RunnerError> {
        let now = Instant::now();
        for task in self.tasks.iter_mut().filter(|t| !t.done) {
            if let (Some(after), Some(at)) = (task.crash_after, task.crashes_at)
                && at <= now
            {
                panic!(
                    "task {} crashed on purpose (crash_after {}ms)",
                    task.name,
                    after.as_millis()
                );
            }
            if task.ends_at.is_some_and(|end| end <= now) {
                task.done = true;
                let message = format!("Exit Code: {}", task.exit_code);
                if task.exit_code == 0 {
                    info!("task {} finished: {message}", task.name);
                } else {
                    warn!("task {} failed: {message}", task.name);
                }
                state.task_finished(&task.name, task.exit_code != 0, &message);
            } else if let (Some(every), Some(next)) = (task.log_every, task.next_log)
                && next <= now
            {
                info!("task {} still running", task.name);
                task.next_log = Some(next + every);
            }
        }
        Ok(())
    }

    fn on_signal(&mut self, request: SignalRequest, state: &mut State) -> Result<(), RunnerError> {
        let targets = self
            .tasks
            .iter()
            .filter(|t| request.task.as_ref().is_none_or(|name| *name == t.name));
        for task in targets {
            info!("received signal {} for task {}", request.signal, task.name);
            state.task_signaled(&task.name, &request.signal);
        }
        Ok(())
    }

    fn on_restart_task(&mut self, name: String, state: &mut State) -> Result<(), RunnerError> {
        let Some(task) = self.tasks.iter_mut().find(|t| t.name == name) else {
            warn!("restart asked for task {name}, which this alloc does not have");
            return Ok(());
        };
        let now = Instant::now();
        task.ends_at = task.run_for.map(|d| now + d);
        task.next_log = task.log_every.map(|d| now + d);
        task.crashes_at = task.crash_after.map(|d| now + d);
        task.done = false;
        state.task_event(&name, "Restart Signaled", "User requested task to restart");
        state.task_restarted(&name, "Task restarting in 0s");
        state.task_started(&name);
        let restarts = state.task(&name).map_or(0, |t| t.restarts);
        info!("task {name} restarted (restart {restarts})");
        Ok(())
    }

    fn on_kill(&mut self, state: &mut State) {
        for task in self.tasks.iter().filter(|t| !t.done) {
            info!("task {} killed", task.name);
        }
        state.kill_all("alloc was stopped");
    }
}

caravan_guest::export_runner!(Sleeper);
