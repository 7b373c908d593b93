//! `caravan nodesim`: its flags, the live summary line, simulated restarts, and the final
//! report on Ctrl-C or SIGTERM. The simulation itself is [`crate::nodesim`]; this module
//! only parses, schedules and prints.

use super::GlobalArgs;
use super::client::DEFAULT_ADDR;
use crate::agent::cluster_config::{DEFAULT_NODE_TTL, MIN_NODE_TTL, valid_api_url};
use crate::cluster::{EtcdServerApi, EtcdStore, Member, MemberRecord};
use crate::model::node::{NodeInfo, NodeResources};
use crate::nodesim::{NodeServers, NodeSim, NodeSimConfig, SimRunner, Summary, node_name};
use crate::rpc::ServerApi;
use crate::rpc::http::HttpServer;
use crate::shutdown::Shutdown;
use crate::util::units::{format_duration, parse_bytes, parse_duration};
use anyhow::bail;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The most nodes one process simulates, as measured: 50,000 ran 100,000 sim allocs
/// (BENCHMARKS.md). Past a few thousand, what a node costs while idle (its watch and its
/// sync tick, 18 KiB) is what grows; connections no longer do (they are shared).
const MAX_NODES: usize = 50_000;

/// How many nodes share one HTTP/2 connection to the agent, each call a stream of it. With
/// a connection each, as separate agents have, the nodes' waiting watches held a descriptor
/// apiece on both sides, and open files were the first limit a process met (at about 12,000
/// nodes under a limit of 20,000). 64 nodes' watches, reports and fetches stay within the
/// streams an agent takes on one connection at once.
pub const NODES_PER_AGENT_CONNECTION: usize = 64;

/// `caravan nodesim`'s flags.
#[derive(Debug, clap::Args)]
pub struct NodesimCommand {
    /// How many nodes to simulate (1 to 50000).
    #[arg(long, value_name = "N")]
    nodes: usize,
    /// The agent whose server the nodes register with.
    #[arg(long, env = "CARAVAN_ADDR", default_value = DEFAULT_ADDR, value_name = "URL")]
    server: String,
    /// The token the nodes send: a `node` token where the agent has ACLs on (`caravan acl
    /// token create --role node`), or its shared token.
    #[arg(long, env = "CARAVAN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// How the nodes reach agents that serve HTTPS (a node's certificate: `caravan tls cert
    /// create --client`).
    #[command(flatten)]
    tls: crate::cli::client::DialTlsArgs,
    /// `etcd`: the nodes join the cluster whose state lives in etcd (each with a lease and a
    /// live key, as an agent's node, but never leading), instead of registering with --server.
    #[arg(long, value_name = "MODE")]
    cluster: Option<String>,
    /// Every etcd member's client URL, comma-separated (with --cluster etcd).
    #[arg(long, value_name = "URL,URL,...")]
    etcd_endpoints: Option<String>,
    /// The CA etcd's certificates chain to, for https:// endpoints (with --cluster etcd).
    #[arg(long, value_name = "FILE")]
    etcd_ca_file: Option<PathBuf>,
    /// The nodes' certificate for etcd members run with --client-cert-auth.
    #[arg(long, value_name = "FILE")]
    etcd_cert_file: Option<PathBuf>,
    /// The key of --etcd-cert-file.
    #[arg(long, value_name = "FILE")]
    etcd_key_file: Option<PathBuf>,
    /// An etcd user, for an etcd with authentication on; its password from
    /// --etcd-password-file or CARAVAN_ETCD_PASSWORD.
    #[arg(long, value_name = "NAME")]
    etcd_username: Option<String>,
    /// A file holding the etcd user's password (its last line break dropped).
    #[arg(long, value_name = "FILE")]
    etcd_password_file: Option<PathBuf>,
    /// Each node's lease TTL in the cluster: a node silent this long is down (with
    /// --cluster etcd; at least 2s). Default: 10s, or a second for every 50 nodes past 500
    /// (100s for 5,000), as Nomad's servers lengthen heartbeats as a cluster grows, so that
    /// renewals reach etcd at about 150 a second however many nodes there are.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    node_ttl: Option<Duration>,
    /// What runs each alloc: `wasm`, the component its job names, sandboxed as on an agent
    /// (guests/sim is made for this); or `native`, a runner without a sandbox that runs until
    /// stopped, to tell the sandbox's cost from the client's.
    #[arg(long, value_enum, default_value = "wasm")]
    runner: SimRunner,
    /// Keep each node's state (a redb file) and alloc dirs under DIR/NODE, so that the
    /// next run on DIR resumes them. Without it, state is in memory only.
    #[arg(long, value_name = "DIR", conflicts_with = "ephemeral")]
    data_dir: Option<PathBuf>,
    /// Keep state in memory only (the default when --data-dir is not given).
    #[arg(long)]
    ephemeral: bool,
    /// Nodes are named PREFIX-00001, PREFIX-00002, ...
    #[arg(long, default_value = "sim", value_name = "PREFIX")]
    name_prefix: String,
    /// Restart one node (the next in turn) this often, as an agent restart would.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    restart_every: Option<Duration>,
    /// How often to print the summary line.
    #[arg(long, value_parser = parse_duration, default_value = "1s", value_name = "DURATION")]
    summary_every: Duration,
    /// Where compiled runner components are kept (default: the cache the agent, `caravan
    /// run` and `runner check` share, ~/.cache/caravan/components).
    #[arg(long, env = "CARAVAN_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Sizes the sandbox pool that every node's wasm runners share.
    #[arg(long, default_value_t = 4_096, value_name = "N")]
    max_live_allocs: u32,
    /// The memory each node says allocs may reserve on it, such as 4GiB (default: none
    /// said, so memory never keeps an alloc off a simulated node).
    #[arg(long, value_parser = parse_bytes, value_name = "SIZE")]
    node_memory: Option<u64>,
    /// How many allocs each node says it runs at once (default: none said, so slots never
    /// keep an alloc off a simulated node).
    #[arg(long, value_name = "N")]
    node_slots: Option<u32>,
    /// Each node's class, for job constraints on `${node.class}`.
    #[arg(long, default_value = "", value_name = "CLASS")]
    node_class: String,
}

