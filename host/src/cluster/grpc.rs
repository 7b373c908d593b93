//! The production [`EtcdBackend`]: etcd over gRPC, through the `etcd-client` crate. It turns
//! each call into the crate's request and each answer or error back into the backend's
//! types, and knows what a gRPC status means ([`is_refusal`]); it retries nothing.

use super::backend::{
    CallError, CompareOp, EtcdBackend, LeaseKeeper, RangeAnswer, RangeRead, RevisionCompare,
    RevisionOf, StatusAnswer, Transaction, TxnAnswer, TxnStep, WatchAnswer, WatchEvent,
    WatchStream,
};
use super::store::{CALL_TIMEOUT, KeyValue};
use async_trait::async_trait;
use etcd_client::{
    AlarmAction, AlarmType, Client, Compare, ConnectOptions, EventType, GetOptions, KvClient,
    PutOptions, Txn, TxnOp, WatchOptions,
};

/// The largest response decoded: a watch catching up sends up to a thousand revisions in one
/// response, far past the crate's default of 4 MiB, and a response over the limit would fail
/// the same way at every re-open. Values are small (etcd refuses requests over 1.5 MiB).
const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// etcd over gRPC. Cheap to clone: one connection, shared.
#[derive(Clone)]
pub(super) struct GrpcEtcd {
    client: Client,
}

impl GrpcEtcd {
    /// Connects to `endpoints` (every member: a client given one endpoint is down while
    /// that member is), with `access`'s TLS and user. Checks nothing: the store's first
    /// read does.
    pub(super) async fn connect(
        endpoints: &[String],
        access: &super::EtcdAccess,
    ) -> Result<GrpcEtcd, ConnectFailure> {
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
        Client::connect(endpoints, Some(options))
            .await
            .map(|client| GrpcEtcd { client })
            .map_err(|error| ConnectFailure {
                etcd_was_busy: asks_to_connect_again(&error),
                reason: described(&error),
            })
    }

    fn kv(&self) -> KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
    }
}

/// Why [`GrpcEtcd::connect`] failed.
#[derive(Debug)]
pub(super) struct ConnectFailure {
    /// The root cause, in one line.
    pub reason: String,
    /// etcd answered, and asked to be asked again ([`asks_to_connect_again`]).
    pub etcd_was_busy: bool,
}

/// Whether a connect's `error` is etcd's answer that it cannot serve now (its leader changed,
/// or is being elected, or it is overloaded), so that connecting again soon succeeds. A
/// connect calls etcd only to authenticate a user, and etcd elects a new leader whenever a
/// member misses its heartbeats, as members starved of CPU do. Anything else is final, and
/// the agent says why at once rather than after every retry: a refused password, a user
/// given to an etcd without authentication ("authentication is not enabled"), a TLS
/// handshake that ends in an alert, a member that does not answer, an endpoint that is not
/// etcd. (A status that carries a source is the transport's, not etcd's answer.)
fn asks_to_connect_again(error: &etcd_client::Error) -> bool {
    use tonic::Code;
    let etcd_client::Error::GRpcStatus(status) = error else {
        return false;
    };
    if std::error::Error::source(status).is_some() {
        return false;
    }
    let message = status.message();
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded => message.starts_with("etcdserver:"),
        Code::ResourceExhausted => message.contains("too many requests"),
        Code::Unknown => message.contains("leader changed"),
        _ => false,
    }
}

/// An etcd error as the backend's: a refusal keeps etcd's text; a failed connection (a TLS
/// alert, a reset) is named by its root cause ("received fatal alert: BadCertificate")
/// rather than by gRPC's nested debug output of every layer.
fn call_error(error: etcd_client::Error) -> CallError {
    if is_refusal(&error) {
        let text = error.to_string();
        if text.contains("lease not found") {
            return CallError::LeaseNotFound(text);
        }
        if text.contains("required revision has been compacted") {
            return CallError::Compacted(text);
        }
        return CallError::Refused(text);
    }
    CallError::Lost(described(&error))
}

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

