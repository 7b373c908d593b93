//! The node routes: [`crate::rpc::ServerApi`] served over HTTP, so that client nodes in
//! another process (`caravan nodesim --server`) register with this agent's embedded server
//! and run its allocs. Paths and bodies are [`crate::rpc::http`]'s.
//!
//! Every node route needs the agent's ACL token when it has one, the watch too: a node
//! that watches is registered, and allocs are placed on it.
//!
//! Only a single agent serves them. In cluster mode nodes join through etcd, where the
//! cluster's allocs live; a node here would bypass it, so it is refused with 409 naming the
//! way in. The agent's own node name (`local`) is refused too: two clients acting on one
//! node's allocs would kill each other's.

use super::body::{RequestBody, decode};
use super::{ApiError, ApiResult, ApiState};
use crate::agent::LOCAL_NODE;
use crate::model::node::NodeInfo;
use crate::model::structs::Alloc;
use crate::rpc::http::{FetchRequest, MAX_ITEMS_PER_CALL, MAX_WAIT, UpdateRequest, UpdateResponse};
use crate::rpc::{ServerApi, ServerError};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The largest request body the node routes take: a full batch of updates, each with its
/// task events, fits with room to spare.
pub const MAX_NODE_REQUEST_BYTES: usize = 32 << 20;

/// `PUT /v1/node/{node}/register`, with what the node says of itself (a [`NodeInfo`];
/// an empty body is a node that says nothing).
pub async fn register_node(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    body: String,
) -> ApiResult<Json<serde_json::Value>> {
    let server = node_server(&state, &node)?;
    let info: NodeInfo = decode(&body)?;
    info.check()
        .map_err(|problem| ApiError::bad_request("body", format!("node {node:?}: {problem}")))?;
    server
        .register_node(&node, &info)
        .await
        .map_err(server_error)?;
    Ok(Json(serde_json::json!({ "node": node })))
}

/// `GET /v1/node/{node}/allocations?index=N&wait=D`. A read, but it needs the token as
/// writes do: a node that watches is registered and gets allocs placed on it.
pub async fn watch_allocs(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<crate::rpc::NodeAllocs>> {
    let server = node_server(&state, &node)?;
    let min_index = match query.get("index") {
        None => 0,
        Some(text) => text.parse::<u64>().map_err(|_| {
            ApiError::bad_request("index", format!("index: {text:?} is not a whole number"))
        })?,
    };
    let wait = match query.get("wait") {
        None => Duration::ZERO,
        Some(text) => crate::util::units::parse_duration(text)
            .map_err(|e| ApiError::bad_request("wait", format!("wait: {e}")))?,
    };
    let answer = server
        .watch_allocs(&node, min_index, wait.min(MAX_WAIT))
        .await
        .map_err(server_error)?;
    Ok(Json(answer))
}

/// `POST /v1/node/{node}/allocations/fetch`: only the node's own allocs are answered.
pub async fn fetch_allocs(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    body: String,
) -> ApiResult<Json<Vec<Alloc>>> {
    let server = node_server(&state, &node)?;
    let request: FetchRequest = decode(&body)?;
    check_count("ids", request.ids.len())?;
    let own = server.placed_on(&node, &request.ids);
    let ids: Vec<String> = request
        .ids
        .into_iter()
        .filter(|id| own.contains(id))
        .collect();
    let allocs = server.get_allocs(&ids).await.map_err(server_error)?;
    Ok(Json(allocs.iter().map(|a| Alloc::clone(a)).collect()))
}

/// `POST /v1/node/{node}/allocations/update`: updates for allocs that are not the node's are
/// dropped, not accepted (a node reports only on what it runs).
pub async fn update_allocs(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    body: String,
) -> ApiResult<Json<UpdateResponse>> {
    let server = node_server(&state, &node)?;
    let request: UpdateRequest = decode(&body)?;
    check_count("updates", request.updates.len())?;
    let own = server.placed_on(&node, request.updates.iter().map(|u| &u.alloc_id));
    let updates: Vec<_> = request
        .updates
        .into_iter()
        .filter(|u| own.contains(&u.alloc_id))
        .collect();
    let accepted = server.update_allocs(&updates).await.map_err(server_error)?;
    Ok(Json(UpdateResponse { accepted }))
}

/// The embedded server, for `node`: refused when the name cannot be a node's or is the
/// agent's own.
fn node_server(state: &ApiState, node: &str) -> ApiResult<Arc<crate::server::EmbeddedServer>> {
    crate::cluster::keys::valid_node_name(node).map_err(|e| ApiError::bad_request("node", e))?;
    if node == LOCAL_NODE {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("node name {LOCAL_NODE:?} is this agent's own node; choose another"),
        ));
    }
    embedded_server(state)
}

fn embedded_server(state: &ApiState) -> ApiResult<Arc<crate::server::EmbeddedServer>> {
    if state.forwarding.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "this agent is in cluster mode: nodes join through etcd \
             (caravan nodesim --cluster etcd --etcd-endpoints ...)",
        ));
    }
    state.server()
}

/// A server's refusal is 409 (the node cannot be taken: too many); anything else is 503,
/// for the node to retry.
fn server_error(error: ServerError) -> ApiError {
    let status = match error {
        ServerError::Refused(_) => StatusCode::CONFLICT,
        ServerError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    ApiError::new(status, error.to_string())
}

impl RequestBody for FetchRequest {
    const EXAMPLE: &'static str = r#"{"ids": ["<alloc id>", ...]}"#;
}

impl RequestBody for NodeInfo {
    const EXAMPLE: &'static str = r#"{"class": "edge", "pool": "default", "meta": {"rack": "r1"}, "resources": {"memory_bytes": 8589934592, "alloc_slots": 1000}}"#;

    fn when_empty() -> Option<Self> {
        Some(NodeInfo::default())
    }
}

impl RequestBody for UpdateRequest {
    const EXAMPLE: &'static str = r#"{"updates": [{"alloc_id": "...", "state": {...}}, ...]}"#;
}

fn check_count(field: &str, count: usize) -> ApiResult<()> {
    if count > MAX_ITEMS_PER_CALL {
        return Err(ApiError::bad_request(
            field,
            format!("{field}: {count} items; at most {MAX_ITEMS_PER_CALL} per request"),
        ));
    }
    Ok(())
}
