//! An alloc's files over HTTP, as Nomad's client fs API: `GET /v1/client/fs/ls/{id}?path=P`
//! answers what P is (a file's size, or a directory's entries) as JSON, and `GET
//! /v1/client/fs/cat/{id}?path=P` a file's bytes. P defaults to the alloc dir itself.
//! Files a runner leaves may hold what its job computed or kept, so both need the token,
//! when the agent has one.
//!
//! Like every handler these only translate: confinement to the alloc dir and the bounds
//! are [`crate::alloc_fs`]'s; the reads run on the blocking pool.

use super::allocs::local_alloc_id;
use super::{ApiError, ApiResult, ApiState};
use crate::alloc_fs::{self, FsError};
use crate::server::RequestError;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;

/// The alloc's directory on this node, for a request about `id` (an id or unique prefix).
fn alloc_dir(state: &ApiState, id: String) -> ApiResult<std::path::PathBuf> {
    let (alloc_id, known) = local_alloc_id(state, id)?;
    // An id the server does not know is only trusted when a runner here has it: it
    // becomes a path.
    if !known && state.client.runner(&alloc_id).is_none() {
        return Err(RequestError::AllocNotFound(alloc_id).into());
    }
    Ok(state.client.alloc_dir(&alloc_id))
}

fn path_of(query: &HashMap<String, String>) -> String {
    query.get("path").cloned().unwrap_or_default()
}

fn fs_error(error: FsError) -> ApiError {
    let status = match &error {
        FsError::NotFound { .. } | FsError::NoAllocDir => StatusCode::NOT_FOUND,
        FsError::Outside { .. }
        | FsError::LinkLoop { .. }
        | FsError::NotAPath { .. }
        | FsError::IsADirectory { .. }
        | FsError::NotAFile { .. }
        | FsError::TooLarge { .. } => StatusCode::BAD_REQUEST,
        FsError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let error = ApiError::new(status, error.to_string());
    if status == StatusCode::BAD_REQUEST {
        ApiError {
            field: Some("path".into()),
            ..error
        }
    } else {
        error
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FsError> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(fs_error)
}

pub(super) async fn list(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<super::TimedJson<alloc_fs::Stat>> {
    let dir = alloc_dir(&state, id)?;
    let path = path_of(&query);
    Ok(super::TimedJson(
        blocking(move || alloc_fs::stat(&dir, &path)).await?,
    ))
}

pub(super) async fn cat(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Response> {
    let dir = alloc_dir(&state, id)?;
    let path = path_of(&query);
    let bytes = blocking(move || alloc_fs::read(&dir, &path)).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}
