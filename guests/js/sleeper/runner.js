// Sleeper, in JavaScript, on the caravan-runner SDK: each task "runs" for a configured time,
// then exits with a configured code. It behaves as guests/sleeper (Rust) does: the same
// config, log lines and task events (the conformance suite checks it).
//
// Task config (all optional), named after Nomad's mock driver:
// - `run_for`: how long the task runs, such as `500ms`, `5s`, `2m` (default: until killed).
// - `exit_code`: the code it exits with; anything but 0 fails the task (default 0).
// - `log_every`: log a progress line this often while running (default: never).
// - `crash_after`: crash this long after the task starts, as a bug would: an exception nothing
//   catches (default: never). The host fails the alloc naming the trap and the exception.

// @ts-check: `tsc --checkJs` (guests/js/build) checks this against caravan-runner.d.ts.
import * as caravan from "../../../guest-sdk/js/caravan-runner.js";
import { TaskConfig, exportRunner, nowMs } from "../../../guest-sdk/js/caravan-runner.js";

/** @param {string} message */
const info = (message) => caravan.info(message, "sleeper");

/** @typedef {import("../../../guest-sdk/js/caravan-runner.js").State} State */
/** @typedef {import("../../../guest-sdk/js/caravan-runner.js").Task} Task */

class SleepingTask {
  /** @param {Task} task @param {number} startedMs */
  constructor(task, startedMs) {
    const config = new TaskConfig(task);
    this.name = task.name;
    this.runFor = config.durationMs("run_for");
    this.exitCode = config.wholeNumber("exit_code") ?? 0n;
    this.logEvery = config.durationMs("log_every");
    this.crashAfter = config.durationMs("crash_after");
    this.start(startedMs);
  }

  /** @param {number} now */
  start(now) {
    /** @param {number | undefined} delay */
    const after = (delay) => (delay === undefined ? undefined : now + delay);
    this.endsAt = after(this.runFor);
    this.nextLog = after(this.logEvery);
    this.crashesAt = after(this.crashAfter);
    this.done = false;
  }
}

class Sleeper extends caravan.Runner {
  /** @type {SleepingTask[]} */
  tasks = [];

  /** @param {import("../../../guest-sdk/js/caravan-runner.js").Alloc} alloc
   * @param {Uint8Array | undefined} restored @param {State} state */
  onStart(alloc, restored, state) {
    const now = nowMs();
    this.tasks = alloc.tasks.map((task) => {
      const sleeping = new SleepingTask(task, now);
      info(sleeping.runFor === undefined
        ? `task ${task.name} started; runs until killed`
        : `task ${task.name} started; runs for ${sleeping.runFor}ms`);
      state.taskStarted(task.name);
      return sleeping;
    });
  }

  nextWakeupMs() {
    return caravan.wakeupFor(this.tasks.filter((t) => !t.done).flatMap((t) => [t.endsAt, t.nextLog, t.crashesAt]));
  }

  /** @param {State} state */
  onWakeup(state) {
    const now = nowMs();
    for (const task of this.tasks.filter((t) => !t.done)) {
      if (task.crashesAt !== undefined && task.crashesAt <= now) {
        throw new Error(`task ${task.name} crashed on purpose (crash_after ${task.crashAfter}ms)`);
      }
      if (task.endsAt !== undefined && task.endsAt <= now) {
        task.done = true;
        const message = `Exit Code: ${task.exitCode}`;
        if (task.exitCode === 0n) info(`task ${task.name} finished: ${message}`);
        else caravan.warn(`task ${task.name} failed: ${message}`, "sleeper");
        state.taskFinished(task.name, task.exitCode !== 0n, message);
      } else if (task.nextLog !== undefined && task.nextLog <= now) {
        info(`task ${task.name} still running`);
        task.nextLog += task.logEvery ?? 0; // set whenever nextLog is
      }
    }
  }

  /** @param {string | undefined} task @param {string} signal @param {State} state */
  onSignal(task, signal, state) {
    for (const target of this.tasks.filter((t) => task === undefined || t.name === task)) {
      info(`received signal ${signal} for task ${target.name}`);
      state.taskSignaled(target.name, signal);
    }
  }

  /** @param {string} task @param {State} state */
  onRestartTask(task, state) {
    const target = this.tasks.find((t) => t.name === task);
    if (target === undefined) {
      caravan.warn(`restart asked for task ${task}, which this alloc does not have`, "sleeper");
      return;
    }
    target.start(nowMs());
    state.taskEvent(task, "Restart Signaled", "User requested task to restart");
    state.taskRestarted(task, "Task restarting in 0s");
    state.taskStarted(task);
    info(`task ${task} restarted (restart ${state.task(task)?.restarts ?? 0})`);
  }

  /** @param {State} state */
  onKill(state) {
    for (const task of this.tasks.filter((t) => !t.done)) info(`task ${task.name} killed`);
    state.killAll("alloc was stopped");
  }
}

export const runner = exportRunner(Sleeper);