impl NodesimCommand {
    /// What every simulated node says of itself.
    fn node_info(&self) -> anyhow::Result<NodeInfo> {
        let info = NodeInfo {
            class: self.node_class.clone(),
            attributes: NodeInfo::machine_attributes(),
            resources: NodeResources {
                memory_bytes: self.node_memory,
                default_alloc_memory_bytes: None,
                alloc_slots: self.node_slots,
            },
            ..NodeInfo::default()
        };
        info.check()
            .map_err(|problem| anyhow::anyhow!("--node-{problem}"))?;
        Ok(info)
    }

    /// Runs the simulation until the first Ctrl-C or SIGTERM, then prints the final report,
    /// stops the nodes and exits 0. Bad flags or a server address that is not a URL exit 2.
    pub async fn execute(self, global: &GlobalArgs) -> anyhow::Result<ExitCode> {
        global.start_logging("warn")?;
        if !(1..=MAX_NODES).contains(&self.nodes) {
            bail!("--nodes must be from 1 to {MAX_NODES}, not {}", self.nodes);
        }
        if self.summary_every < Duration::from_millis(100) {
            bail!("--summary-every must be at least 100ms");
        }
        // The longest name, checked before any node says it is live anywhere.
        crate::cluster::keys::valid_node_name(&node_name(&self.name_prefix, self.nodes))
            .map_err(|e| anyhow::anyhow!("--name-prefix: {e}"))?;
        if self.restart_every.is_some_and(|d| d.is_zero()) {
            bail!("--restart-every must be more than 0");
        }
        let mut config = NodeSimConfig {
            nodes: self.nodes,
            name_prefix: self.name_prefix.clone(),
            runner: self.runner,
            data_dir: self.data_dir.clone(),
            max_live_allocs: self.max_live_allocs,
            cache_dir: self
                .cache_dir
                .clone()
                .or_else(crate::runtime::component::disk_cache::shared_dir),
            gc: crate::nodesim::sim_gc_config(),
            runner_peers: None,
            node_info: self.node_info()?,
        };
        // A bad server address or cluster setting is refused before anything is warned
        // about or started.
        let Servers {
            nodes: servers,
            target,
            agent,
            members: _members,
            runner_peers,
        } = self.servers(&config).await?;
        config.runner_peers = Some(crate::nodesim::RunnerPeers {
            peers: runner_peers,
            token: self.token.clone(),
            pool: self.tls.pool()?,
        });
        let shutdown = Shutdown::new();
        shutdown.on_signals()?;
        let mut stop = shutdown.listener();
        let open_files = crate::agent::descriptors::raise_open_files_limit();
        if self.runner == SimRunner::Wasm {
            // A live alloc may hold its log file open, and its alloc dir when its runner
            // imports `wasi:filesystem` (the sim runner does not).
            crate::agent::descriptors::warn_if_allocs_can_exhaust(
                open_files,
                self.max_live_allocs,
                2,
            );
        }
        let sim = NodeSim::start(config, servers).await?;
        say(&format!(
            "nodesim: {} nodes ({} runners) registering with {target}",
            self.nodes,
            match self.runner {
                SimRunner::Wasm => "wasm",
                SimRunner::Native => "native",
            },
        ));
        let mut summaries = tokio::time::interval(self.summary_every);
        // Without --restart-every the branch is disabled; the period only has to be valid.
        let mut restarts =
            tokio::time::interval(self.restart_every.unwrap_or(Duration::from_secs(3600)));
        // Both tick at once first; neither should act before a whole period.
        summaries.tick().await;
        restarts.tick().await;
        let mut last = sim.summary();
        loop {
            tokio::select! {
                _ = stop.stopping() => break,
                _ = summaries.tick() => {
                    let now = sim.summary();
                    say(&summary_line(&now, &last));
                    last = now;
                }
                _ = restarts.tick(), if self.restart_every.is_some() => {
                    match sim.restart_next().await {
                        Ok((node, restored)) => {
                            say(&format!("restarted {node}: restored {restored} allocs"));
                        }
                        Err(error) => say(&format!("restart failed: {error:#}")),
                    }
                }
            }
        }
        let mut report = report(&sim.summary());
        if let Some(agent) = agent {
            report.push_str(&watch_lag_line(&agent).await);
        }
        say(&report);
        tokio::select! {
            _ = sim.stop() => Ok(ExitCode::SUCCESS),
            _ = stop.abandoning() => bail!("interrupted again: stopped without waiting for the nodes"),
        }
    }

