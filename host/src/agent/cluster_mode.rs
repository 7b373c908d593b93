//! The agent in cluster mode: its connection to etcd (the schema checked before anything
//! else), its membership (a lease, its node's live key, its campaign for the leadership),
//! the seam its client talks through, and the scheduler it runs while it leads.
//!
//! It wires [`crate::cluster`]'s parts together and decides nothing itself.

use super::cluster_config::ClusterConfig;
use super::http::forward::Forwarding;
use crate::cluster::{
    EtcdServerApi, EtcdStore, Member, MemberRecord, MemberView, SchedulerConfig, ServerSlot,
};
use crate::rpc::ServerApi;
use crate::server::{EmbeddedServer, ServerConfig};
use std::net::SocketAddr;
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
    slot: ServerSlot,
    scheduling: tokio::task::JoinHandle<()>,
}

impl ClusterMode {
    /// Connects to etcd, checks the schema, joins as `config.node_name` with its HTTP API at
    /// `api`, and starts scheduling whenever this agent wins the leadership.
    pub(super) async fn join(
        config: &ClusterConfig,
        server: &ServerConfig,
        api: SocketAddr,
    ) -> anyhow::Result<ClusterMode> {
        let store = EtcdStore::connect(&config.etcd_endpoints).await?;
        store.check_schema().await?;
        let member = Member::join(
            store.clone(),
            MemberRecord {
                node: config.node_name.clone(),
                api: format!("http://{api}"),
            },
            config.node_ttl,
        );
        let slot: ServerSlot = watch::channel(None).0;
        let scheduler = SchedulerConfig {
            server: server.clone(),
            node_ttl: config.node_ttl,
            gc_interval: SERVER_GC_INTERVAL,
        };
        let scheduling = tokio::spawn(schedule_while_leading(
            store.clone(),
            member.view(),
            scheduler,
            slot.clone(),
        ));
        tracing::info!(
            etcd = %store.endpoints(),
            node = %config.node_name,
            node_ttl = ?config.node_ttl,
            "joined the cluster"
        );
        Ok(ClusterMode {
            server_api: EtcdServerApi::new(store),
            member,
            slot,
            scheduling,
        })
    }

    /// The server answering here while this agent leads.
    pub(super) fn servers(&self) -> watch::Receiver<Option<Arc<EmbeddedServer>>> {
        self.slot.subscribe()
    }

    /// What the HTTP API forwards by.
    pub(super) fn forwarding(&self) -> Arc<Forwarding> {
        Arc::new(Forwarding::new(self.member.view()))
    }

    /// Stops scheduling and hands the leadership over.
    pub(super) async fn leave(self) {
        self.scheduling.abort();
        self.slot.send_replace(None);
        self.member.leave().await;
    }
}

/// Runs the scheduler each time this agent wins the leadership, until it loses it.
async fn schedule_while_leading(
    store: EtcdStore,
    mut view: watch::Receiver<MemberView>,
    config: SchedulerConfig,
    slot: ServerSlot,
) {
    loop {
        let Ok(fence) = view
            .wait_for(|v| v.leading.is_some())
            .await
            .map(|v| v.leading.clone())
        else {
            return;
        };
        let Some(fence) = fence else {
            continue;
        };
        let mut lost = view.clone();
        let held = fence.clone();
        let until = async move {
            let _ = lost
                .wait_for(|v| v.leading.as_ref() != Some(&held))
                .await
                .map(|_| ());
        };
        crate::cluster::lead(
            store.clone(),
            fence.clone(),
            config.clone(),
            slot.clone(),
            until,
        )
        .await;
        // Deposed by a failed save while the membership still says this agent leads: wait
        // for the membership to see it, rather than leading again on the same fence.
        let _ = view
            .wait_for(|v| v.leading.as_ref() != Some(&fence))
            .await
            .map(|_| ());
    }
}
