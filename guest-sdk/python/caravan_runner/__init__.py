"""Write Caravan alloc runners in Python.

A runner is a WebAssembly component that runs one alloc (an instance of a job) for the Caravan
host; componentize-py builds it from your module. This package is the contract of
`wit/runner.wit` made small, with the same shape as the Rust SDK (`caravan-guest`):

- `Runner`: subclass it and write only the handlers that differ (`on_start`, `on_wakeup`
  with `next_wakeup_ms`, `on_update`, `on_signal`, `on_restart_task`, `on_kill`,
  `on_shutdown`); `export(YourRunner)` gives the class componentize-py exports.
- `State`: the alloc's state, changed by small calls (`task_started`, `task_finished`, ...)
  that add Nomad's task events and derive the alloc's status as the host documents it.
- `encode_checkpoint` / `decode_checkpoint`: a versioned checkpoint, the same bytes in
  every SDK, so a new build can tell an old checkpoint from its own.
- `log`, `info`, `warn`, ...: lines through the host's logger.
- `TaskConfig`, `parse_duration_ms`: task config read with errors worded as the host shows
  them.

The loop's rules, the same as the Rust SDK's:

1. `on_start(alloc, restored, state)`; if the status is still `pending` afterwards it becomes
   `running` ("Runner started"). The state is reported.
2. While the state is not terminal, wait for an event for at most `next_wakeup_ms()` (for
   ever on None), then call the handler: no event in time, `on_wakeup`; `update`,
   `on_update`; `signal`, `on_signal` (default: a `Signaling` event); `restart-task`,
   `on_restart_task` (default: a restart counted); `kill`, `on_kill` (default: every task
   killed, the alloc `complete`); `shutdown`, `on_shutdown`, whose bytes (if any) are saved
   as the checkpoint, and the run returns at once, leaving the state as it is. After each
   handler the state is reported when it changed.
3. The run returns when the state is terminal. A handler that raises `InvalidConfig` or
   `Failed` ends the alloc `failed` with its message; any other exception is a crash, which
   the host reports with its traceback's last line.

Build with `componentize-py --wit-path WIT --world alloc-runner componentize app -p
PATH/TO/guest-sdk/python --output runner.wasm`, or install this package with pip
(`pip install PATH/TO/guest-sdk/python`) into the environment componentize-py runs in.
"""

from __future__ import annotations

import re
import time
from typing import Callable, Optional, Sequence, TypeVar, Union

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host
from wit_world.imports import logging as wasi_logging
from wit_world.imports.logging import Level
from wit_world.imports.types import (
    Alloc,
    AllocState,
    ClientStatus,
    Event_Kill,
    Event_RestartTask,
    Event_Shutdown,
    Event_Signal,
    Event_Update,
    RunnerError_Failed,
    RunnerError_InvalidConfig,
    Task,
    TaskEvent,
    TaskLifecycle,
    TaskState,
)

__all__ = [
    "Alloc",
    "ClientStatus",
    "Failed",
    "InvalidConfig",
    "Level",
    "Runner",
    "State",
    "Task",
    "TaskConfig",
    "TaskLifecycle",
    "TaskState",
    "decode_checkpoint",
    "encode_checkpoint",
    "export",
    "log",
    "parse_duration_ms",
    "quoted",
    "wakeup_for",
]

T = TypeVar("T")

#: `next-event` waits at most this many milliseconds: as long as it takes.
FOREVER = 0xFFFF_FFFF_FFFF_FFFF
#: How many events the host keeps per task; the state keeps the same.
MAX_EVENTS_PER_TASK = 10


class InvalidConfig(Exception):
    """Raise it from a handler: the alloc cannot run as configured (say which task and key)."""


class Failed(Exception):
    """Raise it from a handler: the alloc cannot go on; the message is its description."""


# ---- logging ---------------------------------------------------------------------------

def log(level: Level, message: str, context: str = "runner") -> None:
    """Logs `message` through the host's logger at `level`, under `context`."""
    wasi_logging.log(level, context, message)


def trace(message: str, context: str = "runner") -> None:
    log(Level.TRACE, message, context)


def debug(message: str, context: str = "runner") -> None:
    log(Level.DEBUG, message, context)


def info(message: str, context: str = "runner") -> None:
    log(Level.INFO, message, context)


def warn(message: str, context: str = "runner") -> None:
    log(Level.WARN, message, context)


def error(message: str, context: str = "runner") -> None:
    log(Level.ERROR, message, context)


