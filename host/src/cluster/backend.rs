//! The seam under [`super::EtcdStore`]: the handful of etcd calls cluster mode makes, as a
//! trait. In production it is always etcd over gRPC (`grpc`); the deterministic simulation
//! puts its own in-memory etcd behind it (`testing::simulated_etcd`), so that the real
//! cluster code (membership, leases, the campaign, the fenced scheduler, the watches) runs
//! on the simulated clock with faults drawn from a seed.
//!
//! The trait carries single calls only: retries, call timeouts, paging, the watch's
//! re-opening and what a refusal means to the caller stay in `store`, `listing`, `lease`
//! and `watch`, above it, where both backends share them. An implementation must keep
//! etcd's semantics as its clients see them: one revision counter for every change, each
//! write transaction one revision, compares on create revisions, leases whose keys vanish
//! when they expire, watches that deliver every change from a revision in order (or say
//! the history was compacted), and range reads at a past revision.

use super::store::KeyValue;
use async_trait::async_trait;

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// etcd answered and refused (a request too large, a permission, a compacted revision,
    /// no space): asking again gets the same answer. The text is etcd's.
    Refused(String),
    /// A refusal: the call named a lease etcd does not have (it expired, or was revoked).
    LeaseNotFound(String),
    /// A refusal: the revision asked for (by a read or a compaction) is compacted away.
    Compacted(String),
    /// No answer, or one that says to ask again (no leader, a member gone, a broken
    /// connection). The text names the root cause in one line.
    Lost(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Refused(reason)
            | CallError::LeaseNotFound(reason)
            | CallError::Compacted(reason)
            | CallError::Lost(reason) => f.write_str(reason),
        }
    }
}

/// A read of the keys in `[start, end)` (`end` empty: the one key `start`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeRead {
    /// The first key.
    pub start: Vec<u8>,
    /// The key past the last (empty: only `start`).
    pub end: Vec<u8>,
    /// The revision to read at (0: now).
    pub revision: i64,
    /// Most keys in the answer (0: all).
    pub limit: i64,
    /// Count only; return no keys.
    pub count_only: bool,
}

/// What a range read found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeAnswer {
    /// The keys, in key order.
    pub kvs: Vec<KeyValue>,
    /// Whether keys past the limit remain.
    pub more: bool,
    /// The store's revision when it answered.
    pub revision: i64,
}

/// The compare of a transaction: one of `key`'s revisions (0 when it does not exist)
/// against `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionCompare {
    /// The key compared.
    pub key: String,
    /// Which of its revisions.
    pub of: RevisionOf,
    /// How it is compared.
    pub op: CompareOp,
    /// The revision compared with.
    pub revision: i64,
}

impl RevisionCompare {
    /// `key`'s create revision, compared with `revision` by `op`.
    pub fn created(key: &str, op: CompareOp, revision: i64) -> RevisionCompare {
        RevisionCompare {
            key: key.to_string(),
            of: RevisionOf::Create,
            op,
            revision,
        }
    }

    /// `key`'s last change's revision, compared with `revision` by `op`.
    pub fn modified(key: &str, op: CompareOp, revision: i64) -> RevisionCompare {
        RevisionCompare {
            key: key.to_string(),
            of: RevisionOf::Mod,
            op,
            revision,
        }
    }
}

/// Which revision of a key a compare reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevisionOf {
    /// The revision that created it (since its last deletion).
    Create,
    /// The revision of its last change.
    Mod,
}

/// How a compare compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// Equal to.
    Equal,
    /// Greater than.
    Greater,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnStep {
    /// Writes `value` at `key`, attached to `lease` (0: none).
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The lease (0: none).
        lease: i64,
    },
    /// Reads `key`.
    Get {
        /// The key.
        key: String,
    },
    /// Deletes `key`.
    Delete {
        /// The key.
        key: String,
    },
}

/// A transaction: when every compare holds, `then` runs, else `otherwise`; in one revision
/// either way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transaction {
    /// What must hold.
    pub when: Vec<RevisionCompare>,
    /// Run when it does.
    pub then: Vec<TxnStep>,
    /// Run when it does not.
    pub otherwise: Vec<TxnStep>,
}

