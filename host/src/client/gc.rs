//! The garbage collector of terminal allocs, with its config next to it.
//!
//! Invariants, each with the reason the Nomad client keeps it:
//! - A terminal alloc is marked once, and "marking allocation for GC" is logged once, however
//!   often its state is reported: one alloc, one line an operator can grep.
//! - The queue is ordered by mark time and deduplicated by alloc id; the GC receives the
//!   runner with the id and never looks it up, so it cannot race the alloc map.
//! - Each pass re-checks, in order, disk usage, inode usage and the live alloc count (runners
//!   not yet destroyed, running ones included) and destroys the oldest marked alloc while one
//!   is over: the oldest finished work is the least interesting to keep. The GC keeps the
//!   live count itself, raised by [`GarbageCollector::runner_added`] and lowered as each
//!   destroy ends, so reading it costs nothing however many allocs the node holds: a churn
//!   of n short allocs, with a pass after nearly every one, stays linear in n.
//! - Destroys run concurrently but never more than `gc_parallel_destroys` at once (a value
//!   <= 0 becomes 1 with a warning): destroying is disk-heavy and must not starve the node.
//! - Nothing that adds allocs waits for a destroy (Nomad removed its blocking `MakeRoomFor`
//!   after it stalled placements): passes run on the GC's own task, triggered, not awaited.
//! - With nothing to collect, "garbage collection skipped because no terminal allocations"
//!   is INFO when the reason is the alloc count and that count is under twice the limit, WARN
//!   otherwise: a node somewhat over its soft limit is normal, one far over it is not.
//! - Forced collection ignores thresholds but not the destroy limit, and refuses an alloc
//!   that is not terminal.
//!
//! - A destroy, once claimed, runs to its end on a task of its own: a caller that goes away
//!   (an operator's HTTP request dropped) must not leave it half done, its claim held and
//!   its alloc counted live for good.
//!
//! The GC may use the seam ([`AllocRunner`]) and its own stats source; it knows nothing of
//! the server, nor of the alloc map beyond the runners the client tells it of.

use super::metrics::Metrics;
use crate::allocrunner::AllocRunner;
use crate::util::determinism::{HashMap, HashSet};
use crate::util::locks::LockUnpoisoned;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, Semaphore};

mod config;
pub use config::{DiskStats, GcConfig, StatsSource, StatvfsStats};

/// Why an alloc is collected. [`GcReason::kind`] is the stable label for metrics; the
/// `Display` form is the sentence logged for operators (Nomad's wording).
#[derive(Debug, Clone, PartialEq)]
pub enum GcReason {
    /// The data dir's disk usage, in percent, is over `gc_disk_usage_threshold`.
    DiskUsage {
        /// Usage measured.
        used_percent: f64,
        /// The threshold it is over.
        threshold: f64,
    },
    /// The data dir's inode usage, in percent, is over `gc_inode_usage_threshold`.
    InodeUsage {
        /// Usage measured.
        used_percent: f64,
        /// The threshold it is over.
        threshold: f64,
    },
    /// More allocs are live than `gc_max_allocs`.
    AllocCount {
        /// Live allocs counted.
        live: usize,
        /// The limit.
        max: usize,
    },
    /// An operator asked for this alloc to go.
    Forced,
    /// The server no longer lists the alloc.
    ServerRemoved,
    /// An operator asked for every terminal alloc to go.
    FullNode,
    /// A dev agent is stopping and frees every alloc.
    DevAgentStopping,
}

impl GcReason {
    /// The stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            GcReason::DiskUsage { .. } => "disk_usage",
            GcReason::InodeUsage { .. } => "inode_usage",
            GcReason::AllocCount { .. } => "alloc_count",
            GcReason::Forced => "forced",
            GcReason::ServerRemoved => "server_removed",
            GcReason::FullNode => "forced_full_node",
            GcReason::DevAgentStopping => "forced_full_node",
        }
    }
}

