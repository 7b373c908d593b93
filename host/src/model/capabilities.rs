//! Capabilities: what an alloc may reach beyond its own directory.
//!
//! A job asks for them (`[job.capabilities]`), the agent offers them
//! (`[client.capabilities]`), and an alloc gets what it asked only when all of it is offered.
//! Nothing is granted by default: no network, no host directory besides the alloc's own
//! `/alloc`, no environment variable (the agent's own environment is never passed on).
//!
//! - **network**: destinations as `IP:PORT`. The runner may connect to them (TCP) and
//!   exchange datagrams with them (UDP), nothing else: no listening, no name lookups. Host
//!   names are refused rather than resolved: a lookup the agent makes for a runner is a
//!   channel out of the node that no allow-list covers.
//! - **volumes**: host directories the operator names in the agent's config and a job mounts
//!   by name at a path of its choice, always read-only. A job never names a host path.
//! - **env**: variables the job sets for its runner. They carry only what the job's author
//!   wrote, so every agent allows them; they are bounded in number and size.
//!
//! A job asking for what the agent does not offer is refused at submit, naming the key; the
//! runtime checks again when the alloc starts (the agent's config may have changed since),
//! failing that alloc alone. This module is the data and the checks between the two sides;
//! it knows nothing of wasmtime (the runtime turns [`Grants`] into the sandbox's context).

use crate::util::text::cut;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// The most network destinations one job may name.
pub const MAX_NETWORK_DESTINATIONS: usize = 64;
/// The most volumes one job may mount.
pub const MAX_VOLUMES: usize = 16;
/// The most environment variables one job may set.
pub const MAX_ENV_VARS: usize = 128;
/// The most bytes of environment (names and values together) one job may set.
pub const MAX_ENV_BYTES: usize = 64 * 1024;

/// What a job asks for beyond its alloc directory. Empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Destinations the runner may connect to or exchange datagrams with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<SocketAddr>,
    /// Host volumes offered by the agent, mounted read-only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// Environment variables, in name order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

impl Capabilities {
    /// True when the job asks for nothing.
    pub fn is_empty(&self) -> bool {
        // Every field named: one added must be counted here, or a grant would skip it.
        let Capabilities {
            network,
            volumes,
            env,
        } = self;
        network.is_empty() && volumes.is_empty() && env.is_empty()
    }
}

/// One volume a job mounts: the agent's volume by name, at an absolute path in the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// Where the guest sees it, such as `/data`.
    pub path: String,
    /// The name the agent's config gives it.
    pub volume: String,
}

/// A capability asked or offered wrongly: the key at fault and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct CapabilityError {
    /// The key, as `job.capabilities.network[1]` or `client.capabilities.volumes.shared`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

fn refuse(key: impl Into<String>, message: impl Into<String>) -> CapabilityError {
    CapabilityError {
        key: key.into(),
        message: message.into(),
    }
}

/// Most of a job's own text (an address, a path, a name) quoted back in one problem.
const MAX_QUOTED_BYTES: usize = 64;

/// Checks a job's `[job.capabilities]` as written and returns them validated, or its first
/// problem (see [`parse_job_all`]). `volumes` maps guest paths to volume names and `env`
/// names to values, as in the file.
pub fn parse_job(
    network: &[String],
    volumes: &BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
) -> Result<Capabilities, CapabilityError> {
    parse_job_all(network, volumes, env).map_err(|mut problems| problems.remove(0))
}

