//! Guest log throughput: how many records a guest can log per second into the agent's JSON
//! log and its alloc's log file, against the same guest calling a `log` import that does
//! nothing (a bare wasmtime embedding), measured in the same run.
//!
//! Run: `cargo bench -p caravan-host --bench logs` (in `scripts/bench`). Options after `--`:
//! `--lines N` (records per round, default 200000), `--rounds N` (default 5), and
//! `--agent-log-level LEVEL` (default `info`; `warn` keeps the guest's INFO records out of
//! the agent log, to see what the rest of the path costs).
//!
//! The guest is `fixture_log_flood`: it logs its records in a loop inside `start`, then
//! reports `complete`. Each round times, on both sides, from the runner's start to that
//! report, so the time is the loop's; on Caravan's side, until the agent log's writer has
//! written every record too.
//! - no-op: the bare embedding; `log` drops the line.
//! - caravan: the wasm factory's runner, as an agent runs it, with the log rate limits
//!   lifted (this measures the path, not the limit): each record is cut to size, rate-checked,
//!   emitted into the alloc's span through the agent's own JSON subscriber, and queued for
//!   the alloc's log file, whose writer runs off the guest's path.
//!
//! The agent's subscriber writes to stderr, so the bench runs itself as a child whose stderr
//! is a file (an operator's `caravan agent --log-json 2> agent.log`), and then counts the
//! records that reached it. Records the file writer's queue could not take are dropped and
//! counted, as in an agent; the report says how many.

mod common;
#[path = "common/raw.rs"]
mod raw;

use caravan_host::alloc_logs::AllocLogs;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::structs::{ClientStatus, Limits};
use caravan_host::runtime::{Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use caravan_test_artifacts::FIXTURE_LOG_FLOOD;
use common::{StatusSignal, alloc, arg_value, config, count_arg, median};
use raw::{Baseline, types as raw_types};
use std::io::BufRead;
use std::time::{Duration, Instant};

/// Given to the child that measures, whose stderr is the agent log file.
const CHILD: &str = "--measure-with-json-log-on-stderr";
/// What every flood record contains, to count them in the agent log.
const RECORD_TEXT: &str = "flood line";

fn main() {
    if std::env::args().any(|a| a == CHILD) {
        measure();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let agent_log = dir.path().join("agent.log");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(std::env::args().skip(1))
        .arg(CHILD)
        .stderr(std::fs::File::create(&agent_log).unwrap())
        .status()
        .unwrap();
    let log = std::fs::File::open(&agent_log).unwrap();
    let size = log.metadata().unwrap().len();
    let records = std::io::BufReader::new(log)
        .lines()
        .map_while(Result::ok)
        .filter(|line| line.contains(RECORD_TEXT))
        .count();
    assert!(
        status.success(),
        "the measuring child failed ({status}); its log is {}",
        agent_log.display()
    );
    println!(
        "  the agent's JSON log: {records} guest records in {:.1} MiB",
        size as f64 / (1024.0 * 1024.0)
    );
}

fn measure() {
    let level = arg_value("--agent-log-level").unwrap_or_else(|| "info".to_string());
    caravan_host::telemetry::init(&level, true).unwrap();
    let lines = count_arg("--lines", 200_000);
    let rounds = count_arg("--rounds", 5);
    let tokio = tokio::runtime::Runtime::new().unwrap();
    // From a worker task, as the client's add path runs.
    tokio.block_on(async move {
        tokio::spawn(flood_rounds(lines, rounds)).await.unwrap();
    });
}

async fn flood_rounds(lines: usize, rounds: usize) {
    let runtime = Runtime::new(&RuntimeConfig {
        max_live_allocs: 16,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let factory = WasmAllocRunnerFactory::new(runtime.clone());
    let baseline = Baseline::new(runtime.engine(), FIXTURE_LOG_FLOOD);
    let data_dir = tempfile::tempdir().unwrap();
    let alloc_logs = AllocLogs::under_data_dir(data_dir.path());
    let task_config = vec![
        ("lines".to_string(), lines.to_string()),
        ("long_line".to_string(), "1".to_string()),
    ];
    let raw_alloc = raw_types::Alloc {
        id: "bench".into(),
        job_id: "bench".into(),
        group: "bench".into(),
        tasks: vec![raw_types::Task {
            name: "main".into(),
            config: task_config.clone(),
        }],
        desired_status: raw_types::DesiredStatus::Run,
        modify_index: 1,
        meta: vec![],
    };
    let (mut no_op, mut caravan) = (Vec::new(), Vec::new());
    // Round 0 warms caches and the pool; it is not counted.
    for round in 0..=rounds {
        let raw = baseline.start_once(&raw_alloc).await;

        let mut flood = alloc(FIXTURE_LOG_FLOOD, round);
        flood.tasks[0].config = task_config.clone();
        let alloc_id = flood.id.clone();
        let complete = StatusSignal::new(ClientStatus::Complete);
        let mut config = config(flood, data_dir.path(), complete.clone());
        config.limits = Limits {
            log_lines_per_second: u32::MAX,
            log_bytes_per_second: u64::MAX / 4,
            ..Limits::default()
        };
        config.log_writer = Some(alloc_logs.writer(&alloc_id));
        let begun = Instant::now();
        let runner = factory.build(config).unwrap();
        runner.run();
        complete.reached.notified().await;
        // Until the agent log's writer has written them all: records in memory are not in
        // the log yet.
        caravan_host::telemetry::flush();
        let elapsed = begun.elapsed();
        runner.destroy();
        runner.destroyed().wait().await;
        if round > 0 {
            no_op.push(raw);
            caravan.push(elapsed);
        }
    }
    alloc_logs.settle_all().await;
    let per_second = |d: Duration| lines as f64 / d.as_secs_f64();
    let (no_op, caravan) = (per_second(median(no_op)), per_second(median(caravan)));
    let into_files = (lines * rounds) as u64;
    let dropped = alloc_logs.lines_dropped();
    println!("guest log records: {lines} per round, median of {rounds} rounds");
    println!("  no-op log import (bare wasmtime, baseline)   {no_op:>12.0} records/s");
    println!(
        "  caravan: agent JSON log + alloc log file     {caravan:>12.0} records/s  ({:.1}% of the no-op rate)",
        caravan / no_op * 100.0
    );
    common::scoreboard(
        "logs",
        &format!("{caravan:.0} records/s"),
        &format!("{no_op:.0} records/s"),
        &format!("{:.1}%", caravan / no_op * 100.0),
    );
    println!(
        "  alloc log files: {} of {into_files} records written, {dropped} dropped by a full queue",
        into_files - dropped.min(into_files)
    );
}
