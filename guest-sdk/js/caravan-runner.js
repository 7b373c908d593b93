// Write Caravan alloc runners in JavaScript (componentize-js), with the same shape as the Rust
// SDK (`caravan-guest`) and the Python one (`caravan_runner`). Types: caravan-runner.d.ts.
//
// - `Runner`: extend it and write only the handlers that differ (`onStart`, `onWakeup` with
//   `nextWakeupMs`, `onUpdate`, `onSignal`, `onRestartTask`, `onKill`, `onShutdown`);
//   `exportRunner(YourRunner)` is what your module exports as `runner`.
// - `State`: the alloc's state, changed by small calls (`taskStarted`, `taskFinished`, ...)
//   that add Nomad's task events and derive the alloc's status as the host documents it.
// - `encodeCheckpoint` / `decodeCheckpoint`: a versioned checkpoint, the same bytes in every
//   SDK, so a new build can tell an old checkpoint from its own.
// - `log`, `info`, `warn`, ...: lines through the host's logger.
// - `TaskConfig`, `parseDurationMs`: task config read with errors worded as the host shows
//   them.
//
// The loop's rules, the same as every SDK's:
// 1. `onStart(alloc, restored, state)`; if the status is still `pending` afterwards it becomes
//    `running` ("Runner started"). The state is reported.
// 2. While the state is not terminal, wait for an event for at most `nextWakeupMs()` (for
//    ever on undefined), then call the handler: no event in time, `onWakeup`; `update`,
//    `onUpdate`; `signal`, `onSignal` (default: a `Signaling` event); `restart-task`,
//    `onRestartTask` (default: a restart counted); `kill`, `onKill` (default: every task
//    killed, the alloc `complete`); `shutdown`, `onShutdown`, whose bytes (if any) are saved
//    as the checkpoint, and the run returns at once. After each handler the state is
//    reported when it changed.
// 3. The run returns when the state is terminal. A handler that throws `InvalidConfig` or
//    `Failed` ends the alloc `failed` with its message; anything else thrown is a crash.
//
// Import it by path from your runner module; componentize-js bundles what it imports.

import { checkpoint, nextEvent, updateState } from "caravan:runner/host@0.1.0";
import { log as wasiLog } from "wasi:logging/logging@0.1.0-draft";

/** `next-event` waits at most this many milliseconds: as long as it takes. */
export const FOREVER = 0xffffffffffffffffn;
/** How many events the host keeps per task; the state keeps the same. */
export const MAX_EVENTS_PER_TASK = 10;

/** Throw it from a handler: the alloc cannot run as configured (say which task and key). */
export class InvalidConfig extends Error {}
/** Throw it from a handler: the alloc cannot go on; the message is its description. */
export class Failed extends Error {}
/** The host refused a report (see `update-state` in `wit/runner.wit`). */
export class HostRefused extends Error {}

// ---- logging -----------------------------------------------------------------------------

/** Logs `message` through the host's logger at `level`, under `context`. */
export function log(level, message, context = "runner") {
  wasiLog(level, context, message);
}
export const trace = (message, context) => log("trace", message, context);
export const debug = (message, context) => log("debug", message, context);
export const info = (message, context) => log("info", message, context);
export const warn = (message, context) => log("warn", message, context);
export const error = (message, context) => log("error", message, context);

/** The host's monotonic clock in whole milliseconds (paused-time tests move it too). */
export const nowMs = () => Math.floor(performance.now());
/** Milliseconds since the Unix epoch, for task events. */
export const nowUnixMs = () => BigInt(Date.now());

// ---- task config -------------------------------------------------------------------------

const UNITS_MS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

