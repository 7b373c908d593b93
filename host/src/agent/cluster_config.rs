//! The `[cluster]` block and the cluster flags: which mode the agent runs in, and, in
//! cluster mode, where etcd is and what this node is called.
//!
//! Settings are gathered as given (the file first, then the flags over it, each value
//! remembering where it came from) and resolved once at the end, so that a message names
//! the key or flag that is at fault and a flag can fix a bad file value. It starts nothing.

use super::config::ConfigError;
use crate::cluster::DEFAULT_COMPACT_INTERVAL;
use crate::cluster::keys::valid_node_name;
use crate::util::units::parse_duration;
use serde::Deserialize;
use std::time::Duration;

/// The default lease TTL of a node: a node silent this long is down.
pub const DEFAULT_NODE_TTL: Duration = Duration::from_secs(10);

/// etcd's floor for a lease TTL.
pub const MIN_NODE_TTL: Duration = Duration::from_secs(2);

/// The shortest time between two compactions of etcd's history: each keeps one interval of
/// history, and a watch resuming after a member's death (well under a second) must find it.
pub const MIN_COMPACT_INTERVAL: Duration = Duration::from_secs(1);

/// Cluster mode, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Every etcd member's client URL.
    pub etcd_endpoints: Vec<String>,
    /// This agent's node name: unique in the cluster.
    pub node_name: String,
    /// The node's lease TTL.
    pub node_ttl: Duration,
    /// The URL other agents reach this one's API at, when it is not the bind address.
    pub advertise: Option<String>,
    /// How often the leader compacts etcd's history (`None`: never, `compact_interval =
    /// "0s"`, for an etcd run with its own `--auto-compaction-retention`).
    pub compact_interval: Option<Duration>,
    /// TLS to etcd and the etcd user, as configured (read when the agent joins).
    pub etcd_security: super::etcd_security::EtcdSecurity,
}

/// `[cluster]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClusterSection {
    mode: Option<String>,
    etcd_endpoints: Option<Vec<String>>,
    node_name: Option<String>,
    node_ttl: Option<String>,
    advertise: Option<String>,
    compact_interval: Option<String>,
    etcd_ca_file: Option<std::path::PathBuf>,
    etcd_cert_file: Option<std::path::PathBuf>,
    etcd_key_file: Option<std::path::PathBuf>,
    etcd_username: Option<String>,
    etcd_password_file: Option<std::path::PathBuf>,
}

/// The cluster settings as given, each value with the key or flag it came from.
#[derive(Debug, Clone, Default)]
pub struct ClusterSettings {
    pub(super) mode: Option<(String, String)>,
    pub(super) etcd_endpoints: Option<(Vec<String>, String)>,
    pub(super) node_name: Option<(String, String)>,
    pub(super) node_ttl: Option<Duration>,
    pub(super) advertise: Option<(String, String)>,
    pub(super) compact_interval: Option<Duration>,
    pub(super) etcd_security: super::etcd_security::EtcdSecurity,
}

impl ClusterSettings {
    pub(super) fn read_file(
        &mut self,
        path: &str,
        section: ClusterSection,
    ) -> Result<(), ConfigError> {
        let at = |key: &str| format!("{path}: cluster.{key}");
        if let Some(mode) = section.mode {
            self.mode = Some((mode, at("mode")));
        }
        if let Some(endpoints) = section.etcd_endpoints {
            self.etcd_endpoints = Some((endpoints, at("etcd_endpoints")));
        }
        if let Some(name) = section.node_name {
            self.node_name = Some((name, at("node_name")));
        }
        if let Some(url) = section.advertise {
            self.advertise = Some((url, at("advertise")));
        }
        let security = &mut self.etcd_security;
        let file = |key: &str, value: Option<std::path::PathBuf>| {
            value.map(|file| crate::tls::PemFile::new(&at(key), file))
        };
        security.ca = file("etcd_ca_file", section.etcd_ca_file).or(security.ca.take());
        security.cert = file("etcd_cert_file", section.etcd_cert_file).or(security.cert.take());
        security.key = file("etcd_key_file", section.etcd_key_file).or(security.key.take());
        if let Some(name) = section.etcd_username {
            security.username = Some((name, at("etcd_username")));
        }
        if let Some(file) = section.etcd_password_file {
            security.password_file = Some((file, at("etcd_password_file")));
        }
        if let Some(ttl) = section.node_ttl {
            let ttl = parse_duration(&ttl).map_err(|problem| {
                ConfigError::Cluster(format!("{}: {problem}", at("node_ttl")))
            })?;
            if ttl < MIN_NODE_TTL {
                return Err(ConfigError::Cluster(format!(
                    "{}: at least {}s (etcd's shortest lease), not {ttl:?}",
                    at("node_ttl"),
                    MIN_NODE_TTL.as_secs()
                )));
            }
            self.node_ttl = Some(ttl);
        }
        if let Some(interval) = section.compact_interval {
            let interval = parse_duration(&interval).map_err(|problem| {
                ConfigError::Cluster(format!("{}: {problem}", at("compact_interval")))
            })?;
            if !interval.is_zero() && interval < MIN_COMPACT_INTERVAL {
                return Err(ConfigError::Cluster(format!(
                    "{}: at least {}s (a resuming watch needs that much history), or \"0s\" \
                     to leave compaction to etcd, not {interval:?}",
                    at("compact_interval"),
                    MIN_COMPACT_INTERVAL.as_secs()
                )));
            }
            self.compact_interval = Some(interval);
        }
        Ok(())
    }

