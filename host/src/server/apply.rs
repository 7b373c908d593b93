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
        let replacement = self.apply(plan, &spec, version, index);
        let replacement = replacement.first().map_or("", String::as_str);
        tracing::info!(job = %spec.id, alloc_id, replacement, attempt, start_after_unix_ms, "replacing failed allocation");
    }

    pub(super) fn remove_empty_purged_jobs(&mut self) {
        for job_id in gc::empty_purged_jobs(&self.jobs, self.allocs.values()) {
            self.remove_job(&job_id);
        }
    }

    /// Takes `node_id` out of the nodes allocs are placed on and loses its allocs (see
    /// [`reconcile::lose_node`]). Returns the ids of the allocs lost.
    pub(super) fn node_down(&mut self, node_id: &str, index: u64) -> Vec<String> {
        self.remove_node(node_id);
        let loss = reconcile::lose_node(node_id, &self.jobs, &self.placeable, self.allocs.values());
        for id in &loss.lost {
            self.stop_alloc(id, index);
            if let Some(record) = self.alloc_mut(id) {
                record.client_state = Some(AllocState {
                    client_status: ClientStatus::Lost,
                    description: format!("node {node_id} stopped answering"),
                    task_states: record
                        .client_state
                        .take()
                        .map(|s| s.task_states)
                        .unwrap_or_default(),
                });
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
        loss.lost
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
        if spec.migrate.checkpoint
            && let Some(record) = self.alloc_mut(&replacement)
        {
            record.alloc = Arc::new(Alloc {
                previous_alloc: Some(PreviousAlloc {
                    alloc_id: alloc_id.to_string(),
                    node_id: from_node.clone(),
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
