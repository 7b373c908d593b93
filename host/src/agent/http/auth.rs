//! Who may call what: the one place a caller's token and certificate are checked.
//!
//! Every route is added with what it needs ([`Permission`], `routes`), and [`authorize`], a
//! layer over the whole router, checks each request against its route's rule before
//! anything else answers it; handlers never look at the token, but for the namespace a
//! `submit` token is confined to ([`Caller::may_change_namespace`]). A request no rule
//! matches is a 404 (or 405) here, and never reaches the router: a route without a rule
//! cannot be reached, and neither can a path the router would match more loosely than the
//! rules. A public route's caller is not looked up at all.
//!
//! Who the caller is ([`Caller`]) depends on the agent's settings:
//! - ACLs on (`[acl] enabled`): the token presented (`X-Caravan-Token`, or `Authorization:
//!   Bearer`) is looked up by its secret's digest in the token store on every request, so a
//!   revocation holds at once; without one, only public routes answer (401 else), and a
//!   token whose role falls short gets a 403 naming the role needed. The old `acl_token`, if
//!   set, is a management token.
//! - ACLs off, `acl_token` set (the single shared token of earlier releases): that token may
//!   do everything; without it, the reads are open but an alloc's files, runner builds and
//!   node routes.
//! - Neither: everything is open, as in Nomad without ACLs.
//!
//! A node's routes ([`Permission::Node`]) take a `node` token or, with TLS on, an agent's
//! or node's certificate ([`PeerRole::Agent`]); with TLS on they need that certificate
//! whatever the token.
//!
//! The check runs where the caller's request arrives, before forwarding; the leader a
//! request is forwarded to checks it again (it has the same tokens) to know the caller's
//! namespace.

use super::routes::RuleBook;
use super::{ApiError, ApiState};
use crate::acl::{AclToken, Permission, Resolution, TokenStore};
use crate::tls::PeerRole;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The header a token may come in, as Nomad's `X-Nomad-Token`.
pub const TOKEN_HEADER: &str = "x-caravan-token";

/// How this agent tells callers apart.
#[derive(Clone, Default)]
pub struct AclSettings {
    /// ACL tokens (`[acl] enabled`); `None`: ACLs off.
    pub tokens: Option<Arc<dyn TokenStore>>,
    /// The single shared token of earlier releases (`acl_token`): with ACLs on, a
    /// management token; with them off, the one token writes need.
    pub shared_token: Option<String>,
}

impl AclSettings {
    /// Whether anything is checked at all.
    fn is_open(&self) -> bool {
        self.tokens.is_none() && self.shared_token.is_none()
    }
}

/// Who made a request, as the check found it; put on the request for handlers and on the
/// answer for the audit line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Nothing is checked on this agent.
    Open,
    /// The shared `acl_token`.
    SharedToken,
    /// An ACL token.
    Token(Arc<AclToken>),
    /// No token, or (recorded for the audit) one that is not valid.
    Anonymous(Presented),
}

/// What an anonymous caller presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented {
    /// No token.
    Nothing,
    /// A token no one has (never made, revoked, or not the shared one).
    Unknown,
    /// A token past its TTL.
    Expired,
}

impl Caller {
    /// Whether this caller may change jobs of `namespace` (a `submit` token may be confined
    /// to one).
    pub fn may_change_namespace(&self, namespace: &str) -> bool {
        match self {
            Caller::Token(token) => token.covers_namespace(namespace),
            _ => true,
        }
    }

    /// For the audit line: `none`, `valid`, `invalid` or `expired`.
    pub fn token_word(&self) -> &'static str {
        match self {
            Caller::Open | Caller::Anonymous(Presented::Nothing) => "none",
            Caller::SharedToken | Caller::Token(_) => "valid",
            Caller::Anonymous(Presented::Unknown) => "invalid",
            Caller::Anonymous(Presented::Expired) => "expired",
        }
    }
}

/// The secret a request presents: `X-Caravan-Token`, else `Authorization: Bearer`.
pub fn presented_secret(headers: &HeaderMap) -> Option<&str> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let present = |secret: &str| !secret.is_empty();
    header(TOKEN_HEADER)
        .map(str::trim)
        .filter(|secret| present(secret))
        .or_else(|| {
            let bearer = header(header::AUTHORIZATION.as_str())?.strip_prefix("Bearer ")?;
            Some(bearer.trim()).filter(|secret| present(secret))
        })
}

/// The layer's state: the API's, and the rules of its routes.
#[derive(Clone)]
pub(super) struct Guard {
    pub(super) api: ApiState,
    pub(super) rules: Arc<RuleBook>,
}

