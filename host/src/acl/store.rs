//! Where tokens are kept: the [`TokenStore`] seam, and [`LocalTokens`], a single agent's,
//! on its state store. Cluster mode keeps them in etcd (`crate::cluster::EtcdTokens`), so
//! that every agent finds the same tokens and a revocation holds on all of them at once.

use super::token::{AclToken, digests_match};
use crate::state::{ServerTable, StateDb, Write, call_store};
use crate::util::locks::LockUnpoisoned;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The key of the bootstrap marker in a store's token table: tokens are keyed by their
/// secret's digest (64 hex digits), which this can never be.
pub const BOOTSTRAP_KEY: &str = "bootstrapped";

/// Why a token could not be read or kept.
#[derive(Debug, thiserror::Error)]
#[error("ACL token store: {0}")]
pub struct TokenStoreError(pub String);

/// The cluster's tokens.
///
/// # Contract
/// - A token is found ([`find`](TokenStore::find)) by its secret's digest, from the moment
///   its [`insert`](TokenStore::insert) or [`bootstrap`](TokenStore::bootstrap) returns
///   until its [`revoke`](TokenStore::revoke) returns, on every agent sharing the store, and
///   never after: callers look a token up on every request and cache nothing.
/// - [`bootstrap`](TokenStore::bootstrap) succeeds once in the store's life, whoever calls it
///   and wherever.
/// - Every method may be called from any task, at once.
#[async_trait::async_trait]
pub trait TokenStore: Send + Sync + 'static {
    /// Saves `token` as the first management token, unless the ACLs were bootstrapped
    /// already: then saves nothing and returns false.
    async fn bootstrap(&self, token: &AclToken) -> Result<bool, TokenStoreError>;
    /// Saves a new token.
    async fn insert(&self, token: &AclToken) -> Result<(), TokenStoreError>;
    /// The token whose secret has `digest`, expired or not.
    async fn find(&self, digest: &str) -> Result<Option<Arc<AclToken>>, TokenStoreError>;
    /// Every token.
    async fn list(&self) -> Result<Vec<AclToken>, TokenStoreError>;
    /// Deletes the token `accessor_id` names; false when there is none.
    async fn revoke(&self, accessor_id: &str) -> Result<bool, TokenStoreError>;
}

/// A single agent's tokens: in memory, written through to its state store (table
/// `acl_tokens`) before any change is answered.
pub struct LocalTokens {
    db: Arc<dyn StateDb>,
    tokens: Mutex<Tokens>,
}

#[derive(Default)]
struct Tokens {
    by_digest: BTreeMap<String, Arc<AclToken>>,
    bootstrapped: bool,
}

impl LocalTokens {
    /// The tokens `db` holds. A record that does not decode is skipped with a WARN (the
    /// token it was stops working; the agent starts).
    pub fn open(db: Arc<dyn StateDb>) -> Result<LocalTokens, TokenStoreError> {
        let records = call_store(&*db, || db.server_records(ServerTable::AclTokens))
            .map_err(|e| TokenStoreError(e.to_string()))?;
        let mut tokens = Tokens::default();
        for (key, bytes) in records {
            if key == BOOTSTRAP_KEY {
                tokens.bootstrapped = true;
                continue;
            }
            match serde_json::from_slice::<AclToken>(&bytes) {
                Ok(token) => {
                    tokens.by_digest.insert(key, Arc::new(token));
                }
                Err(error) => tracing::warn!(error = %error, "skipping an unreadable ACL token"),
            }
        }
        Ok(LocalTokens {
            db,
            tokens: Mutex::new(tokens),
        })
    }

    fn save(&self, writes: Vec<Write>) -> Result<(), TokenStoreError> {
        call_store(&*self.db, || self.db.apply(writes)).map_err(|e| TokenStoreError(e.to_string()))
    }
}

fn put(token: &AclToken) -> Write {
    Write::PutServer {
        table: ServerTable::AclTokens,
        key: token.secret_sha256.clone(),
        value: serde_json::to_vec(token).expect("a token serializes"),
    }
}

