"""Sleeper, in Python, on the caravan_runner SDK: each task "runs" for a configured time,
then exits with a configured code. It behaves as guests/sleeper (Rust) does: the same
config, log lines and task events (the conformance suite checks it).

Task config (all optional), named after Nomad's mock driver:
- `run_for`: how long the task runs, such as `500ms`, `5s`, `2m` (default: until killed).
- `exit_code`: the code it exits with; anything but 0 fails the task (default 0).
- `log_every`: log a progress line this often while running (default: never).
- `crash_after`: crash this long after the task starts, as a bug would: an exception nothing
  catches (default: never). The host fails the alloc naming the trap and the exception.
"""

from typing import Optional

import caravan_runner as caravan
from caravan_runner import State, TaskConfig, now_ms


def info(message: str) -> None:
    caravan.info(message, "sleeper")


class SleepingTask:
    def __init__(self, task, started_ms: int):
        config = TaskConfig(task)
        self.name = task.name
        self.run_for = config.duration_ms("run_for")
        self.exit_code = config.whole_number("exit_code") or 0
        self.log_every = config.duration_ms("log_every")
        self.crash_after = config.duration_ms("crash_after")
        self.start(started_ms)

    def start(self, now: int) -> None:
        after = lambda delay: None if delay is None else now + delay  # noqa: E731
        self.ends_at = after(self.run_for)
        self.next_log = after(self.log_every)
        self.crashes_at = after(self.crash_after)
        self.done = False


class Sleeper(caravan.Runner):
    def on_start(self, alloc, restored: Optional[bytes], state: State) -> None:
        now = now_ms()
        self.tasks = []
        for task in alloc.tasks:
            sleeping = SleepingTask(task, now)
            if sleeping.run_for is None:
                info(f"task {task.name} started; runs until killed")
            else:
                info(f"task {task.name} started; runs for {sleeping.run_for}ms")
            state.task_started(task.name)
            self.tasks.append(sleeping)

    def next_wakeup_ms(self) -> Optional[int]:
        return caravan.wakeup_for(
            [at for t in self.tasks if not t.done for at in (t.ends_at, t.next_log, t.crashes_at)]
        )

    def on_wakeup(self, state: State) -> None:
        now = now_ms()
        for task in self.tasks:
            if task.done:
                continue
            if task.crashes_at is not None and task.crashes_at <= now:
                raise RuntimeError(f"task {task.name} crashed on purpose (crash_after {task.crash_after}ms)")
            if task.ends_at is not None and task.ends_at <= now:
                task.done = True
                message = f"Exit Code: {task.exit_code}"
                if task.exit_code == 0:
                    info(f"task {task.name} finished: {message}")
                else:
                    caravan.warn(f"task {task.name} failed: {message}", "sleeper")
                state.task_finished(task.name, task.exit_code != 0, message)
            elif task.next_log is not None and task.next_log <= now:
                info(f"task {task.name} still running")
                task.next_log += task.log_every

    def on_signal(self, task: Optional[str], signal: str, state: State) -> None:
        for target in self.tasks:
            if task is None or target.name == task:
                info(f"received signal {signal} for task {target.name}")
                state.task_signaled(target.name, signal)

    def on_restart_task(self, task: str, state: State) -> None:
        target = next((t for t in self.tasks if t.name == task), None)
        if target is None:
            caravan.warn(f"restart asked for task {task}, which this alloc does not have", "sleeper")
            return
        target.start(now_ms())
        state.task_event(task, "Restart Signaled", "User requested task to restart")
        state.task_restarted(task, "Task restarting in 0s")
        state.task_started(task)
        restarted = state.task(task)
        info(f"task {task} restarted (restart {restarted.restarts if restarted else 0})")

    def on_kill(self, state: State) -> None:
        for task in self.tasks:
            if not task.done:
                info(f"task {task.name} killed")
        state.kill_all("alloc was stopped")


Runner = caravan.export(Sleeper)
