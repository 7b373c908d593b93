//! Nodes, as the operator sees them (`GET /v1/nodes`): which are ready, how many allocs
//! each runs, what each said of itself (class, pool, meta, attributes, memory and slots,
//! with the memory its allocs reserve) and, in cluster mode, each live node's agent and
//! last heartbeat. What nodes
//! themselves call is in `node_rpc`.

use super::body::{JsonBody, RequestBody};
use super::{ApiError, ApiResult, ApiState};
use crate::server::drain::NodeSchedule;
use crate::server::{DrainRequest, NodeDetails};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use std::collections::BTreeMap;

/// Every node: those allocs are placed on (`ready`), and in cluster mode every other node
/// that ever registered (`down`), with how many allocs each runs; in cluster mode, also each
/// live node's agent address and how many seconds ago it last renewed its lease.
pub(super) async fn list_nodes(
    State(state): State<ApiState>,
) -> ApiResult<Json<Vec<serde_json::Value>>> {
    let server = state.server()?;
    let details: BTreeMap<String, NodeDetails> = server
        .node_details()
        .into_iter()
        .map(|details| (details.id.clone(), details))
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
                if let Some(NodeDetails {
                    info,
                    used,
                    schedule,
                    ..
                }) = details.get(&node)
                {
                    view["eligibility"] = eligibility(schedule).into();
                    view["drain"] = serde_json::json!(schedule.drain);
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

fn eligibility(schedule: &NodeSchedule) -> &'static str {
    if schedule.eligible() {
        "eligible"
    } else {
        "ineligible"
    }
}

/// A node's schedule as the drain and eligibility routes answer it.
fn schedule_view(node: &str, schedule: &NodeSchedule) -> serde_json::Value {
    serde_json::json!({
        "node": node,
        "eligibility": eligibility(schedule),
        "drain": schedule.drain,
    })
}

/// The body of `POST /v1/node/{node}/drain`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DrainBody {
    enable: bool,
    /// `5m`, `1h`...; absent: no deadline.
    #[serde(default)]
    deadline: Option<String>,
    #[serde(default)]
    ignore_system: bool,
    /// With `enable = false`: leave the node ineligible.
    #[serde(default)]
    keep_ineligible: bool,
}

impl RequestBody for DrainBody {
    const EXAMPLE: &'static str = r#"{"enable": true, "deadline": "5m", "ignore_system": false} or {"enable": false, "keep_ineligible": false}"#;
}

/// `POST /v1/node/{node}/drain`: starts or ends the node's drain (Nomad's `node drain
/// -enable|-disable`). 404 for a node not registered, 400 for a deadline that does not
/// parse; nothing changes on a refusal.
pub(super) async fn drain_node(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    JsonBody(body): JsonBody<DrainBody>,
) -> ApiResult<Json<serde_json::Value>> {
    let server = state.server()?;
    let drain = match body.enable {
        false => None,
        true => {
            let deadline = match &body.deadline {
                None => None,
                Some(text) => Some(
                    crate::util::units::parse_duration(text)
                        .map_err(|e| ApiError::bad_request("deadline", format!("deadline: {e}")))?,
                ),
            };
            Some(DrainRequest {
                deadline,
                ignore_system: body.ignore_system,
            })
        }
    };
    let schedule = server.set_drain(&node, drain, body.keep_ineligible)?;
    Ok(Json(schedule_view(&node, &schedule)))
}

/// The body of `POST /v1/node/{node}/eligibility`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EligibilityBody {
    eligible: bool,
}

impl RequestBody for EligibilityBody {
    const EXAMPLE: &'static str = r#"{"eligible": false}"#;
}

/// `POST /v1/node/{node}/eligibility`: whether new allocs may go to the node (Nomad's `node
/// eligibility -enable|-disable`). 404 for a node not registered; 409 to make a draining
/// node eligible.
pub(super) async fn set_eligibility(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    JsonBody(body): JsonBody<EligibilityBody>,
) -> ApiResult<Json<serde_json::Value>> {
    let server = state.server()?;
    let schedule = server.set_eligibility(&node, body.eligible)?;
    Ok(Json(schedule_view(&node, &schedule)))
}
