//! A new leader taking over a large cluster: how long from the moment an agent wins the
//! leader key until it schedules (it reads every job, alloc, state and node at one revision,
//! opens the embedded server on them and completes what its predecessor left undone).
//!
//! Run: `cargo bench -p caravan-host --bench takeover` (see `scripts/bench`). Options after
//! `--`: `--allocs N` (default 100,000), `--nodes M` (simulated nodes, default 200).
//!
//! Three etcd members; two agents in cluster mode (node TTL 2 s, etcd's floor); M simulated
//! nodes (`caravan nodesim --cluster etcd --runner native`) hold most of the allocs. One
//! service job of N allocs runs; then the leading agent is killed (SIGKILL). The other wins
//! the key once the dead one's lease expires; measured from then (the survivor's
//! `/v1/status/leader` names itself) until it answers `/v1/jobs` (its server is in place),
//! polled every 10 ms, and as the survivor logs it (`took_ms`, with its reading and its
//! opening of the server apart); and from the `kill -9` itself. The baseline of the same run
//! is the same takeover of an empty cluster (the two agents alone, before the job). It also
//! prints the survivor's memory before, at its peak and once it schedules, beside what the
//! leader it replaced held before its kill (it placed and held the same allocs, and ran
//! as many of its own as a node): what leading that cluster costs, against what taking it
//! over does.

#[path = "../tests/all/etcd.rs"]
#[allow(dead_code)]
mod etcd;

mod common;

use caravan_test_artifacts::MINIMAL;
use common::{Agent, count_arg, spawn_agent, wait_for};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CARAVAN: &str = env!("CARGO_BIN_EXE_caravan");