/// What a transaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnAnswer {
    /// Whether every compare held.
    pub succeeded: bool,
    /// What the gets of the branch run found, in order (keys that do not exist left out).
    pub found: Vec<KeyValue>,
    /// The store's revision after it: the transaction's own when it wrote.
    pub revision: i64,
}

/// One answer of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchAnswer {
    /// The watch is open.
    Created,
    /// Every change up to `revision` has been sent.
    Progress {
        /// The store's revision.
        revision: i64,
    },
    /// Changes, in revision order.
    Events(Vec<WatchEvent>),
    /// etcd ended the watch: `compact_revision` > 0 when the history it needed was
    /// compacted away.
    Canceled {
        /// The compacted revision, or 0.
        compact_revision: i64,
        /// etcd's reason.
        reason: String,
    },
}

/// One change a watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key as written.
    Put(KeyValue),
    /// The key was deleted at `mod_revision`.
    Delete {
        /// The key.
        key: String,
        /// The revision of the delete.
        mod_revision: i64,
    },
}

/// An open watch.
#[async_trait]
pub trait WatchStream: Send {
    /// The next answer; `Ok(None)` when the stream ended. Cancel-safe as a stream's next
    /// message is: dropping the future loses nothing the next call would have returned.
    async fn next(&mut self) -> Result<Option<WatchAnswer>, CallError>;
}

/// Renews one lease, again and again.
#[async_trait]
pub trait LeaseKeeper: Send + Sync {
    /// Renews once: true when the lease lives on, false when it had expired. Called by one
    /// task at a time; an attempt cut short by the caller's timeout must not make the next
    /// one take its answer for its own.
    async fn renew(&self) -> Result<bool, CallError>;
}

/// What etcd says of itself: one member's status, the raised alarms, and the members'
/// names (see [`super::EtcdSpace`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusAnswer {
    /// The member that answered, by name (its id in hex when it has none).
    pub member: String,
    /// Its etcd version.
    pub version: String,
    /// Its database's size in bytes.
    pub db_size: u64,
    /// The part of it in use.
    pub db_size_in_use: u64,
    /// The revision it answered at.
    pub revision: i64,
    /// Every raised alarm: the member's name and the alarm's.
    pub alarms: Vec<(String, String)>,
}

/// The etcd calls cluster mode makes; see the module docs. Every method is one call, which
/// may be made from many tasks at once and may be abandoned (its future dropped) at any
/// await; none retries.
#[async_trait]
pub trait EtcdBackend: Send + Sync {
    /// Reads a range of keys.
    async fn range(&self, read: RangeRead) -> Result<RangeAnswer, CallError>;

    /// Writes `value` at `key`, attached to `lease` (0: none).
    async fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), CallError>;

    /// Deletes `key`; returns how many keys were deleted (0 or 1).
    async fn delete(&self, key: &str) -> Result<i64, CallError>;

    /// Runs a transaction.
    async fn txn(&self, txn: Transaction) -> Result<TxnAnswer, CallError>;

    /// Grants a lease of `ttl_secs`; returns its id.
    async fn grant_lease(&self, ttl_secs: i64) -> Result<i64, CallError>;

    /// What renews `lease` from now on (over a stream kept open between renewals, on etcd).
    fn lease_keeper(&self, lease: i64) -> Box<dyn LeaseKeeper>;

    /// Revokes `lease`, deleting its keys; [`CallError::LeaseNotFound`] when it is gone.
    async fn revoke_lease(&self, lease: i64) -> Result<(), CallError>;

    /// `lease`'s granted TTL and what is left of it, in seconds (left ≤ 0: expired).
    async fn lease_time_to_live(&self, lease: i64) -> Result<(i64, i64), CallError>;

    /// Opens a watch of every key under `prefix`, from `start_revision` on.
    async fn watch(
        &self,
        prefix: &str,
        start_revision: i64,
    ) -> Result<Box<dyn WatchStream>, CallError>;

    /// Compacts the history up to `revision`.
    async fn compact(&self, revision: i64) -> Result<(), CallError>;

    /// What etcd says of itself.
    async fn status(&self) -> Result<StatusAnswer, CallError>;
}
