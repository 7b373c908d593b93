//! The agent in cluster mode: its connection to etcd (the schema checked before anything
//! else), its membership (a lease, its node's live key, its campaign for the leadership),
//! the seam its client talks through, and the scheduler it runs while it leads.
//!
//! It wires [`crate::cluster`]'s parts together and decides nothing itself.

use super::cluster_config::ClusterConfig;
use super::http::forward::Forwarding;
use crate::cluster::{
    EtcdHealth, EtcdServerApi, EtcdStore, HistoryStats, Member, MemberRecord, SPACE_PROBE_INTERVAL,
    SchedulerConfig, ServerSlot, watch_space,
};
use crate::model::node::NodeInfo;
use crate::rpc::ServerApi;
use crate::rpc::transport::AgentPool;
use crate::server::{EmbeddedServer, ServerConfig};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the leader looks for terminal allocs past `job_gc_threshold`.
const SERVER_GC_INTERVAL: Duration = Duration::from_secs(60);

/// A running cluster membership.
pub(super) struct ClusterMode {
    /// What the agent's client talks to.
    pub(super) server_api: Arc<dyn ServerApi>,
    member: Member,
    store: EtcdStore,
    node: String,
    slot: ServerSlot,
    scheduling: tokio::task::JoinHandle<()>,
    etcd_health: EtcdHealth,
}

impl ClusterMode {
    /// Connects to etcd, checks the schema, joins as `config.node_name` with its HTTP API at
    /// `api`, and starts scheduling whenever this agent wins the leadership.
    /// `tls`: whether the API serves HTTPS, which the address advertised must then say.
    pub(super) async fn join(
        config: &ClusterConfig,
        server: &ServerConfig,
        (bound, tls): (SocketAddr, bool),
        data_dir: &Path,
        node_info: NodeInfo,
    ) -> anyhow::Result<ClusterMode> {
        let scheme = if tls { "https" } else { "http" };
        let api = match &config.advertise {
            Some(url) if !url.starts_with(&format!("{scheme}://")) => anyhow::bail!(
                "cluster.advertise {url:?} must be {scheme}://HOST:PORT: this agent's API \
                 serves {}",
                if tls {
                    "HTTPS only ([tls] http = true)"
                } else {
                    "plain HTTP (no [tls])"
                }
            ),
            Some(url) => url.clone(),
            None if bound.ip().is_unspecified() => anyhow::bail!(
                "the API listens on {bound}, which other agents cannot dial as such: give \
                 the URL they reach it at with --advertise (or cluster.advertise)"
            ),
            None => format!("{scheme}://{bound}"),
        };
        let access = config.etcd_security.access()?;
        let store = EtcdStore::connect_with(&config.etcd_endpoints, &access).await?;
        store.check_schema().await?;
        let record = MemberRecord {
            node: config.node_name.clone(),
            api,
            agent: agent_id(data_dir)?,
            info: node_info,
        };
        let previous_lease = previous_run_or_namesake(&store, &record, config.node_ttl).await?;
        let member = Member::join(store.clone(), record, config.node_ttl, previous_lease);
        let slot: ServerSlot = watch::channel(None).0;
        let history = Arc::new(HistoryStats::default());
        let scheduler = SchedulerConfig {
            server: server.clone(),
            node_ttl: config.node_ttl,
            gc_interval: SERVER_GC_INTERVAL,
            compact_interval: config.compact_interval,
            history: history.clone(),
        };
        let etcd_health = EtcdHealth {
            space: watch_space(store.clone(), SPACE_PROBE_INTERVAL),
            history,
        };
        let scheduling = tokio::spawn(crate::cluster::schedule_while_leading(
            store.clone(),
            member.view(),
            scheduler,
            slot.clone(),
        ));
        tracing::info!(
            etcd = %store.endpoints(),
            node = %config.node_name,
            node_ttl = ?config.node_ttl,
            compact_interval = ?config.compact_interval,
            "joined the cluster"
        );
        Ok(ClusterMode {
            server_api: EtcdServerApi::new(store.clone()),
            member,
            store,
            node: config.node_name.clone(),
            slot,
            scheduling,
            etcd_health,
        })
    }

    /// What the HTTP API shows of etcd's space, alarms and compactions.
    pub(super) fn etcd_health(&self) -> EtcdHealth {
        self.etcd_health.clone()
    }

    /// The server answering here while this agent leads.
    pub(super) fn servers(&self) -> watch::Receiver<Option<Arc<EmbeddedServer>>> {
        self.slot.subscribe()
    }

