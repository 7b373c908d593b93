//! What a client node tells the server about itself when it registers: what it can hold
//! (memory for allocs, alloc slots) and what it is (class, pool, meta, and the attributes
//! the agent knows: OS, architecture, version). Placement reads it to filter and rank nodes
//! (see `server::placement`); job constraints name its fields as `${node.class}`,
//! `${meta.KEY}`, `${attr.KEY}` (see [`crate::model::constraint`]).
//!
//! Plain data with its bounds: a node's registration crosses the network (the HTTP node
//! routes, etcd's live keys), so [`NodeInfo::check`] refuses one that would cost the server
//! more than a node is worth before anything of it is stored.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The pool a node is in when its agent names none (Nomad's `default`).
pub const DEFAULT_POOL: &str = "default";

/// The most entries of `meta`, and of `attributes`, a node may send.
pub const MAX_NODE_ENTRIES: usize = 64;
/// The longest key, class or pool name a node may send, in bytes.
pub const MAX_NODE_NAME_BYTES: usize = 128;
/// The longest meta or attribute value a node may send, in bytes.
pub const MAX_NODE_VALUE_BYTES: usize = 512;

/// A node's own account of itself, sent at registration. Every field has a default, so a
/// registration from before nodes advertised anything (an empty body, an old live key) is a
/// node of unknown capacity in the default pool; a field this build does not know (from a
/// newer agent) is ignored, so a cluster can be upgraded one agent at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeInfo {
    /// `[client] node_class`: a free-form class constraints can pick nodes by (empty: none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub class: String,
    /// `[client] node_pool`: the pool the node is in.
    pub pool: String,
    /// `[client.meta]`: the operator's key/values.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// What the agent knows of its machine: `kernel.name`, `cpu.arch`, `caravan.version`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
    /// What it can hold.
    pub resources: NodeResources,
}

impl Default for NodeInfo {
    fn default() -> Self {
        NodeInfo {
            class: String::new(),
            pool: DEFAULT_POOL.into(),
            meta: BTreeMap::new(),
            attributes: BTreeMap::new(),
            resources: NodeResources::default(),
        }
    }
}

/// What a node can hold. `None` is "not said": a node that does not say is never full in
/// that dimension.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeResources {
    /// Bytes of memory allocs may reserve (`[client] memory_total` less `reserved_memory`).
    /// Each alloc reserves its memory limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The memory limit of an alloc whose job sets none: this node's `[client.limits]
    /// memory`, which is what such an alloc reserves here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_alloc_memory_bytes: Option<u64>,
    /// How many allocs it runs at once (`[client] max_live_allocs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_slots: Option<u32>,
}

impl NodeInfo {
    /// The attributes an agent knows of the machine it runs on, as Nomad names them.
    pub fn machine_attributes() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("kernel.name".to_string(), std::env::consts::OS.to_string()),
            ("cpu.arch".to_string(), std::env::consts::ARCH.to_string()),
            (
                "caravan.version".to_string(),
                env!("CARGO_PKG_VERSION").to_string(),
            ),
        ])
    }

    /// The value of a constraint target on node `node_id`: `node.name` (also
    /// `node.unique.name`), `node.class`, `node.pool`, `meta.KEY`, `attr.KEY`. `None` when
    /// the node has no such value (an empty class is none).
    pub fn value_of<'a>(&'a self, node_id: &'a str, target: &Target) -> Option<&'a str> {
        match target {
            Target::NodeName => Some(node_id),
            Target::NodeClass => Some(self.class.as_str()).filter(|c| !c.is_empty()),
            Target::NodePool => Some(self.pool.as_str()),
            Target::Meta(key) => self.meta.get(key).map(String::as_str),
            Target::Attribute(key) => self.attributes.get(key).map(String::as_str),
        }
    }

    /// Checks the bounds a node's registration must keep (see the module docs); the error
    /// names the field at fault.
    pub fn check(&self) -> Result<(), String> {
        let name = |field: &str, text: &str| -> Result<(), String> {
            if text.len() > MAX_NODE_NAME_BYTES {
                return Err(format!(
                    "{field}: {} bytes; at most {MAX_NODE_NAME_BYTES}",
                    text.len()
                ));
            }
            if text.chars().any(char::is_control) {
                return Err(format!("{field}: {text:?} has a control character"));
            }
            Ok(())
        };
        name("class", &self.class)?;
        name("pool", &self.pool)?;
        if self.pool.is_empty() {
            return Err("pool: empty; leave it out for the default pool".into());
        }
        for (field, map) in [("meta", &self.meta), ("attributes", &self.attributes)] {
            if map.len() > MAX_NODE_ENTRIES {
                return Err(format!(
                    "{field}: {} entries; at most {MAX_NODE_ENTRIES}",
                    map.len()
                ));
            }
            for (key, value) in map {
                name(&format!("{field} key"), key)?;
                if key.is_empty() {
                    return Err(format!("{field}: an empty key"));
                }
                if value.len() > MAX_NODE_VALUE_BYTES {
                    return Err(format!(
                        "{field}.{key}: {} bytes; at most {MAX_NODE_VALUE_BYTES}",
                        value.len()
                    ));
                }
                if value.chars().any(char::is_control) {
                    return Err(format!("{field}.{key}: has a control character"));
                }
            }
        }
        Ok(())
    }
}

