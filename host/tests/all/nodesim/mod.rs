//! `caravan nodesim` against a real agent, both real binaries: simulated nodes register, run
//! a job's allocs in the sim runner, complete a batch job's, lose them to the server's GC,
//! and keep theirs over a simulated restart. Also the node routes' answers to bad requests;
//! `secured` has nodes on an agent and an etcd that require credentials, `command_line` the
//! command's flags, examples and output.

use crate::support::*;
use caravan_test_artifacts::SIM;
use serde_json::Value;
use std::sync::mpsc::Receiver;

mod command_line;
mod secured;

/// An agent named `agent` in cluster mode on the etcd at `endpoints`, its data in
/// `data_dir`, with `etcd_keys` (how it reaches a secured etcd) in its `[cluster]` block.
fn agent_on_etcd(endpoints: &str, data_dir: &std::path::Path, etcd_keys: &str) -> AgentProcess {
    AgentProcess::start_configured(
        &[
            "--cluster",
            "etcd",
            "--etcd-endpoints",
            endpoints,
            "--node-name",
            "agent",
            "--data-dir",
            data_dir.to_str().unwrap(),
        ],
        &format!("max_live_allocs = 64\n[cluster]\nnode_ttl = \"4s\"\n{etcd_keys}"),
    )
}

const NODES: usize = 50;

/// A running `caravan nodesim`, killed when dropped; what it printed is shown on failure.
struct Nodesim {
    child: std::process::Child,
    stdout: Receiver<String>,
    seen: Vec<String>,
}

impl Nodesim {
    fn start(agent: &AgentProcess, args: &[&str]) -> Nodesim {
        let mut child = crate::etcd::dies_with_its_parent(&mut crate::support::caravan_command())
            .args([
                "nodesim",
                "--server",
                &agent.addr,
                "--summary-every",
                "100ms",
                // What the tests need (1,000 at most at once) and some room: these tests are about
                // placement, restarts and collection, not the pool's edge, where an alloc that
                // finds it full fails. The default would warn about this machine's map count.
                "--max-live-allocs",
                "1100",
            ])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("caravan nodesim starts");
        let stdout = lines_of(child.stdout.take().unwrap());
        Nodesim {
            child,
            stdout,
            seen: Vec::new(),
        }
    }

    /// Reads stdout until a line satisfies `found`, and returns it; fails after a minute
    /// (a summary line comes every 100ms, so a wait per line would never end).
    fn wait_for(&mut self, what: &str, found: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.stdout.recv_timeout(left).unwrap_or_else(|_| {
                let last: Vec<&String> = self.seen.iter().rev().take(5).collect();
                panic!("no {what} line within a minute; the last ones: {last:#?}")
            });
            self.seen.push(line.clone());
            if found(&line) {
                return line;
            }
        }
    }

    /// Stops it with Ctrl-C; returns its exit code and everything printed after the last
    /// line read.
    fn interrupt(mut self) -> (Option<i32>, Vec<String>) {
        interrupt(&self.child);
        let status = self.child.wait().unwrap();
        (status.code(), self.stdout.try_iter().collect())
    }
}

impl Drop for Nodesim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let last = self.seen.len().saturating_sub(40);
            eprintln!(
                "--- nodesim printed, last lines\n{}",
                self.seen[last..].join("\n")
            );
        }
    }
}

/// Sends `child` Ctrl-C's signal.
fn interrupt(child: &std::process::Child) {
    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
}

async fn register(agent: &AgentProcess, job: Value) {
    let body = serde_json::json!({ "job": job }).to_string();
    let (status, answer) = http(agent.socket_addr(), "POST", "/v1/jobs", Some(&body), None).await;
    assert_eq!(status, 200, "{answer}");
}

