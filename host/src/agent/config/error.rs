//! Why the agent's configuration is not usable: one line per error, naming the file and key
//! (or the flag) at fault.

use crate::model::capabilities::CapabilityError;
use crate::util::units::UnitError;

/// Why the agent's configuration is not usable. Each message is the whole line the operator
/// sees, naming the file and key (or the flag) at fault; the problem inside is part of the
/// message rather than a `source`, so `anyhow`'s `{:#}` does not print it twice.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `client.enabled = false` in cluster mode, where every agent is a node.
    #[error(
        "client.enabled = false: in cluster mode every agent is one of the cluster's nodes; \
         only a single agent can run without a client"
    )]
    ClientNeededInCluster,
    /// ACLs on in cluster mode without TLS: agents would have nothing to prove to each other
    /// who they are with.
    #[error(
        "[acl] enabled in cluster mode needs [tls] http = true: agents fetch runner builds and \
         checkpoints from each other with their certificates"
    )]
    AclNeedsTlsInCluster,
    /// The config file could not be read.
    #[error("cannot read config file {path}: {error}")]
    Read {
        /// The file as named on the command line.
        path: String,
        /// What reading it said.
        error: std::io::Error,
    },
    /// The file is not TOML, has an unknown key, or a value of the wrong type.
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// The TOML parser's message.
        message: String,
    },
    /// A size or duration key did not parse.
    #[error("{path}: {key}: {problem}")]
    Unit {
        /// The file.
        path: String,
        /// The key, with its section: `client.gc_interval`.
        key: &'static str,
        /// What was wrong with the value.
        problem: UnitError,
    },
    /// A number outside what the key allows.
    #[error("{path}: {key}: {expected}")]
    OutOfRange {
        /// The file.
        path: String,
        /// The key, with its section.
        key: &'static str,
        /// What the key allows, or why the value is outside it.
        expected: String,
    },
    /// The file's `bind` is not an address.
    #[error("{path}: bind: {problem}")]
    FileBind {
        /// The file.
        path: String,
        /// What was wrong with the value.
        problem: BindError,
    },
    /// `node_class`, `node_pool` or `[client.meta]` past what a node may say.
    #[error("{path}: client.{problem}")]
    Node {
        /// The file.
        path: String,
        /// What is wrong, naming the key.
        problem: String,
    },
    /// A `[client.limits]` or `[client.limit_caps]` entry is not usable.
    #[error("{path}: {field}: {problem}")]
    Limit {
        /// The file.
        path: String,
        /// The key, with its section: `client.limits.memory`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// `--bind` is not an address.
    #[error("--bind: {0}")]
    FlagBind(BindError),
    /// The cluster settings (`[cluster]` or the cluster flags) are not usable: the whole
    /// line, naming the key or flag.
    #[error("{0}")]
    Cluster(String),
    /// `region` or `[tls]` is not usable.
    #[error("{path}: {problem}")]
    Tls {
        /// The file.
        path: String,
        /// What is wrong, naming the key.
        problem: String,
    },
    /// A `[client.capabilities]` entry is not usable.
    #[error("{path}: {problem}")]
    Capability {
        /// The file.
        path: String,
        /// The key and what is wrong with it.
        problem: CapabilityError,
    },
}

/// A listen address that is not `HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an address such as 127.0.0.1:4646")]
pub struct BindError {
    /// The address as typed.
    pub text: String,
}
