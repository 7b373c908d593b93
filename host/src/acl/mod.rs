//! ACL tokens with roles (`[acl] enabled = true`): what a token is, what each role may do,
//! and where tokens are kept.
//!
//! A caller presents a token's secret; the agent hashes it, finds the token by that digest
//! ([`TokenStore::find`]) on every request, and checks the token's role against what the
//! route needs ([`Permission`]). Nothing here knows HTTP or etcd: the agent's API applies the
//! rules, and cluster mode provides a store on etcd.
//!
//! May use `state` (a single agent's tokens live in its state store), `model` (what a
//! namespace is) and `util`; nothing above.

mod store;
mod token;

pub use store::{BOOTSTRAP_KEY, LocalTokens, TokenStore, TokenStoreError};
pub use token::{
    AclToken, MAX_NAME, MAX_SECRET, Permission, Role, TokenRequest, digests_match, secret_digest,
};

/// What a presented secret turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// A live token.
    Token(std::sync::Arc<AclToken>),
    /// No token has this secret (never made, or revoked).
    Unknown,
    /// The token it was has passed its TTL.
    Expired,
}

/// Finds the token `secret` belongs to, as it stands at `now_unix_ms`. A secret longer than
/// [`MAX_SECRET`] is unknown without being hashed.
pub async fn resolve(
    store: &dyn TokenStore,
    secret: &str,
    now_unix_ms: u64,
) -> Result<Resolution, TokenStoreError> {
    if secret.is_empty() || secret.len() > MAX_SECRET {
        return Ok(Resolution::Unknown);
    }
    Ok(match store.find(&secret_digest(secret)).await? {
        None => Resolution::Unknown,
        Some(token) if !token.is_live(now_unix_ms) => Resolution::Expired,
        Some(token) => Resolution::Token(token),
    })
}
