//! Admission: the rules a job's allocs must meet on this agent, in one place. The agent's HTTP
//! API applies them when a job is submitted, so a refused job changes nothing; the runtime
//! applies them again when each alloc starts, because the agent's caps and offer may have
//! changed since, and an alloc read back after a restart or sent by another agent's server
//! must meet today's. Both give the same refusal, naming the job file key at fault.
//!
//! A job's runner is admitted here too ([`Admission::admit_job`]): the build it names by
//! SHA-256 (uploaded by `caravan job run`), or else the file at its path, which must be
//! absolute, must load as a runner, and the job then names that build by its SHA-256. Loading needs the runtime, which this module must not see: it asks through
//! [`RunnerIdentity`], which the runtime implements.

use super::capabilities::{Capabilities, CapabilityPolicy, Grants};
use super::jobspec::JobSpec;
use super::limits::{LimitCaps, LimitOverrides, Limits};
use std::path::Path;
use std::sync::Arc;

/// Where a job's runner is identified: loaded as a runner (compiled, for a build not seen
/// before) and named by the SHA-256 of its bytes. Blocking: a compile takes up to seconds,
/// so call it off the async workers.
pub trait RunnerIdentity: Send + Sync {
    /// The SHA-256 (hex) of the runner a job names, once it loaded: build `sha256` when the
    /// job names one (`path` then only names it), else the file at `path`, an absolute path.
    /// Or why it did not load, naming the build or the file.
    fn identify(&self, path: &Path, sha256: Option<&str>) -> Result<String, String>;
}

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

impl Admission {
    /// Every rule a submitted job must meet on this agent: [`Admission::admit`] for what its
    /// allocs ask (against the agent's `defaults`), then its runner, identified through
    /// `runners`. Returns the runner's SHA-256, which the job records: a new build is a change
    /// of the job. Blocking (see [`RunnerIdentity`]).
    pub fn admit_job(
        &self,
        job: &JobSpec,
        defaults: &Limits,
        runners: &dyn RunnerIdentity,
    ) -> Result<String, Refusal> {
        let running_under = defaults.with_overrides(&job.limits);
        self.admit(&job.limits, &running_under, &job.capabilities)?;
        let refuse = |message: String| Refusal {
            field: "job.runner".into(),
            message: format!("job.runner: {message}"),
        };
        let runner = Path::new(&job.runner);
        if let Some(sha256) = &job.runner_sha256 {
            return runners.identify(runner, Some(sha256)).map_err(refuse);
        }
        if !runner.is_absolute() {
            return Err(refuse(format!(
                "{:?} is relative; the API needs an absolute path (`caravan job run` resolves \
                 a job file's relative path against the file's directory)",
                job.runner
            )));
        }
        runners.identify(runner, None).map_err(refuse)
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

    /// Runners as a test sees them: every path is a runner of build `sha256:<path>`.
    struct AnyFile;

    impl RunnerIdentity for AnyFile {
        fn identify(&self, path: &Path, sha256: Option<&str>) -> Result<String, String> {
            if let Some(sha256) = sha256 {
                return Ok(sha256.to_string());
            }
            match path.to_str() {
                Some("/missing.wasm") => {
                    Err("runner component /missing.wasm does not exist".into())
                }
                other => Ok(format!("sha256:{}", other.unwrap_or(""))),
            }
        }
    }

    fn job(runner: &str) -> JobSpec {
        crate::model::jobspec::parse_json(&format!(
            r#"{{"job": {{"id": "web", "type": "service", "count": 1, "runner": {runner:?}}}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_job_names_its_runners_build_and_a_relative_or_missing_runner_is_refused() {
        let admission = Admission::default();
        let defaults = Limits::default();
        assert_eq!(
            admission.admit_job(&job("/runners/web.wasm"), &defaults, &AnyFile),
            Ok("sha256:/runners/web.wasm".to_string())
        );
        for (runner, says) in [
            ("web.wasm", "is relative"),
            ("/missing.wasm", "does not exist"),
        ] {
            let refusal = admission
                .admit_job(&job(runner), &defaults, &AnyFile)
                .unwrap_err();
            assert_eq!(refusal.field, "job.runner");
            assert!(refusal.message.starts_with("job.runner: "), "{refusal}");
            assert!(refusal.message.contains(says), "{refusal}");
        }
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