    /// What each node talks to: an agent over HTTP, or the etcd cluster, which every node
    /// joins (a lease and a live key, as an agent's node has) before it starts.
    async fn servers(&self, config: &NodeSimConfig) -> anyhow::Result<Servers> {
        match self.cluster.as_deref() {
            None | Some("embedded") => {
                let pool = self.tls.pool()?;
                let agent = HttpServer::new(&pool, &self.server, self.token.clone())?;
                // Once, over HTTP/1.1, before the nodes' HTTP/2: what is wrong with the
                // address is then said in words (a TLS agent called over plain HTTP answers
                // a 400 only HTTP/1.1 can read).
                if let Err(error) = agent.check_reachable().await {
                    bail!("cannot use the agent at {}: {error}", self.server);
                }
                let connections = (0..config.nodes.div_ceil(NODES_PER_AGENT_CONNECTION))
                    .map(|_| HttpServer::new(&pool.multiplexed(), &self.server, self.token.clone()))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let by_node: std::collections::HashMap<String, HttpServer> = (1..=config.nodes)
                    .map(|number| {
                        let connection = &connections[(number - 1) / NODES_PER_AGENT_CONNECTION];
                        (node_name(&config.name_prefix, number), connection.clone())
                    })
                    .collect();
                let first = connections[0].clone();
                let nodes: NodeServers = Arc::new(move |node: &str| {
                    by_node.get(node).unwrap_or(&first).node(node) as Arc<dyn ServerApi>
                });
                Ok(Servers {
                    nodes,
                    target: self.server.clone(),
                    agent: Some(agent),
                    members: Vec::new(),
                    runner_peers: crate::runner_store::fixed_peers(vec![self.server.clone()]),
                })
            }
            Some("etcd") => {
                let endpoints: Vec<String> = match &self.etcd_endpoints {
                    Some(list) => list.split(',').map(|e| e.trim().to_string()).collect(),
                    None => bail!("--cluster etcd needs --etcd-endpoints URL,URL,..."),
                };
                if let Some(bad) = endpoints.iter().find(|e| !valid_api_url(e)) {
                    bail!("--etcd-endpoints: {bad:?} is not http://HOST:PORT (or https://)");
                }
                let security = crate::agent::etcd_security::EtcdSecurity::from_flags(
                    (
                        self.etcd_ca_file.clone(),
                        self.etcd_cert_file.clone(),
                        self.etcd_key_file.clone(),
                    ),
                    self.etcd_username.clone(),
                    self.etcd_password_file.clone(),
                );
                security
                    .check(&endpoints, "--etcd-endpoints")
                    .map_err(|problem| anyhow::anyhow!(problem))?;
                let node_ttl = self.node_ttl.unwrap_or_else(|| lease_ttl_for(config.nodes));
                if node_ttl < MIN_NODE_TTL {
                    bail!(
                        "--node-ttl must be at least {}",
                        format_duration(MIN_NODE_TTL)
                    );
                }
                let access = security.access()?;
                let store = EtcdStore::connect_with(&endpoints, &access).await?;
                store.check_schema().await?;
                // A connection for every hundred nodes (real nodes each have their own): one
                // connection carrying every node's lease and watch streams would be one
                // queue, and one failure, for all of them.
                let mut stores = vec![store.clone()];
                for _ in 1..config.nodes.div_ceil(NODES_PER_ETCD_CONNECTION) {
                    stores.push(EtcdStore::connect_with(&endpoints, &access).await?);
                }
                // Dealt round, not in blocks: the leader writes a save's allocs node by node,
                // in the order of their names, and a block of a hundred neighbours on one
                // connection took a hundred nodes' allocs, runner starts and status writes
                // at once, ahead of their lease renewals (which lapsed, for thousands of
                // nodes at 5,000). A node's lease and its watch share its connection.
                let slot = |number: usize| (number - 1) % stores.len();
                let connection_of = |number: usize| &stores[slot(number)];
                let members = (1..=config.nodes)
                    .map(|number| {
                        let record = MemberRecord {
                            node: node_name(&config.name_prefix, number),
                            // Nothing answers there: an alloc's logs are not reachable
                            // through the cluster's API for simulated nodes.
                            api: SIMULATED_NODE_API.into(),
                            agent: uuid::Uuid::new_v4().to_string(),
                            info: config.node_info.clone(),
                        };
                        Member::join_as_node_only(connection_of(number).clone(), record, node_ttl)
                    })
                    .collect();
                let agents = store.clone();
                let runner_peers: crate::runner_store::PeerList = Arc::new(move || {
                    let agents = agents.clone();
                    Box::pin(async move {
                        let live = crate::cluster::live_records(&agents).await;
                        live.unwrap_or_default()
                            .into_iter()
                            .map(|(member, _)| member.api)
                            .filter(|api| api != SIMULATED_NODE_API)
                            .collect()
                    })
                });
                let apis: Vec<Arc<EtcdServerApi>> = stores
                    .iter()
                    .map(|s| EtcdServerApi::new(s.clone()))
                    .collect();
                let by_node: std::collections::HashMap<String, Arc<EtcdServerApi>> = (1..=config
                    .nodes)
                    .map(|number| {
                        let api = apis[slot(number)].clone();
                        (node_name(&config.name_prefix, number), api)
                    })
                    .collect();
                let first = apis[0].clone();
                let nodes: NodeServers = Arc::new(move |node: &str| {
                    by_node.get(node).unwrap_or(&first).clone() as Arc<dyn ServerApi>
                });
                Ok(Servers {
                    nodes,
                    target: format!(
                        "etcd at {} (lease TTL {})",
                        store.endpoints(),
                        format_duration(node_ttl)
                    ),
                    agent: None,
                    members,
                    runner_peers,
                })
            }
            Some(other) => bail!("--cluster must be etcd or embedded, not {other:?}"),
        }
    }
}

