//! A job document's values checked, every field apart: each problem is found, not only the
//! first, so that a job file's author sees them all at once (`super::problems` puts them in
//! file order with their lines), every bad limit, capability and policy key too (a policy
//! block's keys first, then how they agree). Each constraint still stops at its first bad
//! key.

use super::{
    DEFAULT_NAMESPACE, DEFAULT_RESCHEDULE_ATTEMPTS, JobSpec, JobType, MAX_JOB_BYTES, MigratePolicy,
    RawJob, SpecError, UpdatePolicy, check_namespace, error, normalise_path,
};
use crate::model::capabilities;
use crate::model::constraint::{Algorithm, MAX_CONSTRAINTS};
use crate::model::limits::LimitOverrides;
use crate::model::structs::Task;

/// Every problem of `raw`, or the job it describes.
pub(super) fn validate_all(raw: RawJob) -> Result<JobSpec, Vec<SpecError>> {
    let mut problems = Problems(Vec::new());
    let id = problems.keep(job_id(raw.id));
    let job_type = problems.keep(job_type(raw.job_type.as_deref()));
    let count = problems.keep(count(raw.count));
    let runner = problems.keep(runner(raw.runner));
    let runner_sha256 = problems.keep(runner_sha256(raw.runner_sha256));
    let limits = problems.keep_named(LimitOverrides::from_raw_all(&raw.limits), |e| {
        error(e.field("job.limits"), e.problem())
    });
    let caps = &raw.capabilities;
    let capabilities = problems.keep_named(
        capabilities::parse_job_all(&caps.network, &caps.volumes, &caps.env),
        |e| error(e.key, e.message),
    );
    let reschedule = problems.keep_named(
        raw.reschedule
            .as_ref()
            .map(|block| block.parse_all(DEFAULT_RESCHEDULE_ATTEMPTS))
            .transpose(),
        |e| error(format!("job.reschedule.{}", e.key), e.message),
    );
    let restart = problems.keep_named(
        raw.restart
            .as_ref()
            .map(|block| block.parse_all())
            .transpose(),
        |e| error(format!("job.restart.{}", e.key), e.message),
    );
    let constraints = if raw.constraint.len() > MAX_CONSTRAINTS {
        problems.keep(Err(error(
            "job.constraint",
            format!(
                "{} constraints; at most {MAX_CONSTRAINTS}",
                raw.constraint.len()
            ),
        )))
    } else {
        problems.keep_each(
            raw.constraint
                .into_iter()
                .enumerate()
                .map(|(i, constraint)| {
                    constraint.parse().map_err(|(key, problem)| {
                        error(format!("job.constraint[{i}].{key}"), problem)
                    })
                }),
        )
    };
    let placement = problems.keep(placement(raw.placement.as_deref()));
    let disconnect = problems.keep_named(
        raw.disconnect.map_or(Ok(None), |block| block.parse()),
        |(key, problem)| error(format!("job.disconnect.{key}"), problem),
    );
    let mut names: Vec<String> = Vec::new();
    let tasks = problems.keep_each(raw.tasks.into_iter().enumerate().map(|(i, task)| {
        let name = task_name(i, task.name, &names)?;
        names.push(name.clone());
        let config = task
            .config
            .into_iter()
            .map(|(key, value)| match value {
                serde_json::Value::String(text) => (key, text),
                other => (key, other.to_string()),
            })
            .collect();
        Ok(Task { name, config })
    }));
    let namespace = problems.keep(match raw.namespace {
        None => Ok(DEFAULT_NAMESPACE.to_string()),
        Some(namespace) => check_namespace(&namespace)
            .map(|()| namespace)
            .map_err(|problem| error("job.namespace", problem)),
    });
    let (
        Some(id),
        Some(namespace),
        Some(job_type),
        Some(count),
        Some(runner),
        Some(runner_sha256),
        Some(limits),
        Some(mut tasks),
        Some(capabilities),
        Some(reschedule),
        Some(restart),
        Some(constraints),
        Some(placement),
        Some(disconnect),
    ) = (
        id,
        namespace,
        job_type,
        count,
        runner,
        runner_sha256,
        limits,
        tasks,
        capabilities,
        reschedule,
        restart,
        constraints,
        placement,
        disconnect,
    )
    else {
        return Err(problems.0);
    };
    if tasks.is_empty() {
        tasks.push(Task {
            name: id.clone(),
            config: Vec::new(),
        });
    }
    let spec = JobSpec {
        id,
        namespace,
        job_type,
        count,
        runner,
        runner_sha256,
        limits,
        tasks,
        meta: raw.meta.into_iter().collect(),
        capabilities,
        reschedule,
        restart,
        update: UpdatePolicy {
            carry_checkpoint: raw.update.and_then(|u| u.carry_checkpoint).unwrap_or(false),
        },
        constraints,
        placement,
        migrate: MigratePolicy {
            checkpoint: raw.migrate.and_then(|m| m.checkpoint).unwrap_or(true),
        },
        disconnect,
    };
    let stored = serde_json::to_vec(&spec).map_or(usize::MAX, |bytes| bytes.len());
    if stored > MAX_JOB_BYTES {
        return Err(vec![error(
            "job",
            format!(
                "is {stored} bytes as stored; at most {} KiB (its tasks' config and meta are \
                 copied into each of its allocs, each stored whole)",
                MAX_JOB_BYTES >> 10
            ),
        )]);
    }
    Ok(spec)
}

