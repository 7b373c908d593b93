//! Job specs: the TOML job file operators write, and the same document as JSON for the HTTP
//! API. Parsing checks everything a job needs and names the field at fault, so a rejected
//! job is rejected whole, before anything changes.
//!
//! The smallest valid file:
//!
//! ```toml
//! [job]
//! id = "hello"
//! type = "service"          # or "batch"
//! count = 3
//! runner = "path/to/runner.wasm"
//! ```
//!
//! Optional: `[job.limits]` (any key of [`LimitOverrides::KEYS`]: see [`crate::model::limits`]),
//! `[[job.tasks]]` (`name`, `config` table), `[job.meta]` (string values),
//! `[job.capabilities]` (`network`, `volumes`, `env`: see [`crate::model::capabilities`]),
//! `[job.reschedule]` (`attempts`, `interval`, `delay`, `delay_function`, `max_delay`,
//! `unlimited`: see [`crate::model::reschedule`]), `[job.restart]` (`attempts`, `interval`, `delay`,
//! `delay_function`, `max_delay`, `mode`: see [`crate::model::restart`]), `[job.update]`
//! (`carry_checkpoint`: see [`UpdatePolicy`]), `[[job.constraint]]` (`attribute`, `operator`,
//! `value`: see [`crate::model::constraint`]), `placement` (`"binpack"`, the default, or
//! `"spread"`), `[job.migrate]` (`checkpoint`: see [`MigratePolicy`]), `[job.disconnect]` (`lost_after`,
//! `replace`, `reconcile`: see [`crate::model::disconnect`]).
//!
//! This module only parses and validates; it knows nothing of servers or runners.

use crate::model::capabilities::Capabilities;
use crate::model::constraint::{Algorithm, Constraint, RawConstraint};
use crate::model::disconnect::{DisconnectPolicy, RawDisconnect};
use crate::model::limits::{LimitOverrides, RawLimits};
use crate::model::reschedule::{RawReschedule, ReschedulePolicy};
use crate::model::restart::{RawRestart, RestartPolicy};
use crate::model::structs::Task;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a job's allocs live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobType {
    /// Runs until stopped; failed allocs are replaced (up to a restart limit).
    Service,
    /// Runs to completion; finished allocs are not replaced.
    Batch,
}

/// The namespace of a job that names none, as Nomad's.
pub const DEFAULT_NAMESPACE: &str = "default";

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.to_string()
}

/// Whether `namespace` may name a namespace: 1 to 64 lower-case letters, digits, '-' or '_'.
pub fn check_namespace(namespace: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    if namespace.is_empty() || namespace.len() > 64 || !namespace.chars().all(ok) {
        return Err(format!(
            "{:?} is not a namespace: 1 to 64 lower-case letters, digits, '-' or '_'",
            crate::util::text::cut(namespace, 64)
        ));
    }
    Ok(())
}

/// A validated job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Unique job id (in the whole cluster, whatever its namespace).
    pub id: String,
    /// The namespace it belongs to (`[job] namespace`, default `default`): what a `submit`
    /// token may be confined to, and what lists filter by.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Service or batch.
    pub job_type: JobType,
    /// How many allocs to run.
    pub count: u32,
    /// Path of the runner component.
    pub runner: String,
    /// The SHA-256 (hex) of the runner component: which build the job runs, so that a new
    /// build at the same path is a change. A job file or request may name it (`caravan job
    /// run` does, after uploading the file), and the runner's path is then only its name;
    /// else the agent that takes the job sets it from the file at the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_sha256: Option<String>,
    /// Per-alloc limits; unset ones take the agent's defaults.
    pub limits: LimitOverrides,
    /// The tasks each alloc runs (one task named after the job when none is given).
    pub tasks: Vec<Task>,
    /// Free-form metadata.
    pub meta: Vec<(String, String)>,
    /// What each alloc may reach beyond its directory; nothing by default.
    #[serde(default, skip_serializing_if = "Capabilities::is_empty")]
    pub capabilities: Capabilities,
    /// How failed allocs are replaced (`[job.reschedule]`); `None`: the job type's default
    /// (see [`ReschedulePolicy::default_for`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reschedule: Option<ReschedulePolicy>,
    /// How a crashed runner is restarted in place (`[job.restart]`); `None`: it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartPolicy>,
    /// How a change of the job reaches its running allocs (`[job.update]`).
    #[serde(default, skip_serializing_if = "UpdatePolicy::is_default")]
    pub update: UpdatePolicy,
    /// Which nodes its allocs may go to (`[[job.constraint]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Constraint>,
    /// How its allocs are ranked over the nodes that can hold them (`placement`).
    #[serde(default, skip_serializing_if = "Algorithm::is_default")]
    pub placement: Algorithm,
    /// How its allocs move off a drained node (`[job.migrate]`).
    #[serde(default, skip_serializing_if = "MigratePolicy::is_default")]
    pub migrate: MigratePolicy,
    /// What its allocs become when their node stops answering (`[job.disconnect]`); `None`:
    /// lost at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disconnect: Option<DisconnectPolicy>,
}

/// How a job's allocs move off a drained node (`[job.migrate]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigratePolicy {
    /// The replacement starts from the moved alloc's checkpoint (the default); false: it
    /// starts afresh. Either way the moved alloc is shut down, not killed.
    pub checkpoint: bool,
}

impl Default for MigratePolicy {
    fn default() -> Self {
        MigratePolicy { checkpoint: true }
    }
}

