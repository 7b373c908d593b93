//! Jobs: listing and reading them (`GET /v1/jobs`, `/v1/job/{id}`, its allocations),
//! stopping and scaling them, and submitting one or asking what a submission would do:
//! `POST /v1/jobs` registers, `POST /v1/validate/job` checks, `POST /v1/job/{id}/plan` shows
//! the plan. All three run the same checks ([`check_job`]) first, so a job that validates is
//! one that registers, and a refused one changes nothing.
//!
//! The runner is checked here, on the agent that takes the job: the build the job names by
//! SHA-256 (uploaded to an agent of the cluster first, as `caravan job run` does), or else the
//! file at its absolute path on this agent's disk, which is then kept in the runner store.
//! Loading compiles it (once per build of the runner, into the cache the agent's allocs start
//! from), so the first placement does not wait for a compile and a broken runner never
//! registers. In a cluster every node loads the build from its own runner store, fetching it
//! by hash from another agent when it lacks it.

use super::auth::Caller;
use super::body::{JsonBody, RequestBody};
use super::views::{alloc_view, job_view};
use super::{AllocView, ApiError, ApiResult, ApiState, JobView, TimedJson, flag};
use crate::model::jobspec::{self, JobSpec};
use crate::runner_store::oci;
use crate::server::reconcile::JobChange;
use crate::util::timestamp::unix_ms_now;
use axum::extract::Query;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::collections::HashMap;

/// Every check a job gets before anything changes: the document, then the agent's admission
/// (its limits against the caps and the defaults, its capabilities against the offer, and
/// its runner, loaded and named by its SHA-256: a new build is a change of the job). Returns
/// the job with its build set, and the first digits of its SHA-256 to show.
async fn check_job(state: &ApiState, body: &str) -> ApiResult<(JobSpec, String)> {
    let mut spec = jobspec::parse_json(body)
        .map_err(|e| ApiError::bad_request(e.field.clone(), e.to_string()))?;
    if oci::is_oci(&spec.runner) && spec.runner_sha256.is_none() {
        pin_registry_build(state, &mut spec).await?;
    }
    // Off the async workers: identifying a runner may compile it.
    let (admission, defaults) = (state.admission.clone(), state.default_limits);
    let runners = crate::runtime::StoredRunners {
        runtime: state.runtime.clone(),
        store: state.runners.clone(),
    };
    let (admitted, spec_back) = crate::util::blocking::with_a_turn(move || {
        let admitted = admission.admit_job(&spec, &defaults, &runners);
        (admitted, spec)
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("checking the job failed: {e}"),
        )
    })?;
    spec = spec_back;
    let sha256 =
        admitted.map_err(|refused| ApiError::bad_request(refused.field, refused.message))?;
    let short_hash = crate::allocrunner::short_hash(&sha256).to_string();
    spec.runner_sha256 = Some(sha256);
    Ok((spec, short_hash))
}

/// Resolves a job's registry reference to the build it names now (a tag is read once, here:
/// every node then pulls the same digest, and a tag moved since is a new build at the next
/// registration), pulls that build into this agent's store, and names it in the job.
async fn pin_registry_build(state: &ApiState, spec: &mut JobSpec) -> ApiResult<()> {
    let refuse = |why: String| ApiError::bad_request("job.runner", format!("job.runner: {why}"));
    let store = &state.runners;
    let resolved = store
        .registries()
        .resolve(&spec.runner)
        .await
        .map_err(|e| refuse(e.to_string()))?;
    if resolved.size > store.max_build_bytes() {
        return Err(refuse(format!(
            "{}: the component is {} bytes, over the limit of {}",
            spec.runner,
            resolved.size,
            store.max_build_bytes()
        )));
    }
    store
        .get_or_fetch(&resolved.sha256, Some(&resolved.pinned))
        .await
        .map_err(|e| refuse(e.to_string()))?;
    spec.runner = resolved.pinned;
    spec.runner_sha256 = Some(resolved.sha256);
    Ok(())
}

/// Refuses a change to a job of `namespace` by a caller confined to another namespace (403).
/// (An id another namespace holds is the server's to refuse, under its lock: 409.)
fn check_namespace(caller: &Caller, namespace: &str) -> ApiResult<()> {
    if !caller.may_change_namespace(namespace) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("this token may change jobs of its own namespace only, not of {namespace:?}"),
        ));
    }
    Ok(())
}

/// The namespace of the job `job_id`, if it exists (a missing job is the server's 404).
fn namespace_of(server: &crate::server::EmbeddedServer, job_id: &str) -> Option<String> {
    server.job(job_id).ok().map(|job| job.spec.namespace)
}

/// `POST /v1/jobs`: registers the job (or updates it when its id exists).
pub(super) async fn register_job(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: String,
) -> ApiResult<(axum::Extension<super::audit::AuditJob>, Json<Value>)> {
    let server = state.server()?;
    let (spec, _) = check_job(&state, &body).await?;
    check_namespace(&caller, &spec.namespace)?;
    let job_id = spec.id.clone();
    // A span of its own, for the OTLP export: what placing the job logs is its events.
    let span = tracing::info_span!("job.register", job_id = %spec.id, namespace = %spec.namespace);
    let registration = span.in_scope(|| server.register_job(spec))?;
    tracing::info!(
        parent: &span,
        job_id,
        created = registration.created,
        placed = registration.placed.len(),
        stopped = registration.stopped.len(),
        upgraded = registration.upgraded.len(),
        "job registered"
    );
    let audited = axum::Extension(super::audit::AuditJob(job_id.clone()));
    Ok((
        audited,
        Json(json!({
            "job_id": job_id,
            "created": registration.created,
            "placed": registration.placed,
            "stopped": registration.stopped,
            "upgraded": registration.upgraded,
        })),
    ))
}

