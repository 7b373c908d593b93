//! `[server]` of the agent's config file: the embedded server's knobs.

use super::{AgentConfig, ConfigError};
use crate::util::units::parse_duration;
use serde::Deserialize;

/// `[server]`, as the file has it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServerSection {
    job_gc_threshold: Option<String>,
    reschedule_limit: Option<u32>,
    /// `reschedule_limit`'s name before restarts in place and reschedules were told apart;
    /// still read.
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
        if self.reschedule_limit.is_some() && self.restart_limit.is_some() {
            return Err(ConfigError::OutOfRange {
                path: path.into(),
                key: "server.restart_limit",
                expected: "the old name of server.reschedule_limit: give only that one".into(),
            });
        }
        if let Some(v) = self.reschedule_limit.or(self.restart_limit) {
            config.server.reschedule_limit = v;
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
