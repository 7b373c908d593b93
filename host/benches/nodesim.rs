//! `caravan nodesim` at scale: many simulated nodes in one process against one agent's
//! server, 10 allocs each, with the sandboxed sim runner and, as the baseline measured in the
//! same run, the native runner (the client core without a sandbox).
//!
//! Run: `cargo bench -p caravan-host --bench nodesim` (see `scripts/bench`). Options after
//! `--`: `--nodes N,N,...` (default `100,1000,5000`), `--allocs-per-node N` (default 10),
//! `--runs N` (default 3: each figure is from the run with the median time to all running;
//! the sim runner is compiled once, in the first wasm run, and loaded from the cache after).
//!
//! For each size and runner: a fresh `caravan agent --dev` that runs no client of its own
//! (`client.enabled = false`) and a `caravan nodesim` process, both the real binaries on
//! loopback. It measures
//! - registration: from nodesim's start until the agent lists every node;
//! - time to all running: from submitting one service job of nodes x allocs-per-node allocs
//!   of `guests/sim` until the agent's job view counts them all running (the server has
//!   every node's report), hence the placement rate;
//! - the server's update rate over that time (`caravan_server_alloc_updates_total`);
//! - nodesim's RSS per node (after registering) and per alloc (the growth once all run);
//! - alloc start as the nodes saw it (nodesim's p50 and p99, from an alloc reaching its node
//!   to its node reporting it running).
//!
//! A wasm size whose nodes would need more open files than this process may have (a
//! connection per 64 nodes; the sim runner imports no `wasi:filesystem`, so its allocs hold
//! no alloc dir open) is skipped with the reason. One that may need more memory maps
//! than `vm.max_map_count` allows (about 7 per live alloc; `scripts/bench` raises it when run
//! as root) says so and runs; should it fail, the failure names the maps held and the limit.
//! A failed run kills the agent and nodesim it spawned.
//!
//! With `--cluster etcd` (issue 45, target 2) each size runs the wasm nodes twice: against
//! the embedded server as above (the baseline, same run), and joined to a three-member etcd
//! on loopback (`nodesim --cluster etcd`: a lease and a live key per node, one watch of its
//! allocs per node, its status writes) with one agent in cluster mode as the scheduler (its
//! own node too small to hold an alloc). It adds, for the etcd run, what etcd spent: its
//! three members' CPU time from the nodes' start to all running (from `/proc`), what they
//! were asked over that span (gRPC calls and stream messages by method, raft proposals, from
//! their `/metrics`), their RSS at the end, and the database's size.
//!
//! Every run also prints the open files nodesim and the agent hold once all run, and when
//! the job's submit was answered: the server had placed and saved every alloc (on etcd,
//! the leader's fenced transactions, one after another).

mod common;
#[path = "../tests/all/etcd.rs"]
#[allow(dead_code)]
mod etcd;

use caravan_test_artifacts::SIM;
use common::{Agent, cpu_of, spawn_agent, status_bytes};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CARAVAN: &str = env!("CARGO_BIN_EXE_caravan");