    /// Cluster mode as configured, or `None` for the embedded mode.
    pub fn resolve(&self) -> Result<Option<ClusterConfig>, ConfigError> {
        let bad = |at: &str, problem: String| Err(ConfigError::Cluster(format!("{at}: {problem}")));
        match &self.mode {
            None => {
                if let Some((_, at)) = &self.etcd_endpoints {
                    return bad(at, "needs cluster mode etcd (--cluster etcd)".into());
                }
                return Ok(None);
            }
            Some((mode, _)) if mode == "embedded" => return Ok(None),
            Some((mode, _)) if mode == "etcd" => {}
            Some((mode, at)) => {
                return bad(
                    at,
                    format!("{mode:?} is not a mode: \"embedded\" or \"etcd\""),
                );
            }
        }
        let Some((endpoints, at)) = &self.etcd_endpoints else {
            return Err(ConfigError::Cluster(
                "cluster mode etcd needs every etcd member's URL: --etcd-endpoints \
                 http://HOST:PORT,... (or cluster.etcd_endpoints)"
                    .into(),
            ));
        };
        if endpoints.iter().all(|e| e.is_empty()) {
            return bad(at, "names no endpoint".into());
        }
        if let Some(endpoint) = endpoints.iter().find(|e| !valid_api_url(e)) {
            return bad(
                at,
                format!(
                    "{endpoint:?} is not an etcd client URL such as http://127.0.0.1:2379 \
                     (https:// with cluster.etcd_ca_file)"
                ),
            );
        }
        self.etcd_security
            .check(endpoints, at)
            .map_err(ConfigError::Cluster)?;
        let node_name = match &self.node_name {
            Some((name, at)) => {
                if let Err(problem) = valid_node_name(name) {
                    return bad(at, problem);
                }
                name.clone()
            }
            None => host_name().ok_or_else(|| {
                ConfigError::Cluster(
                    "this host's name cannot be a node name: give one with --node-name".into(),
                )
            })?,
        };
        if let Some((url, at)) = &self.advertise
            && !valid_api_url(url)
        {
            return bad(
                at,
                format!(
                    "{url:?} is not a URL other agents can reach, such as http://10.0.0.11:4646 \
                     (https:// with [tls])"
                ),
            );
        }
        Ok(Some(ClusterConfig {
            etcd_endpoints: endpoints.clone(),
            node_name,
            node_ttl: self.node_ttl.unwrap_or(DEFAULT_NODE_TTL),
            advertise: self.advertise.as_ref().map(|(url, _)| url.clone()),
            compact_interval: match self.compact_interval {
                Some(interval) if interval.is_zero() => None,
                Some(interval) => Some(interval),
                None => Some(DEFAULT_COMPACT_INTERVAL),
            },
            etcd_security: self.etcd_security.clone(),
        }))
    }
}

/// `http://HOST:PORT` or `https://HOST:PORT`: an agent's API, as others dial it, or an etcd
/// member's client URL.
pub fn valid_api_url(url: &str) -> bool {
    url.strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .is_some_and(host_and_port)
}

fn host_and_port(rest: &str) -> bool {
    rest.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// The host's name, when it can be a node name.
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_string();
    valid_node_name(&name).ok().map(|()| name)
}
