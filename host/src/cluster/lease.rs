//! What holds only while its holder does: leases (a key that etcd deletes when its agent
//! stops renewing), and fenced writes (a transaction that lands only while the writer still
//! holds the key it was elected with).
//!
//! Retry rules, as for the rest of the store: a lease grant is retried (a lost answer leaves
//! an orphan lease, which expires on its own), a leased put writes the same value again, and
//! a create-or-read is guarded. A fenced transaction is retried too, but an attempt whose
//! answer was lost may still land later, after a newer transaction, and would then leave
//! etcd older than its writer believes: so a leadership's sequence of transactions goes
//! through a [`FencedWriter`], each of whose transactions lands only right after the one
//! before it. A writer that fails all the same ends its leadership, and the next one (which
//! compares another create revision, so no late attempt of this one lands) starts from what
//! etcd holds.

use super::backend::{CallError, CompareOp, LeaseKeeper, RevisionCompare, Transaction, TxnStep};
use super::store::{EtcdStore, KeyValue, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// Most operations one fenced transaction carries: etcd refuses more than 128 in a branch,
/// and a [`FencedWriter`] adds one (its sequence key's put); compares count apart.
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

    /// Writes `value` at `key`, attached to `lease`, so that no attempt of it lands after a
    /// later change of the key: each attempt compares the key's last change with the one
    /// read just before it. A plain put, retried, could land late (held in a member cut off,
    /// and forwarded once it is back), after the caller wrote the key again under a newer
    /// lease, and tie the key to a lease that is never renewed: the node's live key would
    /// then vanish with that lease while its agent runs on. Done when the key holds `value`
    /// under `lease`, by this attempt or an earlier one.
    pub async fn put_leased(&self, key: &str, value: &[u8], lease: i64) -> Result<(), StoreError> {
        // Another writer of the key could move it on every round; the key's owner is its
        // only writer, so a few rounds are plenty.
        const ROUNDS: usize = 5;
        for _ in 0..ROUNDS {
            let current = self.get_many(&[key.to_string()]).await?.into_iter().next();
            if current
                .as_ref()
                .is_some_and(|kv| kv.lease == lease && kv.value == value)
            {
                return Ok(());
            }
            let seen = current.map_or(0, |kv| kv.mod_revision);
            let written = self
                .retrying("writing a leased key", |etcd| async move {
                    let txn = Transaction {
                        when: vec![RevisionCompare::modified(key, CompareOp::Equal, seen)],
                        then: vec![TxnStep::Put {
                            key: key.to_string(),
                            value: value.to_vec(),
                            lease,
                        }],
                        otherwise: Vec::new(),
                    };
                    Ok(etcd.txn(txn).await?.succeeded)
                })
                .await?;
            if written {
                return Ok(());
            }
        }
        Err(StoreError::Unreachable {
            endpoints: self.endpoints(),
            reason: format!("writing {key}: it changed under every one of {ROUNDS} attempts"),
        })
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
                when: vec![RevisionCompare::created(key, CompareOp::Equal, 0)],
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

    /// Makes every write of `ops` (at most 120, no key twice) if `fence` still holds, and
    /// none otherwise. Returns false when the fence no longer holds. Retried: for a write
    /// that is the holder's last under its fence (its resignation), which no newer one can
    /// follow; a leadership's sequence of writes goes through a [`FencedWriter`].
    pub async fn write_fenced(&self, fence: &Fence, ops: &[FencedOp]) -> Result<bool, StoreError> {
        self.retrying("writing under the leader's fence", |etcd| async move {
            let txn = Transaction {
                when: vec![fence_holds(fence)],
                then: ops.iter().map(FencedOp::to_txn_step).collect(),
                otherwise: Vec::new(),
            };
            Ok(etcd.txn(txn).await?.succeeded)
        })
        .await
    }
}

fn fence_holds(fence: &Fence) -> RevisionCompare {
    RevisionCompare::created(&fence.key, CompareOp::Equal, fence.create_revision)
}

/// Makes one leadership's transactions, in order, each only if the fence still holds and
/// the one before it was the last written. Every transaction also writes `sequence_key`,
/// and compares its mod revision with the revision of the writer's previous transaction, so
/// an attempt whose answer was lost and that lands late (held in a member cut off, and
/// forwarded once it is back), after a newer transaction, changes nothing. That makes a
/// retry safe: a retry that finds the attempt before it landed (the key holds that
/// attempt's token) takes it as its own.
pub struct FencedWriter {
    store: EtcdStore,
    fence: Fence,
    sequence_key: String,
    /// The revision of the last transaction written (of `sequence_key`'s last change).
    last: i64,
    /// How many transactions this writer made: with `nonce`, each one's token.
    written: u64,
    /// This writer's own, so that no two writers' tokens are alike.
    nonce: String,
    /// Set by a write that failed or found the fence gone: an attempt of it may still
    /// land, and a later write with its token would take it for its own.
    stopped: bool,
}

impl FencedWriter {
    /// A writer under `fence`, its transactions ordered through `sequence_key` (read once
    /// here: its last change, whoever made it).
    pub async fn start(
        store: &EtcdStore,
        fence: Fence,
        sequence_key: &str,
    ) -> Result<FencedWriter, StoreError> {
        let found = store.get_many(&[sequence_key.to_string()]).await?;
        Ok(FencedWriter {
            store: store.clone(),
            fence,
            sequence_key: sequence_key.to_string(),
            last: found.first().map_or(0, |kv| kv.mod_revision),
            written: 0,
            nonce: crate::util::determinism::new_id(),
            stopped: false,
        })
    }

    /// The fence it writes under.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Makes every write of `ops` (at most 120, no key twice, not the
    /// sequence key) after the writer's previous ones, if the fence still holds. Returns
    /// false when it does not (or when another writer wrote the sequence key: the same).
    /// After false or an error, every later call returns false and writes nothing.
    pub async fn write(&mut self, ops: &[FencedOp]) -> Result<bool, StoreError> {
        if self.stopped {
            return Ok(false);
        }
        self.stopped = true;
        let token = format!("{}:{}", self.nonce, self.written + 1);
        let (fence, sequence_key, last) = (&self.fence, self.sequence_key.as_str(), self.last);
        let token_ref = token.as_str();
        let answer = self
            .store
            .retrying("writing under the leader's fence", |etcd| async move {
                let mut then: Vec<TxnStep> = ops.iter().map(FencedOp::to_txn_step).collect();
                then.push(TxnStep::Put {
                    key: sequence_key.to_string(),
                    value: token_ref.as_bytes().to_vec(),
                    lease: 0,
                });
                let txn = Transaction {
                    when: vec![
                        fence_holds(fence),
                        RevisionCompare::modified(sequence_key, CompareOp::Equal, last),
                    ],
                    then,
                    otherwise: vec![
                        TxnStep::Get {
                            key: fence.key.clone(),
                        },
                        TxnStep::Get {
                            key: sequence_key.to_string(),
                        },
                    ],
                };
                etcd.txn(txn).await
            })
            .await?;
        let landed_at = if answer.succeeded {
            Some(answer.revision)
        } else {
            // An earlier attempt of this write may have landed, its answer lost: then the
            // fence still holds and the sequence key holds this write's token.
            let held = answer.found.iter().any(|kv| {
                kv.key == self.fence.key && kv.create_revision == self.fence.create_revision
            });
            let ours = answer
                .found
                .iter()
                .find(|kv| kv.key == self.sequence_key && kv.value == token.as_bytes());
            ours.filter(|_| held).map(|kv| kv.mod_revision)
        };
        let Some(revision) = landed_at else {
            return Ok(false);
        };
        self.last = revision;
        self.written += 1;
        self.stopped = false;
        Ok(true)
    }
}