#[async_trait::async_trait]
impl TokenStore for LocalTokens {
    async fn bootstrap(&self, token: &AclToken) -> Result<bool, TokenStoreError> {
        // The lock is held across the save so that two bootstraps cannot both pass the check.
        let mut tokens = self.tokens.lock_unpoisoned();
        if tokens.bootstrapped {
            return Ok(false);
        }
        let marker = Write::PutServer {
            table: ServerTable::AclTokens,
            key: BOOTSTRAP_KEY.into(),
            value: token.accessor_id.as_bytes().to_vec(),
        };
        self.save(vec![marker, put(token)])?;
        tokens.bootstrapped = true;
        tokens
            .by_digest
            .insert(token.secret_sha256.clone(), Arc::new(token.clone()));
        Ok(true)
    }

    async fn insert(&self, token: &AclToken) -> Result<(), TokenStoreError> {
        let mut tokens = self.tokens.lock_unpoisoned();
        self.save(vec![put(token)])?;
        tokens
            .by_digest
            .insert(token.secret_sha256.clone(), Arc::new(token.clone()));
        Ok(())
    }

    async fn find(&self, digest: &str) -> Result<Option<Arc<AclToken>>, TokenStoreError> {
        let tokens = self.tokens.lock_unpoisoned();
        Ok(tokens
            .by_digest
            .get(digest)
            .filter(|token| digests_match(&token.secret_sha256, digest))
            .cloned())
    }

    async fn list(&self) -> Result<Vec<AclToken>, TokenStoreError> {
        Ok(self
            .tokens
            .lock_unpoisoned()
            .by_digest
            .values()
            .map(|token| AclToken::clone(token))
            .collect())
    }

    async fn revoke(&self, accessor_id: &str) -> Result<bool, TokenStoreError> {
        let mut tokens = self.tokens.lock_unpoisoned();
        let Some(digest) = tokens
            .by_digest
            .iter()
            .find(|(_, token)| token.accessor_id == accessor_id)
            .map(|(digest, _)| digest.clone())
        else {
            return Ok(false);
        };
        self.save(vec![Write::DeleteServer {
            table: ServerTable::AclTokens,
            key: digest.clone(),
        }])?;
        tokens.by_digest.remove(&digest);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{Role, TokenRequest};
    use crate::state::MemoryStateDb;

    fn token(role: Role) -> (AclToken, String) {
        TokenRequest {
            name: "t".into(),
            role,
            namespace: None,
            ttl: None,
        }
        .make(0)
        .unwrap()
    }

    #[tokio::test]
    async fn bootstrap_happens_once_and_survives_a_reopen() {
        let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
        let store = LocalTokens::open(db.clone()).unwrap();
        let (first, _) = token(Role::Management);
        let (second, _) = token(Role::Management);
        assert!(store.bootstrap(&first).await.unwrap());
        assert!(!store.bootstrap(&second).await.unwrap());
        let reopened = LocalTokens::open(db).unwrap();
        assert!(!reopened.bootstrap(&second).await.unwrap());
        let found = reopened.find(&first.secret_sha256).await.unwrap();
        assert_eq!(found.as_deref(), Some(&first));
        assert_eq!(reopened.find(&second.secret_sha256).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_revoked_token_is_gone_at_once_and_after_a_reopen() {
        let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
        let store = LocalTokens::open(db.clone()).unwrap();
        let (read, _) = token(Role::Read);
        store.insert(&read).await.unwrap();
        assert_eq!(store.list().await.unwrap().len(), 1);
        assert!(store.revoke(&read.accessor_id).await.unwrap());
        assert!(!store.revoke(&read.accessor_id).await.unwrap());
        assert_eq!(store.find(&read.secret_sha256).await.unwrap(), None);
        let reopened = LocalTokens::open(db).unwrap();
        assert!(reopened.list().await.unwrap().is_empty());
    }
}
