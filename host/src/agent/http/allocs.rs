//! Allocations: listing and reading them (with what this node's client adds for one it
//! runs), stopping one, collecting one, and its log (`?follow=true` streams it until the
//! alloc stops). Signals and restarts are in `alloc_actions`, its files in `alloc_fs`.

use super::views::{LocalAllocView, alloc_view};
use super::{AllocView, ApiError, ApiResult, ApiState, TimedJson, flag};
use crate::client::Client;
use crate::client::gc::GcError;
use crate::server::{AllocRecord, EmbeddedServer, RequestError};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::Arc;

pub(super) async fn list_allocations(
    State(state): State<ApiState>,
) -> ApiResult<TimedJson<Vec<AllocView>>> {
    Ok(TimedJson(
        state.server()?.allocs().iter().map(alloc_view).collect(),
    ))
}

/// Finds an alloc by id or unique id prefix, as Nomad's CLI allows.
pub(super) fn find_alloc(state: &ApiState, id_or_prefix: &str) -> ApiResult<AllocRecord> {
    let server = state.server()?;
    if let Ok(record) = server.alloc(id_or_prefix) {
        return Ok(record);
    }
    let matches: Vec<AllocRecord> = server
        .allocs()
        .into_iter()
        .filter(|a| !id_or_prefix.is_empty() && a.alloc.id.starts_with(id_or_prefix))
        .collect();
    match matches.len() {
        0 => Err(RequestError::AllocNotFound(id_or_prefix.to_string()).into()),
        1 => Ok(matches.into_iter().next().expect("one match")),
        n => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("alloc id prefix {id_or_prefix:?} matches {n} allocations"),
        )),
    }
}

pub(super) async fn get_allocation(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<TimedJson<AllocView>> {
    let record = find_alloc(&state, &id)?;
    let mut view = alloc_view(&record);
    view.local = local_view(&state, &record.alloc.id);
    Ok(TimedJson(view))
}

/// What this node's client knows of an alloc it runs: the `local` part of an alloc's view,
/// for the agent of the node running it (where a cluster routes this request).
pub(super) async fn get_local_allocation(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<LocalAllocView>> {
    let (alloc_id, _) = local_alloc_id(&state, id)?;
    local_view(&state, &alloc_id).map(Json).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("allocation {alloc_id} does not run on this node"),
        )
    })
}

/// `GET /v1/client/allocation/{id}/checkpoint`: the final checkpoint of an alloc this node
/// shut down to move it (a drain), for the node of the alloc that replaces it: 200 with
/// its bytes, 204 when its runner saved none, 409 while it still runs, 404 when it is not
/// on this node. Needs the token: it is the guest's own state.
pub(super) async fn allocation_checkpoint(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    use crate::client::migrate::CheckpointUnavailable;
    let (alloc_id, _) = local_alloc_id(&state, id)?;
    match state.client.migration_checkpoint(&alloc_id).await {
        Ok(Some(bytes)) => {
            Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
        }
        Ok(None) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(refused @ CheckpointUnavailable::Unknown(_)) => {
            Err(ApiError::new(StatusCode::NOT_FOUND, refused.to_string()))
        }
        Err(refused @ CheckpointUnavailable::NotFinal(_)) => {
            Err(ApiError::new(StatusCode::CONFLICT, refused.to_string()))
        }
        Err(refused @ CheckpointUnavailable::Store(..)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            refused.to_string(),
        )),
    }
}

fn local_view(state: &ApiState, alloc_id: &str) -> Option<LocalAllocView> {
    let runner = state.client.runner(alloc_id)?;
    let limits = state.default_limits.with_overrides(&runner.alloc().limits);
    let defaults = state.default_limits.shown();
    // The limits its job changed first (what an operator looks for), then the defaults.
    let (changed, unchanged): (Vec<_>, Vec<_>) = limits
        .shown()
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .partition(|(key, value)| !defaults.iter().any(|(k, v)| k == key && v == value));
    // What its job set reads as the job wrote it (`60s`, not `1m`).
    let alloc = runner.alloc();
    let as_written = |(key, value): (String, String)| {
        let written = alloc.limits.written.get(&key);
        let written = written.map(|text| crate::util::text::cut(text, 64).into_owned());
        (key, written.unwrap_or(value))
    };
    let changed: Vec<(String, String)> = changed.into_iter().map(as_written).collect();
    let usage = runner.usage();
    let alloc_dir = state.client.alloc_dir(alloc_id);
    Some(LocalAllocView {
        alloc_dir: alloc_dir.is_dir().then(|| alloc_dir.display().to_string()),
        limits_changed: changed.iter().map(|(key, _)| key.clone()).collect(),
        limits: changed.into_iter().chain(unchanged).collect(),
        cpu_used_us: usage.map(|u| u.cpu_used.as_micros() as u64),
        memory_peak_bytes: usage.map(|u| u.memory_peak_bytes),
        runner_sha256: runner.runner_sha256(),
        upgrade: runner.last_upgrade().map(Into::into),
    })
}

