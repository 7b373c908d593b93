//! How the API shows jobs and allocs: the JSON views built from the server's records, and
//! [`TimedJson`], which gives every time in an answer an RFC 3339 twin.

use crate::allocrunner::{UpgradeOutcome, UpgradeReport};
use crate::model::jobspec::JobType;
use crate::model::structs::{ClientStatus, DesiredStatus, Reschedule, TaskState};
use crate::server::reconcile;
use crate::server::{AllocRecord, EmbeddedServer, JobRecord};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

fn default_namespace() -> String {
    crate::model::jobspec::DEFAULT_NAMESPACE.to_string()
}

/// A job as the API shows it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct JobView {
    /// Job id.
    pub id: String,
    /// Its namespace.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// `service` or `batch`.
    #[serde(rename = "type")]
    pub job_type: JobType,
    /// Allocs wanted.
    pub count: u32,
    /// Runner component path, as it was submitted (on the submitter's machine): a name.
    pub runner: String,
    /// The build every new alloc runs: the SHA-256 (hex) of the runner component, kept in
    /// the agents' runner stores (absent for a job saved before builds were named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_sha256: Option<String>,
    /// As Nomad's job summary reads: `running` (an alloc runs), `pending` (allocs wanted,
    /// none running yet: placed, waiting for a node, or restarting), `complete` (a batch job
    /// whose allocs all completed), `dead` (every alloc ended and none will run again: a
    /// batch job with a failure, a service job whose allocs all failed), or `stopped`. The
    /// counts of each alloc status are beside it, in `allocs`.
    pub status: String,
    /// Bumped by each change that replaced allocs.
    pub version: u64,
    /// The job's allocs by client status.
    pub allocs: BTreeMap<String, usize>,
    /// When an alloc of the job failed: what happens next, and why. Its runner restarting in
    /// place (`alloc 1a2b3c4d restarting in 5s (restart 1, ...)`, the client's, same alloc),
    /// or a new alloc from the server (`reschedule 2/3 in 8s (alloc 1a2b3c4d failed: ...)`,
    /// `reschedule limit reached: ...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<String>,
    /// When allocs of the job wait for a node that can hold them: how many, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<BlockedView>,
    /// Its tasks, each with the config its runner is given.
    #[serde(default)]
    pub tasks: Vec<TaskView>,
}

/// A job's task as the API shows it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskView {
    /// Its name.
    pub name: String,
    /// Its config, key by key.
    pub config: BTreeMap<String, String>,
}

/// Allocs of a job waiting for a node, and why.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct BlockedView {
    /// How many.
    pub allocs: usize,
    /// Why, in Nomad's words: `no node has 512 MiB free: 3 nodes exhausted memory, 1 node
    /// filtered by constraint ${node.class} = edge`.
    pub reason: String,
    /// The nodes registered: with none, the allocs only wait for the first.
    pub nodes: usize,
}

/// An alloc as the API shows it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct AllocView {
    /// Alloc id.
    pub id: String,
    /// Its job.
    pub job_id: String,
    /// The job version it was made for.
    #[serde(default)]
    pub job_version: u64,
    /// The runner component's path, as the job gives it.
    #[serde(default)]
    pub runner: String,
    /// The node it is placed on, if any yet.
    pub node_id: Option<String>,
    /// What the scheduler wants.
    pub desired_status: DesiredStatus,
    /// What the client last reported (`pending` before any report).
    pub client_status: ClientStatus,
    /// Why it is in that status.
    pub description: String,
    /// Grows with every server-side change.
    pub modify_index: u64,
    /// Its tasks' states, as last reported.
    pub task_states: Vec<TaskState>,
    /// Set when it replaces a failed alloc: which, its attempt, and when it may start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reschedule: Option<Reschedule>,
    /// What only the agent running it knows, in `GET /v1/allocation/{id}` from that agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalAllocView>,
}

/// What the agent whose client runs an alloc adds to its view.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct LocalAllocView {
    /// The alloc's directory on this machine (`/alloc` to its runner), while it exists:
    /// absent for a runner that reaches no files (no `wasi:filesystem` import), which is
    /// given none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_dir: Option<String>,
    /// The limits it runs under, the job's overrides over this agent's defaults: key (as a
    /// job file writes it) and value; those that differ from the defaults first.
    pub limits: Vec<(String, String)>,
    /// The keys of `limits` that differ from this agent's defaults.
    #[serde(default)]
    pub limits_changed: Vec<String>,
    /// CPU time spent for it since this agent started its runner, guest and host work, in
    /// microseconds (absent for a runner that does not measure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_used_us: Option<u64>,
    /// The most memory its instance held at once, in bytes (absent as above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    /// The SHA-256 (hex) of the runner component it runs (absent for a native runner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_sha256: Option<String>,
    /// Its runner's last upgrade in place, if it had one since this agent started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeView>,
}

