//! The Caravan host: runs WebAssembly alloc runners under a Nomad-style client core.
//!
//! # Layout
//! From the top (each room may use only those below it: `tests/all/module_map.rs` checks it,
//! and the README's architecture section draws it):
//! - [`cli`]: the `caravan` command line: each command group's flags, output and exit status;
//!   the client commands (`job run`, `alloc status`, ...) over HTTP.
//! - [`agent`]: `caravan agent`, the composition root: server, client and HTTP API.
//! - [`nodesim`]: many simulated client nodes in one process, behind `caravan nodesim`.
//! - [`run`]: one alloc to completion without an agent, behind `caravan run`.
//! - [`check`]: the contract checker behind `caravan runner check`, for runner authors.
//! - [`cluster`]: cluster mode on etcd: the store, membership, and the elected scheduler.
//! - [`runtime`]: everything wasmtime; [`runtime::WasmAllocRunner`] runs an alloc in its own
//!   sandbox.
//! - [`client`]: the client core: alloc map, server watch and sync, garbage collector.
//! - [`server`]: the embedded server (jobs, placement, server-side GC) behind
//!   [`rpc::ServerApi`], which the agent hosts.
//! - [`runner_store`]: runner components by content (SHA-256) under the data dir, fetched
//!   from the cluster's other agents when missing, collected when no job uses them.
//! - [`acl`]: ACL tokens, their roles and what each may do, and where a single agent keeps
//!   them.
//! - [`allocrunner`]: the seam: the [`allocrunner::AllocRunner`] trait, its config and factory,
//!   and the native [`allocrunner::EmptyAllocRunner`].
//! - [`state`]: the state store ([`state::StateDb`]) the client and server save to, so a
//!   restart loses nothing.
//! - [`rpc`]: the client-server seam ([`rpc::ServerApi`]), the one module `client` and
//!   `server` share, with what every server implementation promises.
//! - [`alloc_logs`]: alloc log files, their one owner: layout, queued writing, rotation,
//!   reading, following and deletion.
//! - [`telemetry`]: the process's tracing subscriber (text or JSON) and its stderr writer.
//! - [`model`]: the job model: allocs and their state, job files, limits, capabilities, the
//!   restart and reschedule policies.
//! - [`util`]: leaf helpers: backoff, locks, units, timestamps, guest text, histograms,
//!   directory trees.
//! - [`alloc_fs`]: an alloc dir read for its operator, confined to it (`alloc fs`).
//! - [`tls`]: the PEM files, rustls configurations and certificate roles of TLS on the API.
//! - [`shutdown`]: Ctrl-C and SIGTERM as shutdown stages the commands wait on.
//! - [`scaffold`]: the files of a new runner, behind `caravan runner new`.
//! - `testing` (feature `testing` only): seams that fail on demand, an in-memory server.
//!
//! Arrows of use point one way: `run` -> `runtime` -> `allocrunner` -> `model`, and
//! `client` -> `allocrunner` (the client never sees wasmtime: it is given a factory);
//! `client` and `server` -> `state` -> `model`; `client` and `server` -> `rpc` (and never
//! each other); `allocrunner`, `runtime`, `client` and the agent's HTTP API -> `alloc_logs`;
//! everything -> `util`, which uses nothing.

pub mod acl;
pub mod agent;
pub mod alloc_fs;
pub mod alloc_logs;
pub mod allocrunner;
pub mod check;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod model;
pub mod nodesim;
pub mod rpc;
pub mod run;
pub mod runner_store;
pub mod runtime;
pub mod scaffold;
pub mod server;
pub mod shutdown;
pub mod state;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
pub mod util;
