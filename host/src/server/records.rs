//! What the server holds about each job and alloc, and the form those records are saved in.
//!
//! The records are plain data, with no store or lock behind them: the scheduler's pure
//! functions ([`super::placement`], [`super::reconcile`], [`super::gc`]) read them, the
//! embedded server owns and mutates them, and its `persist` module saves them in the form
//! defined here. Only that conversion reads the clock.
//!
//! Invariant of the saved form, for the reason given:
//! - A terminal alloc's `terminal_since` is saved as wall-clock milliseconds and read back as
//!   an [`Instant`] of the same age, since an `Instant` means nothing to the next process
//!   and the job GC threshold must keep counting across a restart.

use crate::model::jobspec::JobSpec;
use crate::model::structs::{Alloc, AllocState, ClientStatus, DesiredStatus};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A job as the server holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRecord {
    /// The spec last registered.
    pub spec: JobSpec,
    /// Bumped by every change that replaces allocs.
    pub version: u64,
    /// True after `stop`.
    pub stopped: bool,
    /// True after `stop --purge`: removed with its last alloc.
    pub purged: bool,
    /// Failed allocs replaced so far.
    pub restarts: u32,
}

/// An alloc as the server holds it.
#[derive(Debug, Clone)]
pub struct AllocRecord {
    /// The alloc as sent to clients.
    pub alloc: Arc<Alloc>,
    /// The node it is placed on; `None` until a node registers.
    pub node_id: Option<String>,
    /// The state its client last reported.
    pub client_state: Option<AllocState>,
    /// The job version it was made for.
    pub job_version: u64,
    /// Creation order across the server (orders allocs oldest first, even within one
    /// registration).
    pub sequence: u64,
    /// When its client first reported it terminal.
    pub terminal_since: Option<Instant>,
    /// True once a replacement was made for it (a failed service alloc, one moved off a
    /// drained node, one whose node stopped answering).
    pub replaced: bool,
    /// When its node stopped answering, while it is `unknown` (Unix ms): it is lost once
    /// its job's `[job.disconnect] lost_after` has passed since.
    pub disconnected_unix_ms: Option<u64>,
    /// The unknown alloc this one stands in for, until that one's node returns or it is
    /// lost (see [`crate::model::disconnect`]).
    pub stands_in_for: Option<String>,
}

impl AllocRecord {
    /// Its client reported it complete, failed or lost: it runs no more.
    pub fn is_terminal(&self) -> bool {
        self.client_state
            .as_ref()
            .is_some_and(|s| s.client_status.is_terminal())
    }

    /// Sets the state the scheduler decided for it (`lost`, `unknown`: its client cannot
    /// say), keeping the tasks its client last reported.
    pub fn set_decided_state(&mut self, client_status: ClientStatus, description: String) {
        let task_states = self
            .client_state
            .take()
            .map(|s| s.task_states)
            .unwrap_or_default();
        self.client_state = Some(AllocState {
            client_status,
            description,
            task_states,
        });
    }

    /// Desired to run, not terminal, not replaced: counts toward the job's count.
    pub fn is_wanted(&self) -> bool {
        self.alloc.desired_status == DesiredStatus::Run && !self.is_terminal() && !self.replaced
    }
}

/// An [`AllocRecord`] as saved: the time it turned terminal as wall-clock milliseconds, since
/// an `Instant` means nothing to the next process.
/// Cluster mode stores it too, as the value of the alloc's key (see `crate::cluster`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SavedAllocRecord {
    pub(crate) alloc: Alloc,
    pub(crate) node_id: Option<String>,
    pub(crate) client_state: Option<AllocState>,
    job_version: u64,
    sequence: u64,
    terminal_since_unix_ms: Option<u64>,
    replaced: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disconnected_unix_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stands_in_for: Option<String>,
}

/// The server's counters, saved as one record with every change.
#[derive(Default, Serialize, Deserialize)]
pub(crate) struct SavedMeta {
    pub(crate) index: u64,
    pub(crate) next_sequence: u64,
    /// Where the node list was kept before it had a record of its own ([`NODES_KEY`]): read
    /// from an older state file, never written.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) nodes: BTreeSet<String>,
}

/// The key of the one [`SavedMeta`] record.
pub(crate) const META_KEY: &str = "server";

/// The key of the registered nodes' record (a list of names) in the metadata table, written
/// only when a node comes or goes: with it in [`SavedMeta`], every change wrote every node's
/// name, and with thousands of nodes that was most of each save.
pub(crate) const NODES_KEY: &str = "nodes";

/// The key of the nodes' schedules (eligibility and drains, see `super::drain`) in the
/// metadata table: one record, written when an operator changes one.
pub(crate) const NODE_SCHEDULES_KEY: &str = "node_schedules";

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Plain derived data: serializing to JSON cannot fail.
    serde_json::to_vec(value).expect("server records serialize to JSON")
}

impl SavedAllocRecord {
    pub(super) fn from_record(record: &AllocRecord) -> Self {
        let (now, unix_now) = (Instant::now(), crate::util::timestamp::unix_ms_now());
        SavedAllocRecord {
            alloc: Alloc::clone(&record.alloc),
            node_id: record.node_id.clone(),
            client_state: record.client_state.clone(),
            job_version: record.job_version,
            sequence: record.sequence,
            terminal_since_unix_ms: record
                .terminal_since
                .map(|since| unix_now.saturating_sub(now.duration_since(since).as_millis() as u64)),
            replaced: record.replaced,
            disconnected_unix_ms: record.disconnected_unix_ms,
            stands_in_for: record.stands_in_for.clone(),
        }
    }

    pub(super) fn into_record(self) -> AllocRecord {
        let (now, unix_now) = (Instant::now(), crate::util::timestamp::unix_ms_now());
        AllocRecord {
            alloc: Arc::new(self.alloc),
            node_id: self.node_id,
            client_state: self.client_state,
            job_version: self.job_version,
            sequence: self.sequence,
            terminal_since: self.terminal_since_unix_ms.map(|since| {
                let age = Duration::from_millis(unix_now.saturating_sub(since));
                now.checked_sub(age).unwrap_or(now)
            }),
            replaced: self.replaced,
            disconnected_unix_ms: self.disconnected_unix_ms,
            stands_in_for: self.stands_in_for,
        }
    }
}

/// One job's allocs, counted for the web UI's plot of them over time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobAllocCounts {
    /// Placed on a node, whatever their status, and not yet collected.
    pub placed: u32,
    /// Running.
    pub running: u32,
    /// Failed.
    pub failed: u32,
    /// Replacing an alloc that failed or was lost (rescheduled), not yet collected.
    pub rescheduled: u32,
}
