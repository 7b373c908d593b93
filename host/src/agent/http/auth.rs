//! Who may call what: the one place the API's token is checked.
//!
//! [`require_token`] is a route layer over every route, so a route added later is covered
//! without its handler doing anything; handlers never look at the token. The rule
//! ([`needs_token`]) is by method and path: every write (any method but GET and HEAD) needs
//! the token, and so do the reads that hand out more than the cluster's state: an alloc's
//! files (`/v1/client/fs/...`) and checkpoint (`/v1/client/allocation/{id}/checkpoint`, the
//! guest's own state, fetched by the node its drained alloc moves to), node RPC
//! (`/v1/node/...`, which streams every alloc of a node) and runner builds (`/v1/runner/...`,
//! a job's code; agents fetching one send their own token). Everything else is readable without one, as in Nomad without ACLs.
//!
//! The token is compared in constant time (both sides hashed, the digests compared without
//! an early exit), so its bytes cannot be guessed one at a time from response times.
//!
//! A request forwarded to the leader is checked by the leader, where it is answered: this
//! layer runs only on routes this agent answers itself.
//!
//! With TLS on, the routes only agents and nodes call ([`agent_only`]: node RPC, a runner
//! build fetched by hash (a HEAD, which only says whether it is here, is anyone's), an
//! alloc's checkpoint) also need the caller's connection to carry
//! an agent's or a node's certificate ([`PeerRole::Agent`]), checked before anything is
//! forwarded ([`require_agent_certificate`]): an operator's certificate from the same CA, or
//! none, gets a 403 or 401 there whatever its token.

use super::{ApiError, ApiState};
use crate::tls::PeerRole;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// Reads that need the token like writes do, by path prefix.
const GUARDED_READS: [&str; 3] = ["/v1/client/fs/", "/v1/node/", "/v1/runner/"];

/// Whether a request of `method` on `path` needs the token (when one is configured).
pub(super) fn needs_token(method: &Method, path: &str) -> bool {
    let read = *method == Method::GET || *method == Method::HEAD;
    let checkpoint = path.starts_with("/v1/client/allocation/") && path.ends_with("/checkpoint");
    !read || checkpoint || GUARDED_READS.iter().any(|prefix| path.starts_with(prefix))
}

/// Whether a request of `method` on `path` is one only agents and nodes make.
pub(super) fn agent_only(method: &Method, path: &str) -> bool {
    let read = *method == Method::GET || *method == Method::HEAD;
    let node_schedule = path.ends_with("/drain") || path.ends_with("/eligibility");
    let node_rpc = path.starts_with("/v1/node/") && !node_schedule;
    // A HEAD says only whether a build is here, as the list of builds does: the CLI asks
    // before uploading.
    let build = *method == Method::GET && path.starts_with("/v1/runner/");
    let checkpoint =
        read && path.starts_with("/v1/client/allocation/") && path.ends_with("/checkpoint");
    node_rpc || build || checkpoint
}

/// The layer over everything: with TLS on, refuses an [`agent_only`] request whose
/// connection did not present an agent's or a node's certificate.
pub(super) async fn require_agent_certificate(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    if !state.agent_routes_need_certs || !agent_only(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    let role = request.extensions().get::<PeerRole>().copied();
    match role.unwrap_or(PeerRole::Anonymous) {
        PeerRole::Agent => next.run(request).await,
        PeerRole::Anonymous => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "only agents call this route: connect with an agent's certificate \
             (server.REGION.caravan or client.REGION.caravan, from the cluster's CA)",
        )
        .into_response(),
        PeerRole::Operator => ApiError::new(
            StatusCode::FORBIDDEN,
            "only agents call this route, and this connection's certificate is not an \
             agent's (server.REGION.caravan or client.REGION.caravan of this region)",
        )
        .into_response(),
    }
}

/// The route layer: refuses a request that needs the token and lacks it (401) or carries
/// another (403), before any extractor reads its body.
pub(super) async fn require_token(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(expected) = &state.acl_token
        && needs_token(request.method(), request.uri().path())
    {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            None => {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "this agent needs a token: send Authorization: Bearer <token>",
                )
                .into_response();
            }
            Some(token) if !tokens_match(token, expected) => {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    "the token is not valid for this agent",
                )
                .into_response();
            }
            Some(_) => {}
        }
    }
    next.run(request).await
}

/// Whether `given` is `expected`, in time that depends on neither: both are hashed to a fixed
/// length first (so neither length shows), and the digests are compared byte by byte to
/// the end.
pub(super) fn tokens_match(given: &str, expected: &str) -> bool {
    let given = Sha256::digest(given.as_bytes());
    let expected = Sha256::digest(expected.as_bytes());
    let difference = given
        .iter()
        .zip(expected.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_needs_the_token() {
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            for path in [
                "/v1/jobs",
                "/v1/job/web",
                "/v1/system/gc",
                "/v1/anything-new",
            ] {
                assert!(needs_token(&method, path), "{method} {path}");
            }
        }
    }

    #[test]
    fn reads_are_open_but_for_an_allocs_files_and_node_rpc() {
        for path in [
            "/v1/jobs",
            "/v1/allocations",
            "/v1/client/allocation/abc/logs",
            "/v1/metrics",
            "/ui/",
        ] {
            assert!(!needs_token(&Method::GET, path), "{path}");
        }
        for path in [
            "/v1/client/fs/ls/abc",
            "/v1/client/fs/cat/abc",
            "/v1/node/n1/allocations",
        ] {
            assert!(needs_token(&Method::GET, path), "{path}");
            assert!(needs_token(&Method::HEAD, path), "{path}");
        }
    }

    #[test]
    fn only_node_rpc_build_fetches_and_checkpoints_are_agents_own() {
        for (method, path) in [
            (Method::PUT, "/v1/node/n1/register"),
            (Method::GET, "/v1/node/n1/allocations"),
            (Method::POST, "/v1/node/n1/allocations/fetch"),
            (Method::POST, "/v1/node/n1/allocations/update"),
            (Method::GET, "/v1/runner/00ff"),
            (Method::GET, "/v1/client/allocation/abc/checkpoint"),
        ] {
            assert!(agent_only(&method, path), "{method} {path}");
        }
        for (method, path) in [
            (Method::POST, "/v1/node/n1/drain"),
            (Method::POST, "/v1/node/n1/eligibility"),
            (Method::PUT, "/v1/runner/00ff"),
            (Method::HEAD, "/v1/runner/00ff"),
            (Method::GET, "/v1/runners"),
            (Method::GET, "/v1/nodes"),
            (Method::GET, "/v1/client/allocation/abc/logs"),
            (Method::POST, "/v1/jobs"),
        ] {
            assert!(!agent_only(&method, path), "{method} {path}");
        }
    }

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(tokens_match("s3cret", "s3cret"));
        assert!(!tokens_match("s3cres", "s3cret"));
        assert!(!tokens_match("s3cret-longer", "s3cret"));
        assert!(!tokens_match("", "s3cret"));
    }
}