impl std::fmt::Display for GcReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GcReason::DiskUsage {
                used_percent,
                threshold,
            } => write!(
                f,
                "disk usage of {used_percent:.0} is over gc threshold of {threshold:.0}"
            ),
            GcReason::InodeUsage {
                used_percent,
                threshold,
            } => write!(
                f,
                "inode usage of {used_percent:.0} is over gc threshold of {threshold:.0}"
            ),
            GcReason::AllocCount { live, max } => {
                write!(
                    f,
                    "number of allocations ({live}) is over the limit ({max})"
                )
            }
            GcReason::Forced | GcReason::ServerRemoved => f.write_str("forced collection"),
            GcReason::FullNode => f.write_str("forced full node collection"),
            GcReason::DevAgentStopping => f.write_str("agent stopping in dev mode"),
        }
    }
}

/// Why a forced collection was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GcError {
    /// The client has no such alloc.
    #[error("unknown allocation {0}")]
    UnknownAlloc(String),
    /// The alloc is still pending or running.
    #[error("allocation {alloc_id} is {status}; only terminal allocations can be collected")]
    NotTerminal {
        /// The alloc.
        alloc_id: String,
        /// Its client status.
        status: String,
    },
}

type Marked = (String, Arc<dyn AllocRunner>);

/// Runners from their start to their destroy's end.
#[derive(Default)]
struct Destroys {
    /// Runners added and not yet destroyed, the ones being destroyed included.
    live: usize,
    /// Allocs claimed for a destroy that has not finished: a pass does not count them as
    /// live, and no alloc is destroyed twice at once.
    claimed: HashMap<String, Arc<dyn AllocRunner>>,
}

/// The queue of marked allocs, oldest first.
#[derive(Default)]
struct GcQueue {
    /// (mark sequence, alloc id): a min-heap on the order allocs were marked.
    heap: BinaryHeap<Reverse<(u64, String)>>,
    runners: HashMap<String, Arc<dyn AllocRunner>>,
    /// Every id ever marked and not yet forgotten, so an alloc is marked (and logged) once.
    ever_marked: HashSet<String>,
    next_sequence: u64,
}

impl GcQueue {
    fn pop(&mut self) -> Option<Marked> {
        while let Some(Reverse((_, id))) = self.heap.pop() {
            if let Some(runner) = self.runners.remove(&id) {
                return Some((id, runner));
            }
        }
        None
    }
}

/// Collects terminal allocs; see the module docs for its rules.
pub struct GarbageCollector {
    config: GcConfig,
    parallel_destroys: usize,
    queue: Mutex<GcQueue>,
    destroy_slots: Arc<Semaphore>,
    stats: Arc<dyn StatsSource>,
    /// Told each alloc whose destroy finished, so its saved state can follow.
    on_destroyed: Box<dyn Fn(&str) + Send + Sync>,
    /// The live count and the destroys under way, under one lock so that a destroy's end
    /// moves an alloc out of both at once.
    destroys: Mutex<Destroys>,
    trigger: Notify,
    passes: AtomicU64,
    /// The last time a pass found a threshold exceeded and nothing to collect.
    last_skip: Mutex<Option<GcSkip>>,
    metrics: Arc<Metrics>,
}

/// What the collector is doing, as the API and the web UI show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GcStatus {
    /// Terminal allocs marked and waiting for a pass to collect them.
    pub marked: usize,
    /// The allocs being destroyed now, never more than `parallel_destroys`.
    pub destroying: Vec<String>,
    /// Destroys allowed at once (`gc_parallel_destroys`, made usable).
    pub parallel_destroys: usize,
    /// Passes finished since the agent started.
    pub passes: u64,
    /// Live allocs above which terminal ones are collected (`gc_max_allocs`).
    pub max_allocs: usize,
    /// Disk usage percent above which allocs are collected.
    pub disk_usage_threshold: f64,
    /// Inode usage percent above which allocs are collected.
    pub inode_usage_threshold: f64,
    /// Seconds between passes.
    pub interval_secs: f64,
    /// The last pass that had to skip: a threshold was exceeded and nothing was marked.
    pub last_skip: Option<GcSkip>,
}

