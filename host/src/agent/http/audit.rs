//! The audit trail: one structured line per write an operator makes (any method but GET and
//! HEAD, on any route but those only agents call), saying who (the token presented, the
//! connection's certificate role and address; with ACLs on, the token's name and accessor), what (the method, the path, the job, alloc or
//! node it names) and how it ended (the status, accepted or refused). Each line is a tracing
//! event on the target `caravan::audit`, so it reaches the agent's log in its format, and
//! an operator filters it there (`log_level = "info,caravan::audit=off"`); with `[audit]
//! path`, each is also appended to that file as a JSON line ([`super::super::audit_log`]).
//!
//! The layer is outside forwarding, so a write is recorded where its caller sent it, with
//! the caller's own connection; a request another agent forwarded here (marked so, over a
//! connection with an agent's certificate) is not recorded twice. Without TLS the mark cannot
//! be trusted, so such a request is recorded again, marked `forwarded`.
//!
//! What a caller sends is cut and escaped before it is recorded, as every line for people is.
//! Node RPC and the other agent routes are not operators' writes, and are not recorded: a
//! cluster's nodes report thousands of times a second.

use super::auth::{Caller, Guard};
use crate::tls::PeerRole;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use std::net::SocketAddr;

/// The most of a path an audit line keeps.
const MAX_PATH: usize = 256;

/// The address of the caller's connection, put on each request by the agent's accept loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerAddr(pub SocketAddr);

/// What a handler adds to its answer for the audit line, beyond what its path names: the
/// job a registration created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AuditJob(pub String);

/// One write, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditRecord {
    /// When it was answered, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// The token presented: `none`, `valid`, `invalid` (unknown or revoked) or `expired`.
    pub token: &'static str,
    /// The ACL token's name, when a valid one was presented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_name: Option<String>,
    /// The ACL token's accessor id, when a valid one was presented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_accessor: Option<String>,
    /// What the connection's certificate made the caller: `anonymous` (none, or plain
    /// HTTP), `operator` or `agent`.
    pub peer: &'static str,
    /// The caller's address.
    pub addr: Option<String>,
    /// The method.
    pub method: String,
    /// The path, cut and escaped.
    pub path: String,
    /// The job it names, if any.
    pub job: Option<String>,
    /// The alloc it names, if any.
    pub alloc: Option<String>,
    /// The node it names, if any.
    pub node: Option<String>,
    /// The status answered.
    pub status: u16,
    /// `accepted` (2xx) or `refused`.
    pub result: &'static str,
    /// Whether the request said another agent forwarded it (recorded anyway: see the module).
    pub forwarded: bool,
}

/// The layer: records every operator's write once it is answered.
pub(super) async fn record_writes(
    State(guard): State<Guard>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    if method == Method::GET
        || method == Method::HEAD
        || super::auth::agent_only(&guard.rules, &method, &path)
    {
        return next.run(request).await;
    }
    let role = request
        .extensions()
        .get::<PeerRole>()
        .copied()
        .unwrap_or(PeerRole::Anonymous);
    let forwarded = request.headers().contains_key(super::forward::FORWARDED);
    if forwarded && role == PeerRole::Agent {
        return next.run(request).await;
    }
    let addr = request
        .extensions()
        .get::<CallerAddr>()
        .map(|a| a.0.to_string());
    let response = next.run(request).await;
    let caller = response.extensions().get::<Caller>();
    let token = caller.map_or("none", Caller::token_word);
    let (token_name, token_accessor) = match caller {
        Some(Caller::Token(token)) => (Some(clean(&token.name)), Some(token.accessor_id.clone())),
        Some(Caller::SharedToken) => (Some("acl_token".to_string()), None),
        _ => (None, None),
    };
    let (job, alloc, node) = subjects(&path);
    let job = job.or_else(|| response.extensions().get::<AuditJob>().map(|j| j.0.clone()));
    let status = response.status();
    let record = AuditRecord {
        time_unix_ms: crate::util::timestamp::unix_ms_now(),
        token,
        token_name,
        token_accessor,
        peer: match role {
            PeerRole::Anonymous => "anonymous",
            PeerRole::Operator => "operator",
            PeerRole::Agent => "agent",
        },
        addr,
        method: method.to_string(),
        path: crate::util::text::escape_controls(&crate::util::text::cut(&path, MAX_PATH))
            .into_owned(),
        job: job.map(|id| clean(&id)),
        alloc: alloc.map(|id| clean(&id)),
        node: node.map(|id| clean(&id)),
        status: status.as_u16(),
        result: if status.is_success() {
            "accepted"
        } else {
            "refused"
        },
        forwarded,
    };
    tracing::info!(
        target: "caravan::audit",
        token = record.token,
        token_name = record.token_name.as_deref().unwrap_or("-"),
        token_accessor = record.token_accessor.as_deref().unwrap_or("-"),
        peer = record.peer,
        addr = record.addr.as_deref().unwrap_or("-"),
        method = %record.method,
        path = %record.path,
        job = record.job.as_deref().unwrap_or("-"),
        alloc = record.alloc.as_deref().unwrap_or("-"),
        node = record.node.as_deref().unwrap_or("-"),
        status = record.status,
        result = record.result,
        forwarded = record.forwarded,
        "audit"
    );
    if let Some(log) = &guard.api.audit_log {
        log.append(&record);
    }
    response
}

/// An id from a path, as a line may show it.
fn clean(id: &str) -> String {
    crate::util::text::escape_controls(&crate::util::text::cut(id, 128)).into_owned()
}

/// The job, alloc and node a write's path names.
fn subjects(path: &str) -> (Option<String>, Option<String>, Option<String>) {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let after = |name: &str| {
        segments
            .windows(2)
            .find(|pair| pair[0] == name)
            .map(|pair| pair[1].to_string())
    };
    let alloc = after("allocation").or_else(|| {
        // `/v1/client/fs/{ls,cat}/{id}`
        (segments.get(2) == Some(&"fs")).then(|| segments.get(4).map(|s| s.to_string()))?
    });
    (after("job"), alloc, after("node"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writes_path_names_its_job_alloc_or_node() {
        let some = |s: &str| Some(s.to_string());
        assert_eq!(subjects("/v1/job/web/scale"), (some("web"), None, None));
        assert_eq!(subjects("/v1/job/web"), (some("web"), None, None));
        assert_eq!(
            subjects("/v1/client/allocation/ab12/signal"),
            (None, some("ab12"), None)
        );
        assert_eq!(
            subjects("/v1/allocation/ab12/stop"),
            (None, some("ab12"), None)
        );
        assert_eq!(
            subjects("/v1/node/node-1/drain"),
            (None, None, some("node-1"))
        );
        assert_eq!(subjects("/v1/jobs"), (None, None, None));
        assert_eq!(subjects("/v1/system/gc"), (None, None, None));
    }
}