/// The agent's allocs of `job`, by client status (`pending` for none reported yet).
async fn statuses(agent: &AgentProcess, job: &str) -> Vec<String> {
    let path = format!("/v1/job/{job}/allocations");
    let (_, allocs) = http(agent.socket_addr(), "GET", &path, None, None).await;
    let allocs = allocs.as_array().cloned().unwrap_or_default();
    allocs
        .iter()
        .map(|a| a["client_status"].as_str().unwrap_or("pending").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_nodes_run_collect_and_restore_a_jobs_allocs() {
    // An agent that only schedules: every alloc goes to a simulated node.
    let agent = AgentProcess::start_configured(&["--dev"], "enabled = false\n");
    let mut sim = Nodesim::start(
        &agent,
        &["--nodes", &NODES.to_string(), "--restart-every", "300ms"],
    );
    sim.wait_for("every node registered", |l| {
        l.contains(&format!("nodes {NODES}/{NODES} registered"))
    });
    let (_, nodes) = http(agent.socket_addr(), "GET", "/v1/nodes", None, None).await;
    assert_eq!(nodes.as_array().map(Vec::len), Some(NODES), "{nodes}");

    // 500 service allocs, 10 per node, each a sim runner that runs until stopped.
    register(
        &agent,
        serde_json::json!({"id": "web", "type": "service", "count": 500, "runner": SIM}),
    )
    .await;
    sim.wait_for("500 allocs running", |l| {
        l.contains("allocs 500 (running 500)")
    });
    let restarted = sim.wait_for("a node restarted with its allocs", |l| {
        l.starts_with("restarted ") && l.ends_with("restored 10 allocs")
    });
    // The nodes' reports reach the server a sync batch later.
    eventually_async("the server to see 500 running", || async {
        let web = statuses(&agent, "web").await;
        web.iter().filter(|s| *s == "running").count() == 500
    })
    .await;
    let web = statuses(&agent, "web").await;
    assert_eq!(web.len(), 500, "nothing was replaced over {restarted:?}");

    // A batch job's allocs complete, then the server's GC removes them from every node.
    let tasks = serde_json::json!([{ "name": "main", "config": { "run_for": "200ms" } }]);
    register(
        &agent,
        serde_json::json!({"id": "once", "type": "batch", "count": 500, "runner": SIM, "tasks": tasks}),
    )
    .await;
    sim.wait_for("the batch allocs complete", |l| {
        l.contains("allocs 1000 (complete 500, running 500)")
    });
    // The server collects what it has seen complete: wait for the nodes' last reports.
    eventually_async("the server to see 500 complete", || async {
        let once = statuses(&agent, "once").await;
        once.iter().filter(|s| *s == "complete").count() == 500
    })
    .await;
    let (status, _) = http(agent.socket_addr(), "PUT", "/v1/system/gc", None, None).await;
    assert_eq!(status, 200);
    sim.wait_for("the batch allocs gone from every node", |l| {
        l.contains("allocs 500 (running 500)")
    });
    assert!(statuses(&agent, "once").await.is_empty());

    let (code, report) = sim.interrupt();
    assert_eq!(code, Some(0), "{report:?}");
    let report = report.join("\n");
    assert!(report.contains("nodesim report"), "{report}");
    // Every node's watch was answered with its allocs, so the server's histogram has them.
    assert!(report.contains("watch lag     p50 under "), "{report}");
    assert!(
        report.contains(&format!("{NODES} ({NODES} registered")),
        "{report}"
    );
    agent.stop();
}

/// More nodes in one process than tokio's blocking pool has threads (512), each needing the
/// runner it lacks: every node's build waited on a blocking thread for the one fetch, whose
/// file write needed a thread of that same pool, and no alloc ever started. And nodes that
/// say nothing of their size share the job evenly (binpack piled it onto a few), and share
/// their connections to the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_nodes_than_blocking_threads_fetch_the_runner_and_share_the_job_evenly() {
    // Two allocs each, within the 1,100 live allocs the helper's nodesim allows.
    const MANY: usize = 520;
    let agent = AgentProcess::start_configured(&["--dev"], "enabled = false\n");
    let mut sim = Nodesim::start(&agent, &["--nodes", &MANY.to_string()]);
    sim.wait_for("every node registered", |l| {
        l.contains(&format!("nodes {MANY}/{MANY} registered"))
    });
    register(
        &agent,
        serde_json::json!({"id": "wide", "type": "service", "count": 2 * MANY, "runner": SIM}),
    )
    .await;
    sim.wait_for("every alloc running", |l| {
        l.contains(&format!("allocs {0} (running {0})", 2 * MANY))
    });
    let (_, nodes) = http(agent.socket_addr(), "GET", "/v1/nodes", None, None).await;
    let per_node: Vec<u64> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["allocs"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        per_node.iter().all(|&n| n == 2),
        "two per node: {per_node:?}"
    );
    // Its nodes share HTTP/2 connections, 64 nodes to one (9 here), where each node's
    // waiting watch held a connection of its own: a descriptor per node on both sides.
    for (process, pid) in [("nodesim", sim.child.id()), ("the agent", agent.pid())] {
        let sockets = sockets_held(pid);
        assert!(
            sockets <= 9 + 10,
            "{process} holds {sockets} sockets for {MANY} nodes, which share a connection per 64"
        );
    }
    drop(sim);
    agent.stop();
}

/// How many sockets process `pid` has open.
fn sockets_held(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_of_a_killed_nodesim_go_down_and_their_allocs_move_to_live_ones() {
    // Long enough for a node to compile the sim runner between two watches on a busy
    // machine; the survivor loads it from the cache the doomed nodes filled.
    let config = "enabled = false\n[server]\nnode_ttl = \"5s\"\n";
    let agent = AgentProcess::start_configured(&["--dev"], config);
    let cache = tempfile::tempdir().unwrap();
    let cache = cache.path().to_str().unwrap();
    let mut doomed = Nodesim::start(
        &agent,
        &[
            "--nodes",
            "2",
            "--name-prefix",
            "doomed",
            "--cache-dir",
            cache,
        ],
    );
    doomed.wait_for("the doomed nodes registered", |l| {
        l.contains("nodes 2/2 registered")
    });
    register(
        &agent,
        serde_json::json!({"id": "web", "type": "service", "count": 4, "runner": SIM}),
    )
    .await;
    doomed.wait_for("4 allocs running", |l| l.contains("allocs 4 (running 4)"));
    let mut survivor = Nodesim::start(
        &agent,
        &[
            "--nodes",
            "1",
            "--name-prefix",
            "survivor",
            "--cache-dir",
            cache,
        ],
    );
    survivor.wait_for("the survivor registered", |l| {
        l.contains("nodes 1/1 registered")
    });

    // SIGKILL: no goodbye, only silence; one node_ttl later the server gives up on them.
    drop(doomed);
    survivor.wait_for("the replacements running", |l| {
        l.contains("allocs 4 (running 4)")
    });
    let web = statuses(&agent, "web").await;
    assert!(web.iter().filter(|s| *s == "lost").count() >= 4, "{web:?}");
    let (_, nodes) = http(agent.socket_addr(), "GET", "/v1/nodes", None, None).await;
    let ready: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["status"] == "ready")
        .map(|n| n["id"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(ready, ["survivor-00001"], "{nodes}");
    drop(survivor);
    agent.stop();
}

#[tokio::test]
async fn the_node_routes_refuse_bad_requests_with_the_field_at_fault() {
    let agent = AgentProcess::start();
    let addr = agent.socket_addr();
    let cases = [
        (
            "PUT",
            "/v1/node/local/register",
            None,
            409,
            "this agent's own node",
        ),
        (
            "PUT",
            "/v1/node/bad%20name/register",
            None,
            400,
            "node name",
        ),
        ("GET", "/v1/node/n1/allocations?index=x", None, 400, "index"),
        ("GET", "/v1/node/n1/allocations?wait=5", None, 400, "wait"),
        (
            "POST",
            "/v1/node/n1/allocations/fetch",
            Some("{\"ids\": 3}"),
            400,
            "request body",
        ),
    ];
    for (method, path, body, expected, named) in cases {
        let (status, answer) = http(addr, method, path, body, None).await;
        assert_eq!(status, expected, "{method} {path}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains(named), "{method} {path}: {error}");
    }
    let too_many: Vec<String> = (0..513).map(|n| n.to_string()).collect();
    let body = serde_json::json!({ "ids": too_many }).to_string();
    let (status, answer) = http(
        addr,
        "POST",
        "/v1/node/n1/allocations/fetch",
        Some(&body),
        None,
    )
    .await;
    assert_eq!(
        (status, answer["field"].as_str()),
        (400, Some("ids")),
        "{answer}"
    );
    agent.stop();
}

#[tokio::test]
async fn a_node_fetches_and_reports_only_its_own_allocs() {
    let agent = AgentProcess::start_configured(&["--dev"], "enabled = false\n");
    let addr = agent.socket_addr();
    for node in ["a", "b"] {
        let path = format!("/v1/node/{node}/register");
        assert_eq!(http(addr, "PUT", &path, None, None).await.0, 200);
    }
    register(
        &agent,
        serde_json::json!({"id": "web", "type": "service", "count": 2, "runner": SIM}),
    )
    .await;
    let (_, allocs) = http(addr, "GET", "/v1/job/web/allocations", None, None).await;
    let on_a = allocs
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["node_id"] == "a")
        .expect("one alloc on a")["id"]
        .as_str()
        .unwrap()
        .to_string();

    let fetch = serde_json::json!({ "ids": [on_a] }).to_string();
    let (_, from_b) = http(
        addr,
        "POST",
        "/v1/node/b/allocations/fetch",
        Some(&fetch),
        None,
    )
    .await;
    assert_eq!(from_b, serde_json::json!([]), "b is not given a's alloc");
    let (_, from_a) = http(
        addr,
        "POST",
        "/v1/node/a/allocations/fetch",
        Some(&fetch),
        None,
    )
    .await;
    assert_eq!(from_a[0]["id"], on_a.as_str());

    let failed = serde_json::json!({ "updates": [{ "alloc_id": on_a, "state": {
        "client_status": "failed", "description": "b says so", "task_states": [] } }] })
    .to_string();
    let (_, answer) = http(
        addr,
        "POST",
        "/v1/node/b/allocations/update",
        Some(&failed),
        None,
    )
    .await;
    assert_eq!(answer, serde_json::json!({ "accepted": [] }));
    let (_, alloc) = http(addr, "GET", &format!("/v1/allocation/{on_a}"), None, None).await;
    assert_ne!(alloc["client_status"], "failed", "{alloc}");
    agent.stop();
}

#[tokio::test]
async fn with_a_token_every_node_route_needs_it_the_watch_too() {
    let agent = AgentProcess::start_configured(&["--dev", "--acl-token", "s3cret"], "");
    let addr = agent.socket_addr();
    let watch = "/v1/node/n1/allocations?index=0&wait=0s";
    for (method, path) in [("PUT", "/v1/node/n1/register"), ("GET", watch)] {
        let (status, answer) = http(addr, method, path, None, None).await;
        assert_eq!(status, 401, "{method} {path}: {answer}");
    }
    let (_, nodes) = http(addr, "GET", "/v1/nodes", None, None).await;
    assert!(
        !nodes.to_string().contains("n1"),
        "a refused watch registers nothing: {nodes}"
    );
    // With the token the watch is let through; a node the server does not know is told to
    // register first, and then watches.
    let (status, answer) = http(addr, "GET", watch, None, Some("s3cret")).await;
    assert_eq!(status, 503, "{answer}");
    assert!(answer.to_string().contains("register it again"), "{answer}");
    let (status, answer) = http(addr, "PUT", "/v1/node/n1/register", None, Some("s3cret")).await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = http(addr, "GET", watch, None, Some("s3cret")).await;
    assert_eq!(status, 200, "{answer}");
    agent.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_nodes_join_an_etcd_cluster_run_its_allocs_and_are_replaced_when_gone() {
    let etcd = crate::etcd::EtcdCluster::start().await;
    let endpoints = etcd.endpoints().join(",");
    let data_dir = tempfile::tempdir().unwrap();
    let agent = agent_on_etcd(&endpoints, data_dir.path(), "");
    eventually_async("the agent to lead", || async {
        let (_, leader) = http(agent.socket_addr(), "GET", "/v1/status/leader", None, None).await;
        leader["this_agent_leads"] == true
    })
    .await;
    let mut sim = Nodesim::start(
        &agent,
        &[
            "--nodes",
            "3",
            "--cluster",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--node-ttl",
            "4s",
        ],
    );
    sim.wait_for("the nodes registered", |l| {
        l.contains("nodes 3/3 registered")
    });
    // Eight allocs over four live nodes: the agent's own and the three simulated ones.
    let sim_nodes_live = || async {
        let (_, nodes) = http(agent.socket_addr(), "GET", "/v1/nodes", None, None).await;
        let nodes = nodes.as_array().cloned().unwrap_or_default();
        nodes.iter().filter(|n| n["status"] == "ready").count() == 4
    };
    eventually_async("the simulated nodes live in the cluster", sim_nodes_live).await;
    register(
        &agent,
        serde_json::json!({"id": "web", "type": "service", "count": 8, "runner": SIM}),
    )
    .await;
    sim.wait_for("their allocs running", |l| {
        l.contains("allocs 6 (running 6)")
    });

    // Gone without a word: their leases expire, and the leader runs their allocs elsewhere.
    drop(sim);
    eventually_async("the lost allocs replaced on the agent's node", || async {
        let path = "/v1/job/web/allocations";
        let (_, allocs) = http(agent.socket_addr(), "GET", path, None, None).await;
        let allocs = allocs.as_array().cloned().unwrap_or_default();
        let running_on_agent = allocs
            .iter()
            .filter(|a| a["node_id"] == "agent" && a["client_status"] == "running")
            .count();
        running_on_agent == 8
    })
    .await;
    agent.stop();
}
