// Sleeper, in JavaScript: each task "runs" for a configured time, then exits with a
// configured code. It behaves as guests/sleeper (Rust) does: the same config, log lines and
// task events.
//
// Task config (all optional), named after Nomad's mock driver:
// - `run_for`: how long the task runs, such as `500ms`, `5s`, `2m` (default: until killed).
// - `exit_code`: the code it exits with; anything but 0 fails the task (default 0).
// - `log_every`: log a progress line this often while running (default: never).
// - `crash_after`: crash this long after the task starts, as a bug would: an exception nothing
//   catches (default: never). The host fails the alloc naming the trap and the exception.

import { nextEvent, updateState } from "caravan:runner/host@0.1.0";
import { log as wasiLog } from "wasi:logging/logging@0.1.0-draft";

const FOREVER = 0xffffffffffffffffn;
const UNITS_MS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
// The host keeps the last 10 events of each task; so does the runner.
const MAX_EVENTS = 10;

const log = (level, message) => wasiLog(level, "sleeper", message);
// WASI's monotonic clock: the host's, so a test with paused time moves it too.
const nowMs = () => performance.now();

function parseDurationMs(text) {
  const match = /^\+?(\d+)(ms|s|m|h)$/.exec(text);
  if (!match) {
    throw new Error(`${JSON.stringify(text)} is not a duration such as 500ms, 5s or 2m`);
  }
  return Number(match[1]) * UNITS_MS[match[2]];
}

const event = (kind, message) => ({ kind, message, timeUnixMs: BigInt(Date.now()) });

class Task {
  constructor(name, config, startedMs) {
    const setting = (key, parse) => {
      const entry = config.find(([k]) => k === key);
      if (!entry) return undefined;
      try {
        return parse(entry[1]);
      } catch (error) {
        throw { tag: "invalid-config", val: `task ${JSON.stringify(name)}: ${key}: ${error.message}` };
      }
    };
    const runFor = setting("run_for", parseDurationMs);
    this.exitCode = setting("exit_code", (v) => {
      const inRange = /^[+-]?\d+$/.test(v) && BigInt(v) >= -(2n ** 63n) && BigInt(v) < 2n ** 63n;
      if (!inRange) throw new Error(`${JSON.stringify(v)} is not a whole number`);
      return BigInt(v);
    }) ?? 0n;
    this.logEvery = setting("log_every", parseDurationMs);
    this.crashAfter = setting("crash_after", parseDurationMs);
    this.name = name;
    this.endsAt = runFor === undefined ? undefined : startedMs + runFor;
    this.nextLog = this.logEvery === undefined ? undefined : startedMs + this.logEvery;
    this.crashesAt = this.crashAfter === undefined ? undefined : startedMs + this.crashAfter;
    this.state = {
      name,
      state: "running",
      failed: false,
      restarts: 0,
      events: [event("Received", "Task received by client"), event("Started", "Task started by client")],
    };
    log("info", runFor === undefined
      ? `task ${name} started; runs until killed`
      : `task ${name} started; runs for ${runFor}ms`);
  }

  get running() {
    return this.state.state === "running";
  }

  addEvent(kind, message) {
    this.state.events = [...this.state.events, event(kind, message)].slice(-MAX_EVENTS);
  }

  finish(failed, kind, message) {
    this.state.state = "dead";
    this.state.failed = failed;
    this.addEvent(kind, message);
  }
}

// Nomad's rule: running while any task runs; then failed if any failed, else complete. An
// alloc without tasks runs until it is killed.
function derivedStatus(tasks) {
  if (tasks.length === 0) return ["running", "Runner started"];
  if (tasks.some((t) => t.running)) return ["running", "Tasks are running"];
  const failed = tasks.filter((t) => t.state.failed).map((t) => t.name);
  if (failed.length > 0) return ["failed", `Failed tasks: ${failed.join(", ")}`];
  return ["complete", "All tasks have completed"];
}

function report(tasks, status = derivedStatus(tasks)) {
  try {
    updateState({
      clientStatus: status[0],
      description: status[1],
      taskStates: tasks.map((t) => t.state),
    });
  } catch (refused) {
    throw { tag: "failed", val: `host refused state: ${refused.payload ?? refused}` };
  }
}

function wakeUp(tasks) {
  const now = nowMs();
  for (const task of tasks.filter((t) => t.running)) {
    if (task.crashesAt !== undefined && task.crashesAt <= now) {
      throw new Error(`task ${task.name} crashed on purpose (crash_after ${task.crashAfter}ms)`);
    }
    if (task.endsAt !== undefined && task.endsAt <= now) {
      const message = `Exit Code: ${task.exitCode}`;
      if (task.exitCode === 0n) {
        log("info", `task ${task.name} finished: ${message}`);
      } else {
        log("warn", `task ${task.name} failed: ${message}`);
      }
      task.finish(task.exitCode !== 0n, "Terminated", message);
      report(tasks);
    } else if (task.nextLog !== undefined && task.nextLog <= now) {
      log("info", `task ${task.name} still running`);
      task.nextLog += task.logEvery;
    }
  }
}

export const runner = {
  run(alloc, restored) {
    const started = nowMs();
    const tasks = alloc.tasks.map((t) => new Task(t.name, t.config, started));
    report(tasks);
    for (;;) {
      const wakeups = tasks
        .filter((t) => t.running)
        .flatMap((t) => [t.endsAt, t.nextLog, t.crashesAt])
        .filter((at) => at !== undefined);
      const timeout = wakeups.length === 0
        ? FOREVER
        : BigInt(Math.max(0, Math.ceil(Math.min(...wakeups) - nowMs())));
      const next = nextEvent(timeout);
      if (next === undefined || next === null) {
        wakeUp(tasks);
      } else if (next.tag === "kill") {
        for (const task of tasks.filter((t) => t.running)) {
          log("info", `task ${task.name} killed`);
          task.addEvent("Killing", "Sent interrupt");
          task.finish(false, "Killed", "Task successfully killed");
        }
        report(tasks, ["complete", "alloc was stopped"]);
        return;
      } else if (next.tag === "shutdown") {
        return;
      } else if (next.tag === "signal") {
        for (const task of tasks.filter((t) => next.val.task == null || t.name === next.val.task)) {
          task.addEvent("Signaling", `Task being sent signal ${next.val.signal}`);
        }
        report(tasks);
      } else if (next.tag === "restart-task") {
        for (const task of tasks.filter((t) => t.name === next.val)) {
          task.state.restarts += 1;
          task.state.state = "running";
          task.state.failed = false;
          task.addEvent("Restarting", "User requested task to restart");
        }
        report(tasks);
      }
      // With tasks, the run ends when the last one does; without, only on kill.
      if (tasks.length > 0 && !tasks.some((t) => t.running)) return;
    }
  },
};
