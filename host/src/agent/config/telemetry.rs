//! `[telemetry]` of the agent's config file: what the agent measures of itself (Nomad's
//! block): how often it samples the web UI's series, and where it exports over OTLP.

use super::{AgentConfig, ConfigError};
use crate::util::units::{format_duration, parse_duration};
use serde::Deserialize;
use std::time::Duration;

/// `[telemetry]`, as the file has it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TelemetrySection {
    collection_interval: Option<String>,
    otlp_endpoint: Option<String>,
}

/// The shortest and longest `[telemetry] collection_interval`: sampling every alloc more
/// often than ten times a second would cost a node of many allocs real CPU, and a plot of
/// samples an hour apart shows nothing.
const COLLECTION_INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));

impl TelemetrySection {
    /// Reads what the section sets into `config`; `path` names the file in errors.
    pub(super) fn read_into(self, config: &mut AgentConfig, path: &str) -> Result<(), ConfigError> {
        if let Some(endpoint) = self.otlp_endpoint.filter(|e| !e.is_empty()) {
            config.otlp_endpoint = Some(endpoint);
        }
        if let Some(interval) = self.collection_interval {
            let key = "telemetry.collection_interval";
            let interval = parse_duration(&interval).map_err(|problem| ConfigError::Unit {
                path: path.into(),
                key,
                problem,
            })?;
            let (shortest, longest) = COLLECTION_INTERVAL_RANGE;
            if interval < shortest || interval > longest {
                return Err(ConfigError::OutOfRange {
                    path: path.into(),
                    key,
                    expected: format!("between 100ms and 1h, not {}", format_duration(interval)),
                });
            }
            config.collection_interval = interval;
        }
        Ok(())
    }
}
