//! Cluster mode end to end: real `caravan agent` processes in cluster mode on a real
//! three-member etcd, all on loopback, started, killed, paused and restarted by the tests.
//! A failing test prints what every agent logged. This module holds the harness; the tests
//! are in its submodules.

mod acl;
mod bad_input;
mod etcd_failure;
mod etcd_security;
mod failover;
mod leadership;
mod runner_builds;
mod tls;

use crate::etcd::EtcdCluster;
use crate::support::{AgentProcess, eventually_async, http};
pub use crate::support::{live_by_node, running, unique_ids};
use caravan_test_artifacts::SLEEPER;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Three agents, `node-1` to `node-3`, in cluster mode on `etcd`, with their data under `dir`,
/// each serving HTTPS with a server certificate of `pki` and requiring one of every caller,
/// with `config` (top-level keys, then blocks) before their `[tls]` and `[cluster]`.
pub fn secured_agents(
    pki: &crate::support::pki::Pki,
    etcd: &EtcdCluster,
    dir: &std::path::Path,
    config: &str,
) -> Vec<AgentProcess> {
    let endpoints = etcd.endpoints().join(",");
    (1..=3)
        .map(|n| {
            let name = format!("node-{n}");
            let certificate = pki.issue(caravan_host::cli::tls::Role::Server, &name);
            let data_dir = dir.join(&name);
            let args = [
                "--cluster",
                "etcd",
                "--etcd-endpoints",
                &endpoints,
                "--node-name",
                &name,
                "--data-dir",
                data_dir.to_str().unwrap(),
            ];
            let tls = pki.agent_config(&certificate, true);
            let text = format!("{config}{tls}[cluster]\nnode_ttl = \"{NODE_TTL}\"\n");
            AgentProcess::start_configured(&args, &text)
        })
        .collect()
}

/// Nodes' lease TTL in these tests: short, so deaths are seen fast, but twice etcd's floor,
/// so that a node starved of CPU by the tests around it does not miss its renewals.
const NODE_TTL: &str = "4s";

/// One agent of the cluster: its process (when running), its name and its data dir, which
/// outlives the process so that a restart restores from it.
struct Node {
    name: String,
    data_dir: PathBuf,
    process: Option<AgentProcess>,
    /// Every line logged by the earlier runs of this node, for the failure report.
    earlier_logs: Vec<String>,
    /// Its lease TTL, as `[cluster] node_ttl` takes it.
    ttl: &'static str,
}

impl Node {
    fn addr(&self) -> std::net::SocketAddr {
        self.process.as_ref().expect("the node runs").socket_addr()
    }

    fn start(&mut self, etcd: &EtcdCluster) {
        // Continues the harness's [client] block: a small sandbox pool per agent.
        let config = format!(
            "max_live_allocs = 64\n[cluster]\nnode_ttl = \"{}\"\n",
            self.ttl
        );
        let endpoints = etcd.endpoints().join(",");
        let data_dir = self.data_dir.to_str().unwrap().to_string();
        self.process = Some(AgentProcess::start_configured(
            &[
                "--cluster",
                "etcd",
                "--etcd-endpoints",
                &endpoints,
                "--node-name",
                &self.name,
                "--data-dir",
                &data_dir,
            ],
            &config,
        ));
    }

    fn kill9(&mut self) {
        if let Some(process) = self.process.take() {
            self.earlier_logs.extend(process.kill9());
        }
    }
}

/// Three etcd members and three agents, `node-1` to `node-3`.
struct Cluster {
    etcd: EtcdCluster,
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::on(EtcdCluster::start().await).await
    }

    /// Three agents on `etcd`, as it is.
    async fn on(etcd: EtcdCluster) -> Cluster {
        Cluster::with_ttl(etcd, NODE_TTL).await
    }

    /// Three agents on `etcd` whose leases last `ttl`.
    async fn with_ttl(etcd: EtcdCluster, ttl: &'static str) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut nodes: Vec<Node> = (1..=3)
            .map(|n| Node {
                name: format!("node-{n}"),
                data_dir: dir.path().join(format!("node-{n}")),
                process: None,
                earlier_logs: Vec::new(),
                ttl,
            })
            .collect();
        for node in &mut nodes {
            node.start(&etcd);
        }
        let cluster = Cluster {
            etcd,
            nodes,
            _dir: dir,
        };
        cluster
            .until("three nodes ready", |c| async move {
                c.ready_nodes().await.len() == 3
            })
            .await;
        cluster
    }

    /// `GET path` on node `i`.
    async fn get(&self, i: usize, path: &str) -> (u16, Value) {
        http(self.nodes[i].addr(), "GET", path, None, None).await
    }

    /// The node names the cluster places on, as node `i` answers.
    async fn ready_nodes_via(&self, i: usize) -> BTreeSet<String> {
        crate::support::ready_nodes(self.nodes[i].addr()).await
    }

    async fn ready_nodes(&self) -> BTreeSet<String> {
        self.ready_nodes_via(0).await
    }

    /// The index of the node whose agent leads, as node `via` sees it.
    async fn leader_via(&self, via: usize) -> Option<usize> {
        let (_, answer) = self.get(via, "/v1/status/leader").await;
        let name = answer["leader"]["node"].as_str()?;
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Job `id`'s allocs, as node `i` answers (empty while it cannot).
    async fn allocs(&self, i: usize, job: &str) -> Vec<Value> {
        let (status, allocs) = self.get(i, &format!("/v1/job/{job}/allocations")).await;
        if status != 200 {
            return Vec::new();
        }
        allocs.as_array().cloned().unwrap_or_default()
    }

    /// Waits (for at most two minutes) until `condition` holds of the cluster.
    async fn until<'a, F, Fut>(&'a self, what: &str, condition: F)
    where
        F: Fn(&'a Cluster) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        eventually_async(what, || condition(self)).await;
    }

    /// Submits a service job of `count` sleepers through node `via`.
    async fn run_job(&self, via: usize, id: &str, count: u32) -> (u16, Value) {
        let body = serde_json::json!({ "job": {
            "id": id, "type": "service", "count": count, "runner": SLEEPER,
        }})
        .to_string();
        http(
            self.nodes[via].addr(),
            "POST",
            "/v1/jobs",
            Some(&body),
            None,
        )
        .await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for node in &self.nodes {
            let mut lines = node.earlier_logs.clone();
            if let Some(process) = &node.process {
                lines.extend(process.unread_lines());
            }
            let tail = lines.len().saturating_sub(80);
            eprintln!(
                "--- {} logged (last {} lines):",
                node.name,
                lines.len() - tail
            );
            for line in &lines[tail..] {
                eprintln!("{line}");
            }
        }
    }
}