fn main() {
    let mut sizes = vec![100usize, 1_000, 5_000];
    let mut per_node = 10usize;
    let mut runs = 3usize;
    let mut on_etcd = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--nodes" => {
                if let Some(list) = args.next() {
                    sizes = list.split(',').filter_map(|n| n.parse().ok()).collect();
                }
            }
            "--allocs-per-node" => {
                per_node = args.next().and_then(|n| n.parse().ok()).unwrap_or(per_node);
            }
            "--cluster" => on_etcd = args.next().as_deref() == Some("etcd"),
            "--runs" => {
                runs = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(runs)
                    .max(1);
            }
            _ => {}
        }
    }
    let open_files = open_files_limit();
    let map_count = max_map_count();
    // Shared by every run: the first wasm run compiles the sim runner, the others load it.
    let cache = tempfile::tempdir().unwrap();
    println!(
        "nodesim scale: {per_node} sim allocs per node, median of {runs} runs, open-files limit {open_files}, vm.max_map_count {map_count}"
    );
    println!(
        "{:>6} {:>7} {:>8} {:>10} {:>12} {:>11} {:>10} {:>10} {:>9} {:>9}",
        "nodes",
        "runner",
        "allocs",
        "register",
        "all running",
        "allocs/s",
        "updates/s",
        "RSS/node",
        "RSS/alloc",
        "start p50/p99"
    );
    let modes: [(&str, Target); 2] = if on_etcd {
        [("wasm", Target::Embedded), ("wasm", Target::Etcd)]
    } else {
        [("native", Target::Embedded), ("wasm", Target::Embedded)]
    };
    for &nodes in &sizes {
        let mut rates = Vec::new();
        for (runner, target) in modes {
            let allocs = nodes * per_node;
            // Nodes share HTTP/2 connections to the agent. A sim alloc holds no descriptor:
            // its runner imports no `wasi:filesystem` and a quiet one opens no log file.
            let connections =
                nodes.div_ceil(caravan_host::cli::nodesim::NODES_PER_AGENT_CONNECTION);
            let needed = (connections * 2 + 1_000) as u64;
            if runner == "wasm" && needed > open_files {
                println!(
                    "{nodes:>6} {runner:>7} {allocs:>8} skipped: needs about {needed} open files, the limit is {open_files}"
                );
                continue;
            }
            // An estimate (the sim runner may need fewer maps than the host counts on), so
            // the size runs anyway; a run that stalls on the limit names it.
            let maps_needed = allocs as u64 * MAPS_PER_LIVE_ALLOC;
            if runner == "wasm" && maps_needed > map_count {
                println!(
                    "{nodes:>6} {runner:>7} {allocs:>8} may not fit: about {maps_needed} memory maps against vm.max_map_count {map_count}; run scripts/bench as root, or `sysctl -w vm.max_map_count={}`",
                    maps_needed.next_power_of_two()
                );
            }
            let mut measured: Vec<Run> = (0..runs)
                .map(|_| measure(nodes, allocs, runner, target, cache.path()))
                .collect();
            measured.sort_by_key(|run| run.all_running);
            let run = measured.swap_remove(measured.len() / 2);
            let runner = if target == Target::Etcd {
                "etcd"
            } else {
                runner
            };
            println!(
                "{nodes:>6} {runner:>7} {allocs:>8} {:>9.2}s {:>11.2}s {:>11.0} {:>10.0} {:>8.1}K {:>8.1}K {:>5}/{}ms",
                run.register.as_secs_f64(),
                run.all_running.as_secs_f64(),
                run.placement_rate(),
                run.updates as f64 / run.all_running.as_secs_f64(),
                run.rss_registered as f64 / nodes as f64 / 1024.0,
                run.rss_running.saturating_sub(run.rss_registered) as f64 / allocs as f64 / 1024.0,
                run.start_p50,
                run.start_p99,
            );
            println!(
                "{nodes:>6} {runner:>7} open files once all run: nodesim {}, the agent {}",
                run.descriptors.0, run.descriptors.1
            );
            println!(
                "{nodes:>6} {runner:>7} the job's submit was answered (its allocs saved) after {:.2}s of the {:.2}s",
                run.saved.as_secs_f64(),
                run.all_running.as_secs_f64(),
            );
            if let Some(spent) = &run.etcd {
                let database =
                    spent
                        .db_size
                        .map_or("unknown (no answer)".into(), |(size, in_use)| {
                            format!(
                                "{:.1} MiB ({:.1} MiB in use)",
                                size as f64 / MIB,
                                in_use as f64 / MIB
                            )
                        });
                println!(
                    "{nodes:>6} etcd spent: {:.1} CPU s in the {:.1} s from the nodes' start to all running ({:.0}% of one core), {:.0} MiB RSS in its 3 members, database {database}",
                    spent.cpu.as_secs_f64(),
                    spent.over.as_secs_f64(),
                    100.0 * spent.cpu.as_secs_f64() / spent.over.as_secs_f64(),
                    spent.rss as f64 / MIB,
                );
                let mut calls: Vec<(&String, &f64)> = spent.calls.iter().collect();
                calls.sort_by(|a, b| b.1.total_cmp(a.1));
                println!(
                    "{nodes:>6} etcd was asked (summed over its members): {}",
                    calls
                        .iter()
                        .take(12)
                        .map(|(call, count)| format!("{call} {count:.0}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            rates.push((runner, run.placement_rate()));
        }
        if on_etcd {
            if let [(_, embedded), (_, joined)] = rates[..] {
                println!(
                    "{nodes:>6} on etcd / embedded placement rate: {:.2}x",
                    joined / embedded
                );
                common::scoreboard(
                    "nodesim_etcd",
                    &format!("{nodes} nodes on etcd: {joined:.0} allocs/s"),
                    &format!("embedded server: {embedded:.0} allocs/s"),
                    &format!("{:.2}x", joined / embedded),
                );
            }
        } else if let [(_, native), (_, wasm)] = rates[..] {
            println!(
                "{nodes:>6} wasm/native placement rate: {:.2}x",
                wasm / native
            );
            // The scoreboard's rows are of these sizes.
            let row = match nodes {
                5_000 => "nodesim",
                10_000 => "nodesim_10000",
                _ => continue,
            };
            common::scoreboard(
                row,
                &format!("{nodes} nodes: {wasm:.0} allocs/s"),
                &format!("native: {native:.0} allocs/s"),
                &format!("{:.2}x", wasm / native),
            );
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// What the nodes talk to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// One agent's embedded server, over HTTP.
    Embedded,
    /// A three-member etcd, with one agent in cluster mode as the scheduler.
    Etcd,
}

/// What etcd spent over an etcd run: from the nodes' start (their registration included)
/// until all allocs ran.
struct EtcdSpent {
    cpu: Duration,
    over: Duration,
    /// What etcd's members handled over that span, by gRPC method (and the raft proposals
    /// they applied), summed over the members.
    calls: std::collections::BTreeMap<String, f64>,
    rss: u64,
    /// The database's size and what of it is in use; none when etcd did not answer.
    db_size: Option<(u64, u64)>,
}

struct Run {
    register: Duration,
    /// From the job's submit until its answer: the server placed and saved every alloc.
    saved: Duration,
    all_running: Duration,
    allocs: usize,
    updates: u64,
    rss_registered: u64,
    rss_running: u64,
    /// Open files of nodesim and of the agent, once all run.
    descriptors: (usize, usize),
    start_p50: String,
    start_p99: String,
    etcd: Option<EtcdSpent>,
}

impl Run {
    fn placement_rate(&self) -> f64 {
        self.allocs as f64 / self.all_running.as_secs_f64()
    }
}

fn measure(
    nodes: usize,
    allocs: usize,
    runner: &str,
    target: Target,
    cache: &std::path::Path,
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let etcd_cluster = (target == Target::Etcd).then(|| tokio.block_on(etcd::EtcdCluster::start()));
    let (agent, reach) = match &etcd_cluster {
        None => {
            // Nodes busy starting thousands of allocs must not be taken for dead meanwhile.
            std::fs::write(
                &config,
                "[client]\nenabled = false\n[server]\nnode_ttl = \"5m\"\n",
            )
            .unwrap();
            let agent = spawn_agent(dir.path(), &config, &["--dev"]);
            let reach = vec!["--server".to_string(), format!("http://{}", agent.addr)];
            (agent, reach)
        }
        Some(etcd) => {
            // In a cluster every agent is a node too: this one's holds too little memory for
            // any alloc, so all go to the simulated nodes. The nodes keep nodesim's default
            // TTL (10 s, longer past 500 nodes: 100 s at 5,000): a node whose lease lapses
            // under the load is replaced, and it shows.
            std::fs::write(
                &config,
                "[client]\nmemory_total = \"1MiB\"\n[cluster]\nmode = \"etcd\"\n",
            )
            .unwrap();
            let endpoints = etcd.endpoints().join(",");
            let agent = spawn_agent(
                &dir.path().join("data"),
                &config,
                &["--etcd-endpoints", &endpoints, "--node-name", "scheduler"],
            );
            let reach = ["--cluster", "etcd", "--etcd-endpoints", &endpoints].map(String::from);
            (agent, reach.to_vec())
        }
    };
    let etcd_pids = etcd_cluster
        .as_ref()
        .map(etcd::EtcdCluster::pids)
        .unwrap_or_default();
    let cpu_before = cpu_of(&etcd_pids);
    let calls_before = etcd_calls(etcd_cluster.as_ref());
    let started = Instant::now();
    let mut sim = Nodesim::start(&reach, nodes, runner, allocs, cache);
    sim.wait_for(&format!("nodes {nodes}/{nodes} registered"));
    // On etcd the scheduling agent's own node is listed too.
    while node_count(&agent) < nodes + usize::from(target == Target::Etcd) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let register = started.elapsed();
    let rss_registered = status_bytes(sim.child.id(), "VmRSS");

    let job = format!(
        r#"{{"job": {{"id": "scale", "type": "service", "count": {allocs}, "runner": {SIM:?}}}}}"#
    );
    let submitted = Instant::now();
    let answer = agent.request("POST", "/v1/jobs", &job);
    let saved = submitted.elapsed();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "{answer}\nthe agent's last warnings:\n{}",
        agent.last_warnings(20)
    );
    loop {
        let now_running = running(&agent);
        if now_running >= allocs {
            break;
        }
        // When the kernel refuses a map, the allocator aborts nodesim ("memory allocation
        // of N bytes failed"): say so now rather than after the timeout.
        if let Ok(Some(exit)) = sim.child.try_wait() {
            panic!(
                "{nodes} nodes, {runner}: nodesim exited ({exit}) with {now_running} of {allocs} allocs running; vm.max_map_count is {}",
                max_map_count()
            );
        }
        assert!(
            submitted.elapsed() < Duration::from_secs(300),
            "{nodes} nodes, {runner} on {target:?}: only {now_running} of {allocs} allocs running after 5 minutes; nodesim holds {} memory maps of vm.max_map_count {}; the agent's last warnings:\n{}",
            maps_of(sim.child.id()),
            max_map_count(),
            agent.last_warnings(20),
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let all_running = submitted.elapsed();
    let etcd = etcd_cluster.as_ref().map(|cluster| {
        let cpu = cpu_of(&etcd_pids).saturating_sub(cpu_before);
        let over = started.elapsed();
        // A probe tried once: right after a large run etcd may still be busy.
        let space = tokio.block_on(async { cluster.store().await.space().await });
        EtcdSpent {
            cpu,
            over,
            calls: etcd_calls(Some(cluster))
                .into_iter()
                .map(|(call, count)| {
                    (
                        call.clone(),
                        count - calls_before.get(&call).unwrap_or(&0.0),
                    )
                })
                .filter(|(_, count)| *count > 0.0)
                .collect(),
            rss: etcd_pids
                .iter()
                .map(|&pid| status_bytes(pid, "VmRSS"))
                .sum(),
            db_size: space
                .ok()
                .map(|space| (space.db_size, space.db_size_in_use)),
        }
    });
    let updates = agent.metric("caravan_server_alloc_updates_total");
    // The last summary line has every start measured.
    sim.wait_for(&format!("allocs {allocs} (running {allocs})"));
    let line = sim.wait_for("start p50");
    let rss_running = status_bytes(sim.child.id(), "VmRSS");
    let descriptors = (
        descriptors_of(sim.child.id()),
        descriptors_of(agent.child.id()),
    );
    let latency = |label: &str| {
        line.split(label)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or("-")
            .trim_end_matches("ms")
            .to_string()
    };
    let run = Run {
        register,
        saved,
        all_running,
        allocs,
        updates,
        rss_registered,
        rss_running,
        descriptors,
        start_p50: latency("start p50 "),
        start_p99: latency(" p99 "),
        etcd,
    };
    sim.stop();
    agent.stop();
    run
}

/// Memory maps one live wasm alloc needs, as the host's engine counts them when it warns
/// at start (`MAPS_PER_LIVE_ALLOC` in `runtime/engine.rs`).
const MAPS_PER_LIVE_ALLOC: u64 = 7;

/// A `caravan nodesim` process and its stdout. Dropping it kills the process, so a failed
/// run leaves no nodesim behind.
struct Nodesim {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Nodesim {
    /// `reach`: how the nodes reach their server (`--server URL`, or `--cluster etcd ...`).
    fn start(
        reach: &[String],
        nodes: usize,
        runner: &str,
        allocs: usize,
        cache: &std::path::Path,
    ) -> Nodesim {
        let mut child = Command::new(CARAVAN)
            .arg("nodesim")
            .args(reach)
            .args(["--nodes", &nodes.to_string(), "--runner", runner])
            .args(["--summary-every", "100ms", "--log-level", "error"])
            .args(["--max-live-allocs", &(allocs + 100).to_string()])
            .arg("--cache-dir")
            .arg(cache)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("caravan nodesim starts");
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (lines_tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        Nodesim { child, lines }
    }

    fn wait_for(&mut self, text: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(600))
                .unwrap_or_else(|_| panic!("nodesim never printed {text:?}"));
            if line.contains(text) {
                return line;
            }
        }
    }

    fn stop(self) {
        drop(self);
    }
}

impl Drop for Nodesim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn body(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

fn node_count(agent: &Agent) -> usize {
    let answer = agent.request("GET", "/v1/nodes", "");
    serde_json::from_str::<serde_json::Value>(body(&answer))
        .ok()
        .and_then(|nodes| nodes.as_array().map(Vec::len))
        .unwrap_or(0)
}

fn running(agent: &Agent) -> usize {
    let answer = agent.request("GET", "/v1/job/scale", "");
    serde_json::from_str::<serde_json::Value>(body(&answer))
        .ok()
        .and_then(|job| job["allocs"]["running"].as_u64())
        .unwrap_or(0) as usize
}

/// The members' counters that say what they were asked, summed over the members of
/// `cluster`: gRPC calls handled and stream messages received, by method, and raft proposals
/// applied, from each member's `/metrics`. Empty without a cluster.
fn etcd_calls(cluster: Option<&etcd::EtcdCluster>) -> std::collections::BTreeMap<String, f64> {
    let mut counts = std::collections::BTreeMap::new();
    let Some(cluster) = cluster else {
        return counts;
    };
    for member in 0..cluster.endpoints().len() {
        for line in cluster.metrics(member).lines() {
            let name = if line.starts_with("grpc_server_handled_total") {
                "handled"
            } else if line.starts_with("grpc_server_msg_received_total") {
                "messages"
            } else if line.starts_with("etcd_server_proposals_applied_total") {
                "proposals applied"
            } else {
                continue;
            };
            let method = line
                .split("grpc_method=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("");
            let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            *counts
                .entry(format!("{name} {method}").trim().to_string())
                .or_insert(0.0) += value;
        }
    }
    counts
}

fn descriptors_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| fds.count())
}

/// How many memory maps the process `pid` holds.
fn maps_of(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).map_or(0, |maps| maps.lines().count())
}

/// The kernel's limit on memory maps per process, which live wasm allocs count against.
fn max_map_count() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(u64::MAX)
}

/// The hard limit on open files, which nodesim raises its own soft limit to.
fn open_files_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .and_then(|line| line.split_whitespace().nth(4))
        .and_then(|hard| hard.parse().ok())
        .unwrap_or(u64::MAX)
}
