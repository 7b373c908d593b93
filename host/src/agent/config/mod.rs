//! The agent's configuration: a TOML file with Nomad's knob names, overridden by flags.
//!
//! ```toml
//! data_dir = "./caravan-data"
//! bind = "127.0.0.1:4646"
//! log_level = "info"
//! log_json = false
//! acl_token = "secret"            # deprecated: a management token (with [acl]) or the one
//!                                 # token writes need (without)
//!
//! [acl]                           # ACL tokens with roles (see `crate::acl`)
//! enabled = true                  # every request but public ones then needs a token
//!
//! [client]
//! enabled = true                  # false: run no allocs here, only schedule (single agent)
//! gc_interval = "1m"
//! gc_max_allocs = 50
//! gc_parallel_destroys = 2
//! gc_disk_usage_threshold = 80
//! gc_inode_usage_threshold = 70
//! max_live_allocs = 1000          # sizes the sandbox pool (about 42 KiB each when live)
//! runner_gc_grace = "1h"          # a runner build no job uses is removed after this long
//! insecure_registries = []        # OCI registries (HOST:PORT) spoken to over plain HTTP
//!
//! [client.limits]                 # every alloc's limits unless its job sets them: the keys
//! memory = "64MiB"                # of [job.limits] (crate::model::limits has them all)
//! cpu = "60s"
//! kill_timeout = "5s"
//! disk = "1GiB"                   # what an alloc directory may hold
//!
//! [client.limit_caps]             # the most a job may ask for; more is refused at submit
//! memory = "1GiB"
//! cpu = "1h"
//! kill_timeout = "30s"
//! disk = "10GiB"
//!
//! [client.capabilities]           # what jobs may ask for beyond /alloc; nothing by default
//! network = ["10.0.0.5:5432", "10.0.0.6"]     # IP:PORT, or an IP for all its ports
//! volumes = { shared = "/srv/caravan/shared" } # mounted read-only where a job asks
//!
//! [server]
//! job_gc_threshold = "4h"
//! reschedule_limit = 3               # a service job's reschedule attempts when it states none
//! node_ttl = "30s"                # a node with no watch open this long is down (nodesim's)
//!
//! [tls]                           # optional: HTTPS only, certificates (see `tls`)
//! http = true
//! ca_file = "caravan-agent-ca.pem"
//! cert_file = "global-server-caravan.pem"
//! key_file = "global-server-caravan-key.pem"
//! verify_https_client = true
//!
//! [telemetry]
//! collection_interval = "5s"      # how often the web UI's plots are sampled (100ms to 1h)
//! otlp_endpoint = "http://127.0.0.1:4318"  # optional: spans and metrics to this collector
//!
//! [audit]                         # optional: each operator's write as a JSON line here too
//! path = "/var/log/caravan/audit.log"
//!
//! [cluster]                       # optional: many agents, one cluster (docs/cluster.md)
//! mode = "etcd"                   # "embedded" (the default) or "etcd"
//! etcd_endpoints = ["http://127.0.0.1:2379", "http://127.0.0.1:22379"]  # every member
//! node_name = "node-1"            # default: the host's name
//! node_ttl = "10s"                # a node silent this long is down (at least 2s)
//! advertise = "http://10.0.0.11:4646"  # where other agents reach this API (default: bind)
//! etcd_ca_file = "ca.pem"         # https:// endpoints; etcd_cert_file, etcd_key_file,
//! etcd_username = "caravan"       # etcd_password_file: see `etcd_security`
//! ```
//!
//! An unknown key or a bad value is an error naming the key and the form expected.
//!
//! [`AgentFlags`] holds what `caravan agent` was given on the command line, and
//! [`AgentFlags::load`] merges it over the file: a flag given wins, a flag left out keeps the
//! file's value, and the file's value wins over the default. This module only turns text into
//! an [`AgentConfig`]; it starts nothing and knows nothing of clap.