def now_ms() -> int:
    """The host's monotonic clock in milliseconds (a test with paused time moves it too)."""
    return time.monotonic_ns() // 1_000_000


def now_unix_ms() -> int:
    """Milliseconds since the Unix epoch, for task events."""
    return time.time_ns() // 1_000_000


# ---- task config -----------------------------------------------------------------------

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
_U64_MAX = 2**64 - 1


def quoted(text: str) -> str:
    """`text` quoted as every SDK's errors quote it, as Rust's `{:?}` does: `"we\\"b"`, control
    characters as `\\n` or `\\u{1b}`."""
    def escape(ch: str) -> str:
        code = ord(ch)
        if ch in _ESCAPES:
            return _ESCAPES[ch]
        if code < 0x20 or 0x7F <= code < 0xA0:
            return "\\u{%x}" % code
        return ch

    return '"' + "".join(escape(ch) for ch in text) + '"'


def parse_duration_ms(text: str) -> int:
    """`500ms`, `5s`, `2m`, `1h` in milliseconds; `ValueError` naming `text` otherwise."""
    match = re.fullmatch(r"\+?([0-9]+)(ms|s|m|h)", text, re.ASCII)
    if match is None or int(match[1]) > _U64_MAX:
        raise ValueError(f"{quoted(text)} is not a duration such as 500ms, 5s or 2m")
    ms = int(match[1]) * _UNITS_MS[match[2]]
    if ms > _U64_MAX:
        raise ValueError(f"{quoted(text)} is too long")
    return ms


def _parse_whole_number(text: str) -> int:
    if re.fullmatch(r"[+-]?[0-9]+", text, re.ASCII) is None or not -(2**63) <= int(text) < 2**63:
        raise ValueError(f"{quoted(text)} is not a whole number")
    return int(text)


class TaskConfig:
    """One task's config, read key by key; the first setting of a key counts. Errors are
    `InvalidConfig` naming the task and the key: `task "web": run_for: "soon" is not ...`."""

    def __init__(self, task: Task):
        self.task = task

    def get(self, key: str) -> Optional[str]:
        return next((value for k, value in self.task.config if k == key), None)

    def parsed(self, key: str, parse: Callable[[str], T]) -> Optional[T]:
        value = self.get(key)
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError as why:
            raise self.invalid(key, str(why)) from None

    def duration_ms(self, key: str) -> Optional[int]:
        return self.parsed(key, parse_duration_ms)

    def whole_number(self, key: str) -> Optional[int]:
        return self.parsed(key, _parse_whole_number)

    def invalid(self, key: str, why: str) -> InvalidConfig:
        return InvalidConfig(f"task {quoted(self.task.name)}: {key}: {why}")


def wakeup_for(deadlines_ms: Sequence[Optional[int]]) -> Optional[int]:
    """How long to wait until the earliest of `deadlines_ms` (monotonic ms; None ignored):
    0 when one has passed, None when there is none."""
    pending = [at for at in deadlines_ms if at is not None]
    if not pending:
        return None
    return max(0, min(pending) - now_ms())


# ---- checkpoints -----------------------------------------------------------------------

_CHECKPOINT_HEADER = re.compile(rb"caravan-checkpoint v([0-9]{1,10})\n")
_U32_MAX = 2**32 - 1


def encode_checkpoint(version: int, data: bytes) -> bytes:
    """`data` under a header naming its `version` (`caravan-checkpoint v1\\n`), the same bytes
    every Caravan SDK writes; `version` is at most 4294967295."""
    if not 0 <= version <= _U32_MAX:
        raise ValueError(f"checkpoint version {version} is out of range")
    return b"caravan-checkpoint v%d\n" % version + data


def decode_checkpoint(raw: bytes) -> tuple[int, bytes]:
    """The version and data of a checkpoint `encode_checkpoint` wrote; `Failed` otherwise."""
    match = _CHECKPOINT_HEADER.match(raw)
    if match is None or int(match[1]) > _U32_MAX:
        raise Failed("the restored checkpoint has no caravan-checkpoint header")
    return int(match[1]), raw[match.end():]


# ---- state -----------------------------------------------------------------------------

def _event(kind: str, message: str) -> TaskEvent:
    return TaskEvent(kind, message, now_unix_ms())


def _push_event(task: TaskState, event: TaskEvent) -> None:
    task.events = (task.events + [event])[-MAX_EVENTS_PER_TASK:]


class HostRefused(Exception):
    """The host refused a report (see `update-state` in `wit/runner.wit`)."""


