//! Churn: how many minimal allocs one node starts, completes and collects per second
//! through the client core, against one `wasmtime run` process per alloc, measured in the
//! same run.
//!
//! Run: `scripts/bench`, which first builds wasmtime-cli 48 from crates.io into
//! `target/tools` (the test command never does), or `cargo bench -p caravan-host --bench
//! churn -- --wasmtime PATH`. Options after `--`: `--allocs N` (default 10000), `--processes
//! N` (default 200), `--rounds N` (default 3).
//!
//! - caravan: one node's client core in process, on an in-memory server, with the
//!   sandboxed sim runner (`guests/sim`). N batch allocs (`run_for = 0s`: received, set up,
//!   started, terminated) are placed at once; the round ends when every one has completed,
//!   been reported, and been collected by the client's GC, but for the 50 terminal allocs
//!   Nomad's default `gc_max_allocs` keeps (two destroys at a time, Nomad's default too).
//! - process per alloc (the baseline): the smallest WASI command
//!   (`guests/fixtures/wrong-world`: prints a line, exits), compiled ahead once with
//!   `wasmtime compile` so no process compiles it, and run as `wasmtime run
//!   --allow-precompiled` once per alloc, as many at a time as the machine has cores. A
//!   runner component cannot be run there: it imports Caravan's host interface, which only a
//!   Caravan host gives, so the baseline does less per alloc than the sim runner does.
//!
//! The caravan side runs twice a round: with the node's data dir (alloc dirs, log files) in
//! the temp dir, on this machine's disk, and in `/dev/shm`, a tmpfs, where there is one: a
//! short alloc makes and removes a directory and a log file, and what that costs is the
//! file system's, not the client core's (on a journal-less ext4, far more than the rest).
//!
//! Rounds alternate the sides; reported are the medians, their ratios and the targets.

mod common;
#[path = "common/one_node.rs"]
mod one_node;

use caravan_host::allocrunner::AllocRunnerFactory;
use caravan_host::client::gc::GcConfig;
use caravan_host::runtime::{Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use caravan_host::state::{MemoryStateDb, StateDb};
use caravan_host::testing::InMemoryServer;
use caravan_test_artifacts::FIXTURE_WRONG_WORLD;
use common::{arg_value, count_arg, median};
use one_node::{LOOK, NODE, collected, sim_alloc, wait_until};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the command prints, to know each process really ran it.
const COMMAND_SAYS: &str = "I am a command";

/// One caravan round: `allocs` placed at once, until all but the GC's kept ones are
/// collected, with the node's data dir in `parent`.
async fn caravan_round(factory: &AllocRunnerFactory, allocs: usize, parent: &Path) -> Duration {
    let dir = tempfile::tempdir_in(parent).unwrap();
    let server = InMemoryServer::new();
    let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
    let gc = GcConfig::default();
    let kept = gc.max_allocs as u64;
    let client = one_node::client(server.clone(), factory, &db, dir.path(), gc);
    client.restore().await.unwrap();
    client.start();
    let began = Instant::now();
    server.place_many(
        NODE,
        (0..allocs).map(|n| sim_alloc(format!("churn-{n:06}"), "churn", &[("run_for", "0s")])),
    );
    let wanted = (allocs as u64).saturating_sub(kept);
    wait_until("the allocs to complete and be collected", LOOK, || {
        collected(&client) >= wanted
    })
    .await;
    let elapsed = began.elapsed();
    client.destroy_all().await;
    elapsed
}

/// One baseline round: `processes` runs of the command, as many at once as there are cores.
fn process_round(wasmtime: &Path, compiled: &Path, processes: usize) -> Duration {
    let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = AtomicUsize::new(0);
    let began = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..parallel {
            scope.spawn(|| {
                while next.fetch_add(1, Ordering::Relaxed) < processes {
                    let output = Command::new(wasmtime)
                        .args(["run", "--allow-precompiled"])
                        .arg(compiled)
                        .output()
                        .unwrap();
                    assert!(
                        output.status.success()
                            && String::from_utf8_lossy(&output.stdout).contains(COMMAND_SAYS),
                        "wasmtime run failed ({}): {}",
                        output.status,
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
            });
        }
    });
    began.elapsed()
}

/// wasmtime-cli from `--wasmtime`, or where `scripts/bench` installs it.
fn wasmtime_cli() -> PathBuf {
    let path = arg_value("--wasmtime").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/bin/wasmtime"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "no wasmtime-cli at {}: scripts/bench builds it (cargo install wasmtime-cli --version 48.0.8 ... --root target/tools), or pass --wasmtime PATH",
        path.display()
    );
    let version = Command::new(&path).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    assert!(
        version.starts_with("wasmtime 48."),
        "{} is {version:?}, not wasmtime 48 (the host's wasmtime)",
        path.display()
    );
    path
}

