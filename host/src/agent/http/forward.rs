//! Cluster mode's forwarding: any agent answers for the whole cluster, as in Nomad, by
//! handing the cluster's requests (jobs, allocations, nodes, system GC) to the agent that
//! leads and relaying its answer. A node's own routes (`/v1/client/...`, health, metrics)
//! are always answered here.
//!
//! A request is forwarded once: one that arrives forwarded at an agent that does not lead
//! (leadership moved meanwhile) gets a 503 to retry, rather than a loop. While no agent
//! leads, or while this one is taking over, the answer is a 503 too. The leader checks the
//! token again; this agent passes it on untouched.

use super::{ApiError, ApiState};
use crate::cluster::{EtcdStore, LiveMember, MemberView};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use tokio::sync::watch;

/// Marks a request an agent forwarded.
const FORWARDED: &str = "x-caravan-forwarded";

/// How long a forwarded request may take: the cluster's requests are all short.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Who leads, a connection pool to reach them, and the store for what only etcd knows
/// (each live agent's last heartbeat).
pub struct Forwarding {
    members: watch::Receiver<MemberView>,
    http: HttpClient<HttpConnector, Body>,
    store: EtcdStore,
}

impl Forwarding {
    /// Forwarding by what `members` says of the leader.
    pub fn new(members: watch::Receiver<MemberView>, store: EtcdStore) -> Forwarding {
        Forwarding {
            members,
            http: HttpClient::builder(TokioExecutor::new()).build_http(),
            store,
        }
    }

    /// Every live agent and how long ago it last renewed its lease.
    pub async fn live_members(&self) -> Result<Vec<LiveMember>, crate::cluster::StoreError> {
        crate::cluster::live_members(&self.store).await
    }

    /// What this agent is in the cluster now.
    pub fn view(&self) -> MemberView {
        self.members.borrow().clone()
    }
}

/// The cluster's routes, as opposed to this node's own.
fn is_cluster_route(path: &str) -> bool {
    [
        "/v1/jobs",
        "/v1/job/",
        "/v1/allocation",
        "/v1/nodes",
        "/v1/system/",
    ]
    .iter()
    .any(|prefix| path.starts_with(prefix))
}

fn unavailable(message: String) -> Response {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message).into_response()
}

/// The middleware: answers here when this agent can, else forwards to the leader.
pub async fn to_leader(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let Some(forwarding) = &state.forwarding else {
        return next.run(request).await;
    };
    if !is_cluster_route(request.uri().path()) || state.servers.borrow().is_some() {
        return next.run(request).await;
    }
    if request.headers().contains_key(FORWARDED) {
        return unavailable("leadership moved while forwarding; retry".into());
    }
    let view = forwarding.members.borrow().clone();
    let leader = match (view.leader, view.leading) {
        (_, Some(_)) => return unavailable("this agent is taking over the cluster; retry".into()),
        (None, None) => {
            return unavailable("no agent leads the cluster yet; retry in a few seconds".into());
        }
        (Some(leader), None) => leader,
    };
    let (mut parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let uri = format!("{}{path}", leader.api);
    parts.uri = match uri.parse() {
        Ok(uri) => uri,
        Err(_) => {
            return unavailable(format!(
                "the leader's address {:?} is not usable",
                crate::text::cut(&leader.api, 64)
            ));
        }
    };
    parts.headers.remove(header::HOST);
    parts
        .headers
        .insert(FORWARDED, HeaderValue::from_static("1"));
    let sent = forwarding.http.request(Request::from_parts(parts, body));
    match tokio::time::timeout(FORWARD_TIMEOUT, sent).await {
        Ok(Ok(response)) => response.map(Body::new),
        Ok(Err(error)) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "cannot reach the leader {} at {}: {error}",
                leader.node, leader.api
            ),
        )
        .into_response(),
        Err(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the leader {} did not answer within {}s",
                leader.node,
                FORWARD_TIMEOUT.as_secs()
            ),
        )
        .into_response(),
    }
}
