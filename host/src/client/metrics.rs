//! Counters the client keeps for the agent to expose: allocs marked and collected (by
//! reason), destroys in flight, sync batches sent and failed, runners that failed to build, state commits.
//! Allocs by client status are counted from the alloc map when asked.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The client's counters. Cheap to update from any task.
#[derive(Default, Debug)]
pub struct Metrics {
    marked: AtomicU64,
    collected: Mutex<BTreeMap<&'static str, u64>>,
    destroys_in_flight: AtomicU64,
    sync_batches_sent: AtomicU64,
    sync_batches_failed: AtomicU64,
    runner_build_failures: AtomicU64,
    state_batches_saved: AtomicU64,
    state_writes_saved: AtomicU64,
}

/// A copy of every counter at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetricsSnapshot {
    /// Allocs the client holds, by client status.
    pub allocs_by_status: BTreeMap<String, u64>,
    /// Of those, allocs already collected (destroyed, still in the map).
    pub allocs_destroyed: u64,
    /// Allocs marked for collection.
    pub allocs_marked: u64,
    /// Allocs collected, by reason kind (`alloc_count`, `disk_usage`, `inode_usage`, `forced`,
    /// `forced_full_node`, `server_removed`).
    pub allocs_collected: BTreeMap<String, u64>,
    /// Destroys running now.
    pub destroys_in_flight: u64,
    /// Update batches the server took.
    pub sync_batches_sent: u64,
    /// Update batches that failed and were kept for a retry.
    pub sync_batches_failed: u64,
    /// Allocs failed because their runner could not be built.
    pub runner_build_failures: u64,
    /// Commits to the state store.
    pub state_batches_saved: u64,
    /// Records written by those commits (allocs, states, checkpoints, marks).
    pub state_writes_saved: u64,
}

impl Metrics {
    pub(crate) fn marked(&self) {
        self.marked.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn collected(&self, reason_kind: &'static str) {
        *self
            .collected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason_kind)
            .or_default() += 1;
    }

    pub(crate) fn destroy_started(&self) {
        self.destroys_in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn destroy_finished(&self) {
        self.destroys_in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn sync_batch_sent(&self) {
        self.sync_batches_sent.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn sync_batch_failed(&self) {
        self.sync_batches_failed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn runner_build_failed(&self) {
        self.runner_build_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn state_batch_saved(&self, writes: u64) {
        self.state_batches_saved.fetch_add(1, Ordering::Relaxed);
        self.state_writes_saved.fetch_add(writes, Ordering::Relaxed);
    }

    /// The counters now, with the alloc counts filled in by the caller.
    pub fn snapshot(
        &self,
        allocs_by_status: BTreeMap<String, u64>,
        allocs_destroyed: u64,
    ) -> MetricsSnapshot {
        MetricsSnapshot {
            allocs_by_status,
            allocs_destroyed,
            allocs_marked: self.marked.load(Ordering::Relaxed),
            allocs_collected: self
                .collected
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(kind, count)| (kind.to_string(), *count))
                .collect(),
            destroys_in_flight: self.destroys_in_flight.load(Ordering::Relaxed),
            sync_batches_sent: self.sync_batches_sent.load(Ordering::Relaxed),
            sync_batches_failed: self.sync_batches_failed.load(Ordering::Relaxed),
            runner_build_failures: self.runner_build_failures.load(Ordering::Relaxed),
            state_batches_saved: self.state_batches_saved.load(Ordering::Relaxed),
            state_writes_saved: self.state_writes_saved.load(Ordering::Relaxed),
        }
    }
}