/// A pass that found a threshold exceeded and no terminal alloc to collect.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GcSkip {
    /// The threshold exceeded (`number of allocations (120) is over the limit (50)`).
    pub reason: String,
    /// `info` for a node somewhat over its alloc limit, `warn` otherwise (as it was logged).
    pub level: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

impl GarbageCollector {
    /// A collector with no runners yet (see [`GarbageCollector::runner_added`]);
    /// `on_destroyed` hears each alloc once its destroy has finished.
    pub fn new(
        config: GcConfig,
        stats: Arc<dyn StatsSource>,
        on_destroyed: Box<dyn Fn(&str) + Send + Sync>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let parallel_destroys = config.sanitized_parallel_destroys();
        GarbageCollector {
            config,
            parallel_destroys,
            queue: Mutex::new(GcQueue::default()),
            destroy_slots: Arc::new(Semaphore::new(parallel_destroys)),
            stats,
            on_destroyed,
            destroys: Mutex::new(Destroys::default()),
            trigger: Notify::new(),
            passes: AtomicU64::new(0),
            last_skip: Mutex::new(None),
            metrics,
        }
    }

    /// The usable number of parallel destroys.
    pub fn parallel_destroys(&self) -> usize {
        self.parallel_destroys
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GcQueue> {
        self.queue.lock_unpoisoned()
    }

    fn destroys_lock(&self) -> std::sync::MutexGuard<'_, Destroys> {
        self.destroys.lock_unpoisoned()
    }

    /// Counts a runner the client has started (or restored): it is live until the GC has
    /// destroyed it. Every runner counted must reach the GC's destroy (every one the client
    /// holds does: the GC is the only place a runner is destroyed), or the count stays high.
    pub fn runner_added(&self) {
        self.destroys_lock().live += 1;
    }

    /// Runners not yet destroyed, running ones included: what `gc_max_allocs` limits.
    pub fn live(&self) -> usize {
        self.destroys_lock().live
    }

    /// Marks a terminal alloc for collection. The first call for an id queues it and logs;
    /// later calls do nothing.
    pub fn mark_for_collection(&self, alloc_id: &str, runner: Arc<dyn AllocRunner>) {
        {
            let mut queue = self.lock();
            if !queue.ever_marked.insert(alloc_id.to_string()) {
                return;
            }
            let sequence = queue.next_sequence;
            queue.next_sequence += 1;
            queue.heap.push(Reverse((sequence, alloc_id.to_string())));
            queue.runners.insert(alloc_id.to_string(), runner);
        }
        self.metrics.marked();
        tracing::info!(alloc_id, "marking allocation for GC");
    }

    /// Forgets an alloc the server dropped: unqueued, and its mark record cleared.
    pub fn forget(&self, alloc_id: &str) {
        let mut queue = self.lock();
        queue.runners.remove(alloc_id);
        queue.ever_marked.remove(alloc_id);
    }

    /// How many marked allocs wait for collection.
    pub fn queued(&self) -> usize {
        self.lock().runners.len()
    }

    /// The allocs being destroyed now: their directories are still theirs to remove.
    pub(crate) fn destroying_ids(&self) -> Vec<String> {
        self.destroys_lock().claimed.keys().cloned().collect()
    }

    /// What the collector is doing now.
    pub fn status(&self) -> GcStatus {
        let mut destroying = self.destroying_ids();
        destroying.sort();
        GcStatus {
            marked: self.queued(),
            destroying,
            parallel_destroys: self.parallel_destroys,
            passes: self.passes(),
            max_allocs: self.config.max_allocs,
            disk_usage_threshold: self.config.disk_usage_threshold,
            inode_usage_threshold: self.config.inode_usage_threshold,
            interval_secs: self.config.interval.as_secs_f64(),
            last_skip: self.last_skip.lock_unpoisoned().clone(),
        }
    }

