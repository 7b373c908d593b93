//! The runtime's one wasmtime `Engine`, as configured: epoch interruption, the pooling
//! allocator sized so `max_live_allocs` allocs of any runners fit and reset cheaply (or, on
//! demand, linear memories that reserve no more address space than that many allocs can
//! share), the check of the kernel's map count against that size, and the thread that ticks
//! the epoch. It decides nothing about components, stores or allocs.

use crate::runtime::sandbox::store_limits::{self, EPOCH_TICK};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Where the engine takes each instance's memories, tables and stack from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::runtime) enum Instances {
    /// A pool reserved up front, one slot per live alloc.
    Pooled,
    /// Mapped when an alloc starts and unmapped when it ends.
    OnDemand,
}

/// The engine's configuration for `max_live_allocs` live allocs whose instances come from
/// `instances`.
pub(in crate::runtime) fn engine_config(max_live_allocs: u32, instances: Instances) -> Config {
    let mut config = Config::new();
    // Every running guest reaches an epoch check at each tick, where it yields to tokio (so
    // no guest pins a worker thread) and is charged CPU time.
    config.epoch_interruption(true);
    match instances {
        Instances::Pooled => config.allocation_strategy(InstanceAllocationStrategy::Pooling(
            pool_config(max_live_allocs),
        )),
        Instances::OnDemand => {
            match on_demand_memory_reservation(max_live_allocs, address_space_for_memories()) {
                Some(reservation) => {
                    tracing::info!(
                        max_live_allocs,
                        reservation = %crate::util::units::format_bytes(reservation),
                        "each linear memory reserves less than 4 GiB of address space so that \
                         max_live_allocs fit in it; guest code checks memory bounds explicitly"
                    );
                    config
                        .memory_reservation(reservation)
                        .memory_reservation_for_growth(reservation)
                }
                None => &mut config,
            }
        }
    };
    config
}

/// The part of this process's address space that live allocs' linear memories may reserve
/// between them: 100/128 of it, the rest being the agent's (its heap, stacks and code). On
/// Linux x86-64 the space is 128 TiB, and on-demand memories of 4 GiB and their guards
/// filled it at about 32,200 (measured); aarch64 kernels give 64 GiB to 256 TiB.
fn address_space_for_memories() -> u64 {
    let bits = user_address_bits().unwrap_or(47);
    (1u64 << bits) / 128 * 100
}

/// How many bits a user address has in this process, from the top of the main thread's
/// stack, which Linux places just under the top of the user address space (at the very top
/// on aarch64 when its randomization is off: the end the maps give is exclusive).
fn user_address_bits() -> Option<u32> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let stack = maps.lines().find(|line| line.ends_with("[stack]"))?;
    let end = stack.split(['-', ' ']).nth(1)?;
    let last_byte = u64::from_str_radix(end, 16).ok()?.checked_sub(1)?;
    Some(64 - last_byte.leading_zeros())
}

/// wasmtime's default reservation for a linear memory on a 64-bit host: with it, and the
/// default guard regions, compiled code needs no bounds checks.
const DEFAULT_MEMORY_RESERVATION: u64 = 4 << 30;
/// wasmtime's default guard regions, before and after each linear memory.
const MEMORY_GUARDS: u64 = 2 * (32 << 20);

/// What each linear memory reserves of address space when instances are allocated on demand:
/// `None` (wasmtime's 4 GiB) while `max_live_allocs` allocs, each with the most memories an
/// instance may have, fit in `address_space` so (up to about 12,600 allocs on x86-64), else
/// the largest power of two that fits. At 4 GiB and 64 MiB of guards a memory, about
/// 32,000 memories exhaust the address space of the process, long before its RAM.
///
/// A smaller reservation costs explicit bounds checks in guest code (measured with nodesim's
/// sim runner: its 1,000 nodes placed 10,000 allocs 1.6x as slowly with 2 GiB reservations),
/// and a memory that grows past it is moved (copied) into a new reservation of its new size
/// plus this reservation again. So it is taken only where the live allocs could not
/// otherwise fit.
fn on_demand_memory_reservation(max_live_allocs: u32, address_space: u64) -> Option<u64> {
    let memories = u64::from(max_live_allocs) * store_limits::MAX_MEMORIES_PER_INSTANCE as u64;
    let share = address_space / memories.max(1);
    let usable = share.saturating_sub(MEMORY_GUARDS);
    if usable >= DEFAULT_MEMORY_RESERVATION {
        return None;
    }
    // At least one wasm page: a smaller reservation only means every memory is moved once.
    Some(prev_power_of_two(usable).max(WASM_PAGE))
}

const WASM_PAGE: u64 = 64 * 1024;

fn prev_power_of_two(n: u64) -> u64 {
    match n {
        0 => 0,
        n => 1 << (63 - n.leading_zeros()),
    }
}

/// The pooling allocator for `slots` live allocs.
fn pool_config(slots: u32) -> PoolingAllocationConfig {
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
    pool
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
pub(in crate::runtime) fn warn_if_map_count_too_low(max_live_allocs: u32) {
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

pub(in crate::runtime) fn spawn_epoch_ticker(
    engine: Engine,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memories_reserve_less_address_space_only_when_the_live_allocs_would_not_fit() {
        let x86_64 = 100 << 40;
        let reservation = |allocs| on_demand_memory_reservation(allocs, x86_64);
        assert_eq!(reservation(1_000), None);
        assert_eq!(reservation(12_000), None);
        assert_eq!(reservation(13_000), Some(2 << 30));
        // 100,016 allocs of two memories share 100 TiB: 524 MiB each, 64 MiB of it guards.
        assert_eq!(reservation(100_016), Some(256 << 20));
        assert_eq!(reservation(u32::MAX), Some(WASM_PAGE));
        // With 39-bit addresses, 1,000 allocs share 400 GiB: 200 MiB each.
        assert_eq!(
            on_demand_memory_reservation(1_000, 400 << 30),
            Some(128 << 20)
        );
    }

    #[test]
    fn this_hosts_address_space_is_read_from_its_stack() {
        // Linux on x86-64 has 47 bits (4-level page tables; with 5 levels, mappings stay
        // under 47 bits unless asked); aarch64 and riscv64 kernels 36 to 48.
        let bits = user_address_bits().expect("the main thread's stack is in /proc/self/maps");
        assert!((36..=48).contains(&bits), "{bits}");
        if cfg!(target_arch = "x86_64") {
            assert_eq!(address_space_for_memories(), 100 << 40);
        }
    }
}
