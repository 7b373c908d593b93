//! The connection to etcd and the few operations cluster mode needs: a consistent read of a
//! prefix, a create-if-absent, and the schema check. Every call is retried while etcd is
//! between leaders or one member is gone, and only when a retry cannot apply it twice.
//! What etcd refused (a request too large, out of space, a permission, a compacted
//! revision: [`is_refusal`]) is not retried: asking again gets the same answer, and the
//! caller must hear it at once rather than after the whole retry window.

use super::{SCHEMA_KEY, SCHEMA_VERSION};
use crate::util::backoff::Backoff;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KvClient, Txn, TxnOp, WatchClient,
};
use std::time::Duration;

/// How long one call to etcd may take before it is retried, and how long all retries of one
/// operation may take: an etcd leader election takes about 2 s, a member's death 0.4 s.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const RETRY_FOR: Duration = Duration::from_secs(15);

/// Keys read per response of a listing: a new leader reads every alloc of the cluster, and
/// 100,000 of them in one response would be hundreds of MiB, past what a response may carry
/// ([`MAX_RESPONSE_BYTES`]); a page of this many is a few MiB.
pub const LIST_PAGE: i64 = 1_000;

/// The end of the range of keys that start with `prefix`, by etcd's own rule: the prefix
/// with its last byte below 0xff raised by one and what follows it dropped (every key from
/// the prefix on, `\0`, when there is none).
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// An etcd error as one line: a failed connection (a TLS alert, a reset) is named by its
/// root cause ("received fatal alert: BadCertificate") rather than by gRPC's nested debug
/// output of every layer.
fn described(error: &etcd_client::Error) -> String {
    let source: Option<&(dyn std::error::Error + 'static)> = match error {
        etcd_client::Error::GRpcStatus(status) => std::error::Error::source(status),
        etcd_client::Error::TransportError(transport) => Some(transport),
        _ => None,
    };
    let Some(mut root) = source else {
        return error.to_string();
    };
    while let Some(deeper) = root.source() {
        root = deeper;
    }
    format!("cannot connect: {root}")
}

/// The waits between retries of one call: from 50 ms, doubling to 1 s, jittered.
const RETRY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// The largest response decoded: a watch catching up sends up to a thousand revisions in one
/// response, far past the crate's default of 4 MiB, and a response over the limit would fail
/// the same way at every re-open. Values are small (etcd refuses requests over 1.5 MiB).
const MAX_RESPONSE_BYTES: usize = 256 << 20;

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

/// What the single-key gets of a transaction found, in order (keys that do not exist left out).
pub(super) fn read_in(response: etcd_client::TxnResponse) -> Vec<KeyValue> {
    response
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            etcd_client::TxnOpResponse::Get(get) => get.kvs().first().map(KeyValue::from_etcd),
            _ => None,
        })
        .collect()
}

/// One transaction making every put of `writes` if every guard exists, and none otherwise.
fn guarded_txn(writes: &[GuardedPut]) -> Txn {
    let guards: Vec<Compare> = writes
        .iter()
        .map(|w| Compare::create_revision(w.guard.as_str(), CompareOp::Greater, 0))
        .collect();
    let puts: Vec<TxnOp> = writes
        .iter()
        .map(|w| TxnOp::put(w.key.as_str(), w.value.as_slice(), None))
        .collect();
    Txn::new().when(guards).and_then(puts)
}

impl KeyValue {
    pub(super) fn from_etcd(kv: &etcd_client::KeyValue) -> Self {
        KeyValue {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: kv.value().to_vec(),
            mod_revision: kv.mod_revision(),
            create_revision: kv.create_revision(),
            lease: kv.lease(),
        }
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
    pub(super) client: Client,
    endpoints: Vec<String>,
    access: std::sync::Arc<super::EtcdAccess>,
}

impl EtcdStore {
    /// Connects to the cluster at `endpoints` (every member: a client given one endpoint is
    /// down while that member is) and checks that a member answers.
    pub async fn connect(endpoints: &[String]) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect_with(endpoints, &super::EtcdAccess::default()).await
    }

    /// Connects as [`EtcdStore::connect`] does, with `access`'s TLS and user.
    pub async fn connect_with(
        endpoints: &[String],
        access: &super::EtcdAccess,
    ) -> Result<EtcdStore, StoreError> {
        // Watches fail when their member loses the cluster's leader, rather than staying open
        // and silent for ever; no timeout on the client itself, which would end every watch.
        // HTTP/2 keep-alive pings find a member that froze or was cut off, which could
        // otherwise never tell a watch it lost its leader.
        let options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(CALL_TIMEOUT)
            .with_keep_alive(CALL_TIMEOUT, CALL_TIMEOUT)
            .with_keep_alive_while_idle(true);
        let options = access.apply(options);
        let unreachable = |reason: String| StoreError::Unreachable {
            endpoints: endpoints.join(","),
            reason: access.explain(reason),
        };
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| unreachable(described(&e)))?;
        let store = EtcdStore {
            client,
            endpoints: endpoints.to_vec(),
            access: std::sync::Arc::new(access.clone()),
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

    /// Every member's endpoint, as given.
    pub fn endpoint_list(&self) -> &[String] {
        &self.endpoints
    }

    /// A connection of its own to the same cluster, with the same access.
    pub async fn connect_again(&self) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect_with(&self.endpoints, &self.access).await
    }