class State:
    """The alloc's state as the runner reports it: client status, description, and one task
    state per task. Change it with the `task_*` calls (they add the usual events and derive
    the status), then `report()`, which sends it only when it changed.

    The status follows the tasks: `running` once any task runs, `complete` when every task
    is dead and none failed, `failed` when every task is dead and one failed. A status set
    with `set_status` holds until the next task change; a terminal one is final."""

    def __init__(self, alloc: Alloc):
        self.client_status = ClientStatus.PENDING
        self.description = ""
        self.task_states = [
            TaskState(t.name, TaskLifecycle.PENDING, False, 0, [_event("Received", "Task received by client")])
            for t in alloc.tasks
        ]
        self._last_reported: Optional[tuple[object, ...]] = None

    def is_terminal(self) -> bool:
        return self.client_status in (ClientStatus.COMPLETE, ClientStatus.FAILED)

    def set_status(self, status: ClientStatus, description: str) -> None:
        """Sets the status and description yourself; after a terminal one, changes nothing."""
        if not self.is_terminal():
            self.client_status = status
            self.description = description

    def task(self, name: str) -> Optional[TaskState]:
        return next((t for t in self.task_states if t.name == name), None)

    def task_started(self, name: str) -> None:
        """Marks task `name` running, with a `Started` event."""
        def change(task: TaskState) -> None:
            task.state = TaskLifecycle.RUNNING
            task.failed = False
            _push_event(task, _event("Started", "Task started by client"))
        self._update_task(name, change)

    def task_finished(self, name: str, failed: bool, message: str) -> None:
        """Marks task `name` dead, with a `Terminated` event saying `message`."""
        def change(task: TaskState) -> None:
            task.state = TaskLifecycle.DEAD
            task.failed = failed
            _push_event(task, _event("Terminated", message))
        self._update_task(name, change)

    def task_restarted(self, name: str, reason: str) -> None:
        """Counts a restart of task `name`, with a `Restarting` event, and marks it running."""
        def change(task: TaskState) -> None:
            task.restarts += 1
            _push_event(task, _event("Restarting", reason))
            task.state = TaskLifecycle.RUNNING
            task.failed = False
        self._update_task(name, change)

    def task_signaled(self, name: str, signal: str) -> None:
        """Records that task `name` was sent `signal`, with Nomad's `Signaling` event."""
        self.task_event(name, "Signaling", f"Task being sent signal {signal}")

    def task_event(self, name: str, kind: str, message: str) -> None:
        """Adds an event of your own kind to task `name`."""
        self._update_task(name, lambda task: _push_event(task, _event(kind, message)))

    def kill_all(self, description: str) -> None:
        """Kills every task not dead yet (`Killing`, `Killed`) and makes the alloc `complete`."""
        for task in self.task_states:
            if task.state != TaskLifecycle.DEAD:
                _push_event(task, _event("Killing", "Sent interrupt"))
                _push_event(task, _event("Killed", "Task successfully killed"))
                task.state = TaskLifecycle.DEAD
        self.set_status(ClientStatus.COMPLETE, description)

    def snapshot(self) -> AllocState:
        """The state as it would be reported now."""
        return AllocState(self.client_status, self.description, list(self.task_states))

    def report(self) -> None:
        """Sends the state to the host if it changed since the last report the host took;
        raises `HostRefused` with the host's reason when it refuses it."""
        key = _fingerprint(self)
        if key == self._last_reported:
            return
        try:
            host.update_state(self.snapshot())
        except Err as refused:
            raise HostRefused(str(refused.value)) from None
        self._last_reported = key

    def _update_task(self, name: str, change: Callable[[TaskState], None]) -> None:
        task = self.task(name)
        if task is None:
            warn(f"no task named {quoted(name)} in this alloc", "caravan-runner")
            return
        change(task)
        self._derive_client_status()

    def _derive_client_status(self) -> None:
        if self.is_terminal():
            return
        tasks = self.task_states
        if tasks and all(t.state == TaskLifecycle.DEAD for t in tasks):
            failed = [t.name for t in tasks if t.failed]
            if failed:
                self.set_status(ClientStatus.FAILED, "Failed tasks: " + ", ".join(failed))
            else:
                self.set_status(ClientStatus.COMPLETE, "All tasks have completed")
        elif any(t.state == TaskLifecycle.RUNNING for t in tasks):
            self.client_status = ClientStatus.RUNNING
            self.description = "Tasks are running"


def _fingerprint(state: State) -> tuple[object, ...]:
    return (
        state.client_status,
        state.description,
        tuple(
            (t.name, t.state, t.failed, t.restarts, tuple((e.kind, e.message, e.time_unix_ms) for e in t.events))
            for t in state.task_states
        ),
    )