/// The layer over every route, outside forwarding: finds the route's rule and the caller,
/// and refuses what the one may not do of the other (see the module docs).
pub(super) async fn authorize(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let Some(rule) = guard.rules.find(request.method(), path).cloned() else {
        // Closed: what no rule covers is answered here, and never reaches the router, whose
        // matching may be looser than the rules' (an empty segment fills a `{name}` there).
        let refusal = if guard.rules.knows_path(path) {
            super::method_not_allowed_error(request.method(), path)
        } else {
            super::not_found_error(path)
        };
        return refusal.into_response();
    };
    if rule.needs == Permission::Public {
        return next.run(request).await;
    }
    let peer = request.extensions().get::<PeerRole>().copied();
    if let Some(refusal) = refuse_without_agent_certificate(&guard, rule.needs, peer) {
        return refusal.into_response();
    }
    let settings = &guard.api.acl;
    let caller = match identify(settings, request.headers()).await {
        Ok(caller) => caller,
        Err(error) => return error.into_response(),
    };
    if let Err(refusal) = check(settings, &caller, peer, rule.needs, request.uri().path()) {
        let mut response = refusal.into_response();
        response.extensions_mut().insert(caller);
        return response;
    }
    request.extensions_mut().insert(caller.clone());
    let mut response = next.run(request).await;
    response.extensions_mut().insert(caller);
    response
}

/// Who the caller of a request with `headers` is.
async fn identify(settings: &AclSettings, headers: &HeaderMap) -> Result<Caller, ApiError> {
    if settings.is_open() {
        return Ok(Caller::Open);
    }
    let Some(secret) = presented_secret(headers) else {
        return Ok(Caller::Anonymous(Presented::Nothing));
    };
    if let Some(shared) = &settings.shared_token
        && tokens_match(secret, shared)
    {
        return Ok(Caller::SharedToken);
    }
    let Some(store) = &settings.tokens else {
        return Ok(Caller::Anonymous(Presented::Unknown));
    };
    let now = crate::util::timestamp::unix_ms_now();
    match crate::acl::resolve(&**store, secret, now).await {
        Ok(Resolution::Token(token)) => Ok(Caller::Token(token)),
        Ok(Resolution::Unknown) => Ok(Caller::Anonymous(Presented::Unknown)),
        Ok(Resolution::Expired) => Ok(Caller::Anonymous(Presented::Expired)),
        Err(error) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot check the token now: {error}; retry"),
        )),
    }
}

/// Whether `caller`, over a connection whose certificate made it `peer`, may do what a
/// route needing `needs` does; the refusal to answer if not.
fn check(
    settings: &AclSettings,
    caller: &Caller,
    peer: Option<PeerRole>,
    needs: Permission,
    path: &str,
) -> Result<(), ApiError> {
    if needs == Permission::Public {
        return Ok(());
    }
    match caller {
        Caller::Open | Caller::SharedToken => Ok(()),
        Caller::Token(token) if token.role.allows(needs) => Ok(()),
        Caller::Token(token) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "this needs a token with role {}{}; token {:?} has role {}",
                needs.least_role(),
                if needs == Permission::Management || needs == Permission::Node {
                    ""
                } else {
                    " or above"
                },
                crate::util::text::escape_controls(&token.name),
                token.role
            ),
        )),
        Caller::Anonymous(_) if needs == Permission::Node && peer == Some(PeerRole::Agent) => {
            Ok(())
        }
        Caller::Anonymous(presented) => {
            // Without ACLs, the shared token guards writes, an alloc's files and runner
            // builds; other reads are open, as before ACLs.
            let open_read = settings.tokens.is_none()
                && needs == Permission::Read
                && !path.starts_with("/v1/client/fs/")
                && !path.starts_with("/v1/runner/");
            if open_read {
                return Ok(());
            }
            Err(match presented {
                Presented::Nothing => ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    format!(
                        "this needs a token (role {} or above): send X-Caravan-Token: <secret> \
                         or Authorization: Bearer <secret>",
                        needs.least_role()
                    ),
                ),
                Presented::Unknown => ApiError::new(
                    StatusCode::FORBIDDEN,
                    "the token is not valid here: unknown, or revoked",
                ),
                Presented::Expired => ApiError::new(StatusCode::FORBIDDEN, "the token has expired"),
            })
        }
    }
}

/// With TLS on, the refusal of a node's route ([`Permission::Node`]) to a connection that
/// did not present an agent's or a node's certificate, whatever its token.
fn refuse_without_agent_certificate(
    guard: &Guard,
    needs: Permission,
    peer: Option<PeerRole>,
) -> Option<ApiError> {
    if !guard.api.agent_routes_need_certs || needs != Permission::Node {
        return None;
    }
    match peer.unwrap_or(PeerRole::Anonymous) {
        PeerRole::Agent => None,
        PeerRole::Anonymous => Some(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "only agents call this route: connect with an agent's certificate \
             (server.REGION.caravan or client.REGION.caravan, from the cluster's CA)",
        )),
        PeerRole::Operator => Some(ApiError::new(
            StatusCode::FORBIDDEN,
            "only agents call this route, and this connection's certificate is not an \
             agent's (server.REGION.caravan or client.REGION.caravan of this region)",
        )),
    }
}

