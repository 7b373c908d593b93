"""Sleeper, in Python: each task "runs" for a configured time, then exits with a configured
code. It behaves as guests/sleeper (Rust) does: the same config, log lines and task events.

Task config (all optional), named after Nomad's mock driver:
- `run_for`: how long the task runs, such as `500ms`, `5s`, `2m` (default: until killed).
- `exit_code`: the code it exits with; anything but 0 fails the task (default 0).
- `log_every`: log a progress line this often while running (default: never).
"""

import time

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, logging
from wit_world.imports.logging import Level
from wit_world.imports.types import (
    AllocState,
    ClientStatus,
    Event_Kill,
    Event_Shutdown,
    RunnerError_Failed,
    RunnerError_InvalidConfig,
    TaskEvent,
    TaskLifecycle,
    TaskState,
)

FOREVER = 0xFFFF_FFFF_FFFF_FFFF
UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def log(level: Level, message: str) -> None:
    logging.log(level, "sleeper", message)


def now_ms() -> int:
    # WASI's monotonic clock: the host's, so a test with paused time moves it too.
    return time.monotonic_ns() // 1_000_000


def parse_duration_ms(text: str) -> int:
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits):]
    if not digits.isdigit() or unit not in UNITS_MS:
        raise ValueError(f"{text!r} is not a duration such as 500ms, 5s or 2m")
    return int(digits) * UNITS_MS[unit]


def event(kind: str, message: str) -> TaskEvent:
    return TaskEvent(kind, message, time.time_ns() // 1_000_000)


class Task:
    def __init__(self, name: str, config: dict, started_ms: int):
        def setting(key, parse):
            if key not in config:
                return None
            try:
                return parse(config[key])
            except ValueError as error:
                message = f"task {name!r}: {key}: {error}"
                raise Err(RunnerError_InvalidConfig(message))

        run_for = setting("run_for", parse_duration_ms)
        self.exit_code = setting("exit_code", int) or 0
        self.log_every = setting("log_every", parse_duration_ms)
        self.name = name
        self.ends_at = None if run_for is None else started_ms + run_for
        self.next_log = None if self.log_every is None else started_ms + self.log_every
        self.state = TaskState(
            name,
            TaskLifecycle.RUNNING,
            False,
            0,
            [event("Received", "Task received by client"), event("Started", "Task started by client")],
        )
        if run_for is None:
            log(Level.INFO, f"task {name} started; runs until killed")
        else:
            log(Level.INFO, f"task {name} started; runs for {run_for}ms")

    def running(self) -> bool:
        return self.state.state == TaskLifecycle.RUNNING

    def finish(self, failed: bool, kind: str, message: str) -> None:
        self.state.state = TaskLifecycle.DEAD
        self.state.failed = failed
        self.state.events.append(event(kind, message))


class Runner(exports.Runner):
    def run(self, alloc, restored):
        started = now_ms()
        tasks = [Task(t.name, dict(t.config), started) for t in alloc.tasks]
        self.report(tasks, None)
        while True:
            wakeups = [at for t in tasks if t.running() for at in (t.ends_at, t.next_log) if at is not None]
            timeout = FOREVER if not wakeups else max(0, min(wakeups) - now_ms())
            next_event = host.next_event(timeout)
            if next_event is None:
                self.wake_up(tasks)
            elif isinstance(next_event, Event_Kill):
                for task in tasks:
                    if task.running():
                        log(Level.INFO, f"task {task.name} killed")
                        task.state.events.append(event("Killing", "Sent interrupt"))
                        task.finish(False, "Killed", "Task successfully killed")
                self.report(tasks, (ClientStatus.COMPLETE, "alloc was stopped"))
                return
            elif isinstance(next_event, Event_Shutdown):
                return
            if all(not t.running() for t in tasks):
                return

    def wake_up(self, tasks) -> None:
        now = now_ms()
        for task in tasks:
            if not task.running():
                continue
            if task.ends_at is not None and task.ends_at <= now:
                message = f"Exit Code: {task.exit_code}"
                if task.exit_code == 0:
                    log(Level.INFO, f"task {task.name} finished: {message}")
                else:
                    log(Level.WARN, f"task {task.name} failed: {message}")
                task.finish(task.exit_code != 0, "Terminated", message)
                self.report(tasks, None)
            elif task.next_log is not None and task.next_log <= now:
                log(Level.INFO, f"task {task.name} still running")
                task.next_log += task.log_every

    def report(self, tasks, status) -> None:
        if status is None:
            status = derived_status(tasks)
        state = AllocState(status[0], status[1], [t.state for t in tasks])
        try:
            host.update_state(state)
        except Err as refused:
            raise Err(RunnerError_Failed(f"host refused state: {refused.value}"))


def derived_status(tasks):
    """Nomad's rule: running while any task runs; then failed if any failed, else complete."""
    if any(t.running() for t in tasks):
        return ClientStatus.RUNNING, "Tasks are running"
    failed = [t.name for t in tasks if t.state.failed]
    if failed:
        return ClientStatus.FAILED, "Failed tasks: " + ", ".join(failed)
    return ClientStatus.COMPLETE, "All tasks have completed"
