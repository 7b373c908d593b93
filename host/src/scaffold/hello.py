"""{name}: a Caravan runner, made by `caravan runner new`. It starts its tasks, says hello,
logs a line every `log_every` (task config, default 10s) and runs until it is killed.
The SDK's docs (the `caravan_runner` module, guest-sdk/python in the Caravan checkout) give
the event loop's rules and every hook."""

from typing import Optional

import caravan_runner as caravan
from caravan_runner import Alloc, State, TaskConfig, now_ms


class Hello(caravan.Runner):
    def on_start(self, alloc: Alloc, restored: Optional[bytes], state: State) -> None:
        self.every = 10_000
        for task in alloc.tasks:
            configured = TaskConfig(task).duration_ms("log_every")
            if configured is not None:
                self.every = configured
            state.task_started(task.name)
        caravan.info(f"hello from alloc {alloc.id}", "{name}")
        self.next = now_ms() + self.every

    def next_wakeup_ms(self) -> Optional[int]:
        return caravan.wakeup_for([self.next])

    def on_wakeup(self, state: State) -> None:
        caravan.info("still running", "{name}")
        self.next = now_ms() + self.every


Runner = caravan.export(Hello)