# ---- the runner and its loop -----------------------------------------------------------

class Runner:
    """A runner written as event handlers; see the module's docs for the loop's rules.
    Handlers should return promptly and use `next_wakeup_ms` instead of sleeping, so that
    `kill` is answered in time."""

    def on_start(self, alloc: Alloc, restored: Optional[bytes], state: State) -> None:
        """Check the config, start the tasks (`state.task_started`). `restored` is the last
        checkpoint when the alloc resumes (after an agent restart, a crash restarted in
        place, or an upgrade to a new build)."""

    def next_wakeup_ms(self) -> Optional[int]:
        """How long to wait for an event before `on_wakeup`; None waits for ever."""
        return None

    def on_wakeup(self, state: State) -> None:
        """`next_wakeup_ms` passed without an event."""

    def on_update(self, alloc: Alloc, state: State) -> None:
        """A new version of the alloc arrived. A `kill` follows if it is to stop."""

    def on_signal(self, task: Optional[str], signal: str, state: State) -> None:
        """A signal for one task (or all, when `task` is None). Default: `Signaling` events."""
        for t in state.task_states:
            if task is None or t.name == task:
                state.task_signaled(t.name, signal)

    def on_restart_task(self, task: str, state: State) -> None:
        """A request to restart task `task`. Default: counts the restart, marks it running."""
        state.task_restarted(task, "User requested task to restart")

    def on_kill(self, state: State) -> None:
        """The alloc is being stopped for good. Default: `state.kill_all`."""
        state.kill_all("alloc was stopped")

    def on_shutdown(self) -> Optional[bytes]:
        """The agent is stopping, or a new build takes over: return the bytes to resume from
        (`encode_checkpoint` them), or None to save nothing. The state is not reported
        after this (the alloc goes on elsewhere), so it is not handed to you."""
        return None


def run(runner: Runner, alloc: Alloc, restored: Optional[bytes]) -> None:
    """The event loop (see the module's docs); raises `Err` with the runner error to return."""
    state = State(alloc)
    try:
        _drive(runner, alloc, restored, state)
    except (InvalidConfig, Failed, HostRefused) as why:
        runner_error: Union[RunnerError_InvalidConfig, RunnerError_Failed]
        if isinstance(why, InvalidConfig):
            runner_error = RunnerError_InvalidConfig(str(why))
            description = f"invalid config: {why}"
        elif isinstance(why, HostRefused):
            runner_error = RunnerError_Failed(f"host refused state: {why}")
            description = runner_error.value
        else:
            runner_error = RunnerError_Failed(str(why))
            description = str(why)
        # Worded as the host words it, so the description does not change when the host
        # applies its own rule for `err`; this report only adds the task states.
        state.set_status(ClientStatus.FAILED, description)
        try:
            state.report()
        except HostRefused:
            pass
        raise Err(runner_error) from None


def _drive(runner: Runner, alloc: Alloc, restored: Optional[bytes], state: State) -> None:
    runner.on_start(alloc, restored, state)
    if state.client_status == ClientStatus.PENDING:
        state.set_status(ClientStatus.RUNNING, "Runner started")
    state.report()
    while not state.is_terminal():
        wait = runner.next_wakeup_ms()
        event = host.next_event(FOREVER if wait is None else min(max(0, wait), FOREVER))
        if event is None:
            runner.on_wakeup(state)
        elif isinstance(event, Event_Update):
            runner.on_update(event.value, state)
        elif isinstance(event, Event_Signal):
            runner.on_signal(event.value.task, event.value.signal, state)
        elif isinstance(event, Event_RestartTask):
            runner.on_restart_task(event.value, state)
        elif isinstance(event, Event_Kill):
            runner.on_kill(state)
        elif isinstance(event, Event_Shutdown):
            checkpoint = runner.on_shutdown()
            if checkpoint is not None:
                try:
                    host.checkpoint(checkpoint)
                except Err as refused:
                    raise Failed(str(refused.value)) from None
            return
        state.report()


def export(runner_class: type[Runner]) -> type:
    """The class componentize-py exports, running `runner_class` in the loop. In your app
    module: `Runner = export(MyRunner)` (componentize-py looks for the name `Runner`)."""

    class Export(exports.Runner):
        def run(self, alloc: Alloc, restored: Optional[bytes]) -> None:
            run(runner_class(), alloc, restored)

    Export.__name__ = Export.__qualname__ = f"Exported{runner_class.__name__}"
    return Export