pub(super) async fn stop_allocation(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let record = find_alloc(&state, &id)?;
    state.server()?.stop_alloc(&record.alloc.id)?;
    Ok(Json(serde_json::json!({ "alloc_id": record.alloc.id })))
}

pub(super) async fn collect_allocation(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let (alloc_id, _) = local_alloc_id(&state, id)?;
    match state.client.collect(&alloc_id).await {
        Ok(()) => Ok(Json(
            serde_json::json!({ "alloc_id": alloc_id, "collected": true }),
        )),
        Err(error @ GcError::UnknownAlloc(_)) => {
            Err(ApiError::new(StatusCode::NOT_FOUND, error.to_string()))
        }
        Err(error @ GcError::NotTerminal { .. }) => {
            Err(ApiError::new(StatusCode::CONFLICT, error.to_string()))
        }
    }
}

pub(super) async fn allocation_logs(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Response> {
    let follow = flag(&query, "follow")?;
    let (alloc_id, known) = local_alloc_id(&state, id)?;
    if !known && state.client.runner(&alloc_id).is_none() {
        return Err(RequestError::AllocNotFound(alloc_id).into());
    }
    let content_type = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    if !follow {
        let text = state.alloc_logs.read(&alloc_id).await.map_err(|error| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot read the logs of alloc {alloc_id}: {error}"),
            )
        })?;
        return Ok((content_type, text).into_response());
    }
    // Everything kept, then whatever is appended, until the alloc has stopped.
    let stopped = AllocStopped {
        server: state.servers.borrow().clone(),
        client: state.client.clone(),
        alloc_id: alloc_id.clone(),
    };
    let follower = state.alloc_logs.follow(&alloc_id, move || stopped.check());
    let chunks = futures_util::stream::try_unfold(follower, |mut follower| async move {
        let chunk = follower.next_chunk().await?;
        Ok::<_, std::io::Error>(chunk.map(|chunk| (axum::body::Bytes::from(chunk), follower)))
    });
    Ok((content_type, axum::body::Body::from_stream(chunks)).into_response())
}

/// Whether a followed alloc has stopped, as the server and this client know it.
struct AllocStopped {
    server: Option<Arc<EmbeddedServer>>,
    client: Client,
    alloc_id: String,
}

impl AllocStopped {
    /// True once the alloc's runner has stopped, or the server no longer has the alloc, or
    /// the server knows it is terminal and this client never ran it.
    fn check(&self) -> bool {
        if let Some(runner) = self.client.runner(&self.alloc_id) {
            return runner.wait().is_set();
        }
        let Some(server) = &self.server else {
            return true;
        };
        match server.alloc(&self.alloc_id) {
            Err(_) => true,
            Ok(record) => record
                .client_state
                .is_some_and(|s| s.client_status.is_terminal()),
        }
    }
}

/// The full id of `id` (an id or a unique prefix) for this node's client routes, and
/// whether the server knows it. The server may already have dropped an alloc the client
/// still holds, and in cluster mode an agent that does not lead has no server: then the id
/// as given.
pub(super) fn local_alloc_id(state: &ApiState, id: String) -> ApiResult<(String, bool)> {
    match find_alloc(state, &id) {
        Ok(record) => Ok((record.alloc.id.clone(), true)),
        Err(error)
            if matches!(
                error.status,
                StatusCode::NOT_FOUND | StatusCode::SERVICE_UNAVAILABLE
            ) && !id.is_empty() =>
        {
            Ok((id, false))
        }
        Err(error) => Err(error),
    }
}
