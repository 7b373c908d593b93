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
//!   freed (the allocator keeps it), and count too little.

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
    let raw_alloc = raw_types::Alloc {
        id: "bench".into(),
        job_id: "bench".into(),
        group: "bench".into(),
        tasks: vec![],
        desired_status: raw_types::DesiredStatus::Run,
        modify_index: 1,
        meta: vec![],
    };
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

async fn live_memory(count: u32) {
    let runtime = Runtime::new(&RuntimeConfig {
        max_live_allocs: count + 16,
        ..RuntimeConfig::default()
    })
    .unwrap();
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
    let count = runners.len() as u32;
    let elapsed = begun.elapsed();
    let after = rss_bytes();
    let failed = runners.iter().filter(|r| r.wait().is_set()).count();
    println!(
        "{count} live allocs (pooling: {}): {:.1} KiB RSS each ({} MiB in all), started in {:.2} s, {failed} stopped early",
        runtime.uses_pooling(),
        (after - before) as f64 / count as f64 / 1024.0,
        (after - before) >> 20,
        elapsed.as_secs_f64()
    );
    common::scoreboard(
        "density",
        &format!(
            "{:.1} KiB at {count} live allocs",
            (after - before) as f64 / count as f64 / 1024.0
        ),
        "none",
        "-",
    );
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
    let live = arg_value("--live").unwrap_or_else(|| "1000,10000".into());
    run_on_worker(start_latency(rounds));
    for count in live.split(',').filter(|n| n.parse::<u32>().is_ok()) {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--bench", ONLY_LIVE, count])
            .status()
            .unwrap();
        assert!(
            status.success(),
            "the {count} live allocs run failed: {status}"
        );
    }
}

/// Given to the child process that measures one size of live allocs.
const ONLY_LIVE: &str = "--only-live";

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
