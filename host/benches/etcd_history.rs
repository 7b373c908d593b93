//! etcd's database under churn, with the leader's compaction and without it: the soak that
//! shows etcd's history stays bounded.
//!
//! Run: `cargo bench -p caravan-host --bench etcd_history` (see `scripts/bench`). Options
//! after `--`: `--batches N` (default 400: about half a minute a side here, so that the run
//! spans many compactions), `--allocs M` (allocs per batch, default 300).
//!
//! Each side starts its own one-member etcd and one agent in cluster mode, then runs N batch
//! jobs of M allocs of `guests/batch` one after the other: register, wait until every alloc
//! completed, purge the job and collect its allocs (`PUT /v1/system/gc`), as a cluster that
//! runs short jobs all day does. After each batch it reads etcd's database size and the part
//! in use (etcd's own status). The baseline is the same churn with compaction off
//! (`compact_interval = "0s"`), in the same run: it grows with every alloc ever run; with
//! compaction (`compact_interval = "1s"`, the least allowed, so that a short run sees many compactions; the
//! default is 5m) the part in use stays flat.

#[path = "../tests/all/etcd.rs"]
#[allow(dead_code)]
mod etcd;

mod common;

use caravan_test_artifacts::BATCH;
use common::{Agent, count_arg, spawn_agent, wait_for};
use std::time::{Duration, Instant};

/// The compaction interval measured: short, so that a run of a minute or two compacts often.
const COMPACT_INTERVAL: &str = "1s";

fn main() {
    let batches = count_arg("--batches", 400);
    let allocs = count_arg("--allocs", 300);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let without = runtime.block_on(churn("0s", batches, allocs));
    let with = runtime.block_on(churn(COMPACT_INTERVAL, batches, allocs));
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    println!(
        "etcd_history: {} allocs in {batches} batches: in use at the end {:.2} MiB with \
         compaction every {COMPACT_INTERVAL} (at most {:.2} MiB after a batch of the second \
         half), {:.2} MiB without: {:.3}x; database file {:.2} MiB / {:.2} MiB; KiB kept per \
         alloc run: {:.2} with, {:.2} without",
        batches * allocs,
        mib(with.in_use_end),
        mib(with.in_use_peak_late),
        mib(without.in_use_end),
        with.in_use_end as f64 / without.in_use_end as f64,
        mib(with.size_end),
        mib(without.size_end),
        with.growth_per_alloc(batches * allocs) / 1024.0,
        without.growth_per_alloc(batches * allocs) / 1024.0,
    );
    common::scoreboard(
        "etcd_history",
        &format!(
            "{:.2} MiB in use after {} allocs, at most {:.2} MiB in the second half ({:.2} KiB kept per alloc)",
            mib(with.in_use_end),
            batches * allocs,
            mib(with.in_use_peak_late),
            with.growth_per_alloc(batches * allocs) / 1024.0
        ),
        &format!(
            "{:.2} MiB without compaction ({:.2} KiB per alloc)",
            mib(without.in_use_end),
            without.growth_per_alloc(batches * allocs) / 1024.0
        ),
        &format!(
            "{:.3}x at the end, {:.3}x at most",
            with.in_use_end as f64 / without.in_use_end as f64,
            with.in_use_peak_late as f64 / without.in_use_end as f64
        ),
    );
}

/// What one side measured.
struct Side {
    in_use_start: u64,
    /// The most in use after any batch of the second half of the run, when compaction has
    /// had its time to catch up: what a long-running cluster holds.
    in_use_peak_late: u64,
    in_use_end: u64,
    size_end: u64,
}

impl Side {
    fn growth_per_alloc(&self, allocs: usize) -> f64 {
        self.in_use_end.saturating_sub(self.in_use_start) as f64 / allocs as f64
    }
}

fn config(dir: &std::path::Path, compact_interval: &str, allocs: usize) -> std::path::PathBuf {
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "[client]\nmemory_total = \"65536GiB\"\nmax_live_allocs = {}\n[cluster]\nmode = \"etcd\"\nnode_name = \"node-1\"\n\
             compact_interval = \"{compact_interval}\"\n",
            allocs + 100
        ),
    )
    .unwrap();
    path
}

fn completed(agent: &Agent, job: &str) -> usize {
    agent
        .request("GET", &format!("/v1/job/{job}/allocations"), "")
        .matches("\"client_status\":\"complete\"")
        .count()
}

async fn churn(compact_interval: &str, batches: usize, allocs: usize) -> Side {
    let etcd = etcd::EtcdCluster::start_with(1, &[]).await;
    let store = etcd.store().await;
    let work = tempfile::tempdir().unwrap();
    let config = config(work.path(), compact_interval, allocs);
    let endpoints = etcd.endpoints().join(",");
    let agent = spawn_agent(
        &work.path().join("data"),
        &config,
        &["--etcd-endpoints", &endpoints],
    );
    wait_for("the node ready", || {
        agent.request("GET", "/v1/nodes", "").contains("\"ready\"")
    });
    let in_use_start = store.space().await.unwrap().db_size_in_use;
    let started = Instant::now();
    let mut in_use_peak_late = 0;
    for batch in 0..batches {
        let id = format!("batch-{batch}");
        let job = format!(
            r#"{{"job": {{"id": "{id}", "type": "batch", "count": {allocs}, "runner": {BATCH:?}}}}}"#
        );
        let answer = agent.request("POST", "/v1/jobs", &job);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        wait_for("every alloc complete", || completed(&agent, &id) == allocs);
        let answer = agent.request("DELETE", &format!("/v1/job/{id}?purge=true"), "");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let answer = agent.request("PUT", "/v1/system/gc", "");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        wait_for("the purged job gone", || {
            agent
                .request("GET", &format!("/v1/job/{id}"), "")
                .starts_with("HTTP/1.1 404")
        });
        let space = store.space().await.unwrap();
        if batch >= batches / 2 {
            in_use_peak_late = in_use_peak_late.max(space.db_size_in_use);
        }
        println!(
            "etcd_history: compact_interval {compact_interval}: batch {:>3}, {:>6} allocs run, \
             {:6.1} s: database {:>9} bytes, {:>9} in use",
            batch + 1,
            (batch + 1) * allocs,
            started.elapsed().as_secs_f64(),
            space.db_size,
            space.db_size_in_use
        );
    }
    // Two more intervals, so that the last compaction covers the last batch.
    if compact_interval != "0s" {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let space = store.space().await.unwrap();
    agent.stop();
    Side {
        in_use_start,
        in_use_peak_late,
        in_use_end: space.db_size_in_use,
        size_end: space.db_size,
    }
}
