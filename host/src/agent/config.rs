//! The agent's configuration: a TOML file with Nomad's knob names, overridden by flags.
//!
//! ```toml
//! data_dir = "./caravan-data"
//! bind = "127.0.0.1:4646"
//! log_level = "info"
//! log_json = false
//! acl_token = "secret"            # optional: every write then needs it as a bearer token
//!
//! [client]
//! gc_interval = "1m"
//! gc_max_allocs = 50
//! gc_parallel_destroys = 2
//! gc_disk_usage_threshold = 80
//! gc_inode_usage_threshold = 70
//! memory = "64MiB"                # runner limit defaults
//! cpu = "60s"
//! kill_timeout = "5s"
//! log_rate = 1000
//! max_live_allocs = 1000          # sizes the sandbox pool (about 42 KiB each when live)
//!
//! [server]
//! job_gc_threshold = "4h"
//! restart_limit = 3
//! ```
//!
//! An unknown key or a bad value is an error naming the key and the form expected.

use crate::client::gc::GcConfig;
use crate::server::ServerConfig;
use crate::structs::Limits;
use crate::units::{parse_bytes, parse_duration};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything the agent needs, file and flags merged.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Where state and alloc directories live.
    pub data_dir: PathBuf,
    /// Where the HTTP API listens.
    pub bind: SocketAddr,
    /// A fresh temporary data dir, destroyed with everything in it on exit.
    pub dev: bool,
    /// Log level or filter.
    pub log_level: String,
    /// JSON log lines.
    pub log_json: bool,
    /// When set, every write request needs `Authorization: Bearer <token>`.
    pub acl_token: Option<String>,
    /// The garbage collector's knobs.
    pub gc: GcConfig,
    /// Default limits for every alloc.
    pub limits: Limits,
    /// The embedded server's knobs.
    pub server: ServerConfig,
    /// How many allocs may run at once on this node: sizes the runtime's instance pool.
    pub max_live_allocs: u32,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            data_dir: PathBuf::from("./caravan-data"),
            bind: SocketAddr::from(([127, 0, 0, 1], 4646)),
            dev: false,
            log_level: "info".into(),
            log_json: false,
            acl_token: None,
            gc: GcConfig::default(),
            limits: Limits::default(),
            server: ServerConfig::default(),
            max_live_allocs: 1_000,
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
    #[serde(default)]
    client: ClientSection,
    #[serde(default)]
    server: ServerSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientSection {
    gc_interval: Option<String>,
    gc_max_allocs: Option<usize>,
    gc_parallel_destroys: Option<i64>,
    gc_disk_usage_threshold: Option<f64>,
    gc_inode_usage_threshold: Option<f64>,
    memory: Option<String>,
    cpu: Option<String>,
    wall_time: Option<String>,
    kill_timeout: Option<String>,
    log_rate: Option<u32>,
    max_live_allocs: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerSection {
    job_gc_threshold: Option<String>,
    restart_limit: Option<u32>,
}

/// Parses a config file's text into `config`, keeping what the file leaves out.
pub fn apply_file(config: &mut AgentConfig, path: &str, text: &str) -> Result<(), String> {
    let file: FileConfig =
        toml::from_str(text).map_err(|e| format!("{path}: {}", e.message().trim()))?;
    let bad = |key: &str, e: String| format!("{path}: {key}: {e}");
    let duration = |key: &str, value: &str| parse_duration(value).map_err(|e| bad(key, e));
    if let Some(dir) = file.data_dir {
        config.data_dir = dir;
    }
    if let Some(bind) = file.bind {
        config.bind = parse_bind(&bind).map_err(|e| bad("bind", e))?;
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
    let client = file.client;
    if let Some(v) = client.gc_interval {
        config.gc.interval = duration("client.gc_interval", &v)?;
        if config.gc.interval.is_zero() {
            return Err(bad("client.gc_interval", "must be longer than 0".into()));
        }
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
                return Err(bad(
                    key,
                    format!("{percent} is not a percentage from 0 to 100"),
                ));
            }
            *target = percent;
        }
    }
    if let Some(v) = client.memory {
        config.limits.memory_bytes = parse_bytes(&v).map_err(|e| bad("client.memory", e))?;
    }
    if let Some(v) = client.cpu {
        config.limits.cpu = duration("client.cpu", &v)?;
    }
    if let Some(v) = client.wall_time {
        config.limits.wall_time = Some(duration("client.wall_time", &v)?);
    }
    if let Some(v) = client.kill_timeout {
        config.limits.kill_timeout = duration("client.kill_timeout", &v)?;
    }
    if let Some(v) = client.log_rate {
        if v == 0 {
            return Err(bad("client.log_rate", "must be above 0".into()));
        }
        config.limits.log_lines_per_second = v;
    }
    if let Some(v) = client.max_live_allocs {
        if v == 0 {
            return Err(bad("client.max_live_allocs", "must be above 0".into()));
        }
        config.max_live_allocs = v;
    }
    if let Some(v) = file.server.job_gc_threshold {
        config.server.job_gc_threshold = duration("server.job_gc_threshold", &v)?;
    }
    if let Some(v) = file.server.restart_limit {
        config.server.restart_limit = v;
    }
    Ok(())
}

/// Parses `--bind`: `HOST:PORT`.
pub fn parse_bind(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not an address such as 127.0.0.1:4646"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_file_sets_nomads_knobs_and_keeps_the_rest() {
        let mut config = AgentConfig::default();
        let text = "bind = \"127.0.0.1:0\"\n[client]\ngc_max_allocs = 10\ngc_interval = \"30s\"\nmemory = \"32MiB\"\n[server]\njob_gc_threshold = \"1h\"\n";
        apply_file(&mut config, "agent.toml", text).unwrap();
        assert_eq!(config.gc.max_allocs, 10);
        assert_eq!(config.gc.interval, Duration::from_secs(30));
        assert_eq!(
            config.gc.parallel_destroys, 2,
            "unset keys keep their defaults"
        );
        assert_eq!(config.limits.memory_bytes, 32 << 20);
        assert_eq!(config.server.job_gc_threshold, Duration::from_secs(3600));
        assert_eq!(config.bind.port(), 0);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let error =
            |text: &str| apply_file(&mut AgentConfig::default(), "agent.toml", text).unwrap_err();
        assert!(error("[client]\ngc_max_alloc = 3\n").contains("gc_max_alloc"));
        assert!(error("[client]\ngc_interval = \"soon\"\n").contains("client.gc_interval"));
        assert!(
            error("[client]\ngc_disk_usage_threshold = 120.0\n")
                .contains("client.gc_disk_usage_threshold")
        );
        assert!(error("bind = \"everywhere\"\n").contains("bind"));
        assert!(error("[client]\ngc_max_allocs = \"many\"\n").starts_with("agent.toml: "));
    }
}