fn main() {
    let allocs = count_arg("--allocs", 100_000);
    let nodes = count_arg("--nodes", 200);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let etcd = runtime.block_on(etcd::EtcdCluster::start());
    let endpoints = etcd.endpoints().join(",");
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("agent.toml");
    std::fs::write(
        &config,
        "[client]\nmemory_total = \"65536GiB\"\nmax_live_allocs = 4096\n[cluster]\nmode = \"etcd\"\nnode_ttl = \"2s\"\n",
    )
    .unwrap();
    let start_agent = |n: usize| {
        let name = format!("node-{n}");
        spawn_agent(
            &work.path().join(&name),
            &config,
            &["--etcd-endpoints", &endpoints, "--node-name", &name],
        )
    };

    // The baseline: an empty cluster's takeover.
    let mut agents = vec![start_agent(1), start_agent(2)];
    wait_for("a leader", || agents[0].leader_node().is_some());
    let (empty, _) = kill_leader_and_time(&mut agents, &start_agent);

    // The cluster at scale: simulated nodes, then the job.
    let mut sim = Command::new(CARAVAN)
        .args([
            "nodesim",
            "--cluster",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
        ])
        .args(["--nodes", &nodes.to_string(), "--runner", "native"])
        .args(["--node-ttl", "10s", "--summary-every", "1h"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("caravan nodesim starts");
    wait_for("every simulated node ready", || {
        agents[0]
            .request("GET", "/v1/nodes", "")
            .matches("\"ready\"")
            .count()
            >= nodes + 2
    });
    let job = format!(
        r#"{{"job": {{"id": "many", "type": "service", "count": {allocs}, "runner": {MINIMAL:?}}}}}"#
    );
    let placed_at = Instant::now();
    let answer = agents[0].request("POST", "/v1/jobs", &job);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    wait_for("every alloc running", || running(&agents[0]) >= allocs);
    println!(
        "takeover: {allocs} allocs running on {nodes} simulated nodes and 2 agents in {:.1} s",
        placed_at.elapsed().as_secs_f64()
    );
    let (full, logged) = kill_leader_and_time(&mut agents, &start_agent);
    println!(
        "takeover: a new leader schedules {allocs} allocs {full:.2?} after it won the key \
         (it logs {logged} ms); an empty cluster's: {empty:.2?}; {:.1}x",
        full.as_secs_f64() / empty.as_secs_f64()
    );
    common::scoreboard(
        "takeover",
        &format!("{full:.2?} for {allocs} allocs (logged {logged} ms)"),
        &format!("{empty:.2?} for an empty cluster"),
        &format!("{:.1}x", full.as_secs_f64() / empty.as_secs_f64()),
    );
    let _ = sim.kill();
    let _ = sim.wait();
    for agent in agents {
        agent.stop();
    }
}

/// Allocs running, as the job's view counts them.
fn running(agent: &Agent) -> usize {
    let answer = agent.request("GET", "/v1/job/many", "");
    let Some(body) = answer.split("\r\n\r\n").nth(1) else {
        return 0;
    };
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["allocs"]["running"].as_u64())
        .unwrap_or(0) as usize
}

/// Kills the leading agent, times the survivor's takeover (from naming itself leader to
/// answering `/v1/jobs`), restarts the dead one, and returns the time and what the survivor
/// logged.
fn kill_leader_and_time(
    agents: &mut [Agent],
    start_agent: &impl Fn(usize) -> Agent,
) -> (Duration, u64) {
    let leader = agents[0].leader_node().expect("a leader");
    let dead = if leader == "node-1" { 0 } else { 1 };
    let survivor = 1 - dead;
    let survivor_pid = agents[survivor].child.id();
    let mib = |field| common::status_bytes(survivor_pid, field) as f64 / (1024.0 * 1024.0);
    let rss_before = mib("VmRSS");
    // The dead leader placed every alloc and held them all, as the survivor will once it
    // schedules; both also run as many allocs of their own, as nodes.
    let leader_rss =
        common::status_bytes(agents[dead].child.id(), "VmRSS") as f64 / (1024.0 * 1024.0);
    let killed = Instant::now();
    agents[dead].child.kill().unwrap();
    agents[dead].child.wait().unwrap();
    let me = format!("node-{}", survivor + 1);
    let deadline = Instant::now() + Duration::from_secs(120);
    while agents[survivor].leader_node().as_deref() != Some(me.as_str()) {
        assert!(Instant::now() < deadline, "no takeover within 120 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let won = Instant::now();
    while !agents[survivor]
        .request("GET", "/v1/jobs", "")
        .starts_with("HTTP/1.1 200")
    {
        assert!(Instant::now() < deadline, "no takeover within 120 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = won.elapsed();
    println!(
        "takeover: from kill -9 of the leader until the survivor schedules: {:.2} s \
         (its lease's end, then the takeover)",
        killed.elapsed().as_secs_f64()
    );
    println!(
        "takeover: the survivor's memory: {rss_before:.0} MiB before, {:.0} MiB at its peak so \
         far, {:.0} MiB once it schedules; the leader it replaced held {leader_rss:.0} MiB \
         before its kill",
        mib("VmHWM"),
        mib("VmRSS"),
    );
    let logged = agents[survivor].last_logged("this agent now schedules the cluster", "took_ms");
    let read = agents[survivor].last_logged("this agent now schedules the cluster", "read_ms");
    let open = agents[survivor].last_logged("this agent now schedules the cluster", "open_ms");
    let list = agents[survivor].last_logged("read the cluster's keys", "list_ms");
    let keys = agents[survivor].last_logged("read the cluster's keys", "keys");
    let bytes = agents[survivor].last_logged("read the cluster's keys", "bytes");
    println!("takeover: listing {keys} keys ({bytes} bytes of values) took {list} ms");
    println!(
        "takeover: logged {logged} ms: reading the cluster {read} ms, opening the server {open} ms, \
         the rest (nodes registered, deploys completed) {} ms",
        logged.saturating_sub(read + open)
    );
    agents[dead] = start_agent(dead + 1);
    (took, logged)
}
