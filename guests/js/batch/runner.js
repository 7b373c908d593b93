// Batch, in JavaScript, on the caravan-runner SDK: each task computes the sum of the squares
// of 1..`numbers`, `chunk` numbers at a time (so `kill` and `shutdown` are answered between
// chunks), logs it and ends with it in the task's `Terminated` event; the alloc completes when
// every task has. It behaves as guests/batch (Rust) does, byte for byte (the conformance suite checks it).
//
// Task config (all optional): `numbers` (default 1000, at most 1000000), `chunk` (default
// 100), `result_file` (a file under `/alloc/`, at most 128 bytes, its parts neither empty nor
// `.` or `..`: the task writes `{"numbers":N,"sum":S}` and a newline there when it is done,
// making its directories, and reads it back; a write that fails fails the task with the
// reason as a WASI error code, `Cannot write PATH: is-directory`; the files SDK needs the
// `file-runner` world, which guests/js/build builds this runner against). On `shutdown` it checkpoints each task's progress (version 1: a line
// `name<TAB>next<TAB>sum` per task) and resumes from it.

// @ts-check: `tsc --checkJs` (guests/js/build) checks this against caravan-runner.d.ts.
import * as caravan from "../../../guest-sdk/js/caravan-runner.js";
import { Failed, TaskConfig, exportRunner } from "../../../guest-sdk/js/caravan-runner.js";
import * as files from "../../../guest-sdk/js/caravan-files.js";

const CHECKPOINT_VERSION = 1;
const MAX_NUMBERS = 1_000_000n;
const MAX_RESULT_FILE = 128;

/** Why a write failed, as the WASI error code every language's batch names it by.
 * @param {string} code */
function reason(code) {
  const same = ["is-directory", "not-directory", "no-entry", "insufficient-space", "access", "exist"];
  if (same.includes(code)) return code;
  if (code === "quota") return "insufficient-space";
  if (code === "not-permitted") return "access";
  return "io";
}

/** @param {string} message */
const info = (message) => caravan.info(message, "batch");

/** @typedef {import("../../../guest-sdk/js/caravan-runner.js").State} State */

/** Decimal digits only (no sign), fitting a u64; undefined otherwise.
 * @param {string} text */
function digits(text) {
  if (!/^[0-9]+$/.test(text) || BigInt(text) >= 2n ** 64n) return undefined;
  return BigInt(text);
}

/** Writes `text` to `path` (its directories made first) and reads it back.
 * @param {string} path @param {string} text */
function writeAndReadBack(path, text) {
  files.makeDirs(path.slice(0, path.lastIndexOf("/")) || "/");
  files.writeFile(path, text);
  return files.readTextFile(path);
}

class Summing {
  /** @param {import("../../../guest-sdk/js/caravan-runner.js").Task} task */
  constructor(task) {
    const config = new TaskConfig(task);
    this.name = task.name;
    this.numbers = config.wholeNumber("numbers") ?? 1000n;
    if (this.numbers < 0n || this.numbers > MAX_NUMBERS) {
      throw config.invalid("numbers", `${this.numbers} is not between 0 and ${MAX_NUMBERS}`);
    }
    this.chunk = config.wholeNumber("chunk") ?? 100n;
    if (this.chunk < 1n) throw config.invalid("chunk", `${this.chunk} is not at least 1`);
    this.resultFile = config.get("result_file");
    const path = this.resultFile;
    if (path !== undefined) {
      // A file under /alloc/ named plainly (no empty, `.` or `..` part), so that every
      // language resolves it alike.
      if (new TextEncoder().encode(path).length > MAX_RESULT_FILE) {
        throw config.invalid("result_file", `is longer than ${MAX_RESULT_FILE} bytes`);
      }
      const parts = path.slice("/alloc/".length).split("/");
      if (!path.startsWith("/alloc/") || parts.some((p) => p === "" || p === "." || p === ".." || p.includes("\0"))) {
        throw config.invalid("result_file", `${caravan.quoted(path)} is not a file under /alloc/`);
      }
    }
    this.next = 1n;
    this.sum = 0n;
    this.done = false;
  }
}

class Batch extends caravan.Runner {
  /** @type {Summing[]} */
  tasks = [];

  /** @param {import("../../../guest-sdk/js/caravan-runner.js").Alloc} alloc
   * @param {Uint8Array | undefined} restored @param {State} state */
  onStart(alloc, restored, state) {
    this.tasks = alloc.tasks.map((task) => new Summing(task));
    if (restored !== undefined) this.restore(restored);
    for (const task of this.tasks) state.taskStarted(task.name);
    if (this.tasks.length === 0) state.setStatus("complete", "All tasks have completed");
  }

  /** Each line `name<TAB>next<TAB>sum` of a version 1 checkpoint sets that task's progress;
   * anything else in it is refused, in the same words in every language.
   * @param {Uint8Array} restored */
  restore(restored) {
    const { version, data } = caravan.decodeCheckpoint(restored);
    if (version !== CHECKPOINT_VERSION) {
      throw new Failed(`checkpoint version ${version} is not one this runner reads`);
    }
    const unreadable = new Failed("the restored checkpoint's progress cannot be read");
    let text;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(data);
    } catch {
      throw unreadable;
    }
    for (const line of text.split("\n").filter((l) => l !== "")) {
      const fields = line.split("\t");
      if (fields.length !== 3) throw unreadable;
      const [name, nextText, sumText] = fields;
      const next = digits(nextText);
      const sum = digits(sumText);
      if (next === undefined || next < 1n || next > MAX_NUMBERS + 1n || sum === undefined) throw unreadable;
      const task = this.tasks.find((t) => t.name === name);
      if (task !== undefined) {
        task.next = next;
        task.sum = sum;
        info(`task ${name} resumed at ${task.next}`);
      }
    }
  }

  nextWakeupMs() {
    return this.tasks.some((t) => !t.done) ? 0 : undefined;
  }

  /** @param {State} state */
  onWakeup(state) {
    for (const task of this.tasks.filter((t) => !t.done)) {
      const last = task.numbers < task.next + task.chunk - 1n ? task.numbers : task.next + task.chunk - 1n;
      for (let n = task.next; n <= last; n++) task.sum += n * n;
      task.next = last + 1n;
      if (task.next > task.numbers) {
        task.done = true;
        info(`task ${task.name} computed the sum of squares of 1..${task.numbers}: ${task.sum}`);
        let message = `Computed the sum of squares of 1..${task.numbers}: ${task.sum}`;
        let failed = false;
        const path = task.resultFile;
        if (path !== undefined) {
          const result = `{"numbers":${task.numbers},"sum":${task.sum}}\n`;
          try {
            const read = writeAndReadBack(path, result);
            if (read === result) {
              info(`task ${task.name} wrote ${new TextEncoder().encode(read).length} bytes to ${path}`);
            } else {
              [failed, message] = [true, `${path} reads back otherwise`];
            }
          } catch (error) {
            if (!(error instanceof files.FileError)) throw error;
            [failed, message] = [true, `Cannot write ${path}: ${reason(error.code)}`];
          }
        }
        state.taskFinished(task.name, failed, message);
      }
    }
  }

  onShutdown() {
    const lines = this.tasks.map((t) => `${t.name}\t${t.next}\t${t.sum}\n`).join("");
    return caravan.encodeCheckpoint(CHECKPOINT_VERSION, lines);
  }
}

export const runner = exportRunner(Batch);
