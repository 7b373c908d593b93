//! An etcd in memory, behind the same [`EtcdBackend`] as the real one, for the deterministic
//! simulation: the real cluster code (`cluster::EtcdStore` and everything above it) runs over
//! it on tokio's clock, paused in the simulation, with faults chosen by the caller.
//!
//! What it keeps of etcd's semantics, as its clients see them:
//! - one revision counter; each put, delete or write transaction is one revision (a
//!   transaction that writes nothing, or a delete of nothing, makes none);
//! - every version of every key since the last compaction, so a range may be read at a past
//!   revision; a revision compacted away, or one not yet made, is refused;
//! - compares on create revisions (0 for a key that does not exist);
//! - leases that expire on tokio's clock, their keys deleted in one revision; a put naming a
//!   lease that is gone is refused;
//! - watches of a prefix from a revision, every change in revision order, canceled with the
//!   compacted revision when the history they need is gone.
//!
//! It refuses what etcd refuses of a transaction's shape (more than 128 operations in a
//! list, a key written twice). Where it is stricter than etcd, on purpose: a watch must
//! start after the compacted revision (etcd also serves one starting at it), and it sends
//! no progress notifications. It has no members, quotas, authentication or request sizes.
//!
//! Faults ([`CallFate`]) are the caller's: before each call, a plan it gives says whether the
//! call is answered, lost before etcd applies it, lost after, or applied later (a request
//! held in a partitioned member and forwarded once the partition heals, after newer ones).
//!
//! Layout: this file (the etcd as a whole, its connections and fates), `state` (the keys,
//! their versions, leases and compaction), `watch` (its watches).

mod state;
mod watch;

use crate::cluster::KeyValue;
use crate::cluster::backend::{
    CallError, CompareOp, EtcdBackend, LeaseKeeper, RangeAnswer, RangeRead, RevisionOf,
    StatusAnswer, Transaction, TxnAnswer, TxnStep, WatchEvent, WatchStream,
};
use crate::util::locks::LockUnpoisoned;
use async_trait::async_trait;
use state::{Lease, State, lease_not_found, lost, refused_as_etcd_would};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use watch::SimulatedWatch;

/// What happens to one call; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFate {
    /// Applied and answered.
    Answered,
    /// Not applied; the caller hears that the answer was lost.
    LostBefore,
    /// Applied; the caller hears that the answer was lost.
    LostAfter,
    /// Applied after this long; the caller hears at once that the answer was lost.
    AppliedLater(Duration),
}

/// Which call a fate is chosen for: its kind, as the plan may treat reads and writes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// A range read, a lease's time to live, a status.
    Read,
    /// A put, a delete, a transaction, a compaction.
    Write,
    /// A lease grant, renewal or revocation.
    Lease,
    /// Opening a watch, or its next answer.
    Watch,
}

type FatePlan = Box<dyn FnMut(&str, CallKind) -> CallFate + Send>;

/// A write etcd just applied, as a check sees it: who made it, and what it changed.
pub struct AppliedWrite<'a> {
    /// The connection that made the call; `None` for etcd's own writes (leases expiring,
    /// each a revision: `revision` is the last of them).
    pub connection: Option<&'a str>,
    /// The revision it made.
    pub revision: i64,
    /// The keys it put or deleted.
    pub keys: Vec<&'a str>,
    state: &'a State,
}

impl AppliedWrite<'_> {
    /// `key` as it was just before this write.
    pub fn before(&self, key: &str) -> Option<&KeyValue> {
        self.state.current(key, self.revision - 1)
    }

    /// `key` as this write left it.
    pub fn after(&self, key: &str) -> Option<&KeyValue> {
        self.state.current(key, self.revision)
    }
}

