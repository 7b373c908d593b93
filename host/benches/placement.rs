//! Placement with capacity and constraints, and a drain that moves guests' state.
//!
//! Run: `cargo bench -p caravan-host --bench placement` (see `scripts/bench`).
//!
//! - placement: 10,000 allocs of one job over 1,000 nodes that say what they hold (64 GiB,
//!   1,000 slots, half of class `edge`, ten racks), placed by the scheduler's pure functions:
//!   without constraints, and with `${node.class} = edge` and `${meta.rack} regexp ^r[0-4]$`;
//!   the baseline is the placement before capacity (least loaded by alloc count, a heap:
//!   `server/placement.rs` as of 805b7ed, kept below), over the same nodes in the same run.
//!   Then the same job registered on an embedded server with the 1,000 nodes registered,
//!   end to end (placement, alloc records, the in-memory save).
//! - drain: two agents in cluster mode on three loopback etcd members; 1,000 allocs of the
//!   stateful runner (100 jobs of 10) on node-1, then `POST /v1/node/node-1/drain` until
//!   the drain is complete and node-2 runs every one, each started from the checkpoint of
//!   the alloc it replaces (counted in node-2's log). Its baseline: the first placement of
//!   the same 1,000 allocs on node-1, submit to all running, in the same run.

#[path = "../tests/all/etcd.rs"]
#[allow(dead_code)]
mod etcd;

mod common;

use caravan_host::model::jobspec::JobSpec;
use caravan_host::model::node::{NodeInfo, NodeResources};
use caravan_host::rpc::ServerApi;
use caravan_host::server::placement::{Ask, Nodes, Placer};
use caravan_host::server::{EmbeddedServer, ServerConfig};
use caravan_test_artifacts::STATEFUL;
use common::{median, spawn_agent, wait_for};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::{Duration, Instant};

const NODES: usize = 1_000;
const ALLOCS: usize = 10_000;
const ROUNDS: usize = 7;

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    placement(&runtime);
    runtime.block_on(drain());
}

fn nodes() -> Nodes {
    (0..NODES)
        .map(|i| {
            let info = NodeInfo {
                class: if i % 2 == 0 { "edge" } else { "core" }.into(),
                meta: BTreeMap::from([("rack".to_string(), format!("r{}", i % 10))]),
                resources: NodeResources {
                    memory_bytes: Some(64 << 30),
                    default_alloc_memory_bytes: Some(64 << 20),
                    alloc_slots: Some(1_000),
                },
                ..NodeInfo::default()
            };
            (format!("node-{i:04}"), info)
        })
        .collect()
}

fn job(constrained: bool) -> JobSpec {
    let mut text =
        format!("[job]\nid = \"web\"\ntype = \"service\"\ncount = {ALLOCS}\nrunner = \"r.wasm\"\n");
    if constrained {
        text.push_str(
            "[[job.constraint]]\nattribute = \"${node.class}\"\nvalue = \"edge\"\n\
             [[job.constraint]]\nattribute = \"${meta.rack}\"\noperator = \"regexp\"\nvalue = \"^r[0-4]$\"\n",
        );
    }
    caravan_host::model::jobspec::parse_toml(&text).unwrap()
}

/// The placement before capacity: every node takes any alloc, the least loaded by count
/// first, ties by name.
fn least_loaded(nodes: &Nodes, count: usize) -> Vec<Option<String>> {
    let mut heap: BinaryHeap<Reverse<(usize, &String)>> =
        nodes.keys().map(|name| Reverse((0, name))).collect();
    (0..count)
        .map(|_| {
            let Reverse((n, name)) = heap.pop()?;
            heap.push(Reverse((n + 1, name)));
            Some(name.clone())
        })
        .collect()
}

fn time(mut run: impl FnMut() -> usize) -> Duration {
    let samples = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            let placed = run();
            let elapsed = started.elapsed();
            assert_eq!(placed, ALLOCS, "every alloc placed");
            elapsed
        })
        .collect();
    median(samples)
}

fn rate(elapsed: Duration) -> f64 {
    ALLOCS as f64 / elapsed.as_secs_f64()
}

