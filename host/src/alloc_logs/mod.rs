//! Alloc log files, with one owner: where they live under the data dir, how lines are written
//! and rotated, how they are read and followed, and how they are deleted.
//!
//! Layout: `<data dir>/logs/<alloc id>.log`, the current file, beside `<alloc id>.log.1` and
//! `.2`, older, rotated by size ([`LOG_FILE_MAX_BYTES`], [`LOG_FILES_KEPT`]). The directory is
//! outside every alloc dir, so a guest can neither read nor forge it.
//!
//! - [`AllocLogs`] (one per agent, cheap to clone) hands out writers, reads, follows and
//!   removes.
//! - [`AllocLogWriter`] (one per alloc, cheap to clone) takes a guest's lines without ever
//!   waiting on the disk: each line joins a bounded per-alloc queue that a writer task drains
//!   in batches; a line that finds the queue full is dropped and counted, per alloc and per
//!   agent (`caravan_alloc_log_lines_dropped_total`). Lines of one alloc reach its file in the
//!   order they were written, up to [`WRITE_BEHIND`] after (see "Write-behind" below).
//! - [`LogFollower`] reads everything kept, then what is appended, across rotations, each line
//!   once and in order, until the caller says the alloc has stopped.
//!
//! Invariants, and why:
//! - Every file operation of one alloc (batch write, rotation, read, deletion) happens under
//!   that alloc's file lock, so a reader never sees half a batch and a rotation never renames
//!   a file under a reader's feet.
//! - The lock also holds the count of rotations, which is how a follower knows which file its
//!   next line is in: lines are never skipped or repeated across a rotation.
//! - [`AllocLogs::settle`] returns once every line written before it is in the file (or known
//!   lost): reads after a runner stopped see all of its lines.
//! - Deletion discards queued lines on purpose (the alloc is going away), refuses later
//!   writes, and is never fatal: a file that cannot be removed is logged and left.
//! - Shutdown drains: the agent calls [`AllocLogs::settle_all`] after its runners stop.
//!
//! Write-behind: a line waits in its queue up to [`WRITE_BEHIND`] before the writer takes it
//! to the file, unless the log is read, followed or settled through this module (each of
//! which has the writer go at once, so those readers never see the delay; one reading the
//! file itself does) or the queue is half full. The lines that arrive meanwhile go in the
//! same write; and a short alloc collected before its lines were due never makes a file at
//! all (nor, knowing that, tries to delete one: `on_disk`), where a churn of them would
//! otherwise create, write and delete one file per alloc (about a tenth of a churn's CPU,
//! measured in docs/bench/history.md). A line written where there
//! is no tokio runtime is written at once, by the writing thread. What it costs: a process
//! killed outright loses up to [`WRITE_BEHIND`] of lines from the files, not from the
//! agent's log, which has every line its level filter lets through (docs/decisions.md).
//!
//! This module is a leaf: it uses std, tokio and tracing, and never the client, the server,
//! the runtime or wasmtime.

mod file;
mod follow;
mod log;
mod on_disk;
#[cfg(test)]
mod tests;

pub use file::parse_line;
pub use follow::LogFollower;

/// One line of an alloc's log file, taken apart by [`parse_line`]: its parts as kept, the
/// guest's text with its control characters escaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LogLine<'a> {
    /// RFC 3339 UTC, to the millisecond.
    pub time: &'a str,
    /// `TRACE` to `ERROR`.
    pub level: &'a str,
    /// The `wasi:logging` context, or `stdout` or `stderr`.
    pub source: &'a str,
    /// What the runner wrote.
    pub message: &'a str,
}

