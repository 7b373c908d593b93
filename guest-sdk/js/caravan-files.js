// Files in the alloc dir, for JavaScript runners (componentize-js). Types: caravan-files.d.ts.
//
// JavaScript under componentize-js has no file API of its own, so this module calls
// `wasi:filesystem` directly: a runner that imports it must be built against the
// `file-runner` world (`componentize-js --world-name file-runner ...`), which adds
// `wasi:filesystem` to `alloc-runner`; built against `alloc-runner`, the build fails with an
// unknown import. Keep it out of runners that need no files: only a runner importing
// `wasi:filesystem` is given an alloc dir at all.
//
// Paths are absolute, as the runner sees them: `/alloc/...` for the alloc dir, or a volume's
// path for the job's volumes (read-only). Every call finishes its work before it returns and
// closes what it opened; an error is thrown as a `FileError` naming the path and WASI's
// error code (`no-entry`, `insufficient-space` past the alloc's disk quota, ...).

import { getDirectories } from "wasi:filesystem/preopens@0.2.12";

/** How much one `read` asks for. */
const READ_CHUNK = 64n * 1024n;

/** A file call failed: `code` is WASI's `error-code` (such as `no-entry`), or `bad-path` for a
 * path outside the alloc dir and the job's volumes or with a `.` or `..` part. */
export class FileError extends Error {
  /** @param {string} message @param {string} code */
  constructor(message, code) {
    super(message);
    this.code = code;
  }
}

/** The directories the host opened for this alloc, asked for once: each handle counts
 * against the alloc's `open_files` for as long as it is held. */
let preopens;
function directories() {
  preopens ??= getDirectories();
  return preopens;
}

/** The opened directory `path` lies under (the deepest one), and `path` relative to it. */
function locate(path) {
  if (typeof path !== "string" || !path.startsWith("/")) {
    throw new FileError(`${JSON.stringify(path)} is not an absolute path: start it with /alloc/`, "bad-path");
  }
  let found;
  for (const [dir, root] of directories()) {
    const under = path === root || path.startsWith(root.endsWith("/") ? root : `${root}/`);
    if (under && (found === undefined || root.length > found.root.length)) found = { dir, root };
  }
  if (found === undefined) {
    throw new FileError(`${path} is not under /alloc or a volume of this job`, "bad-path");
  }
  const parts = path.slice(found.root.length).split("/").filter((part) => part !== "");
  if (parts.some((part) => part === "." || part === "..")) {
    throw new FileError(`${path} has a "." or ".." part: name the file plainly`, "bad-path");
  }
  return { dir: found.dir, relative: parts.length === 0 ? "." : parts.join("/") };
}

/** WASI's error code, when `error` is one thrown by a `wasi:filesystem` call. */
function wasiCode(error) {
  return typeof error?.payload === "string" ? error.payload : undefined;
}

/** Runs `call`, rethrowing WASI's error as a FileError that says what was being done;
 * anything else (a bug) goes up as it is. */
function attempt(what, path, call) {
  try {
    return call();
  } catch (error) {
    const code = wasiCode(error);
    if (code === undefined) throw error;
    throw new FileError(`cannot ${what} ${path}: ${code}`, code);
  }
}

/** Closes a handle now. The bindings stop the engine from collecting a handle once a
 * method was called on it, so one not closed here would stay open (and count against the
 * alloc's `open_files`) until the alloc ends. */
function close(handle) {
  const dispose = handle[Symbol.dispose ?? Symbol.for("dispose")];
  if (typeof dispose !== "function") {
    throw new FileError("cannot close a file: this engine's handles have no dispose method", "io");
  }
  dispose.call(handle);
}

/** Makes the directory `path` and every missing parent (as `mkdir -p`); a part that exists
 * as a file fails with `exist`. */
export function makeDirs(path) {
  const { dir, relative } = locate(path);
  if (relative === ".") return;
  let prefix = "";
  for (const part of relative.split("/").filter((p) => p !== "")) {
    prefix = prefix === "" ? part : `${prefix}/${part}`;
    try {
      dir.createDirectoryAt(prefix);
    } catch (error) {
      const code = wasiCode(error);
      if (code === undefined) throw error;
      const made = code === "exist" && attempt("look at", path, () => dir.statAt({}, prefix)).type === "directory";
      if (!made) throw new FileError(`cannot make the directory ${path}: ${code}`, code);
    }
  }
}

/** Writes `data` (bytes, or a string as UTF-8) to the file `path`, replacing what it held;
 * its directory must exist (`makeDirs`). */
export function writeFile(path, data) {
  const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
  const { dir, relative } = locate(path);
  const file = attempt("open", path, () =>
    dir.openAt({}, relative, { create: true, truncate: true }, { write: true }),
  );
  try {
    let written = 0;
    while (written < bytes.length) {
      const count = attempt("write", path, () => file.write(bytes.subarray(written), BigInt(written)));
      if (count === 0n) throw new FileError(`cannot write ${path}: no progress`, "io");
      written += Number(count);
    }
  } finally {
    close(file);
  }
}

/** The bytes of the file `path`. */
export function readFile(path) {
  const { dir, relative } = locate(path);
  const file = attempt("open", path, () => dir.openAt({}, relative, {}, { read: true }));
  try {
    const chunks = [];
    let length = 0;
    for (;;) {
      const [chunk, ended] = attempt("read", path, () => file.read(READ_CHUNK, BigInt(length)));
      chunks.push(chunk);
      length += chunk.length;
      if (ended || chunk.length === 0) break;
    }
    const bytes = new Uint8Array(length);
    let at = 0;
    for (const chunk of chunks) {
      bytes.set(chunk, at);
      at += chunk.length;
    }
    return bytes;
  } finally {
    close(file);
  }
}

/** The file `path` as text (UTF-8; bytes that are not UTF-8 read as U+FFFD). */
export function readTextFile(path) {
  return new TextDecoder().decode(readFile(path));
}