/// Whether etcd answered `error` and refused the request, so that asking again gets the same
/// answer: an argument it rejects (a request too large, too many operations, a wrong
/// password), a permission it denies, a revision compacted or in the future, a lease it does
/// not know, a quota it is out of (`NOSPACE`; "too many requests" is load, and retried).
/// Every error of the transport, a timeout, no leader or an unavailable member is not a
/// refusal, nor is `FailedPrecondition`: etcd 3.4 says "not leader" and "rpc not supported
/// for learner" with it, and another member answers the retry. Nor is `Unauthenticated`
/// ("invalid auth token"), which etcd also says for a token it has just issued: a new token
/// reaches each member through raft, and one that has not applied it yet refuses it
/// (etcd-io/etcd#18437). The etcd client has then already fetched a new token and sent the
/// call again once; the member has caught up by a later try.
fn is_refusal(error: &etcd_client::Error) -> bool {
    use tonic::Code;
    let etcd_client::Error::GRpcStatus(status) = error else {
        return false;
    };
    match status.code() {
        Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::OutOfRange
        | Code::Unimplemented => true,
        Code::ResourceExhausted => !status.message().contains("too many requests"),
        _ => false,
    }
}

fn key_value(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        mod_revision: kv.mod_revision(),
        create_revision: kv.create_revision(),
        lease: kv.lease(),
    }
}

fn compare(compare: &RevisionCompare) -> Compare {
    let op = match compare.op {
        CompareOp::Equal => etcd_client::CompareOp::Equal,
        CompareOp::Greater => etcd_client::CompareOp::Greater,
    };
    let key = compare.key.as_str();
    match compare.of {
        RevisionOf::Create => Compare::create_revision(key, op, compare.revision),
        RevisionOf::Mod => Compare::mod_revision(key, op, compare.revision),
    }
}

fn txn_op(step: &TxnStep) -> TxnOp {
    match step {
        TxnStep::Put { key, value, lease } => {
            let options = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
            TxnOp::put(key.as_str(), value.as_slice(), options)
        }
        TxnStep::Get { key } => TxnOp::get(key.as_str(), None),
        TxnStep::Delete { key } => TxnOp::delete(key.as_str(), None),
    }
}

#[async_trait]
impl EtcdBackend for GrpcEtcd {
    async fn range(&self, read: RangeRead) -> Result<RangeAnswer, CallError> {
        let mut options = GetOptions::new();
        if !read.end.is_empty() {
            options = options.with_range(read.end);
        }
        if read.limit > 0 {
            options = options.with_limit(read.limit);
        }
        if read.revision > 0 {
            options = options.with_revision(read.revision);
        }
        if read.count_only {
            options = options.with_count_only();
        }
        let mut response = self
            .kv()
            .get(read.start, Some(options))
            .await
            .map_err(call_error)?;
        Ok(RangeAnswer {
            revision: response.header().map_or(0, |h| h.revision()),
            more: response.more(),
            kvs: response.take_kvs().iter().map(key_value).collect(),
        })
    }

