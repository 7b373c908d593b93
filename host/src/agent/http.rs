//! The agent's HTTP API: JSON over HTTP/1, Nomad's paths where they fit.
//!
//! Every error is `{"error": "...", "field": "..."}` (field only when one is at fault) with
//! 400 for a bad request, 401/403 for a missing or wrong token, 404 for an unknown id and 409
//! for a request the alloc's state does not allow; 500 when an alloc's log files cannot be
//! read. A rejected request changes nothing. With an ACL token configured, every write (POST,
//! PUT, DELETE) needs `Authorization: Bearer`, and so does reading an alloc's files.
//!
//! Handlers only translate: the work is the server's, the client's and the alloc logs'
//! ([`crate::alloc_logs`]); each metric family renders itself next to its counters. The
//! signal and restart handlers live in `alloc_actions`, the alloc files' in `alloc_fs`, job
//! submission, validation and plans (and the checks they share) in `jobs`; the web UI's
//! static files in `ui`.

use crate::alloc_logs::AllocLogs;
use crate::client::Client;
use crate::client::gc::GcError;
use crate::histogram::write_instantiation_latency;
use crate::server::{AllocRecord, EmbeddedServer, RequestError};
use crate::timestamp::unix_ms_now;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

mod alloc_actions;
mod alloc_fs;
mod auth;
pub mod forward;
mod jobs;
mod node_rpc;
mod ui;
mod views;
use alloc_actions::{restart_allocation, signal_allocation};
pub use views::{AllocView, JobView, LocalAllocView, TimedJson};
use views::{alloc_view, job_view};

/// What every handler can reach.
#[derive(Clone)]
pub struct ApiState {
    /// The server that answers for the cluster here: always the embedded server in the
    /// single-node mode; in cluster mode, the scheduler's while this agent leads, else none
    /// (requests for it are forwarded to the leader, see `forward`).
    pub servers: tokio::sync::watch::Receiver<Option<Arc<EmbeddedServer>>>,
    /// In cluster mode, who leads, for forwarding.
    pub forwarding: Option<Arc<forward::Forwarding>>,
    /// In cluster mode, etcd's space, alarms and this agent's compactions.
    pub etcd: Option<crate::cluster::EtcdHealth>,
    /// This node's client.
    pub client: Client,
    /// The token writes need, if any.
    pub acl_token: Option<String>,
    /// The runtime, for its instantiation latency.
    pub runtime: crate::runtime::Runtime,
    /// The alloc log files.
    pub alloc_logs: AllocLogs,
    /// The limits a job's unset keys take: a job whose limits contradict each other once
    /// merged with them is refused with 400.
    pub default_limits: crate::structs::Limits,
    /// The most a job may ask for; a job over a cap is refused with 400.
    pub limit_caps: crate::structs::LimitCaps,
    /// What jobs may ask to reach; a job asking for more is refused with 400.
    pub capabilities: Arc<crate::capabilities::CapabilityPolicy>,
}

/// The API's routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/jobs", get(list_jobs).post(jobs::register_job))
        .route("/v1/validate/job", post(jobs::validate_job))
        .route("/v1/job/{id}/plan", post(jobs::plan_job))
        .route("/v1/job/{id}", get(get_job).delete(stop_job))
        .route("/v1/job/{id}/allocations", get(job_allocations))
        .route("/v1/job/{id}/scale", post(scale_job))
        .route("/v1/allocations", get(list_allocations))
        .route("/v1/allocation/{id}", get(get_allocation))
        .route("/v1/allocation/{id}/stop", post(stop_allocation))
        .route("/v1/client/allocation/{id}", get(get_local_allocation))
        .route("/v1/client/allocation/{id}/gc", post(collect_allocation))
        .route("/v1/client/allocation/{id}/logs", get(allocation_logs))
        .route("/v1/client/allocation/{id}/signal", post(signal_allocation))
        .route(
            "/v1/client/allocation/{id}/restart",
            post(restart_allocation),
        )
        .route("/v1/client/fs/ls/{id}", get(alloc_fs::list))
        .route("/v1/client/fs/cat/{id}", get(alloc_fs::cat))
        .route("/v1/client/gc", get(gc_status).post(collect_all))
        .route("/v1/system/gc", put(system_gc))
        .route("/v1/nodes", get(list_nodes))
        .route("/v1/node/{node}/register", put(node_rpc::register_node))
        .route("/v1/node/{node}/allocations", get(node_rpc::watch_allocs))
        .route(
            "/v1/node/{node}/allocations/fetch",
            post(node_rpc::fetch_allocs).layer(node_body_limit()),
        )
        .route(
            "/v1/node/{node}/allocations/update",
            post(node_rpc::update_allocs).layer(node_body_limit()),
        )
        .route("/v1/agent/health", get(health))
        .route("/v1/status/leader", get(leader))
        .route("/v1/status/etcd", get(etcd_status))
        .route("/v1/metrics", get(metrics))
        .merge(ui::routes())
        // Over every route above, so that no route can forget it (see `auth`).
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            forward::to_leader,
        ))
        .with_state(state)
}

