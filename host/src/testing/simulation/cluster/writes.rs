//! The invariants checked as etcd applies each write, whoever makes it:
//! - a write of the scheduler's keys (`jobs/`, `allocs/`, `unplaced/`) is made by the agent
//!   run holding the leader key just before it (its member record names the run's
//!   connection): no deposed leader's write lands; and within one agent run, by the writer
//!   of the current leadership (the nonce of its `scheduler_sequence` token), not by one of
//!   an earlier leadership of the same run;
//! - an alloc becomes lost (or unknown) only on a node whose lease truly ended within the
//!   leadership that writes it: the node's live key was absent at some revision since the
//!   leader key was created (deleted since, created since, or absent now). A leader learns
//!   that a node ended only from its takeover read or its watch, both after its leadership
//!   began, so an end before that, the node live again since, justifies nothing. Finer,
//!   "since the leader last knew the node live", cannot be told from etcd alone: a leader
//!   that placed an alloc before it heard of a deletion (its watch lags its own writes)
//!   rightly loses it once it does, even when the node has joined again meanwhile (seed 897
//!   showed it).

use super::super::ledger::Ledger;
use crate::cluster::{KeyValue, MemberRecord, keys};
use crate::model::structs::ClientStatus;
use crate::server::records::SavedAllocRecord;
use crate::testing::simulated_etcd::AppliedWrite;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The check, for `SimulatedEtcd::check_writes`; violations go to `ledger`.
pub(super) fn check_each(ledger: Arc<Ledger>) -> impl FnMut(&AppliedWrite<'_>) + Send + 'static {
    let mut gone = LiveKeysGone::default();
    let mut terms = Terms::default();
    move |write| {
        gone.note(write);
        if let Some(problem) = written_by_another_than_the_leader(write) {
            ledger.violation(problem);
        }
        if let Some(problem) = terms.written_outside_its_term(write) {
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

/// Which writer (the nonce of its `scheduler_sequence` tokens) wrote in each leadership
/// (the leader key's create revision): one writer per leadership, and none of an earlier
/// one, even of the same agent run, once a newer began.
#[derive(Default)]
struct Terms {
    writer_of: BTreeMap<i64, String>,
}

impl Terms {
    fn written_outside_its_term(&mut self, write: &AppliedWrite<'_>) -> Option<String> {
        let sequence = keys::scheduler_sequence_key();
        if !write.keys.iter().any(|key| *key == sequence) {
            return None;
        }
        let term = write.before(&keys::leader_key())?.create_revision;
        let token = write.after(&sequence)?;
        let token = String::from_utf8_lossy(&token.value);
        let nonce = token.split(':').next().unwrap_or_default().to_string();
        if let Some((earlier, _)) = self
            .writer_of
            .iter()
            .find(|(t, n)| **t < term && **n == nonce)
        {
            return Some(format!(
                "the writer of the leadership that began at revision {earlier} wrote at \
                 revision {} in the one that began at {term}",
                write.revision
            ));
        }
        let first = self.writer_of.entry(term).or_insert_with(|| nonce.clone());
        (*first != nonce).then(|| {
            format!(
                "two writers wrote in the leadership that began at revision {term} (the second \
                 at revision {})",
                write.revision
            )
        })
    }
}

/// The last revision at which each node's live key was deleted (its lease expired or was
/// revoked).
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

    /// Each alloc this write made lost (or unknown) on a node whose live key was there
    /// throughout the writer's leadership.
    fn allocs_lost_under_a_lease_that_never_ended(&self, write: &AppliedWrite<'_>) -> Vec<String> {
        let allocs = keys::allocs_prefix();
        let away = |kv: Option<&KeyValue>| {
            let record =
                kv.and_then(|kv| serde_json::from_slice::<SavedAllocRecord>(&kv.value).ok());
            let status = record.and_then(|r| r.client_state).map(|s| s.client_status);
            matches!(status, Some(ClientStatus::Lost | ClientStatus::Unknown))
        };
        // The leadership began when the leader key was created; a write made without it is
        // another check's.
        let Some(began) = write
            .before(&keys::leader_key())
            .map(|kv| kv.create_revision)
        else {
            return Vec::new();
        };
        let mut problems = Vec::new();
        for key in &write.keys {
            let Some((node, _)) = key.strip_prefix(&allocs).and_then(|k| k.split_once('/')) else {
                continue;
            };
            if !away(write.after(key)) || away(write.before(key)) {
                continue;
            }
            let live_since = write
                .before(&keys::live_key(node))
                .map(|kv| kv.create_revision);
            let deleted = self.0.get(node).copied();
            let ended_within = match live_since {
                None => true,
                Some(created) => created > began || deleted.is_some_and(|d| d >= began),
            };
            if ended_within {
                continue;
            }
            problems.push(format!(
                "{key} made lost at revision {} by {}, while {node}'s live key was there \
                 throughout its leadership (since revision {began}; last deleted at {deleted:?})",
                write.revision,
                write.connection.unwrap_or("etcd itself"),
            ));
        }
        problems
    }
}
