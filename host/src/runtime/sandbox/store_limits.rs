//! Per-alloc limits enforced inside the store: memory (a [`wasmtime::ResourceLimiter`]), the
//! counts of memories, tables and instances, and the epoch tick at which every
//! computing guest yields and its CPU budget ([`crate::runtime::sandbox::cpu_meter`]) is checked.
//!
//! The limiter records which limit was hit, so the runner can name it in the alloc's
//! description instead of showing a bare trap. It acts on one store only and never reaches
//! past it.

use crate::allocrunner::AllocUsage;
use crate::util::units::format_bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What the meters inside an alloc's store have counted, readable from outside it while the
/// guest runs: the store belongs to the run's task, and an operator asks from the API.
#[derive(Debug, Default)]
pub struct UsageGauges {
    cpu_nanos: AtomicU64,
    memory_peak_bytes: AtomicU64,
    memory_bytes: AtomicU64,
}

impl UsageGauges {
    /// The usage counted so far.
    pub fn snapshot(&self) -> AllocUsage {
        AllocUsage {
            cpu_used: Duration::from_nanos(self.cpu_nanos.load(Ordering::Relaxed)),
            memory_peak_bytes: self.memory_peak_bytes.load(Ordering::Relaxed),
            memory_bytes: self.memory_bytes.load(Ordering::Relaxed),
        }
    }

    /// The CPU time charged in all, guest and host together, in nanoseconds. It only grows:
    /// during an upgrade in place two runs publish their totals at once, and the alloc's
    /// gauge (and the CPU chart drawn from it) must not swing between them.
    pub fn set_cpu_used_nanos(&self, nanos: u64) {
        self.cpu_nanos.fetch_max(nanos, Ordering::Relaxed);
    }

    /// A store of the alloc was granted `bytes` more (an upgrade in place runs two stores
    /// for a moment: both count).
    fn memory_grown(&self, bytes: u64) {
        let held = self.memory_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.memory_peak_bytes.fetch_max(held, Ordering::Relaxed);
    }

    /// A store of the alloc gave `bytes` back (a failed growth, or the store gone).
    fn memory_released(&self, bytes: u64) {
        let _ = self
            .memory_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                Some(held.saturating_sub(bytes))
            });
    }
}

/// How often the engine's epoch advances. Every running guest yields to tokio at each tick,
/// where its CPU budget is checked.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Most linear memories one alloc's instance may have. Also its share of the instance pool,
/// which holds this many per live alloc: a runner can then never take another's slots. Every
/// runner the Rust, C, Python and JavaScript toolchains make has one; two leaves room for a
/// runner composed of two components.
pub const MAX_MEMORIES_PER_INSTANCE: usize = 2;
/// Most tables one alloc's instance may have, and its share of the pool (runners have two).
pub const MAX_TABLES_PER_INSTANCE: usize = 4;
/// Most core instances one alloc's component may create, and its share of the pool (a Rust or
/// C runner has 3, a JavaScript one 4, a Python one 14).
pub const MAX_CORE_INSTANCES_PER_INSTANCE: usize = 16;
/// Most table elements, all tables of one instance together: tables hold function references,
/// and a runner needs thousands at most.
pub const MAX_TABLE_ELEMENTS: usize = 1_000_000;

/// Caps the memory of one alloc's instance: all its linear memories together may hold at most
/// `max_bytes`, and it may have at most [`MAX_MEMORIES_PER_INSTANCE`] of them (and as many
/// tables and core instances as the constants above allow).
pub struct MemoryLimiter {
    max_bytes: u64,
    /// Bytes of all memories granted so far.
    total_bytes: u64,
    /// Elements of all tables granted so far.
    total_table_elements: usize,
    /// What the last grant added, taken back if wasmtime then fails the growth (over the
    /// memory's own maximum, or out of host memory): a failed grow holds nothing.
    last_memory_grant: u64,
    last_table_grant: usize,
    exceeded: bool,
    gauges: Option<Arc<UsageGauges>>,
}

