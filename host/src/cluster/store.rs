//! The connection to etcd and the few operations cluster mode needs: a consistent read of a
//! prefix, a create-if-absent, and the schema check. Every call is retried while etcd is
//! between leaders or one member is gone, and only when a retry cannot apply it twice.
//! What etcd refused (a request too large, out of space, a permission, a compacted
//! revision: any [`CallError`] but `Lost`) is not retried: asking again gets the same
//! answer, and the caller must hear it at once rather than after the whole retry window.

use super::backend::{
    CallError, CompareOp, EtcdBackend, RangeRead, RevisionCompare, Transaction, TxnStep,
};
use super::{SCHEMA_KEY, SCHEMA_VERSION};
use crate::util::backoff::Backoff;
use std::sync::Arc;
use std::time::Duration;

/// How long one call to etcd may take before it is retried, and how long all retries of one
/// operation may take: an etcd leader election takes about 2 s, a member's death 0.4 s.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const RETRY_FOR: Duration = Duration::from_secs(15);

/// Keys read per response of a listing: a new leader reads every alloc of the cluster, and
/// 100,000 of them in one response would be hundreds of MiB, past what a response may carry;
/// a page of this many is a few MiB.
pub const LIST_PAGE: i64 = 1_000;

/// The end of the range of keys that start with `prefix`, by etcd's own rule: the prefix
/// with its last byte below 0xff raised by one and what follows it dropped (every key from
/// the prefix on, `\0`, when there is none).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The waits between retries of one call: from 50 ms, doubling to 1 s, jittered.
const RETRY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// Why an etcd operation failed, after its retries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No member answered in time.
    #[error("etcd is unreachable at {endpoints}: {reason}")]
    Unreachable {
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// The last error seen.
        reason: String,
    },
    /// The cluster holds keys of a newer schema than this build knows.
    #[error(
        "etcd at {endpoints} holds Caravan's cluster schema {found}; this build knows up to \
         {SCHEMA_VERSION}: upgrade this agent"
    )]
    NewerSchema {
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// The version found.
        found: String,
    },
    /// This process could not do its part (a thread or a runtime would not start).
    #[error("{0}")]
    Local(String),
    /// etcd answered, and refused: asking again would get the same answer.
    #[error("etcd at {endpoints} refused {what}: {reason}")]
    Refused {
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// What was asked.
        what: String,
        /// etcd's answer.
        reason: String,
    },
    /// etcd canceled a watch for a reason other than compaction, again and again.
    #[error("etcd at {endpoints} keeps canceling the watch of {prefix}: {reason}")]
    WatchCanceled {
        /// Every endpoint, comma-separated.
        endpoints: String,
        /// The prefix watched.
        prefix: String,
        /// etcd's reason.
        reason: String,
    },
}

/// One key and its value, with the revision that last changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key, as text (Caravan writes only text keys).
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// The revision that created it (since its last deletion).
    pub create_revision: i64,
    /// The lease it is attached to (0: none).
    pub lease: i64,
}

/// One transaction making every put of `writes` if every guard exists, and none otherwise.
fn guarded_txn(writes: &[GuardedPut]) -> Transaction {
    Transaction {
        when: writes
            .iter()
            .map(|w| RevisionCompare::created(&w.guard, CompareOp::Greater, 0))
            .collect(),
        then: writes
            .iter()
            .map(|w| TxnStep::Put {
                key: w.key.clone(),
                value: w.value.clone(),
                lease: 0,
            })
            .collect(),
        otherwise: Vec::new(),
    }
}

/// A put that lands only while another key (its guard) exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedPut {
    /// The key that must exist.
    pub guard: String,
    /// The key written.
    pub key: String,
    /// The value written.
    pub value: Vec<u8>,
}

/// A connection to an etcd cluster, every member named. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    backend: Arc<dyn EtcdBackend>,
    endpoints: Vec<String>,
    /// How it connected, to connect again; `None` for a store made over a given backend.
    access: Option<Arc<super::EtcdAccess>>,
}

