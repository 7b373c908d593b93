//! Signalling an alloc's tasks and restarting them, as Nomad's client API does:
//! `POST /v1/client/allocation/{id}/signal` with `{"signal": "SIGUSR1", "task": "web"}` and
//! `POST /v1/client/allocation/{id}/restart` with `{"task": "web"}` (or no body), the task
//! being optional (every task of the alloc when absent). Both are writes: they need the token.
//!
//! Like every handler these only translate: the checks and the delivery are the client's and
//! the runner's ([`crate::allocrunner::AllocRunner::signal`]). They never change the server.

use super::body::{JsonBody, RequestBody};
use super::{ApiError, ApiResult, ApiState};
use crate::allocrunner::{NotRunningReason, TaskActionError};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SignalRequest {
    signal: String,
    #[serde(default)]
    task: Option<String>,
}

impl RequestBody for SignalRequest {
    const EXAMPLE: &'static str = r#"{"signal": "SIGUSR1", "task": "web"}"#;
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RestartRequest {
    #[serde(default)]
    task: Option<String>,
}

impl RequestBody for RestartRequest {
    const EXAMPLE: &'static str = r#"{"task": "web"} (or no body: every task)"#;

    fn when_empty() -> Option<Self> {
        Some(RestartRequest::default())
    }
}

pub(super) async fn signal_allocation(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<SignalRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    let (alloc_id, known_to_server) = super::allocs::local_alloc_id(&state, id)?;
    let task = request.task.as_deref();
    state
        .client
        .signal_alloc(&alloc_id, task, &request.signal)
        .map_err(|e| action_error(e, known_to_server))?;
    Ok(Json(serde_json::json!({
        "alloc_id": alloc_id,
        "signal": request.signal.to_ascii_uppercase(),
        "task": task,
    })))
}

pub(super) async fn restart_allocation(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<RestartRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    let (alloc_id, known_to_server) = super::allocs::local_alloc_id(&state, id)?;
    let task = request.task.as_deref();
    state
        .client
        .restart_alloc(&alloc_id, task)
        .map_err(|e| action_error(e, known_to_server))?;
    Ok(Json(
        serde_json::json!({ "alloc_id": alloc_id, "task": task }),
    ))
}

/// The answer to a refusal: 404 for an alloc nobody knows, 400 for a bad task or signal, 409
/// for an alloc that is not running. An alloc the server placed but this client has not
/// picked up yet has not started.
fn action_error(error: TaskActionError, known_to_server: bool) -> ApiError {
    let (status, field) = match &error {
        TaskActionError::UnknownAlloc(alloc_id) if known_to_server => {
            let not_started = TaskActionError::NotRunning {
                alloc_id: alloc_id.clone(),
                reason: NotRunningReason::NotStarted,
            };
            return ApiError::new(StatusCode::CONFLICT, not_started.to_string());
        }
        TaskActionError::UnknownAlloc(alloc_id) => {
            return crate::server::RequestError::AllocNotFound(alloc_id.clone()).into();
        }
        TaskActionError::UnknownTask { .. } => (StatusCode::BAD_REQUEST, Some("task")),
        TaskActionError::UnknownSignal(_) => (StatusCode::BAD_REQUEST, Some("signal")),
        TaskActionError::NotRunning { .. } => (StatusCode::CONFLICT, None),
        TaskActionError::Busy { .. } => (StatusCode::TOO_MANY_REQUESTS, None),
    };
    ApiError {
        status,
        message: error.to_string(),
        field: field.map(str::to_string),
    }
}
