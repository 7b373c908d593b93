//! Runner builds by content: this agent's runner store over HTTP. `PUT /v1/runner/{sha256}`
//! uploads a build (`caravan job run` does, before it registers), `GET` (and `HEAD`) serves
//! one (other agents fetch what they lack from here), and `GET /v1/runners` lists what this
//! agent holds. Each agent answers for its own store: these routes are never forwarded.
//!
//! An upload is streamed to the store, refused past the store's cap (at once when its
//! `Content-Length` says so), and kept only when its bytes hash to the name it was sent
//! under; an agent that has the build answers without reading the body.

use super::{ApiError, ApiResult, ApiState};
use crate::runner_store::{Put, PutError, is_sha256_hex};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The build of a path, or a 400 naming what is wrong with it.
fn build_name(sha256: &str) -> ApiResult<&str> {
    if is_sha256_hex(sha256) {
        Ok(sha256)
    } else {
        Err(ApiError::bad_request(
            "sha256",
            format!(
                "{:?} is not a SHA-256: expected 64 lowercase hex digits",
                crate::util::text::cut(sha256, 80)
            ),
        ))
    }
}

/// `GET /v1/runners`: the builds this agent's store holds.
pub(super) async fn list_builds(State(state): State<ApiState>) -> ApiResult<Json<Value>> {
    let store = state.runners.clone();
    let builds = tokio::task::spawn_blocking(move || store.list())
        .await
        .map_err(|e| internal(format!("listing the runner store stopped: {e}")))?
        .map_err(|e| internal(format!("cannot list the runner store: {e}")))?;
    let mut builds: Vec<Value> = builds
        .into_iter()
        .map(|build| {
            json!({
                "sha256": build.sha256,
                "size": build.size,
                "last_used_unix_ms": crate::util::timestamp::unix_ms(build.last_used),
            })
        })
        .collect();
    builds.sort_by(|a, b| a["sha256"].as_str().cmp(&b["sha256"].as_str()));
    Ok(Json(Value::Array(builds)))
}

/// `GET` and `HEAD /v1/runner/{sha256}`: the build's bytes, or 404 when this agent lacks it.
pub(super) async fn get_build(
    State(state): State<ApiState>,
    Path(sha256): Path<String>,
) -> ApiResult<Response> {
    let sha256 = build_name(&sha256)?;
    let Some(path) = state.runners.path(sha256) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("this agent has no runner build sha256:{sha256}"),
        ));
    };
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| internal(format!("cannot open runner build sha256:{sha256}: {e}")))?;
    let size = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    state.runners.touch(sha256);
    Ok((
        [
            (header::CONTENT_TYPE, "application/wasm".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(file_chunks(file)),
    )
        .into_response())
}

/// A file's bytes as a stream of chunks, for a body.
fn file_chunks(
    file: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> {
    use tokio::io::AsyncReadExt;
    futures_util::stream::try_unfold(file, |mut file| async move {
        let mut chunk = bytes::BytesMut::with_capacity(64 * 1024);
        match file.read_buf(&mut chunk).await? {
            0 => Ok(None),
            _ => Ok(Some((chunk.freeze(), file))),
        }
    })
}

/// `PUT /v1/runner/{sha256}`: stores the body as build `sha256` once its bytes are checked:
/// 201 when stored, 200 when this agent had it (the body is then not read).
pub(super) async fn put_build(
    State(state): State<ApiState>,
    Path(sha256): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let sha256 = build_name(&sha256)?.to_string();
    let store = &state.runners;
    let answer = |status: StatusCode, size: Option<u64>| {
        let body =
            json!({ "sha256": sha256, "size": size, "stored": status == StatusCode::CREATED });
        (status, Json(body)).into_response()
    };
    if let Some(path) = store.path(&sha256) {
        store.touch(&sha256);
        let size = std::fs::metadata(path).ok().map(|m| m.len());
        return Ok(answer(StatusCode::OK, size));
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > store.max_build_bytes()) {
        return Err(too_large(store.max_build_bytes()));
    }
    let upload = store.put_stream(&sha256, body.into_data_stream());
    let uploaded = tokio::time::timeout(UPLOAD_TIMEOUT, upload)
        .await
        .unwrap_or_else(|_| {
            Err(PutError::Interrupted(format!(
                "not all sent within {}s",
                UPLOAD_TIMEOUT.as_secs()
            )))
        });
    match uploaded {
        Ok(Put::Stored) => {
            tracing::info!(
                runner_sha256 = %crate::allocrunner::short_hash(&sha256),
                "runner build uploaded"
            );
            Ok(answer(StatusCode::CREATED, declared))
        }
        Ok(Put::AlreadyHad) => Ok(answer(StatusCode::OK, declared)),
        Err(PutError::TooLarge(max)) => Err(too_large(max)),
        Err(PutError::Io(error)) => Err(internal(format!(
            "the runner store could not write: {error}"
        ))),
        Err(refused) => Err(ApiError::bad_request("body", refused.to_string())),
    }
}

/// How long one upload may take: 256 MiB at a slow 0.5 MiB/s. A slower one holds the build's
/// turn (fetches of it wait) for no good reason.
const UPLOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

fn too_large(max: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the runner is over this agent's limit of {} ({max} bytes)",
            crate::util::units::format_bytes(max)
        ),
    )
}

fn internal(message: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
}