use crate::client::gc::GcConfig;
use crate::model::capabilities::CapabilityPolicy;
use crate::model::limits::{LimitCaps, LimitError, LimitOverrides, Limits, RawLimits};
use crate::server::ServerConfig;
use crate::util::units::parse_duration;
use serde::Deserialize;
use serde::de::IgnoredAny;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// What `caravan agent` was given on the command line (and the global log flags): each
/// overrides the config file when given.
#[derive(Debug, Clone, Default)]
pub struct AgentFlags {
    /// `--config`: the TOML file to read first.
    pub config_file: Option<PathBuf>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--bind`, as typed.
    pub bind: Option<String>,
    /// `--dev`: can turn dev mode on, never off.
    pub dev: bool,
    /// `--acl-token`: an empty token counts as not given.
    pub acl_token: Option<String>,
    /// `--acl-enabled`: can turn ACLs on, never off.
    pub acl_enabled: bool,
    /// `--log-level`.
    pub log_level: Option<String>,
    /// `--log-json`: can turn JSON lines on, never off.
    pub log_json: bool,
    /// `--cluster`: `embedded` or `etcd`.
    pub cluster: Option<String>,
    /// `--etcd-endpoints`, comma-separated.
    pub etcd_endpoints: Option<String>,
    /// `--node-name`.
    pub node_name: Option<String>,
    /// `--advertise`.
    pub advertise: Option<String>,
    /// `--cache-dir` (or `CARAVAN_CACHE_DIR`, or the shared cache the CLI found).
    pub cache_dir: Option<PathBuf>,
}

impl AgentFlags {
    /// Reads the config file named by `--config`, if any, over the defaults, then lays the
    /// flags over the result.
    pub fn load(self) -> Result<AgentConfig, ConfigError> {
        let mut config = AgentConfig::default();
        if let Some(path) = &self.config_file {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
                path: name.clone(),
                error,
            })?;
            apply_file(&mut config, &name, &text)?;
        }
        self.apply(&mut config)?;
        config.cluster = config.cluster_settings.resolve()?;
        if !config.client_enabled && config.cluster.is_some() {
            return Err(ConfigError::ClientNeededInCluster);
        }
        if config.acl_enabled && config.cluster.is_some() && config.tls.is_none() {
            return Err(ConfigError::AclNeedsTlsInCluster);
        }
        Ok(config)
    }

    /// Lays the flags over `config`: a flag given wins, a flag left out keeps what is there.
    /// The config file named in the flags is not read here (see [`AgentFlags::load`]).
    pub fn apply(self, config: &mut AgentConfig) -> Result<(), ConfigError> {
        if let Some(dir) = self.data_dir {
            config.data_dir = dir;
        }
        if let Some(dir) = self.cache_dir {
            config.cache_dir = Some(dir);
        }
        if let Some(bind) = self.bind {
            config.bind = parse_bind(&bind).map_err(ConfigError::FlagBind)?;
        }
        config.dev |= self.dev;
        config.acl_enabled |= self.acl_enabled;
        if let Some(token) = self.acl_token.filter(|t| !t.is_empty()) {
            config.acl_token = Some(token);
        }
        if let Some(level) = self.log_level {
            config.log_level = level;
        }
        config.log_json |= self.log_json;
        let cluster = &mut config.cluster_settings;
        if let Some(mode) = self.cluster {
            cluster.mode = Some((mode, "--cluster".into()));
        }
        if let Some(endpoints) = self.etcd_endpoints {
            cluster.etcd_endpoints = Some((
                endpoints.split(',').map(|e| e.trim().to_string()).collect(),
                "--etcd-endpoints".into(),
            ));
        }
        if let Some(name) = self.node_name {
            cluster.node_name = Some((name, "--node-name".into()));
        }
        if let Some(url) = self.advertise {
            cluster.advertise = Some((url, "--advertise".into()));
        }
        Ok(())
    }
}

/// Everything the agent needs, file and flags merged.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Where state and alloc directories live.
    pub data_dir: PathBuf,
    /// Where compiled components are kept; `None`: `cache` under `data_dir`. The `caravan
    /// agent` command gives the cache `caravan run` and `runner check` share.
    pub cache_dir: Option<PathBuf>,
    /// Where the HTTP API listens.
    pub bind: SocketAddr,
    /// A fresh temporary data dir, destroyed with everything in it on exit.
    pub dev: bool,
    /// Log level or filter.
    pub log_level: String,
    /// JSON log lines.
    pub log_json: bool,
    /// The shared token of earlier releases (`acl_token`): with ACLs on, a management
    /// token; without, the token every write needs.
    pub acl_token: Option<String>,
    /// `[acl] enabled`: ACL tokens with roles; every request but public ones needs one.
    pub acl_enabled: bool,
    /// The garbage collector's knobs.
    pub gc: GcConfig,
    /// How long a runner build no job uses stays in the runner store (`client.runner_gc_grace`).
    pub runner_gc_grace: std::time::Duration,
    /// OCI registries (`HOST:PORT`) reached over plain HTTP rather than HTTPS
    /// (`client.insecure_registries`).
    pub insecure_registries: Vec<String>,
    /// Default limits for every alloc.
    pub limits: Limits,
    /// The most a job may ask for, per limit.
    pub limit_caps: LimitCaps,
    /// What jobs may ask to reach beyond their alloc directory.
    pub capabilities: CapabilityPolicy,
    /// The embedded server's knobs.
    pub server: ServerConfig,
    /// How many allocs may run at once on this node: sizes the runtime's instance pool.
    pub max_live_allocs: u32,
    /// `[client] node_class`, `node_pool` and `[client.meta]`: what the node says it is,
    /// for job constraints.
    pub node_class: String,
    /// See `node_class`.
    pub node_pool: String,
    /// See `node_class`.
    pub node_meta: BTreeMap<String, String>,
    /// `[client] memory_total`: the memory allocs may reserve before `reserved_memory` is
    /// taken off (`None`: a share of the machine's, see [`AgentConfig::node_info`]).
    pub memory_total: Option<u64>,
    /// `[client.reserved] memory`: memory kept back from allocs.
    pub reserved_memory: u64,
    /// Whether the agent runs a client node of its own (`client.enabled`, default true). A
    /// single agent without one only schedules, for nodes elsewhere (`caravan nodesim`).
    pub client_enabled: bool,
    /// The cluster's region (`region`, default `global`): names its agents' certificates.
    pub region: String,
    /// `[tls]`: HTTPS on the API and TLS to other agents; `None` for plain HTTP.
    pub tls: Option<tls::AgentTls>,
    /// `[audit] path`: a file each operator's write is also appended to, as a JSON line.
    pub audit_path: Option<PathBuf>,
    /// `[telemetry] collection_interval`: how often the agent samples the series its web UI
    /// plots (each alloc's CPU and memory, each job's allocs).
    pub collection_interval: std::time::Duration,
    /// `[telemetry] otlp_endpoint`: the OTLP/HTTP collector the agent's spans and metrics
    /// are sent to, every `collection_interval` (none: no export).
    pub otlp_endpoint: Option<String>,
    /// Cluster mode on etcd; `None` for the single-node embedded mode.
    pub cluster: Option<super::cluster_config::ClusterConfig>,
    /// The cluster settings as given, file then flags, each with where it came from.
    pub cluster_settings: super::cluster_config::ClusterSettings,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            data_dir: PathBuf::from("./caravan-data"),
            cache_dir: None,
            bind: SocketAddr::from(([127, 0, 0, 1], 4646)),
            dev: false,
            log_level: "info".into(),
            log_json: false,
            acl_token: None,
            acl_enabled: false,
            gc: GcConfig::default(),
            runner_gc_grace: crate::runner_store::gc::DEFAULT_GRACE,
            insecure_registries: Vec::new(),
            limits: Limits::default(),
            limit_caps: LimitCaps::default(),
            capabilities: CapabilityPolicy::default(),
            server: ServerConfig::default(),
            max_live_allocs: 1_000,
            node_class: String::new(),
            node_pool: crate::model::node::DEFAULT_POOL.into(),
            node_meta: BTreeMap::new(),
            memory_total: None,
            reserved_memory: 0,
            client_enabled: true,
            region: crate::tls::DEFAULT_REGION.into(),
            tls: None,
            audit_path: None,
            collection_interval: crate::agent::series::SAMPLE_INTERVAL,
            otlp_endpoint: None,
            cluster: None,
            cluster_settings: Default::default(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    bind: Option<String>,
    log_level: Option<String>,
    log_json: Option<bool>,
    acl_token: Option<String>,
    acl: Option<AclSection>,
    region: Option<String>,
    tls: Option<tls::TlsSection>,
    audit: Option<AuditSection>,
    telemetry: Option<telemetry::TelemetrySection>,
    #[serde(default)]
    client: ClientSection,
    #[serde(default)]
    server: server::ServerSection,
    cluster: Option<super::cluster_config::ClusterSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientSection {
    enabled: Option<bool>,
    gc_interval: Option<String>,
    gc_max_allocs: Option<usize>,
    gc_parallel_destroys: Option<i64>,
    gc_disk_usage_threshold: Option<f64>,
    gc_inode_usage_threshold: Option<f64>,
    runner_gc_grace: Option<String>,
    insecure_registries: Option<Vec<String>>,
    /// `[client.limits]`: the defaults for every alloc, the keys of `[job.limits]`.
    #[serde(default)]
    limits: RawLimits,
    // Where the limit defaults were before `[client.limits]`: read only to say where they went,
    // so an operator's old file gets that line rather than "unknown field".
    memory: Option<IgnoredAny>,
    cpu: Option<IgnoredAny>,
    wall_time: Option<IgnoredAny>,
    kill_timeout: Option<IgnoredAny>,
    log_rate: Option<IgnoredAny>,
    disk: Option<IgnoredAny>,
    /// `[client.limit_caps]`: the most a job may ask, the same keys.
    #[serde(default)]
    limit_caps: RawLimits,
    max_live_allocs: Option<u32>,
    capabilities: Option<CapabilitiesSection>,
    node_class: Option<String>,
    node_pool: Option<String>,
    meta: Option<BTreeMap<String, String>>,
    memory_total: Option<String>,
    reserved: Option<node::ReservedSection>,
}

impl ClientSection {
    /// The first limit key set where it was before `[client.limits]`, if any.
    fn moved_limit_key(&self) -> Option<&'static str> {
        [
            ("memory", &self.memory),
            ("cpu", &self.cpu),
            ("wall_time", &self.wall_time),
            ("kill_timeout", &self.kill_timeout),
            ("log_rate", &self.log_rate),
            ("disk", &self.disk),
        ]
        .into_iter()
        .find_map(|(key, value)| value.is_some().then_some(key))
    }
}

/// `[acl]`: ACL tokens with roles (Nomad's block, its `enabled` key).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AclSection {
    enabled: Option<bool>,
}

