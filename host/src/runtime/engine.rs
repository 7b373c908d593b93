//! The runtime's one wasmtime `Engine`, as configured: epoch interruption, the pooling
//! allocator sized so `max_live_allocs` allocs of any runners fit and reset cheaply, the
//! check of the kernel's map count against that size, and the thread that ticks the epoch.
//! It decides nothing about components, stores or allocs.

use super::store_limits::{self, EPOCH_TICK};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

pub(super) fn engine_config(pooling_slots: Option<u32>) -> Config {
    let mut config = Config::new();
    // Every running guest reaches an epoch check at each tick, where it yields to tokio (so
    // no guest pins a worker thread) and is charged CPU time.
    config.epoch_interruption(true);
    if let Some(slots) = pooling_slots {
        let mut pool = PoolingAllocationConfig::new();
        // Each live alloc's share of the pool is the most one instance may hold, so no runner
        // can take another's slots: `max_live_allocs` allocs of any runners always fit.
        let memories = store_limits::MAX_MEMORIES_PER_INSTANCE as u32;
        let tables = store_limits::MAX_TABLES_PER_INSTANCE as u32;
        let core_instances = store_limits::MAX_CORE_INSTANCES_PER_INSTANCE as u32;
        pool.total_component_instances(slots)
            .total_core_instances(slots.saturating_mul(core_instances))
            .total_memories(slots.saturating_mul(memories))
            .total_tables(slots.saturating_mul(tables))
            // Every live alloc waits inside an async call, which holds one fiber stack.
            .total_stacks(slots)
            .max_memories_per_component(memories)
            .max_tables_per_component(tables)
            .max_core_instances_per_component(core_instances);
        // A finished alloc's slot is zeroed by rewriting the pages it dirtied, found with
        // Linux's PAGEMAP_SCAN (6.7 and later), rather than by `madvise`: on a busy node,
        // every `madvise` is a TLB shootdown that interrupts every other core running the
        // agent, and the next alloc in the slot would fault its pages back in. The caps bound
        // what a slot keeps resident, and wasmtime keeps at most 100 unused slots warm.
        // Without the ioctl, keeping memory resident would mean zeroing the caps' whole
        // length at every reset, dirtied or not: wasmtime's default (`madvise`) stays then.
        if PoolingAllocationConfig::is_pagemap_scan_available() {
            pool.pagemap_scan(Enabled::Yes)
                .linear_memory_keep_resident(SLOT_MEMORY_KEPT_RESIDENT)
                .table_keep_resident(SLOT_TABLE_KEPT_RESIDENT);
        }
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// The most of a finished alloc's linear memory its pool slot keeps resident (rewritten,
/// not returned to the kernel): more than a small runner dirties.
const SLOT_MEMORY_KEPT_RESIDENT: usize = 512 * 1024;
/// The same for its tables.
const SLOT_TABLE_KEPT_RESIDENT: usize = 64 * 1024;

/// Memory maps one live alloc needs, measured: about 7 with either allocator (linear memory,
/// guard regions, fiber stack, instance data).
const MAPS_PER_LIVE_ALLOC: u64 = 7;

/// The kernel's map count, not memory, is what caps live allocs (Elasticsearch and other
/// servers check it at start the same way): say so before it bites.
pub(super) fn warn_if_map_count_too_low(max_live_allocs: u32) {
    let path = "/proc/sys/vm/max_map_count";
    let Some(limit) = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
    else {
        return;
    };
    let needed = u64::from(max_live_allocs) * MAPS_PER_LIVE_ALLOC + 10_000;
    if needed > limit {
        tracing::warn!(
            max_map_count = limit,
            max_live_allocs,
            fits = limit.saturating_sub(10_000) / MAPS_PER_LIVE_ALLOC,
            "vm.max_map_count is too low for the configured live allocs; raise it with `sysctl -w vm.max_map_count={}`",
            needed.next_power_of_two()
        );
    }
}

pub(super) fn spawn_epoch_ticker(engine: Engine, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("caravan-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })?;
    Ok(())
}
