//! Admission: the rules a job's allocs must meet on this agent, in one place. The agent's HTTP
//! API applies them when a job is submitted, so a refused job changes nothing; the runtime
//! applies them again when each alloc starts, because the agent's caps and offer may have
//! changed since, and an alloc read back after a restart or sent by another agent's server
//! must meet today's. Both give the same refusal, naming the job file key at fault.
//!
//! What is not here: the runner's identity (that its component loads, and its SHA-256),
//! which needs the runtime; the agent checks it beside these rules when a job is submitted.

use super::capabilities::{Capabilities, CapabilityPolicy, Grants};
use super::limits::{LimitCaps, LimitOverrides, Limits};
use std::sync::Arc;

/// What this agent admits: the most a job may ask for, and what it offers beyond an alloc's
/// own directory.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    /// The agent's caps (`[client.limit_caps]`); `None` admits any limit (`caravan run`).
    pub caps: Option<LimitCaps>,
    /// What the agent offers (`[client.capabilities]`).
    pub offered: Arc<CapabilityPolicy>,
}

/// Why a job or an alloc is not admitted: the job file key at fault, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// The key, as `job.limits.memory` or `job.capabilities.network[1]`.
    pub field: String,
    /// What is wrong, for people, starting with the key.
    pub message: String,
}

impl Admission {
    /// Checks what an alloc asks: its limits (`asked`, each value valid and within the caps,
    /// and `running_under`, the limits it would run under with the agent's defaults, free of
    /// contradictions) and its capabilities (each one offered). Returns what it is granted.
    pub fn admit(
        &self,
        asked: &LimitOverrides,
        running_under: &Limits,
        capabilities: &Capabilities,
    ) -> Result<Grants, Refusal> {
        asked.check_values().map_err(|error| Refusal {
            field: error.field("job.limits"),
            message: format!("job.limits.{error}"),
        })?;
        if let Some(caps) = &self.caps {
            caps.check(asked).map_err(|over| Refusal {
                field: over.field(),
                message: over.to_string(),
            })?;
        }
        if let Some(conflict) = running_under.conflict() {
            return Err(Refusal {
                field: "job.limits".into(),
                message: format!("job.limits: {conflict}"),
            });
        }
        self.offered.grant(capabilities).map_err(|refused| Refusal {
            field: refused.key.clone(),
            message: refused.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(key: &str, value: &str) -> LimitOverrides {
        let mut asked = LimitOverrides::default();
        asked.set(key, value).unwrap();
        asked
    }

    #[test]
    fn limits_over_the_caps_are_refused_naming_the_key() {
        let admission = Admission {
            caps: Some(LimitCaps::default().with_overrides(&asking("memory", "64MiB"))),
            ..Admission::default()
        };
        let asked = asking("memory", "128MiB");
        let refusal = admission
            .admit(
                &asked,
                &Limits::default().with_overrides(&asked),
                &Capabilities::default(),
            )
            .unwrap_err();
        assert_eq!(refusal.field, "job.limits.memory");
        assert!(refusal.message.contains("cap"), "{refusal}");
    }

    #[test]
    fn a_capability_not_offered_is_refused_naming_it_and_nothing_asked_is_granted_nothing() {
        let admission = Admission::default();
        let asked = Capabilities {
            network: vec!["127.0.0.1:9".parse().unwrap()],
            ..Capabilities::default()
        };
        let refusal = admission
            .admit(&LimitOverrides::default(), &Limits::default(), &asked)
            .unwrap_err();
        assert_eq!(refusal.field, "job.capabilities.network[0]", "{refusal:?}");
        let granted = admission
            .admit(
                &LimitOverrides::default(),
                &Limits::default(),
                &Capabilities::default(),
            )
            .unwrap();
        assert_eq!(granted, Grants::default());
    }
}
