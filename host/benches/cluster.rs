//! Cluster mode's placement throughput, the etcd writes it costs, and how long a dead node's
//! allocs take to run elsewhere.
//!
//! Run: `cargo bench -p caravan-host --bench cluster` (see `scripts/bench`). Options after
//! `--`: `--allocs N` (default 10000).
//!
//! - baseline: one `caravan agent` (embedded server): the time from submitting a service job
//!   of N allocs of `guests/minimal` until its metrics count N runner instantiations.
//! - cluster: three etcd members and three agents in cluster mode (default node TTL, 10 s),
//!   all on loopback: the same job submitted to one agent, until the three agents' metrics
//!   count N instantiations in all. The same job, the same runner, the same machine, in the
//!   same run.
//! - etcd writes: every key written or deleted under Caravan's prefix during the cluster
//!   run (read back from etcd's history), per placed alloc, and the transactions they took.
//! - node death: SIGKILL of an agent that does not lead, until the two others have started a
//!   replacement for each of its allocs.
//! - etcd over TLS: the cluster run again on members that serve TLS only and require a client
//!   certificate, with authentication on and the `caravan` user (docs/cluster.md, "Securing a
//!   cluster"), against the plain cluster's rate in the same run.

#[path = "../tests/all/etcd.rs"]
#[allow(dead_code)]
mod etcd;
#[path = "../tests/all/support/pki.rs"]
#[allow(dead_code)]
mod pki;

mod common;

use caravan_host::cluster::{Change, EtcdStore, PrefixWatch};
use caravan_test_artifacts::MINIMAL;
use common::{Agent, cpu_of, spawn_agent, wait_for};
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut allocs = 10_000u64;
    while let Some(arg) = args.next() {
        if arg == "--allocs" {
            allocs = args.next().and_then(|v| v.parse().ok()).unwrap_or(allocs);
        }
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let baseline = embedded(allocs);
    let plain = runtime.block_on(cluster(allocs, baseline));
    runtime.block_on(secured_cluster(allocs, plain));
}

/// Allocs per second placed and running on three agents reaching etcd over TLS, with client
/// certificates and etcd's authentication, printed against `plain`, the same run's cluster.
async fn secured_cluster(allocs: u64, plain: f64) {
    let pki = pki::Pki::new("bench");
    let member = pki.issue(caravan_host::cli::tls::Role::Server, "etcd-member");
    let agent_identity = pki.issue(caravan_host::cli::tls::Role::Server, "agent");
    let mut etcd = etcd::EtcdCluster::start_secured(
        &pki.ca,
        (&member.cert, &member.key),
        (&agent_identity.cert, &agent_identity.key),
    )
    .await;
    etcd.enable_auth("caravan", "bench-password").await;
    let work = tempfile::tempdir().unwrap();
    let password = work.path().join("etcd-password");
    std::fs::write(&password, "bench-password\n").unwrap();
    let config = config(
        work.path(),
        &format!(
            "[client]\nmemory_total = \"65536GiB\"\nmax_live_allocs = {}\n[cluster]\nmode = \"etcd\"\n{}",
            allocs / 2 + 200,
            pki.etcd_keys(&agent_identity, &password)
        ),
    );
    let agents = three_agents(&etcd, work.path(), &config);
    let first = agents[0].as_ref().unwrap();
    let started = submit(first, allocs);
    wait_for("every alloc running", || {
        total_instantiations(&agents) >= allocs
    });
    let rate = allocs as f64 / started.elapsed().as_secs_f64();
    println!(
        "cluster: 3 agents on etcd over TLS with client certificates and a user: {allocs} allocs \
         running in {:.2} s, {rate:.0} allocs/s; {:.2}x the plain cluster's rate in the same run",
        started.elapsed().as_secs_f64(),
        rate / plain
    );
    common::scoreboard(
        "cluster_tls",
        &format!("{rate:.0} allocs/s"),
        &format!("{plain:.0} allocs/s"),
        &format!("{:.2}x", rate / plain),
    );
    for agent in agents.into_iter().flatten() {
        agent.stop();
    }
}

fn job(allocs: u64) -> String {
    format!(
        r#"{{"job": {{"id": "many", "type": "service", "count": {allocs}, "runner": {MINIMAL:?}}}}}"#
    )
}