/// The problems found so far.
struct Problems(Vec<SpecError>);

impl Problems {
    /// The value checked, or `None` with its problem kept.
    fn keep<T>(&mut self, checked: Result<T, SpecError>) -> Option<T> {
        self.keep_all(checked.map_err(|problem| vec![problem]))
    }

    /// Every item checked, or `None` with the problems of all that failed kept.
    fn keep_each<T>(
        &mut self,
        items: impl Iterator<Item = Result<T, SpecError>>,
    ) -> Option<Vec<T>> {
        let (good, bad): (Vec<_>, Vec<_>) = items.partition(Result::is_ok);
        let bad: Vec<SpecError> = bad.into_iter().filter_map(Result::err).collect();
        self.keep_all(if bad.is_empty() {
            Ok(good.into_iter().filter_map(Result::ok).collect())
        } else {
            Err(bad)
        })
    }

    /// The value checked, or `None` with its problems kept, each named as a job file's
    /// field by `named`.
    fn keep_named<T, E>(
        &mut self,
        checked: Result<T, Vec<E>>,
        named: impl Fn(E) -> SpecError,
    ) -> Option<T> {
        self.keep_all(checked.map_err(|problems| problems.into_iter().map(named).collect()))
    }

    /// The value checked, or `None` with its problems kept.
    fn keep_all<T>(&mut self, checked: Result<T, Vec<SpecError>>) -> Option<T> {
        match checked {
            Ok(value) => Some(value),
            Err(problems) => {
                self.0.extend(problems);
                None
            }
        }
    }
}

fn job_id(id: Option<String>) -> Result<String, SpecError> {
    let id = id.ok_or_else(|| error("job.id", "missing"))?;
    let id_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if id.is_empty() || id.len() > 64 || !id.chars().all(id_chars) || id == "." || id == ".." {
        return Err(error(
            "job.id",
            format!(
                "{:?} must be 1 to 64 letters, digits, '-', '_' or '.'",
                crate::util::text::cut(&id, 80)
            ),
        ));
    }
    Ok(id)
}

fn job_type(text: Option<&str>) -> Result<JobType, SpecError> {
    match text {
        None => Err(error(
            "job.type",
            "missing; expected \"service\" or \"batch\"",
        )),
        Some("service") => Ok(JobType::Service),
        Some("batch") => Ok(JobType::Batch),
        Some(other) => Err(error(
            "job.type",
            format!(
                "unknown job type {:?}{}; expected \"service\" or \"batch\"",
                crate::util::text::cut(other, 64),
                super::problems::did_you_mean(other, &["service", "batch"])
            ),
        )),
    }
}

fn count(count: Option<i64>) -> Result<u32, SpecError> {
    match count {
        None => Err(error(
            "job.count",
            "missing; how many allocs to run, such as `count = 3`",
        )),
        Some(count) if !(0..=100_000).contains(&count) => Err(error(
            "job.count",
            format!("{count} is out of range; expected 0 to 100000"),
        )),
        Some(count) => Ok(count as u32),
    }
}

fn runner(runner: Option<String>) -> Result<String, SpecError> {
    let runner = runner.filter(|r| !r.trim().is_empty()).ok_or_else(|| {
        error(
            "job.runner",
            "missing; the path of the runner component (.wasm)",
        )
    })?;
    // A registry reference is kept as written; a path loses its `.` and `..` segments.
    Ok(if runner.starts_with("oci://") {
        runner
    } else {
        normalise_path(&runner)
    })
}

fn runner_sha256(sha256: Option<String>) -> Result<Option<String>, SpecError> {
    let Some(sha256) = sha256 else {
        return Ok(None);
    };
    let digits = sha256.strip_prefix("sha256:").unwrap_or(&sha256);
    if !crate::util::text::is_sha256_hex(digits) {
        return Err(error(
            "job.runner_sha256",
            format!(
                "{:?} is not a SHA-256: expected 64 lowercase hex digits, optionally after \
                 `sha256:`",
                crate::util::text::cut(&sha256, 80)
            ),
        ));
    }
    Ok(Some(digits.to_string()))
}

fn placement(text: Option<&str>) -> Result<Algorithm, SpecError> {
    match text {
        None | Some("binpack") => Ok(Algorithm::Binpack),
        Some("spread") => Ok(Algorithm::Spread),
        Some(other) => Err(error(
            "job.placement",
            format!(
                "unknown placement {:?}{}; expected \"binpack\" or \"spread\"",
                crate::util::text::cut(other, 64),
                super::problems::did_you_mean(other, &["binpack", "spread"])
            ),
        )),
    }
}

fn task_name(i: usize, name: Option<String>, taken: &[String]) -> Result<String, SpecError> {
    let field = format!("job.tasks[{i}].name");
    let name = name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| error(&field, "missing"))?;
    if taken.contains(&name) {
        return Err(error(field, format!("{name:?} is used by another task")));
    }
    if name.chars().any(char::is_control) {
        // A task's name is a line in logs, tables and runners' C strings.
        return Err(error(field, format!("{name:?} has a control character")));
    }
    Ok(name)
}
