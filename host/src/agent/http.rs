//! The agent's HTTP API: JSON over HTTP/1, Nomad's paths where they fit.
//!
//! Every error is `{"error": "...", "field": "..."}` (field only when one is at fault) with
//! 400 for a bad request, 401/403 for a missing or wrong token, 404 for an unknown id and 409
//! for a request the alloc's state does not allow; 500 when an alloc's log files cannot be
//! read. A rejected request changes nothing. With an ACL token configured, every write (any
//! method but GET and HEAD) needs `Authorization: Bearer`, and so do an alloc's files and
//! node RPC (`auth`).
//!
//! Handlers only translate: the work is the server's, the client's and the alloc logs'
//! ([`crate::alloc_logs`]); each metric family renders itself next to its counters.
//!
//! Layout, one file per resource: `jobs` (and job submission's checks), `allocs` (with
//! `alloc_actions` for signals and restarts and `alloc_fs` for an alloc's files), `nodes`,
//! `node_rpc` (what nodes call), `gc`, `runners` (runner builds by hash), `status` (leader,
//! health, etcd, metrics) and `ui` (the web UI's static files). Beside them: `auth`, the one place the token is checked (a route
//! layer over every route); `audit`, the line each operator's write leaves; `body`, the one way a JSON body is read; `forward`, cluster
//! mode's forwarding to the leader; `views`, what the API shows of jobs and allocs.

use crate::acl::Permission;
use crate::alloc_logs::AllocLogs;
use crate::client::Client;
use crate::server::{EmbeddedServer, RequestError};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use routes::Routes;
use std::collections::HashMap;
use std::sync::Arc;

mod acl;
mod alloc_actions;
mod alloc_fs;
mod allocs;
mod audit;
mod auth;
mod body;
pub mod forward;
mod gc;
mod jobs;
mod node_rpc;
mod nodes;
mod routes;
mod runners;
mod series;
mod status;
pub use status::metrics_text;
mod ui;
mod views;
pub use audit::{AuditRecord, CallerAddr};
pub use auth::{AclSettings, Caller, TOKEN_HEADER};
pub use routes::{Rule, RuleBook};
pub use views::{AllocView, JobView, LocalAllocView, TaskView, TimedJson};

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
    /// How callers are told apart: ACL tokens, the shared token, or neither (see `auth`).
    pub acl: AclSettings,
    /// `[audit] path`'s file, when configured (every write is also a `caravan::audit` line).
    pub audit_log: Option<Arc<crate::agent::audit_log::AuditLog>>,
    /// Whether the API serves TLS, so that the routes only agents call (node RPC, runner
    /// builds by hash, checkpoints) need an agent's certificate (see `auth`).
    pub agent_routes_need_certs: bool,
    /// The runtime, for its instantiation latency and to load a job's runner.
    pub runtime: crate::runtime::Runtime,
    /// This agent's runner builds by hash: what a job's runner is kept as, uploaded to,
    /// and fetched from by other agents.
    pub runners: crate::runner_store::RunnerStore,
    /// The alloc log files.
    pub alloc_logs: AllocLogs,
    /// The limits a job's unset keys take: a job whose limits contradict each other once
    /// merged with them is refused with 400.
    pub default_limits: crate::model::structs::Limits,
    /// What this agent admits (its caps, its offer); a job it does not is refused with 400,
    /// naming the key at fault.
    pub admission: crate::model::admission::Admission,
    /// The series this agent samples for the web UI's plots.
    pub series: Arc<crate::agent::series::Series>,
    /// How often it samples them (`[telemetry] collection_interval`).
    pub sample_interval: std::time::Duration,
}

/// The API's routes, by resource, each with what its caller needs (see `auth`): each
/// handler lives in the file of its resource.
pub fn router(state: ApiState) -> Router {
    let (router, rules) = routes().finish();
    let guard = auth::Guard {
        api: state.clone(),
        rules: Arc::new(rules),
    };
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            forward::to_leader,
        ))
        // Outside forwarding: nothing is relayed for a caller this agent would refuse, and a
        // request an agent would relay with its own certificate is checked for the caller's.
        .layer(axum::middleware::from_fn_with_state(
            guard.clone(),
            auth::authorize,
        ))
        // Outermost: a write is recorded where its caller sent it, however it ends.
        .layer(axum::middleware::from_fn_with_state(
            guard,
            audit::record_writes,
        ))
        .with_state(state)
}

