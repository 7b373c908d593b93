//! A cluster request's way to the leader: answered here only while this agent's leadership
//! is certain, else sent to the agent that leads, and sent again to the next one when the
//! leadership moves before an answer came.
//!
//! The two rules, and the failures they came from (chaos runs of the real cluster):
//! - A leader answers from its memory only while its lease is known to hold
//!   ([`MemberView::lease_is_fresh`]); past that it asks etcd whether the leader key is still
//!   its own (as etcd's own linearizable reads confirm leadership) before answering. A
//!   leader woken from a pause otherwise showed allocs `running` that the leader elected
//!   meanwhile had marked `lost`.
//! - A request sent on to the leader follows the leadership: when another agent wins while
//!   the request waits (the leader was paused, or cut off), it is sent to that one. It was
//!   otherwise held until the old leader woke, 7-10 s later, and then refused. A request the
//!   old leader had not started on cannot land through it when it wakes: it checks its lease
//!   before answering (the rule above), and its writes are fenced by the leader key it lost.
//!   One it had written before it stopped answering is applied again by the new leader
//!   (`docs/cluster.md`, "Not done yet": every write the API offers is the same done twice).
//!
//! It may not decide what a request does; only where it is answered.

use super::{FORWARD_TIMEOUT, FORWARDED, Forwarding, proxy, unavailable};
use crate::agent::http::{ApiError, ApiState};
use crate::cluster::{Fence, MemberRecord, MemberView};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Duration;
use tokio::time::Instant;

/// How long a look at the leader key may take: a leader whose lease is stale and whose etcd
/// is slow answers 503 rather than hold its callers.
const LEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest body a request sent on to the leader may have: axum's default limit, which
/// every cluster route keeps (the leader would refuse a larger one). It is held in memory
/// so that it can be sent again.
const MAX_CLUSTER_BODY: usize = 2 << 20;

/// Where a cluster request is answered, as far as this agent can tell now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// Here: this agent leads, its lease known to hold or confirmed in etcd.
    Here,
    /// The agent whose API this is leads.
    Leader(String),
    /// This agent won the leadership and is reading the cluster before it answers.
    TakingOver,
    /// No agent is known to lead.
    Nobody,
}

impl Forwarding {
    /// Where a cluster request goes now; `serving`: whether this agent's server is
    /// published (it leads, or has not yet wound down).
    async fn target(&self, serving: bool) -> Result<Target, ApiError> {
        let view = self.view();
        if let Some(fence) = &view.leading {
            if !serving {
                return Ok(Target::TakingOver);
            }
            if view.lease_is_fresh() {
                return Ok(Target::Here);
            }
            return self.leader_in_etcd(Some(fence)).await;
        }
        match self.other_leader(&view) {
            // Its view still names this agent, which does not lead: it has just learnt that
            // its lease ended (a pause), not who won. etcd knows.
            Target::Nobody if view.leader.as_ref().is_some_and(|l| l.node == self.node) => {
                self.leader_in_etcd(None).await
            }
            target => Ok(target),
        }
    }

    /// Whether `view` says that the leadership moved since `before`, away from `sent_to` (the
    /// API a request went to, if any): this agent won it, or another agent than `sent_to`
    /// leads. A view that still names this agent without it leading says nothing new (its
    /// membership learnt that its lease ended, not who won).
    fn leads_elsewhere(
        &self,
        view: &MemberView,
        before: &MemberView,
        sent_to: Option<&str>,
    ) -> bool {
        let won_here = view.leading.is_some() && view.leading != before.leading;
        let another = view
            .leader
            .as_ref()
            .is_some_and(|leader| leader.node != self.node && Some(leader.api.as_str()) != sent_to);
        won_here || another
    }

    /// Who leads as the view says, when that is another agent.
    fn other_leader(&self, view: &MemberView) -> Target {
        match &view.leader {
            Some(leader) if leader.node != self.node => Target::Leader(leader.api.clone()),
            _ => Target::Nobody,
        }
    }

    /// Who holds the leader key, read from etcd (at most [`LEADER_READ_TIMEOUT`]): whether it
    /// is still the one this agent won (`fence`), whose lease has not been renewed lately
    /// (this process was paused, or etcd is slow), so that what the server holds may already
    /// be another leader's past; or who won it after this agent lost it (`None`).
    async fn leader_in_etcd(&self, fence: Option<&Fence>) -> Result<Target, ApiError> {
        let key = crate::cluster::keys::leader_key();
        let read = self.store.get_many(std::slice::from_ref(&key));
        let held = match tokio::time::timeout(LEADER_READ_TIMEOUT, read).await {
            Ok(Ok(held)) => held,
            Ok(Err(e)) => {
                return Err(unavailable(format!(
                    "cannot read who leads the cluster: {e}"
                )));
            }
            Err(_) => {
                return Err(unavailable(format!(
                    "etcd did not say who leads the cluster within {}s; retry",
                    LEADER_READ_TIMEOUT.as_secs()
                )));
            }
        };
        Ok(match held.into_iter().next() {
            Some(key) if fence.is_some_and(|f| key.create_revision == f.create_revision) => {
                Target::Here
            }
            Some(key) => serde_json::from_slice::<MemberRecord>(&key.value)
                .ok()
                .filter(|leader| leader.node != self.node)
                .map_or(Target::Nobody, |leader| Target::Leader(leader.api)),
            None => Target::Nobody,
        })
    }
}

/// A request held to be sent more than once: its head and its whole body.
struct HeldRequest {
    parts: Parts,
    body: Bytes,
}

