//! The series the agent samples for the web UI's plots (`agent::series`): an alloc's CPU and
//! memory, answered by the agent of its node, and a job's allocs over time, answered where
//! the cluster's server is (forwarded to the leader, as every job route).

use super::allocs::local_alloc_id;
use super::{ApiResult, ApiState};
use crate::agent::series::NOT_FOLLOWED;
use axum::Json;
use axum::extract::{Path, State};
use serde_json::{Value, json};

/// `GET /v1/client/allocation/{id}/usage`: the alloc's CPU and memory samples on this node,
/// oldest first (`note` says why there are none).
pub(super) async fn allocation_usage(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let (alloc_id, _) = local_alloc_id(&state, id)?;
    let samples = state.series.alloc(&alloc_id);
    let note = match (&samples, state.client.runner(&alloc_id)) {
        (Some(_), _) => None,
        (None, None) => Some("not sampled: its runner is not on this node"),
        (None, Some(runner)) if runner.usage().is_none() => {
            Some("not sampled: its runner does not measure its usage")
        }
        (None, Some(_)) if state.series.allocs_full() => Some(NOT_FOLLOWED),
        (None, Some(_)) => Some("not sampled yet"),
    };
    Ok(Json(json!({
        "alloc_id": alloc_id,
        "interval_ms": state.sample_interval.as_millis() as u64,
        "samples": samples.unwrap_or_default(),
        "note": note,
    })))
}

/// `GET /v1/job/{id}/series`: the job's allocs by status, sampled by this agent's server
/// since it started (or, in a cluster, since this agent leads), oldest first.
pub(super) async fn job_series(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let server = state.server()?;
    let job = server.job(&id)?;
    Ok(Json(json!({
        "job_id": job.spec.id,
        "interval_ms": state.sample_interval.as_millis() as u64,
        "samples": state.series.job(&job.spec.id).unwrap_or_default(),
    })))
}
