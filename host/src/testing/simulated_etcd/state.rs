//! The simulated etcd's keys: every version of each since the last compaction, the change
//! log its watches read, its leases, and what etcd refuses of a transaction's shape.

use crate::cluster::KeyValue;
use crate::cluster::backend::{CallError, Transaction, TxnStep, WatchEvent};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

pub(super) struct Lease {
    pub(super) ttl: Duration,
    pub(super) expires: Instant,
    pub(super) keys: BTreeSet<String>,
}

/// One version of a key: what it held from `revision` on (`None`: deleted).
pub(super) type Version = (i64, Option<KeyValue>);

#[derive(Default)]
pub(super) struct State {
    pub(super) revision: i64,
    pub(super) compacted: i64,
    /// Every version of every key since the compaction, oldest first.
    pub(super) versions: BTreeMap<String, Vec<Version>>,
    /// Every change since the compaction, in revision order, for watches.
    pub(super) log: VecDeque<(i64, WatchEvent)>,
    pub(super) leases: BTreeMap<i64, Lease>,
    pub(super) next_lease: i64,
    /// See [`SimulatedEtcd::end_leases_early`].
    pub(super) leases_end_early: bool,
    /// See [`SimulatedEtcd::ignore_compares`].
    pub(super) compares_ignored: bool,
    /// See [`SimulatedEtcd::report_phantom_deletes`]: the prefix, and the keys under it
    /// deleted so far.
    pub(super) phantom_deletes: Option<(String, BTreeSet<String>)>,
}

pub(super) fn lost(what: &str) -> CallError {
    CallError::Lost(format!("simulated etcd lost the answer to {what}"))
}

pub(super) fn lease_not_found() -> CallError {
    CallError::LeaseNotFound("etcdserver: requested lease not found".into())
}

impl State {
    /// How long a lease of `ttl` lasts from a grant or a renewal.
    pub(super) fn lasts(&self, ttl: Duration) -> Duration {
        if self.leases_end_early { ttl / 2 } else { ttl }
    }

    pub(super) fn current(&self, key: &str, at: i64) -> Option<&KeyValue> {
        let versions = self.versions.get(key)?;
        let (_, value) = versions
            .iter()
            .rev()
            .find(|(revision, _)| *revision <= at)?;
        value.as_ref()
    }

    /// Every key of `[start, end)` (`end` empty: `start` alone) as of revision `at`.
    pub(super) fn range(&self, start: &[u8], end: &[u8], at: i64) -> Vec<KeyValue> {
        let at = if at == 0 { self.revision } else { at };
        let start = String::from_utf8_lossy(start).into_owned();
        if end.is_empty() {
            return self.current(&start, at).cloned().into_iter().collect();
        }
        // `[0]` is etcd's "every key from start on".
        let end = (end != [0]).then(|| String::from_utf8_lossy(end).into_owned());
        self.versions
            .range(start..)
            .take_while(|(key, _)| end.as_ref().is_none_or(|end| *key < end))
            .filter_map(|(key, _)| self.current(key, at).cloned())
            .collect()
    }

    pub(super) fn write(&mut self, key: &str, value: Option<KeyValue>) {
        let revision = self.revision;
        let deleting = value.is_none();
        let old_lease = self.current(key, revision).map(|kv| kv.lease);
        if let Some(lease) = old_lease.and_then(|lease| self.leases.get_mut(&lease)) {
            lease.keys.remove(key);
        }
        let event = match &value {
            Some(kv) => {
                if let Some(lease) = self.leases.get_mut(&kv.lease) {
                    lease.keys.insert(key.to_string());
                }
                WatchEvent::Put(kv.clone())
            }
            None => WatchEvent::Delete {
                key: key.to_string(),
                mod_revision: revision,
            },
        };
        self.versions
            .entry(key.to_string())
            .or_default()
            .push((revision, value));
        self.log.push_back((revision, event));
        if let Some((prefix, deleted)) = &mut self.phantom_deletes
            && key.starts_with(prefix.as_str())
        {
            if deleting {
                deleted.insert(key.to_string());
            } else if deleted.contains(key) {
                let phantom = WatchEvent::Delete {
                    key: key.to_string(),
                    mod_revision: revision,
                };
                self.log.push_back((revision, phantom));
            }
        }
    }

