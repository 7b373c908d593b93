//! Applying the scheduler's decisions to the server's state: each method takes the state as
//! the server's lock holds it, asks the pure functions ([`super::reconcile`],
//! [`super::placement`], [`super::gc`]) what to do, and makes it so (alloc ids, sequence
//! numbers, modify indexes). It must not save, wake anyone or read a clock other than to
//! stamp a terminal alloc: that is [`super::EmbeddedServer`]'s.

use super::reconcile::{self, JobPlan, Plan, Replacement};
use super::records::{AllocRecord, JobRecord};
use super::{Registration, State, drain, gc, placement};
use crate::model::jobspec::JobSpec;
use crate::model::structs::{
    Alloc, AllocState, ClientStatus, DesiredStatus, PreviousAlloc, Reschedule,
};
use crate::rpc::AllocUpdate;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::time::Instant;

/// Applying decisions: each takes the state as the lock holds it, asks the scheduler's pure
/// functions what to do, and makes it so (ids, sequence numbers, modify indexes).
impl State {
    pub(super) fn register(&mut self, spec: JobSpec, index: u64) -> Registration {
        let existing = self.jobs.get(&spec.id);
        let JobPlan {
            created,
            version,
            plan,
            ..
        } = reconcile::reconcile_job(existing, &spec, &self.placeable, self.allocs.values());
        let restarts = existing
            .filter(|job| !job.purged)
            .map_or(0, |job| job.restarts);
        let stopped = plan.stop.clone();
        let upgraded = plan.upgrade.clone();
        let placed = self.apply(plan, &spec, version, index);
        self.insert_job(
            spec.id.clone(),
            JobRecord {
                spec,
                version,
                stopped: false,
                purged: false,
                restarts,
            },
        );
        Registration {
            created,
            placed,
            stopped,
            upgraded,
        }
    }

    /// Applies `plan` to the allocs of the job `spec` describes at `version`: stops, marks
    /// replaced, upgrades, then creates the new allocs. Returns the new allocs' ids.
    pub(super) fn apply(
        &mut self,
        plan: Plan,
        spec: &JobSpec,
        version: u64,
        index: u64,
    ) -> Vec<String> {
        for id in &plan.stop {
            self.stop_alloc(id, index);
        }
        for id in &plan.replace {
            if let Some(record) = self.alloc_mut(id) {
                record.replaced = true;
            }
        }
        for id in &plan.upgrade {
            self.upgrade_alloc(id, spec, version, index);
        }
        plan.place
            .into_iter()
            .map(|node_id| {
                self.create_alloc(spec, version, node_id, plan.reschedule.clone(), index)
            })
            .collect()
    }

    /// Asks an alloc to stop. One still waiting for a node has nothing to stop: it ends
    /// at once, complete, and waits no more.
    pub(super) fn stop_alloc(&mut self, alloc_id: &str, index: u64) {
        let Some(record) = self.alloc_mut(alloc_id) else {
            return;
        };
        if record.alloc.desired_status != DesiredStatus::Run {
            return;
        }
        record.alloc = Arc::new(Alloc {
            desired_status: DesiredStatus::Stop,
            modify_index: index,
            ..Alloc::clone(&record.alloc)
        });
        if record.node_id.is_none() && !record.is_terminal() {
            record.client_state = Some(AllocState {
                client_status: ClientStatus::Complete,
                description: "stopped before it was placed".into(),
                task_states: Default::default(),
            });
            record.terminal_since = Some(Instant::now());
            self.waiting.remove(alloc_id);
        }
    }

    /// Gives a running alloc the job's new runner, tasks and meta, as the job's `version`:
    /// its client upgrades it in place.
    fn upgrade_alloc(&mut self, alloc_id: &str, spec: &JobSpec, version: u64, index: u64) {
        if let Some(record) = self.alloc_mut(alloc_id)
            && record.alloc.desired_status == DesiredStatus::Run
        {
            record.alloc = Arc::new(Alloc {
                runner: spec.runner.clone(),
                runner_sha256: spec.runner_sha256.clone(),
                tasks: spec.tasks.clone(),
                meta: spec.meta.clone(),
                modify_index: index,
                ..Alloc::clone(&record.alloc)
            });
            record.job_version = version;
        }
    }

