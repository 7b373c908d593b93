//! Cluster mode's forwarding: any agent answers for the whole cluster, as in Nomad, by
//! handing the cluster's requests (jobs, allocations, nodes, system GC) to the agent that
//! leads and relaying its answer, and an alloc's client requests (`/v1/client/allocation/
//! {id}/...`: logs, signal, restart, GC) to the agent of the node that runs it. Everything
//! else (health, metrics, the node's own GC, who leads) is answered here.
//!
//! A request is forwarded by one agent only: one that arrives forwarded at an agent that
//! does not lead (leadership moved meanwhile) gets a 503, rather than a loop. The agent
//! that forwarded it follows the leadership instead, and sends it to the next leader
//! (`leader`, which also says when a leader answers from its own memory). While no agent
//! leads, or while this one is taking over, the answer is a 503 too. The leader checks the
//! token again; this agent passes it on untouched.

use super::{ApiError, ApiState};
use crate::cluster::{EtcdStore, LiveMember, MemberView};
use crate::rpc::transport::{AgentApi, AgentPool};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Duration;
use tokio::sync::watch;

mod leader;

/// Marks a request an agent forwarded.
pub(super) const FORWARDED: &str = "x-caravan-forwarded";

/// How long a forwarded request may take: the cluster's requests are all short.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Who leads, a connection pool to reach them, and the store for what only etcd knows
/// (each live agent's last heartbeat).
pub struct Forwarding {
    members: watch::Receiver<MemberView>,
    pool: AgentPool,
    store: EtcdStore,
    node: String,
}

impl Forwarding {
    /// Forwarding for the agent of `node`, by what `members` says of the leader.
    /// `pool` dials the other agents (over TLS in a TLS cluster).
    pub fn new(
        members: watch::Receiver<MemberView>,
        store: EtcdStore,
        node: String,
        pool: AgentPool,
    ) -> Forwarding {
        Forwarding {
            members,
            pool,
            store,
            node,
        }
    }

    /// Every live agent and how long ago it last renewed its lease.
    pub async fn live_members(&self) -> Result<Vec<LiveMember>, crate::cluster::StoreError> {
        crate::cluster::live_members(&self.store).await
    }

    /// Every node that ever registered, live or not.
    pub async fn registered_nodes(&self) -> Result<Vec<String>, crate::cluster::StoreError> {
        let prefix = crate::cluster::keys::nodes_prefix();
        let (entries, _) = self.store.list(&prefix).await?;
        Ok(entries
            .into_iter()
            .filter_map(|kv| Some(kv.key.strip_prefix(&prefix)?.to_string()))
            .collect())
    }

    /// What this agent is in the cluster now.
    pub fn view(&self) -> MemberView {
        self.members.borrow().clone()
    }
}

/// The cluster's routes, as opposed to this node's own.
fn is_cluster_route(path: &str) -> bool {
    let node_schedule = path.starts_with("/v1/node/")
        && (path.ends_with("/drain") || path.ends_with("/eligibility"));
    node_schedule
        || [
            "/v1/jobs",
            "/v1/job/",
            "/v1/allocation",
            "/v1/nodes",
            "/v1/system/",
        ]
        .iter()
        .any(|prefix| path.starts_with(prefix))
}

fn unavailable(message: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
}

/// The alloc id (or id prefix) of a `/v1/client/allocation/{id}/...` or
/// `/v1/client/fs/{ls,cat}/{id}` path.
fn client_alloc(path: &str) -> Option<&str> {
    let rest = path
        .strip_prefix("/v1/client/allocation/")
        .or_else(|| path.strip_prefix("/v1/client/fs/ls/"))
        .or_else(|| path.strip_prefix("/v1/client/fs/cat/"))?;
    rest.split('/').next().filter(|id| !id.is_empty())
}

/// The middleware: answers here when this agent can, else forwards to the agent that can.
pub async fn to_leader(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let Some(forwarding) = state.forwarding.clone() else {
        return next.run(request).await;
    };
    let forwarded = request.headers().contains_key(FORWARDED);
    if let Some(alloc) = client_alloc(request.uri().path()) {
        let alloc = alloc.to_string();
        if forwarded || state.client.runner(&alloc).is_some() {
            return next.run(request).await;
        }
        return match alloc_node(&state, &forwarding, &alloc, request.headers()).await {
            Ok(Some(api)) => proxy(&forwarding, request, &api).await,
            Ok(None) => next.run(request).await,
            Err(error) => error.into_response(),
        };
    }
    if !is_cluster_route(request.uri().path()) {
        return next.run(request).await;
    }
    leader::to_cluster(&state, &forwarding, request, next).await
}

