//! Applying a node's loss and return: its allocs lost, or unknown with stand-ins under
//! `[job.disconnect]`; unknown allocs expired past `lost_after`; a returning node's allocs
//! reconciled with their stand-ins by the job's rule (the decisions are
//! [`super::super::reconcile`]'s). As the rest of `apply`, it reads no clock but to stamp a
//! terminal alloc.

use super::super::reconcile::{self, Plan};
use super::super::{State, placement};
use crate::model::structs::{Alloc, AllocState, ClientStatus, DesiredStatus};
use std::sync::Arc;
use tokio::time::Instant;

impl State {
    /// Takes `node_id` out of the nodes allocs are placed on and loses its allocs, or marks
    /// them unknown when their job has a `[job.disconnect]` block (see
    /// [`reconcile::lose_node`]). Returns the ids of the allocs lost or unknown.
    pub(in crate::server) fn node_down(
        &mut self,
        node_id: &str,
        index: u64,
        now_unix_ms: u64,
    ) -> Vec<String> {
        self.remove_node(node_id);
        let loss = reconcile::lose_node(node_id, &self.jobs, &self.placeable, self.allocs.values());
        for id in &loss.unknown {
            let lost_after = self
                .allocs
                .get(id)
                .and_then(|r| self.jobs.get(&r.alloc.job_id))
                .and_then(|job| job.spec.disconnect)
                .map(|d| crate::util::units::format_duration(d.lost_after))
                .unwrap_or_default();
            if let Some(record) = self.alloc_mut(id) {
                record.set_decided_state(
                    ClientStatus::Unknown,
                    format!(
                        "node {node_id} stopped answering; lost in {lost_after} unless it returns"
                    ),
                );
                record.disconnected_unix_ms = Some(now_unix_ms);
                record.alloc = Arc::new(Alloc {
                    modify_index: index,
                    ..Alloc::clone(&record.alloc)
                });
            }
            self.unknown.insert(id.clone());
        }
        for (job_id, plan) in loss.stand_ins {
            let Some(job) = self.jobs.get(&job_id) else {
                continue;
            };
            let (spec, version) = (job.spec.clone(), job.version);
            let originals = plan.replace.clone();
            let placed = self.apply(plan, &spec, version, index);
            for (original, stand_in) in originals.iter().zip(&placed) {
                if let Some(record) = self.alloc_mut(stand_in) {
                    record.stands_in_for = Some(original.clone());
                }
            }
            tracing::info!(job = %job_id, node_id, stand_ins = placed.len(), "allocations unknown with their node: placing stand-ins until it returns");
        }
        for id in &loss.lost {
            self.stop_alloc(id, index);
            if let Some(record) = self.alloc_mut(id) {
                record.set_decided_state(
                    ClientStatus::Lost,
                    format!("node {node_id} stopped answering"),
                );
                record.terminal_since = Some(Instant::now());
            }
        }
        for (job_id, plan) in loss.replacements {
            let Some(job) = self.jobs.get(&job_id) else {
                continue;
            };
            let (spec, version) = (job.spec.clone(), job.version);
            let placed = self.apply(plan, &spec, version, index);
            tracing::info!(job = %job_id, node_id, replacements = placed.len(), "replacing allocations lost with their node");
        }
        loss.lost.into_iter().chain(loss.unknown).collect()
    }

    /// Loses the unknown allocs whose job's `lost_after` has passed since their node stopped
    /// answering; one that has no stand-in (`replace = false`) is replaced now.
    pub(in crate::server) fn expire_disconnects(&mut self, index: u64, now_unix_ms: u64) {
        let expired: Vec<String> = self
            .unknown
            .iter()
            .filter(|id| {
                let Some(record) = self.allocs.get(*id) else {
                    return true;
                };
                let lost_after = self
                    .jobs
                    .get(&record.alloc.job_id)
                    .and_then(|job| job.spec.disconnect)
                    .map_or(0, |d| d.lost_after.as_millis() as u64);
                record
                    .disconnected_unix_ms
                    .is_none_or(|since| now_unix_ms >= since.saturating_add(lost_after))
            })
            .cloned()
            .collect();
        for id in expired {
            self.unknown.remove(&id);
            let Some(record) = self.allocs.get(&id) else {
                continue;
            };
            if record.client_state.as_ref().map(|s| s.client_status) != Some(ClientStatus::Unknown)
            {
                continue;
            }
            let node = record.node_id.clone().unwrap_or_default();
            let had_stand_in = record.replaced;
            let job = self.jobs.get(&record.alloc.job_id);
            let current =
                job.filter(|j| !j.stopped && !j.purged && j.version == record.job_version);
            let replacement = match current {
                Some(job) if !had_stand_in && record.alloc.desired_status == DesiredStatus::Run => {
                    Some((job.spec.clone(), job.version))
                }
                _ => None,
            };
            self.stop_alloc(&id, index);
            if let Some(record) = self.alloc_mut(&id) {
                record.set_decided_state(
                    ClientStatus::Lost,
                    format!("node {node} stopped answering for longer than the job's lost_after"),
                );
                record.terminal_since = Some(Instant::now());
                record.disconnected_unix_ms = None;
            }
            // Its stand-in, if any, is the job's own alloc from now on.
            let stand_ins: Vec<String> = self
                .allocs
                .values()
                .filter(|a| a.stands_in_for.as_deref() == Some(id.as_str()))
                .map(|a| a.alloc.id.clone())
                .collect();
            for stand_in in stand_ins {
                if let Some(record) = self.alloc_mut(&stand_in) {
                    record.stands_in_for = None;
                }
            }
            if let Some((spec, version)) = replacement {
                let place = placement::Placer::new(&self.placeable, self.allocs.values())
                    .place(placement::Ask::new(&spec, 1));
                let plan = Plan {
                    replace: vec![id.clone()],
                    place,
                    ..Plan::default()
                };
                self.apply(plan, &spec, version, index);
            }
            tracing::warn!(alloc_id = %id, node, "allocation lost: its node did not return within lost_after");
        }
    }

