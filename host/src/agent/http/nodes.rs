//! Nodes, as the operator sees them (`GET /v1/nodes`): which are ready, how many allocs
//! each runs, what each said of itself (class, pool, meta, attributes, memory and slots,
//! with the memory its allocs reserve) and, in cluster mode, each live node's agent and
//! last heartbeat. What nodes
//! themselves call is in `node_rpc`.

use super::{ApiError, ApiResult, ApiState};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use std::collections::BTreeMap;

/// Every node: those allocs are placed on (`ready`), and in cluster mode every other node
/// that ever registered (`down`), with how many allocs each runs; in cluster mode, also each
/// live node's agent address and how many seconds ago it last renewed its lease.
pub(super) async fn list_nodes(
    State(state): State<ApiState>,
) -> ApiResult<Json<Vec<serde_json::Value>>> {
    let server = state.server()?;
    let details: BTreeMap<String, _> = server
        .node_details()
        .into_iter()
        .map(|(id, info, used)| (id, (info, used)))
        .collect();
    let allocs = server.allocs();
    let ready: std::collections::BTreeSet<String> = server.nodes().into_iter().collect();
    let mut nodes: BTreeMap<String, (bool, usize)> =
        ready.iter().map(|n| (n.clone(), (true, 0))).collect();
    for alloc in &allocs {
        if let Some(node) = &alloc.node_id {
            let entry = nodes
                .entry(node.clone())
                .or_insert((ready.contains(node), 0));
            entry.1 += usize::from(!alloc.is_terminal());
        }
    }
    let etcd_failed = |error: crate::cluster::StoreError| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
    };
    let live = match &state.forwarding {
        Some(cluster) => {
            // Every node that ever registered is listed, down ones holding nothing too.
            for node in cluster.registered_nodes().await.map_err(etcd_failed)? {
                nodes.entry(node).or_insert((false, 0));
            }
            cluster.live_members().await.map_err(etcd_failed)?
        }
        None => Vec::new(),
    };
    Ok(Json(
        nodes
            .into_iter()
            .map(|(node, (ready, running))| {
                let status = if ready { "ready" } else { "down" };
                let mut view =
                    serde_json::json!({ "id": node, "status": status, "allocs": running });
                if let Some((info, used)) = details.get(&node) {
                    view["class"] = info.class.clone().into();
                    view["pool"] = info.pool.clone().into();
                    view["meta"] = serde_json::json!(info.meta);
                    view["attributes"] = serde_json::json!(info.attributes);
                    view["memory_bytes"] = info.resources.memory_bytes.into();
                    view["memory_reserved_bytes"] = used.memory_bytes.into();
                    view["alloc_slots"] = info.resources.alloc_slots.into();
                }
                if let Some(member) = live.iter().find(|m| m.record.node == node) {
                    view["address"] = member.record.api.clone().into();
                    view["last_heartbeat_secs"] =
                        member.since_heartbeat.map(|age| age.as_secs()).into();
                }
                view
            })
            .collect(),
    ))
}
