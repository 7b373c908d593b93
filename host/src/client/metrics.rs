//! Counters the client keeps for the agent to expose: allocs marked and collected (by
//! reason), destroys in flight (and their peak), sync batches sent and failed, runners that failed to build, state commits.
//! Allocs by client status are counted from the alloc map when asked. A snapshot renders
//! itself in Prometheus' text format for the agent's `/v1/metrics`. Counting only: it never
//! reads the alloc map or decides anything.

use crate::util::locks::LockUnpoisoned;
use crate::util::prometheus::{self, Kind};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The client's counters. Cheap to update from any task.
#[derive(Default, Debug)]
pub struct Metrics {
    marked: AtomicU64,
    collected: Mutex<BTreeMap<&'static str, u64>>,
    destroys_in_flight: AtomicU64,
    destroys_in_flight_peak: AtomicU64,
    sync_batches_sent: AtomicU64,
    sync_batches_failed: AtomicU64,
    runner_build_failures: AtomicU64,
    state_batches_saved: AtomicU64,
    state_writes_saved: AtomicU64,
    leftover_dirs: AtomicU64,
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
    /// The most destroys that ever ran at once: what shows that `gc_parallel_destroys`
    /// held through a burst no sampling of the gauge above would catch.
    pub destroys_in_flight_peak: u64,
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
    /// Alloc directories no alloc owns that the last sweep could not remove (each retried at
    /// the next one, and named in the log).
    pub leftover_dirs: u64,
}

impl Metrics {
    pub(crate) fn marked(&self) {
        self.marked.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn collected(&self, reason_kind: &'static str) {
        *self
            .collected
            .lock_unpoisoned()
            .entry(reason_kind)
            .or_default() += 1;
    }

    /// Allocs collected, over every reason.
    pub(crate) fn collected_total(&self) -> u64 {
        self.collected.lock_unpoisoned().values().sum()
    }

    pub(crate) fn destroy_started(&self) {
        let now = self.destroys_in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.destroys_in_flight_peak
            .fetch_max(now, Ordering::Relaxed);
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

    pub(crate) fn set_leftover_dirs(&self, count: u64) {
        self.leftover_dirs.store(count, Ordering::Relaxed);
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
                .lock_unpoisoned()
                .iter()
                .map(|(kind, count)| (kind.to_string(), *count))
                .collect(),
            destroys_in_flight: self.destroys_in_flight.load(Ordering::Relaxed),
            destroys_in_flight_peak: self.destroys_in_flight_peak.load(Ordering::Relaxed),
            sync_batches_sent: self.sync_batches_sent.load(Ordering::Relaxed),
            sync_batches_failed: self.sync_batches_failed.load(Ordering::Relaxed),
            runner_build_failures: self.runner_build_failures.load(Ordering::Relaxed),
            state_batches_saved: self.state_batches_saved.load(Ordering::Relaxed),
            state_writes_saved: self.state_writes_saved.load(Ordering::Relaxed),
            leftover_dirs: self.leftover_dirs.load(Ordering::Relaxed),
        }
    }
}

impl MetricsSnapshot {
    /// Writes every counter in Prometheus' text format (0.0.4), one family after another.
    pub fn write_prometheus(&self, out: &mut String) {
        let unlabelled = |value: u64| vec![(None, value)];
        family(
            out,
            "caravan_client_allocs",
            Kind::Gauge,
            "Allocs on this client by client status.",
            labelled("status", &self.allocs_by_status),
        );
        family(
            out,
            "caravan_client_allocs_destroyed",
            Kind::Gauge,
            "Allocs collected and still listed.",
            unlabelled(self.allocs_destroyed),
        );
        family(
            out,
            "caravan_gc_marked_total",
            Kind::Counter,
            "Allocs marked for garbage collection.",
            unlabelled(self.allocs_marked),
        );
        family(
            out,
            "caravan_gc_collected_total",
            Kind::Counter,
            "Allocs collected, by reason.",
            labelled("reason", &self.allocs_collected),
        );
        family(
            out,
            "caravan_gc_destroys_in_flight",
            Kind::Gauge,
            "Destroys running now.",
            unlabelled(self.destroys_in_flight),
        );
        family(
            out,
            "caravan_gc_destroys_in_flight_peak",
            Kind::Gauge,
            "The most destroys that ran at once since the client started.",
            unlabelled(self.destroys_in_flight_peak),
        );
        family(
            out,
            "caravan_sync_batches_total",
            Kind::Counter,
            "Alloc update batches sent to the server, by result.",
            vec![
                (Some(("result", "sent".to_string())), self.sync_batches_sent),
                (
                    Some(("result", "failed".to_string())),
                    self.sync_batches_failed,
                ),
            ],
        );
        family(
            out,
            "caravan_runner_build_failures_total",
            Kind::Counter,
            "Allocs failed because their runner could not be built.",
            unlabelled(self.runner_build_failures),
        );
        family(
            out,
            "caravan_client_leftover_dirs",
            Kind::Gauge,
            "Alloc directories no alloc owns that the last sweep could not remove.",
            unlabelled(self.leftover_dirs),
        );
    }
}

/// One sample's label (`None`: unlabelled) and value.
type Sample = (Option<(&'static str, String)>, u64);

/// One metric family: its `HELP` and `TYPE` lines, then a sample per label.
fn family(out: &mut String, name: &str, kind: Kind, help: &str, samples: Vec<Sample>) {
    prometheus::header(out, name, kind, help);
    for (label, value) in samples {
        match &label {
            Some((label, key)) => prometheus::sample(out, name, &[(label, key.as_str())], value),
            None => prometheus::sample(out, name, &[], value),
        }
    }
}

/// One sample per key of `map`, labelled `label="key"`.
fn labelled(label: &'static str, map: &BTreeMap<String, u64>) -> Vec<Sample> {
    map.iter()
        .map(|(key, value)| (Some((label, key.clone())), *value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_renders_every_family_with_its_labels() {
        let snapshot = MetricsSnapshot {
            allocs_by_status: [("running".to_string(), 2)].into(),
            allocs_collected: [("forced".to_string(), 1)].into(),
            sync_batches_sent: 7,
            runner_build_failures: 3,
            destroys_in_flight_peak: 3,
            ..MetricsSnapshot::default()
        };
        let mut text = String::new();
        snapshot.write_prometheus(&mut text);
        for expected in [
            "# HELP caravan_client_allocs Allocs on this client by client status.\n\
             # TYPE caravan_client_allocs gauge\n\
             caravan_client_allocs{status=\"running\"} 2\n",
            "# TYPE caravan_client_allocs_destroyed gauge\ncaravan_client_allocs_destroyed 0\n",
            "# TYPE caravan_gc_marked_total counter\ncaravan_gc_marked_total 0\n",
            "caravan_gc_collected_total{reason=\"forced\"} 1\n",
            "caravan_gc_destroys_in_flight 0\n",
            "caravan_gc_destroys_in_flight_peak 3\n",
            "caravan_sync_batches_total{result=\"sent\"} 7\n\
             caravan_sync_batches_total{result=\"failed\"} 0\n",
            "caravan_runner_build_failures_total 3\n",
            "# TYPE caravan_client_leftover_dirs gauge\ncaravan_client_leftover_dirs 0\n",
        ] {
            assert!(text.contains(expected), "{expected:?} in\n{text}");
        }
    }
}