const ESCAPES = { '"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0" };
const U64_MAX = 2n ** 64n - 1n;

/** `text` quoted as every SDK's errors quote it, as Rust's `{:?}` does: `"we\"b"`, control
 * characters as `\n` or `\u{1b}`. */
export function quoted(text) {
  let out = '"';
  for (const ch of text) {
    const code = ch.codePointAt(0) ?? 0;
    if (ch in ESCAPES) out += ESCAPES[/** @type {keyof typeof ESCAPES} */ (ch)];
    else if (code < 0x20 || (code >= 0x7f && code < 0xa0)) out += `\\u{${code.toString(16)}}`;
    else out += ch;
  }
  return `${out}"`;
}

/** `500ms`, `5s`, `2m`, `1h` in milliseconds; throws an Error naming `text` otherwise. */
export function parseDurationMs(text) {
  const match = /^\+?([0-9]+)(ms|s|m|h)$/.exec(text);
  if (!match || BigInt(match[1]) > U64_MAX) {
    throw new Error(`${quoted(text)} is not a duration such as 500ms, 5s or 2m`);
  }
  const ms = BigInt(match[1]) * BigInt(UNITS_MS[match[2]]);
  if (ms > U64_MAX) throw new Error(`${quoted(text)} is too long`);
  return Number(ms);
}

function parseWholeNumber(text) {
  const inRange = /^[+-]?[0-9]+$/.test(text) && BigInt(text) >= -(2n ** 63n) && BigInt(text) < 2n ** 63n;
  if (!inRange) throw new Error(`${quoted(text)} is not a whole number`);
  return BigInt(text);
}

/** One task's config, read key by key; the first setting of a key counts. Errors are
 * `InvalidConfig` naming the task and the key: `task "web": run_for: "soon" is not ...`. */
export class TaskConfig {
  constructor(task) {
    this.task = task;
  }
  get(key) {
    const entry = this.task.config.find(([k]) => k === key);
    return entry === undefined ? undefined : entry[1];
  }
  parsed(key, parse) {
    const value = this.get(key);
    if (value === undefined) return undefined;
    try {
      return parse(value);
    } catch (why) {
      throw this.invalid(key, why.message);
    }
  }
  durationMs(key) {
    return this.parsed(key, parseDurationMs);
  }
  /** A whole number, as a BigInt (any i64). */
  wholeNumber(key) {
    return this.parsed(key, parseWholeNumber);
  }
  invalid(key, why) {
    return new InvalidConfig(`task ${quoted(this.task.name)}: ${key}: ${why}`);
  }
}

/** How long to wait until the earliest of `deadlinesMs` (monotonic ms; undefined ignored):
 * 0 when one has passed, undefined when there is none. */
export function wakeupFor(deadlinesMs) {
  const pending = deadlinesMs.filter((at) => at !== undefined);
  if (pending.length === 0) return undefined;
  return Math.max(0, Math.min(...pending) - nowMs());
}

// ---- checkpoints -------------------------------------------------------------------------

const HEADER = /^caravan-checkpoint v([0-9]{1,10})\n/;
const U32_MAX = 4_294_967_295;

/** `data` (a Uint8Array or a string) under a header naming its `version` (at most
 * 4294967295; `caravan-checkpoint v1\n`): the same bytes every Caravan SDK writes. */
export function encodeCheckpoint(version, data) {
  if (!Number.isInteger(version) || version < 0 || version > U32_MAX) {
    throw new RangeError(`checkpoint version ${version} is out of range`);
  }
  const header = new TextEncoder().encode(`caravan-checkpoint v${version}\n`);
  const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
  const bytes = new Uint8Array(header.length + body.length);
  bytes.set(header);
  bytes.set(body, header.length);
  return bytes;
}

/** `{ version, data }` of a checkpoint `encodeCheckpoint` wrote; throws `Failed` otherwise. */
export function decodeCheckpoint(raw) {
  const newline = raw.indexOf(10);
  const head = newline < 0 ? "" : new TextDecoder().decode(raw.subarray(0, newline + 1));
  const match = HEADER.exec(head);
  if (!match || Number(match[1]) > U32_MAX) {
    throw new Failed("the restored checkpoint has no caravan-checkpoint header");
  }
  return { version: Number(match[1]), data: raw.subarray(newline + 1) };
}

// ---- state -------------------------------------------------------------------------------

const event = (kind, message) => ({ kind, message, timeUnixMs: nowUnixMs() });

function pushEvent(task, newEvent) {
  task.events = [...task.events, newEvent].slice(-MAX_EVENTS_PER_TASK);
}

const isTerminalStatus = (status) => status === "complete" || status === "failed";

/** The alloc's state as the runner reports it; see caravan-runner.d.ts. */
export class State {
  constructor(alloc) {
    this.clientStatus = "pending";
    this.description = "";
    this.taskStates = alloc.tasks.map((t) => ({
      name: t.name,
      state: "pending",
      failed: false,
      restarts: 0,
      events: [event("Received", "Task received by client")],
    }));
    this.lastReported = undefined;
  }

  isTerminal() {
    return isTerminalStatus(this.clientStatus);
  }

  setStatus(status, description) {
    if (!this.isTerminal()) {
      this.clientStatus = status;
      this.description = description;
    }
  }

  task(name) {
    return this.taskStates.find((t) => t.name === name);
  }

  taskStarted(name) {
    this.updateTask(name, (task) => {
      task.state = "running";
      task.failed = false;
      pushEvent(task, event("Started", "Task started by client"));
    });
  }

  taskFinished(name, failed, message) {
    this.updateTask(name, (task) => {
      task.state = "dead";
      task.failed = failed;
      pushEvent(task, event("Terminated", message));
    });
  }

  taskRestarted(name, reason) {
    this.updateTask(name, (task) => {
      task.restarts += 1;
      pushEvent(task, event("Restarting", reason));
      task.state = "running";
      task.failed = false;
    });
  }

  taskSignaled(name, signal) {
    this.taskEvent(name, "Signaling", `Task being sent signal ${signal}`);
  }

  taskEvent(name, kind, message) {
    this.updateTask(name, (task) => pushEvent(task, event(kind, message)));
  }

  killAll(description) {
    for (const task of this.taskStates) {
      if (task.state !== "dead") {
        pushEvent(task, event("Killing", "Sent interrupt"));
        pushEvent(task, event("Killed", "Task successfully killed"));
        task.state = "dead";
      }
    }
    this.setStatus("complete", description);
  }

  snapshot() {
    return { clientStatus: this.clientStatus, description: this.description, taskStates: this.taskStates };
  }

  report() {
    const fingerprint = JSON.stringify(this.snapshot(), (_, v) => (typeof v === "bigint" ? v.toString() : v));
    if (fingerprint === this.lastReported) return;
    try {
      updateState(this.snapshot());
    } catch (refused) {
      throw new HostRefused(String(refused.payload ?? refused));
    }
    this.lastReported = fingerprint;
  }

  updateTask(name, change) {
    const task = this.task(name);
    if (task === undefined) {
      warn(`no task named ${quoted(name)} in this alloc`, "caravan-runner");
      return;
    }
    change(task);
    this.deriveClientStatus();
  }

  deriveClientStatus() {
    if (this.isTerminal()) return;
    const tasks = this.taskStates;
    if (tasks.length > 0 && tasks.every((t) => t.state === "dead")) {
      const failed = tasks.filter((t) => t.failed).map((t) => t.name);
      if (failed.length > 0) this.setStatus("failed", `Failed tasks: ${failed.join(", ")}`);
      else this.setStatus("complete", "All tasks have completed");
    } else if (tasks.some((t) => t.state === "running")) {
      this.clientStatus = "running";
      this.description = "Tasks are running";
    }
  }
}

// ---- the runner and its loop -------------------------------------------------------------

/** A runner written as event handlers; see the loop's rules above. */
export class Runner {
  onStart(alloc, restored, state) {}
  nextWakeupMs() {
    return undefined;
  }
  onWakeup(state) {}
  onUpdate(alloc, state) {}
  onSignal(task, signal, state) {
    for (const t of state.taskStates) {
      if (task == null || t.name === task) state.taskSignaled(t.name, signal);
    }
  }
  onRestartTask(task, state) {
    state.taskRestarted(task, "User requested task to restart");
  }
  onKill(state) {
    state.killAll("alloc was stopped");
  }
  onShutdown() {
    return undefined;
  }
}

function drive(runner, alloc, restored, state) {
  runner.onStart(alloc, restored, state);
  if (state.clientStatus === "pending") state.setStatus("running", "Runner started");
  state.report();
  while (!state.isTerminal()) {
    const wait = runner.nextWakeupMs();
    const timeout = wait === undefined || !Number.isFinite(wait) ? FOREVER : BigInt(Math.max(0, Math.ceil(wait)));
    const next = nextEvent(timeout > FOREVER ? FOREVER : timeout);
    if (next === undefined || next === null) runner.onWakeup(state);
    else if (next.tag === "update") runner.onUpdate(next.val, state);
    else if (next.tag === "signal") runner.onSignal(next.val.task ?? undefined, next.val.signal, state);
    else if (next.tag === "restart-task") runner.onRestartTask(next.val, state);
    else if (next.tag === "kill") runner.onKill(state);
    else if (next.tag === "shutdown") {
      const bytes = runner.onShutdown();
      if (bytes !== undefined && bytes !== null) {
        try {
          checkpoint(bytes);
        } catch (refused) {
          throw new Failed(String(refused.payload ?? refused));
        }
      }
      return;
    }
    state.report();
  }
}

/** Runs `runner` in the loop; throws the runner error to return. */
export function run(runner, alloc, restored) {
  const state = new State(alloc);
  try {
    drive(runner, alloc, restored, state);
  } catch (why) {
    let runnerError;
    let description;
    if (why instanceof InvalidConfig) {
      runnerError = { tag: "invalid-config", val: why.message };
      description = `invalid config: ${why.message}`;
    } else if (why instanceof HostRefused) {
      runnerError = { tag: "failed", val: `host refused state: ${why.message}` };
      description = runnerError.val;
    } else if (why instanceof Failed) {
      runnerError = { tag: "failed", val: why.message };
      description = why.message;
    } else {
      throw why; // a crash: the host names it
    }
    // Worded as the host words it, so the description does not change when the host
    // applies its own rule for `err`; this report only adds the task states.
    state.setStatus("failed", description);
    try {
      state.report();
    } catch {
      // refused: the error below says what went wrong
    }
    throw runnerError;
  }
}

/** What your module exports as `runner`: `export const runner = exportRunner(MyRunner);`. */
export function exportRunner(RunnerClass) {
  return {
    run(alloc, restored) {
      run(new RunnerClass(), alloc, restored);
    },
  };
}
