//! The Caravan host: runs WebAssembly alloc runners under a Nomad-style client core.
//!
//! # Layout
//! - [`agent`]: `caravan agent`, the composition root: server, client and HTTP API.
//! - [`alloc_fs`]: an alloc dir read for its operator, confined to it (`alloc fs`).
//! - [`alloc_logs`]: alloc log files, their one owner: layout, queued writing, rotation,
//!   reading, following and deletion.
//! - [`structs`]: plain data shared by every layer (allocs, alloc state).
//! - [`limits`]: every per-alloc limit, its key, default and cap, and their one parser.
//! - [`backoff`]: the one backoff (doubling, capped, jittered) every retry waits by.
//! - [`allocrunner`]: the seam: the [`allocrunner::AllocRunner`] trait, its config and factory,
//!   and the native [`allocrunner::EmptyAllocRunner`].
//! - [`check`]: the contract checker behind `caravan runner check`, for runner authors.
//! - [`cli`]: the `caravan` command line: each command group's flags, output and exit status;
//!   the client commands (`job run`, `alloc status`, ...) over HTTP.
//! - [`client`]: the client core: alloc map, server watch and sync, garbage collector.
//! - [`runtime`]: everything wasmtime; [`runtime::WasmAllocRunner`] runs an alloc in its own
//!   sandbox.
//! - [`locks`]: `lock_unpoisoned`, the one way the host locks a mutex.
//! - [`jobspec`]: job files (TOML) and their JSON form, validated field by field.
//! - [`nodesim`]: many simulated client nodes in one process, behind `caravan nodesim`.
//! - [`reschedule`]: a job's reschedule policy and the arithmetic of its decisions: when a
//!   failed alloc is replaced, and when no more.
//! - [`rpc`]: the client-server seam ([`rpc::ServerApi`]), the one module `client` and
//!   `server` share, with what every server implementation promises.
//! - [`server`]: the embedded server (jobs, placement, server-side GC) behind
//!   [`rpc::ServerApi`], which the agent hosts.
//! - [`state`]: the state store ([`state::StateDb`]) the client and server save to, so a
//!   restart loses nothing.
//! - [`run`]: one alloc to completion without an agent, behind `caravan run`.
//! - [`shutdown`]: Ctrl-C and SIGTERM as shutdown stages the commands wait on.
//! - [`telemetry`]: the process's tracing subscriber (text or JSON) and its stderr writer.
//! - [`text`]: escaping what guests write before it is logged or shown.
//! - [`timestamp`]: the clock as Unix milliseconds, RFC 3339 UTC timestamps for log lines.
//! - [`units`]: sizes and durations as operators type them.
//! - `testing` (feature `testing` only): seams that fail on demand, an in-memory server.
//!
//! Arrows of use point one way: `run` -> `runtime` -> `allocrunner` -> `structs`, and
//! `client` -> `allocrunner` (the client never sees wasmtime: it is given a factory);
//! `client` and `server` -> `state` -> `structs`; `client` and `server` -> `rpc` (and never
//! each other); `allocrunner`, `runtime`, `client` and the agent's HTTP API -> `alloc_logs`,
//! a leaf; `alloc_logs` and `telemetry` -> `timestamp`, another.

pub mod agent;
pub mod alloc_fs;
pub mod alloc_logs;
pub mod allocrunner;
pub mod backoff;
pub mod capabilities;
pub mod check;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod fs_tree;
pub mod histogram;
pub mod jobspec;
pub mod limits;
pub mod locks;
pub mod nodesim;
pub mod reschedule;
pub mod restart;
pub mod rpc;
pub mod run;
pub mod runtime;
pub mod scaffold;
pub mod server;
pub mod shutdown;
pub mod state;
pub mod structs;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod text;
pub mod timestamp;
pub mod units;