/// Every route, with its rule (the route-role test walks them: `rules`).
fn routes() -> Routes<ApiState> {
    use Permission::{Management, Node, Operator, Public, Read, Submit, Token};
    use axum::http::Method as M;
    let api = Routes::new()
        .at(Read, M::GET, "/v1/jobs", get(jobs::list_jobs))
        .at(Submit, M::POST, "/v1/jobs", post(jobs::register_job))
        .at(
            Submit,
            M::POST,
            "/v1/validate/job",
            post(jobs::validate_job),
        )
        .at(Submit, M::POST, "/v1/job/{id}/plan", post(jobs::plan_job))
        .at(Read, M::GET, "/v1/job/{id}", get(jobs::get_job))
        .at(Submit, M::DELETE, "/v1/job/{id}", delete(jobs::stop_job))
        .at(
            Read,
            M::GET,
            "/v1/job/{id}/allocations",
            get(jobs::job_allocations),
        )
        .at(Submit, M::POST, "/v1/job/{id}/scale", post(jobs::scale_job))
        .at(Read, M::GET, "/v1/job/{id}/series", get(series::job_series))
        .at(
            Read,
            M::GET,
            "/v1/allocations",
            get(allocs::list_allocations),
        )
        .at(
            Read,
            M::GET,
            "/v1/allocation/{id}",
            get(allocs::get_allocation),
        )
        .at(
            Operator,
            M::POST,
            "/v1/allocation/{id}/stop",
            post(allocs::stop_allocation),
        )
        .at(
            Read,
            M::GET,
            "/v1/client/allocation/{id}",
            get(allocs::get_local_allocation),
        )
        .at(
            Operator,
            M::POST,
            "/v1/client/allocation/{id}/gc",
            post(allocs::collect_allocation),
        )
        .at(
            Read,
            M::GET,
            "/v1/client/allocation/{id}/logs",
            get(allocs::allocation_logs),
        )
        .at(
            Node,
            M::GET,
            "/v1/client/allocation/{id}/checkpoint",
            get(allocs::allocation_checkpoint),
        )
        .at(
            Operator,
            M::POST,
            "/v1/client/allocation/{id}/signal",
            post(alloc_actions::signal_allocation),
        )
        .at(
            Operator,
            M::POST,
            "/v1/client/allocation/{id}/restart",
            post(alloc_actions::restart_allocation),
        )
        .at(
            Read,
            M::GET,
            "/v1/client/allocation/{id}/usage",
            get(series::allocation_usage),
        )
        .at(Read, M::GET, "/v1/client/fs/ls/{id}", get(alloc_fs::list))
        .at(Read, M::GET, "/v1/client/fs/cat/{id}", get(alloc_fs::cat))
        .at(Read, M::GET, "/v1/client/gc", get(gc::gc_status))
        .at(Operator, M::POST, "/v1/client/gc", post(gc::collect_all))
        .at(Operator, M::PUT, "/v1/system/gc", put(gc::system_gc))
        .at(Read, M::GET, "/v1/nodes", get(nodes::list_nodes))
        .at(
            Operator,
            M::POST,
            "/v1/node/{node}/drain",
            post(nodes::drain_node),
        )
        .at(
            Operator,
            M::POST,
            "/v1/node/{node}/eligibility",
            post(nodes::set_eligibility),
        )
        .at(
            Node,
            M::PUT,
            "/v1/node/{node}/register",
            put(node_rpc::register_node),
        )
        .at(
            Node,
            M::GET,
            "/v1/node/{node}/allocations",
            get(node_rpc::watch_allocs),
        )
        .at(
            Node,
            M::POST,
            "/v1/node/{node}/allocations/fetch",
            post(node_rpc::fetch_allocs).layer(node_body_limit()),
        )
        .at(
            Node,
            M::POST,
            "/v1/node/{node}/allocations/update",
            post(node_rpc::update_allocs).layer(node_body_limit()),
        )
        .at(Read, M::GET, "/v1/runners", get(runners::list_builds))
        .at(Node, M::GET, "/v1/runner/{sha256}", get(runners::get_build))
        // A HEAD says only whether a build is here, as the list does: the CLI asks before
        // it uploads.
        .rule(Read, M::HEAD, "/v1/runner/{sha256}")
        .at(
            Submit,
            M::PUT,
            "/v1/runner/{sha256}",
            put(runners::put_build),
        )
        .at(Public, M::POST, "/v1/acl/bootstrap", post(acl::bootstrap))
        .at(Management, M::GET, "/v1/acl/tokens", get(acl::list_tokens))
        .at(
            Management,
            M::POST,
            "/v1/acl/token",
            post(acl::create_token),
        )
        .at(Token, M::GET, "/v1/acl/token/self", get(acl::token_self))
        .at(
            Management,
            M::DELETE,
            "/v1/acl/token/{accessor}",
            delete(acl::revoke_token),
        )
        .at(Public, M::GET, "/v1/agent/health", get(status::health))
        .at(Read, M::GET, "/v1/status/leader", get(status::leader))
        .at(Read, M::GET, "/v1/status/etcd", get(status::etcd_status))
        .at(Read, M::GET, "/v1/metrics", get(status::metrics));
    ui::routes(api)
}

/// The rule of every route, as the router has them: what the route-role test walks.
pub fn route_rules() -> RuleBook {
    routes().finish().1
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
    not_found_error(uri.path())
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    method_not_allowed_error(&method, uri.path())
}

fn not_found_error(path: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no such endpoint: {}",
            crate::util::text::escape_controls(&crate::util::text::cut(path, 256))
        ),
    )
}

fn method_not_allowed_error(method: &axum::http::Method, path: &str) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{method} is not allowed on {}",
            crate::util::text::escape_controls(&crate::util::text::cut(path, 256))
        ),
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
            RequestError::JobNotFound(_)
            | RequestError::AllocNotFound(_)
            | RequestError::NodeNotFound(_) => StatusCode::NOT_FOUND,
            RequestError::JobStopped(_)
            | RequestError::NodeDraining(_)
            | RequestError::JobInOtherNamespace { .. } => StatusCode::CONFLICT,
            RequestError::NotSaved(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, error.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

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
