//! A GC storm: what collecting thousands of terminal allocs at once does to the allocs
//! starting beside it, and whether `gc_parallel_destroys` holds through it.
//!
//! Run: `cargo bench -p caravan-host --bench gc_storm` (in `scripts/bench`). Options after
//! `--`: `--terminal N` (default 10000), `--new N` (default 500), `--waves N` (default 10),
//! `--rounds N` (default 3).
//!
//! Each round is one node's client, in process, on an in-memory server, with the sandboxed
//! sim runner (`guests/sim`):
//! 1. N batch allocs (`run_for = 0s`) run and complete under a GC that keeps them all.
//! 2. The client restarts on the same state, as an agent restarts after its operator lowered
//!    `gc_max_allocs`: with a storm, `gc_max_allocs = 50` and `gc_parallel_destroys = 2`, so
//!    every terminal alloc is over the limit at once; without one (the baseline), a limit that
//!    keeps them all. Everything else is the same.
//! 3. New service allocs arrive in waves, and each one's start is timed from its node
//!    fetching it to its node reporting it running.
//!
//! Rounds alternate baseline and storm. Reported: each side's start p50 and p99 (medians
//! over the rounds), their p99 ratio, and from the client's metrics the most destroys ever
//! in flight at once (`caravan_gc_destroys_in_flight_peak`) and how long the storm lasted.

mod common;
#[path = "common/one_node.rs"]
mod one_node;