    fn create_alloc(
        &mut self,
        spec: &JobSpec,
        version: u64,
        node_id: Option<String>,
        reschedule: Option<Reschedule>,
        index: u64,
    ) -> String {
        let alloc = Alloc {
            modify_index: index,
            reschedule,
            meta: spec.meta.clone(),
            limits: spec.limits.clone(),
            capabilities: spec.capabilities.clone(),
            restart: spec.restart,
            runner_sha256: spec.runner_sha256.clone(),
            ..Alloc::new(
                uuid::Uuid::new_v4().to_string(),
                spec.id.clone(),
                spec.runner.clone(),
                spec.tasks.clone(),
            )
        };
        let id = alloc.id.clone();
        self.next_sequence += 1;
        self.insert_alloc(AllocRecord {
            alloc: Arc::new(alloc),
            node_id,
            client_state: None,
            job_version: version,
            sequence: self.next_sequence,
            terminal_since: None,
            replaced: false,
            disconnected_unix_ms: None,
            stands_in_for: None,
        });
        id
    }

    /// Places the allocs waiting for a node on those that can hold them now, oldest first.
    pub(super) fn place_unplaced(&mut self, index: u64) {
        let mut waiting: Vec<&AllocRecord> = self
            .waiting
            .iter()
            .filter_map(|id| self.allocs.get(id))
            .collect();
        waiting.sort_by_key(|record| record.sequence);
        let jobs = &self.jobs;
        let chosen =
            placement::place_unplaced(&self.placeable, self.allocs.values(), &waiting, |job_id| {
                jobs.get(job_id).map(|job| &job.spec)
            });
        for (id, node) in chosen {
            let Some(node) = node else { continue };
            self.waiting.remove(&id);
            if let Some(record) = self.alloc_mut(&id) {
                record.node_id = Some(node);
                record.alloc = Arc::new(Alloc {
                    modify_index: index,
                    ..Alloc::clone(&record.alloc)
                });
            }
        }
    }

    /// Takes one node's reports into the allocs' records; returns the ids accepted (every
    /// alloc the server knows) and adds the nodes they are on to `reporting_nodes`. A failed
    /// alloc is replaced as its job says.
    ///
    /// A terminal alloc stays terminal. A lost one until its node, back, reports how it
    /// ended; a finished one for good: its client never runs it again (restore keeps it
    /// finished), so a later non-terminal report is a stale one, delivered late (a restarted
    /// node's request still in flight), and taking it would bring the alloc back to life on
    /// the server alone.
    pub(super) fn take_updates(
        &mut self,
        updates: &[AllocUpdate],
        index: u64,
        restart_limit: u32,
        now_unix_ms: u64,
        reporting_nodes: &mut BTreeSet<String>,
    ) -> Vec<String> {
        let mut accepted = Vec::new();
        for update in updates {
            let Some(record) = self.alloc_mut(&update.alloc_id) else {
                continue;
            };
            if let Some(node) = &record.node_id {
                reporting_nodes.insert(node.clone());
            }
            if matches!(
                update.state.client_status,
                ClientStatus::Unknown | ClientStatus::Lost
            ) {
                // The scheduler's to decide, never a client's: dropped, and not asked again.
                accepted.push(update.alloc_id.clone());
                continue;
            }
            let unknown = record
                .client_state
                .as_ref()
                .is_some_and(|s| s.client_status == ClientStatus::Unknown);
            if unknown {
                let node = record.node_id.clone();
                let node_back = node.is_some_and(|node| self.nodes.contains_key(&node));
                // A report sent before its node went silent, delivered late, says nothing of
                // now: only how the alloc ended is taken from it.
                if node_back || update.state.client_status.is_terminal() {
                    self.reconnect(&update.alloc_id, &update.state, index);
                    self.replace_if_failed(&update.alloc_id, restart_limit, now_unix_ms, index);
                }
                accepted.push(update.alloc_id.clone());
                continue;
            }
            let terminal = record
                .client_state
                .as_ref()
                .is_some_and(|s| s.client_status.is_terminal());
            if terminal && !update.state.client_status.is_terminal() {
                accepted.push(update.alloc_id.clone());
                continue;
            }
            let ended = update.state.client_status.is_terminal() && record.terminal_since.is_none();
            if ended {
                record.terminal_since = Some(Instant::now());
            }
            record.client_state = Some(AllocState::clone(&update.state));
            // What it held on its node is free for the allocs waiting for room.
            self.room_made |= ended;
            accepted.push(update.alloc_id.clone());
            self.replace_if_failed(&update.alloc_id, restart_limit, now_unix_ms, index);
        }
        accepted
    }

