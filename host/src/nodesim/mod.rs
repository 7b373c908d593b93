//! `caravan nodesim`: many simulated client nodes in one process, each a real client core
//! (its own node name, alloc map, watch, sync, GC and state store) registered with a real
//! server, as nomad-nodesim runs many Nomad clients behind a minimal AllocRunner. Each
//! node's runners are WebAssembly components, as an agent's are (the sim runner in
//! `guests/sim` is the one meant for this), or the native [`EmptyAllocRunner`], to tell the
//! sandbox's cost from the client's.
//!
//! It may use the client, the runtime and the state store; it knows no server's internals
//! (it is given a [`ServerApi`]) and prints nothing: the CLI shows its [`Summary`].
//!
//! State: with a data dir, each node keeps a redb file and its alloc dirs under
//! `<data dir>/<node>`, so a nodesim run on the same dir resumes its nodes as agents resume;
//! without one (`--ephemeral`), state is in memory and alloc dirs go under a temporary
//! directory removed at the end. Either way a simulated restart ([`NodeSim::restart_next`])
//! stops a node's client as an agent stop does and starts a new one on the same store.

mod observe;

pub use observe::{Observed, SimStats};

use crate::allocrunner::{AllocRunner, AllocRunnerFactory, EmptyAllocRunner};
use crate::client::gc::GcConfig;
use crate::client::{Client, ClientConfig};
use crate::rpc::ServerApi;
use crate::runtime::{Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use crate::state::{MemoryStateDb, RedbStateDb, StateDb};
use crate::util::locks::LockUnpoisoned;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What runs each simulated node's allocs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SimRunner {
    /// The component each alloc's job names, sandboxed as on an agent.
    Wasm,
    /// [`EmptyAllocRunner`]: running until stopped, no sandbox.
    Native,
}

/// How a simulation is set up.
#[derive(Debug, Clone)]
pub struct NodeSimConfig {
    /// How many nodes.
    pub nodes: usize,
    /// Node names are `<prefix>-<number>`, numbered from 1 with five digits.
    pub name_prefix: String,
    /// What runs the allocs.
    pub runner: SimRunner,
    /// Where each node keeps its state and alloc dirs; `None` for memory only.
    pub data_dir: Option<PathBuf>,
    /// Sizes the shared sandbox pool (wasm runners only).
    pub max_live_allocs: u32,
    /// Where compiled components are kept; `None` for `<data dir>/cache` (a temporary
    /// directory when ephemeral, so every run compiles afresh).
    pub cache_dir: Option<PathBuf>,
    /// Every node's garbage collector.
    pub gc: GcConfig,
    /// What every node says of itself when it registers (its capacity and class).
    pub node_info: crate::model::node::NodeInfo,
    /// Where the nodes fetch the runner builds their allocs name (wasm runners only): the
    /// agents of the cluster. `None`: only builds already in the simulation's store run.
    pub runner_peers: Option<RunnerPeers>,
}

/// The agents simulated nodes fetch runner builds from, and the token they send.
#[derive(Clone)]
pub struct RunnerPeers {
    /// The agents' APIs, asked anew for each fetch.
    pub peers: crate::runner_store::PeerList,
    /// The agents' ACL token, if they have one.
    pub token: Option<String>,
    /// How the agents are dialled (TLS in a TLS cluster).
    pub pool: crate::rpc::transport::AgentPool,
}

impl std::fmt::Debug for RunnerPeers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunnerPeers { .. }")
    }
}

struct SimNode {
    name: String,
    data_dir: PathBuf,
    db: Arc<dyn StateDb>,
    /// `None` only while the node restarts.
    client: Mutex<Option<Client>>,
}

/// Each node's [`ServerApi`], by node name (over one connection pool, for HTTP).
pub type NodeServers = Arc<dyn Fn(&str) -> Arc<dyn ServerApi> + Send + Sync>;

/// A running simulation.
pub struct NodeSim {
    nodes: Vec<SimNode>,
    server: NodeServers,
    factory: AllocRunnerFactory,
    config: NodeSimConfig,
    stats: Arc<SimStats>,
    next_restart: AtomicUsize,
    restarts: AtomicU64,
    started: Instant,
    /// The alloc dirs of an ephemeral run; removed when dropped.
    _temp: Option<crate::util::fs_tree::TempTree>,
}