    /// How many passes have finished; lets tests wait for one.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::SeqCst)
    }

    /// Asks for a pass soon. Calls made before the pass starts are coalesced into it.
    pub fn trigger(&self) {
        self.trigger.notify_one();
    }

    /// The GC loop: a pass every interval and after each trigger. Runs until dropped.
    pub async fn run(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(self.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            // Biased so that a simulation replays (an unbiased select draws from tokio's own
            // random); either way one pass follows, and a trigger not taken stays.
            tokio::select! {
                biased;
                _ = ticker.tick() => {}
                _ = self.trigger.notified() => {}
            }
            self.pass().await;
        }
    }

    /// One pass: collect while a threshold is exceeded and marked allocs remain.
    pub async fn pass(self: &Arc<Self>) {
        // Read once per pass, then lowered by each alloc the pass claims (claims made by
        // others meanwhile are left for the next pass to see).
        let mut live = self.live_not_claimed();
        while let Some(reason) = self.exceeded_threshold(live) {
            let Some((alloc_id, runner)) = self.lock().pop() else {
                let routine = matches!(reason, GcReason::AllocCount { .. })
                    && live < 2 * self.config.max_allocs;
                let message = "garbage collection skipped because no terminal allocations";
                if routine {
                    tracing::info!(reason = %reason, "{message}");
                } else {
                    tracing::warn!(reason = %reason, "{message}");
                }
                *self.last_skip.lock_unpoisoned() = Some(GcSkip {
                    reason: reason.to_string(),
                    level: if routine { "info" } else { "warn" }.to_string(),
                    at_unix_ms: crate::util::timestamp::unix_ms_now(),
                });
                break;
            };
            // The count drops as each destroy finishes: start it and go on to the next. What a
            // destroy frees on disk is only known after it: one at a time.
            let one_at_a_time = !matches!(reason, GcReason::AllocCount { .. });
            let Some(destroying) = self.start_destroy(&alloc_id, runner, reason) else {
                continue;
            };
            live = live.saturating_sub(1);
            if one_at_a_time {
                destroying.finished().await;
            }
        }
        self.passes.fetch_add(1, Ordering::SeqCst);
    }

    /// Live runners that no destroy has claimed yet.
    fn live_not_claimed(&self) -> usize {
        let destroys = self.destroys_lock();
        destroys.live.saturating_sub(destroys.claimed.len())
    }

    /// Claims an alloc for destruction; false when it is destroyed or being destroyed.
    fn claim(&self, alloc_id: &str, runner: &Arc<dyn AllocRunner>) -> bool {
        let mut destroys = self.destroys_lock();
        if runner.is_destroyed() || destroys.claimed.contains_key(alloc_id) {
            return false;
        }
        destroys
            .claimed
            .insert(alloc_id.to_string(), runner.clone());
        true
    }

    /// The first threshold exceeded, given `live` allocs not destroyed nor being destroyed.
    fn exceeded_threshold(&self, live: usize) -> Option<GcReason> {
        match self.stats.stats() {
            Ok(stats) if stats.used_percent > self.config.disk_usage_threshold => {
                return Some(GcReason::DiskUsage {
                    used_percent: stats.used_percent,
                    threshold: self.config.disk_usage_threshold,
                });
            }
            Ok(stats) if stats.inodes_used_percent > self.config.inode_usage_threshold => {
                return Some(GcReason::InodeUsage {
                    used_percent: stats.inodes_used_percent,
                    threshold: self.config.inode_usage_threshold,
                });
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(error = %error, "cannot read disk usage; checking the alloc count only")
            }
        }
        (live > self.config.max_allocs).then_some(GcReason::AllocCount {
            live,
            max: self.config.max_allocs,
        })
    }

    /// Destroys one alloc under the destroy limit, waiting for a slot; does nothing when it
    /// is already destroyed or being destroyed. The destroy goes on if the caller goes away.
    pub async fn destroy(
        self: &Arc<Self>,
        alloc_id: &str,
        runner: Arc<dyn AllocRunner>,
        reason: GcReason,
    ) {
        if let Some(destroying) = self.start_destroy(alloc_id, runner, reason) {
            destroying.finished().await;
        }
    }

    /// Claims an alloc and starts destroying it under the destroy limit, on a task of its
    /// own; `None` when it is destroyed or being destroyed already. Every destroy starts
    /// here: callers that start many keep one task each, not a task waiting on another.
    pub fn start_destroy(
        self: &Arc<Self>,
        alloc_id: &str,
        runner: Arc<dyn AllocRunner>,
        reason: GcReason,
    ) -> Option<Destroying> {
        if !self.claim(alloc_id, &runner) {
            return None;
        }
        let (gc, id) = (self.clone(), alloc_id.to_string());
        let task = tokio::spawn(async move { gc.destroy_claimed(&id, runner, reason).await });
        Some(Destroying {
            alloc_id: alloc_id.to_string(),
            task,
        })
    }

    async fn destroy_claimed(
        &self,
        alloc_id: &str,
        runner: Arc<dyn AllocRunner>,
        reason: GcReason,
    ) {
        // The semaphore is never closed, so acquiring only waits.
        let destroyed = match self.destroy_slots.acquire().await {
            Ok(_slot) => {
                self.metrics.destroy_started();
                tracing::info!(alloc_id, reason = %reason, "garbage collecting allocation");
                // Lasts as long as the destroy, for the OTLP export; never entered, so the
                // lines logged meanwhile are not its own.
                let collecting = tracing::info_span!("alloc.gc", alloc_id, reason = %reason);
                runner.destroy();
                runner.destroyed().wait().await;
                drop(collecting);
                (self.on_destroyed)(alloc_id);
                self.metrics.destroy_finished();
                self.metrics.collected(reason.kind());
                true
            }
            Err(_) => false,
        };
        let mut destroys = self.destroys_lock();
        destroys.claimed.remove(alloc_id);
        if destroyed {
            destroys.live = destroys.live.saturating_sub(1);
        }
    }

    /// Forced collection of one alloc the caller found terminal (see the client's `collect`):
    /// unqueued if marked, destroyed under the destroy limit whatever the thresholds.
    pub async fn collect(self: &Arc<Self>, alloc_id: &str, runner: Arc<dyn AllocRunner>) {
        self.lock().runners.remove(alloc_id);
        self.destroy(alloc_id, runner, GcReason::Forced).await;
    }

    /// Collects an alloc the server dropped, as [`GarbageCollector::collect`] does; a
    /// running alloc is killed by its destroy before it is freed.
    pub async fn collect_removed(self: &Arc<Self>, alloc_id: &str, runner: Arc<dyn AllocRunner>) {
        self.forget(alloc_id);
        self.destroy(alloc_id, runner, GcReason::ServerRemoved)
            .await;
    }

    /// Forced collection of every marked alloc, under the destroy limit.
    pub async fn collect_all(self: &Arc<Self>) {
        let mut started = Vec::new();
        loop {
            let Some((alloc_id, runner)) = self.lock().pop() else {
                break;
            };
            started.extend(self.start_destroy(&alloc_id, runner, GcReason::FullNode));
        }
        for destroying in started {
            destroying.finished().await;
        }
    }
}

/// A destroy [`GarbageCollector::start_destroy`] started. Dropping it leaves the destroy
/// running.
pub struct Destroying {
    alloc_id: String,
    task: tokio::task::JoinHandle<()>,
}

impl Destroying {
    /// Waits for the destroy to end. A panic in it is logged here and goes no further.
    pub async fn finished(self) {
        if let Err(error) = self.task.await {
            let alloc_id = self.alloc_id;
            tracing::error!(alloc_id, error = %error, "destroying the allocation failed");
        }
    }
}

#[cfg(test)]
mod tests;
