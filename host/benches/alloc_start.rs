//! Alloc start latency and memory per live alloc, with raw wasmtime as the baseline.
//!
//! Run: `cargo bench -p caravan-host --bench alloc_start` (builds the guests first through
//! `caravan-test-artifacts`). Options after `--`: `--rounds N` (default 2000) and
//! `--live N,N` (default 1000,10000).
//!
//! - baseline: a bare embedding of the same component (its own `bindgen!`, no-op host
//!   imports, `next-event` answering `kill` at once): new `Store` + `InstancePre`
//!   instantiate + the `run` call until the guest's first `update-state`.
//! - caravan: the wasm factory builds the runner, `run()`, and the time until the host's
//!   state updater sees the guest's `running` (taken in the updater, as the baseline takes
//!   it in its import; the time until the bench's waiting task resumes is shown beside it).
//!   Rounds alternate between the two so machine noise hits both alike. Both run on a tokio
//!   worker task, as the client's add path does.
//! - live allocs: start N minimal runners, wait until all are running (waiting in
//!   `next-event`), and divide the growth of the process's RSS by N. Each size runs in a
//!   fresh process of its own: one that ran other allocs before would reuse the memory they
//!   freed (the allocator keeps it), and count too little. The baseline, in another fresh
//!   process: N instances of the same component in the bare embedding, on the engine
//!   Caravan's runtime makes for N, each waiting in a `next-event` that never answers.