type WriteCheck = Box<dyn FnMut(&AppliedWrite<'_>) + Send>;

/// The simulated etcd. Cheap to clone: every clone is the same etcd.
#[derive(Clone)]
pub struct SimulatedEtcd {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    plan: Mutex<Option<FatePlan>>,
    /// Every open watch's wake-up, woken in the order the watches opened at each new
    /// revision. Not a `tokio::sync::watch` channel: that one wakes its receivers in an
    /// order drawn from tokio's own random, and a simulation must replay.
    watchers: Mutex<Vec<Weak<Notify>>>,
    /// The runtime it was made on, whose clock its leases expire on and where the writes
    /// it applies late wait: the simulation's, also for a call made from a thread of the
    /// host's own (the scheduler's writer, `util::determinism::runtime_for_thread`).
    runtime: tokio::runtime::Handle,
    /// Sees every write, as it is applied.
    write_check: Mutex<Option<WriteCheck>>,
}

impl SimulatedEtcd {
    /// An empty etcd at revision 1, every call answered, on the clock of the tokio runtime
    /// this is called on.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[allow(clippy::new_without_default)]
    pub fn new() -> SimulatedEtcd {
        let state = State {
            revision: 1,
            next_lease: 0x5EED_0000,
            ..State::default()
        };
        let shared = Shared {
            state: Mutex::new(state),
            plan: Mutex::new(None),
            watchers: Mutex::default(),
            runtime: tokio::runtime::Handle::current(),
            write_check: Mutex::new(None),
        };
        SimulatedEtcd {
            shared: Arc::new(shared),
        }
    }

    /// A store over this etcd, for the cluster code: [`SimulatedEtcd::store_for`] a
    /// connection named "client".
    pub fn store(&self) -> crate::cluster::EtcdStore {
        self.store_for("client")
    }

    /// A store over this etcd whose calls the fate plan sees as made by `connection` (an
    /// agent's name, so that one agent may be cut off while the others are not).
    pub fn store_for(&self, connection: &str) -> crate::cluster::EtcdStore {
        let connection = Connection {
            etcd: self.clone(),
            name: connection.into(),
        };
        crate::cluster::EtcdStore::over("simulated-etcd", Arc::new(connection))
    }

    /// From now on, `plan` chooses each call's fate (see [`CallFate`]), given the name of
    /// the connection making it and the call's kind.
    pub fn set_fates(&self, plan: impl FnMut(&str, CallKind) -> CallFate + Send + 'static) {
        *self.shared.plan.lock_unpoisoned() = Some(Box::new(plan));
    }

    /// From now on, leases end at half their TTL: a planted defect (an etcd whose clock
    /// runs fast), for a simulation to show that its checks see what follows.
    pub fn end_leases_early(&self) {
        self.with_state(|state| state.leases_end_early = true);
    }

    /// From now on, `check` sees every write the moment it is applied, a call's or a lease's
    /// expiry (for a simulation's invariants about who may write what). It must not call
    /// this etcd.
    pub fn check_writes(&self, check: impl FnMut(&AppliedWrite<'_>) + Send + 'static) {
        *self.shared.write_check.lock_unpoisoned() = Some(Box::new(check));
    }

    /// From now on, every transaction's compares succeed: a planted defect (an etcd that
    /// does not fence), for a simulation to show that its checks see what follows.
    pub fn ignore_compares(&self) {
        self.with_state(|state| state.compares_ignored = true);
    }

    /// From now on, watches report each put of a key under `prefix` that was deleted before
    /// (a node joining again, for live keys) followed by a delete of it that never happened:
    /// a planted defect (an etcd whose watches replay old deletes), for a simulation to show
    /// that its checks see what follows.
    pub fn report_phantom_deletes(&self, prefix: &str) {
        self.with_state(|state| {
            state.phantom_deletes = Some((prefix.to_string(), BTreeSet::new()))
        });
    }

    /// Every call answered again.
    pub fn clear_fates(&self) {
        *self.shared.plan.lock_unpoisoned() = None;
    }

    /// The current revision, for checks.
    pub fn current_revision(&self) -> i64 {
        self.with_state(|state| state.revision)
    }

    /// `key` as it is now, for checks.
    pub fn get(&self, key: &str) -> Option<KeyValue> {
        self.with_state(|state| state.current(key, state.revision).cloned())
    }

    /// Every key now, in key order, for checks.
    pub fn snapshot(&self) -> Vec<KeyValue> {
        self.with_state(|state| state.range(b"", &[0], 0))
    }

    fn fate(&self, connection: &str, kind: CallKind) -> CallFate {
        match self.shared.plan.lock_unpoisoned().as_mut() {
            Some(plan) => plan(connection, kind),
            None => CallFate::Answered,
        }
    }

    /// Runs `apply` on the state as of now (expired leases gone first), and wakes watches
    /// when it made a revision.
    fn with_state<T>(&self, apply: impl FnOnce(&mut State) -> T) -> T {
        self.with_state_for(None, apply)
    }

    /// [`Self::with_state`], for a call `connection` made (its writes checked).
    fn with_state_for<T>(
        &self,
        connection: Option<&str>,
        apply: impl FnOnce(&mut State) -> T,
    ) -> T {
        // Every `Instant::now()` below reads the simulation's clock, whichever thread calls.
        let _on_its_clock = self.shared.runtime.enter();
        let mut state = self.shared.state.lock_unpoisoned();
        let before = state.revision;
        state.expire_leases(Instant::now());
        let expired = state.revision;
        self.check_write(&state, None, before);
        let answer = apply(&mut state);
        if connection.is_some() {
            self.check_write(&state, connection, expired);
        }
        if state.revision != before {
            drop(state);
            self.shared.watchers.lock_unpoisoned().retain(|watcher| {
                let Some(watcher) = watcher.upgrade() else {
                    return false;
                };
                watcher.notify_one();
                true
            });
        }
        answer
    }

    /// Shows the check of writes what changed since revision `since`, if anything did.
    fn check_write(&self, state: &State, connection: Option<&str>, since: i64) {
        if state.revision == since {
            return;
        }
        if let Some(check) = self.shared.write_check.lock_unpoisoned().as_mut() {
            let keys = state.log.iter().rev();
            let keys = keys.take_while(|(revision, _)| *revision > since);
            check(&AppliedWrite {
                connection,
                revision: state.revision,
                keys: keys.map(|(_, event)| changed_key(event)).collect(),
                state,
            });
        }
    }

    /// Runs `apply` as a call of `kind` whose fate the plan chooses.
    fn call<T: Send + 'static>(
        &self,
        connection: &str,
        kind: CallKind,
        what: &str,
        apply: impl FnOnce(&mut State) -> Result<T, CallError> + Send + 'static,
    ) -> Result<T, CallError> {
        match self.fate(connection, kind) {
            CallFate::Answered => self.with_state_for(Some(connection), apply),
            CallFate::LostBefore => Err(lost(what)),
            CallFate::LostAfter => {
                let _ = self.with_state_for(Some(connection), apply);
                Err(lost(what))
            }
            CallFate::AppliedLater(after) => {
                let etcd = self.clone();
                let connection = connection.to_string();
                self.shared.runtime.spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = etcd.with_state_for(Some(&connection), apply);
                });
                Err(lost(what))
            }
        }
    }
}