use caravan_host::allocrunner::AllocRunnerFactory;
use caravan_host::client::gc::GcConfig;
use caravan_host::nodesim::{Observed, SimStats};
use caravan_host::runtime::{Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use caravan_host::state::{MemoryStateDb, StateDb};
use caravan_host::testing::InMemoryServer;
use common::count_arg;
use one_node::{LOOK, NODE, collected, sim_alloc, wait_until};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARALLEL_DESTROYS: i64 = 2;
/// The storm's `gc_max_allocs`: Nomad's default.
const STORM_MAX_ALLOCS: usize = 50;
const WAVE_GAP: Duration = Duration::from_millis(50);

struct Sizes {
    terminal: usize,
    new: usize,
    waves: usize,
}

/// One round's measures.
struct Round {
    start_p50: Duration,
    start_p99: Duration,
    /// For a storm round: the collection's figures.
    storm: Option<Storm>,
}

struct Storm {
    peak_in_flight: u64,
    lasted: Duration,
    /// Terminal allocs collected when the last new alloc started: how much of the storm the
    /// new allocs started inside.
    collected_at_last_start: u64,
}

/// The GC of a round's client: `max_allocs`, two destroys at a time.
fn gc_keeping(max_allocs: usize) -> GcConfig {
    GcConfig {
        max_allocs,
        parallel_destroys: PARALLEL_DESTROYS,
        ..GcConfig::default()
    }
}

async fn round(factory: &AllocRunnerFactory, sizes: &Sizes, storm: bool) -> Round {
    let dir = tempfile::tempdir().unwrap();
    let server = InMemoryServer::new();
    let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
    let keep_all = sizes.terminal + sizes.new + STORM_MAX_ALLOCS;

    let finishing = one_node::client(
        server.clone(),
        factory,
        &db,
        dir.path(),
        gc_keeping(keep_all),
    );
    finishing.restore().await.unwrap();
    finishing.start();
    server.place_many(
        NODE,
        (0..sizes.terminal)
            .map(|n| sim_alloc(format!("done-{n:05}"), "done", &[("run_for", "0s")])),
    );
    let terminal = sizes.terminal as u64;
    // Each one is marked for collection as it completes.
    wait_until("the batch allocs to complete", LOOK, || {
        finishing.gc().queued() == sizes.terminal
    })
    .await;
    finishing.shutdown_all().await;
    drop(finishing);

    let stats = Arc::new(SimStats::default());
    let max_allocs = if storm { STORM_MAX_ALLOCS } else { keep_all };
    let restarted = one_node::client(
        Observed::new(server.clone(), stats.clone()),
        factory,
        &db,
        dir.path(),
        gc_keeping(max_allocs),
    );
    restarted.restore().await.unwrap();
    let storm_began = Instant::now();
    restarted.start();
    let per_wave = sizes.new.div_ceil(sizes.waves);
    for wave in 0..sizes.waves {
        let first = wave * per_wave;
        let last = (first + per_wave).min(sizes.new);
        server.place_many(
            NODE,
            (first..last).map(|n| sim_alloc(format!("new-{n:05}"), "new", &[])),
        );
        tokio::time::sleep(WAVE_GAP).await;
    }
    wait_until("the new allocs to run", LOOK, || {
        stats.started() >= sizes.new
    })
    .await;
    let collected_at_last_start = collected(&restarted);
    let [start_p50, start_p99] = stats.start_latencies(&[50.0, 99.0]).unwrap()[..] else {
        unreachable!("two percentiles asked, two given")
    };
    let storm = if storm {
        wait_until("the storm to claim every alloc", LOOK, || {
            restarted.gc().queued() == 0
        })
        .await;
        wait_until("the storm to end", LOOK, || {
            collected(&restarted) >= terminal
        })
        .await;
        Some(Storm {
            peak_in_flight: restarted.metrics().destroys_in_flight_peak,
            lasted: storm_began.elapsed(),
            collected_at_last_start,
        })
    } else {
        assert_eq!(collected_at_last_start, 0, "the baseline collects nothing");
        None
    };
    restarted.destroy_all().await;
    Round {
        start_p50,
        start_p99,
        storm,
    }
}

fn main() {
    common::log_as_the_agent();
    let sizes = Sizes {
        terminal: count_arg("--terminal", 10_000),
        new: count_arg("--new", 500),
        waves: count_arg("--waves", 10),
    };
    let rounds = count_arg("--rounds", 3);
    let cache = tempfile::tempdir().unwrap();
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (baseline, stormy) = tokio.block_on(async {
        let runtime = Runtime::new(&RuntimeConfig {
            max_live_allocs: u32::try_from(sizes.terminal + sizes.new + 100).unwrap(),
            cache_dir: Some(cache.path().to_path_buf()),
            ..RuntimeConfig::default()
        })
        .unwrap();
        let factory = WasmAllocRunnerFactory::new(runtime).into_factory();
        let (mut baseline, mut stormy) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            baseline.push(round(&factory, &sizes, false).await);
            stormy.push(round(&factory, &sizes, true).await);
        }
        (baseline, stormy)
    });
    let median = |rounds: &[Round], pick: fn(&Round) -> Duration| {
        common::median(rounds.iter().map(pick).collect())
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "gc storm: {} terminal allocs, gc_parallel_destroys {PARALLEL_DESTROYS}, {} new service allocs in {} waves {WAVE_GAP:?} apart; medians of {rounds} rounds",
        sizes.terminal, sizes.new, sizes.waves
    );
    let (base_p50, base_p99) = (
        median(&baseline, |r| r.start_p50),
        median(&baseline, |r| r.start_p99),
    );
    let (storm_p50, storm_p99) = (
        median(&stormy, |r| r.start_p50),
        median(&stormy, |r| r.start_p99),
    );
    println!(
        "  no storm (baseline)  start p50 {:>7.2} ms  p99 {:>7.2} ms",
        ms(base_p50),
        ms(base_p99)
    );
    println!(
        "  during the storm     start p50 {:>7.2} ms  p99 {:>7.2} ms  (p99 {:.2}x the baseline)",
        ms(storm_p50),
        ms(storm_p99),
        storm_p99.as_secs_f64() / base_p99.as_secs_f64()
    );
    let peak = stormy
        .iter()
        .filter_map(|round| round.storm.as_ref().map(|s| s.peak_in_flight))
        .max()
        .unwrap_or(0);
    common::scoreboard(
        "gc_storm",
        &format!(
            "p99 {:.1} ms; at most {peak} destroys in flight (limit {PARALLEL_DESTROYS})",
            ms(storm_p99)
        ),
        &format!("p99 {:.1} ms", ms(base_p99)),
        &format!("{:.2}x", storm_p99.as_secs_f64() / base_p99.as_secs_f64()),
    );
    for (n, round) in stormy.iter().enumerate() {
        let storm = round
            .storm
            .as_ref()
            .expect("a storm round measures its storm");
        println!(
            "  storm {}: {} collected in {:.2} s ({:.0}/s), destroys in flight at most {} (limit {PARALLEL_DESTROYS}); {} of them collected when the last new alloc started",
            n + 1,
            sizes.terminal,
            storm.lasted.as_secs_f64(),
            sizes.terminal as f64 / storm.lasted.as_secs_f64(),
            storm.peak_in_flight,
            storm.collected_at_last_start
        );
    }
}