/// Prints one line of nodesim's output. Once nobody reads it (the pipe's reader left: a
/// bench that stopped, `| head`), the line is dropped: nodesim, like the agent, ignores
/// SIGPIPE (`cli::end_quietly_on_a_closed_pipe`), and `println!` would panic there. It runs
/// on until it is stopped, and then stops its nodes as it should.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// Nodes per second of lease TTL, past [`DEFAULT_NODE_TTL`]: Nomad's
/// `max_heartbeats_per_second`. A node renews three times per TTL, so etcd takes about 150
/// renewals a second from any number of nodes (up to 165: the TTL is whole seconds), where
/// a fixed TTL of 10 s would have 5,000 nodes send 1,500 (the call etcd was asked most at
/// 5,000 nodes; and renewals held up behind a burst of alloc starts let hundreds of leases
/// lapse). The trade is Nomad's: a dead node is found later in a larger cluster.
const NODES_PER_TTL_SECOND: usize = 50;

/// The lease TTL of a run of `nodes` simulated nodes when `--node-ttl` is not given.
fn lease_ttl_for(nodes: usize) -> Duration {
    DEFAULT_NODE_TTL.max(Duration::from_secs((nodes / NODES_PER_TTL_SECOND) as u64))
}

/// How many simulated nodes share one connection to etcd, at most.
const NODES_PER_ETCD_CONNECTION: usize = 100;

/// The API a simulated node's member record names: nothing answers there, and no agent
/// fetches a runner build from it.
const SIMULATED_NODE_API: &str = "http://nodesim.invalid:1";