fn placement(runtime: &tokio::runtime::Runtime) {
    let nodes = nodes();
    let placed = |p: Vec<Option<String>>| p.iter().flatten().count();
    let baseline = time(|| placed(least_loaded(&nodes, ALLOCS)));
    let (plain, constrained) = (job(false), job(true));
    let today = time(|| placed(Placer::new(&nodes, []).place(Ask::new(&plain, ALLOCS))));
    let with_constraints =
        time(|| placed(Placer::new(&nodes, []).place(Ask::new(&constrained, ALLOCS))));
    let end_to_end = time(|| {
        let server = EmbeddedServer::new(ServerConfig::default());
        runtime.block_on(async {
            for (name, info) in &nodes {
                server.register_node(name, info).await.unwrap();
            }
        });
        server.register_job(job(false)).unwrap().placed.len()
    });
    println!(
        "placement: {ALLOCS} allocs over {NODES} nodes, median of {ROUNDS}: least loaded by \
         count (before) {:.1} ms, {:.0}/s; capacity and binpack {:.1} ms, {:.0}/s; with two \
         constraints {:.1} ms, {:.0}/s; registered on an embedded server, end to end \
         (1,000 nodes registered each round) {:.1} ms, {:.0}/s",
        baseline.as_secs_f64() * 1e3,
        rate(baseline),
        today.as_secs_f64() * 1e3,
        rate(today),
        with_constraints.as_secs_f64() * 1e3,
        rate(with_constraints),
        end_to_end.as_secs_f64() * 1e3,
        rate(end_to_end),
    );
    common::scoreboard(
        "placement",
        &format!(
            "{:.0} allocs/s; {:.0} with 2 constraints",
            rate(today),
            rate(with_constraints)
        ),
        &format!("{:.0} allocs/s (least loaded by count)", rate(baseline)),
        &format!(
            "{:.2}x; {:.2}x",
            rate(today) / rate(baseline),
            rate(with_constraints) / rate(baseline)
        ),
    );
}

const DRAIN_JOBS: usize = 100;
const DRAIN_ALLOCS_PER_JOB: usize = 10;

fn stateful_job(n: usize) -> String {
    format!(
        r#"{{"job": {{"id": "counter-{n}", "type": "service", "count": {DRAIN_ALLOCS_PER_JOB}, "runner": {STATEFUL:?}, "tasks": [{{"name": "counter", "config": {{"tick_every": "1000"}}}}]}}}}"#
    )
}

async fn drain() {
    let total = (DRAIN_JOBS * DRAIN_ALLOCS_PER_JOB) as u64;
    let etcd = etcd::EtcdCluster::start().await;
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[client]\nmemory_total = \"65536GiB\"\nmax_live_allocs = {}\n[cluster]\nmode = \"etcd\"\n",
            total + 200
        ),
    )
    .unwrap();
    let endpoints = etcd.endpoints().join(",");
    let agent = |name: &str| {
        spawn_agent(
            &work.path().join(name),
            &config,
            &["--etcd-endpoints", &endpoints, "--node-name", name],
        )
    };
    let first = agent("node-1");
    wait_for("node-1 ready", || {
        first.request("GET", "/v1/nodes", "").contains("\"ready\"")
    });
    let submitted = Instant::now();
    for n in 0..DRAIN_JOBS {
        let answer = first.request("POST", "/v1/jobs", &stateful_job(n));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    wait_for("every alloc running on node-1", || {
        first.instantiations() >= total
    });
    let placed_in = submitted.elapsed();
    let second = agent("node-2");
    wait_for("node-2 ready", || {
        first
            .request("GET", "/v1/nodes", "")
            .matches("\"ready\"")
            .count()
            == 2
    });
    let started = Instant::now();
    let answer = first.request("POST", "/v1/node/node-1/drain", r#"{"enable": true}"#);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    wait_for("the drain complete, every alloc running on node-2", || {
        let nodes = first.request("GET", "/v1/nodes", "");
        let done = !nodes.contains("\"started_unix_ms\"");
        done && second.instantiations() >= total
    });
    let drained_in = started.elapsed();
    // The log is read on a thread of its own: give it a moment to catch up.
    let with = "starting from the checkpoint of the allocation this one replaces";
    let without = "starting without the checkpoint of the allocation this one replaces";
    let read_by = Instant::now() + Duration::from_secs(10);
    while second.count_logged(with) + second.count_logged(without) < total
        && Instant::now() < read_by
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    for line in second.kept_lines_with(without).iter().take(3) {
        println!(
            "placement: node-2 started one afresh: {}",
            line["fields"]["why"]
        );
    }
    let (resumed, afresh) = (second.count_logged(with), second.count_logged(without));
    println!(
        "placement: drain of node-1 with {total} stateful allocs ({DRAIN_JOBS} jobs of \
         {DRAIN_ALLOCS_PER_JOB}): all running on node-2 in {:.2} s; node-2 logged {resumed} \
         started from their checkpoint, {afresh} afresh; their first placement on node-1 \
         took {:.2} s",
        drained_in.as_secs_f64(),
        placed_in.as_secs_f64()
    );
    common::scoreboard(
        "drain",
        &format!("{:.1} s for {total} allocs", drained_in.as_secs_f64()),
        &format!("{:.1} s (their first placement)", placed_in.as_secs_f64()),
        &format!("{:.2}x", drained_in.as_secs_f64() / placed_in.as_secs_f64()),
    );
    first.stop();
    second.stop();
}