fn submit(agent: &Agent, allocs: u64) -> Instant {
    let started = Instant::now();
    let answer = agent.request("POST", "/v1/jobs", &job(allocs));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    started
}

fn config(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("agent.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Allocs per second placed and running on one agent with its embedded server.
fn embedded(allocs: u64) -> f64 {
    let work = tempfile::tempdir().unwrap();
    let config = config(
        work.path(),
        &format!(
            "[client]\nmemory_total = \"65536GiB\"\nmax_live_allocs = {}\n",
            allocs + 100
        ),
    );
    let agent = spawn_agent(&work.path().join("data"), &config, &[]);
    let cpu_before = cpu_of(&[agent.child.id()]);
    let started = submit(&agent, allocs);
    agent.wait_instantiations(allocs);
    let elapsed = started.elapsed();
    let cpu = cpu_of(&[agent.child.id()]).saturating_sub(cpu_before);
    agent.stop();
    let rate = allocs as f64 / elapsed.as_secs_f64();
    println!(
        "cluster: baseline, embedded server: {allocs} allocs running in {:.2} s, {rate:.0} allocs/s; \
         the agent spent {:.2} CPU s ({})",
        elapsed.as_secs_f64(),
        cpu.as_secs_f64(),
        share_of_cores(cpu, elapsed),
    );
    rate
}

/// `cpu` as a share of what this machine's cores could give over `wall`.
fn share_of_cores(cpu: Duration, wall: Duration) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{:.0}% of {cores} cores",
        100.0 * cpu.as_secs_f64() / (wall.as_secs_f64() * cores as f64)
    )
}

/// Three agents in cluster mode on `etcd`, `node-1` to `node-3`, each with its data under
/// `work` and `config`, once all three are ready: every node live before the job, so that
/// the job spreads.
fn three_agents(
    etcd: &etcd::EtcdCluster,
    work: &std::path::Path,
    config: &std::path::Path,
) -> Vec<Option<Agent>> {
    let endpoints = etcd.endpoints().join(",");
    let agents: Vec<Option<Agent>> = (1..=3)
        .map(|n| {
            let name = format!("node-{n}");
            Some(spawn_agent(
                &work.join(&name),
                config,
                &["--etcd-endpoints", &endpoints, "--node-name", &name],
            ))
        })
        .collect();
    let first = agents[0].as_ref().unwrap();
    wait_for("three nodes ready", || {
        first
            .request("GET", "/v1/nodes", "")
            .matches("\"ready\"")
            .count()
            == 3
    });
    agents
}

fn total_instantiations(agents: &[Option<Agent>]) -> u64 {
    agents.iter().flatten().map(Agent::instantiations).sum()
}