/// Whether a request of `method` on `path` is one only agents and nodes make.
pub(super) fn agent_only(rules: &RuleBook, method: &Method, path: &str) -> bool {
    rules
        .find(method, path)
        .is_some_and(|rule| rule.needs == Permission::Node)
}

/// Whether `given` is `expected`, in time that depends on neither: both are hashed to a fixed
/// length first (so neither length shows), and the digests compared to the end.
pub(super) fn tokens_match(given: &str, expected: &str) -> bool {
    crate::acl::digests_match(
        &crate::acl::secret_digest(given),
        &crate::acl::secret_digest(expected),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{Role, TokenRequest};

    fn token(role: Role) -> Caller {
        let request = TokenRequest {
            name: "t".into(),
            role,
            namespace: None,
            ttl: None,
        };
        Caller::Token(Arc::new(request.make(0).unwrap().0))
    }

    fn acls_on() -> AclSettings {
        let db: Arc<dyn crate::state::StateDb> = Arc::new(crate::state::MemoryStateDb::new());
        AclSettings {
            tokens: Some(Arc::new(crate::acl::LocalTokens::open(db).unwrap())),
            shared_token: None,
        }
    }

    fn status(result: Result<(), ApiError>) -> u16 {
        match result {
            Ok(()) => 200,
            Err(error) => error.into_response().status().as_u16(),
        }
    }

    #[test]
    fn with_acls_on_nothing_but_public_routes_answer_without_a_token() {
        let on = acls_on();
        let anonymous = Caller::Anonymous(Presented::Nothing);
        assert_eq!(
            status(check(&on, &anonymous, None, Permission::Public, "/ui")),
            200
        );
        for needs in [Permission::Read, Permission::Submit, Permission::Node] {
            assert_eq!(status(check(&on, &anonymous, None, needs, "/v1/jobs")), 401);
        }
        let revoked = Caller::Anonymous(Presented::Unknown);
        assert_eq!(
            status(check(&on, &revoked, None, Permission::Read, "/v1/jobs")),
            403
        );
    }

    #[test]
    fn a_role_that_falls_short_is_told_which_it_needs() {
        let refusal = check(
            &acls_on(),
            &token(Role::Read),
            None,
            Permission::Submit,
            "/",
        );
        let text = format!("{refusal:?}");
        assert!(text.contains("role submit or above"), "{text}");
        assert_eq!(status(refusal), 403);
    }

    #[test]
    fn a_node_route_takes_a_node_token_or_an_agents_certificate() {
        let on = acls_on();
        let anonymous = Caller::Anonymous(Presented::Nothing);
        let agent = Some(PeerRole::Agent);
        assert_eq!(
            status(check(&on, &anonymous, agent, Permission::Node, "/")),
            200
        );
        assert_eq!(
            status(check(&on, &anonymous, agent, Permission::Read, "/")),
            401
        );
        assert_eq!(
            status(check(&on, &token(Role::Node), None, Permission::Node, "/")),
            200
        );
        assert_eq!(
            status(check(&on, &token(Role::Node), None, Permission::Read, "/")),
            403
        );
        assert_eq!(
            status(check(
                &on,
                &token(Role::Operator),
                None,
                Permission::Node,
                "/"
            )),
            403
        );
    }

    #[test]
    fn without_acls_the_shared_token_guards_writes_and_files() {
        let shared = AclSettings {
            tokens: None,
            shared_token: Some("s3cret".into()),
        };
        let anonymous = Caller::Anonymous(Presented::Nothing);
        assert_eq!(
            status(check(
                &shared,
                &anonymous,
                None,
                Permission::Read,
                "/v1/jobs"
            )),
            200
        );
        let files = "/v1/client/fs/cat/abc";
        assert_eq!(
            status(check(&shared, &anonymous, None, Permission::Read, files)),
            401
        );
        assert_eq!(
            status(check(&shared, &anonymous, None, Permission::Submit, "/")),
            401
        );
        assert_eq!(
            status(check(
                &shared,
                &Caller::SharedToken,
                None,
                Permission::Node,
                "/"
            )),
            200
        );
    }

    #[test]
    fn a_token_comes_in_either_header() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(presented_secret(&headers), Some("abc"));
        headers.insert(TOKEN_HEADER, "xyz".parse().unwrap());
        assert_eq!(presented_secret(&headers), Some("xyz"));
        assert_eq!(presented_secret(&HeaderMap::new()), None);
    }

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(tokens_match("s3cret", "s3cret"));
        assert!(!tokens_match("s3cres", "s3cret"));
        assert!(!tokens_match("s3cret-longer", "s3cret"));
        assert!(!tokens_match("", "s3cret"));
    }
}
