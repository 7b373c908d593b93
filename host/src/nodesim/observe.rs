//! What nodesim counts about its nodes' conversation with the server, by standing between
//! each client and the [`ServerApi`]: registrations, update traffic, and how long each alloc
//! took from reaching its node to being reported running. It passes every call through
//! unchanged and decides nothing.

use crate::model::structs::{Alloc, ClientStatus, DesiredStatus};
use crate::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use crate::util::locks::LockUnpoisoned;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Start latencies kept for percentiles; past it new ones are counted, not kept, so a long
/// churn run holds a bounded sample (the first ones).
const MAX_LATENCY_SAMPLES: usize = 1_000_000;

/// Counters shared by every node of one simulation.
#[derive(Default)]
pub struct SimStats {
    registered: Mutex<HashSet<String>>,
    update_calls: AtomicU64,
    updates: AtomicU64,
    allocs_received: AtomicU64,
    server_errors: AtomicU64,
    /// Alloc id -> when its node first fetched it, until it is reported running.
    received_at: Mutex<HashMap<String, Instant>>,
    start_latencies: Mutex<Vec<Duration>>,
}

impl SimStats {
    /// Nodes the server has registered at least once.
    pub fn registered(&self) -> usize {
        self.registered.lock_unpoisoned().len()
    }

    /// Update batches sent and accepted, and the updates in them.
    pub fn updates(&self) -> (u64, u64) {
        (
            self.update_calls.load(Ordering::Relaxed),
            self.updates.load(Ordering::Relaxed),
        )
    }

    /// Allocs the nodes fetched from the server: new placements and new versions of allocs.
    pub fn allocs_received(&self) -> u64 {
        self.allocs_received.load(Ordering::Relaxed)
    }

    /// Calls the server failed or refused (each retried by the client).
    pub fn server_errors(&self) -> u64 {
        self.server_errors.load(Ordering::Relaxed)
    }

    /// The given percentiles (0 to 100) of the time from an alloc reaching its node to its
    /// node reporting it running, from one sort; `None` before the first.
    pub fn start_latencies(&self, percentiles: &[f64]) -> Option<Vec<Duration>> {
        let mut samples = self.start_latencies.lock_unpoisoned().clone();
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let last = samples.len() - 1;
        let at = |p: f64| samples[((p / 100.0) * last as f64).round().min(last as f64) as usize];
        Some(percentiles.iter().map(|p| at(*p)).collect())
    }

    /// How many start latencies were measured.
    pub fn started(&self) -> usize {
        self.start_latencies.lock_unpoisoned().len()
    }

    fn counted<T>(&self, result: Result<T, ServerError>) -> Result<T, ServerError> {
        if result.is_err() {
            self.server_errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

/// One node's [`ServerApi`], counted into [`SimStats`].
pub struct Observed {
    inner: Arc<dyn ServerApi>,
    stats: Arc<SimStats>,
}

impl Observed {
    /// `inner`, counted into `stats`.
    pub fn new(inner: Arc<dyn ServerApi>, stats: Arc<SimStats>) -> Arc<Self> {
        Arc::new(Observed { inner, stats })
    }
}

#[async_trait::async_trait]
impl ServerApi for Observed {
    async fn register_node(
        &self,
        node_id: &str,
        info: &crate::model::node::NodeInfo,
    ) -> Result<(), ServerError> {
        let result = self
            .stats
            .counted(self.inner.register_node(node_id, info).await);
        if result.is_ok() {
            let mut registered = self.stats.registered.lock_unpoisoned();
            registered.insert(node_id.to_string());
        }
        result
    }

    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError> {
        let answer = self.inner.watch_allocs(node_id, min_index, wait).await;
        self.stats.counted(answer)
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        let allocs = self.stats.counted(self.inner.get_allocs(ids).await)?;
        let count = allocs.len() as u64;
        self.stats
            .allocs_received
            .fetch_add(count, Ordering::Relaxed);
        let now = Instant::now();
        let mut received = self.stats.received_at.lock_unpoisoned();
        for alloc in allocs
            .iter()
            .filter(|a| a.desired_status == DesiredStatus::Run)
        {
            // Bounded like the samples: an alloc removed before any report leaves its entry.
            if received.len() < MAX_LATENCY_SAMPLES {
                received.entry(alloc.id.clone()).or_insert(now);
            }
        }
        Ok(allocs)
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        let accepted = self
            .stats
            .counted(self.inner.update_allocs(updates).await)?;
        self.stats.update_calls.fetch_add(1, Ordering::Relaxed);
        let count = updates.len() as u64;
        self.stats.updates.fetch_add(count, Ordering::Relaxed);
        let now = Instant::now();
        let mut received = self.stats.received_at.lock_unpoisoned();
        let mut latencies = self.stats.start_latencies.lock_unpoisoned();
        for update in updates {
            let status = update.state.client_status;
            if status != ClientStatus::Running && !status.is_terminal() {
                continue;
            }
            // A terminal report ends the wait too (a batch alloc may finish before a running
            // report was sent); only a running one is a start.
            if let Some(at) = received.remove(&update.alloc_id)
                && status == ClientStatus::Running
                && latencies.len() < MAX_LATENCY_SAMPLES
            {
                latencies.push(now - at);
            }
        }
        Ok(accepted)
    }
}