fn main() {
    common::log_as_the_agent();
    let allocs = count_arg("--allocs", 10_000);
    let processes = count_arg("--processes", 200);
    let rounds = count_arg("--rounds", 3);
    let wasmtime = wasmtime_cli();
    let work = tempfile::tempdir().unwrap();
    let compiled = work.path().join("command.cwasm");
    let compile = Command::new(&wasmtime)
        .arg("compile")
        .arg(FIXTURE_WRONG_WORLD)
        .arg("-o")
        .arg(&compiled)
        .status()
        .unwrap();
    assert!(compile.success(), "wasmtime compile failed");

    let on_disk = std::env::temp_dir();
    let tmpfs = Path::new("/dev/shm");
    let tmpfs = tmpfs.is_dir().then_some(tmpfs);
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (mut caravan, mut caravan_tmpfs, mut per_process) = (Vec::new(), Vec::new(), Vec::new());
    tokio.block_on(async {
        let runtime = Runtime::new(&RuntimeConfig {
            max_live_allocs: u32::try_from(allocs + 100).unwrap(),
            cache_dir: Some(work.path().join("cache")),
            ..RuntimeConfig::default()
        })
        .unwrap();
        let factory = WasmAllocRunnerFactory::new(runtime).into_factory();
        // Warm-up, not counted: the sim runner compiled, pools and caches filled.
        caravan_round(&factory, 200, &on_disk).await;
        process_round(&wasmtime, &compiled, 10);
        for _ in 0..rounds {
            caravan.push(caravan_round(&factory, allocs, &on_disk).await);
            if let Some(tmpfs) = tmpfs {
                caravan_tmpfs.push(caravan_round(&factory, allocs, tmpfs).await);
            }
            per_process.push(process_round(&wasmtime, &compiled, processes));
        }
    });
    let caravan_rate = allocs as f64 / median(caravan).as_secs_f64();
    let process_rate = processes as f64 / median(per_process).as_secs_f64();
    println!("churn: medians of {rounds} rounds");
    println!(
        "  process per alloc (wasmtime run, baseline)  {process_rate:>9.0} allocs/s  ({processes} processes, {} at a time)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "  caravan client core, sim runner             {caravan_rate:>9.0} allocs/s  ({allocs} allocs started, completed and collected, data dir in {}; {:.1}x the baseline)",
        on_disk.display(),
        caravan_rate / process_rate
    );
    common::scoreboard(
        "churn",
        &format!("{caravan_rate:.0} allocs/s"),
        &format!("{process_rate:.0} processes/s"),
        &format!("{:.1}x", caravan_rate / process_rate),
    );
    if !caravan_tmpfs.is_empty() {
        let tmpfs_rate = allocs as f64 / median(caravan_tmpfs).as_secs_f64();
        println!(
            "  the same, data dir on tmpfs (/dev/shm)      {tmpfs_rate:>9.0} allocs/s  ({:.1}x the baseline)",
            tmpfs_rate / process_rate
        );
    }
    println!("  targets: at least 25000 allocs/s and at least 50x the baseline");
}
