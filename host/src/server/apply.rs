//! Applying the scheduler's decisions to the server's state: each method takes the state as
//! the server's lock holds it, asks the pure functions ([`super::reconcile`],
//! [`super::placement`], [`super::gc`]) what to do, and makes it so (alloc ids, sequence
//! numbers, modify indexes). It must not save, wake anyone or read a clock other than to
//! stamp a terminal alloc: that is [`super::EmbeddedServer`]'s.
//!
//! A node's loss and return are in `node_loss`, drains in `drains`.

use super::reconcile::{self, JobPlan, Plan, Replacement};
use super::records::{AllocRecord, JobRecord};
use super::{Registration, State, gc, placement};
use crate::model::jobspec::JobSpec;
use crate::model::structs::{Alloc, AllocState, ClientStatus, DesiredStatus, Reschedule};
use crate::rpc::AllocUpdate;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::time::Instant;

mod drains;
mod node_loss;

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
            restart: spec.restart.clone(),
            runner_sha256: spec.runner_sha256.clone(),
            ..Alloc::new(
                crate::util::determinism::new_id(),
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
        reschedule_limit: u32,
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
                    self.replace_if_failed(&update.alloc_id, reschedule_limit, now_unix_ms, index);
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
            self.replace_if_failed(&update.alloc_id, reschedule_limit, now_unix_ms, index);
        }
        accepted
    }

    /// Replaces a failed alloc that failed at `now_unix_ms`, as its job's reschedule policy
    /// says (see [`reconcile::replace_failed`]).
    pub(super) fn replace_if_failed(
        &mut self,
        alloc_id: &str,
        reschedule_limit: u32,
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
            reschedule_limit,
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
                    "not replacing failed allocation: reschedule limit reached"
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
        // The replacement as a span of its own, for the OTLP export (never entered: the line
        // above stays as it is).
        drop(
            tracing::info_span!("alloc.reschedule", job = %spec.id, alloc_id, replacement, attempt),
        );
    }

    pub(super) fn remove_empty_purged_jobs(&mut self) {
        for job_id in gc::empty_purged_jobs(&self.jobs, self.allocs.values()) {
            self.remove_job(&job_id);
        }
    }

    /// What a takeover completes (see `EmbeddedServer::complete_deploys`): each failed,
    /// unreplaced alloc decided by its job's reschedule policy at the time it failed, then
    /// each job's missing allocs placed. Returns how many allocs were placed.
    pub(super) fn complete_takeover(
        &mut self,
        reschedule_limit: u32,
        now_unix_ms: u64,
        index: u64,
    ) -> usize {
        let before = self.allocs.len();
        // A replacement that landed without its predecessor's mark (a save split over
        // transactions, cut between them): the mark is made, not a second replacement.
        let replaced_by_another: BTreeSet<String> = self
            .allocs
            .values()
            .filter_map(|a| Some(a.alloc.reschedule.as_ref()?.previous_alloc_id.clone()))
            .collect();
        let failed: Vec<(String, u64)> = self
            .allocs
            .values()
            .filter(|a| {
                a.client_state
                    .as_ref()
                    .is_some_and(|s| s.client_status == ClientStatus::Failed)
            })
            .filter(|a| a.alloc.desired_status == DesiredStatus::Run && !a.replaced)
            .map(|a| {
                // When it failed, not now: a limit reached stays reached at every
                // takeover, however much later.
                let failed_at = reconcile::last_event_unix_ms(a).unwrap_or(now_unix_ms);
                (a.alloc.id.clone(), failed_at.min(now_unix_ms))
            })
            .collect();
        for (alloc_id, failed_at) in failed {
            if replaced_by_another.contains(&alloc_id) {
                if let Some(record) = self.alloc_mut(&alloc_id) {
                    record.replaced = true;
                }
                continue;
            }
            self.replace_if_failed(&alloc_id, reschedule_limit, failed_at, index);
        }
        let job_ids: Vec<String> = self.jobs.keys().cloned().collect();
        for job_id in &job_ids {
            self.fill_missing(job_id, index);
        }
        self.allocs.len() - before
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
