//! Applying node drains: each drain taken one step on, as [`super::super::drain`] decides,
//! and an alloc moved off its drained node (evicted, with a replacement that names it).

use super::super::{State, drain, placement};
use crate::model::structs::{Alloc, DesiredStatus, PreviousAlloc};
use std::sync::Arc;

impl State {
    /// Takes every drain one step on (see [`drain::drain_step`]): moves what is due, and
    /// ends the drains with nothing left on their node.
    pub(in crate::server) fn advance_drains(&mut self, index: u64, now_unix_ms: u64) {
        let draining: Vec<(String, drain::Drain)> = self
            .schedules
            .iter()
            .filter_map(|(node, s)| Some((node.clone(), s.drain.clone()?)))
            .collect();
        for (node_id, node_drain) in draining {
            let step = drain::drain_step(
                &node_id,
                &node_drain,
                &self.jobs,
                self.allocs.values(),
                now_unix_ms,
            );
            for alloc_id in &step.migrate {
                self.migrate_alloc(alloc_id, step.past_deadline, index);
            }
            if step.done {
                let mut schedule = self.schedules.get(&node_id).cloned().unwrap_or_default();
                schedule.drain = None;
                self.set_schedule(&node_id, schedule);
                tracing::info!(node_id, "node drain complete: the node stays ineligible");
            }
        }
    }

    /// Moves an alloc off its drained node: a replacement on a node that can hold it, which
    /// starts from the alloc's checkpoint unless its job says not to, and the alloc evicted
    /// (its client shuts it down, saving that checkpoint). Without room elsewhere it stays
    /// where it is, unless `even_without_room` (the drain's deadline passed: the replacement
    /// then waits for room). True when moved.
    fn migrate_alloc(&mut self, alloc_id: &str, even_without_room: bool, index: u64) -> bool {
        let Some(record) = self.allocs.get(alloc_id) else {
            return false;
        };
        let Some(job) = self.jobs.get(&record.alloc.job_id) else {
            return false;
        };
        let (spec, version) = (job.spec.clone(), job.version);
        let from_node = record.node_id.clone().unwrap_or_default();
        let stopping = [alloc_id.to_string()];
        let node = placement::Placer::new(&self.placeable, self.allocs.values())
            .place(placement::Ask {
                stopping: &stopping,
                ..placement::Ask::new(&spec, 1)
            })
            .pop()
            .flatten();
        if node.is_none() && !even_without_room {
            return false;
        }
        if let Some(record) = self.alloc_mut(alloc_id) {
            record.replaced = true;
            record.alloc = Arc::new(Alloc {
                desired_status: DesiredStatus::Evict,
                modify_index: index,
                ..Alloc::clone(&record.alloc)
            });
        }
        let replacement = self.create_alloc(&spec, version, node.clone(), None, index);
        // Named even when it starts afresh: the drain waits for it to run before the job's
        // next move.
        if let Some(record) = self.alloc_mut(&replacement) {
            record.alloc = Arc::new(Alloc {
                previous_alloc: Some(PreviousAlloc {
                    alloc_id: alloc_id.to_string(),
                    node_id: from_node.clone(),
                    checkpoint: spec.migrate.checkpoint,
                }),
                ..Alloc::clone(&record.alloc)
            });
        }
        tracing::info!(
            job = %spec.id,
            alloc_id,
            from = %from_node,
            to = node.as_deref().unwrap_or("(waiting for room)"),
            replacement,
            "moving allocation off its drained node"
        );
        true
    }
}