    /// Puts `key` at the revision being made (the caller bumps it first).
    pub(super) fn put(&mut self, key: &str, value: &[u8], lease: i64) -> Result<(), CallError> {
        if lease != 0 && !self.leases.contains_key(&lease) {
            return Err(lease_not_found());
        }
        let created = self
            .current(key, self.revision)
            .map_or(self.revision, |kv| kv.create_revision);
        let kv = KeyValue {
            key: key.to_string(),
            value: value.to_vec(),
            mod_revision: self.revision,
            create_revision: created,
            lease,
        };
        self.write(key, Some(kv));
        Ok(())
    }

    /// Deletes `key` at the revision being made; whether it existed.
    pub(super) fn delete(&mut self, key: &str) -> bool {
        if self.current(key, self.revision).is_none() {
            return false;
        }
        self.write(key, None);
        true
    }

    /// Runs `steps` in one revision, made only if one of them writes.
    pub(super) fn run_steps(&mut self, steps: &[TxnStep]) -> Result<Vec<KeyValue>, CallError> {
        let writes = steps.iter().any(|s| !matches!(s, TxnStep::Get { .. }));
        if writes {
            for step in steps {
                if let TxnStep::Put { lease, .. } = step
                    && *lease != 0
                    && !self.leases.contains_key(lease)
                {
                    return Err(lease_not_found());
                }
            }
        }
        let before = self.revision;
        self.revision += 1;
        let mut found = Vec::new();
        let mut wrote = false;
        for step in steps {
            match step {
                TxnStep::Put { key, value, lease } => {
                    self.put(key, value, *lease)?;
                    wrote = true;
                }
                TxnStep::Delete { key } => wrote |= self.delete(key),
                TxnStep::Get { key } => found.extend(self.current(key, self.revision).cloned()),
            }
        }
        if !wrote {
            self.revision = before;
        }
        Ok(found)
    }

    pub(super) fn expire_leases(&mut self, now: Instant) {
        let expired: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, lease)| lease.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.revoke(id);
        }
    }

    pub(super) fn revoke(&mut self, id: i64) -> bool {
        let Some(lease) = self.leases.remove(&id) else {
            return false;
        };
        let steps: Vec<TxnStep> = lease
            .keys
            .into_iter()
            .map(|key| TxnStep::Delete { key })
            .collect();
        // Deletes only: cannot fail.
        let _ = self.run_steps(&steps);
        true
    }

    pub(super) fn compact(&mut self, revision: i64) -> Result<(), CallError> {
        if revision <= self.compacted {
            return Err(CallError::Compacted(
                "etcdserver: mvcc: required revision has been compacted".into(),
            ));
        }
        if revision > self.revision {
            return Err(CallError::Refused(
                "etcdserver: mvcc: required revision is a future revision".into(),
            ));
        }
        self.compacted = revision;
        for versions in self.versions.values_mut() {
            // Keep the newest version at or before the compaction, and every later one.
            let keep_from = versions
                .iter()
                .rposition(|(r, _)| *r <= revision)
                .unwrap_or(0);
            versions.drain(..keep_from);
            if versions
                .first()
                .is_some_and(|(r, v)| *r <= revision && v.is_none())
            {
                versions.remove(0);
            }
        }
        self.versions.retain(|_, versions| !versions.is_empty());
        while self.log.front().is_some_and(|(r, _)| *r <= revision) {
            self.log.pop_front();
        }
        Ok(())
    }
}

/// What etcd refuses of a transaction before it looks at the keys: more operations than its
/// default `--max-txn-ops` (128) in a compare list or a branch, or one key written twice
/// in a branch.
pub(super) fn refused_as_etcd_would(txn: &Transaction) -> Result<(), CallError> {
    const MAX_TXN_OPS: usize = 128;
    if [txn.when.len(), txn.then.len(), txn.otherwise.len()]
        .iter()
        .any(|n| *n > MAX_TXN_OPS)
    {
        return Err(CallError::Refused(
            "etcdserver: too many operations in txn request".into(),
        ));
    }
    for branch in [&txn.then, &txn.otherwise] {
        let mut written = BTreeSet::new();
        for step in branch {
            let key = match step {
                TxnStep::Put { key, .. } | TxnStep::Delete { key } => key,
                TxnStep::Get { .. } => continue,
            };
            if !written.insert(key) {
                return Err(CallError::Refused(
                    "etcdserver: duplicate key given in txn request".into(),
                ));
            }
        }
    }
    Ok(())
}
