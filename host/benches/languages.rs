//! What a language costs a runner: component size, compile time on first load, load time from
//! the on-disk cache, alloc start latency, and memory per live alloc, for the `minimal` runner of
//! each language, with Rust as the baseline every ratio is taken against.
//!
//! Run: `cargo bench -p caravan-host --bench languages` after `./run-tests` or
//! `scripts/build-guests` (the Python, JavaScript and C runners are built by their own
//! toolchains). Options after `--`: `--rounds N` alloc starts per language (default 200),
//! `--live N` live allocs for the memory figure (default 1,000).
//!
//! - compile: a fresh runtime with an empty cache dir, `load_file` (read, hash, compile,
//!   link, write the cache entry).
//! - cached load: a second fresh runtime on the same cache dir, `load_file`.
//! - alloc start: the wasm factory builds the runner, `run()`, until the guest reports
//!   `running` (as the `alloc_start` bench measures it); then `kill` and wait, outside the
//!   timing. Median of the rounds.
//! - memory per live alloc: N allocs started in a pool no instance has used yet and waiting
//!   in `next-event`, in a process of the bench's own that loads the component from the
//!   cache, its growth divided by N, as PSS (what the machine pays: a
//!   page shared by several mappings is divided among them) and as RSS (each mapping of a
//!   page counted whole). They differ by the component's copy-on-write memory image, which
//!   every instance maps and reads but the kernel holds once; it prints the other kinds too
//!   (anonymous, shared, private, and the machine's used memory, which is noisy).
//!
//! `--only LANGUAGE` (`c`, `python`, `javascript`) measures that language beside Rust, e.g.
//! under `perf record`.

mod common;

