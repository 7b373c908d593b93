//! `caravan agent`: the embedded server, one client node and the HTTP API in one process;
//! or, in cluster mode, one node of a cluster whose state lives in etcd, which schedules
//! for the whole cluster while it holds the leadership (see [`crate::cluster`]).
//!
//! Layout:
//! - [`config`]: the TOML config file and its knobs; [`cluster_config`], its `[cluster]`.
//! - [`http`]: the HTTP API.
//! - [`descriptors`]: the process's open-file limit, raised at start.
//! - `listener`: the listening socket, with a backlog for thousands of nodes at once.
//! - `serve`: the connections on it, plain or TLS, each request told its caller's role.
//!
//! The agent is the composition root: the only place that knows every layer. It may use all
//! of them; none of them knows it, and only the CLI's `agent` command starts it.

pub mod audit_log;
mod checkpoints;
pub mod cluster_config;
mod cluster_mode;
pub mod config;
pub mod descriptors;
pub mod etcd_security;
pub mod http;
mod listener;
mod runner_builds;
pub mod series;
mod serve;

use crate::alloc_logs::AllocLogs;
use crate::client::{Client, ClientConfig};
use crate::model::admission::Admission;
use crate::rpc::ServerApi;
use crate::rpc::transport::AgentPool;
use crate::runtime::{Runtime, RuntimeConfig, WasmAllocRunnerFactory};
use crate::server::EmbeddedServer;
use crate::state::{RedbStateDb, StateDb};
use crate::tls::{Expect, ServeTls};
use anyhow::Context;
use config::AgentConfig;
use std::net::SocketAddr;
use std::sync::Arc;

/// How long open HTTP connections get to finish when the agent stops.
const HTTP_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The node id of the agent's own client.
pub const LOCAL_NODE: &str = "local";

/// A running agent.
pub struct Agent {
    /// Where the HTTP API listens (the real port when `bind` asked for port 0).
    pub addr: SocketAddr,
    /// The server answering here: the embedded one, or in cluster mode the scheduler's while
    /// this agent leads.
    pub servers: tokio::sync::watch::Receiver<Option<Arc<EmbeddedServer>>>,
    /// The agent's client.
    pub client: Client,
    /// In cluster mode, the agent's membership and its scheduler.
    cluster: Option<cluster_mode::ClusterMode>,
    /// False when the agent only schedules: its client never started, so has nothing to stop.
    client_enabled: bool,
    dev: bool,
    alloc_logs: AllocLogs,
    /// Holds a dev agent's temporary data dir; dropping it removes the directory.
    _dev_data_dir: Option<crate::util::fs_tree::TempTree>,
    http: tokio::task::JoinHandle<()>,
    stop_http: tokio::sync::oneshot::Sender<()>,
    /// Removes runner builds no job uses.
    runner_gc: tokio::task::JoinHandle<()>,
    /// Samples the series the web UI plots.
    sampler: tokio::task::JoinHandle<()>,
}

/// Takes nodes that stopped watching out of placement, and moves node drains on (their
/// deadlines), a few times per `node_ttl`, until the server is dropped.
async fn down_silent_nodes(server: std::sync::Weak<EmbeddedServer>, node_ttl: std::time::Duration) {
    let mut sweeps = tokio::time::interval(node_ttl / 4);
    sweeps.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        sweeps.tick().await;
        let Some(server) = server.upgrade() else {
            return;
        };
        // Off the runtime's workers: taking a node down saves, under the server's lock.
        // The agent's own node lives as long as this process does.
        let swept = tokio::task::spawn_blocking(move || {
            let downed = server.down_silent_nodes(LOCAL_NODE);
            (downed, server.tick())
        })
        .await;
        if let Ok((downed, drains)) = swept {
            if let Err(error) = downed {
                tracing::error!(error = %error, "cannot take silent nodes down; retrying");
            }
            if let Err(error) = drains {
                tracing::error!(error = %error, "cannot move node drains and disconnects on; retrying");
            }
        }
    }
}

