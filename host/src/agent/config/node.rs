//! The node's part of the agent's config: what its node says of itself when it registers
//! (`[client] node_class`, `node_pool`, `memory_total`, `[client.meta]`, `[client.reserved]`),
//! read from the file and made into a [`NodeInfo`].

use super::{AgentConfig, ConfigError};
use crate::model::node::{NodeInfo, NodeResources};
use crate::util::units::{format_bytes, parse_bytes};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The share of the machine's memory allocs may reserve when `[client] memory_total` is
/// not set, in percent: the rest is the agent's, the OS's and its page cache's.
pub const DEFAULT_MEMORY_SHARE_PERCENT: u64 = 80;

impl AgentConfig {
    /// What this agent's node says of itself when it registers: its class, pool and meta,
    /// the machine's attributes, and what it can hold: `memory_total` (by default
    /// [`DEFAULT_MEMORY_SHARE_PERCENT`] of the machine's memory) less `reserved_memory`,
    /// `max_live_allocs` slots, and the memory limit of an alloc whose job sets none.
    pub fn node_info(&self) -> NodeInfo {
        let total = self.memory_total.or_else(|| {
            machine_memory_bytes().map(|bytes| bytes / 100 * DEFAULT_MEMORY_SHARE_PERCENT)
        });
        NodeInfo {
            class: self.node_class.clone(),
            pool: self.node_pool.clone(),
            meta: self.node_meta.clone(),
            attributes: NodeInfo::machine_attributes(),
            resources: NodeResources {
                memory_bytes: total.map(|t| t.saturating_sub(self.reserved_memory)),
                default_alloc_memory_bytes: Some(self.limits.memory_bytes),
                alloc_slots: Some(self.max_live_allocs),
            },
        }
    }
}

/// The machine's memory (`MemTotal` of `/proc/meminfo`); `None` where there is no such file.
fn machine_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `[client.reserved]`: what allocs may not have of the node (Nomad's block).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReservedSection {
    memory: Option<String>,
}

/// The node's keys of `[client]`, as the file has them.
pub(super) struct NodeKeys {
    pub(super) class: Option<String>,
    pub(super) pool: Option<String>,
    pub(super) meta: Option<BTreeMap<String, String>>,
    pub(super) memory_total: Option<String>,
    pub(super) reserved: Option<ReservedSection>,
}

/// Reads `keys` of file `path` into `config`, refusing in one line a size that does not
/// parse, a reservation that leaves nothing, or a node that says more than a node may.
pub(super) fn read_keys(
    config: &mut AgentConfig,
    path: &str,
    keys: NodeKeys,
) -> Result<(), ConfigError> {
    let out_of_range = |key: &'static str, expected: String| ConfigError::OutOfRange {
        path: path.into(),
        key,
        expected,
    };
    let bytes = |key: &'static str, value: &str| {
        parse_bytes(value).map_err(|problem| ConfigError::Unit {
            path: path.into(),
            key,
            problem,
        })
    };
    if let Some(class) = keys.class {
        config.node_class = class;
    }
    if let Some(pool) = keys.pool {
        config.node_pool = pool;
    }
    if let Some(meta) = keys.meta {
        config.node_meta = meta;
    }
    if let Some(total) = keys.memory_total {
        let total = bytes("client.memory_total", &total)?;
        if total == 0 {
            return Err(out_of_range(
                "client.memory_total",
                "must be above 0".into(),
            ));
        }
        config.memory_total = Some(total);
    }
    if let Some(memory) = keys.reserved.and_then(|r| r.memory) {
        config.reserved_memory = bytes("client.reserved.memory", &memory)?;
    }
    if let Some(total) = config.memory_total
        && config.reserved_memory >= total
    {
        return Err(out_of_range(
            "client.reserved.memory",
            format!(
                "{} leaves nothing of client.memory_total ({})",
                format_bytes(config.reserved_memory),
                format_bytes(total)
            ),
        ));
    }
    if let Err(problem) = config.node_info().check() {
        // The node's fields as this file names them.
        let problem = ["class", "pool"]
            .iter()
            .find_map(|field| Some(format!("node_{field}{}", problem.strip_prefix(field)?)))
            .unwrap_or(problem);
        return Err(ConfigError::Node {
            path: path.into(),
            problem,
        });
    }
    Ok(())
}