fn node_body_limit() -> axum::extract::DefaultBodyLimit {
    axum::extract::DefaultBodyLimit::max(node_rpc::MAX_NODE_REQUEST_BYTES)
}

impl ApiState {
    /// The server answering here, or 503 while none does (an election in progress).
    fn server(&self) -> ApiResult<Arc<EmbeddedServer>> {
        self.servers.borrow().clone().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no agent leads the cluster yet; retry in a few seconds",
            )
        })
    }
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {}", uri.path()),
    )
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            field: None,
        }
    }

    /// A 400 naming the request's `field` at fault.
    fn bad_request(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            field: Some(field.into()),
            ..ApiError::new(StatusCode::BAD_REQUEST, message)
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({ "error": self.message });
        if let Some(field) = self.field {
            body["field"] = field.into();
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<RequestError> for ApiError {
    fn from(error: RequestError) -> Self {
        let status = match error {
            RequestError::JobNotFound(_) | RequestError::AllocNotFound(_) => StatusCode::NOT_FOUND,
            RequestError::JobStopped(_) => StatusCode::CONFLICT,
            RequestError::NotSaved(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, error.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

async fn list_jobs(State(state): State<ApiState>) -> ApiResult<Json<Vec<JobView>>> {
    let server = state.server()?;
    Ok(Json(
        server
            .jobs()
            .iter()
            .map(|job| {
                let allocs = server.job_allocs(&job.spec.id);
                job_view(job, &allocs, server.restart_limit(), unix_ms_now())
            })
            .collect(),
    ))
}

async fn get_job(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    let server = state.server()?;
    let job = server.job(&id)?;
    let allocs = server.job_allocs(&id);
    Ok(Json(job_view(
        &job,
        &allocs,
        server.restart_limit(),
        unix_ms_now(),
    )))
}

/// Reads a boolean query parameter (`true` or `false`; absent is false), as JSON errors.
fn flag(query: &HashMap<String, String>, name: &str) -> ApiResult<bool> {
    match query.get(name).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") | Some("") => Ok(true),
        Some(other) => Err(ApiError::bad_request(
            name,
            format!("{name}: expected true or false, got {other:?}"),
        )),
    }
}

async fn stop_job(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<serde_json::Value>> {
    let purge = flag(&query, "purge")?;
    let server = state.server()?;
    let stopped = server.stop_job(&id, purge)?;
    // A purged job goes with its last alloc: at once when it has none left.
    let removed = purge && server.job_allocs(&id).is_empty();
    Ok(Json(serde_json::json!({
        "job_id": id, "stopped": stopped, "purged": purge, "removed": removed,
    })))
}

#[derive(Deserialize)]
struct ScaleRequest {
    count: i64,
}

async fn scale_job(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    body: String,
) -> ApiResult<Json<serde_json::Value>> {
    let bad = |message: String| ApiError::bad_request("count", message);
    let request: ScaleRequest = serde_json::from_str(&body)
        .map_err(|e| bad(format!("count: expected {{\"count\": N}}: {e}")))?;
    let count = u32::try_from(request.count)
        .ok()
        .filter(|c| *c <= 100_000)
        .ok_or_else(|| {
            bad(format!(
                "count: {} is out of range; expected 0 to 100000",
                request.count
            ))
        })?;
    let registration = state.server()?.scale_job(&id, count)?;
    Ok(Json(
        serde_json::json!({ "job_id": id, "placed": registration.placed, "stopped": registration.stopped }),
    ))
}

async fn job_allocations(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<TimedJson<Vec<AllocView>>> {
    let server = state.server()?;
    server.job(&id)?;
    Ok(TimedJson(
        server.job_allocs(&id).iter().map(alloc_view).collect(),
    ))
}

async fn list_allocations(State(state): State<ApiState>) -> ApiResult<TimedJson<Vec<AllocView>>> {
    Ok(TimedJson(
        state.server()?.allocs().iter().map(alloc_view).collect(),
    ))
}

/// Finds an alloc by id or unique id prefix, as Nomad's CLI allows.
fn find_alloc(state: &ApiState, id_or_prefix: &str) -> ApiResult<AllocRecord> {
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

async fn get_allocation(
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
async fn get_local_allocation(
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

fn local_view(state: &ApiState, alloc_id: &str) -> Option<LocalAllocView> {
    let runner = state.client.runner(alloc_id)?;
    let limits = state.default_limits.with_overrides(&runner.alloc().limits);
    let usage = runner.usage();
    let alloc_dir = state.client.alloc_dir(alloc_id);
    Some(LocalAllocView {
        alloc_dir: alloc_dir.is_dir().then(|| alloc_dir.display().to_string()),
        limits: limits
            .shown()
            .into_iter()
            .map(|(key, value)| (key.to_string(), value))
            .collect(),
        cpu_used_us: usage.map(|u| u.cpu_used.as_micros() as u64),
        memory_peak_bytes: usage.map(|u| u.memory_peak_bytes),
        runner_sha256: runner.runner_sha256(),
        upgrade: runner.last_upgrade().map(Into::into),
    })
}

async fn stop_allocation(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let record = find_alloc(&state, &id)?;
    state.server()?.stop_alloc(&record.alloc.id)?;
    Ok(Json(serde_json::json!({ "alloc_id": record.alloc.id })))
}

async fn collect_allocation(
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

async fn allocation_logs(
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

async fn gc_status(State(state): State<ApiState>) -> TimedJson<crate::client::gc::GcStatus> {
    TimedJson(state.client.gc().status())
}

async fn collect_all(State(state): State<ApiState>) -> ApiResult<Json<serde_json::Value>> {
    state.client.collect_all().await;
    Ok(Json(serde_json::json!({ "collected": true })))
}

async fn system_gc(State(state): State<ApiState>) -> ApiResult<Json<serde_json::Value>> {
    let removed = state.server()?.collect_garbage(true)?;
    Ok(Json(serde_json::json!({ "removed": removed })))
}

/// Every node: those allocs are placed on (`ready`), and in cluster mode every other node
/// that ever registered (`down`), with how many allocs each runs; in cluster mode, also each
/// live node's agent address and how many seconds ago it last renewed its lease.
async fn list_nodes(State(state): State<ApiState>) -> ApiResult<Json<Vec<serde_json::Value>>> {
    let server = state.server()?;
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

/// The full id of `id` (an id or a unique prefix) for this node's client routes, and
/// whether the server knows it. The server may already have dropped an alloc the client
/// still holds, and in cluster mode an agent that does not lead has no server: then the id
/// as given.
fn local_alloc_id(state: &ApiState, id: String) -> ApiResult<(String, bool)> {
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

/// Who leads the cluster, as this agent last saw it (answered here, never forwarded).
async fn leader(State(state): State<ApiState>) -> Json<serde_json::Value> {
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
async fn health(State(state): State<ApiState>) -> Response {
    let Some(etcd) = &state.etcd else {
        return Json(serde_json::json!({ "ok": true })).into_response();
    };
    let problem = match &*etcd.space.borrow() {
        crate::cluster::SpaceProbe::NotYet => None,
        crate::cluster::SpaceProbe::Answered(space) => space.alarm_line(),
        crate::cluster::SpaceProbe::Failed(reason) => Some(reason.clone()),
    };
    match problem {
        None => Json(serde_json::json!({ "ok": true })).into_response(),
        Some(problem) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "ok": false, "problems": [problem] })),
        )
            .into_response(),
    }
}

/// What etcd said of its space and alarms at this agent's last probe (answered here, never
/// forwarded), and the compactions this agent made while it led.
async fn etcd_status(State(state): State<ApiState>) -> ApiResult<Json<serde_json::Value>> {
    let Some(etcd) = &state.etcd else {
        return Ok(Json(serde_json::json!({ "mode": "embedded" })));
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
    Ok(Json(answer))
}

async fn metrics(State(state): State<ApiState>) -> impl IntoResponse {
    let mut text = String::new();
    state.client.metrics().write_prometheus(&mut text);
    // In cluster mode, only the leader has a server to count.
    if let Some(server) = state.servers.borrow().clone() {
        server.write_prometheus(&mut text);
    }
    write_instantiation_latency(state.runtime.instantiation_latency(), &mut text);
    if let Some(etcd) = &state.etcd {
        etcd.write_prometheus(&mut text);
    }
    state.alloc_logs.write_prometheus(&mut text);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
