//! The embedded server's counters, as `/v1/metrics` shows them: placements, client state
//! updates taken, blocking queries open, and the watch lag (from a change to a node's allocs
//! to its watch answering with it). Counting only; it decides nothing.

use crate::util::histogram::Histogram;
use crate::util::prometheus::{self, Kind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Default)]
pub(super) struct ServerMetrics {
    placements: AtomicU64,
    alloc_updates: AtomicU64,
    watch_lag: Histogram,
}

impl ServerMetrics {
    pub(super) fn placed(&self, count: usize) {
        self.placements.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(super) fn updates_taken(&self, count: usize) {
        self.alloc_updates
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(super) fn watch_answered_after(&self, lag: Duration) {
        self.watch_lag.record(lag);
    }

    pub(super) fn write_prometheus(&self, watches_open: usize, out: &mut String) {
        let counters = [
            (
                "caravan_server_placements_total",
                "Allocs placed on a node by the server (new ones and replacements).",
                self.placements.load(Ordering::Relaxed),
            ),
            (
                "caravan_server_alloc_updates_total",
                "Client state updates the server took from its nodes.",
                self.alloc_updates.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            prometheus::single(out, name, Kind::Counter, help, value);
        }
        prometheus::single(
            out,
            "caravan_server_watches_open",
            Kind::Gauge,
            "Blocking queries of nodes waiting on the server now.",
            watches_open,
        );
        self.watch_lag.write_prometheus(
            "caravan_server_watch_lag_seconds",
            "From a change to a node's allocs to that node's watch answering with it.",
            out,
        );
    }
}