    /// The endpoints, comma-separated, for messages.
    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    /// A watch client that decodes responses up to [`MAX_RESPONSE_BYTES`].
    pub(super) fn watch_client(&self) -> WatchClient {
        self.client
            .watch_client()
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    fn kv(&self) -> KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Runs `call` until it succeeds, retrying what may be retried (a lost answer, a member
    /// gone, no leader) for [`RETRY_FOR`], and returning etcd's refusals at once. Callers
    /// pass only calls that a retry cannot apply twice (reads, and writes guarded by a
    /// compare).
    pub(super) async fn retrying<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T, StoreError>
    where
        F: FnMut(KvClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = tokio::time::Instant::now();
        let mut failures = 0;
        loop {
            let error = match tokio::time::timeout(CALL_TIMEOUT, call(self.kv())).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error)) if is_refusal(&error) => {
                    return Err(StoreError::Refused {
                        endpoints: self.endpoints(),
                        what: what.to_string(),
                        reason: error.to_string(),
                    });
                }
                Ok(Err(error)) => described(&error),
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
        self.retrying("reading the revision", |mut client| async move {
            let response = client
                .get(SCHEMA_KEY, Some(GetOptions::new().with_count_only()))
                .await?;
            Ok(response.header().map_or(0, |h| h.revision()))
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
        self.retrying(what, |mut client| async move {
            let mut writes = vec![TxnOp::put(key, value, None)];
            writes.extend(
                puts.iter()
                    .map(|(k, v)| TxnOp::put(k.as_str(), v.clone(), None)),
            );
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then(writes)
                .or_else([TxnOp::get(key, None)]);
            let response = client.txn(txn).await?;
            if response.succeeded() {
                return Ok(value.to_vec());
            }
            Ok(read_in(response)
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
        self.retrying("deleting a key", |mut client| async move {
            Ok(client.delete(key, None).await?.deleted() > 0)
        })
        .await
    }

    /// Writes `value` at `key`, whatever was there: retried, so callers pass only writes
    /// whose repeat changes nothing (the same value again).
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.retrying("writing a key", |mut client| async move {
            client.put(key, value, None).await?;
            Ok(())
        })
        .await
    }

    /// The keys of `keys` that exist, with their values, in one consistent read (at most
    /// 128 keys: one transaction).
    pub async fn get_many(&self, keys: &[String]) -> Result<Vec<KeyValue>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.retrying("reading keys", |mut client| async move {
            let gets: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(k.as_str(), None)).collect();
            Ok(read_in(client.txn(Txn::new().and_then(gets)).await?))
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
            .retrying("writing guarded keys", |mut client| async move {
                Ok(client.txn(guarded_txn(writes)).await?.succeeded())
            })
            .await?;
        if all {
            return Ok(writes.iter().map(|w| w.key.clone()).collect());
        }
        let mut landed = Vec::new();
        for write in writes {
            let one = std::slice::from_ref(write);
            let put = self
                .retrying("writing a guarded key", |mut client| async move {
                    Ok(client.txn(guarded_txn(one)).await?.succeeded())
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

/// Whether etcd answered `error` and refused the request, so that asking again gets the same
/// answer: an argument it rejects (a request too large, too many operations), a permission
/// or authentication it denies, a revision compacted or in the future, a lease it does not
/// know, a quota it is out of (`NOSPACE`; "too many requests" is load, and retried). Every
/// error of the transport, a timeout, no leader or an unavailable member is not a refusal,
/// nor is `FailedPrecondition`: etcd 3.4 says "not leader" and "rpc not supported for
/// learner" with it, and another member answers the retry.
pub(super) fn is_refusal(error: &etcd_client::Error) -> bool {
    use tonic::Code;
    let etcd_client::Error::GRpcStatus(status) = error else {
        return false;
    };
    match status.code() {
        Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::OutOfRange
        | Code::Unimplemented => true,
        Code::ResourceExhausted => !status.message().contains("too many requests"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn a_prefixs_range_ends_where_etcd_ends_it() {
        assert_eq!(prefix_end(b"/caravan/v1/allocs/"), b"/caravan/v1/allocs0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    #[test]
    fn what_etcd_refused_is_not_retried_and_what_was_lost_is() {
        use tonic::Code;
        for refused in [
            status(Code::InvalidArgument, "etcdserver: request is too large"),
            status(
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            status(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            status(Code::PermissionDenied, "etcdserver: permission denied"),
            status(Code::NotFound, "etcdserver: requested lease not found"),
        ] {
            assert!(is_refusal(&refused), "{refused}");
        }
        for lost in [
            status(Code::Unavailable, "etcdserver: no leader"),
            status(
                Code::Unavailable,
                "error trying to connect: Connection refused",
            ),
            status(Code::DeadlineExceeded, "etcdserver: request timed out"),
            status(
                Code::FailedPrecondition,
                "etcdserver: rpc not supported for learner",
            ),
            status(Code::FailedPrecondition, "etcdserver: not leader"),
            status(Code::ResourceExhausted, "etcdserver: too many requests"),
            status(Code::Unknown, "etcdserver: leader changed"),
            etcd_client::Error::WatchError("channel closed".into()),
        ] {
            assert!(!is_refusal(&lost), "{lost}");
        }
    }
}
