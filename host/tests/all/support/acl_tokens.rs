//! ACL tokens made as an operator makes them, over the agent's API: the bootstrap, then a
//! token of a role.

use super::http;
use std::net::SocketAddr;

/// Bootstraps the ACLs of the agent at `addr`; returns the management token's secret.
pub async fn acl_bootstrap(addr: SocketAddr) -> String {
    let (status, token) = http(addr, "POST", "/v1/acl/bootstrap", None, None).await;
    assert_eq!(status, 200, "bootstrap: {token}");
    token["secret_id"].as_str().unwrap().to_string()
}

/// Makes a token called `name` of `role` (`read`, `submit`, ...), confined to `namespace`
/// if given, with the `management` token; returns its secret and accessor id.
pub async fn acl_token(
    addr: SocketAddr,
    management: &str,
    name: &str,
    role: &str,
    namespace: Option<&str>,
) -> (String, String) {
    let body = serde_json::json!({ "name": name, "role": role, "namespace": namespace });
    let body = body.to_string();
    let (status, token) = http(addr, "POST", "/v1/acl/token", Some(&body), Some(management)).await;
    assert_eq!(status, 200, "token create: {token}");
    (
        token["secret_id"].as_str().unwrap().to_string(),
        token["accessor_id"].as_str().unwrap().to_string(),
    )
}