impl Agent {
    /// Starts the server, the client and the HTTP API.
    pub async fn start(mut config: AgentConfig) -> anyhow::Result<Agent> {
        if let Some(i) = config.capabilities.rule_reaching(config.bind) {
            anyhow::bail!(
                "client.capabilities.network[{i}] lets runners reach this agent's own API on {}; \
                 offer other ports (whoever reaches the API runs and stops jobs)",
                config.bind
            );
        }
        // Before anything starts: a certificate or key the agent cannot use is one line.
        let (serve_tls, agents) = match &config.tls {
            None => (None, AgentPool::new()),
            Some(tls) => (
                Some(ServeTls::new(
                    &tls.files,
                    &config.region,
                    tls.verify_https_client,
                )?),
                AgentPool::with_tls(crate::tls::dial_config(
                    &tls.files,
                    &Expect::AgentOf(config.region.clone()),
                )?),
            ),
        };
        let audit_log = match &config.audit_path {
            Some(path) => Some(Arc::new(audit_log::AuditLog::open(path)?)),
            None => None,
        };
        let descriptor_limit = descriptors::raise_open_files_limit();
        // An agent without a client runs no allocs, and needs no budget for them.
        let runner_descriptors = if config.client_enabled {
            descriptors::runner_budget(
                descriptor_limit,
                config.max_live_allocs,
                u64::from(config.limit_caps.open_files),
            )
        } else {
            None
        };
        let dev_data_dir = if config.dev {
            let dir = crate::util::fs_tree::TempTree::new("caravan-dev-")
                .context("cannot create the dev data dir")?;
            config.data_dir = dir.path().to_path_buf();
            Some(dir)
        } else {
            std::fs::create_dir_all(&config.data_dir)
                .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
            None
        };
        // Refused before anything else starts: a store this build cannot use is the
        // operator's to look at, never something to overwrite.
        // Opening may repair a file left by a crash: a blocking read of the whole file.
        let db: Arc<dyn StateDb> = Arc::new(crate::state::blocking(|| {
            RedbStateDb::open(&config.data_dir)
        })?);
        let runners = crate::runner_store::RunnerStore::open(&config.data_dir)
            .with_context(|| {
                format!(
                    "cannot open the runner store in {}",
                    config.data_dir.join("runners").display()
                )
            })?
            .with_registries(crate::runner_store::oci::Registries::new(
                config.insecure_registries.clone(),
            ));
        let runtime = Runtime::new(&RuntimeConfig {
            guest_descriptors: runner_descriptors,
            ..RuntimeConfig::for_node(
                config.max_live_allocs,
                config.cache_dir.as_deref(),
                &config.data_dir,
            )
        })?;
        let listener = listener::listen(config.bind)
            .with_context(|| format!("cannot listen on {}", config.bind))?;
        let addr = listener.local_addr()?;
        // The server side: the embedded server on this agent's state file, or etcd.
        let (server_api, node_id, servers, cluster) = match &config.cluster {
            None => {
                let server = EmbeddedServer::open(config.server.clone(), db.clone())?;
                tokio::spawn(down_silent_nodes(
                    Arc::downgrade(&server),
                    config.server.node_ttl,
                ));
                let servers = tokio::sync::watch::channel(Some(server.clone())).1;
                (
                    server as Arc<dyn ServerApi>,
                    LOCAL_NODE.to_string(),
                    servers,
                    None,
                )
            }
            Some(cluster) => {
                let mode = cluster_mode::ClusterMode::join(
                    cluster,
                    &config.server,
                    (addr, serve_tls.is_some()),
                    &config.data_dir,
                    config.node_info(),
                )
                .await?;
                (
                    mode.server_api.clone(),
                    cluster.node_name.clone(),
                    mode.servers(),
                    Some(mode),
                )
            }
        };
        let mut client_config = ClientConfig::new(&node_id, &config.data_dir);
        // One owner of the alloc log files (it lists their directory once), shared by the
        // runners and the HTTP API: the client's, under the same data dir.
        let alloc_logs = client_config.alloc_logs.clone();
        client_config.gc = config.gc.clone();
        client_config.limits = config.limits;
        client_config.node_info = config.node_info();
        // The agent decides what runs allocs: WebAssembly components, on the shared runtime.
        let admission = Admission {
            caps: Some(config.limit_caps),
            offered: Arc::new(config.capabilities.clone()),
        };
        let builds = match &cluster {
            None => runner_builds::embedded_builds(servers.clone()),
            Some(mode) => {
                runners.fetch_from(
                    mode.runner_peers(),
                    config.acl_token.clone(),
                    agents.clone(),
                );
                mode.runner_builds()
            }
        };
        let factory = WasmAllocRunnerFactory::new(runtime.clone())
            .admitting(admission.clone())
            .with_store(runners.clone())
            .into_factory();
        let client = Client::with_disk_stats(client_config, server_api, factory, db.clone());
        if let Some(mode) = &cluster {
            client.fetch_checkpoints_from(
                mode.checkpoint_source(config.acl_token.clone(), agents.clone()),
            );
        }
        // A client that never starts never registers its node: nothing is placed here.
        let restored = if config.client_enabled {
            let restored = client.restore().await?;
            client.start();
            restored
        } else {
            tracing::info!("client.enabled is false: this agent runs no allocs, it only schedules");
            0
        };

        let acl = http::AclSettings {
            tokens: match (&cluster, config.acl_enabled) {
                (_, false) => None,
                (None, true) => Some(Arc::new(crate::acl::LocalTokens::open(db.clone())?)),
                (Some(mode), true) => Some(mode.acl_tokens()),
            },
            shared_token: config.acl_token.clone(),
        };
        if config.acl_token.is_some() {
            tracing::warn!(
                "acl_token is deprecated: {}",
                if config.acl_enabled {
                    "it works as a management token; make tokens with roles (caravan acl token create) and remove it"
                } else {
                    "turn on [acl] enabled = true and make tokens with roles (caravan acl bootstrap)"
                }
            );
        }
        let series = Arc::new(series::Series::default());
        let sampler = tokio::spawn(series::sample_every(
            series.clone(),
            config.collection_interval,
            {
                let client = client.clone();
                move || client.runner_usages()
            },
            servers.clone(),
        ));
        let api_state = http::ApiState {
            servers: servers.clone(),
            forwarding: cluster.as_ref().map(|c| c.forwarding(agents.clone())),
            agent_routes_need_certs: serve_tls.is_some(),
            audit_log,
            etcd: cluster.as_ref().map(|c| c.etcd_health()),
            client: client.clone(),
            acl,
            runtime,
            runners: runners.clone(),
            alloc_logs: alloc_logs.clone(),
            default_limits: config.limits,
            admission,
            series,
            sample_interval: config.collection_interval,
        };
        let metered = api_state.clone();
        crate::telemetry::otlp::export_metrics(move || http::metrics_text(&metered));
        let api = http::router(api_state);
        let runner_gc = tokio::spawn(runner_builds::collect_unused_builds(
            runners,
            config.runner_gc_grace,
            builds,
            client.clone(),
        ));
        let (stop_http, stopped) = tokio::sync::oneshot::channel::<()>();
        let tls = serve_tls.is_some();
        let http = tokio::spawn(serve::serve(listener, api, serve_tls, stopped));
        tracing::info!(
            addr = %addr,
            tls,
            data_dir = %config.data_dir.display(),
            dev = config.dev,
            restored,
            "agent started"
        );
        Ok(Agent {
            addr,
            servers,
            client,
            cluster,
            client_enabled: config.client_enabled,
            dev: config.dev,
            alloc_logs,
            _dev_data_dir: dev_data_dir,
            http,
            stop_http,
            runner_gc,
            sampler,
        })
    }

    /// Stops the agent: the HTTP API first, then every runner. A dev agent destroys its
    /// allocs (and its data dir, when dropped); otherwise runners are shut down, checkpoint,
    /// and are resumed by the next start.
    pub async fn stop(self) {
        // Stop taking requests, stop the runners (which ends followed log streams), then
        // give open connections a moment to finish.
        let _ = self.stop_http.send(());
        self.runner_gc.abort();
        self.sampler.abort();
        // Leadership goes first, so that another agent takes over at once rather than after
        // a TTL. The node stays live until its lease expires: back within the TTL, it keeps
        // its allocs.
        if let Some(cluster) = self.cluster {
            cluster.leave().await;
        }
        if !self.client_enabled {
            // Nothing ran here: the client's loops (which destroys wait on) never started.
        } else if self.dev {
            self.client.destroy_all().await;
        } else {
            self.client.shutdown_all().await;
        }
        // What the runners logged last is written before the process goes.
        self.alloc_logs.settle_all().await;
        if tokio::time::timeout(HTTP_DRAIN, self.http).await.is_err() {
            tracing::warn!(
                "HTTP connections still open after {}s; closing them",
                HTTP_DRAIN.as_secs()
            );
        }
        tracing::info!("agent stopped");
    }
}