    /// What the HTTP API forwards by.
    pub(super) fn forwarding(&self, pool: AgentPool) -> Arc<Forwarding> {
        Arc::new(Forwarding::new(
            self.member.view(),
            self.store.clone(),
            self.node.clone(),
            pool,
        ))
    }

    /// The other agents a missing runner build is fetched from: the leader first (it has
    /// every build a job was registered with), then every other live agent by node name.
    pub(super) fn runner_peers(&self) -> crate::runner_store::PeerList {
        let (view, store, node) = (self.member.view(), self.store.clone(), self.node.clone());
        Arc::new(move || {
            let leader = view.borrow().leader.clone();
            let (store, node) = (store.clone(), node.clone());
            Box::pin(async move {
                let mut peers: Vec<String> = leader
                    .filter(|leader| leader.node != node)
                    .map(|leader| leader.api)
                    .into_iter()
                    .collect();
                let mut others = crate::cluster::live_records(&store)
                    .await
                    .unwrap_or_default();
                others.sort_by(|(a, _), (b, _)| a.node.cmp(&b.node));
                for (member, _) in others {
                    // Simulated nodes' members name an API under `.invalid`, which no one
                    // serves (RFC 6761): never asked.
                    let served = !member.api.contains(".invalid:");
                    if member.node != node && served && !peers.contains(&member.api) {
                        peers.push(member.api);
                    }
                }
                peers
            })
        })
    }

    /// The cluster's ACL tokens, on etcd: every agent reads and writes them itself.
    pub(super) fn acl_tokens(&self) -> Arc<dyn crate::acl::TokenStore> {
        Arc::new(crate::cluster::EtcdTokens::new(self.store.clone()))
    }

    /// Where this node's client fetches the checkpoints of allocs moved to it (drains).
    pub(super) fn checkpoint_source(
        &self,
        token: Option<String>,
        pool: AgentPool,
    ) -> crate::client::migrate::CheckpointSource {
        super::checkpoints::from_cluster(self.store.clone(), token, pool)
    }

    /// The builds the cluster's jobs name: the leader's server knows them and their allocs;
    /// another agent reads every job from etcd.
    pub(super) fn runner_builds(&self) -> super::runner_builds::ClusterBuilds {
        let (slot, store) = (self.slot.subscribe(), self.store.clone());
        Arc::new(move || {
            let (server, store) = (slot.borrow().clone(), store.clone());
            Box::pin(async move {
                if let Some(server) = server {
                    return super::runner_builds::server_builds_off_workers(server).await;
                }
                let (jobs, _) = store
                    .list(&crate::cluster::keys::jobs_prefix())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(jobs
                    .iter()
                    .filter_map(|kv| serde_json::from_slice::<serde_json::Value>(&kv.value).ok())
                    .filter_map(|job| job["spec"]["runner_sha256"].as_str().map(str::to_string))
                    .collect())
            })
        })
    }

    /// Stops scheduling and hands the leadership over.
    pub(super) async fn leave(self) {
        self.scheduling.abort();
        self.slot.send_replace(None);
        self.member.leave().await;
    }
}

/// This agent's id, made once and kept in its data dir: an agent restarted on its data dir
/// is the same agent, whatever address it listens on.
fn agent_id(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join("cluster-agent-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => anyhow::bail!("cannot read {}: {error}", path.display()),
    }
    let id = uuid::Uuid::new_v4().to_string();
    std::fs::write(&path, &id)
        .map_err(|error| anyhow::anyhow!("cannot write {}: {error}", path.display()))?;
    Ok(id)
}

/// Refuses to join as a node that another live agent already is: two agents running one
/// node's allocs would run each of them twice. The same agent back within its TTL (a
/// restart on its data dir) is not another: returns the lease its previous run held.
async fn previous_run_or_namesake(
    store: &EtcdStore,
    record: &MemberRecord,
    ttl: Duration,
) -> anyhow::Result<Option<i64>> {
    let live = crate::cluster::live_records(store).await?;
    if let Some((other, _)) = live
        .iter()
        .find(|(live, _)| live.node == record.node && live.agent != record.agent)
    {
        anyhow::bail!(
            "node name {} is live in the cluster already, its agent at {}: give this agent              another --node-name, or stop that one and wait {}s for its lease to expire",
            record.node,
            crate::util::text::cut(&other.api, 64),
            ttl.as_secs()
        );
    }
    Ok(live
        .iter()
        .find(|(live, _)| live.node == record.node && live.agent == record.agent)
        .map(|(_, lease)| *lease))
}
