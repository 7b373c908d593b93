// Types of caravan-runner.js: the Caravan runner SDK for JavaScript. The data types are
// `wit/runner.wit`'s as componentize-js maps them (records as objects with camelCase fields,
// enums as their kebab-case names, u64 as bigint, list<u8> as Uint8Array).

export type DesiredStatus = "run" | "stop" | "evict";
export type ClientStatus = "pending" | "running" | "complete" | "failed";
export type TaskLifecycle = "pending" | "running" | "dead";
export type Level = "trace" | "debug" | "info" | "warn" | "error" | "critical";

export interface Task {
  name: string;
  /** Key/value settings, in the order written in the job file. */
  config: [string, string][];
}

export interface Alloc {
  id: string;
  jobId: string;
  group: string;
  tasks: Task[];
  desiredStatus: DesiredStatus;
  modifyIndex: bigint;
  meta: [string, string][];
}

export interface TaskEvent {
  kind: string;
  message: string;
  timeUnixMs: bigint;
}

export interface TaskState {
  name: string;
  state: TaskLifecycle;
  failed: boolean;
  restarts: number;
  events: TaskEvent[];
}

export interface AllocState {
  clientStatus: ClientStatus;
  description: string;
  taskStates: TaskState[];
}

/** `next-event`'s "as long as it takes". */
export const FOREVER: bigint;
/** How many events the host keeps per task. */
export const MAX_EVENTS_PER_TASK: number;

/** Throw it from a handler: the alloc cannot run as configured (say which task and key). */
export class InvalidConfig extends Error {}
/** Throw it from a handler: the alloc cannot go on; the message is its description. */
export class Failed extends Error {}
/** The host refused a report. */
export class HostRefused extends Error {}

export function log(level: Level, message: string, context?: string): void;
export function trace(message: string, context?: string): void;
export function debug(message: string, context?: string): void;
export function info(message: string, context?: string): void;
export function warn(message: string, context?: string): void;
export function error(message: string, context?: string): void;
/** The host's monotonic clock, in whole milliseconds. */
export function nowMs(): number;
/** Milliseconds since the Unix epoch. */
export function nowUnixMs(): bigint;
/** `text` quoted as every SDK's errors quote it, as Rust's `{:?}` does. */
export function quoted(text: string): string;
/** `500ms`, `5s`, `2m`, `1h` in milliseconds; throws an Error naming `text` otherwise. */
export function parseDurationMs(text: string): number;
/** Milliseconds until the earliest deadline (0 when one passed); undefined for none. */
export function wakeupFor(deadlinesMs: (number | undefined)[]): number | undefined;

/** One task's config; errors are `InvalidConfig` naming the task and the key. */
export class TaskConfig {
  constructor(task: Task);
  readonly task: Task;
  get(key: string): string | undefined;
  parsed<T>(key: string, parse: (value: string) => T): T | undefined;
  durationMs(key: string): number | undefined;
  wholeNumber(key: string): bigint | undefined;
  invalid(key: string, why: string): InvalidConfig;
}

/** `data` under the versioned header every Caravan SDK writes (`caravan-checkpoint v1\n`);
 * `version` is at most 4294967295. */
export function encodeCheckpoint(version: number, data: Uint8Array | string): Uint8Array;
/** The version and data of a checkpoint `encodeCheckpoint` wrote; throws `Failed` otherwise. */
export function decodeCheckpoint(raw: Uint8Array): { version: number; data: Uint8Array };

/** The alloc's state as the runner reports it. Its status follows the tasks: `running` once
 * any task runs, `complete` when every task is dead and none failed, `failed` when every task
 * is dead and one failed. A status set with `setStatus` holds until the next task change; a
 * terminal one is final. */
export class State {
  constructor(alloc: Alloc);
  clientStatus: ClientStatus;
  description: string;
  taskStates: TaskState[];
  isTerminal(): boolean;
  /** Sets the status yourself; after a terminal one, changes nothing. */
  setStatus(status: ClientStatus, description: string): void;
  task(name: string): TaskState | undefined;
  /** Task running, with a `Started` event. */
  taskStarted(name: string): void;
  /** Task dead, with a `Terminated` event saying `message`. */
  taskFinished(name: string, failed: boolean, message: string): void;
  /** A restart counted, with a `Restarting` event; the task runs. */
  taskRestarted(name: string, reason: string): void;
  /** Nomad's `Signaling` event. */
  taskSignaled(name: string, signal: string): void;
  /** An event of your own kind. */
  taskEvent(name: string, kind: string, message: string): void;
  /** Every task not dead killed (`Killing`, `Killed`); the alloc `complete`. */
  killAll(description: string): void;
  snapshot(): AllocState;
  /** Sends the state when it changed; throws `HostRefused` when the host refuses it. */
  report(): void;
}

/** A runner as event handlers; extend it and override what differs. */
export class Runner {
  /** Check the config, start the tasks. `restored`: the last checkpoint, when resuming. */
  onStart(alloc: Alloc, restored: Uint8Array | undefined, state: State): void;
  /** How long to wait for an event before `onWakeup`; undefined waits for ever. */
  nextWakeupMs(): number | undefined;
  onWakeup(state: State): void;
  onUpdate(alloc: Alloc, state: State): void;
  /** Default: `Signaling` events on the task (every task when `task` is undefined). */
  onSignal(task: string | undefined, signal: string, state: State): void;
  /** Default: a restart counted. */
  onRestartTask(task: string, state: State): void;
  /** Default: `state.killAll("alloc was stopped")`. */
  onKill(state: State): void;
  /** The bytes to resume from (`encodeCheckpoint` them), or undefined to save nothing. The
   * state is not reported after this, so it is not handed over. */
  onShutdown(): Uint8Array | undefined;
}

/** Runs `runner` in the loop; throws the runner error to return from `run`. */
export function run(runner: Runner, alloc: Alloc, restored: Uint8Array | undefined): void;
/** What your module exports as `runner`. */
export function exportRunner(runnerClass: new () => Runner): {
  run(alloc: Alloc, restored: Uint8Array | undefined): void;
};
