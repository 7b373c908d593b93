//! ACL tokens over HTTP, Nomad's paths: bootstrap (once, anyone: it answers the first caller
//! only), a token made, listed, revoked, and a token asking what it is. The token's secret is
//! in the answer that makes it, and in no other.

use super::auth::Caller;
use super::body::{JsonBody, RequestBody};
use super::{ApiError, ApiResult, ApiState, TimedJson};
use crate::acl::{AclToken, Role, TokenRequest, TokenStore};
use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use std::sync::Arc;

/// A token as the API shows it.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct TokenView {
    /// Names it; grants nothing.
    pub accessor_id: String,
    /// The secret to present: only in the answer that made the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_id: Option<String>,
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// The namespace its writes are confined to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// When it was made.
    pub create_unix_ms: u64,
    /// When it stops working, if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_unix_ms: Option<u64>,
}

impl TokenView {
    fn of(token: AclToken, secret: Option<String>) -> TokenView {
        TokenView {
            accessor_id: token.accessor_id,
            secret_id: secret,
            name: token.name,
            role: token.role,
            namespace: token.namespace,
            create_unix_ms: token.create_unix_ms,
            expire_unix_ms: token.expire_unix_ms,
        }
    }
}

impl RequestBody for TokenRequest {
    const EXAMPLE: &'static str =
        r#"{"name": "ci", "role": "submit", "namespace": "ci", "ttl": "720h"}"#;
}

fn acls_off() -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "ACLs are off on this agent: set [acl] enabled = true in its config",
    )
}

fn tokens(state: &ApiState) -> ApiResult<&Arc<dyn TokenStore>> {
    state.acl.tokens.as_ref().ok_or_else(acls_off)
}

fn unavailable(error: crate::acl::TokenStoreError) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("{error}; retry"))
}

pub(super) async fn bootstrap(State(state): State<ApiState>) -> ApiResult<TimedJson<TokenView>> {
    let store = tokens(&state)?;
    let request = TokenRequest {
        name: "Bootstrap Token".into(),
        role: Role::Management,
        namespace: None,
        ttl: None,
    };
    let now = crate::util::timestamp::unix_ms_now();
    let (token, secret) = request
        .make(now)
        .map_err(|(field, problem)| ApiError::bad_request(field, problem))?;
    if !store.bootstrap(&token).await.map_err(unavailable)? {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "ACL bootstrap already done: ask a management token's holder for a token",
        ));
    }
    tracing::info!(accessor = token.accessor_id, "ACLs bootstrapped");
    Ok(TimedJson(TokenView::of(token, Some(secret))))
}

pub(super) async fn create_token(
    State(state): State<ApiState>,
    JsonBody(request): JsonBody<TokenRequest>,
) -> ApiResult<TimedJson<TokenView>> {
    let store = tokens(&state)?;
    if request.namespace.is_some() && request.role != Role::Submit {
        return Err(ApiError::bad_request(
            "namespace",
            format!(
                "only submit tokens are confined to a namespace; a {} token's actions (on \
                 allocs, nodes, the GC, tokens) are cluster-wide",
                request.role
            ),
        ));
    }
    let now = crate::util::timestamp::unix_ms_now();
    let (token, secret) = request
        .make(now)
        .map_err(|(field, problem)| ApiError::bad_request(field, problem))?;
    store.insert(&token).await.map_err(unavailable)?;
    Ok(TimedJson(TokenView::of(token, Some(secret))))
}

pub(super) async fn list_tokens(
    State(state): State<ApiState>,
) -> ApiResult<TimedJson<Vec<TokenView>>> {
    let mut tokens = tokens(&state)?.list().await.map_err(unavailable)?;
    tokens.sort_by(|a, b| (a.create_unix_ms, &a.name).cmp(&(b.create_unix_ms, &b.name)));
    Ok(TimedJson(
        tokens.into_iter().map(|t| TokenView::of(t, None)).collect(),
    ))
}

pub(super) async fn revoke_token(
    State(state): State<ApiState>,
    Path(accessor): Path<String>,
) -> ApiResult<axum::Json<serde_json::Value>> {
    if !tokens(&state)?
        .revoke(&accessor)
        .await
        .map_err(unavailable)?
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no token has accessor id {:?}",
                crate::util::text::cut(&accessor, 64)
            ),
        ));
    }
    Ok(axum::Json(
        serde_json::json!({ "revoked": true, "accessor_id": accessor }),
    ))
}

/// `GET /v1/acl/token/self`: the token presented; 400 on an agent that checks none (the
/// UI hides its token box then).
pub(super) async fn token_self(
    Extension(caller): Extension<Caller>,
) -> ApiResult<TimedJson<TokenView>> {
    match caller {
        Caller::Token(token) => Ok(TimedJson(TokenView::of(AclToken::clone(&token), None))),
        // The old shared token: a management token with no record.
        Caller::SharedToken => Ok(TimedJson(TokenView {
            accessor_id: String::new(),
            secret_id: None,
            name: "acl_token (deprecated)".into(),
            role: Role::Management,
            namespace: None,
            create_unix_ms: 0,
            expire_unix_ms: None,
        })),
        Caller::Open => Err(acls_off()),
        Caller::Anonymous(_) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "send a token to ask about it",
        )),
    }
}
