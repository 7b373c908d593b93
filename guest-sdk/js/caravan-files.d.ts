// Types of caravan-files.js: files in the alloc dir, for runners built against the
// `file-runner` world. Paths are absolute as the runner sees them (`/alloc/...`).

/** A file call failed: `code` is WASI's `error-code` (such as `no-entry`, or
 * `insufficient-space` past the alloc's disk quota), or `bad-path` for a path outside the
 * alloc dir and the job's volumes or with a `.` or `..` part. */
export class FileError extends Error {
  constructor(message: string, code: string);
  readonly code: string;
}

/** Makes the directory `path` and every missing parent (as `mkdir -p`); a part that exists
 * as a file fails with `exist`. */
export function makeDirs(path: string): void;
/** Writes `data` (bytes, or a string as UTF-8) to the file `path`, replacing what it held;
 * its directory must exist (`makeDirs`). */
export function writeFile(path: string, data: Uint8Array | string): void;
/** The bytes of the file `path`. */
export function readFile(path: string): Uint8Array;
/** The file `path` as text (UTF-8; bytes that are not UTF-8 read as U+FFFD). */
export function readTextFile(path: string): string;
