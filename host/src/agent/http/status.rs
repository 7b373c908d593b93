//! What the agent says of itself and of the cluster it sees, answered here and never
//! forwarded: who leads, its health, etcd's space (cluster mode), and its metrics.

use super::ApiState;
use crate::util::histogram::write_instantiation_latency;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Who leads the cluster, as this agent last saw it (answered here, never forwarded).
pub(super) async fn leader(State(state): State<ApiState>) -> Json<serde_json::Value> {
    match &state.forwarding {
        None => Json(
            serde_json::json!({ "mode": "embedded", "leader": null, "this_agent_leads": true }),
        ),
        Some(forwarding) => {
            let view = forwarding.view();
            Json(serde_json::json!({
                "mode": "etcd",
                "leader": view.leader,
                "this_agent_leads": view.leading.is_some(),
            }))
        }
    }
}

/// The agent's health: in cluster mode, unhealthy (503) while etcd has an alarm raised or
/// did not answer the last probe, since then no write of the cluster can land.
pub(super) async fn health(State(state): State<ApiState>) -> Response {
    // What callers must present, for a page deciding whether to ask for a token.
    let acl = match (&state.acl.tokens, &state.acl.shared_token) {
        (Some(_), _) => "tokens",
        (None, Some(_)) => "shared_token",
        (None, None) => "off",
    };
    let Some(etcd) = &state.etcd else {
        return Json(serde_json::json!({ "ok": true, "acl": acl })).into_response();
    };
    let problem = match &*etcd.space.borrow() {
        crate::cluster::SpaceProbe::NotYet => None,
        crate::cluster::SpaceProbe::Answered(space) => space.alarm_line(),
        crate::cluster::SpaceProbe::Failed(reason) => Some(reason.clone()),
    };
    match problem {
        None => Json(serde_json::json!({ "ok": true, "acl": acl })).into_response(),
        Some(problem) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "ok": false, "acl": acl, "problems": [problem] })),
        )
            .into_response(),
    }
}

/// What etcd said of its space and alarms at this agent's last probe (answered here, never
/// forwarded), and the compactions this agent made while it led.
pub(super) async fn etcd_status(State(state): State<ApiState>) -> Json<serde_json::Value> {
    let Some(etcd) = &state.etcd else {
        return Json(serde_json::json!({ "mode": "embedded" }));
    };
    let mut answer = serde_json::json!({
        "mode": "etcd",
        "compactions": etcd.history.compactions(),
        "compacted_revision": etcd.history.compacted_revision(),
    });
    match &*etcd.space.borrow() {
        crate::cluster::SpaceProbe::NotYet => answer["probe"] = "pending".into(),
        crate::cluster::SpaceProbe::Failed(reason) => {
            answer["probe"] = "failed".into();
            answer["error"] = reason.clone().into();
        }
        crate::cluster::SpaceProbe::Answered(space) => {
            answer["probe"] = "answered".into();
            answer["space"] = serde_json::to_value(space).unwrap_or_default();
            answer["problem"] = space.alarm_line().into();
        }
    }
    Json(answer)
}

pub(super) async fn metrics(State(state): State<ApiState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics_text(&state),
    )
}

/// Every metric of this agent, in Prometheus's text format: what `/v1/metrics` serves and
/// the OTLP export sends.
pub fn metrics_text(state: &ApiState) -> String {
    let mut text = String::new();
    state.client.metrics().write_prometheus(&mut text);
    // In cluster mode, only the leader has a server to count.
    if let Some(server) = state.servers.borrow().clone() {
        server.write_prometheus(&mut text);
    }
    write_instantiation_latency(state.runtime.instantiation_latency(), &mut text);
    crate::util::prometheus::single(
        &mut text,
        "caravan_runner_descriptors_held",
        crate::util::prometheus::Kind::Gauge,
        "Host file descriptors runners hold now, all together (files they opened).",
        state.runtime.descriptors_held(),
    );
    if let Some(etcd) = &state.etcd {
        etcd.write_prometheus(&mut text);
    }
    state.alloc_logs.write_prometheus(&mut text);
    text
}