/// `[audit]`: where the audit trail is also written (Nomad's block, its file sink only).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditSection {
    path: Option<PathBuf>,
}

/// `[client.capabilities]`: see [`CapabilityPolicy::parse`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CapabilitiesSection {
    #[serde(default)]
    network: Vec<String>,
    #[serde(default)]
    volumes: BTreeMap<String, PathBuf>,
}

/// Parses a config file's text into `config`, keeping what the file leaves out. `path` names
/// the file in errors.
pub fn apply_file(config: &mut AgentConfig, path: &str, text: &str) -> Result<(), ConfigError> {
    let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
        path: path.into(),
        message: e.message().trim().into(),
    })?;
    let unit = |key: &'static str| {
        move |problem| ConfigError::Unit {
            path: path.into(),
            key,
            problem,
        }
    };
    let out_of_range = |key: &'static str, expected: String| ConfigError::OutOfRange {
        path: path.into(),
        key,
        expected,
    };
    let duration = |key: &'static str, value: &str| parse_duration(value).map_err(unit(key));
    if let Some(dir) = file.data_dir {
        config.data_dir = dir;
    }
    if let Some(bind) = file.bind {
        config.bind = parse_bind(&bind).map_err(|problem| ConfigError::FileBind {
            path: path.into(),
            problem,
        })?;
    }
    if let Some(level) = file.log_level {
        config.log_level = level;
    }
    if let Some(json) = file.log_json {
        config.log_json = json;
    }
    if let Some(token) = file.acl_token.filter(|t| !t.is_empty()) {
        config.acl_token = Some(token);
    }
    if let Some(enabled) = file.acl.and_then(|acl| acl.enabled) {
        config.acl_enabled = enabled;
    }
    let client = file.client;
    if let Some(key) = client.moved_limit_key() {
        return Err(ConfigError::Limit {
            path: path.into(),
            field: format!("client.{key}"),
            problem: format!(
                "moved to [client.limits] (the keys of [job.limits]): write {key} there"
            ),
        });
    }
    if let Some(v) = client.gc_interval {
        config.gc.interval = duration("client.gc_interval", &v)?;
        if config.gc.interval.is_zero() {
            return Err(out_of_range(
                "client.gc_interval",
                "must be longer than 0".into(),
            ));
        }
    }
    if let Some(v) = client.runner_gc_grace {
        config.runner_gc_grace = duration("client.runner_gc_grace", &v)?;
    }
    if let Some(registries) = client.insecure_registries {
        config.insecure_registries = registries;
    }
    if let Some(v) = client.gc_max_allocs {
        config.gc.max_allocs = v;
    }
    if let Some(v) = client.gc_parallel_destroys {
        config.gc.parallel_destroys = v;
    }
    for (key, value, target) in [
        (
            "client.gc_disk_usage_threshold",
            client.gc_disk_usage_threshold,
            &mut config.gc.disk_usage_threshold,
        ),
        (
            "client.gc_inode_usage_threshold",
            client.gc_inode_usage_threshold,
            &mut config.gc.inode_usage_threshold,
        ),
    ] {
        if let Some(percent) = value {
            if !(0.0..=100.0).contains(&percent) {
                return Err(out_of_range(
                    key,
                    format!("{percent} is not a percentage from 0 to 100"),
                ));
            }
            *target = percent;
        }
    }
    if let Some(enabled) = client.enabled {
        config.client_enabled = enabled;
    }
    if let Some(v) = client.max_live_allocs {
        if v == 0 {
            return Err(out_of_range(
                "client.max_live_allocs",
                "must be above 0".into(),
            ));
        }
        config.max_live_allocs = v;
    }
    node::read_keys(
        config,
        path,
        node::NodeKeys {
            class: client.node_class,
            pool: client.node_pool,
            meta: client.meta,
            memory_total: client.memory_total,
            reserved: client.reserved,
        },
    )?;
    let section = |key: &'static str| {
        move |e: LimitError| ConfigError::Limit {
            path: path.into(),
            field: e.field(key),
            problem: e.problem(),
        }
    };
    let defaults = LimitOverrides::from_raw(&client.limits).map_err(section("client.limits"))?;
    config.limits = config.limits.with_overrides(&defaults);
    let caps =
        LimitOverrides::from_raw(&client.limit_caps).map_err(section("client.limit_caps"))?;
    if caps.wall_time.is_some() {
        return Err(out_of_range(
            "client.limit_caps.wall_time",
            "wall_time has no cap (a runner that waits costs no CPU)".into(),
        ));
    }
    config.limit_caps = config.limit_caps.with_overrides(&caps);
    // The agent's own defaults must be something a job could ask for, and must agree.
    if let Err(over) = config.limit_caps.check(&config.limits.as_overrides()) {
        return Err(ConfigError::Limit {
            path: path.into(),
            field: format!("client.limits.{}", over.key),
            problem: format!(
                "at most client.limit_caps.{} ({}), not {}",
                over.key, over.cap, over.asked
            ),
        });
    }
    if let Some(conflict) = config.limits.conflict() {
        return Err(ConfigError::Limit {
            path: path.into(),
            field: "client.limits".into(),
            problem: conflict,
        });
    }
    if let Some(offer) = client.capabilities {
        config.capabilities =
            CapabilityPolicy::parse(&offer.network, &offer.volumes).map_err(|problem| {
                ConfigError::Capability {
                    path: path.into(),
                    problem,
                }
            })?;
    }
    file.server.read_into(config, path)?;
    tls::read(config, path, file.region, file.tls)?;
    if let Some(telemetry) = file.telemetry {
        telemetry.read_into(config, path)?;
    }
    if let Some(audit) = file.audit {
        config.audit_path = audit.path;
    }
    if let Some(cluster) = file.cluster {
        config.cluster_settings.read_file(path, cluster)?;
    }
    Ok(())
}

/// Parses a listen address: `HOST:PORT`.
pub fn parse_bind(text: &str) -> Result<SocketAddr, BindError> {
    text.parse().map_err(|_| BindError { text: text.into() })
}

mod error;
mod node;
mod server;
mod telemetry;
pub mod tls;

pub use error::{BindError, ConfigError};
pub use node::DEFAULT_MEMORY_SHARE_PERCENT;

#[cfg(test)]
mod tests;