    /// Replaces a failed alloc that failed at `now_unix_ms`, as its job's reschedule policy
    /// says (see [`reconcile::replace_failed`]).
    pub(super) fn replace_if_failed(
        &mut self,
        alloc_id: &str,
        restart_limit: u32,
        now_unix_ms: u64,
        index: u64,
    ) {
        let Some(record) = self.allocs.get(alloc_id) else {
            return;
        };
        let job = self.jobs.get(&record.alloc.job_id);
        let decision = reconcile::replace_failed(
            record,
            job,
            restart_limit,
            now_unix_ms,
            &self.placeable,
            self.allocs.values(),
        );
        let (Replacement::Replace(plan), Some(job)) = (&decision, job) else {
            if let Replacement::LimitReached { attempts, interval } = decision {
                tracing::warn!(
                    job = %record.alloc.job_id,
                    alloc_id,
                    attempts,
                    interval = %crate::util::units::format_duration(interval),
                    "not replacing failed allocation: restart limit reached"
                );
            }
            return;
        };
        let (spec, version, plan) = (job.spec.clone(), job.version, plan.clone());
        if let Some(job) = self.job_mut(&spec.id) {
            job.restarts += 1;
        }
        let attempt = plan.reschedule.as_ref().map_or(0, |r| r.attempt);
        let start_after_unix_ms = plan
            .reschedule
            .as_ref()
            .map_or(0, |r| r.start_after_unix_ms);
        let stands_in_for = self
            .allocs
            .get(alloc_id)
            .and_then(|r| r.stands_in_for.clone());
        let replacement = self.apply(plan, &spec, version, index);
        if let (Some(original), Some(new)) = (stands_in_for, replacement.first())
            && let Some(record) = self.alloc_mut(new)
        {
            // It stands in for the same unknown alloc, for the same reconnect.
            record.stands_in_for = Some(original);
        }
        let replacement = replacement.first().map_or("", String::as_str);
        tracing::info!(job = %spec.id, alloc_id, replacement, attempt, start_after_unix_ms, "replacing failed allocation");
    }

    pub(super) fn remove_empty_purged_jobs(&mut self) {
        for job_id in gc::empty_purged_jobs(&self.jobs, self.allocs.values()) {
            self.remove_job(&job_id);
        }
    }

    /// Takes `node_id` out of the nodes allocs are placed on and loses its allocs, or marks
    /// them unknown when their job has a `[job.disconnect]` block (see
    /// [`reconcile::lose_node`]). Returns the ids of the allocs lost or unknown.
    pub(super) fn node_down(&mut self, node_id: &str, index: u64, now_unix_ms: u64) -> Vec<String> {
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
    pub(super) fn expire_disconnects(&mut self, index: u64, now_unix_ms: u64) {
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
    pub(super) fn reconnect_node(&mut self, node_id: &str, index: u64) {
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
    fn reconnect(&mut self, alloc_id: &str, state: &AllocState, index: u64) {
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

    /// Takes every drain one step on (see [`drain::drain_step`]): moves what is due, and
    /// ends the drains with nothing left on their node.
    pub(super) fn advance_drains(&mut self, index: u64, now_unix_ms: u64) {
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

    /// Places the allocs `job_id` lacks at a takeover (see
    /// [`reconcile::missing_at_takeover`]). Returns how many.
    pub(super) fn fill_missing(&mut self, job_id: &str, index: u64) -> usize {
        let Some(job) = self.jobs.get(job_id) else {
            return 0;
        };
        let missing = reconcile::missing_at_takeover(job, self.allocs.values());
        if missing == 0 {
            return 0;
        }
        let (spec, version) = (job.spec.clone(), job.version);
        let plan = Plan {
            place: placement::Placer::new(&self.placeable, self.allocs.values())
                .place(placement::Ask::new(&spec, missing)),
            ..Plan::default()
        };
        self.apply(plan, &spec, version, index).len()
    }
}