impl MemoryLimiter {
    pub fn new(max_bytes: u64) -> Self {
        MemoryLimiter {
            max_bytes,
            total_bytes: 0,
            total_table_elements: 0,
            last_memory_grant: 0,
            last_table_grant: 0,
            exceeded: false,
            gauges: None,
        }
    }

    /// The same limiter, recording the most memory held in `gauges`.
    pub fn reporting_to(self, gauges: Arc<UsageGauges>) -> Self {
        MemoryLimiter {
            gauges: Some(gauges),
            ..self
        }
    }

    /// The alloc's description when the guest went over the limit, if it did.
    pub fn failure(&self) -> Option<String> {
        self.exceeded
            .then(|| format!("memory limit of {} exceeded", format_bytes(self.max_bytes)))
    }
}

/// The store, and the memory it held, goes with its limiter.
impl Drop for MemoryLimiter {
    fn drop(&mut self) {
        if let Some(gauges) = &self.gauges {
            gauges.memory_released(self.total_bytes);
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Called for each memory as it is created (from 0) and as it grows: the sum over all
        // of them is what the alloc holds.
        let total = self
            .total_bytes
            .saturating_sub(current as u64)
            .saturating_add(desired as u64);
        if total > self.max_bytes {
            self.exceeded = true;
            // An error (not `Ok(false)`) traps at once: a Rust guest would otherwise abort with
            // a bare `unreachable`, and a C guest would carry on with a NULL pointer.
            return Err(wasmtime::Error::msg(format!(
                "memory limit of {} exceeded",
                format_bytes(self.max_bytes)
            )));
        }
        self.last_memory_grant = total.saturating_sub(self.total_bytes);
        self.total_bytes = total;
        if let Some(gauges) = &self.gauges {
            gauges.memory_grown(self.last_memory_grant);
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.total_bytes = self.total_bytes.saturating_sub(self.last_memory_grant);
        if let Some(gauges) = &self.gauges {
            gauges.memory_released(self.last_memory_grant);
        }
        self.last_memory_grant = 0;
        Ok(())
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.total_table_elements = self
            .total_table_elements
            .saturating_sub(self.last_table_grant);
        self.last_table_grant = 0;
        Ok(())
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .total_table_elements
            .saturating_sub(current)
            .saturating_add(desired);
        if total > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.last_table_grant = total.saturating_sub(self.total_table_elements);
        self.total_table_elements = total;
        Ok(true)
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES_PER_INSTANCE
    }

    fn tables(&self) -> usize {
        MAX_TABLES_PER_INSTANCE
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES_PER_INSTANCE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn memory_over_the_limit_traps_and_names_the_limit() {
        let mut limiter = MemoryLimiter::new(64 << 20);
        assert!(limiter.memory_growing(0, 1 << 20, None).unwrap());
        assert!(limiter.failure().is_none());
        assert!(limiter.memory_growing(1 << 20, 65 << 20, None).is_err());
        assert_eq!(
            limiter.failure().as_deref(),
            Some("memory limit of 64 MiB exceeded")
        );
    }

    #[test]
    fn the_limit_is_for_all_memories_together() {
        let mut limiter = MemoryLimiter::new(64 << 20);
        // The sizes of all memories add up (how many there may be is `memories()`'s business):
        // three of 16 MiB fit in 64 MiB.
        for _ in 0..3 {
            assert!(limiter.memory_growing(0, 16 << 20, None).unwrap());
        }
        // Growing one of them by 8 MiB still fits (56 MiB in all).
        assert!(limiter.memory_growing(16 << 20, 24 << 20, None).unwrap());
        // A growth wasmtime then fails (over the memory's own maximum) holds nothing.
        assert!(limiter.memory_growing(24 << 20, 32 << 20, None).unwrap());
        limiter
            .memory_grow_failed(wasmtime::Error::msg("over its maximum"))
            .unwrap();
        assert!(limiter.memory_growing(0, 8 << 20, None).unwrap());
        assert!(limiter.memory_growing(0, 16 << 20, None).is_err());
        assert!(limiter.failure().is_some());
    }
}