/// [`parse_job`], with every problem of the block, in the order its keys are checked
/// (network, volumes, env), so that a job file's author sees them all at once.
pub fn parse_job_all(
    network: &[String],
    volumes: &BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
) -> Result<Capabilities, Vec<CapabilityError>> {
    const KEY: &str = "job.capabilities";
    let mut problems = Vec::new();
    let mut destinations = Vec::with_capacity(network.len().min(MAX_NETWORK_DESTINATIONS));
    if network.len() > MAX_NETWORK_DESTINATIONS {
        problems.push(refuse(
            format!("{KEY}.network"),
            format!(
                "{} destinations; at most {MAX_NETWORK_DESTINATIONS}",
                network.len()
            ),
        ));
    } else {
        for (i, entry) in network.iter().enumerate() {
            match parse_destination(entry) {
                Ok(addr) if !destinations.contains(&addr) => destinations.push(addr),
                Ok(_) => {}
                Err(message) => problems.push(refuse(format!("{KEY}.network[{i}]"), message)),
            }
        }
    }
    let mut mounts = Vec::with_capacity(volumes.len().min(MAX_VOLUMES));
    if volumes.len() > MAX_VOLUMES {
        problems.push(refuse(
            format!("{KEY}.volumes"),
            format!("{} volumes; at most {MAX_VOLUMES}", volumes.len()),
        ));
    } else {
        for (path, volume) in volumes {
            let key = format!("{KEY}.volumes.{:?}", cut(path, MAX_QUOTED_BYTES));
            match check_mount_path(path).and_then(|()| check_volume_name(volume)) {
                Ok(()) => mounts.push(VolumeMount {
                    path: path.clone(),
                    volume: volume.clone(),
                }),
                Err(message) => problems.push(refuse(key, message)),
            }
        }
    }
    let bytes: usize = env
        .iter()
        .map(|(name, value)| name.len() + value.len())
        .sum();
    if env.len() > MAX_ENV_VARS {
        problems.push(refuse(
            format!("{KEY}.env"),
            format!("{} variables; at most {MAX_ENV_VARS}", env.len()),
        ));
    } else if bytes > MAX_ENV_BYTES {
        problems.push(refuse(
            format!("{KEY}.env"),
            format!("{bytes} bytes of names and values; at most {MAX_ENV_BYTES}"),
        ));
    } else {
        for (name, value) in env {
            let key = format!("{KEY}.env.{:?}", cut(name, MAX_QUOTED_BYTES));
            let mut chars = name.chars();
            let portable = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !portable {
                problems.push(refuse(
                    key,
                    "a variable name is a letter or '_' followed by letters, digits or '_'",
                ));
            } else if value.contains('\0') {
                problems.push(refuse(key, "a value cannot hold a NUL character"));
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Capabilities {
        network: destinations,
        volumes: mounts,
        env: env.iter().map(|(n, v)| (n.clone(), v.clone())).collect(),
    })
}

/// `IP:PORT`, with a port and an address a packet can be sent to.
fn parse_destination(entry: &str) -> Result<SocketAddr, String> {
    let shown = cut(entry, MAX_QUOTED_BYTES);
    let addr: SocketAddr = entry.parse().map_err(|_| {
        format!(
            "{shown:?} is not an address such as 10.0.0.5:5432 or [fd00::5]:5432 \
             (host names are not resolved for runners)"
        )
    })?;
    if addr.port() == 0 {
        return Err(format!("{shown:?} has no port"));
    }
    if addr.ip().is_unspecified() || addr.ip().is_multicast() {
        return Err(format!("{shown:?} is not the address of one host"));
    }
    Ok(addr)
}

/// An absolute guest path of plain names, outside `/alloc`.
fn check_mount_path(path: &str) -> Result<(), String> {
    let plain = path.len() <= 256
        && path.starts_with('/')
        && path[1..]
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
        && !path.chars().any(char::is_control);
    if !plain {
        return Err(
            "the mount path is an absolute path of plain names, such as /data (at most 256 bytes)"
                .into(),
        );
    }
    if path == "/alloc" || path.starts_with("/alloc/") {
        return Err("/alloc is the alloc's own directory; mount volumes elsewhere".into());
    }
    Ok(())
}

/// A volume's name: what the agent's config calls it.
fn check_volume_name(name: &str) -> Result<(), String> {
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > 64 || !name.chars().all(name_char) {
        return Err(format!(
            "volume name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
        ));
    }
    Ok(())
}

/// One entry of the agent's network allow-list: a host (any port) or one `IP:PORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkRule {
    /// Every port of this address.
    AnyPort(IpAddr),
    /// This address and port only.
    Exact(SocketAddr),
}

impl NetworkRule {
    fn parse(entry: &str) -> Result<NetworkRule, String> {
        if let Ok(ip) = entry.parse::<IpAddr>() {
            return Ok(NetworkRule::AnyPort(ip));
        }
        parse_destination(entry)
            .map(NetworkRule::Exact)
            .map_err(|_| format!("{entry:?} is not an address such as 10.0.0.5 or 10.0.0.5:5432"))
    }

    fn allows(&self, addr: &SocketAddr) -> bool {
        match self {
            NetworkRule::AnyPort(ip) => addr.ip() == *ip,
            NetworkRule::Exact(exact) => addr == exact,
        }
    }
}

/// What this agent offers jobs (`[client.capabilities]`). Nothing by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapabilityPolicy {
    /// Destinations jobs may ask to reach.
    pub network: Vec<NetworkRule>,
    /// Host directories jobs may mount read-only, by name.
    pub volumes: BTreeMap<String, PathBuf>,
}