/// An upgrade in place of an alloc's runner, as the local view shows it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct UpgradeView {
    /// The build it ran before (SHA-256, hex).
    pub from_sha256: String,
    /// The build asked for: its SHA-256, or the runner's path when it could not be loaded.
    pub to: String,
    /// `in_progress`, `done` or `failed`.
    pub status: String,
    /// Why it failed (absent unless it did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was asked for (Unix ms).
    pub asked_unix_ms: u64,
}

impl From<UpgradeReport> for UpgradeView {
    fn from(report: UpgradeReport) -> Self {
        let (status, reason) = match report.outcome {
            UpgradeOutcome::InProgress => ("in_progress", None),
            UpgradeOutcome::Done => ("done", None),
            UpgradeOutcome::Failed(why) => ("failed", Some(why)),
        };
        UpgradeView {
            from_sha256: report.from_sha256,
            to: report.to,
            status: status.into(),
            reason,
            asked_unix_ms: report.asked_unix_ms,
        }
    }
}

pub(super) fn alloc_view(record: &AllocRecord) -> AllocView {
    let state = record.client_state.clone();
    AllocView {
        id: record.alloc.id.clone(),
        job_id: record.alloc.job_id.clone(),
        job_version: record.job_version,
        runner: record.alloc.runner.clone(),
        node_id: record.node_id.clone(),
        desired_status: record.alloc.desired_status,
        client_status: state
            .as_ref()
            .map_or(ClientStatus::Pending, |s| s.client_status),
        description: state
            .as_ref()
            .map(|s| s.description.clone())
            .unwrap_or_default(),
        modify_index: record.alloc.modify_index,
        task_states: state.map(|s| s.task_states).unwrap_or_default(),
        reschedule: record.alloc.reschedule.clone(),
        local: None,
    }
}

/// `server`: the job's (for its restart limit and why allocs wait); `now_unix_ms`: the time
/// the view is for.
pub(super) fn job_view(
    server: &EmbeddedServer,
    job: &JobRecord,
    allocs: &[AllocRecord],
    now_unix_ms: u64,
) -> JobView {
    let reschedule_limit = server.reschedule_limit();
    let views: Vec<AllocView> = allocs.iter().map(alloc_view).collect();
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for view in &views {
        *by_status.entry(view.client_status.to_string()).or_default() += 1;
    }
    let blocked = server.blocked(&job.spec.id);
    let status = job_status(job, &views, blocked.is_some());
    JobView {
        id: job.spec.id.clone(),
        namespace: job.spec.namespace.clone(),
        job_type: job.spec.job_type,
        count: job.spec.count,
        runner: job.spec.runner.clone(),
        runner_sha256: job.spec.runner_sha256.clone(),
        status: status.into(),
        version: job.version,
        allocs: by_status,
        recovery: recovery_line(job, allocs, reschedule_limit, now_unix_ms),
        blocked: blocked.map(|(allocs, why)| BlockedView {
            allocs,
            reason: why.to_string(),
            nodes: why.nodes + why.ineligible,
        }),
        tasks: job
            .spec
            .tasks
            .iter()
            .map(|task| TaskView {
                name: task.name.clone(),
                config: task.config.iter().cloned().collect(),
            })
            .collect(),
    }
}

/// A job's status from its allocs, as Nomad's job summary reads (see [`JobView::status`]).
/// `waiting`: some of its allocs wait for a node. A batch job whose allocs were collected
/// reads `dead`: how they ended is not known any more.
fn job_status(job: &JobRecord, allocs: &[AllocView], waiting: bool) -> &'static str {
    let any = |status: ClientStatus| allocs.iter().any(|a| a.client_status == status);
    let live = allocs.iter().any(|a| !a.client_status.is_terminal());
    if job.stopped {
        "stopped"
    } else if any(ClientStatus::Running) {
        "running"
    } else if live || waiting || (allocs.is_empty() && job.spec.job_type == JobType::Service) {
        "pending"
    } else if job.spec.job_type == JobType::Batch
        && !allocs.is_empty()
        && allocs
            .iter()
            .all(|a| a.client_status == ClientStatus::Complete)
    {
        "complete"
    } else {
        "dead"
    }
}