/// What the nodes talk to, from [`NodesimCommand::servers`].
struct Servers {
    /// Each node's server.
    nodes: NodeServers,
    /// What they are, for people.
    target: String,
    /// The agent whose embedded server they use, whose metrics the report reads.
    agent: Option<HttpServer>,
    /// The nodes' cluster memberships, which must live as long as the nodes.
    members: Vec<crate::cluster::Member>,
    /// The agents the nodes fetch runner builds from.
    runner_peers: crate::runner_store::PeerList,
}

/// The report's watch lag line, from the server's own histogram (only the server knows when
/// a node's allocs changed): bucket bounds, so "under".
async fn watch_lag_line(agent: &HttpServer) -> String {
    const HISTOGRAM: &str = "caravan_server_watch_lag_seconds";
    // The report is printed on Ctrl-C: an agent that does not answer must not hold it.
    let answer = tokio::time::timeout(Duration::from_secs(2), agent.metrics_text()).await;
    let text = match answer {
        Ok(Ok(text)) => text,
        Ok(Err(error)) => return format!("\n  watch lag     unknown: {error}"),
        Err(_) => {
            return "\n  watch lag     unknown: the agent's metrics did not come within 2s".into();
        }
    };
    let bound = |q| match crate::util::histogram::quantile_bound(&text, HISTOGRAM, q) {
        // Debug shows 250µs, 2.5ms and 10s alike.
        Some(Some(bound)) => format!("under {bound:?}"),
        Some(None) => format!(
            "over {}s",
            crate::util::histogram::BUCKETS_SECONDS
                [crate::util::histogram::BUCKETS_SECONDS.len() - 1]
        ),
        None => "-".into(),
    };
    format!(
        "\n  watch lag     p50 {}, p99 {} (the server's, all its nodes': from a change to a node's allocs to its watch answering)",
        bound(0.5),
        bound(0.99)
    )
}

fn millis(duration: Option<Duration>) -> String {
    duration.map_or("-".into(), |d| format!("{}ms", d.as_millis()))
}

fn by_status(summary: &Summary) -> String {
    let parts: Vec<String> = summary
        .allocs_by_status
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(status, n)| format!("{status} {n}"))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// One line: where the simulation is now, with rates since `last`.
fn summary_line(now: &Summary, last: &Summary) -> String {
    let seconds = (now.elapsed - last.elapsed).as_secs_f64().max(1e-3);
    let per_second = |count: u64| count as f64 / seconds;
    format!(
        "[{:>4}s] nodes {}/{} registered | allocs {}{} | {:.0} received/s, {:.0} updates/s | start p50 {} p99 {} | {} destroying | {} server errors",
        now.elapsed.as_secs(),
        now.registered,
        now.nodes,
        now.allocs(),
        by_status(now),
        per_second(now.allocs_received - last.allocs_received),
        per_second(now.updates - last.updates),
        millis(now.start_p50),
        millis(now.start_p99),
        now.destroys_in_flight,
        now.server_errors,
    )
}

/// The final report, a few lines.
fn report(summary: &Summary) -> String {
    let seconds = summary.elapsed.as_secs_f64().max(1e-3);
    format!(
        "nodesim report after {:.1}s\n  nodes         {} ({} registered, {} restarts)\n  allocs        {}{}\n  received      {} allocs from the server ({:.0}/s)\n  updates       {} in {} batches ({:.0}/s)\n  alloc start   p50 {}, p99 {} ({} measured, from reaching the node to reported running)\n  server errors {}",
        seconds,
        summary.nodes,
        summary.registered,
        summary.restarts,
        summary.allocs(),
        by_status(summary),
        summary.allocs_received,
        summary.allocs_received as f64 / seconds,
        summary.updates,
        summary.update_batches,
        summary.updates as f64 / seconds,
        millis(summary.start_p50),
        millis(summary.start_p99),
        summary.started,
        summary.server_errors,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_lease_ttl_grows_with_the_nodes_past_five_hundred() {
        assert_eq!(lease_ttl_for(1), DEFAULT_NODE_TTL);
        assert_eq!(lease_ttl_for(500), DEFAULT_NODE_TTL);
        assert_eq!(lease_ttl_for(1_000), Duration::from_secs(20));
        assert_eq!(lease_ttl_for(5_000), Duration::from_secs(100));
        // Renewals (three per TTL) stay at about 150 a second from any number of nodes.
        for nodes in [1_000, 5_000, 50_000] {
            let per_second = 3.0 * nodes as f64 / lease_ttl_for(nodes).as_secs_f64();
            assert!(
                (149.0..=151.0).contains(&per_second),
                "{nodes}: {per_second}"
            );
        }
    }
}