/// What a constraint's `attribute` names on a node: `${node.name}`, `${node.class}`,
/// `${node.pool}`, `${meta.KEY}`, `${attr.KEY}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `${node.name}` or `${node.unique.name}`: the node's id.
    NodeName,
    /// `${node.class}`.
    NodeClass,
    /// `${node.pool}`.
    NodePool,
    /// `${meta.KEY}`.
    Meta(String),
    /// `${attr.KEY}`.
    Attribute(String),
}

impl Target {
    /// Parses `${...}`; the error says what is known.
    pub fn parse(text: &str) -> Result<Target, String> {
        const KNOWN: &str = "${node.name}, ${node.class}, ${node.pool}, ${meta.KEY} or ${attr.KEY}";
        let Some(inner) = text.strip_prefix("${").and_then(|t| t.strip_suffix('}')) else {
            return Err(format!("{text:?} is not an attribute; expected {KNOWN}"));
        };
        let keyed = |prefix: &str| {
            inner
                .strip_prefix(prefix)
                .filter(|key| !key.is_empty())
                .map(str::to_string)
        };
        match inner {
            "node.name" | "node.unique.name" => Ok(Target::NodeName),
            "node.class" => Ok(Target::NodeClass),
            "node.pool" => Ok(Target::NodePool),
            _ => {
                if let Some(key) = keyed("meta.") {
                    Ok(Target::Meta(key))
                } else if let Some(key) = keyed("attr.") {
                    Ok(Target::Attribute(key))
                } else {
                    Err(format!("unknown attribute {text:?}; expected {KNOWN}"))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_read_the_nodes_fields() {
        let node = NodeInfo {
            class: "edge".into(),
            meta: BTreeMap::from([("rack".into(), "r1".into())]),
            attributes: NodeInfo::machine_attributes(),
            ..NodeInfo::default()
        };
        let value = |text: &str| node.value_of("n1", &Target::parse(text).unwrap());
        assert_eq!(value("${node.class}"), Some("edge"));
        assert_eq!(value("${node.pool}"), Some("default"));
        assert_eq!(value("${node.name}"), Some("n1"));
        assert_eq!(value("${node.unique.name}"), Some("n1"));
        assert_eq!(value("${meta.rack}"), Some("r1"));
        assert_eq!(value("${meta.row}"), None);
        assert_eq!(value("${attr.kernel.name}"), Some(std::env::consts::OS));
        assert_eq!(NodeInfo::default().value_of("n", &Target::NodeClass), None);
        for bad in ["node.class", "${node.klass}", "${meta.}", "${attr}", "${}"] {
            assert!(Target::parse(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn a_registration_past_its_bounds_is_refused_naming_the_field() {
        let mut node = NodeInfo::default();
        assert_eq!(node.check(), Ok(()));
        node.meta = (0..=MAX_NODE_ENTRIES)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert!(node.check().unwrap_err().starts_with("meta: 65 entries"));
        node.meta = BTreeMap::from([("k".into(), "x".repeat(MAX_NODE_VALUE_BYTES + 1))]);
        assert!(node.check().unwrap_err().starts_with("meta.k: 513 bytes"));
        node.meta.clear();
        node.class = "a\nb".into();
        assert!(node.check().unwrap_err().contains("control character"));
        let old: NodeInfo = serde_json::from_str("{}").unwrap();
        assert_eq!(
            old,
            NodeInfo::default(),
            "an old registration has every default"
        );
    }
}