/// The cluster's run (and a node's death); returns its placement rate.
async fn cluster(allocs: u64, baseline: f64) -> f64 {
    let etcd = etcd::EtcdCluster::start().await;
    let work = tempfile::tempdir().unwrap();
    // Two nodes must hold every alloc once the third is killed.
    let per_node = allocs / 2 + 200;
    let config = config(
        work.path(),
        &format!(
            "[client]\nmemory_total = \"65536GiB\"\nmax_live_allocs = {per_node}\n[cluster]\nmode = \"etcd\"\n"
        ),
    );
    let mut agents = three_agents(&etcd, work.path(), &config);
    let first = agents[0].as_ref().unwrap();
    let store = etcd.store().await;
    let before = store.list("/caravan/v1/").await.unwrap().1;
    // All three run until the job has: `node-N` is `agents[N - 1]`.
    let agent_pids: Vec<u32> = agents.iter().flatten().map(|a| a.child.id()).collect();
    let etcd_pids = etcd.pids();
    let cpu_before: Vec<Duration> = agent_pids.iter().map(|&pid| cpu_of(&[pid])).collect();
    let etcd_cpu_before = cpu_of(&etcd_pids);
    let started = submit(first, allocs);
    wait_for("every alloc running", || {
        total_instantiations(&agents) >= allocs
    });
    let elapsed = started.elapsed();
    let agents_cpu: Vec<Duration> = agent_pids
        .iter()
        .zip(&cpu_before)
        .map(|(&pid, before)| cpu_of(&[pid]).saturating_sub(*before))
        .collect();
    let etcd_cpu = cpu_of(&etcd_pids).saturating_sub(etcd_cpu_before);
    let rate = allocs as f64 / elapsed.as_secs_f64();
    println!(
        "cluster: 3 agents on etcd: {allocs} allocs running in {:.2} s, {rate:.0} allocs/s; \
         {:.2}x the embedded server's rate in the same run",
        elapsed.as_secs_f64(),
        rate / baseline
    );
    let held: Vec<u64> = agents.iter().flatten().map(Agent::instantiations).collect();
    let all_cpu = agents_cpu.iter().sum::<Duration>() + etcd_cpu;
    println!(
        "cluster: CPU from the submit to all running: etcd's 3 members {:.2} s, the agents \
         {} (the leader: {}); in all {:.2} s, {}",
        etcd_cpu.as_secs_f64(),
        agents_cpu
            .iter()
            .zip(&held)
            .enumerate()
            .map(|(i, (cpu, held))| {
                format!("node-{} {:.2} s ({held} allocs)", i + 1, cpu.as_secs_f64())
            })
            .collect::<Vec<_>>()
            .join(", "),
        first.leader_node().unwrap_or_else(|| "unknown".into()),
        all_cpu.as_secs_f64(),
        share_of_cores(all_cpu, elapsed),
    );
    // Let the last client states land, then count what the run wrote.
    std::thread::sleep(Duration::from_secs(2));
    let after = store.list("/caravan/v1/").await.unwrap().1;
    let (writes, bytes) = count_writes(&store, before, after).await;
    println!(
        "cluster: etcd writes: {writes} keys in {} transactions, {:.2} keys per placed alloc, \
         {:.0} bytes a key put on average",
        after - before,
        writes as f64 / allocs as f64,
        bytes as f64 / writes.max(1) as f64
    );
    common::scoreboard(
        "cluster",
        &format!(
            "{rate:.0} allocs/s; {:.2} etcd keys per alloc",
            writes as f64 / allocs as f64
        ),
        &format!("{baseline:.0} allocs/s"),
        &format!("{:.2}x", rate / baseline),
    );

    // A node that does not lead dies.
    let leader = first.request("GET", "/v1/status/leader", "");
    let victim = (0..3)
        .find(|i| !leader.contains(&format!("\"node-{}\"", i + 1)))
        .unwrap();
    // Each agent's metrics count the runners it started: the victim's are the allocs it holds.
    let held = agents[victim].as_ref().unwrap().instantiations();
    let before_kill = total_instantiations(&agents) - held;
    let mut dead = agents[victim].take().unwrap();
    let killed = Instant::now();
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    wait_for("the dead node's allocs replaced", || {
        total_instantiations(&agents) >= before_kill + held
    });
    println!(
        "cluster: node-{} killed (SIGKILL) holding {held} allocs; all running elsewhere {:.2} s later (node TTL 10 s)",
        victim + 1,
        killed.elapsed().as_secs_f64()
    );
    common::scoreboard(
        "node_death",
        &format!("{:.1} s for {held} allocs", killed.elapsed().as_secs_f64()),
        "none",
        "-",
    );
    for agent in agents.into_iter().flatten() {
        agent.stop();
    }
    rate
}

/// The keys written (put or deleted) under Caravan's prefix in revisions `from` (exclusive)
/// to `to`, and the bytes of the keys and values put, from etcd's history.
async fn count_writes(store: &EtcdStore, from: i64, to: i64) -> (u64, u64) {
    let mut watch = PrefixWatch::from_revision(store, "/caravan/v1/", from + 1);
    let (mut writes, mut bytes) = (0u64, 0u64);
    while watch.next_revision() <= to {
        for change in watch.next().await.expect("etcd's history since the job") {
            let (revision, size) = match change {
                Change::Put(kv) => (kv.mod_revision, kv.key.len() + kv.value.len()),
                Change::Delete { mod_revision, .. } => (mod_revision, 0),
                Change::Relisted { .. } => panic!("history compacted during the bench"),
            };
            if revision <= to {
                writes += 1;
                bytes += size as u64;
            }
        }
    }
    (writes, bytes)
}