/// What `job status` says of a job whose allocs failed: the next restart, or that there will
/// be none, with the failure that caused it.
fn recovery_line(
    job: &JobRecord,
    allocs: &[AllocRecord],
    reschedule_limit: u32,
    now_unix_ms: u64,
) -> Option<String> {
    // A runner restarting in place (`[job.restart]`) says so in its alloc's description.
    let in_place = allocs.iter().find_map(|a| {
        let state = a.client_state.as_ref()?;
        (a.is_wanted()
            && state.client_status == ClientStatus::Pending
            && state
                .description
                .starts_with(crate::model::restart::RESTARTING_DESCRIPTION_PREFIX))
        .then(|| {
            let short: String = a.alloc.id.chars().take(8).collect();
            format!("alloc {short} {}", state.description)
        })
    });
    if in_place.is_some() {
        return in_place;
    }
    let policy = reconcile::reschedule_policy(&job.spec, reschedule_limit)?;
    let failure = |alloc_id: &str| {
        let failed = allocs.iter().find(|a| a.alloc.id == alloc_id);
        let description = failed
            .and_then(|a| a.client_state.as_ref())
            .map_or("", |s| s.description.as_str());
        let short: String = alloc_id.chars().take(8).collect();
        format!("alloc {short} failed: {description}")
    };
    let waiting = allocs.iter().find_map(|a| {
        let reschedule = a.alloc.reschedule.as_ref()?;
        let pending = a.client_state.is_none()
            || a.client_state
                .as_ref()
                .is_some_and(|s| s.client_status == ClientStatus::Pending);
        (a.is_wanted() && pending && reschedule.start_after_unix_ms > now_unix_ms)
            .then_some(reschedule)
    });
    if let Some(next) = waiting {
        let wait = Duration::from_millis(next.start_after_unix_ms - now_unix_ms);
        return Some(format!(
            "reschedule {}/{} in {}s ({})",
            next.attempt,
            policy.attempts_text(),
            wait.as_secs_f64().ceil() as u64,
            failure(&next.previous_alloc_id)
        ));
    }
    let given_up = allocs.iter().find(|a| {
        !job.stopped
            && !a.replaced
            && a.job_version == job.version
            && a.alloc.desired_status == DesiredStatus::Run
            && a.client_state
                .as_ref()
                .is_some_and(|s| s.client_status == ClientStatus::Failed)
    })?;
    Some(format!(
        "reschedule limit reached: {} in {} ({})",
        policy.attempts_text(),
        policy.written.duration("interval", policy.interval),
        failure(&given_up.alloc.id)
    ))
}

/// A JSON answer in which every `NAME_unix_ms` field (a number, or a list of numbers) gets a
/// twin `NAME` holding the same time(s) in RFC 3339 UTC (`2026-12-01T18:09:42.791Z`), for
/// people and tools that read dates, while programs keep the exact milliseconds. A field
/// already called `NAME` is left alone.
pub struct TimedJson<T>(pub T);

impl<T: Serialize> axum::response::IntoResponse for TimedJson<T> {
    fn into_response(self) -> axum::response::Response {
        match serde_json::to_value(&self.0) {
            Ok(mut value) => {
                add_rfc3339_twins(&mut value);
                axum::Json(value).into_response()
            }
            // Unreachable for the views (plain data), but an answer must not panic.
            Err(error) => (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(serde_json::json!({ "error": error.to_string() })),
            )
                .into_response(),
        }
    }
}

fn add_rfc3339_twins(value: &mut serde_json::Value) {
    use crate::util::timestamp::rfc3339_from_unix_ms;
    use serde_json::Value;
    match value {
        Value::Array(items) => items.iter_mut().for_each(add_rfc3339_twins),
        Value::Object(fields) => {
            let mut twins = Vec::new();
            for (key, field) in fields.iter_mut() {
                let Some(name) = key.strip_suffix("_unix_ms") else {
                    add_rfc3339_twins(field);
                    continue;
                };
                let twin = match field {
                    Value::Number(ms) => ms.as_u64().map(|ms| rfc3339_from_unix_ms(ms).into()),
                    Value::Array(list) => list
                        .iter()
                        .map(|ms| ms.as_u64().map(|ms| Value::from(rfc3339_from_unix_ms(ms))))
                        .collect::<Option<Vec<Value>>>()
                        .map(Value::Array),
                    _ => None,
                };
                if let Some(twin) = twin {
                    twins.push((name.to_string(), twin));
                }
            }
            for (name, twin) in twins {
                fields.entry(name).or_insert(twin);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::add_rfc3339_twins;
    use serde_json::json;

    #[test]
    fn every_unix_ms_field_gets_an_rfc3339_twin_at_any_depth() {
        let mut value = json!({
            "task_states": [{"events": [{"kind": "Started", "time_unix_ms": 1796058410964u64}]}],
            "reschedule": {"start_after_unix_ms": 0, "history_unix_ms": [1000, 61000]},
            "at": "kept", "at_unix_ms": 5,
            "odd_unix_ms": "not a number",
        });
        add_rfc3339_twins(&mut value);
        assert_eq!(
            value["task_states"][0]["events"][0]["time"],
            "2026-11-30T17:06:50.964Z"
        );
        assert_eq!(
            value["reschedule"]["start_after"],
            "1970-01-01T00:00:00.000Z"
        );
        assert_eq!(
            value["reschedule"]["history"],
            json!(["1970-01-01T00:00:01.000Z", "1970-01-01T00:01:01.000Z"])
        );
        assert_eq!(value["at"], "kept", "an existing field stays");
        assert!(value.get("odd").is_none());
    }
}
