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
//! Optional: `[job.limits]` (any key of [`LimitOverrides::KEYS`]: see [`crate::limits`]),
//! `[[job.tasks]]` (`name`, `config` table), `[job.meta]` (string values),
//! `[job.capabilities]` (`network`, `volumes`, `env`: see [`crate::capabilities`]),
//! `[job.reschedule]` (`attempts`, `interval`, `delay`, `delay_function`, `max_delay`,
//! `unlimited`: see [`crate::reschedule`]), `[job.restart]` (`attempts`, `interval`, `delay`,
//! `delay_function`, `max_delay`, `mode`: see [`crate::restart`]), `[job.update]`
//! (`carry_checkpoint`: see [`UpdatePolicy`]).
//!
//! This module only parses and validates; it knows nothing of servers or runners.

use crate::capabilities::{self, Capabilities};
use crate::limits::{LimitOverrides, RawLimits};
use crate::reschedule::{RawReschedule, ReschedulePolicy};
use crate::restart::{RawRestart, RestartPolicy};
use crate::structs::Task;
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

/// A validated job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Unique job id.
    pub id: String,
    /// Service or batch.
    pub job_type: JobType,
    /// How many allocs to run.
    pub count: u32,
    /// Path of the runner component.
    pub runner: String,
    /// The SHA-256 (hex) of the runner component as the agent that took the job loaded it:
    /// which build the job runs, so that a new build at the same path is a change. Never
    /// from a job file; `None` until an agent sets it.
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
    #[serde(rename = "type")]
    job_type: Option<String>,
    count: Option<i64>,
    runner: Option<String>,
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

/// Parses a TOML job file.
pub fn parse_toml(text: &str) -> Result<JobSpec, SpecError> {
    let raw: RawDocument = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
    validate(raw.job)
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

fn validate(raw: RawJob) -> Result<JobSpec, SpecError> {
    let id = raw.id.ok_or_else(|| error("job.id", "missing"))?;
    let id_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if id.is_empty() || id.len() > 64 || !id.chars().all(id_chars) || id == "." || id == ".." {
        return Err(error(
            "job.id",
            format!("{id:?} must be 1 to 64 letters, digits, '-', '_' or '.'"),
        ));
    }
    let job_type = match raw.job_type.as_deref() {
        None => {
            return Err(error(
                "job.type",
                "missing; expected \"service\" or \"batch\"",
            ));
        }
        Some("service") => JobType::Service,
        Some("batch") => JobType::Batch,
        Some(other) => {
            return Err(error(
                "job.type",
                format!("unknown job type {other:?}; expected \"service\" or \"batch\""),
            ));
        }
    };
    let count = match raw.count {
        None => {
            return Err(error(
                "job.count",
                "missing; how many allocs to run, such as `count = 3`",
            ));
        }
        Some(count) if !(0..=100_000).contains(&count) => {
            return Err(error(
                "job.count",
                format!("{count} is out of range; expected 0 to 100000"),
            ));
        }
        Some(count) => count as u32,
    };
    let runner = raw.runner.filter(|r| !r.trim().is_empty()).ok_or_else(|| {
        error(
            "job.runner",
            "missing; the path of the runner component (.wasm)",
        )
    })?;
    let runner = normalise_path(&runner);
    let limits = LimitOverrides::from_raw(&raw.limits)
        .map_err(|e| error(e.field("job.limits"), e.problem()))?;
    let caps = &raw.capabilities;
    let capabilities = capabilities::parse_job(&caps.network, &caps.volumes, &caps.env)
        .map_err(|e| error(e.key, e.message))?;
    let reschedule = match &raw.reschedule {
        None => None,
        Some(block) => Some(
            block
                .parse(DEFAULT_RESCHEDULE_ATTEMPTS)
                .map_err(|e| error(format!("job.reschedule.{}", e.key), e.message))?,
        ),
    };
    let restart = match &raw.restart {
        None => None,
        Some(block) => Some(
            block
                .parse()
                .map_err(|e| error(format!("job.restart.{}", e.key), e.message))?,
        ),
    };
    let mut tasks: Vec<Task> = Vec::new();
    for (i, task) in raw.tasks.into_iter().enumerate() {
        let field = format!("job.tasks[{i}].name");
        let name = task
            .name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| error(&field, "missing"))?;
        if tasks.iter().any(|t| t.name == name) {
            return Err(error(field, format!("{name:?} is used by another task")));
        }
        if name.chars().any(char::is_control) {
            // A task's name is a line in logs, tables and runners' C strings.
            return Err(error(field, format!("{name:?} has a control character")));
        }
        let config = task
            .config
            .into_iter()
            .map(|(key, value)| match value {
                serde_json::Value::String(text) => (key, text),
                other => (key, other.to_string()),
            })
            .collect();
        tasks.push(Task { name, config });
    }
    if tasks.is_empty() {
        tasks.push(Task {
            name: id.clone(),
            config: Vec::new(),
        });
    }
    let spec = JobSpec {
        id,
        job_type,
        count,
        runner,
        runner_sha256: None,
        limits,
        tasks,
        meta: raw.meta.into_iter().collect(),
        capabilities,
        reschedule,
        restart,
        update: UpdatePolicy {
            carry_checkpoint: raw.update.and_then(|u| u.carry_checkpoint).unwrap_or(false),
        },
    };
    let stored = serde_json::to_vec(&spec).map_or(usize::MAX, |bytes| bytes.len());
    if stored > MAX_JOB_BYTES {
        return Err(error(
            "job",
            format!(
                "is {stored} bytes as stored; at most {} KiB (its tasks' config and meta are \
                 copied into each of its allocs, each stored whole)",
                MAX_JOB_BYTES >> 10
            ),
        ));
    }
    Ok(spec)
}