impl CapabilityPolicy {
    /// Reads the agent's `[client.capabilities]` as written: `network` entries are an IP or
    /// `IP:PORT`; `volumes` maps names to absolute host directories.
    pub fn parse(
        network: &[String],
        volumes: &BTreeMap<String, PathBuf>,
    ) -> Result<CapabilityPolicy, CapabilityError> {
        const KEY: &str = "client.capabilities";
        let network = network
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                NetworkRule::parse(entry).map_err(|m| refuse(format!("{KEY}.network[{i}]"), m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (name, path) in volumes {
            let key = format!("{KEY}.volumes.{name}");
            check_volume_name(name).map_err(|m| refuse(&key, m))?;
            if !path.is_absolute() {
                return Err(refuse(
                    key,
                    format!("{} is not an absolute path", path.display()),
                ));
            }
        }
        Ok(CapabilityPolicy {
            network,
            volumes: volumes.clone(),
        })
    }

    /// The first network rule that would let a runner reach the agent's own API listening
    /// on `api`: its port (or every port) on a loopback address, on the API's own address,
    /// or anywhere when the API listens on every address. An operator must not offer it:
    /// whoever reaches the API runs and stops jobs.
    pub fn rule_reaching(&self, api: SocketAddr) -> Option<usize> {
        self.network.iter().position(|rule| {
            let (ip, port) = match *rule {
                NetworkRule::AnyPort(ip) => (ip, None),
                NetworkRule::Exact(addr) => (addr.ip(), Some(addr.port())),
            };
            let same_port = port.is_none_or(|port| port == api.port());
            let this_host = ip.is_loopback() || ip == api.ip() || api.ip().is_unspecified();
            same_port && this_host
        })
    }

    /// Whether every capability `asked` is offered; the first one that is not is named by
    /// its job file key.
    pub fn check(&self, asked: &Capabilities) -> Result<(), CapabilityError> {
        self.grant(asked).map(drop)
    }

    /// What an alloc asking `asked` gets, with each volume resolved to its host directory;
    /// an error names the first capability not offered.
    pub fn grant(&self, asked: &Capabilities) -> Result<Grants, CapabilityError> {
        // Most allocs ask for nothing; nothing is then checked, on every start.
        if asked.is_empty() {
            return Ok(Grants::default());
        }
        // An alloc read back from the state store or sent by a server was never parsed
        // here: what the job file's parsing checks is checked again.
        let network: Vec<String> = asked.network.iter().map(|addr| addr.to_string()).collect();
        let volumes = asked
            .volumes
            .iter()
            .map(|mount| (mount.path.clone(), mount.volume.clone()))
            .collect();
        parse_job(&network, &volumes, &asked.env.iter().cloned().collect())?;
        for (i, addr) in asked.network.iter().enumerate() {
            if !self.network.iter().any(|rule| rule.allows(addr)) {
                return Err(refuse(
                    format!("job.capabilities.network[{i}]"),
                    format!(
                        "{addr} is not a destination this agent allows \
                         (client.capabilities.network)"
                    ),
                ));
            }
        }
        let mut volumes = Vec::with_capacity(asked.volumes.len());
        for mount in &asked.volumes {
            let Some(host_dir) = self.volumes.get(&mount.volume) else {
                return Err(refuse(
                    format!("job.capabilities.volumes.{:?}", mount.path),
                    format!(
                        "volume {:?} is not offered by this agent (client.capabilities.volumes)",
                        mount.volume
                    ),
                ));
            };
            volumes.push(GrantedVolume {
                host_dir: host_dir.clone(),
                name: mount.volume.clone(),
                guest_path: mount.path.clone(),
            });
        }
        Ok(Grants {
            network: asked.network.clone(),
            volumes,
            env: asked.env.clone(),
        })
    }
}

/// What one alloc's sandbox is given, resolved against the agent's offer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Destinations the runner may connect to or exchange datagrams with.
    pub network: Vec<SocketAddr>,
    /// Directories mounted read-only.
    pub volumes: Vec<GrantedVolume>,
    /// Environment variables.
    pub env: Vec<(String, String)>,
}

/// One volume as the sandbox mounts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedVolume {
    /// The directory on the host.
    pub host_dir: PathBuf,
    /// The agent's name for it, for messages.
    pub name: String,
    /// Where the guest sees it.
    pub guest_path: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn job(
        network: &[&str],
        volumes: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Result<Capabilities, CapabilityError> {
        let owned = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let network: Vec<String> = network.iter().map(|s| s.to_string()).collect();
        parse_job(&network, &owned(volumes), &owned(env))
    }

    fn policy(network: &[&str], volumes: &[(&str, &str)]) -> CapabilityPolicy {
        let network: Vec<String> = network.iter().map(|s| s.to_string()).collect();
        let volumes = volumes
            .iter()
            .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
            .collect();
        CapabilityPolicy::parse(&network, &volumes).unwrap()
    }

    #[test]
    fn a_job_names_addresses_mount_paths_and_portable_variable_names() {
        let asked = job(
            &["127.0.0.1:8080", "[::1]:53", "127.0.0.1:8080"],
            &[("/data", "shared")],
            &[("GREETING", "hello"), ("_X1", "")],
        )
        .unwrap();
        assert_eq!(asked.network.len(), 2, "duplicates are kept once");
        assert_eq!(asked.volumes[0].volume, "shared");
        assert_eq!(asked.env[0], ("GREETING".into(), "hello".into()));

        let refused = |result: Result<Capabilities, CapabilityError>| result.unwrap_err();
        let error = refused(job(&["example.com:443"], &[], &[]));
        assert_eq!(error.key, "job.capabilities.network[0]");
        assert!(error.message.contains("host names are not resolved"));
        assert!(
            refused(job(&["10.0.0.1:0"], &[], &[]))
                .message
                .contains("no port")
        );
        assert!(
            refused(job(&["0.0.0.0:80"], &[], &[]))
                .message
                .contains("one host")
        );
        for path in [
            "data", "/", "/a/../b", "/a//b", "/alloc", "/alloc/x", "/a\n",
        ] {
            let error = refused(job(&[], &[(path, "shared")], &[]));
            assert!(error.key.starts_with("job.capabilities.volumes."), "{path}");
        }
        assert!(
            refused(job(&[], &[("/d", "../etc")], &[]))
                .message
                .contains("volume name")
        );
        for name in ["1X", "A-B", "A=B", ""] {
            let error = refused(job(&[], &[], &[(name, "v")]));
            assert!(error.message.contains("variable name"), "{name}: {error}");
        }
        assert!(
            refused(job(&[], &[], &[("A", "a\0b")]))
                .message
                .contains("NUL")
        );
        let big = "x".repeat(MAX_ENV_BYTES);
        assert!(
            refused(job(&[], &[], &[("A", &big)]))
                .message
                .contains("at most")
        );
    }

    #[test]
    fn a_grant_needs_every_capability_offered_and_names_the_first_that_is_not() {
        let offered = policy(
            &["127.0.0.1", "10.0.0.5:5432"],
            &[("shared", "/srv/shared")],
        );
        let asked = job(
            &["127.0.0.1:9", "10.0.0.5:5432"],
            &[("/data", "shared")],
            &[("A", "1")],
        )
        .unwrap();
        let grants = offered.grant(&asked).unwrap();
        assert_eq!(grants.volumes[0].host_dir, Path::new("/srv/shared"));
        assert_eq!(grants.volumes[0].guest_path, "/data");
        assert_eq!(grants.env, vec![("A".to_string(), "1".to_string())]);

        let error = offered
            .check(&job(&["10.0.0.5:5433"], &[], &[]).unwrap())
            .unwrap_err();
        assert_eq!(error.key, "job.capabilities.network[0]");
        assert!(error.message.contains("client.capabilities.network"));
        let error = offered
            .check(&job(&[], &[("/data", "other")], &[]).unwrap())
            .unwrap_err();
        assert_eq!(error.key, "job.capabilities.volumes.\"/data\"");

        let nothing = CapabilityPolicy::default();
        assert!(
            nothing
                .check(&job(&[], &[], &[("A", "1")]).unwrap())
                .is_ok()
        );
        assert!(
            nothing
                .check(&job(&["127.0.0.1:80"], &[], &[]).unwrap())
                .is_err()
        );
    }

    #[test]
    fn a_rule_that_reaches_the_agents_own_api_is_found() {
        let api: SocketAddr = "127.0.0.1:4646".parse().unwrap();
        assert_eq!(
            policy(&["10.0.0.5:5432", "127.0.0.1"], &[]).rule_reaching(api),
            Some(1)
        );
        assert_eq!(policy(&["[::1]:4646"], &[]).rule_reaching(api), Some(0));
        assert_eq!(policy(&["127.0.0.1:5432"], &[]).rule_reaching(api), None);
        assert_eq!(policy(&["10.0.0.5"], &[]).rule_reaching(api), None);
        let everywhere: SocketAddr = "0.0.0.0:4646".parse().unwrap();
        assert_eq!(
            policy(&["10.0.0.5:4646"], &[]).rule_reaching(everywhere),
            Some(0)
        );
    }

    #[test]
    fn the_agent_offer_is_checked_when_it_is_read() {
        let parse = |network: &[&str], volumes: &[(&str, &str)]| {
            let network: Vec<String> = network.iter().map(|s| s.to_string()).collect();
            let volumes = volumes
                .iter()
                .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
                .collect();
            CapabilityPolicy::parse(&network, &volumes)
        };
        assert_eq!(
            parse(&["localhost"], &[]).unwrap_err().key,
            "client.capabilities.network[0]"
        );
        assert_eq!(
            parse(&[], &[("shared", "relative/dir")]).unwrap_err().key,
            "client.capabilities.volumes.shared"
        );
        assert!(parse(&["::1", "10.0.0.5:5432"], &[("a", "/a")]).is_ok());
    }
}