use caravan_host::allocrunner::AllocRunner;
use caravan_host::runtime::{Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use std::time::Instant;

mod common;

#[path = "common/raw.rs"]
mod raw;

use common::{StatusSignal, alloc, arg_value, build_of, config, median, rss_bytes};
use raw::{Baseline, types as raw_types};

async fn start_latency(rounds: usize) {
    let runtime = Runtime::new(&RuntimeConfig {
        max_live_allocs: 64,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let factory = WasmAllocRunnerFactory::new(runtime.clone());
    let baseline = Baseline::new(runtime.engine(), caravan_test_artifacts::MINIMAL);
    let build = build_of(caravan_test_artifacts::MINIMAL);
    let data_dir = tempfile::tempdir().unwrap();
    let raw_alloc = raw_alloc(0);
    let (mut raw_samples, mut caravan_samples) = (Vec::new(), Vec::new());
    let mut resumed_samples = Vec::new();
    for round in 0..rounds + rounds / 10 {
        let raw = baseline.start_once(&raw_alloc).await;

        let signal = StatusSignal::running();
        // The alloc arrives made, as the baseline's does, naming its build as the server's
        // do; its span is the client's, and timed.
        let mut alloc = alloc(caravan_test_artifacts::MINIMAL, round);
        alloc.runner_sha256 = Some(build.clone());
        let begun = Instant::now();
        let runner = factory
            .build(config(alloc, data_dir.path(), signal.clone()))
            .unwrap();
        runner.run();
        signal.reached.notified().await;
        let resumed = begun.elapsed();
        let caravan = signal.seen_at().expect("running was seen") - begun;
        runner.destroy();
        runner.destroyed().wait().await;

        // The first tenth warms caches and the pool; it is not counted.
        if round >= rounds / 10 {
            raw_samples.push(raw);
            caravan_samples.push(caravan);
            resumed_samples.push(resumed);
        }
    }
    // What a directory would cost per alloc: the minimal runner imports no `wasi:filesystem`
    // and is given none, but a runner that reads or writes files pays this on its start.
    let mut dir_samples = Vec::new();
    for round in 0..rounds {
        let dir = data_dir.path().join(format!("probe-{round}"));
        let begun = Instant::now();
        std::fs::create_dir(&dir).unwrap();
        dir_samples.push(begun.elapsed());
        std::fs::remove_dir(&dir).unwrap();
    }
    let (raw, caravan) = (median(raw_samples), median(caravan_samples));
    println!("pooling allocator: {}", runtime.uses_pooling());
    println!("alloc start, median of {rounds} rounds:");
    println!(
        "  raw wasmtime (instantiate + run until first update-state): {:.1} us",
        raw.as_secs_f64() * 1e6
    );
    println!(
        "  caravan (factory -> run -> running seen by the host):      {:.1} us",
        caravan.as_secs_f64() * 1e6
    );
    println!(
        "  ratio caravan / raw: {:.2}",
        caravan.as_secs_f64() / raw.as_secs_f64()
    );
    common::scoreboard(
        "alloc_start",
        &format!("{:.1} us", caravan.as_secs_f64() * 1e6),
        &format!("raw wasmtime {:.1} us", raw.as_secs_f64() * 1e6),
        &format!("{:.2}x", caravan.as_secs_f64() / raw.as_secs_f64()),
    );
    println!(
        "  (caravan until the task waiting for running resumed:   {:.1} us)",
        median(resumed_samples).as_secs_f64() * 1e6
    );
    println!(
        "  (a runner that reaches files also makes its alloc dir: mkdir here {:.1} us)",
        median(dir_samples).as_secs_f64() * 1e6
    );
}

/// The bare embedding's alloc number `n`.
fn raw_alloc(n: usize) -> raw_types::Alloc {
    raw_types::Alloc {
        id: format!("bench-{n}"),
        job_id: "bench".into(),
        group: "bench".into(),
        tasks: vec![],
        desired_status: raw_types::DesiredStatus::Run,
        modify_index: 1,
        meta: vec![],
    }
}

/// The line a live-allocs process ends with, read by the parent: its KiB per live alloc.
const KIB_PER_LIVE_ALLOC: &str = "KiB per live alloc: ";

/// Prints what `count` live allocs of `what` cost, as the growth of this process's RSS from
/// `before`, and the line the parent reads.
fn report_live(what: &str, count: u32, before: u64, started_in: std::time::Duration) {
    assert!(count > 0, "{what}: no alloc went live");
    let grown = rss_bytes().saturating_sub(before);
    let each = grown as f64 / count as f64 / 1024.0;
    println!(
        "{what}: {count} live allocs: {each:.1} KiB RSS each ({} MiB in all), started in {:.2} s",
        grown >> 20,
        started_in.as_secs_f64()
    );
    println!("{KIB_PER_LIVE_ALLOC}{each}");
}

/// The runtime for `count` live allocs, with some room: what sizes the engine's allocator
/// and reservations, for Caravan's allocs and the baseline's alike.
fn runtime_for_live(count: u32) -> Runtime {
    Runtime::new(&RuntimeConfig {
        max_live_allocs: count + 16,
        ..RuntimeConfig::default()
    })
    .unwrap()
}

/// The baseline of `live_memory`: `count` instances of the same component in the bare
/// embedding, on the engine Caravan's runtime makes for that many (the same allocator and
/// reservations), each waiting in `next-event` on a task of its own.
async fn raw_live_memory(count: u32) {
    let runtime = runtime_for_live(count);
    let baseline = Baseline::new(runtime.engine(), caravan_test_artifacts::MINIMAL);
    // One first, so that no first-use cost counts.
    baseline.park_one(raw_alloc(0)).await;
    let before = rss_bytes();
    let begun = Instant::now();
    for n in 1..=count as usize {
        baseline.park_one(raw_alloc(n)).await;
    }
    report_live("raw wasmtime", count, before, begun.elapsed());
}

async fn live_memory(count: u32) {
    let runtime = runtime_for_live(count);
    let factory = WasmAllocRunnerFactory::new(runtime.clone());
    let data_dir = tempfile::tempdir().unwrap();
    // Compile and run one first, so neither compiled code nor first-use costs count.
    let warm = StatusSignal::running();
    let first = factory
        .build(config(
            alloc(caravan_test_artifacts::MINIMAL, 0),
            data_dir.path(),
            warm.clone(),
        ))
        .unwrap();
    first.run();
    warm.reached.notified().await;

    let before = rss_bytes();
    let begun = Instant::now();
    let mut runners = Vec::new();
    for n in 1..=count as usize {
        let signal = StatusSignal::running();
        let runner = factory
            .build(config(
                alloc(caravan_test_artifacts::MINIMAL, n),
                data_dir.path(),
                signal.clone(),
            ))
            .unwrap();
        runner.run();
        let stopped = runner.wait();
        tokio::select! {
            _ = signal.reached.notified() => {}
            _ = stopped.wait() => {
                println!("alloc {n} of {count} stopped before running: {}", runner.alloc_state().description);
                break;
            }
        }
        runners.push(runner);
    }
    // A figure over fewer allocs than the baseline's is no comparison.
    assert_eq!(runners.len(), count as usize, "some allocs stopped early");
    let elapsed = begun.elapsed();
    let failed = runners.iter().filter(|r| r.wait().is_set()).count();
    assert_eq!(failed, 0, "allocs stopped while the others started");
    println!("pooling allocator: {}", runtime.uses_pooling());
    report_live("caravan", count, before, elapsed);
    for runner in &runners {
        runner.destroy();
    }
    for runner in &runners {
        runner.destroyed().wait().await;
    }
}

fn main() {
    common::log_as_the_agent();
    let rounds = arg_value("--rounds")
        .and_then(|r| r.parse().ok())
        .unwrap_or(2000);
    if let Some(count) = arg_value(ONLY_LIVE).and_then(|n| n.parse().ok()) {
        run_on_worker(live_memory(count));
        return;
    }
    if let Some(count) = arg_value(ONLY_LIVE_RAW).and_then(|n| n.parse().ok()) {
        run_on_worker(raw_live_memory(count));
        return;
    }
    let live = arg_value("--live").unwrap_or_else(|| "1000,10000".into());
    run_on_worker(start_latency(rounds));
    for count in live.split(',').filter(|n| n.parse::<u32>().is_ok()) {
        let raw = live_size(ONLY_LIVE_RAW, count);
        let caravan = live_size(ONLY_LIVE, count);
        println!(
            "{count} live allocs: caravan {caravan:.1} KiB each, raw wasmtime {raw:.1} KiB: {:.2}x",
            caravan / raw
        );
        common::scoreboard(
            "density",
            &format!("{caravan:.1} KiB at {count} live allocs"),
            &format!("raw wasmtime {raw:.1} KiB"),
            &format!("{:.2}x", caravan / raw),
        );
    }
}

/// Given to the child process that measures one size of live allocs.
const ONLY_LIVE: &str = "--only-live";
/// Given to the child process that measures one size of the bare embedding's live allocs.
const ONLY_LIVE_RAW: &str = "--only-live-raw";

/// Runs one size of live allocs (`which`: Caravan's or the bare embedding's) in a process
/// of its own, shows what it printed, and returns its KiB per live alloc.
fn live_size(which: &str, count: &str) -> f64 {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--bench", which, count])
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    print!("{printed}");
    assert!(
        output.status.success(),
        "the {count} live allocs run ({which}) failed: {}",
        output.status
    );
    printed
        .lines()
        .find_map(|line| line.strip_prefix(KIB_PER_LIVE_ALLOC)?.parse().ok())
        .unwrap_or_else(|| panic!("the {count} live allocs run ({which}) printed no figure"))
}

/// Runs `measure` to its end from a tokio worker task, as the client's add path runs: a
/// runner task spawned from there starts on the same worker, without waking another thread.
fn run_on_worker(measure: impl std::future::Future<Output = ()> + Send + 'static) {
    let tokio = if std::env::var_os("BENCH_CURRENT_THREAD").is_some() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    tokio.block_on(async { tokio::spawn(measure).await.unwrap() });
}