    async fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), CallError> {
        let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
        self.kv()
            .put(key, value, options)
            .await
            .map_err(call_error)?;
        Ok(())
    }

    async fn delete(&self, key: &str) -> Result<i64, CallError> {
        Ok(self
            .kv()
            .delete(key, None)
            .await
            .map_err(call_error)?
            .deleted())
    }

    async fn txn(&self, txn: Transaction) -> Result<TxnAnswer, CallError> {
        let request = Txn::new()
            .when(txn.when.iter().map(compare).collect::<Vec<_>>())
            .and_then(txn.then.iter().map(txn_op).collect::<Vec<_>>())
            .or_else(txn.otherwise.iter().map(txn_op).collect::<Vec<_>>());
        let response = self.kv().txn(request).await.map_err(call_error)?;
        let found = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                etcd_client::TxnOpResponse::Get(get) => get.kvs().first().map(key_value),
                _ => None,
            })
            .collect();
        Ok(TxnAnswer {
            succeeded: response.succeeded(),
            found,
            revision: response.header().map_or(0, |h| h.revision()),
        })
    }

    async fn grant_lease(&self, ttl_secs: i64) -> Result<i64, CallError> {
        let mut client = self.client.clone();
        Ok(client
            .lease_grant(ttl_secs, None)
            .await
            .map_err(call_error)?
            .id())
    }

    fn lease_keeper(&self, lease: i64) -> Box<dyn LeaseKeeper> {
        Box::new(GrpcLeaseKeeper {
            client: self.client.clone(),
            lease,
            open: Default::default(),
        })
    }

    async fn revoke_lease(&self, lease: i64) -> Result<(), CallError> {
        let mut client = self.client.clone();
        client.lease_revoke(lease).await.map_err(call_error)?;
        Ok(())
    }

    async fn lease_time_to_live(&self, lease: i64) -> Result<(i64, i64), CallError> {
        let mut client = self.client.clone();
        let answer = client
            .lease_time_to_live(lease, None)
            .await
            .map_err(call_error)?;
        Ok((answer.granted_ttl(), answer.ttl()))
    }

    async fn watch(
        &self,
        prefix: &str,
        start_revision: i64,
    ) -> Result<Box<dyn WatchStream>, CallError> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_progress_notify()
            .with_start_revision(start_revision);
        let mut client = self
            .client
            .watch_client()
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        let stream = client
            .watch(prefix, Some(options))
            .await
            .map_err(call_error)?;
        Ok(Box::new(GrpcWatch(stream)))
    }

    async fn compact(&self, revision: i64) -> Result<(), CallError> {
        self.client
            .kv_client()
            .compact(revision, None)
            .await
            .map_err(call_error)?;
        Ok(())
    }

    async fn status(&self) -> Result<StatusAnswer, CallError> {
        let mut maintenance = self.client.maintenance_client();
        let status = maintenance.status().await.map_err(call_error)?;
        let alarms = maintenance
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .map_err(call_error)?;
        let members = self
            .client
            .cluster_client()
            .member_list()
            .await
            .map_err(call_error)?;
        let name_of = |id: u64| {
            members
                .members()
                .iter()
                .find(|m| m.id() == id && !m.name().is_empty())
                .map(|m| m.name().to_string())
                .unwrap_or_else(|| format!("{id:x}"))
        };
        let header = status.header();
        Ok(StatusAnswer {
            member: name_of(header.map_or(0, |h| h.member_id())),
            version: status.version().to_string(),
            db_size: u64::try_from(status.db_size()).unwrap_or(0),
            db_size_in_use: u64::try_from(status.raft_used_db_size()).unwrap_or(0),
            revision: header.map_or(0, |h| h.revision()),
            alarms: alarms
                .alarms()
                .iter()
                .filter(|a| a.alarm() != AlarmType::None)
                .map(|a| (name_of(a.member_id()), a.alarm().as_str_name().to_string()))
                .collect(),
        })
    }
}

struct GrpcWatch(etcd_client::WatchStream);

#[async_trait]
impl WatchStream for GrpcWatch {
    async fn next(&mut self) -> Result<Option<WatchAnswer>, CallError> {
        let Some(response) = self.0.message().await.map_err(call_error)? else {
            return Ok(None);
        };
        if response.canceled() {
            return Ok(Some(WatchAnswer::Canceled {
                compact_revision: response.compact_revision(),
                reason: response.cancel_reason().to_string(),
            }));
        }
        if response.events().is_empty() {
            // A progress notification says every change up to its revision has been sent;
            // the one confirming the watch's creation says nothing of the kind.
            return Ok(Some(match response.header() {
                Some(header) if !response.created() => WatchAnswer::Progress {
                    revision: header.revision(),
                },
                _ => WatchAnswer::Created,
            }));
        }
        let events = response
            .events()
            .iter()
            .filter_map(|event| {
                let kv = event.kv()?;
                Some(match event.event_type() {
                    EventType::Put => WatchEvent::Put(key_value(kv)),
                    EventType::Delete => WatchEvent::Delete {
                        key: String::from_utf8_lossy(kv.key()).into_owned(),
                        mod_revision: kv.mod_revision(),
                    },
                })
            })
            .collect();
        Ok(Some(WatchAnswer::Events(events)))
    }
}

