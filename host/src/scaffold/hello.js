// @ts-check
// {name}: a Caravan runner, made by `caravan runner new`. It starts its tasks, says hello,
// logs a line every `log_every` (task config, default 10s) and runs until it is killed.
// The SDK's types and docs (out/caravan-runner.d.ts, copied there by ./build from the
// Caravan checkout's guest-sdk/js) give the event loop's rules and every hook.

import * as caravan from "./out/caravan-runner.js";

/** @typedef {import("./out/caravan-runner.js").State} State */

class Hello extends caravan.Runner {
  every = 10_000;
  next = 0;

  /** @param {import("./out/caravan-runner.js").Alloc} alloc
   * @param {Uint8Array | undefined} restored @param {State} state */
  onStart(alloc, restored, state) {
    for (const task of alloc.tasks) {
      this.every = new caravan.TaskConfig(task).durationMs("log_every") ?? this.every;
      state.taskStarted(task.name);
    }
    caravan.info(`hello from alloc ${alloc.id}`, "{name}");
    this.next = caravan.nowMs() + this.every;
  }

  nextWakeupMs() {
    return caravan.wakeupFor([this.next]);
  }

  /** @param {State} state */
  onWakeup(state) {
    caravan.info("still running", "{name}");
    this.next = caravan.nowMs() + this.every;
  }
}

export const runner = caravan.exportRunner(Hello);