fn changed_key(event: &WatchEvent) -> &str {
    match event {
        WatchEvent::Put(kv) => &kv.key,
        WatchEvent::Delete { key, .. } => key,
    }
}

/// One connection to the simulated etcd: its calls carry its name to the fate plan.
struct Connection {
    etcd: SimulatedEtcd,
    name: Arc<str>,
}

impl Connection {
    fn call<T: Send + 'static>(
        &self,
        kind: CallKind,
        what: &str,
        apply: impl FnOnce(&mut State) -> Result<T, CallError> + Send + 'static,
    ) -> Result<T, CallError> {
        self.etcd.call(&self.name, kind, what, apply)
    }

    fn again(&self) -> Connection {
        Connection {
            etcd: self.etcd.clone(),
            name: self.name.clone(),
        }
    }
}

#[async_trait]
impl EtcdBackend for Connection {
    async fn range(&self, read: RangeRead) -> Result<RangeAnswer, CallError> {
        self.call(CallKind::Read, "a range read", move |state| {
            if read.revision > state.revision {
                return Err(CallError::Refused(
                    "etcdserver: mvcc: required revision is a future revision".into(),
                ));
            }
            if read.revision != 0 && read.revision < state.compacted {
                return Err(CallError::Compacted(
                    "etcdserver: mvcc: required revision has been compacted".into(),
                ));
            }
            let mut kvs = state.range(&read.start, &read.end, read.revision);
            let limit = usize::try_from(read.limit).unwrap_or(0);
            let more = limit > 0 && kvs.len() > limit && !read.count_only;
            if more {
                kvs.truncate(limit);
            }
            if read.count_only {
                kvs.clear();
            }
            Ok(RangeAnswer {
                kvs,
                more,
                revision: state.revision,
            })
        })
    }

