"""{name}: a Caravan batch runner, made by `caravan runner new --files`. It writes
/alloc/out/result.json (the alloc's id and its number of tasks), reads it back, logs it and
ends each task with it; `caravan alloc fs ALLOC out/result.json` shows the file. Python's
own `open` reaches the alloc dir: the runner is built against the `alloc-runner` world.
The SDK's docs (the `caravan_runner` module, guest-sdk/python in the Caravan checkout) give
the event loop's rules and every hook."""

import json
import os
from typing import Optional

import caravan_runner as caravan
from caravan_runner import Alloc, Failed, State

RESULT = "/alloc/out/result.json"


class Files(caravan.Runner):
    def on_start(self, alloc: Alloc, restored: Optional[bytes], state: State) -> None:
        result = json.dumps({"alloc": alloc.id, "tasks": len(alloc.tasks)}, separators=(",", ":")) + "\n"
        try:
            # `/alloc/out`, not `/alloc` itself: the runner cannot see `/`, and makedirs
            # looks above the directory it makes.
            os.makedirs("/alloc/out", exist_ok=True)
            with open(RESULT, "w", encoding="utf-8") as file:
                file.write(result)
            with open(RESULT, encoding="utf-8") as file:
                written = file.read()
        except OSError as error:
            raise Failed(f"cannot write {RESULT}: {error.strerror or error}") from None
        caravan.info(f"wrote {RESULT}: {written.strip()}", "{name}")
        for task in alloc.tasks:
            state.task_started(task.name)
            state.task_finished(task.name, False, f"Wrote {RESULT}")
        if not alloc.tasks:
            state.set_status(caravan.ClientStatus.COMPLETE, "All tasks have completed")


Runner = caravan.export(Files)