use crate::util::locks::LockUnpoisoned;
use log::AllocLog;
use on_disk::FilesOnDisk;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Largest size of one log file before it is rotated.
pub const LOG_FILE_MAX_BYTES: u64 = 1024 * 1024;
/// Rotated files kept besides the current one (`<id>.log.1` is the newest of them).
pub const LOG_FILES_KEPT: usize = 2;
/// Most lines waiting for one alloc's writer; more are dropped. A second of the default rate
/// limit, so only a disk slower than the guest's bursts loses lines.
pub const QUEUE_MAX_LINES: usize = 1024;
/// Most bytes waiting for one alloc's writer, so a queue of long lines stays small too.
pub const QUEUE_MAX_BYTES: usize = 512 * 1024;
/// Longest a line waits in its queue before the writer takes it to the file, when nobody
/// reads, follows or settles the log and the queue is less than half full.
pub const WRITE_BEHIND: std::time::Duration = std::time::Duration::from_secs(1);

/// The name `/v1/metrics` gives the agent-wide count of dropped lines.
pub const DROPPED_METRIC: &str = "caravan_alloc_log_lines_dropped_total";

/// The agent's alloc logs: one directory, one writer queue per alloc. Cheap to clone; clones
/// share everything.
///
/// Everything may be used from any thread. Writing needs no runtime: the queue is drained on
/// the tokio runtime current at the time of the write (without one, the writing thread drains
/// it itself). Reading, following, settling and removing are async and need a tokio runtime
/// (file work runs on its blocking pool).
#[derive(Clone)]
pub struct AllocLogs {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// Weak, so the log of an alloc nobody writes, reads or follows any more is freed; a live
    /// one is shared, so every user of an alloc's log takes the same file lock.
    allocs: Mutex<Registry>,
    dropped: AtomicU64,
    on_disk: Arc<FilesOnDisk>,
}

#[derive(Default)]
struct Registry {
    logs: HashMap<String, Weak<AllocLog>>,
    /// Dead entries are pruned when the map reaches this size.
    prune_at: usize,
}