/// A `[job.reschedule]` block's `attempts` when it leaves it out (a job without the block
/// takes the agent's `[server] restart_limit`, 3 by default, for a service job).
pub const DEFAULT_RESCHEDULE_ATTEMPTS: u32 = 3;

/// The largest job, as stored. A job and each of its allocs (which carry its tasks, meta and
/// limits) are each one record; in cluster mode, one etcd request, which etcd refuses past
/// 1.5 MiB.
pub const MAX_JOB_BYTES: usize = 256 << 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_errors_say_where_and_hint_at_the_usual_mistakes() {
        let single_brackets = "[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\n\
                               runner = \"r.wasm\"\n[job.tasks]\nname = \"main\"\n";
        let refused = parse_toml(single_brackets).unwrap_err().to_string();
        assert!(
            refused.starts_with("job: invalid TOML at line 6, column 1: ")
                && refused.ends_with("write each one under `[[job.tasks]]`, with two brackets"),
            "{refused}"
        );
        let no_table = parse_toml("id = \"web\"\n").unwrap_err().to_string();
        assert!(
            no_table.ends_with("a job file starts with a `[job]` table"),
            "{no_table}"
        );
        let bad_value = parse_toml("[job]\nid = \"web\"\ncount = three\n").unwrap_err();
        assert!(
            bad_value
                .message
                .starts_with("invalid TOML at line 3, column 9: "),
            "{bad_value}"
        );
        let no_count = parse_toml("[job]\nid = \"web\"\ntype = \"batch\"\nrunner = \"r.wasm\"\n");
        assert_eq!(
            no_count.unwrap_err().to_string(),
            "job.count: missing; how many allocs to run, such as `count = 3`"
        );
    }

    #[test]
    fn a_reschedule_block_parses_and_a_bad_key_is_named_under_it() {
        let with_block = |block: &str| {
            parse_toml(&format!(
                "[job]\nid = \"web\"\ntype = \"batch\"\ncount = 1\nrunner = \"r.wasm\"\n\
                 [job.reschedule]\n{block}\n"
            ))
        };
        let policy = with_block("attempts = 1\ndelay = \"30s\"\nmax_delay = \"1m\"")
            .unwrap()
            .reschedule
            .unwrap();
        assert_eq!(
            (policy.attempts, policy.delay, policy.max_delay),
            (
                1,
                std::time::Duration::from_secs(30),
                std::time::Duration::from_secs(60)
            )
        );
        let refused = with_block("delay = \"0s\"").unwrap_err();
        assert_eq!(refused.field, "job.reschedule.delay");
        assert!(
            refused.message.contains("would spin a crashing runner"),
            "{refused}"
        );
        let unknown = with_block("retries = 3").unwrap_err();
        assert!(
            unknown.message.contains("unknown field `retries`"),
            "{unknown}"
        );
    }

    #[test]
    fn a_restart_block_parses_into_the_job_and_a_bad_key_is_named_under_it() {
        let with_block = |block: &str| {
            parse_toml(&format!(
                "[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n\
                 [job.restart]\n{block}\n"
            ))
        };
        let policy = with_block("attempts = 3\nmode = \"delay\"")
            .unwrap()
            .restart
            .unwrap();
        assert_eq!(
            (policy.attempts, policy.mode),
            (3, crate::restart::RestartMode::Delay)
        );
        let refused = with_block("mode = \"never\"").unwrap_err();
        assert_eq!(refused.field, "job.restart.mode");
        let without =
            parse_toml("[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n")
                .unwrap();
        assert_eq!(without.restart, None, "no restarts in place unless asked");
    }

    #[test]
    fn a_task_name_with_a_control_character_is_refused() {
        let refused = parse_toml(
            "[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n\
             [[job.tasks]]\nname = \"we\\u0000b\"\n",
        )
        .unwrap_err();
        assert_eq!(refused.field, "job.tasks[0].name");
        assert!(refused.message.contains("control character"), "{refused}");
    }

    #[test]
    fn an_update_block_opts_in_to_carrying_checkpoints_and_an_unknown_key_is_named() {
        let with_block = |block: &str| {
            parse_toml(&format!(
                "[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n\
                 [job.update]\n{block}\n"
            ))
        };
        assert!(
            with_block("carry_checkpoint = true")
                .unwrap()
                .update
                .carry_checkpoint
        );
        assert_eq!(with_block("").unwrap().update, UpdatePolicy::default());
        let refused = with_block("carry = true").unwrap_err().to_string();
        assert!(
            refused.contains("unknown field `carry`") && refused.contains("carry_checkpoint"),
            "{refused}"
        );
        let spec = with_block("carry_checkpoint = false").unwrap();
        assert_eq!(spec.runner_sha256, None, "never from a job file");
    }

    #[test]
    fn runner_paths_are_normalised_without_touching_the_disk() {
        for (written, stored) in [
            (
                "/opt/runners/../caravan/./sleeper.wasm",
                "/opt/caravan/sleeper.wasm",
            ),
            ("/../x.wasm", "/x.wasm"),
            ("../a/./b/../r.wasm", "../a/r.wasm"),
            ("r.wasm", "r.wasm"),
            ("./", "."),
        ] {
            assert_eq!(normalise_path(written), stored, "{written}");
        }
    }

    #[test]
    fn a_job_too_large_to_store_is_refused() {
        let big = "x".repeat(MAX_JOB_BYTES);
        let text = format!(
            "[job]\nid = \"big\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n[job.meta]\nnote = \"{big}\"\n"
        );
        let refused = parse_toml(&text).unwrap_err();
        assert_eq!(refused.field, "job");
        assert!(refused.message.contains("at most 256 KiB"), "{refused}");
    }

    #[test]
    fn the_smallest_file_parses_with_one_task_named_after_the_job() {
        let spec = parse_toml(
            "[job]\nid = \"hello\"\ntype = \"service\"\ncount = 3\nrunner = \"r.wasm\"\n",
        )
        .unwrap();
        assert_eq!(
            (spec.id.as_str(), spec.job_type, spec.count),
            ("hello", JobType::Service, 3)
        );
        assert_eq!(
            spec.tasks,
            [Task {
                name: "hello".into(),
                config: vec![]
            }]
        );
    }

    #[test]
    fn tasks_limits_and_meta_parse_and_config_values_become_text() {
        let spec = parse_toml(
            r#"
            [job]
            id = "web"
            type = "batch"
            count = 1
            runner = "sleeper.wasm"
            [job.limits]
            memory = "32MiB"
            kill_timeout = "2s"
            disk = "100MiB"
            [[job.tasks]]
            name = "main"
            config = { run_for = "5s", exit_code = 1, loud = true }
            [job.meta]
            team = "infra"
            "#,
        )
        .unwrap();
        assert_eq!(spec.limits.memory_bytes, Some(32 << 20));
        assert_eq!(spec.limits.disk_bytes, Some(100 << 20));
        assert_eq!(
            spec.limits.kill_timeout,
            Some(std::time::Duration::from_secs(2))
        );
        let config = &spec.tasks[0].config;
        assert!(config.contains(&("run_for".into(), "5s".into())));
        assert!(config.contains(&("exit_code".into(), "1".into())));
        assert!(config.contains(&("loud".into(), "true".into())));
        assert_eq!(spec.meta, [("team".to_string(), "infra".to_string())]);
    }

    #[test]
    fn capabilities_parse_and_a_bad_one_names_its_key() {
        let spec = parse_toml(
            r#"
            [job]
            id = "net"
            type = "service"
            count = 1
            runner = "r.wasm"
            [job.capabilities]
            network = ["127.0.0.1:8080"]
            volumes = { "/data" = "shared" }
            env = { GREETING = "hello" }
            "#,
        )
        .unwrap();
        assert_eq!(spec.capabilities.network[0].port(), 8080);
        assert_eq!(spec.capabilities.volumes[0].path, "/data");
        assert_eq!(spec.capabilities.env[0].1, "hello");
        let refused = parse_toml(
            "[job]\nid = \"j\"\ntype = \"batch\"\ncount = 1\nrunner = \"r\"\n\
             [job.capabilities]\nnetwork = [\"example.com:80\"]\n",
        )
        .unwrap_err();
        assert_eq!(refused.field, "job.capabilities.network[0]");
        let unknown = parse_toml(
            "[job]\nid = \"j\"\ntype = \"batch\"\ncount = 1\nrunner = \"r\"\n\
             [job.capabilities]\nsockets = true\n",
        )
        .unwrap_err();
        assert!(unknown.message.contains("sockets"), "{unknown}");
    }

    #[test]
    fn json_is_the_same_document() {
        let spec =
            parse_json(r#"{"job": {"id": "j", "type": "batch", "count": 2, "runner": "r.wasm"}}"#)
                .unwrap();
        assert_eq!(spec.count, 2);
    }

    #[test]
    fn each_bad_spec_names_its_field() {
        let base = |extra: &str| {
            format!("[job]\nid = \"j\"\ntype = \"service\"\nrunner = \"r.wasm\"\n{extra}")
        };
        let field_of = |text: &str| parse_toml(text).unwrap_err().field;
        assert_eq!(field_of(&base("count = -1")), "job.count");
        assert_eq!(
            field_of("[job]\nid = \"j\"\ntype = \"service\"\ncount = 1\n"),
            "job.runner"
        );
        assert_eq!(
            field_of(&base("count = 1\n").replace("service", "cron")),
            "job.type"
        );
        assert_eq!(
            field_of(&base("count = 1\n[job.limits]\nmemory = \"lots\"")),
            "job.limits.memory"
        );
        assert_eq!(
            field_of(&base("count = 1\n[[job.tasks]]\nconfig = {}")),
            "job.tasks[0].name"
        );
        let unknown = parse_toml(&base("count = 1\ncolour = \"red\"")).unwrap_err();
        assert!(unknown.message.contains("colour"), "{unknown}");
        let malformed = parse_toml("[job\nid=").unwrap_err();
        assert!(malformed.message.starts_with("invalid TOML"), "{malformed}");
        let json = parse_json("{\"job\": ").unwrap_err();
        assert!(json.message.starts_with("invalid JSON"), "{json}");
        assert_eq!(
            parse_json(r#"{"job": {"id": "../x", "type": "batch", "count": 1, "runner": "r"}}"#)
                .unwrap_err()
                .field,
            "job.id"
        );
    }
}
