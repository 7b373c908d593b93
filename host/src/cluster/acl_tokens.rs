//! The cluster's ACL tokens on etcd: every agent reads and writes them directly (they are not
//! the scheduler's state, and need no leader), so a token made or revoked through any agent
//! holds on every agent from the moment the call returns.
//!
//! Keys (`docs/cluster.md`): `acl/tokens/<digest>`, a token by its secret's SHA-256, and
//! `acl/bootstrapped`, created with the first management token in one transaction. A lookup
//! is one linearizable read of one key; nothing is cached.
//!
//! A revoked token's key is not deleted: it is overwritten with [`REVOKED`], for good. A
//! token is saved only where its key does not exist, so an attempt to save it that was held
//! in a member cut off and lands late, after the revocation, finds the key and changes
//! nothing; with a delete, it would have brought the revoked token back.

use super::keys;
use super::store::{EtcdStore, StoreError};
use crate::acl::{AclToken, TokenStore, TokenStoreError, digests_match};
use std::sync::Arc;

/// The cluster's tokens, on its etcd.
pub struct EtcdTokens {
    store: EtcdStore,
}

impl EtcdTokens {
    /// The tokens on `store`'s cluster.
    pub fn new(store: EtcdStore) -> EtcdTokens {
        EtcdTokens { store }
    }
}

fn failed(error: StoreError) -> TokenStoreError {
    TokenStoreError(error.to_string())
}

/// What a revoked token's key holds (a token's record is JSON, so never this).
const REVOKED: &[u8] = b"revoked";

fn encoded(token: &AclToken) -> Vec<u8> {
    serde_json::to_vec(token).expect("a token serializes")
}

#[async_trait::async_trait]
impl TokenStore for EtcdTokens {
    async fn bootstrap(&self, token: &AclToken) -> Result<bool, TokenStoreError> {
        let put = (keys::acl_token_key(&token.secret_sha256), encoded(token));
        self.store
            .create_with(
                &keys::acl_bootstrap_key(),
                token.accessor_id.as_bytes(),
                &[put],
            )
            .await
            .map_err(failed)
    }

    async fn insert(&self, token: &AclToken) -> Result<(), TokenStoreError> {
        let key = keys::acl_token_key(&token.secret_sha256);
        let saved = self
            .store
            .create(&key, &encoded(token))
            .await
            .map_err(failed)?;
        match saved {
            true => Ok(()),
            // A new token's secret is random: its key is taken only by a token revoked
            // since, whose attempt this is.
            false => Err(TokenStoreError(
                "a token with this secret exists or was revoked; make a new one".into(),
            )),
        }
    }

    async fn find(&self, digest: &str) -> Result<Option<Arc<AclToken>>, TokenStoreError> {
        let found = self
            .store
            .get_many(&[keys::acl_token_key(digest)])
            .await
            .map_err(failed)?;
        let Some(record) = found.into_iter().next().filter(|r| r.value != REVOKED) else {
            return Ok(None);
        };
        match serde_json::from_slice::<AclToken>(&record.value) {
            Ok(token) if digests_match(&token.secret_sha256, digest) => Ok(Some(Arc::new(token))),
            Ok(_) => Ok(None),
            Err(error) => {
                tracing::warn!(key = record.key, error = %error, "an unreadable ACL token");
                Ok(None)
            }
        }
    }

    async fn list(&self) -> Result<Vec<AclToken>, TokenStoreError> {
        let (records, _) = self
            .store
            .list(&keys::acl_tokens_prefix())
            .await
            .map_err(failed)?;
        Ok(records
            .iter()
            .filter_map(|record| serde_json::from_slice(&record.value).ok())
            .collect())
    }

    async fn revoke(&self, accessor_id: &str) -> Result<bool, TokenStoreError> {
        let Some(token) = self
            .list()
            .await?
            .into_iter()
            .find(|token| token.accessor_id == accessor_id)
        else {
            return Ok(false);
        };
        let key = keys::acl_token_key(&token.secret_sha256);
        self.store.put(&key, REVOKED).await.map_err(failed)?;
        Ok(true)
    }
}