impl std::fmt::Debug for AllocLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocLogs")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl AllocLogs {
    /// The logs of the agent whose data dir is `data_dir` (they go under `logs/` in it).
    pub fn under_data_dir(data_dir: &Path) -> Self {
        Self::in_dir(data_dir.join("logs"))
    }

    /// Logs kept directly in `dir` (created on the first line). Lists `dir` once, to know
    /// which allocs have files there already: one owner per directory, as the module says.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        AllocLogs {
            inner: Arc::new(Inner {
                on_disk: Arc::new(FilesOnDisk::list(&dir)),
                dir,
                allocs: Mutex::new(Registry::default()),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// The directory every alloc's files are in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// `alloc_id` comes back after a restart: a removal of its log looks for files, whatever
    /// the listing of the directory found (an earlier owner may have written them since).
    pub fn restored(&self, alloc_id: &str) {
        self.inner.on_disk.writing(alloc_id);
    }

    /// The writer of `alloc_id`'s log: every clone of it, and every later call for the same
    /// alloc while one is alive, feeds the same queue.
    pub fn writer(&self, alloc_id: &str) -> AllocLogWriter {
        AllocLogWriter {
            log: self.log(alloc_id),
            owner: self.inner.clone(),
        }
    }

    /// Everything kept of `alloc_id`'s log, oldest first, with every line written before this
    /// call. An alloc that never logged has an empty log.
    pub async fn read(&self, alloc_id: &str) -> std::io::Result<Vec<u8>> {
        let log = self.log(alloc_id);
        log.settle().await;
        LogFollower::new(log, || true).read_new().await
    }

    /// A follower of `alloc_id`'s log that ends once `stopped` says the alloc has stopped and
    /// the last of its lines has been read.
    pub fn follow(
        &self,
        alloc_id: &str,
        stopped: impl Fn() -> bool + Send + Sync + 'static,
    ) -> LogFollower {
        LogFollower::new(self.log(alloc_id), stopped)
    }

    /// Returns once every line written to `alloc_id`'s log before the call is in its file, or
    /// known lost (a failed disk, a deletion).
    pub async fn settle(&self, alloc_id: &str) {
        self.log(alloc_id).settle().await;
    }

    /// [`AllocLogs::settle`] for every alloc with a live writer: the agent calls it when it
    /// stops, after its runners, so nothing they logged is lost with the process.
    pub async fn settle_all(&self) {
        let logs: Vec<Arc<AllocLog>> = self
            .inner
            .allocs
            .lock_unpoisoned()
            .logs
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for log in logs {
            log.settle().await;
        }
    }

    /// Deletes `alloc_id`'s files, discarding lines still queued for them and refusing later
    /// ones. Never fails: what cannot be removed is logged at WARN and left.
    pub async fn remove(&self, alloc_id: &str) {
        self.writer(alloc_id).remove().await;
    }

    /// Lines dropped because an alloc's queue was full, over every alloc since the agent
    /// started.
    pub fn lines_dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Writes the logs' counters in Prometheus' text format.
    pub fn write_prometheus(&self, out: &mut String) {
        use crate::util::prometheus::{Kind, single};
        single(
            out,
            DROPPED_METRIC,
            Kind::Counter,
            "Alloc log lines dropped because the log writer fell behind.",
            self.lines_dropped(),
        );
    }

    /// The shared log of `alloc_id`, made if no one holds it.
    fn log(&self, alloc_id: &str) -> Arc<AllocLog> {
        let mut registry = self.inner.allocs.lock_unpoisoned();
        if let Some(log) = registry.logs.get(alloc_id).and_then(Weak::upgrade) {
            return log;
        }
        let log = Arc::new(AllocLog::new(
            alloc_id,
            file::current_file(&self.inner.dir, alloc_id),
            self.inner.on_disk.clone(),
        ));
        if registry.logs.len() >= registry.prune_at {
            registry.logs.retain(|_, log| log.strong_count() > 0);
            registry.prune_at = (registry.logs.len() * 2).max(64);
        }
        registry
            .logs
            .insert(alloc_id.to_string(), Arc::downgrade(&log));
        log
    }
}

/// Where one alloc's guest lines go. Cheap to clone; clones share the queue and its order.
#[derive(Clone)]
pub struct AllocLogWriter {
    log: Arc<AllocLog>,
    owner: Arc<Inner>,
}

impl AllocLogWriter {
    /// Queues one line for the file, stamped now, and returns at once: never waits on the
    /// disk. A line that finds the queue full is dropped and counted.
    pub fn write(&self, level: tracing::Level, source: &str, message: &str) {
        if !self.log.enqueue(level, source, message) {
            self.owner.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lines of this alloc dropped because its queue was full.
    pub fn lines_dropped(&self) -> u64 {
        self.log.lines_dropped()
    }

    /// Deletes this alloc's files, as [`AllocLogs::remove`] does, on the blocking pool.
    pub async fn remove(&self) {
        let writer = self.clone();
        let removed =
            crate::util::determinism::spawn_blocking(move || writer.remove_blocking()).await;
        if let Err(error) = removed {
            tracing::warn!(alloc_id = %self.log.alloc_id, error = %error, "cannot remove the alloc's log files");
        }
    }

    /// As [`AllocLogWriter::remove`] when the alloc has no file to delete, without the disk,
    /// so on any thread: true when done; false, having done nothing, when a file may exist
    /// (or a batch is being written), for the caller to go on with a removal that may wait.
    pub fn remove_if_nothing_on_disk(&self) -> bool {
        // Unregistered before it refuses lines, as in any removal: a writer asked for from
        // then on gets a new log, not this one.
        self.log
            .remove_if_nothing_on_disk(|| self.owner.forget(&self.log))
    }

    /// As [`AllocLogWriter::remove`], on the calling thread: for a caller already on the
    /// blocking pool with more of the alloc's files to remove, so that one trip does it all.
    pub fn remove_blocking(&self) {
        self.owner.forget(&self.log);
        self.log.remove_blocking();
    }
}

impl Inner {
    /// Unregisters `log`, and only it: a newer log of the same alloc stays.
    fn forget(&self, log: &Arc<AllocLog>) {
        let mut registry = self.allocs.lock_unpoisoned();
        let registered = registry.logs.get(&log.alloc_id);
        if registered.is_some_and(|known| std::ptr::eq(known.as_ptr(), Arc::as_ptr(log))) {
            registry.logs.remove(&log.alloc_id);
        }
    }
}