impl MigratePolicy {
    fn is_default(&self) -> bool {
        *self == MigratePolicy::default()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMigrate {
    checkpoint: Option<bool>,
}

/// How a change of a job reaches its running allocs (`[job.update]`).
///
/// A change of the runner alone (a new build, or a new path) always upgrades the running
/// allocs in place: each is asked to `shutdown`, and its runner's new build starts from the
/// checkpoint it took, with the same alloc id, directory and log (see
/// `runtime::wasm_runner`). Any other change replaces the allocs with new ones, which start
/// without a checkpoint, unless `carry_checkpoint` lets a change of the tasks' config or the
/// job's meta go in place too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdatePolicy {
    /// A change of the tasks' config or the meta upgrades in place, carrying the checkpoint,
    /// rather than replacing the allocs.
    #[serde(default)]
    pub carry_checkpoint: bool,
}

impl UpdatePolicy {
    fn is_default(&self) -> bool {
        *self == UpdatePolicy::default()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpdate {
    carry_checkpoint: Option<bool>,
}

/// Why a job spec was refused: the field at fault and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// The field, as `job.count` or `job.tasks[1].name`; `job` for the document as a whole.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn error(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

/// The document as written, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    job: RawJob,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    id: Option<String>,
    namespace: Option<String>,
    #[serde(rename = "type")]
    job_type: Option<String>,
    count: Option<i64>,
    runner: Option<String>,
    runner_sha256: Option<String>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    tasks: Vec<RawTask>,
    #[serde(default)]
    meta: BTreeMap<String, String>,
    #[serde(default)]
    capabilities: RawCapabilities,
    reschedule: Option<RawReschedule>,
    restart: Option<RawRestart>,
    update: Option<RawUpdate>,
    #[serde(default)]
    constraint: Vec<RawConstraint>,
    placement: Option<String>,
    migrate: Option<RawMigrate>,
    disconnect: Option<RawDisconnect>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCapabilities {
    #[serde(default)]
    network: Vec<String>,
    #[serde(default)]
    volumes: BTreeMap<String, String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    name: Option<String>,
    #[serde(default)]
    config: serde_json::Map<String, serde_json::Value>,
}

/// Parses a TOML job file: its first problem in file order, if any (every problem, each
/// with its line: [`check_toml`]).
pub fn parse_toml(text: &str) -> Result<JobSpec, SpecError> {
    check_toml(text).map_err(|mut problems| problems.remove(0).error)
}

/// A TOML error as one line: where it is (line and column, from 1), what is wrong, and a
/// hint for the mistakes job files are known for.
fn toml_error(text: &str, toml_error: &toml::de::Error) -> SpecError {
    let mut message = String::from("invalid TOML");
    let mut line_text = "";
    if let Some(before) = toml_error.span().and_then(|span| text.get(..span.start)) {
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |at| at + 1);
        let column = before[line_start..].chars().count() + 1;
        line_text = text[line_start..].lines().next().unwrap_or_default();
        message.push_str(&format!(" at line {line}, column {column}"));
    }
    let what = toml_error.message().trim_end();
    message.push_str(&format!(": {what}"));
    if what.contains("expected a sequence") && line_text.contains("tasks") {
        message.push_str(
            "; tasks are a list: write each one under `[[job.tasks]]`, with two brackets",
        );
    } else if what.contains("missing field `job`") || what.contains("expected `job`") {
        message.push_str("; a job file starts with a `[job]` table");
    }
    error("job", message)
}

/// `path` with its `.` segments left out and each `..` taking out the segment before it,
/// without looking at the file system (a symlink stays a symlink: pointing it at a new build
/// is how some operators upgrade). A `..` above the root or the start stays.
pub fn normalise_path(path: &str) -> String {
    use std::path::{Component, Path, PathBuf};
    let mut normal = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(normal.components().next_back(), Some(Component::Normal(_))) =>
            {
                normal.pop();
            }
            Component::ParentDir if normal.has_root() => {}
            other => normal.push(other),
        }
    }
    if normal.as_os_str().is_empty() {
        return ".".into();
    }
    normal.to_string_lossy().into_owned()
}

/// Parses the JSON form (`{"job": {...}}`), as the HTTP API takes it.
pub fn parse_json(text: &str) -> Result<JobSpec, SpecError> {
    let raw: RawDocument =
        serde_json::from_str(text).map_err(|e| error("job", format!("invalid JSON: {e}")))?;
    validate(raw.job)
}

/// The first of `raw`'s problems, or its job (the API answers one field at a time; a job
/// file's problems are all found by [`check_toml`]).
fn validate(raw: RawJob) -> Result<JobSpec, SpecError> {
    validate::validate_all(raw).map_err(|mut problems| problems.remove(0))
}

/// A `[job.reschedule]` block's `attempts` when it leaves it out (a job without the block
/// takes the agent's `[server] reschedule_limit`, 3 by default, for a service job).
pub const DEFAULT_RESCHEDULE_ATTEMPTS: u32 = 3;

/// The largest job, as stored. A job and each of its allocs (which carry its tasks, meta and
/// limits) are each one record; in cluster mode, one etcd request, which etcd refuses past
/// 1.5 MiB.
pub const MAX_JOB_BYTES: usize = 256 << 10;

mod problems;
#[cfg(test)]
mod tests;
mod validate;

pub use problems::{Problem, check_toml};
