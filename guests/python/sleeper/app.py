"""Sleeper, in Python: each task "runs" for a configured time, then exits with a configured
code. It behaves as guests/sleeper (Rust) does: the same config, log lines and task events.

Task config (all optional), named after Nomad's mock driver:
- `run_for`: how long the task runs, such as `500ms`, `5s`, `2m` (default: until killed).
- `exit_code`: the code it exits with; anything but 0 fails the task (default 0).
- `log_every`: log a progress line this often while running (default: never).
- `crash_after`: crash this long after the task starts, as a bug would: an exception nothing
  catches (default: never). The host fails the alloc naming the trap and the exception.
"""

import json
import re
import time

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, logging
from wit_world.imports.logging import Level
from wit_world.imports.types import (
    AllocState,
    ClientStatus,
    Event_Kill,
    Event_RestartTask,
    Event_Shutdown,
    Event_Signal,
    RunnerError_Failed,
    RunnerError_InvalidConfig,
    TaskEvent,
    TaskLifecycle,
    TaskState,
)

FOREVER = 0xFFFF_FFFF_FFFF_FFFF
UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
# The host keeps the last 10 events of each task; so does the runner.
MAX_EVENTS = 10


def log(level: Level, message: str) -> None:
    logging.log(level, "sleeper", message)


def now_ms() -> int:
    # WASI's monotonic clock: the host's, so a test with paused time moves it too.
    return time.monotonic_ns() // 1_000_000


def quoted(text: str) -> str:
    # As Rust's `{:?}` quotes, so every language words its errors alike.
    return json.dumps(text)


def parse_duration_ms(text: str) -> int:
    match = re.fullmatch(r"\+?([0-9]+)(ms|s|m|h)", text)
    if match is None:
        raise ValueError(f"{quoted(text)} is not a duration such as 500ms, 5s or 2m")
    return int(match[1]) * UNITS_MS[match[2]]


def parse_exit_code(text: str) -> int:
    if re.fullmatch(r"[+-]?[0-9]+", text) is None or not -(2**63) <= int(text) < 2**63:
        raise ValueError(f"{quoted(text)} is not a whole number")
    return int(text)


def event(kind: str, message: str) -> TaskEvent:
    return TaskEvent(kind, message, time.time_ns() // 1_000_000)


class Task:
    def __init__(self, name: str, config: dict, started_ms: int):
        def setting(key, parse):
            # The first setting of a key counts, as in the Rust runner.
            value = next((v for k, v in config if k == key), None)
            if value is None:
                return None
            try:
                return parse(value)
            except ValueError as error:
                message = f"task {quoted(name)}: {key}: {error}"
                raise Err(RunnerError_InvalidConfig(message))

        run_for = setting("run_for", parse_duration_ms)
        self.exit_code = setting("exit_code", parse_exit_code) or 0
        self.log_every = setting("log_every", parse_duration_ms)
        self.crash_after = setting("crash_after", parse_duration_ms)
        self.name = name
        self.ends_at = None if run_for is None else started_ms + run_for
        self.next_log = None if self.log_every is None else started_ms + self.log_every
        self.crashes_at = None if self.crash_after is None else started_ms + self.crash_after
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

    def add_event(self, kind: str, message: str) -> None:
        self.state.events = (self.state.events + [event(kind, message)])[-MAX_EVENTS:]

    def finish(self, failed: bool, kind: str, message: str) -> None:
        self.state.state = TaskLifecycle.DEAD
        self.state.failed = failed
        self.add_event(kind, message)


class Runner(exports.Runner):
    def run(self, alloc, restored):
        started = now_ms()
        tasks = [Task(t.name, t.config, started) for t in alloc.tasks]
        self.report(tasks, None)
        while True:
            wakeups = [
                at for t in tasks if t.running() for at in (t.ends_at, t.next_log, t.crashes_at) if at is not None
            ]
            timeout = FOREVER if not wakeups else max(0, min(wakeups) - now_ms())
            next_event = host.next_event(timeout)
            if next_event is None:
                self.wake_up(tasks)
            elif isinstance(next_event, Event_Kill):
                for task in tasks:
                    if task.running():
                        log(Level.INFO, f"task {task.name} killed")
                        task.add_event("Killing", "Sent interrupt")
                        task.finish(False, "Killed", "Task successfully killed")
                self.report(tasks, (ClientStatus.COMPLETE, "alloc was stopped"))
                return
            elif isinstance(next_event, Event_Shutdown):
                return
            elif isinstance(next_event, Event_Signal):
                wanted = next_event.value.task
                for task in tasks:
                    if wanted is None or task.name == wanted:
                        task.add_event("Signaling", f"Task being sent signal {next_event.value.signal}")
                self.report(tasks, None)
            elif isinstance(next_event, Event_RestartTask):
                for task in tasks:
                    if task.name == next_event.value:
                        task.state.restarts += 1
                        task.state.state = TaskLifecycle.RUNNING
                        task.state.failed = False
                        task.add_event("Restarting", "User requested task to restart")
                self.report(tasks, None)
            # With tasks, the run ends when the last one does; without, only on kill.
            if tasks and all(not t.running() for t in tasks):
                return

    def wake_up(self, tasks) -> None:
        now = now_ms()
        for task in tasks:
            if not task.running():
                continue
            if task.crashes_at is not None and task.crashes_at <= now:
                raise RuntimeError(f"task {task.name} crashed on purpose (crash_after {task.crash_after}ms)")
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
    """Nomad's rule: running while any task runs; then failed if any failed, else complete.
    An alloc without tasks runs until it is killed."""
    if not tasks:
        return ClientStatus.RUNNING, "Runner started"
    if any(t.running() for t in tasks):
        return ClientStatus.RUNNING, "Tasks are running"
    failed = [t.name for t in tasks if t.state.failed]
    if failed:
        return ClientStatus.FAILED, "Failed tasks: " + ", ".join(failed)
    return ClientStatus.COMPLETE, "All tasks have completed"
