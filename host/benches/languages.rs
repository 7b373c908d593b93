//! What a language costs a runner: component size, compile time on first load, load time from
//! the on-disk cache, alloc start latency, and RSS per live alloc, for the `minimal` runner of
//! each language, with Rust as the baseline every ratio is taken against.
//!
//! Run: `cargo bench -p caravan-host --bench languages` after `./run-tests` or
//! `scripts/build-guests` (the Python, JavaScript and C runners are built by their own
//! toolchains). Options after `--`: `--rounds N` alloc starts per language (default 200),
//! `--live N` live allocs for the memory figure (default 100).
//!
//! - compile: a fresh runtime with an empty cache dir, `load_file` (read, hash, compile,
//!   link, write the cache entry).
//! - cached load: a second fresh runtime on the same cache dir, `load_file`.
//! - alloc start: the wasm factory builds the runner, `run()`, until the guest reports
//!   `running` (as the `alloc_start` bench measures it); then `kill` and wait, outside the
//!   timing. Median of the rounds.
//! - RSS per live alloc: start N allocs, wait until all run, divide the RSS growth by N.

mod common;

use caravan_host::allocrunner::AllocRunner;
use caravan_host::runtime::{Origin, Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use caravan_test_artifacts::{MINIMAL, other_language_runner};
use common::{StatusSignal, alloc, config, median, rss_bytes};
use std::path::Path;
use std::time::{Duration, Instant};

struct Figures {
    language: &'static str,
    size: u64,
    compile: Duration,
    cached_load: Duration,
    start: Duration,
    rss_per_alloc: f64,
}

async fn measure(language: &'static str, path: &str, rounds: usize, live: usize) -> Figures {
    let size = std::fs::metadata(path)
        .unwrap_or_else(|_| panic!("{path} is missing: run scripts/build-guests"))
        .len();
    let cache = tempfile::tempdir().unwrap();
    let runtime_config = RuntimeConfig {
        max_live_allocs: (live + 10) as u32,
        cache_dir: Some(cache.path().to_path_buf()),
        ..RuntimeConfig::default()
    };
    let first = Runtime::new(&runtime_config).unwrap();
    let started = Instant::now();
    let loaded = first.load_file(Path::new(path)).unwrap();
    let compile = started.elapsed();
    assert_eq!(loaded.origin, Origin::Compiled);
    drop((loaded, first));

    let runtime = Runtime::new(&runtime_config).unwrap();
    let started = Instant::now();
    let loaded = runtime.load_file(Path::new(path)).unwrap();
    let cached_load = started.elapsed();
    assert_eq!(loaded.origin, Origin::DiskCache);

    let factory = WasmAllocRunnerFactory::new(runtime.clone());
    let data_dir = tempfile::tempdir().unwrap();
    let mut samples = Vec::with_capacity(rounds);
    for n in 0..rounds {
        let signal = StatusSignal::running();
        let started = Instant::now();
        let runner = factory
            .build(config(alloc(path, n), data_dir.path(), signal.clone()))
            .unwrap();
        runner.run();
        signal.reached.notified().await;
        samples.push(started.elapsed());
        runner.kill();
        runner.wait().wait().await;
    }

    let before = rss_bytes();
    let mut runners = Vec::with_capacity(live);
    for n in 0..live {
        let signal = StatusSignal::running();
        let runner = factory
            .build(config(
                alloc(path, rounds + n),
                data_dir.path(),
                signal.clone(),
            ))
            .unwrap();
        runner.run();
        signal.reached.notified().await;
        runners.push(runner);
    }
    let rss_per_alloc = rss_bytes().saturating_sub(before) as f64 / live as f64;
    for runner in &runners {
        runner.kill();
    }
    for runner in &runners {
        runner.wait().wait().await;
    }
    Figures {
        language,
        size,
        compile,
        cached_load,
        start: median(samples),
        rss_per_alloc,
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (rounds, live) = (arg("--rounds", 200), arg("--live", 100));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let runners: Vec<(&'static str, String)> = std::iter::once(("rust", MINIMAL.to_string()))
        .chain(
            [("c", "c"), ("python", "python"), ("javascript", "js")]
                .map(|(name, dir)| (name, other_language_runner(dir, "minimal").0)),
        )
        .collect();
    // On a worker task, as the client starts runners.
    let figures = runtime.block_on(async move {
        tokio::spawn(async move {
            let mut figures = Vec::new();
            for (language, path) in runners {
                figures.push(measure(language, &path, rounds, live).await);
            }
            figures
        })
        .await
        .unwrap()
    });
    let rust = &figures[0];
    println!(
        "| language | component | compile on first load | cached load | alloc start (median of {rounds}) | RSS per live alloc ({live} live) |"
    );
    println!("|---|---|---|---|---|---|");
    for f in &figures {
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!(" ({:.1}x)", a / b)
            } else {
                String::new()
            }
        };
        println!(
            "| {} | {:.1} KB{} | {:.1} ms{} | {:.2} ms{} | {:.0} us{} | {:.0} KiB{} |",
            f.language,
            f.size as f64 / 1000.0,
            ratio(f.size as f64, rust.size as f64),
            f.compile.as_secs_f64() * 1e3,
            ratio(f.compile.as_secs_f64(), rust.compile.as_secs_f64()),
            f.cached_load.as_secs_f64() * 1e3,
            ratio(f.cached_load.as_secs_f64(), rust.cached_load.as_secs_f64()),
            f.start.as_secs_f64() * 1e6,
            ratio(f.start.as_secs_f64(), rust.start.as_secs_f64()),
            f.rss_per_alloc / 1024.0,
            ratio(f.rss_per_alloc, rust.rss_per_alloc),
        );
        let row = match f.language {
            "python" => "languages_python",
            "javascript" => "languages_js",
            _ => continue,
        };
        common::scoreboard(
            row,
            &format!(
                "{:.0} KiB, start {:.0} us",
                f.rss_per_alloc / 1024.0,
                f.start.as_secs_f64() * 1e6
            ),
            &format!(
                "Rust: {:.0} KiB, {:.0} us",
                rust.rss_per_alloc / 1024.0,
                rust.start.as_secs_f64() * 1e6
            ),
            &format!(
                "{:.0}x, {:.0}x",
                f.rss_per_alloc / rust.rss_per_alloc,
                f.start.as_secs_f64() / rust.start.as_secs_f64()
            ),
        );
    }
}
