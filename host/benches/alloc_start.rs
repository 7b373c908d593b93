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
//!   state updater sees the guest's `running`.
//!   Rounds alternate between the two so machine noise hits both alike. Both run on a tokio
//!   worker task, as the client's add path does.
//! - live allocs: start N minimal runners, wait until all are running (waiting in
//!   `next-event`), and divide the growth of the process's RSS by N.

use caravan_host::allocrunner::AllocRunner;
use caravan_host::runtime::{Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

mod common;

mod raw {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "alloc-runner",
        imports: { "caravan:runner/host.next-event": async },
        exports: { default: async },
    });
}

use common::{RunningSignal, alloc, config, median, rss_bytes};
use raw::caravan::runner::{host as raw_host, types as raw_types};

/// The bare embedding's store: WASI plus no-op Caravan imports.
struct RawData {
    wasi: wasmtime_wasi::WasiCtx,
    table: wasmtime::component::ResourceTable,
    reported: Option<Instant>,
}

impl wasmtime_wasi::WasiView for RawData {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        wasmtime_wasi::WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl raw_types::Host for RawData {}

impl raw_host::Host for RawData {
    async fn next_event(&mut self, _timeout_ms: u64) -> Option<raw_types::Event> {
        Some(raw_types::Event::Kill)
    }

    fn update_state(&mut self, _state: raw_types::AllocState) -> Result<(), String> {
        self.reported.get_or_insert_with(Instant::now);
        Ok(())
    }

    fn checkpoint(&mut self, _data: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
}

impl raw::wasi::logging::logging::Host for RawData {
    fn log(&mut self, _: raw::wasi::logging::logging::Level, _: String, _: String) {}
}

struct Baseline {
    engine: wasmtime::Engine,
    pre: raw::AllocRunnerPre<RawData>,
}

impl Baseline {
    fn new(engine: &wasmtime::Engine, path: &str) -> Self {
        let mut linker = wasmtime::component::Linker::<RawData>::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        raw::AllocRunner::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |d| d)
            .unwrap();
        let component = wasmtime::component::Component::from_file(engine, path).unwrap();
        let pre = raw::AllocRunnerPre::new(linker.instantiate_pre(&component).unwrap()).unwrap();
        Baseline {
            engine: engine.clone(),
            pre,
        }
    }

    /// Instantiate and call `run` until the first `update-state`.
    async fn start_once(&self, alloc: &raw_types::Alloc) -> Duration {
        let begun = Instant::now();
        let data = RawData {
            wasi: wasmtime_wasi::WasiCtxBuilder::new().build(),
            table: wasmtime::component::ResourceTable::new(),
            reported: None,
        };
        let mut store = wasmtime::Store::new(&self.engine, data);
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let _ = instance
            .caravan_runner_runner()
            .call_run(&mut store, alloc, None)
            .await
            .unwrap();
        store.data().reported.expect("the guest reported") - begun
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn start_latency(rounds: usize) {
    let runtime = Runtime::new(&RuntimeConfig {
        max_live_allocs: 64,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let factory = WasmAllocRunnerFactory::new(runtime.clone());
    let baseline = Baseline::new(runtime.engine(), caravan_test_artifacts::MINIMAL);
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
    for round in 0..rounds + rounds / 10 {
        let raw = baseline.start_once(&raw_alloc).await;

        let signal = Arc::new(RunningSignal {
            running: Notify::new(),
        });
        let begun = Instant::now();
        let runner = factory
            .build(config(
                alloc(caravan_test_artifacts::MINIMAL, round),
                data_dir.path(),
                signal.clone(),
            ))
            .unwrap();
        runner.run();
        signal.running.notified().await;
        let caravan = begun.elapsed();
        runner.destroy();
        runner.destroyed().wait().await;

        // The first tenth warms caches and the pool; it is not counted.
        if round >= rounds / 10 {
            raw_samples.push(raw);
            caravan_samples.push(caravan);
        }
    }
    // What the filesystem alone costs Caravan per alloc: its directory, made and opened.
    let mut dir_samples = Vec::new();
    for round in 0..rounds {
        let dir = data_dir.path().join(format!("probe-{round}"));
        let begun = Instant::now();
        std::fs::create_dir(&dir).unwrap();
        drop(std::fs::File::open(&dir).unwrap());
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
    println!(
        "  of which making and opening the alloc dir (mkdir + open on this disk): {:.1} us",
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
    let warm = Arc::new(RunningSignal {
        running: Notify::new(),
    });
    let first = factory
        .build(config(
            alloc(caravan_test_artifacts::MINIMAL, 0),
            data_dir.path(),
            warm.clone(),
        ))
        .unwrap();
    first.run();
    warm.running.notified().await;

    let before = rss_bytes();
    let begun = Instant::now();
    let mut runners = Vec::new();
    for n in 1..=count as usize {
        let signal = Arc::new(RunningSignal {
            running: Notify::new(),
        });
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
            _ = signal.running.notified() => {}
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
    for runner in &runners {
        runner.destroy();
    }
    for runner in &runners {
        runner.destroyed().wait().await;
    }
}

fn main() {
    // As an agent would run: a subscriber at INFO, so spans and fields are really built.
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_writer(std::io::sink)
        .init();
    let rounds = arg("--rounds").and_then(|r| r.parse().ok()).unwrap_or(2000);
    let live = arg("--live").unwrap_or_else(|| "1000,10000".into());
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
    // Measured from a worker task, as the client's add path runs: a runner task spawned from
    // there starts on the same worker, without waking another thread.
    tokio.block_on(async {
        tokio::spawn(async move {
            start_latency(rounds).await;
            for count in live.split(',').filter_map(|n| n.parse().ok()) {
                live_memory(count).await;
            }
        })
        .await
        .unwrap();
    });
}