    async fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), CallError> {
        let step = TxnStep::Put {
            key: key.to_string(),
            value: value.to_vec(),
            lease,
        };
        self.call(CallKind::Write, "a put", move |state| {
            state.run_steps(&[step]).map(drop)
        })
    }

    async fn delete(&self, key: &str) -> Result<i64, CallError> {
        let step = TxnStep::Delete {
            key: key.to_string(),
        };
        self.call(CallKind::Write, "a delete", move |state| {
            let before = state.revision;
            state.run_steps(&[step])?;
            Ok(i64::from(state.revision != before))
        })
    }

    async fn txn(&self, txn: Transaction) -> Result<TxnAnswer, CallError> {
        refused_as_etcd_would(&txn)?;
        self.call(CallKind::Write, "a transaction", move |state| {
            let succeeded = state.compares_ignored
                || txn.when.iter().all(|compare| {
                    let found = state.current(&compare.key, state.revision);
                    let revision = found.map_or(0, |kv| match compare.of {
                        RevisionOf::Create => kv.create_revision,
                        RevisionOf::Mod => kv.mod_revision,
                    });
                    match compare.op {
                        CompareOp::Equal => revision == compare.revision,
                        CompareOp::Greater => revision > compare.revision,
                    }
                });
            let steps = if succeeded { &txn.then } else { &txn.otherwise };
            let found = state.run_steps(steps)?;
            Ok(TxnAnswer {
                succeeded,
                found,
                revision: state.revision,
            })
        })
    }

    async fn grant_lease(&self, ttl_secs: i64) -> Result<i64, CallError> {
        self.call(CallKind::Lease, "a lease grant", move |state| {
            let ttl = Duration::from_secs(ttl_secs.max(1) as u64);
            state.next_lease += 1;
            let id = state.next_lease;
            let lease = Lease {
                ttl,
                expires: Instant::now() + state.lasts(ttl),
                keys: BTreeSet::new(),
            };
            state.leases.insert(id, lease);
            Ok(id)
        })
    }

    fn lease_keeper(&self, lease: i64) -> Box<dyn LeaseKeeper> {
        Box::new(SimulatedKeeper {
            connection: self.again(),
            lease,
        })
    }

    async fn revoke_lease(&self, lease: i64) -> Result<(), CallError> {
        self.call(
            CallKind::Lease,
            "a lease revocation",
            move |state| match state.revoke(lease) {
                true => Ok(()),
                false => Err(lease_not_found()),
            },
        )
    }

    async fn lease_time_to_live(&self, lease: i64) -> Result<(i64, i64), CallError> {
        self.call(CallKind::Read, "a lease's time to live", move |state| {
            Ok(match state.leases.get(&lease) {
                Some(held) => {
                    let left = held.expires.saturating_duration_since(Instant::now());
                    (held.ttl.as_secs() as i64, left.as_secs() as i64)
                }
                None => (0, -1),
            })
        })
    }

    async fn watch(
        &self,
        prefix: &str,
        start_revision: i64,
    ) -> Result<Box<dyn WatchStream>, CallError> {
        self.call(CallKind::Watch, "opening a watch", |_| Ok(()))?;
        Ok(Box::new(SimulatedWatch {
            changed: {
                let changed = Arc::new(Notify::new());
                let watchers = &self.etcd.shared.watchers;
                watchers.lock_unpoisoned().push(Arc::downgrade(&changed));
                changed
            },
            connection: self.again(),
            prefix: prefix.to_string(),
            next_revision: start_revision.max(1),
            created: false,
        }))
    }

    async fn compact(&self, revision: i64) -> Result<(), CallError> {
        self.call(CallKind::Write, "a compaction", move |state| {
            state.compact(revision)
        })
    }

    async fn status(&self) -> Result<StatusAnswer, CallError> {
        self.call(CallKind::Read, "a status", |state| {
            let in_use: usize = state
                .versions
                .values()
                .flatten()
                .filter_map(|(_, kv)| kv.as_ref())
                .map(|kv| kv.key.len() + kv.value.len())
                .sum();
            Ok(StatusAnswer {
                member: "simulated".into(),
                version: "3.4-simulated".into(),
                db_size: in_use as u64,
                db_size_in_use: in_use as u64,
                revision: state.revision,
                alarms: Vec::new(),
            })
        })
    }
}

struct SimulatedKeeper {
    connection: Connection,
    lease: i64,
}

#[async_trait]
impl LeaseKeeper for SimulatedKeeper {
    async fn renew(&self) -> Result<bool, CallError> {
        let lease = self.lease;
        self.connection
            .call(CallKind::Lease, "a lease renewal", move |state| {
                let lasts = state.leases.get(&lease).map(|held| state.lasts(held.ttl));
                Ok(match (state.leases.get_mut(&lease), lasts) {
                    (Some(held), Some(lasts)) => {
                        held.expires = Instant::now() + lasts;
                        true
                    }
                    _ => false,
                })
            })
    }
}