/// The simulation at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Nodes simulated.
    pub nodes: usize,
    /// Of those, nodes the server has registered.
    pub registered: usize,
    /// Allocs in the nodes' alloc maps, by client status.
    pub allocs_by_status: BTreeMap<String, u64>,
    /// Allocs the nodes fetched from the server (placements, and new versions of allocs).
    pub allocs_received: u64,
    /// Destroys running now, over every node's garbage collector.
    pub destroys_in_flight: u64,
    /// Update batches the server accepted.
    pub update_batches: u64,
    /// Updates in those batches.
    pub updates: u64,
    /// Server calls that failed (each retried).
    pub server_errors: u64,
    /// Simulated node restarts so far.
    pub restarts: u64,
    /// Time from an alloc reaching its node to being reported running: median and 99th
    /// percentile, and how many were measured.
    pub start_p50: Option<Duration>,
    /// See `start_p50`.
    pub start_p99: Option<Duration>,
    /// See `start_p50`.
    pub started: usize,
    /// Since the simulation started.
    pub elapsed: Duration,
}

impl Summary {
    /// Allocs in every node's map, whatever their status.
    pub fn allocs(&self) -> u64 {
        self.allocs_by_status.values().sum()
    }
}

impl NodeSim {
    /// Starts `config.nodes` clients, each of the server `server` gives for its name; each
    /// registers and begins watching at once.
    pub async fn start(config: NodeSimConfig, server: NodeServers) -> anyhow::Result<Self> {
        if config.nodes == 0 {
            anyhow::bail!("--nodes must be at least 1");
        }
        let (root, temp) = match &config.data_dir {
            Some(dir) => (dir.clone(), None),
            None => {
                let temp = crate::util::fs_tree::TempTree::new("caravan-nodesim-")
                    .context("cannot create a temporary directory for the nodes' alloc dirs")?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot create data dir {}", root.display()))?;
        let factory = match config.runner {
            SimRunner::Native => native_factory(),
            SimRunner::Wasm => {
                let runtime = Runtime::new(&RuntimeConfig::for_node(
                    config.max_live_allocs,
                    config.cache_dir.as_deref(),
                    &root,
                ))?;
                // One store for every simulated node, as they share one runtime: a build is
                // fetched once per simulation, not once per node.
                let store = crate::runner_store::RunnerStore::open(&root)
                    .context("cannot open the simulation's runner store")?;
                if let Some(from) = &config.runner_peers {
                    store.fetch_from(from.peers.clone(), from.token.clone(), from.pool.clone());
                }
                WasmAllocRunnerFactory::new(runtime)
                    .with_store(store)
                    .into_factory()
            }
        };
        let stats = Arc::new(SimStats::default());
        let mut sim = NodeSim {
            nodes: Vec::with_capacity(config.nodes),
            server,
            factory,
            config,
            stats,
            next_restart: AtomicUsize::new(0),
            restarts: AtomicU64::new(0),
            started: Instant::now(),
            _temp: temp,
        };
        for number in 1..=sim.config.nodes {
            let name = node_name(&sim.config.name_prefix, number);
            crate::cluster::keys::valid_node_name(&name).map_err(anyhow::Error::msg)?;
            let data_dir = root.join(&name);
            std::fs::create_dir_all(&data_dir)
                .with_context(|| format!("cannot create {}", data_dir.display()))?;
            let db: Arc<dyn StateDb> = if sim.config.data_dir.is_some() {
                let dir = data_dir.clone();
                Arc::new(crate::state::blocking(|| RedbStateDb::open(&dir))?)
            } else {
                Arc::new(MemoryStateDb::new())
            };
            let client = sim.start_client(&name, &data_dir, &db).await?;
            sim.nodes.push(SimNode {
                name,
                data_dir,
                db,
                client: Mutex::new(Some(client)),
            });
        }
        Ok(sim)
    }

    async fn start_client(
        &self,
        name: &str,
        data_dir: &std::path::Path,
        db: &Arc<dyn StateDb>,
    ) -> anyhow::Result<Client> {
        let mut config = ClientConfig::new(name, data_dir);
        config.gc = self.config.gc.clone();
        config.node_info = self.config.node_info.clone();
        let server = observe::Observed::new((self.server)(name), self.stats.clone());
        let client = Client::with_disk_stats(config, server, self.factory.clone(), db.clone());
        client
            .restore()
            .await
            .with_context(|| format!("node {name}: cannot restore its state"))?;
        client.start();
        Ok(client)
    }

    /// The simulation now.
    pub fn summary(&self) -> Summary {
        let mut allocs_by_status = BTreeMap::new();
        let mut destroys_in_flight = 0;
        for node in &self.nodes {
            let Some(metrics) = node.client.lock_unpoisoned().as_ref().map(Client::metrics) else {
                continue;
            };
            destroys_in_flight += metrics.destroys_in_flight;
            for (status, count) in metrics.allocs_by_status {
                *allocs_by_status.entry(status).or_insert(0) += count;
            }
        }
        let (update_batches, updates) = self.stats.updates();
        let starts = self.stats.start_latencies(&[50.0, 99.0]);
        Summary {
            nodes: self.nodes.len(),
            registered: self.stats.registered(),
            allocs_by_status,
            allocs_received: self.stats.allocs_received(),
            destroys_in_flight,
            update_batches,
            updates,
            server_errors: self.stats.server_errors(),
            restarts: self.restarts.load(Ordering::Relaxed),
            start_p50: starts.as_ref().map(|p| p[0]),
            start_p99: starts.as_ref().map(|p| p[1]),
            started: self.stats.started(),
            elapsed: self.started.elapsed(),
        }
    }

    /// Restarts the next node in turn, as an agent restart would: its runners are shut
    /// down (checkpointing), its client is dropped, and a new one restores from the same
    /// store. Returns the node's name and how many allocs the new client restored.
    pub async fn restart_next(&self) -> anyhow::Result<(String, usize)> {
        let turn = self.next_restart.fetch_add(1, Ordering::Relaxed);
        let node = &self.nodes[turn % self.nodes.len()];
        // Taken out first, so that no watch of the old client starts a runner once the
        // node is stopping; its loops end when it is dropped.
        let old = node.client.lock_unpoisoned().take();
        if let Some(old) = old {
            old.shutdown_all().await;
            old.flush_state().await;
        }
        let client = self
            .start_client(&node.name, &node.data_dir, &node.db)
            .await?;
        let restored = client.alloc_ids().len();
        *node.client.lock_unpoisoned() = Some(client);
        self.restarts.fetch_add(1, Ordering::Relaxed);
        Ok((node.name.clone(), restored))
    }

    /// Stops every node as an agent stop does: runners shut down and checkpoint (an
    /// ephemeral run's state goes with the process).
    pub async fn stop(self) {
        let clients: Vec<Client> = self
            .nodes
            .iter()
            .filter_map(|n| n.client.lock_unpoisoned().take())
            .collect();
        futures_util::future::join_all(clients.iter().map(|c| async move {
            c.shutdown_all().await;
            c.flush_state().await;
        }))
        .await;
    }
}

/// Nomad's GC knobs for a simulated node, but blind to disk usage: every node of the
/// simulation shares this machine's disk, whose fullness is no node's doing, so only the
/// count of terminal allocs (`gc_max_allocs`, 50) decides what a node collects early.
pub fn sim_gc_config() -> GcConfig {
    GcConfig {
        disk_usage_threshold: 100.0,
        inode_usage_threshold: 100.0,
        ..GcConfig::default()
    }
}

/// The name of node `number` (from 1) of a simulation whose names start with `prefix`.
pub fn node_name(prefix: &str, number: usize) -> String {
    format!("{prefix}-{number:05}")
}

fn native_factory() -> AllocRunnerFactory {
    Arc::new(|config| Ok(Arc::new(EmptyAllocRunner::new(config)) as Arc<dyn AllocRunner>))
}