impl HeldRequest {
    async fn hold(request: Request) -> Result<HeldRequest, ApiError> {
        let (parts, body) = request.into_parts();
        let body = axum::body::to_bytes(body, MAX_CLUSTER_BODY)
            .await
            .map_err(|error| {
                let too_large = std::iter::successors(
                    Some(&error as &(dyn std::error::Error + 'static)),
                    |e| e.source(),
                )
                .any(|e| e.is::<http_body_util::LengthLimitError>());
                if too_large {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!(
                            "the request body is over {} MiB, the most a cluster request may \
                             carry",
                            MAX_CLUSTER_BODY >> 20
                        ),
                    )
                } else {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        format!("cannot read the request body: {error}"),
                    )
                }
            })?;
        Ok(HeldRequest { parts, body })
    }

    /// The request again, extensions (the caller the authorization found) included.
    fn copy(&self) -> Request {
        let mut request = Request::new(Body::from(self.body.clone()));
        *request.method_mut() = self.parts.method.clone();
        *request.uri_mut() = self.parts.uri.clone();
        *request.version_mut() = self.parts.version;
        *request.headers_mut() = self.parts.headers.clone();
        *request.extensions_mut() = self.parts.extensions.clone();
        request
    }
}

/// A cluster request (`/v1/jobs`, `/v1/allocations`, ...) in cluster mode: see the module.
pub(super) async fn to_cluster(
    state: &ApiState,
    forwarding: &Forwarding,
    request: Request,
    next: Next,
) -> Response {
    let deadline = Instant::now() + FORWARD_TIMEOUT;
    let first = match settled_target(state, forwarding, deadline).await {
        Ok(Target::Here) => return next.run(request).await,
        Ok(target) => target,
        Err(error) => return error.into_response(),
    };
    if request.headers().contains_key(FORWARDED) {
        // Sent on once already: the agent that sent it follows the leadership, not this one.
        return unavailable("leadership moved while forwarding; retry".into()).into_response();
    }
    if first == Target::Nobody {
        return unavailable("no agent leads the cluster yet; retry in a few seconds".into())
            .into_response();
    }
    let held = match HeldRequest::hold(request).await {
        Ok(held) => held,
        Err(error) => return error.into_response(),
    };
    match follow_the_leader(state, forwarding, first, &held, deadline).await {
        Ok(Some(answer)) => answer,
        Ok(None) => next.run(held.copy()).await,
        Err(error) => error.into_response(),
    }
}

/// Where a cluster request goes, once a takeover under way here has ended: an agent that
/// just won answers as soon as it has read the cluster (a takeover of 100,000 allocs
/// takes seconds), rather than refusing what was sent to it as the new leader.
async fn settled_target(
    state: &ApiState,
    forwarding: &Forwarding,
    deadline: Instant,
) -> Result<Target, ApiError> {
    let serving = state.servers.borrow().is_some();
    let target = forwarding.target(serving).await?;
    if target != Target::TakingOver {
        return Ok(target);
    }
    let mut members = forwarding.members.clone();
    let mut servers = state.servers.clone();
    let took_over = async {
        tokio::select! {
            published = servers.wait_for(Option::is_some) => published.is_ok(),
            lost = members.wait_for(|view| view.leading.is_none()) => lost.is_ok(),
        }
    };
    match tokio::time::timeout_at(deadline, took_over).await {
        Ok(true) => {}
        Ok(false) => return Err(stopping()),
        Err(_) => {
            return Err(unavailable(
                "this agent is taking over the cluster; retry".into(),
            ));
        }
    }
    let serving = state.servers.borrow().is_some();
    forwarding.target(serving).await
}

/// The answer while the agent stops: its membership (and its view of who leads) is gone.
fn stopping() -> ApiError {
    unavailable("this agent is stopping; retry at another".into())
}

/// Sends `held` to the leader (`first`), and again to each next one while the leadership
/// moves before an answer. `None`: this agent leads now, and answers it.
async fn follow_the_leader(
    state: &ApiState,
    forwarding: &Forwarding,
    first: Target,
    held: &HeldRequest,
    deadline: Instant,
) -> Result<Option<Response>, ApiError> {
    let mut target = first;
    loop {
        let before = forwarding.view();
        let mut members = forwarding.members.clone();
        match target {
            Target::Here => return Ok(None),
            Target::Leader(api) => {
                let moved =
                    members.wait_for(|view| forwarding.leads_elsewhere(view, &before, Some(&api)));
                tokio::select! {
                    answer = proxy(forwarding, held.copy(), &api) => return Ok(Some(answer)),
                    moved = moved => {
                        // The membership ended (the agent stops): no view will change again.
                        moved.map_err(|_| stopping())?;
                        tracing::info!(from = %api, "the leadership moved while a request waited for the leader's answer; sending it to the new leader");
                    }
                }
            }
            // This agent won while the request waited: `settled_target` below waits for its
            // server.
            Target::TakingOver => {}
            // The leader's lease ended and nobody won yet: wait for the next one.
            Target::Nobody => {
                let elected =
                    members.wait_for(|view| forwarding.leads_elsewhere(view, &before, None));
                match tokio::time::timeout_at(deadline, elected).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) => return Err(stopping()),
                    Err(_) => {
                        return Err(unavailable(
                            "the leadership moved and no agent took it over in time; retry".into(),
                        ));
                    }
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(unavailable(
                "the leadership kept moving while forwarding; retry".into(),
            ));
        }
        target = settled_target(state, forwarding, deadline).await?;
    }
}