/// The leader's API, as this agent last saw it, or why there is none to ask.
fn leader_api(forwarding: &Forwarding) -> Result<String, ApiError> {
    let view = forwarding.members.borrow().clone();
    match (view.leader, view.leading) {
        (_, Some(_)) => Err(unavailable(
            "this agent is taking over the cluster; retry".into(),
        )),
        (None, None) => Err(unavailable(
            "no agent leads the cluster yet; retry in a few seconds".into(),
        )),
        (Some(leader), None) => Ok(leader.api),
    }
}

/// The API of the agent whose node runs `alloc`; `None` when that is this agent, or when
/// the cluster does not know the alloc (then this agent answers, as a single one would).
async fn alloc_node(
    state: &ApiState,
    forwarding: &Forwarding,
    alloc: &str,
    caller: &axum::http::HeaderMap,
) -> Result<Option<String>, ApiError> {
    let leading = state.servers.borrow().is_some();
    let node = if leading {
        super::allocs::find_alloc(state, alloc)
            .ok()
            .and_then(|record| record.node_id)
    } else {
        node_from_leader(forwarding, alloc, caller).await?
    };
    let Some(node) = node.filter(|node| *node != forwarding.node) else {
        return Ok(None);
    };
    let live = crate::cluster::live_records(&forwarding.store)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    match live.into_iter().find(|(member, _)| member.node == node) {
        Some((member, _)) => Ok(Some(member.api)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("allocation {alloc:?} is on node {node}, which is down"),
        )),
    }
}

/// The node of `alloc`, as the leader answers (`None` when it does not know it), asked with
/// the token of the caller whose request it is (`caller`'s headers): with ACLs on, the
/// leader reads it as that caller's read.
async fn node_from_leader(
    forwarding: &Forwarding,
    alloc: &str,
    caller: &axum::http::HeaderMap,
) -> Result<Option<String>, ApiError> {
    let leader = agent_api(forwarding, &leader_api(forwarding)?)?;
    let mut request = Request::get(format!("/v1/allocation/{alloc}"))
        .header(FORWARDED, "1")
        .body(Body::empty())
        .map_err(|e| unavailable(format!("cannot ask the leader: {e}")))?;
    for name in [
        super::auth::TOKEN_HEADER,
        axum::http::header::AUTHORIZATION.as_str(),
    ] {
        if let Some(value) = caller.get(name) {
            request.headers_mut().insert(name, value.clone());
        }
    }
    let answer = match leader.relay(request, FORWARD_TIMEOUT).await {
        Ok(answer) if answer.status().is_success() => answer,
        _ => return Ok(None),
    };
    let body = crate::rpc::transport::read_body(answer.into_body(), MAX_VIEW_BYTES)
        .await
        .unwrap_or_default();
    Ok(serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|view| view["node_id"].as_str().map(str::to_string)))
}

/// The most read of the leader's view of one alloc: far more than one alloc's view.
const MAX_VIEW_BYTES: usize = 4 << 20;

/// The API of the agent at `api`, as a member record gives it.
fn agent_api(forwarding: &Forwarding, api: &str) -> Result<AgentApi, ApiError> {
    forwarding.pool.agent(api, None).map_err(|_| {
        unavailable(format!(
            "the agent address {:?} is not usable",
            crate::util::text::cut(api, 64)
        ))
    })
}

/// Sends `request` to the agent at `api` once, marked forwarded, its token untouched, and
/// relays its answer (streamed: a followed log stays followed).
async fn proxy(forwarding: &Forwarding, mut request: Request, api: &str) -> Response {
    let agent = match agent_api(forwarding, api) {
        Ok(agent) => agent,
        Err(error) => return error.into_response(),
    };
    request
        .headers_mut()
        .insert(FORWARDED, HeaderValue::from_static("1"));
    match agent.relay(request, FORWARD_TIMEOUT).await {
        Ok(response) => response.map(Body::new),
        Err(unanswered) if unanswered.timed_out => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the agent at {api} did not answer within {}s",
                FORWARD_TIMEOUT.as_secs()
            ),
        )
        .into_response(),
        Err(unanswered) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("cannot reach the agent at {api}: {}", unanswered.reason),
        )
        .into_response(),
    }
}
