//! The invariants checked as etcd applies each write, whoever makes it:
//! - a write of the scheduler's keys (`jobs/`, `allocs/`, `unplaced/`) is made by the agent
//!   run holding the leader key just before it (its member record names the run's
//!   connection): no deposed leader's write lands;
//! - an alloc becomes lost (or unknown) only on a node whose lease truly ended: etcd deleted
//!   its live key (the lease expired, or was revoked) at least once before. Finer, "since
//!   the leader last knew the node live", cannot be told from etcd alone: a leader that
//!   placed an alloc before it heard of a deletion (its watch lags its own writes) rightly
//!   loses it once it does, even when the node has joined again meanwhile (seed 897 showed
//!   it).

use super::super::runner::Ledger;
use crate::cluster::{KeyValue, MemberRecord, keys};
use crate::model::structs::ClientStatus;
use crate::server::records::SavedAllocRecord;
use crate::testing::simulated_etcd::AppliedWrite;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The check, for `SimulatedEtcd::check_writes`; violations go to `ledger`.
pub(super) fn check_each(ledger: Arc<Ledger>) -> impl FnMut(&AppliedWrite<'_>) + Send + 'static {
    let mut gone = LiveKeysGone::default();
    move |write| {
        gone.note(write);
        if let Some(problem) = written_by_another_than_the_leader(write) {
            ledger.violation(problem);
        }
        for problem in gone.allocs_lost_under_a_lease_that_never_ended(write) {
            ledger.violation(problem);
        }
    }
}

fn written_by_another_than_the_leader(write: &AppliedWrite<'_>) -> Option<String> {
    let scheduler_keys = [
        keys::jobs_prefix(),
        keys::allocs_prefix(),
        keys::unplaced_prefix(),
    ];
    let touched = write
        .keys
        .iter()
        .find(|key| scheduler_keys.iter().any(|p| key.starts_with(p.as_str())))?;
    let holder = write
        .before(&keys::leader_key())
        .and_then(|kv| serde_json::from_slice::<MemberRecord>(&kv.value).ok())
        .map(|record| record.agent);
    if holder.is_some() && holder.as_deref() == write.connection {
        return None;
    }
    Some(format!(
        "{} wrote {touched} at revision {} while the leader key named {holder:?}",
        write.connection.unwrap_or("etcd itself"),
        write.revision
    ))
}

/// Revisions at which each node's live key was deleted (its lease expired or was revoked).
#[derive(Default)]
struct LiveKeysGone(BTreeMap<String, i64>);

impl LiveKeysGone {
    fn note(&mut self, write: &AppliedWrite<'_>) {
        let live = keys::live_prefix();
        for key in &write.keys {
            if let Some(node) = key.strip_prefix(&live)
                && write.after(key).is_none()
            {
                self.0.insert(node.to_string(), write.revision);
            }
        }
    }

    /// Each alloc this write made lost (or unknown) on a node whose live key etcd never
    /// deleted.
    fn allocs_lost_under_a_lease_that_never_ended(&self, write: &AppliedWrite<'_>) -> Vec<String> {
        let allocs = keys::allocs_prefix();
        let away = |kv: Option<&KeyValue>| {
            let record =
                kv.and_then(|kv| serde_json::from_slice::<SavedAllocRecord>(&kv.value).ok());
            let status = record.and_then(|r| r.client_state).map(|s| s.client_status);
            matches!(status, Some(ClientStatus::Lost | ClientStatus::Unknown))
        };
        let mut problems = Vec::new();
        for key in &write.keys {
            let Some((node, _)) = key.strip_prefix(&allocs).and_then(|k| k.split_once('/')) else {
                continue;
            };
            if !away(write.after(key)) || away(write.before(key)) || self.0.contains_key(node) {
                continue;
            }
            problems.push(format!(
                "{key} made lost at revision {} by {}, while {node}'s lease never ended",
                write.revision,
                write.connection.unwrap_or("etcd itself"),
            ));
        }
        problems
    }
}