impl EtcdStore {
    /// Connects to the cluster at `endpoints` (every member: a client given one endpoint is
    /// down while that member is) and checks that a member answers.
    pub async fn connect(endpoints: &[String]) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect_with(endpoints, &super::EtcdAccess::default()).await
    }

    /// Connects as [`EtcdStore::connect`] does, with `access`'s TLS and user. With a user,
    /// connecting authenticates it: when etcd answers that it is electing a leader (or is
    /// overloaded), it is asked again, for as long as a call is retried.
    pub async fn connect_with(
        endpoints: &[String],
        access: &super::EtcdAccess,
    ) -> Result<EtcdStore, StoreError> {
        let unreachable = |reason: String| StoreError::Unreachable {
            endpoints: endpoints.join(","),
            reason: access.explain(reason),
        };
        let started = tokio::time::Instant::now();
        let mut failures = 0;
        let backend = loop {
            match super::grpc::GrpcEtcd::connect(endpoints, access).await {
                Ok(backend) => break backend,
                Err(failure) if failure.etcd_was_busy && started.elapsed() < RETRY_FOR => {
                    tracing::debug!(reason = failure.reason, "etcd was busy; connecting again");
                    failures += 1;
                    tokio::time::sleep(RETRY_BACKOFF.wait(failures)).await;
                }
                Err(failure) => return Err(unreachable(failure.reason)),
            }
        };
        let store = EtcdStore {
            backend: Arc::new(backend),
            endpoints: endpoints.to_vec(),
            access: Some(Arc::new(access.clone())),
        };
        match store.revision().await {
            Ok(_) => Ok(store),
            Err(StoreError::Unreachable { endpoints, reason }) => Err(StoreError::Unreachable {
                endpoints,
                reason: access.explain(reason),
            }),
            Err(other) => Err(other),
        }
    }

    /// A store over `backend`, named `name` in messages: for the simulation's etcd. Checks
    /// nothing, and [`EtcdStore::connect_again`] gives back the same backend.
    pub fn over(name: &str, backend: Arc<dyn EtcdBackend>) -> EtcdStore {
        EtcdStore {
            backend,
            endpoints: vec![name.to_string()],
            access: None,
        }
    }

    /// Every member's endpoint, as given.
    pub fn endpoint_list(&self) -> &[String] {
        &self.endpoints
    }

    /// A connection of its own to the same cluster, with the same access.
    pub async fn connect_again(&self) -> Result<EtcdStore, StoreError> {
        match &self.access {
            Some(access) => EtcdStore::connect_with(&self.endpoints, access).await,
            None => Ok(self.clone()),
        }
    }

    /// The endpoints, comma-separated, for messages.
    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    /// The backend, for one call made once, with no retry.
    pub(super) fn backend(&self) -> &dyn EtcdBackend {
        self.backend.as_ref()
    }

    /// Runs `call` until it succeeds, retrying what may be retried (a lost answer, a member
    /// gone, no leader) for [`RETRY_FOR`], and returning etcd's refusals at once. Callers
    /// pass only calls that a retry cannot apply twice (reads, and writes guarded by a
    /// compare).
    pub(super) async fn retrying<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T, StoreError>
    where
        F: FnMut(Arc<dyn EtcdBackend>) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        let started = tokio::time::Instant::now();
        let mut failures = 0;
        loop {
            let attempt = call(self.backend.clone());
            let error = match tokio::time::timeout(CALL_TIMEOUT, attempt).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(CallError::Lost(error))) => error,
                Ok(Err(refusal)) => {
                    return Err(StoreError::Refused {
                        endpoints: self.endpoints(),
                        what: what.to_string(),
                        reason: refusal.to_string(),
                    });
                }
                Err(_) => format!("{what} took longer than {CALL_TIMEOUT:?}"),
            };
            if started.elapsed() >= RETRY_FOR {
                return Err(StoreError::Unreachable {
                    endpoints: self.endpoints(),
                    reason: format!("{what}: {error}"),
                });
            }
            tracing::debug!(what, error, "etcd call failed; retrying");
            failures += 1;
            tokio::time::sleep(RETRY_BACKOFF.wait(failures)).await;
        }
    }

    /// The cluster's current revision (a linearizable read).
    pub async fn revision(&self) -> Result<i64, StoreError> {
        self.retrying("reading the revision", |etcd| async move {
            let read = RangeRead {
                start: SCHEMA_KEY.into(),
                count_only: true,
                ..RangeRead::default()
            };
            Ok(etcd.range(read).await?.revision)
        })
        .await
    }

    /// Writes `key` if it does not exist. Returns true when the key now holds `value`: made
    /// by this call, or by an earlier attempt of it that landed though its answer was lost
    /// (so two writers that must be told apart put a token of their own in the value), and
    /// false when it holds another value. Safe to retry: a retry finds the key and changes
    /// nothing.
    pub async fn create(&self, key: &str, value: &[u8]) -> Result<bool, StoreError> {
        let held = self
            .create_or_read("creating a key", key, value, &[])
            .await?;
        Ok(held == value)
    }

    /// Writes `value` at `key` (and each of `puts` with it) if the key does not exist, else
    /// reads it, in one transaction; returns what the key holds afterwards.
    async fn create_or_read(
        &self,
        what: &str,
        key: &str,
        value: &[u8],
        puts: &[(String, Vec<u8>)],
    ) -> Result<Vec<u8>, StoreError> {
        self.retrying(what, |etcd| async move {
            let put = |key: &str, value: &[u8]| TxnStep::Put {
                key: key.to_string(),
                value: value.to_vec(),
                lease: 0,
            };
            let mut then = vec![put(key, value)];
            then.extend(puts.iter().map(|(k, v)| put(k, v)));
            let txn = Transaction {
                when: vec![RevisionCompare::created(key, CompareOp::Equal, 0)],
                then,
                otherwise: vec![TxnStep::Get {
                    key: key.to_string(),
                }],
            };
            let answer = etcd.txn(txn).await?;
            if answer.succeeded {
                return Ok(value.to_vec());
            }
            Ok(answer
                .found
                .into_iter()
                .next()
                .map(|kv| kv.value)
                .unwrap_or_default())
        })
        .await
    }

    /// Writes every pair of `puts` in one transaction if `key` does not exist yet (creating
    /// it with `value`); returns false, writing nothing, when it does. Safe to retry only when
    /// `value` is the caller's own (an earlier attempt that landed reads as false).
    pub async fn create_with(
        &self,
        key: &str,
        value: &[u8],
        puts: &[(String, Vec<u8>)],
    ) -> Result<bool, StoreError> {
        let held = self
            .create_or_read("creating keys", key, value, puts)
            .await?;
        Ok(held == value)
    }

    /// Deletes `key`; returns whether it existed. A retry after a lost answer finds it gone
    /// and says false: callers that must know use [`EtcdStore::get_many`] first.
    pub async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.retrying("deleting a key", |etcd| async move {
            Ok(etcd.delete(key).await? > 0)
        })
        .await
    }

    /// Writes `value` at `key`, whatever was there: retried, so callers pass only writes
    /// whose repeat changes nothing (the same value again). An attempt whose answer was lost
    /// may also land late, after a newer write of the key: only for keys where that does no
    /// harm (a node's informational record, a revoked token's tombstone); a key whose
    /// newest value matters goes through [`EtcdStore::put_leased`]'s compare.
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.retrying("writing a key", |etcd| async move {
            etcd.put(key, value, 0).await
        })
        .await
    }

    /// The keys of `keys` that exist, with their values, in one consistent read (at most
    /// 128 keys: one transaction).
    pub async fn get_many(&self, keys: &[String]) -> Result<Vec<KeyValue>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.retrying("reading keys", |etcd| async move {
            let then = keys
                .iter()
                .map(|key| TxnStep::Get { key: key.clone() })
                .collect();
            let txn = Transaction {
                then,
                ..Transaction::default()
            };
            Ok(etcd.txn(txn).await?.found)
        })
        .await
    }

    /// Makes each put of `writes` (at most 64: two keys each in one transaction) whose guard
    /// exists, and returns the keys written. All at once when every guard exists; one by one
    /// otherwise. Safe to retry: each put is guarded, and writes the same value again.
    pub async fn put_where_present(
        &self,
        writes: &[GuardedPut],
    ) -> Result<Vec<String>, StoreError> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let all = self
            .retrying("writing guarded keys", |etcd| async move {
                Ok(etcd.txn(guarded_txn(writes)).await?.succeeded)
            })
            .await?;
        if all {
            return Ok(writes.iter().map(|w| w.key.clone()).collect());
        }
        let mut landed = Vec::new();
        for write in writes {
            let one = std::slice::from_ref(write);
            let put = self
                .retrying("writing a guarded key", |etcd| async move {
                    Ok(etcd.txn(guarded_txn(one)).await?.succeeded)
                })
                .await?;
            if put {
                landed.push(write.key.clone());
            }
        }
        Ok(landed)
    }

    /// Checks the cluster's schema: records this build's when there is none, and refuses
    /// another (an agent must never rewrite keys of a layout it does not know). Meant for
    /// an agent's start, before it touches anything else.
    pub async fn check_schema(&self) -> Result<(), StoreError> {
        let ours = SCHEMA_VERSION.to_string();
        let found = self
            .create_or_read("checking the schema", SCHEMA_KEY, ours.as_bytes(), &[])
            .await?;
        let found = String::from_utf8_lossy(&found).into_owned();
        match found.trim().parse::<u32>() {
            Ok(version) if version <= SCHEMA_VERSION => Ok(()),
            _ => Err(StoreError::NewerSchema {
                endpoints: self.endpoints(),
                found: crate::util::text::cut(&found, 64).into_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefixs_range_ends_where_etcd_ends_it() {
        assert_eq!(prefix_end(b"/caravan/v1/allocs/"), b"/caravan/v1/allocs0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }
}
