//! `[server]` of the agent's config file: the embedded server's knobs.

use super::{AgentConfig, ConfigError};
use crate::util::units::parse_duration;
use serde::Deserialize;

/// `[server]`, as the file has it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServerSection {
    job_gc_threshold: Option<String>,
    restart_limit: Option<u32>,
    node_ttl: Option<String>,
}

impl ServerSection {
    /// Reads what the section sets into `config`; `path` names the file in errors.
    pub(super) fn read_into(self, config: &mut AgentConfig, path: &str) -> Result<(), ConfigError> {
        let duration = |key: &'static str, value: &str| {
            parse_duration(value).map_err(|problem| ConfigError::Unit {
                path: path.into(),
                key,
                problem,
            })
        };
        if let Some(v) = self.job_gc_threshold {
            config.server.job_gc_threshold = duration("server.job_gc_threshold", &v)?;
        }
        if let Some(v) = self.restart_limit {
            config.server.restart_limit = v;
        }
        if let Some(v) = self.node_ttl {
            let ttl = duration("server.node_ttl", &v)?;
            if ttl < std::time::Duration::from_secs(1) {
                return Err(ConfigError::OutOfRange {
                    path: path.into(),
                    key: "server.node_ttl",
                    expected: format!("{v} is under the least, 1s"),
                });
            }
            config.server.node_ttl = ttl;
        }
        Ok(())
    }
}