/// `POST /v1/validate/job`: the checks a registration gets, and nothing else. A write as far
/// as the token goes: it makes the agent read and compile a file.
pub(super) async fn validate_job(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: String,
) -> ApiResult<Json<Value>> {
    let (spec, runner_sha256) = check_job(&state, &body).await?;
    check_namespace(&caller, &spec.namespace)?;
    Ok(Json(json!({
        "job_id": spec.id,
        "valid": true,
        "runner": spec.runner,
        "runner_sha256": runner_sha256,
    })))
}

/// `POST /v1/job/{id}/plan`: what registering the job would do, computed by the same
/// reconciliation a registration applies, with nothing changed. Needs the token, as
/// validation does.
pub(super) async fn plan_job(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: String,
) -> ApiResult<Json<Value>> {
    let server = state.server()?;
    let (spec, runner_sha256) = check_job(&state, &body).await?;
    check_namespace(&caller, &spec.namespace)?;
    if spec.id != id {
        return Err(ApiError::bad_request(
            "job.id",
            format!("job.id: {:?} is not the job of this path ({id:?})", spec.id),
        ));
    }
    let (current_version, plan, blocked) = server.plan_job(&spec);
    let mut place_by_node: BTreeMap<String, usize> = BTreeMap::new();
    for node in &plan.plan.place {
        let node = node.clone().unwrap_or_else(|| "(blocked)".into());
        *place_by_node.entry(node).or_default() += 1;
    }
    let change = match plan.change {
        JobChange::Create => "create",
        JobChange::Replace => "replace",
        JobChange::InPlace => "upgrade",
        JobChange::Same if plan.plan.place.is_empty() && plan.plan.stop.is_empty() => "none",
        JobChange::Same => "scale",
    };
    Ok(Json(json!({
        "job_id": spec.id,
        "change": change,
        "current_version": current_version,
        "version": plan.version,
        "place": plan.plan.place.len(),
        "place_by_node": place_by_node,
        "stop": plan.plan.stop,
        "upgrade": plan.plan.upgrade,
        "runner_sha256": runner_sha256,
        "blocked": blocked,
    })))
}

/// `GET /v1/jobs`, every job, or those of one namespace (`?namespace=NS`; `*`: all).
pub(super) async fn list_jobs(
    State(state): State<ApiState>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Vec<JobView>>> {
    let server = state.server()?;
    let namespace = query.get("namespace").filter(|ns| ns.as_str() != "*");
    Ok(Json(
        server
            .jobs()
            .iter()
            .filter(|job| namespace.is_none_or(|ns| job.spec.namespace == *ns))
            .map(|job| {
                let allocs = server.job_allocs(&job.spec.id);
                job_view(&server, job, &allocs, unix_ms_now())
            })
            .collect(),
    ))
}

pub(super) async fn get_job(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    let server = state.server()?;
    let job = server.job(&id)?;
    let allocs = server.job_allocs(&id);
    Ok(Json(job_view(&server, &job, &allocs, unix_ms_now())))
}

pub(super) async fn stop_job(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<serde_json::Value>> {
    let purge = flag(&query, "purge")?;
    let server = state.server()?;
    if let Some(namespace) = namespace_of(&server, &id) {
        check_namespace(&caller, &namespace)?;
    }
    let stopped = server.stop_job(&id, purge)?;
    // A purged job goes with its last alloc: at once when it has none left.
    let removed = purge && server.job_allocs(&id).is_empty();
    Ok(Json(serde_json::json!({
        "job_id": id, "stopped": stopped, "purged": purge, "removed": removed,
    })))
}

#[derive(Deserialize)]
pub(super) struct ScaleRequest {
    count: i64,
}

impl RequestBody for ScaleRequest {
    const EXAMPLE: &'static str = r#"{"count": 3}"#;
}

pub(super) async fn scale_job(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<ScaleRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    let bad = |message: String| ApiError::bad_request("count", message);
    let count = u32::try_from(request.count)
        .ok()
        .filter(|c| *c <= 100_000)
        .ok_or_else(|| {
            bad(format!(
                "count: {} is out of range; expected 0 to 100000",
                request.count
            ))
        })?;
    let server = state.server()?;
    if let Some(namespace) = namespace_of(&server, &id) {
        check_namespace(&caller, &namespace)?;
    }
    let registration = server.scale_job(&id, count)?;
    Ok(Json(
        serde_json::json!({ "job_id": id, "placed": registration.placed, "stopped": registration.stopped }),
    ))
}

pub(super) async fn job_allocations(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<TimedJson<Vec<AllocView>>> {
    let server = state.server()?;
    server.job(&id)?;
    Ok(TimedJson(
        server.job_allocs(&id).iter().map(alloc_view).collect(),
    ))
}