    /// Node `node_id` registered again: each of its allocs that was unknown while it was
    /// away is taken as running there (its client reports otherwise if it ended, and that
    /// report is taken as any other), and reconciled with its stand-in.
    pub(in crate::server) fn reconnect_node(&mut self, node_id: &str, index: u64) {
        let back: Vec<(String, AllocState)> = self
            .unknown
            .iter()
            .filter_map(|id| self.allocs.get(id))
            .filter(|record| record.node_id.as_deref() == Some(node_id))
            .filter_map(|record| {
                let mut state = record.client_state.clone()?;
                state.client_status = ClientStatus::Running;
                state.description = format!("node {node_id} returned");
                Some((record.alloc.id.clone(), state))
            })
            .collect();
        for (alloc_id, state) in back {
            self.reconnect(&alloc_id, &state, index);
        }
    }

    /// An unknown alloc's node reported on it again: it takes the report, and when both it
    /// and a stand-in still run, one is stopped by its job's `reconcile` rule (see
    /// [`reconcile::keep_original`]). A batch alloc that completed while away keeps its
    /// completion, and its stand-in stops: the work is done.
    pub(in crate::server) fn reconnect(&mut self, alloc_id: &str, state: &AllocState, index: u64) {
        self.unknown.remove(alloc_id);
        let Some(original) = self.allocs.get(alloc_id) else {
            return;
        };
        let job = self.jobs.get(&original.alloc.job_id);
        let current = job
            .filter(|j| !j.stopped && !j.purged && j.version == original.job_version)
            .cloned();
        let stand_in = self
            .allocs
            .values()
            .find(|a| a.stands_in_for.as_deref() == Some(alloc_id) && a.is_wanted())
            .cloned();
        let ended = state.client_status.is_terminal();
        let stand_in_runs = stand_in.as_ref().is_some_and(|s| {
            s.node_id.is_some()
                && s.client_state
                    .as_ref()
                    .is_some_and(|c| c.client_status == ClientStatus::Running)
        });
        let keep_original = match (&current, &stand_in) {
            _ if ended => false,
            (None, _) => false,
            // Its stand-in is gone (failed and replaced, scaled away): the original comes
            // back only into a place the job still lacks.
            (Some(job), None) => {
                !original.replaced || self.wanted_of(&job.spec.id) < job.spec.count as usize
            }
            // A stand-in not running yet never wins over the one that runs.
            (Some(_), Some(_)) if !stand_in_runs => true,
            (Some(job), Some(stand_in)) => reconcile::keep_original(
                job.spec.disconnect.map(|d| d.reconcile).unwrap_or_default(),
                &job.spec,
                original,
                stand_in,
                &self.placeable,
                self.allocs.values(),
            ),
        };
        let batch_done = ended
            && state.client_status == ClientStatus::Complete
            && current
                .as_ref()
                .is_some_and(|j| j.spec.job_type == crate::model::jobspec::JobType::Batch);
        if let Some(record) = self.alloc_mut(alloc_id) {
            record.client_state = Some(state.clone());
            record.disconnected_unix_ms = None;
            if ended {
                record.terminal_since = Some(Instant::now());
            }
            if keep_original {
                record.replaced = false;
            }
        }
        if ended {
            self.room_made = true;
        }
        let node = self.allocs.get(alloc_id).and_then(|r| r.node_id.clone());
        match (&stand_in, keep_original || batch_done) {
            (Some(stand_in), true) => {
                self.stop_alloc(&stand_in.alloc.id, index);
                if let Some(record) = self.alloc_mut(&stand_in.alloc.id) {
                    record.stands_in_for = None;
                }
                tracing::info!(alloc_id, stand_in = %stand_in.alloc.id, node, "node returned: keeping the original allocation, stopping its stand-in");
            }
            (Some(stand_in), false) => {
                if !ended {
                    self.stop_alloc(alloc_id, index);
                }
                if let Some(record) = self.alloc_mut(&stand_in.alloc.id) {
                    record.stands_in_for = None;
                }
                tracing::info!(alloc_id, stand_in = %stand_in.alloc.id, node, "node returned: keeping the stand-in, stopping the original allocation");
            }
            (None, _) if !keep_original && !ended => self.stop_alloc(alloc_id, index),
            (None, _) => {}
        }
    }

    /// How many allocs `job_id` wants now (desired to run, not terminal, not replaced).
    fn wanted_of(&self, job_id: &str) -> usize {
        let allocs = self.allocs.values();
        allocs
            .filter(|a| a.alloc.job_id == job_id && a.is_wanted())
            .count()
    }
}
