//! Submitting a job, and asking what a submission would do: `POST /v1/jobs` registers,
//! `POST /v1/validate/job` checks, `POST /v1/job/{id}/plan` shows the plan. All three run the
//! same checks ([`check_job`]) first, so a job that validates is one that registers, and a
//! refused one changes nothing.
//!
//! The runner is checked here, on the agent that takes the job: its path must be absolute and
//! lead to a runner component this agent can load. Loading compiles it (once per build of
//! the runner, into the cache the agent's allocs start from), so the first placement does
//! not wait for a compile and a broken runner never registers. In a cluster every node loads
//! the runner from its own disk again when an alloc is placed there.

use super::{ApiError, ApiResult, ApiState};
use crate::jobspec::{self, JobSpec};
use crate::server::reconcile::JobChange;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Every check a job gets before anything changes: the document, its limits against the
/// caps and the defaults, its capabilities against the offer, and its runner. Returns the
/// job with its runner's SHA-256 set (which build it runs: a new build is a change of the
/// job), and the first digits of that SHA-256 to show.
async fn check_job(state: &ApiState, body: &str) -> ApiResult<(JobSpec, String)> {
    let mut spec = jobspec::parse_json(body)
        .map_err(|e| ApiError::bad_request(e.field.clone(), e.to_string()))?;
    state
        .limit_caps
        .check(&spec.limits)
        .map_err(|over| ApiError::bad_request(over.field(), over.to_string()))?;
    if let Some(conflict) = state.default_limits.with_overrides(&spec.limits).conflict() {
        return Err(ApiError::bad_request(
            "job.limits",
            format!("job.limits: {conflict}"),
        ));
    }
    state
        .capabilities
        .check(&spec.capabilities)
        .map_err(|refused| ApiError::bad_request(refused.key.clone(), refused.to_string()))?;
    let runner = std::path::PathBuf::from(&spec.runner);
    if !runner.is_absolute() {
        return Err(ApiError::bad_request(
            "job.runner",
            format!(
                "job.runner: {:?} is relative; the API needs an absolute path (`caravan job \
                 run` resolves a job file's relative path against the file's directory)",
                spec.runner
            ),
        ));
    }
    let runtime = state.runtime.clone();
    let loaded = tokio::task::spawn_blocking(move || runtime.load_file_now(&runner))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("loading the runner failed: {e}"),
            )
        })?
        .map_err(|e| ApiError::bad_request("job.runner", format!("job.runner: {e}")))?;
    let short_hash = crate::allocrunner::short_hash(&loaded.hash).to_string();
    spec.runner_sha256 = Some(loaded.hash.clone());
    Ok((spec, short_hash))
}

/// `POST /v1/jobs`: registers the job (or updates it when its id exists).
pub(super) async fn register_job(
    State(state): State<ApiState>,
    body: String,
) -> ApiResult<Json<Value>> {
    let server = state.server()?;
    let (spec, _) = check_job(&state, &body).await?;
    let job_id = spec.id.clone();
    let registration = server.register_job(spec)?;
    Ok(Json(json!({
        "job_id": job_id,
        "created": registration.created,
        "placed": registration.placed,
        "stopped": registration.stopped,
        "upgraded": registration.upgraded,
    })))
}

/// `POST /v1/validate/job`: the checks a registration gets, and nothing else. A write as far
/// as the token goes: it makes the agent read and compile a file.
pub(super) async fn validate_job(
    State(state): State<ApiState>,
    body: String,
) -> ApiResult<Json<Value>> {
    let (spec, runner_sha256) = check_job(&state, &body).await?;
    Ok(Json(json!({
        "job_id": spec.id,
        "valid": true,
        "runner": spec.runner,
        "runner_sha256": runner_sha256,
    })))
}

/// `POST /v1/job/{id}/plan`: what registering the job would do, computed by the same
/// reconciliation a registration applies, with nothing changed. Needs the token, as
/// validation does.
pub(super) async fn plan_job(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    body: String,
) -> ApiResult<Json<Value>> {
    let server = state.server()?;
    let (spec, runner_sha256) = check_job(&state, &body).await?;
    if spec.id != id {
        return Err(ApiError::bad_request(
            "job.id",
            format!("job.id: {:?} is not the job of this path ({id:?})", spec.id),
        ));
    }
    let (current_version, plan) = server.plan_job(&spec);
    let mut place_by_node: BTreeMap<String, usize> = BTreeMap::new();
    for node in &plan.plan.place {
        let node = node.clone().unwrap_or_else(|| "(no node yet)".into());
        *place_by_node.entry(node).or_default() += 1;
    }
    let change = match plan.change {
        JobChange::Create => "create",
        JobChange::Replace => "replace",
        JobChange::InPlace => "upgrade",
        JobChange::Same if plan.plan.place.is_empty() && plan.plan.stop.is_empty() => "none",
        JobChange::Same => "scale",
    };
    Ok(Json(json!({
        "job_id": spec.id,
        "change": change,
        "current_version": current_version,
        "version": plan.version,
        "place": plan.plan.place.len(),
        "place_by_node": place_by_node,
        "stop": plan.plan.stop,
        "upgrade": plan.plan.upgrade,
        "runner_sha256": runner_sha256,
    })))
}
