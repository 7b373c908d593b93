//! `caravan agent`: its flags, and the agent's life from start to a stop on Ctrl-C or
//! SIGTERM.
//!
//! The flags are merged over the config file by [`crate::agent::config::AgentFlags`], and
//! the agent is [`crate::agent::Agent`]; this module only wires them to the process's
//! signals and must not configure or build any part of the agent itself.

use super::GlobalArgs;
use crate::agent::Agent;
use crate::agent::config::AgentFlags;
use crate::shutdown::Shutdown;
use anyhow::bail;
use std::path::PathBuf;
use std::process::ExitCode;

/// `caravan agent`'s flags.
#[derive(Debug, clap::Args)]
pub struct AgentCommand {
    /// A TOML config file (its keys: docs/operating.md).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where state and alloc directories live (default ./caravan-data).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Where the HTTP API listens (default 127.0.0.1:4646).
    #[arg(long, env = "CARAVAN_BIND", value_name = "HOST:PORT")]
    bind: Option<String>,
    /// Use a fresh temporary data dir and destroy everything on exit.
    #[arg(long)]
    dev: bool,
    /// Deprecated: a management token with ACLs on; without them, the one token every
    /// write needs.
    #[arg(long, env = "CARAVAN_ACL_TOKEN", value_name = "TOKEN")]
    acl_token: Option<String>,
    /// Turn ACL tokens with roles on (`[acl] enabled = true`): every request but public
    /// ones then needs a token; `caravan acl bootstrap` makes the first.
    #[arg(long)]
    acl_enabled: bool,
    /// `etcd` to join a cluster whose state lives in etcd; `embedded` (the default) runs
    /// one node with its own server (docs/cluster.md).
    #[arg(long, value_name = "MODE")]
    cluster: Option<String>,
    /// Every etcd member's client URL, comma-separated (cluster mode).
    #[arg(long, value_name = "URL,URL,...")]
    etcd_endpoints: Option<String>,
    /// This node's name in the cluster (default: the host's name).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// The URL other agents reach this agent's API at (cluster mode; default: the bind
    /// address, which must then not be 0.0.0.0).
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// Keep compiled components here (default: the cache `caravan run` and `runner check`
    /// share, ~/.cache/caravan/components).
    #[arg(long, env = "CARAVAN_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

impl AgentCommand {
    /// Starts the agent and runs it until the first Ctrl-C or SIGTERM, then stops it and
    /// exits 0. Errors (a bad config, an agent that cannot start) exit 2 through the caller.
    pub async fn execute(self, global: &GlobalArgs) -> anyhow::Result<ExitCode> {
        let config = AgentFlags {
            config_file: self.config,
            data_dir: self.data_dir,
            bind: self.bind,
            dev: self.dev,
            acl_token: self.acl_token,
            acl_enabled: self.acl_enabled,
            cluster: self.cluster,
            etcd_endpoints: self.etcd_endpoints,
            node_name: self.node_name,
            advertise: self.advertise,
            cache_dir: self
                .cache_dir
                .or_else(crate::runtime::component::disk_cache::shared_dir),
            log_level: global.log_level.clone(),
            log_json: global.log_json,
        }
        .load()?;
        let otlp = config
            .otlp_endpoint
            .clone()
            .map(|endpoint| crate::telemetry::OtlpSettings {
                endpoint,
                interval: config.collection_interval,
                instance: config
                    .cluster
                    .as_ref()
                    .map_or(crate::agent::LOCAL_NODE, |cluster| &cluster.node_name)
                    .to_string(),
            });
        crate::telemetry::init_exporting(&config.log_level, config.log_json, otlp.as_ref())?;
        let shutdown = Shutdown::new();
        // Before the agent starts: a signal while it restores its allocs stops it as soon
        // as it is up, rather than killing the process half-way.
        shutdown.on_signals()?;
        let mut stop = shutdown.listener();
        let agent = Agent::start(config).await?;
        stop.stopping().await;
        tracing::info!("interrupted: stopping the agent (press Ctrl-C again to stop waiting)");
        tokio::select! {
            _ = agent.stop() => Ok(ExitCode::SUCCESS),
            _ = stop.abandoning() => {
                bail!("interrupted again: stopped without waiting for the allocs to stop")
            }
        }
    }
}
