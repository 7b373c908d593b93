//! State saving: how long a restart takes with 10,000 saved allocs, and how many state
//! reports per second the client persists under churn.
//!
//! Run: `cargo bench -p caravan-host --bench state` (see `scripts/bench`). Options after
//! `--`: `--allocs N` (default 10000), `--rounds N` (default 5), `--churn-seconds N`
//! (default 3).
//!
//! - restore: the real `caravan` binary. One agent starts N allocs of `guests/minimal` and is
//!   stopped (Ctrl-C); then, per round, the time from spawning `caravan agent` on that data
//!   dir until its metrics count N runner instantiations, i.e. every runner running again.
//!   Baseline, interleaved: the same binary on an empty data dir, spawn until its API answers.
//! - churn: the client's persister on the durable store, with one report per alloc in flight
//!   at a time from 1,000 allocs (latest wins, written behind in batches), counting states on
//!   disk per second. Baseline, same store: one commit per report, as a naive client would.

use caravan_host::client::metrics::Metrics;
use caravan_host::client::persist::Persister;
use caravan_host::model::structs::{AllocState, ClientStatus};
use caravan_host::state::{RedbStateDb, StateDb, Write};
use caravan_test_artifacts::MINIMAL;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;

use common::{median, spawn_agent};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut allocs, mut rounds, mut churn_seconds) = (10_000u32, 5usize, 3u64);
    while let Some(arg) = args.next() {
        let mut value = || args.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match arg.as_str() {
            "--allocs" => allocs = value() as u32,
            "--rounds" => rounds = value() as usize,
            "--churn-seconds" => churn_seconds = value(),
            _ => {} // cargo passes `--bench`
        }
    }
    restore(allocs, rounds);
    churn(Duration::from_secs(churn_seconds));
}

fn restore(allocs: u32, rounds: usize) {
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[client]\nmemory_total = \"65536GiB\"\nmax_live_allocs = {}\n",
            allocs + 100
        ),
    )
    .unwrap();
    let (saved, empty) = (work.path().join("saved"), work.path().join("empty"));

    let agent = spawn_agent(&saved, &config, &[]);
    let job = format!(
        r#"{{"job": {{"id": "many", "type": "service", "count": {allocs}, "runner": {MINIMAL:?}}}}}"#
    );
    let answer = agent.request("POST", "/v1/jobs", &job);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let started = Instant::now();
    agent.wait_instantiations(u64::from(allocs));
    println!(
        "restore: {allocs} allocs of minimal started in {:.2} s; stopping the agent",
        started.elapsed().as_secs_f64()
    );
    agent.stop();
    let state_bytes = std::fs::metadata(saved.join("state.db")).unwrap().len();

    let (mut restores, mut baselines) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let _ = std::fs::remove_dir_all(&empty);
        let started = Instant::now();
        let agent = spawn_agent(&empty, &config, &[]);
        agent.instantiations();
        baselines.push(started.elapsed());
        agent.stop();

        let started = Instant::now();
        let agent = spawn_agent(&saved, &config, &[]);
        agent.wait_instantiations(u64::from(allocs));
        restores.push(started.elapsed());
        agent.stop();
        println!(
            "restore: round {round}: empty start {:.0} ms, restore of {allocs} {:.0} ms",
            baselines[round].as_secs_f64() * 1e3,
            restores[round].as_secs_f64() * 1e3
        );
    }
    let (restore, baseline) = (median(restores), median(baselines));
    println!(
        "restore: median {:.3} s for {allocs} allocs (target < 2 s); empty start {:.3} s; ratio {:.1}; state.db {:.1} MiB",
        restore.as_secs_f64(),
        baseline.as_secs_f64(),
        restore.as_secs_f64() / baseline.as_secs_f64(),
        state_bytes as f64 / (1024.0 * 1024.0)
    );
    common::scoreboard(
        "restore",
        &format!("{:.2} s for {allocs} allocs", restore.as_secs_f64()),
        &format!("empty start {:.0} ms", baseline.as_secs_f64() * 1e3),
        &format!("{:.0}x", restore.as_secs_f64() / baseline.as_secs_f64()),
    );
}

fn churn(window: Duration) {
    const ALLOCS: usize = 1_000;
    let state = |n: u64| AllocState {
        client_status: ClientStatus::Running,
        description: format!("report {n}"),
        task_states: vec![],
    };

    // Baseline: one commit per report.
    let dir = tempfile::tempdir().unwrap();
    let db = RedbStateDb::open(dir.path()).unwrap();
    let started = Instant::now();
    let mut naive = 0u64;
    while started.elapsed() < window {
        db.apply(vec![Write::PutAllocState {
            alloc_id: format!("alloc-{}", naive as usize % ALLOCS),
            state: state(naive).into(),
        }])
        .unwrap();
        naive += 1;
    }
    let naive_rate = naive as f64 / started.elapsed().as_secs_f64();
    drop(db);

    // The persister: reports from every alloc, written behind in batches.
    let dir = tempfile::tempdir().unwrap();
    let db: Arc<dyn StateDb> = Arc::new(RedbStateDb::open(dir.path()).unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let saved = Arc::new(AtomicU64::new(0));
    let rate = runtime.block_on(async {
        let persister = Arc::new(Persister::new(db, Arc::new(Metrics::default())));
        for n in 0..ALLOCS {
            persister.restored(&format!("alloc-{n}"), None, false);
        }
        let counter = saved.clone();
        tokio::spawn(persister.clone().run(Box::new(move |_, _| {
            counter.fetch_add(1, Ordering::Relaxed);
        })));
        let started = Instant::now();
        let mut report = 0u64;
        while started.elapsed() < window {
            // Every alloc reports, then waits for the commit, as runners that report
            // faster than the disk end up doing.
            for n in 0..ALLOCS {
                persister.save_state(&format!("alloc-{n}"), &state(report));
                report += 1;
            }
            persister.flush().await.unwrap();
        }
        saved.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
    });
    println!(
        "churn: {rate:.0} state reports persisted per second across {ALLOCS} allocs; one commit per report: {naive_rate:.0}/s; ratio {:.0}",
        rate / naive_rate
    );
    common::scoreboard(
        "state_writes",
        &format!("{rate:.0}/s"),
        &format!("{naive_rate:.0}/s"),
        &format!("{:.0}x", rate / naive_rate),
    );
}
