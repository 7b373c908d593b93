//! What holds only while its holder does: leases (a key that etcd deletes when its agent
//! stops renewing), and fenced writes (a transaction that lands only while the writer still
//! holds the key it was elected with).
//!
//! Retry rules, as for the rest of the store: a lease grant is retried (a lost answer leaves
//! an orphan lease, which expires on its own), a leased put writes the same value again, and
//! a create-or-read is guarded. A fenced transaction is tried once: an attempt whose answer
//! was lost may still land later, after a newer transaction, and a retry would then leave
//! etcd older than its writer believes. Its caller treats any failure as the end of its
//! leadership, and the next leadership (which compares another create revision, so no late
//! attempt of this one lands) starts from what etcd holds.

use super::backend::{CallError, CompareOp, CreatedCompare, LeaseKeeper, Transaction, TxnStep};
use super::store::{EtcdStore, KeyValue, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// Most operations one fenced transaction carries: etcd refuses more than 128, and the
/// fence's compare does not count, but a margin costs nothing.
pub const MAX_FENCED_OPS: usize = 120;

/// What a keep-alive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Renewed for another TTL.
    Alive,
    /// Expired: every key attached to it is gone. Grant a new one.
    Expired,
}

/// Renews one lease, over what the backend keeps between renewals (on etcd, one
/// keep-alive stream).
pub struct LeaseRenewer {
    store: EtcdStore,
    keeper: Arc<dyn LeaseKeeper>,
}

impl LeaseRenewer {
    /// Renews the lease once, retried as the store retries its calls.
    /// [`LeaseState::Expired`] when etcd no longer has it; an error when no member answered
    /// (the lease may still be alive: try again before its TTL is out). An attempt that
    /// fails or is cut short costs only the stream, opened again by the next attempt.
    pub async fn renew(&self) -> Result<LeaseState, StoreError> {
        self.store
            .retrying("renewing a lease", |_| {
                let keeper = self.keeper.clone();
                async move {
                    Ok(match keeper.renew().await? {
                        true => LeaseState::Alive,
                        false => LeaseState::Expired,
                    })
                }
            })
            .await
    }
}

/// The key an elected writer holds, and the revision that created it: its writes compare
/// the key's create revision with this one, so none lands once the key was lost (deleted
/// when the holder's lease expired, and maybe created again by another).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The held key.
    pub key: String,
    /// Its create revision when it was won.
    pub create_revision: i64,
}

/// One write of a fenced transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencedOp {
    /// Writes `value` at `key`.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Deletes `key` (nothing when it does not exist).
    Delete {
        /// The key.
        key: String,
    },
}

impl FencedOp {
    fn to_txn_step(&self) -> TxnStep {
        match self {
            FencedOp::Put { key, value } => TxnStep::Put {
                key: key.clone(),
                value: value.clone(),
                lease: 0,
            },
            FencedOp::Delete { key } => TxnStep::Delete { key: key.clone() },
        }
    }
}

impl EtcdStore {
    /// A new lease of `ttl` (etcd's floor is 2 s). Returns its id.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<i64, StoreError> {
        let ttl = ttl.as_secs().max(2) as i64;
        self.retrying("granting a lease", |etcd| async move {
            etcd.grant_lease(ttl).await
        })
        .await
    }

    /// What renews `lease` from now on, over one keep-alive stream kept open between
    /// renewals.
    pub fn lease_renewer(&self, lease: i64) -> LeaseRenewer {
        LeaseRenewer {
            store: self.clone(),
            keeper: self.backend().lease_keeper(lease).into(),
        }
    }

    /// Revokes `lease`: every key attached to it is deleted at once. False when etcd no
    /// longer had it (it expired, or was revoked already). Retried: revoking twice is
    /// revoking once.
    pub async fn revoke_lease(&self, lease: i64) -> Result<bool, StoreError> {
        self.retrying("revoking a lease", |etcd| async move {
            match etcd.revoke_lease(lease).await {
                Ok(()) => Ok(true),
                Err(CallError::LeaseNotFound(_)) => Ok(false),
                Err(error) => Err(error),
            }
        })
        .await
    }

    /// How long ago `lease` was last renewed (its granted TTL less what is left), to the
    /// second; `None` when it expired.
    pub async fn lease_age(&self, lease: i64) -> Result<Option<Duration>, StoreError> {
        self.retrying("reading a lease", |etcd| async move {
            let (granted, left) = etcd.lease_time_to_live(lease).await?;
            Ok((left > 0).then(|| Duration::from_secs(granted.saturating_sub(left).max(0) as u64)))
        })
        .await
    }

    /// Writes `value` at `key`, attached to `lease`. Retried: callers write the same value
    /// again.
    pub async fn put_leased(&self, key: &str, value: &[u8], lease: i64) -> Result<(), StoreError> {
        self.retrying("writing a leased key", |etcd| async move {
            etcd.put(key, value, lease).await
        })
        .await
    }

    /// Creates `key` attached to `lease` if it does not exist; either way returns the key as
    /// it is afterwards (the caller holds it when its lease is `lease`).
    pub async fn create_leased(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<KeyValue, StoreError> {
        self.retrying("creating a leased key", |etcd| async move {
            let get = TxnStep::Get {
                key: key.to_string(),
            };
            let txn = Transaction {
                when: vec![CreatedCompare {
                    key: key.to_string(),
                    op: CompareOp::Equal,
                    revision: 0,
                }],
                then: vec![
                    TxnStep::Put {
                        key: key.to_string(),
                        value: value.to_vec(),
                        lease,
                    },
                    get.clone(),
                ],
                otherwise: vec![get],
            };
            let found = etcd.txn(txn).await?.found.into_iter().next();
            // The key was just created or read in the same transaction: it exists, unless
            // its lease expired in between, which the caller sees as not holding it.
            Ok(found.unwrap_or(KeyValue {
                key: key.to_string(),
                value: Vec::new(),
                mod_revision: 0,
                create_revision: 0,
                lease: 0,
            }))
        })
        .await
    }

    /// Makes every write of `ops` (at most 120, no key twice) if `fence`
    /// still holds, and none otherwise. Returns false when the fence no longer holds.
    pub async fn write_fenced(&self, fence: &Fence, ops: &[FencedOp]) -> Result<bool, StoreError> {
        self.retrying("writing under the leader's fence", |etcd| async move {
            let txn = Transaction {
                when: vec![CreatedCompare {
                    key: fence.key.clone(),
                    op: CompareOp::Equal,
                    revision: fence.create_revision,
                }],
                then: ops.iter().map(FencedOp::to_txn_step).collect(),
                otherwise: Vec::new(),
            };
            Ok(etcd.txn(txn).await?.succeeded)
        })
        .await
    }
}
