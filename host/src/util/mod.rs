//! Leaf utilities any room may use: each knows nothing of jobs, runners, clients or servers,
//! and none uses another room of the crate.
//!
//! # Layout
//! - [`backoff`]: the one backoff (doubling, capped, jittered) every retry waits by.
//! - [`blocking`]: turns in the blocking pool for work that may wait there on a fetch.
//! - [`determinism`]: randomness, the wall clock, hash map order and the blocking pool, which
//!   a simulation replaces.
//! - [`fs_tree`]: guest-made directory trees removed iteratively, whatever their depth.
//! - [`histogram`]: a fixed-bucket latency histogram that renders itself for Prometheus.
//! - [`locks`]: `lock_unpoisoned`, the one way the host locks a mutex.
//! - [`prometheus`]: the one writer of the metrics' text format, label values escaped.
//! - [`text`]: a guest's strings cut to a limit and escaped wherever they are shown.
//! - [`timestamp`]: the clock as Unix milliseconds, RFC 3339 UTC timestamps for log lines.
//! - [`units`]: sizes and durations as operators type them.

pub mod backoff;
pub mod blocking;
pub mod determinism;
pub mod fs_tree;
pub mod histogram;
pub mod locks;
pub mod prometheus;
pub mod text;
pub mod timestamp;
pub mod units;
