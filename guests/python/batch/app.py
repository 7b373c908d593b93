"""Batch, in Python, on the caravan_runner SDK: each task computes the sum of the squares of
1..`numbers`, `chunk` numbers at a time (so `kill` and `shutdown` are answered between
chunks), logs it and ends with it in the task's `Terminated` event; the alloc completes when
every task has. It behaves as guests/batch (Rust) does, byte for byte (the conformance suite checks it).

Task config (all optional): `numbers` (default 1000, at most 1000000), `chunk` (default 100),
`result_file` (a file under `/alloc/`, at most 128 bytes, its parts neither empty nor `.` or
`..`: the task writes `{"numbers":N,"sum":S}` and a newline there when it is done, making its
directories, and reads it back; a write that fails fails the task with the reason as a WASI
error code, `Cannot write PATH: is-directory`). On `shutdown` it checkpoints each task's progress (version 1: a line `name<TAB>next<TAB>sum`
per task) and resumes from it.
"""

import errno
import os
from typing import Optional

import caravan_runner as caravan
from caravan_runner import Failed, State, TaskConfig

CHECKPOINT_VERSION = 1
MAX_NUMBERS = 1_000_000
MAX_RESULT_FILE = 128

# Why a write failed, as the WASI error code every language's batch names it by.
REASONS = {
    errno.EISDIR: "is-directory",
    errno.ENOTDIR: "not-directory",
    errno.ENOENT: "no-entry",
    errno.ENOSPC: "insufficient-space",
    errno.EDQUOT: "insufficient-space",
    errno.EACCES: "access",
    errno.EPERM: "access",
    errno.EEXIST: "exist",
}


def info(message: str) -> None:
    caravan.info(message, "batch")


def digits(text: str) -> Optional[int]:
    """Decimal digits only (no sign), fitting a u64; None otherwise."""
    if not text or not all("0" <= c <= "9" for c in text) or int(text) >= 2**64:
        return None
    return int(text)


def write_and_read_back(path: str, text: str) -> str:
    """Writes `text` to `path` (its directories made first) and reads it back."""
    parent = os.path.dirname(path)
    # Not `makedirs(..., exist_ok=True)` on `/alloc` itself: the runner cannot see `/`, so
    # makedirs, looking above `/alloc`, fails with ENOENT.
    if not os.path.isdir(parent):
        os.makedirs(parent)
    with open(path, "w", encoding="utf-8", newline="") as file:
        file.write(text)
    with open(path, encoding="utf-8", newline="") as file:
        return file.read()


class Summing:
    def __init__(self, task):
        config = TaskConfig(task)
        self.name = task.name
        numbers = config.whole_number("numbers")
        self.numbers: int = 1000 if numbers is None else numbers
        if not 0 <= self.numbers <= MAX_NUMBERS:
            raise config.invalid("numbers", f"{self.numbers} is not between 0 and {MAX_NUMBERS}")
        chunk = config.whole_number("chunk")
        self.chunk: int = 100 if chunk is None else chunk
        if self.chunk < 1:
            raise config.invalid("chunk", f"{self.chunk} is not at least 1")
        self.result_file = config.get("result_file")
        if self.result_file is not None:
            # A file under /alloc/ named plainly (no empty, `.` or `..` part), so that every
            # language resolves it alike.
            path = self.result_file
            if len(path.encode()) > MAX_RESULT_FILE:
                raise config.invalid("result_file", f"is longer than {MAX_RESULT_FILE} bytes")
            parts = path[len("/alloc/"):].split("/")
            if not path.startswith("/alloc/") or any(p in ("", ".", "..") or "\0" in p for p in parts):
                raise config.invalid("result_file", f"{caravan.quoted(path)} is not a file under /alloc/")
        self.next = 1
        self.sum = 0
        self.done = False


class Batch(caravan.Runner):
    def on_start(self, alloc, restored: Optional[bytes], state: State) -> None:
        self.tasks = [Summing(task) for task in alloc.tasks]
        if restored is not None:
            self.restore(restored)
        for task in self.tasks:
            state.task_started(task.name)
        if not self.tasks:
            state.set_status(caravan.ClientStatus.COMPLETE, "All tasks have completed")

    def restore(self, restored: bytes) -> None:
        """Each line `name<TAB>next<TAB>sum` of a version 1 checkpoint sets that task's
        progress; anything else in it is refused, in the same words in every language."""
        version, data = caravan.decode_checkpoint(restored)
        if version != CHECKPOINT_VERSION:
            raise Failed(f"checkpoint version {version} is not one this runner reads")
        unreadable = Failed("the restored checkpoint's progress cannot be read")
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise unreadable from None
        for line in (line for line in text.split("\n") if line):
            fields = line.split("\t")
            if len(fields) != 3:
                raise unreadable
            name, next_number, total = fields[0], digits(fields[1]), digits(fields[2])
            if next_number is None or not 1 <= next_number <= MAX_NUMBERS + 1 or total is None:
                raise unreadable
            task = next((t for t in self.tasks if t.name == name), None)
            if task is not None:
                task.next, task.sum = next_number, total
                info(f"task {name} resumed at {task.next}")

    def next_wakeup_ms(self) -> Optional[int]:
        return 0 if any(not t.done for t in self.tasks) else None

    def on_wakeup(self, state: State) -> None:
        for task in self.tasks:
            if task.done:
                continue
            last = min(task.numbers, task.next + task.chunk - 1)
            task.sum += sum(n * n for n in range(task.next, last + 1))
            task.next = last + 1
            if task.next > task.numbers:
                task.done = True
                info(f"task {task.name} computed the sum of squares of 1..{task.numbers}: {task.sum}")
                message = f"Computed the sum of squares of 1..{task.numbers}: {task.sum}"
                failed = False
                if task.result_file is not None:
                    path = task.result_file
                    result = f'{{"numbers":{task.numbers},"sum":{task.sum}}}\n'
                    try:
                        read = write_and_read_back(path, result)
                        if read == result:
                            info(f"task {task.name} wrote {len(read.encode())} bytes to {path}")
                        else:
                            failed, message = True, f"{path} reads back otherwise"
                    except OSError as error:
                        reason = REASONS.get(error.errno or 0, "io")
                        failed, message = True, f"Cannot write {path}: {reason}"
                state.task_finished(task.name, failed, message)

    def on_shutdown(self) -> Optional[bytes]:
        lines = "".join(f"{t.name}\t{t.next}\t{t.sum}\n" for t in self.tasks)
        return caravan.encode_checkpoint(CHECKPOINT_VERSION, lines.encode())


Runner = caravan.export(Batch)
