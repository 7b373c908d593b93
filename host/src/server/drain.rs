//! Node drain and eligibility, Nomad's way: what an operator set for a node (no new allocs
//! on it; its allocs moved off it), and which of its allocs one step of a drain moves. Pure
//! functions over plain data, as placement and reconciliation are; the embedded server
//! applies each step (see `apply`) and saves the schedules with its state.
//!
//! Rules, each for the reason given:
//! - A node that is ineligible or draining gets no new alloc; what runs there runs on.
//! - A drain moves a service job's allocs one at a time per job (Nomad's `migrate {
//!   max_parallel = 1 }`): the next waits until the last one's replacement runs (every
//!   replacement names the alloc it takes over from, checkpoint or not), so a job never has
//!   more than one alloc in flight. A moved alloc is evicted, and its replacement
//!   elsewhere starts from its checkpoint ([`crate::model::structs::DesiredStatus::Evict`]).
//! - Batch allocs may finish until the drain's deadline; at the deadline every alloc still
//!   on the node is moved at once, batch or service, room elsewhere or not (a replacement
//!   that fits nowhere waits, as any blocked alloc does).
//! - Before the deadline an alloc is moved only when another node can hold its
//!   replacement: a drain never stops a service for want of room.
//! - A drain is done when nothing on the node is left running; the node stays ineligible
//!   (as in Nomad) until an operator marks it eligible. Caravan has no system jobs, so
//!   `ignore_system` changes nothing; it is kept for Nomad's command line.
//! - The schedule belongs to the node's name, not to its registration: a drained node that
//!   restarts, or drops off and comes back, is still drained.

use super::records::{AllocRecord, JobRecord};
use crate::model::jobspec::JobType;
use crate::model::structs::{ClientStatus, DesiredStatus};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What an operator set for one node. The default (eligible, not draining) is not stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSchedule {
    /// Nothing new is placed on it (set by a drain too, and kept after it).
    pub ineligible: bool,
    /// Its drain, while one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
}

impl NodeSchedule {
    /// Whether new allocs may go to the node.
    pub fn eligible(&self) -> bool {
        !self.ineligible && self.drain.is_none()
    }

    /// Whether it is the default, and need not be kept.
    pub fn is_default(&self) -> bool {
        *self == NodeSchedule::default()
    }
}

/// One node's drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// When it began (Unix ms).
    pub started_unix_ms: u64,
    /// When every alloc left is moved, done or not (Unix ms); `None`: no deadline.
    pub deadline_unix_ms: Option<u64>,
    /// Nomad's `-ignore-system` (Caravan has no system jobs).
    pub ignore_system: bool,
}

/// What one step of a node's drain does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainStep {
    /// Allocs to move now, oldest first.
    pub migrate: Vec<String>,
    /// True once nothing on the node runs any more: the drain is over.
    pub done: bool,
    /// Whether the deadline has passed: allocs move whether or not there is room.
    pub past_deadline: bool,
    /// Allocs still on the node, not terminal.
    pub left: usize,
}

/// The next step of `drain` on `node_id` at `now_unix_ms`: `jobs` by id, `allocs` every
/// alloc the server holds.
pub fn drain_step<'a>(
    node_id: &str,
    drain: &Drain,
    jobs: &BTreeMap<String, JobRecord>,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
    now_unix_ms: u64,
) -> DrainStep {
    let allocs: Vec<&AllocRecord> = allocs.into_iter().collect();
    let mut on_node: Vec<&AllocRecord> = allocs
        .iter()
        .copied()
        .filter(|a| a.node_id.as_deref() == Some(node_id) && !a.is_terminal())
        .collect();
    on_node.sort_by_key(|a| a.sequence);
    let past_deadline = drain.deadline_unix_ms.is_some_and(|d| now_unix_ms >= d);
    // A job with a move in flight: an evicted alloc still stopping, or a replacement of
    // one not yet running.
    let in_flight: BTreeSet<&str> = allocs
        .iter()
        .filter(|a| !a.is_terminal())
        .filter(|a| {
            let evicted = a.alloc.desired_status == DesiredStatus::Evict;
            let arriving = a.alloc.previous_alloc.is_some()
                && a.client_state
                    .as_ref()
                    .is_none_or(|s| s.client_status == ClientStatus::Pending);
            evicted || arriving
        })
        .map(|a| a.alloc.job_id.as_str())
        .collect();
    let mut moving: BTreeSet<&str> = BTreeSet::new();
    let mut migrate = Vec::new();
    for alloc in on_node.iter().filter(|a| a.is_wanted()) {
        let job_id = alloc.alloc.job_id.as_str();
        let Some(job) = jobs.get(job_id).filter(|j| !j.purged && !j.stopped) else {
            continue;
        };
        let due = past_deadline
            || (job.spec.job_type == JobType::Service
                && !in_flight.contains(job_id)
                && moving.insert(job_id));
        if due {
            migrate.push(alloc.alloc.id.clone());
        }
    }
    DrainStep {
        migrate,
        done: on_node.is_empty(),
        past_deadline,
        left: on_node.len(),
    }
}

#[cfg(test)]
mod tests;
