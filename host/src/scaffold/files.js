// @ts-check
// {name}: a Caravan batch runner, made by `caravan runner new --files`. It writes
// /alloc/out/result.json (the alloc's id and its number of tasks), reads it back, logs it and
// ends each task with it; `caravan alloc fs ALLOC out/result.json` shows the file.
// JavaScript has no file API of its own here: out/caravan-files.js (copied there by ./build
// from the Caravan checkout's guest-sdk/js) calls wasi:filesystem, which is why ./build uses
// the `file-runner` world. The SDK's types and docs (out/caravan-runner.d.ts) give the event
// loop's rules and every hook.

import * as caravan from "./out/caravan-runner.js";
import * as files from "./out/caravan-files.js";

/** @typedef {import("./out/caravan-runner.js").State} State */

const RESULT = "/alloc/out/result.json";

class Files extends caravan.Runner {
  /** @param {import("./out/caravan-runner.js").Alloc} alloc
   * @param {Uint8Array | undefined} restored @param {State} state */
  onStart(alloc, restored, state) {
    const result = JSON.stringify({ alloc: alloc.id, tasks: alloc.tasks.length }) + "\n";
    let written;
    try {
      files.makeDirs("/alloc/out");
      files.writeFile(RESULT, result);
      written = files.readTextFile(RESULT);
    } catch (error) {
      if (error instanceof files.FileError) throw new caravan.Failed(error.message);
      throw error;
    }
    caravan.info(`wrote ${RESULT}: ${written.trim()}`, "{name}");
    for (const task of alloc.tasks) {
      state.taskStarted(task.name);
      state.taskFinished(task.name, false, `Wrote ${RESULT}`);
    }
    if (alloc.tasks.length === 0) state.setStatus("complete", "All tasks have completed");
  }
}

export const runner = caravan.exportRunner(Files);
