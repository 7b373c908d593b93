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

use super::store::{EtcdStore, KeyValue, StoreError, read_in};
use etcd_client::{Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp};
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

/// Renews one lease. etcd's keep-alive is a stream: this keeps one open between renewals
/// and sends each renewal on it. Opening a stream per renewal and dropping it after its
/// first answer reset streams as fast as renewals came; with thousands of nodes in one
/// process (nodesim's) that was faster than etcd's gRPC server allows (its answer is
/// "resource exhausted", against rapid resets), and every call on the connection failed.
pub struct LeaseRenewer {
    store: EtcdStore,
    lease: i64,
    /// The open stream, if any; shared with the store's retries, each attempt of which may
    /// be cut short by the store's call timeout.
    open: std::sync::Arc<tokio::sync::Mutex<Option<OpenStream>>>,
}

/// A keep-alive stream, and whether a renewal sent on it still waits for its answer (its
/// caller gave up): such a stream is dropped, so that no answer is taken for another's.
struct OpenStream {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
    waiting: bool,
}

impl LeaseRenewer {
    /// Renews the lease once, retried as the store retries its calls.
    /// [`LeaseState::Expired`] when etcd no longer has it; an error when no member answered
    /// (the lease may still be alive: try again before its TTL is out). An attempt that
    /// fails or is cut short costs only the stream, opened again by the next attempt.
    pub async fn renew(&self) -> Result<LeaseState, StoreError> {
        let (client, lease) = (self.store.client.clone(), self.lease);
        self.store
            .retrying("renewing a lease", |_| {
                let (mut client, open) = (client.clone(), self.open.clone());
                async move {
                    let mut open = open.lock().await;
                    let renewed = renew_once(&mut client, lease, &mut open).await;
                    if renewed.is_err() {
                        *open = None;
                    }
                    renewed
                }
            })
            .await
    }
}

/// One renewal of `lease`, on `open`'s stream, or on a new one when there is none.
async fn renew_once(
    client: &mut etcd_client::Client,
    lease: i64,
    open: &mut Option<OpenStream>,
) -> Result<LeaseState, etcd_client::Error> {
    if open.as_ref().is_some_and(|stream| stream.waiting) {
        *open = None;
    }
    let Some(OpenStream {
        keeper,
        stream,
        waiting,
    }) = open.as_mut()
    else {
        // Opening the stream renews once and reads the answer.
        return match client.lease_keep_alive(lease).await {
            Ok((keeper, stream)) => {
                *open = Some(OpenStream {
                    keeper,
                    stream,
                    waiting: false,
                });
                Ok(LeaseState::Alive)
            }
            Err(etcd_client::Error::LeaseKeepAliveError(reason))
                if reason.contains("lease not found") =>
            {
                Ok(LeaseState::Expired)
            }
            Err(error) => Err(error),
        };
    };
    *waiting = true;
    keeper.keep_alive().await?;
    let answer = stream.message().await?;
    *waiting = false;
    match answer {
        Some(answer) if answer.ttl() > 0 => Ok(LeaseState::Alive),
        Some(_) => Ok(LeaseState::Expired),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "etcd ended the keep-alive stream".into(),
        )),
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
    fn to_txn_op(&self) -> TxnOp {
        match self {
            FencedOp::Put { key, value } => TxnOp::put(key.as_str(), value.as_slice(), None),
            FencedOp::Delete { key } => TxnOp::delete(key.as_str(), None),
        }
    }
}

impl EtcdStore {
    /// A new lease of `ttl` (etcd's floor is 2 s). Returns its id.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<i64, StoreError> {
        let ttl = ttl.as_secs().max(2) as i64;
        let client = self.client.clone();
        self.retrying("granting a lease", |_| {
            let mut client = client.clone();
            async move { Ok(client.lease_grant(ttl, None).await?.id()) }
        })
        .await
    }

    /// What renews `lease` from now on, over one keep-alive stream kept open between
    /// renewals.
    pub fn lease_renewer(&self, lease: i64) -> LeaseRenewer {
        LeaseRenewer {
            store: self.clone(),
            lease,
            open: Default::default(),
        }
    }

    /// Revokes `lease`: every key attached to it is deleted at once. False when etcd no
    /// longer had it (it expired, or was revoked already). Retried: revoking twice is
    /// revoking once.
    pub async fn revoke_lease(&self, lease: i64) -> Result<bool, StoreError> {
        let client = self.client.clone();
        self.retrying("revoking a lease", |_| {
            let mut client = client.clone();
            async move {
                match client.lease_revoke(lease).await {
                    Ok(_) => Ok(true),
                    Err(etcd_client::Error::GRpcStatus(status))
                        if status.message().contains("lease not found") =>
                    {
                        Ok(false)
                    }
                    Err(error) => Err(error),
                }
            }
        })
        .await
    }

    /// How long ago `lease` was last renewed (its granted TTL less what is left), to the
    /// second; `None` when it expired.
    pub async fn lease_age(&self, lease: i64) -> Result<Option<Duration>, StoreError> {
        let client = self.client.clone();
        self.retrying("reading a lease", |_| {
            let mut client = client.clone();
            async move {
                let answer = client.lease_time_to_live(lease, None).await?;
                Ok((answer.ttl() > 0).then(|| {
                    Duration::from_secs(
                        answer.granted_ttl().saturating_sub(answer.ttl()).max(0) as u64
                    )
                }))
            }
        })
        .await
    }

    /// Writes `value` at `key`, attached to `lease`. Retried: callers write the same value
    /// again.
    pub async fn put_leased(&self, key: &str, value: &[u8], lease: i64) -> Result<(), StoreError> {
        self.retrying("writing a leased key", |mut client| async move {
            let options = PutOptions::new().with_lease(lease);
            client.put(key, value, Some(options)).await?;
            Ok(())
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
        self.retrying("creating a leased key", |mut client| async move {
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
                    TxnOp::get(key, None),
                ])
                .or_else([TxnOp::get(key, None)]);
            let found = read_in(client.txn(txn).await?).into_iter().next();
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
        self.retrying(
            "writing under the leader's fence",
            |mut client| async move {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        fence.key.as_str(),
                        CompareOp::Equal,
                        fence.create_revision,
                    )])
                    .and_then(ops.iter().map(FencedOp::to_txn_op).collect::<Vec<_>>());
                Ok(client.txn(txn).await?.succeeded())
            },
        )
        .await
    }
}
