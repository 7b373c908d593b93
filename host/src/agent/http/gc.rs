//! Garbage collection: this node's collector (`/v1/client/gc`: its state, and collecting
//! every terminal alloc now) and the server's (`PUT /v1/system/gc`).

use super::{ApiResult, ApiState, TimedJson};
use axum::Json;
use axum::extract::State;

pub(super) async fn gc_status(
    State(state): State<ApiState>,
) -> TimedJson<crate::client::gc::GcStatus> {
    TimedJson(state.client.gc().status())
}

pub(super) async fn collect_all(
    State(state): State<ApiState>,
) -> ApiResult<Json<serde_json::Value>> {
    state.client.collect_all().await;
    Ok(Json(serde_json::json!({ "collected": true })))
}

pub(super) async fn system_gc(State(state): State<ApiState>) -> ApiResult<Json<serde_json::Value>> {
    let removed = state.server()?.collect_garbage(true)?;
    Ok(Json(serde_json::json!({ "removed": removed })))
}