use caravan_host::allocrunner::AllocRunner;
use caravan_host::runtime::{Origin, Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use caravan_test_artifacts::{MINIMAL, other_language_runner};
use common::{MemoryKinds, MemoryPerItem, StatusSignal, alloc, config, median};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Figures {
    language: &'static str,
    size: u64,
    compile: Duration,
    cached_load: Duration,
    start: Duration,
    /// Per live alloc, in bytes.
    memory: MemoryPerItem,
}

async fn measure(language: &'static str, path: &str, rounds: usize, live: usize) -> Figures {
    let size = std::fs::metadata(path)
        .unwrap_or_else(|_| panic!("{path} is missing: run scripts/build-guests"))
        .len();
    let cache = tempfile::tempdir().unwrap();
    let runtime_config = RuntimeConfig {
        // The start rounds hold one alloc at a time: the live ones run in a process of
        // their own.
        max_live_allocs: 10,
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

    let memory = live_memory_in_a_fresh_process(language, path, cache.path(), live);
    println!("{language}: per live alloc: {}", memory.describe_kib());

    let factory = WasmAllocRunnerFactory::new(runtime.clone());
    let data_dir = tempfile::tempdir().unwrap();
    let mut samples = Vec::with_capacity(rounds);
    for n in 0..rounds {
        let signal = StatusSignal::running();
        let started = Instant::now();
        let runner = factory
            .build(config(
                alloc(path, live + n),
                data_dir.path(),
                signal.clone(),
            ))
            .unwrap();
        runner.run();
        signal.reached.notified().await;
        samples.push(started.elapsed());
        runner.kill();
        runner.wait().wait().await;
    }
    Figures {
        language,
        size,
        compile,
        cached_load,
        start: median(samples),
        memory,
    }
}

/// Runs this bench again as `--live-memory PATH CACHE_DIR N` and reads what
/// [`live_memory`] measured there. A process of its own, because this one has just compiled
/// the component and its allocator is still handing back what the compile freed, which
/// would be subtracted from the instances' growth (by up to half, measured).
fn live_memory_in_a_fresh_process(
    language: &str,
    path: &str,
    cache: &Path,
    live: usize,
) -> MemoryPerItem {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--live-memory")
        .args([path, &cache.display().to_string(), &live.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("live-memory:")) else {
        panic!(
            "{language}: the live-memory process printed no figures: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let figures: Vec<f64> = line
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let [rss, anon, file, shmem, pss, private, machine_used] = figures[..] else {
        panic!("{language}: live-memory printed {line:?}");
    };
    MemoryPerItem {
        rss,
        anon,
        file,
        shmem,
        pss,
        private,
        machine_used,
    }
}

/// The child's side of [`live_memory_in_a_fresh_process`]: loads the component from the
/// cache the parent filled, starts and ends one alloc (so what any first start sets up once
/// is not counted), then starts `live` allocs, all but one in slots no instance has used (a
/// slot a finished alloc left keeps some of its pages resident, engine.rs), and prints their
/// growth.
async fn live_memory(path: &str, cache: &Path, live: usize) {
    let runtime = Runtime::new(&RuntimeConfig {
        max_live_allocs: (live + 10) as u32,
        cache_dir: Some(cache.to_path_buf()),
        ..RuntimeConfig::default()
    })
    .unwrap();
    assert_eq!(
        runtime.load_file(Path::new(path)).unwrap().origin,
        Origin::DiskCache
    );
    let factory = WasmAllocRunnerFactory::new(runtime.clone());
    let data_dir = tempfile::tempdir().unwrap();
    let start = |n: usize| {
        let signal = StatusSignal::running();
        let runner = factory
            .build(config(alloc(path, n), data_dir.path(), signal.clone()))
            .unwrap();
        runner.run();
        async move {
            signal.reached.notified().await;
            runner
        }
    };
    let first = start(0).await;
    first.kill();
    first.wait().wait().await;
    let before = MemoryKinds::now();
    let mut runners = Vec::with_capacity(live);
    for n in 1..=live {
        runners.push(start(n).await);
    }
    let m = MemoryKinds::now().per_item_since(&before, live);
    println!(
        "live-memory: {} {} {} {} {} {} {}",
        m.rss, m.anon, m.file, m.shmem, m.pss, m.private, m.machine_used
    );
    for runner in &runners {
        runner.kill();
    }
    for runner in &runners {
        runner.wait().wait().await;
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
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, path, cache, live] = &args[..]
        && flag == "--live-memory"
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let (path, cache, live) = (path.clone(), PathBuf::from(cache), live.parse().unwrap());
        // On a worker task, as the client starts runners.
        runtime
            .block_on(async move {
                tokio::spawn(async move { live_memory(&path, &cache, live).await }).await
            })
            .unwrap();
        return;
    }
    let (rounds, live) = (arg("--rounds", 200), arg("--live", 1_000));
    // One language beside Rust (`--only python`), to profile it.
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let runners: Vec<(&'static str, String)> = std::iter::once(("rust", MINIMAL.to_string()))
        .chain(
            [("c", "c"), ("python", "python"), ("javascript", "js")]
                .map(|(name, dir)| (name, other_language_runner(dir, "minimal").0)),
        )
        .filter(|(language, _)| {
            *language == "rust" || only.as_deref().is_none_or(|only| only == *language)
        })
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
        "| language | component | compile on first load | cached load | alloc start (median of {rounds}) | memory per live alloc ({live} live): PSS, RSS |"
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
            "| {} | {:.1} KB{} | {:.1} ms{} | {:.2} ms{} | {:.0} us{} | {:.0} KiB{}, {:.0} KiB{} |",
            f.language,
            f.size as f64 / 1000.0,
            ratio(f.size as f64, rust.size as f64),
            f.compile.as_secs_f64() * 1e3,
            ratio(f.compile.as_secs_f64(), rust.compile.as_secs_f64()),
            f.cached_load.as_secs_f64() * 1e3,
            ratio(f.cached_load.as_secs_f64(), rust.cached_load.as_secs_f64()),
            f.start.as_secs_f64() * 1e6,
            ratio(f.start.as_secs_f64(), rust.start.as_secs_f64()),
            f.memory.pss / 1024.0,
            ratio(f.memory.pss, rust.memory.pss),
            f.memory.rss / 1024.0,
            ratio(f.memory.rss, rust.memory.rss),
        );
        let row = match f.language {
            "python" => "languages_python",
            "javascript" => "languages_js",
            _ => continue,
        };
        common::scoreboard(
            row,
            &format!(
                "PSS {:.0} KiB (RSS {:.0} KiB), start {:.0} us",
                f.memory.pss / 1024.0,
                f.memory.rss / 1024.0,
                f.start.as_secs_f64() * 1e6
            ),
            &format!(
                "Rust: PSS {:.0} KiB, {:.0} us",
                rust.memory.pss / 1024.0,
                rust.start.as_secs_f64() * 1e6
            ),
            &format!(
                "{:.0}x, {:.0}x",
                f.memory.pss / rust.memory.pss,
                f.start.as_secs_f64() / rust.start.as_secs_f64()
            ),
        );
    }
}