/// Renews one lease. etcd's keep-alive is a stream: this keeps one open between renewals
/// and sends each renewal on it. Opening a stream per renewal and dropping it after its
/// first answer reset streams as fast as renewals came; with thousands of nodes in one
/// process (nodesim's) that was faster than etcd's gRPC server allows (its answer is
/// "resource exhausted", against rapid resets), and every call on the connection failed.
struct GrpcLeaseKeeper {
    client: Client,
    lease: i64,
    /// The open stream, if any; locked by the renewal using it, which the store's call
    /// timeout may cut short.
    open: tokio::sync::Mutex<Option<OpenStream>>,
}

/// A keep-alive stream, and whether a renewal sent on it still waits for its answer (its
/// caller gave up): such a stream is dropped, so that no answer is taken for another's.
struct OpenStream {
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
    waiting: bool,
}

#[async_trait]
impl LeaseKeeper for GrpcLeaseKeeper {
    async fn renew(&self) -> Result<bool, CallError> {
        let mut open = self.open.lock().await;
        let mut client = self.client.clone();
        let renewed = renew_once(&mut client, self.lease, &mut open).await;
        if renewed.is_err() {
            *open = None;
        }
        renewed.map_err(call_error)
    }
}

/// One renewal of `lease`, on `open`'s stream, or on a new one when there is none.
async fn renew_once(
    client: &mut Client,
    lease: i64,
    open: &mut Option<OpenStream>,
) -> Result<bool, etcd_client::Error> {
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
                Ok(true)
            }
            Err(etcd_client::Error::LeaseKeepAliveError(reason))
                if reason.contains("lease not found") =>
            {
                Ok(false)
            }
            Err(error) => Err(error),
        };
    };
    *waiting = true;
    keeper.keep_alive().await?;
    let answer = stream.message().await?;
    *waiting = false;
    match answer {
        Some(answer) => Ok(answer.ttl() > 0),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "etcd ended the keep-alive stream".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
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
            status(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            status(Code::NotFound, "etcdserver: requested lease not found"),
        ] {
            assert!(is_refusal(&refused), "{refused}");
            assert!(!matches!(call_error(refused), CallError::Lost(_)));
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
            status(Code::Unauthenticated, "etcdserver: invalid auth token"),
            etcd_client::Error::WatchError("channel closed".into()),
        ] {
            assert!(!is_refusal(&lost), "{lost}");
            assert!(matches!(call_error(lost), CallError::Lost(_)));
        }
    }

    #[test]
    fn a_connect_is_tried_again_only_when_etcd_answered_that_it_is_busy() {
        use tonic::Code;
        for busy in [
            status(Code::Unavailable, "etcdserver: leader changed"),
            status(
                Code::Unavailable,
                "etcdserver: request timed out, possibly due to previous leader failure",
            ),
            status(Code::Unavailable, "etcdserver: no leader"),
            status(Code::Unknown, "etcdserver: leader changed"),
            status(Code::ResourceExhausted, "etcdserver: too many requests"),
        ] {
            assert!(asks_to_connect_again(&busy), "{busy}");
        }
        for fin in [
            status(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            status(
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ),
            // A proxy's 502 at an endpoint that is not etcd, made a status by tonic.
            status(Code::Unavailable, "502 Bad Gateway"),
            etcd_client::Error::InvalidArgs("no endpoints".into()),
            etcd_client::Error::GRpcStatus(tonic::Status::from_error(Box::new(
                std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection closed"),
            ))),
        ] {
            assert!(!asks_to_connect_again(&fin), "{fin}");
        }
    }

    #[test]
    fn a_missing_lease_and_a_compacted_revision_are_told_apart_from_other_refusals() {
        let gone = status(
            tonic::Code::NotFound,
            "etcdserver: requested lease not found",
        );
        assert!(matches!(call_error(gone), CallError::LeaseNotFound(_)));
        let compacted = status(
            tonic::Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        );
        assert!(matches!(call_error(compacted), CallError::Compacted(_)));
    }
}
