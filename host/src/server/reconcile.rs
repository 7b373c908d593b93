//! Reconciliation: what a job's registration, a stop, or a failed alloc does to the job's
//! allocs. Pure functions from plain data (the job, the registered nodes, the current
//! [`AllocRecord`]s) to a [`Plan`]; the caller applies the plan with its own effects (alloc
//! ids, indexes, saving, waking clients). The embedded server calls them under its lock, and
//! a distributed scheduler can call the same functions on what it read from its store. They
//! must not touch a store, a lock or a clock.
//!
//! Rules kept from Nomad's scheduler, each for the reason given:
//! - A job update that changes only the count scales: up adds allocs, down stops the newest
//!   (the oldest have proven themselves). A change of the runner alone (a new build or a new
//!   path; with `[job.update] carry_checkpoint`, of the tasks' config and the meta too)
//!   upgrades the running allocs in place: same ids, new version, their client carries each
//!   runner's checkpoint over (Nomad would replace them; a runner's state is worth keeping).
//!   Any other change replaces every alloc, since what they were given no longer matches the
//!   job. Both bump the job's version.
//! - Registering a stopped job starts it again with new allocs (a new version): its old ones
//!   were asked to stop and may be gone.
//! - Stopping a job sets desired status `stop` on its allocs; the client kills them and
//!   reports them terminal. Nothing here deletes an alloc, so nothing is dropped that a client
//!   still runs (deleting terminal ones is [`super::gc`]'s).
//! - A failed alloc is replaced by a new one under its job's reschedule policy (a service
//!   job's default: a few an hour, each after a growing delay; a batch job's: none), so a
//!   crash-looping runner neither spins nor churns for ever. The delay is carried by the new
//!   alloc, whose client starts it no earlier: no timer lives in the server. Only an alloc of
//!   the job's current version that was still wanted is replaced: a deploy or a stop already
//!   took care of the others.
//! - Only wanted allocs (desired to run, not terminal, not replaced) count toward the job's
//!   count, so a stopping or failed alloc never hides a missing one.
//! - When a node goes down (its lease expired in a cluster; no watch for `node_ttl` for a
//!   single agent), every alloc on it that is not terminal is lost and asked to stop, so that
//!   its node kills it if it comes back; each one its job still wanted is replaced on a live
//!   node, batch or service, without using a restart (its runner did not fail). A batch alloc
//!   that completed stays complete. An alloc of a job with `[job.disconnect]` is `unknown`
//!   instead, with a stand-in, until its node returns or `lost_after` passes.

use super::placement::{Ask, Nodes, Placer};
use super::records::{AllocRecord, JobRecord};
use crate::model::disconnect::Reconcile;
use crate::model::jobspec::{JobSpec, JobType};
use crate::model::reschedule::{Decision, ReschedulePolicy};
use crate::model::structs::{ClientStatus, DesiredStatus, Reschedule, Task};
use std::collections::BTreeMap;

/// What to do to a job's allocs. Applied in field order: stops, then replacements, then
/// upgrades, then new allocs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Allocs to ask to stop (desired status `stop`).
    pub stop: Vec<String>,
    /// Failed allocs to mark replaced; each has its new alloc in `place`.
    pub replace: Vec<String>,
    /// Allocs to upgrade in place to the job's new version: its runner, tasks and meta.
    pub upgrade: Vec<String>,
    /// Allocs to create, one per entry, on that node (`None`: no node yet, placed when one
    /// registers).
    pub place: Vec<Option<String>>,
    /// For a replacement: when it may start and its place in its chain, set on the alloc
    /// `place` creates.
    pub reschedule: Option<Reschedule>,
}

/// What registering a job spec does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPlan {
    /// True when the job did not exist (or had been purged).
    pub created: bool,
    /// What the registration changes for the allocs the job has.
    pub change: JobChange,
    /// The job's version after this registration: new allocs are made for it.
    pub version: u64,
    /// What happens to the job's allocs.
    pub plan: Plan,
}

/// What to do about an alloc whose client reported a new state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replacement {
    /// Nothing: it did not fail, or it is no longer one the job wants replaced.
    NotNeeded,
    /// It failed, and its chain of replacements used the policy's attempts within its
    /// interval: it stays failed.
    LimitReached {
        /// The policy's attempts.
        attempts: u32,
        /// The policy's interval.
        interval: std::time::Duration,
    },
    /// Replace it: the plan marks it replaced and places one new alloc of the job's version.
    Replace(Plan),
}

/// What registering a spec changes for the allocs a job has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobChange {
    /// The job is new (or was purged, or stopped): new allocs.
    Create,
    /// Nothing its allocs carry changed (the count or a policy at most): it scales.
    Same,
    /// Only what a running alloc can be upgraded to changed: the runner, and with
    /// `carry_checkpoint` the tasks' config and the meta. The allocs are upgraded in place.
    InPlace,
    /// Anything else: new allocs replace the old.
    Replace,
}

/// What changes for the allocs of a running job whose spec goes from `old` to `new` (see
/// [`JobChange`]).
pub fn job_change(old: &JobSpec, new: &JobSpec) -> JobChange {
    // What a running alloc cannot take in place; counts and policies aside, since a count
    // scales and a policy applies to the next failure or change, not to what runs.
    let fixed = |spec: &JobSpec, upgradable: bool| {
        let carry = new.update.carry_checkpoint && upgradable;
        JobSpec {
            count: 0,
            reschedule: None,
            update: Default::default(),
            migrate: Default::default(),
            disconnect: None,
            // Where both name their build, the runner's path is only a name for it.
            runner: if upgradable || (old.runner_sha256.is_some() && new.runner_sha256.is_some()) {
                String::new()
            } else {
                spec.runner.clone()
            },
            // A job saved before builds were recorded has none: its build is not a change.
            runner_sha256: if upgradable || old.runner_sha256.is_none() {
                None
            } else {
                spec.runner_sha256.clone()
            },
            tasks: if carry {
                // Which tasks there are is fixed; their config is not.
                spec.tasks.iter().map(|t| Task::named(&t.name)).collect()
            } else {
                spec.tasks.clone()
            },
            meta: if carry { Vec::new() } else { spec.meta.clone() },
            ..spec.clone()
        }
    };
    if fixed(old, false) == fixed(new, false) {
        JobChange::Same
    } else if fixed(old, true) == fixed(new, true) {
        JobChange::InPlace
    } else {
        JobChange::Replace
    }
}

/// Reconciles `spec` with the job as it is: `existing` is the job's record (if any, purged or
/// not), `allocs` every alloc the server holds (all jobs: placement needs each node's load),
/// in a stable order.
pub fn reconcile_job<'a>(
    existing: Option<&JobRecord>,
    spec: &JobSpec,
    nodes: &Nodes,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> JobPlan {
    let allocs: Vec<&AllocRecord> = allocs.into_iter().collect();
    let existing = existing.filter(|job| !job.purged);
    let change = match existing {
        None => JobChange::Create,
        Some(job) if job.stopped => JobChange::Replace,
        Some(job) => job_change(&job.spec, spec),
    };
    let version = match existing {
        Some(job) if change == JobChange::Same => job.version,
        Some(job) => job.version + 1,
        None => 1,
    };
    let mut wanted: Vec<&AllocRecord> = allocs
        .iter()
        .copied()
        .filter(|a| a.alloc.job_id == spec.id && a.is_wanted())
        .collect();
    let mut plan = Plan::default();
    if matches!(change, JobChange::Create | JobChange::Replace) {
        // Every alloc of an older shape goes; new ones take their place.
        plan.stop = wanted.drain(..).map(|a| a.alloc.id.clone()).collect();
    }
    let count = spec.count as usize;
    if wanted.len() > count {
        // Scale down: the newest go.
        wanted.sort_by(|a, b| (a.sequence, &a.alloc.id).cmp(&(b.sequence, &b.alloc.id)));
        plan.stop
            .extend(wanted.split_off(count).iter().map(|a| a.alloc.id.clone()));
    } else {
        plan.place = Placer::new(nodes, allocs).place(Ask {
            stopping: &plan.stop,
            ..Ask::new(spec, count - wanted.len())
        });
    }
    if change == JobChange::InPlace {
        plan.upgrade = wanted.iter().map(|a| a.alloc.id.clone()).collect();
    }
    JobPlan {
        created: existing.is_none(),
        change,
        version,
        plan,
    }
}

/// Stops job `job_id`: every alloc it still wants is asked to stop.
pub fn stop_job<'a>(job_id: &str, allocs: impl IntoIterator<Item = &'a AllocRecord>) -> Plan {
    Plan {
        stop: allocs
            .into_iter()
            .filter(|a| a.alloc.job_id == job_id && a.is_wanted())
            .map(|a| a.alloc.id.clone())
            .collect(),
        ..Plan::default()
    }
}

/// The reschedule policy `job` runs under: its own, or its type's default, in which a
/// service job gets `reschedule_limit` attempts (the agent's `[server] reschedule_limit`).
pub fn reschedule_policy(job: &JobSpec, reschedule_limit: u32) -> Option<ReschedulePolicy> {
    job.reschedule.clone().or_else(|| {
        ReschedulePolicy::default_for(job.job_type == JobType::Service, reschedule_limit)
    })
}

/// Whether `reported`, just updated by its client at `now_unix_ms`, is a failed alloc to
/// replace under its job's reschedule policy (see [`reschedule_policy`]): `job` is its job's
/// record (if any), `allocs` every alloc the server holds (placement needs each node's load).
/// The replacement waits out the policy's delay (its [`Reschedule`]).
pub fn replace_failed<'a>(
    reported: &AllocRecord,
    job: Option<&JobRecord>,
    reschedule_limit: u32,
    now_unix_ms: u64,
    nodes: &Nodes,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> Replacement {
    let failed = reported
        .client_state
        .as_ref()
        .is_some_and(|s| s.client_status == ClientStatus::Failed);
    if !failed || reported.replaced || reported.alloc.desired_status != DesiredStatus::Run {
        return Replacement::NotNeeded;
    }
    let Some(job) = job else {
        return Replacement::NotNeeded;
    };
    if job.stopped || reported.job_version != job.version {
        return Replacement::NotNeeded;
    }
    let Some(policy) = reschedule_policy(&job.spec, reschedule_limit) else {
        return Replacement::NotNeeded;
    };
    if !policy.unlimited && policy.attempts == 0 {
        return Replacement::NotNeeded;
    }
    let history = reported
        .alloc
        .reschedule
        .as_ref()
        .map_or(&[][..], |r| &r.history_unix_ms[..]);
    match policy.decide(history, now_unix_ms) {
        Decision::LimitReached { attempts, interval } => {
            Replacement::LimitReached { attempts, interval }
        }
        Decision::Replace {
            delay,
            attempt,
            history,
        } => Replacement::Replace(Plan {
            replace: vec![reported.alloc.id.clone()],
            place: {
                let allocs: Vec<&AllocRecord> = allocs.into_iter().collect();
                let failed_on = nodes_failed_on(reported, &allocs);
                Placer::new(nodes, allocs).place(Ask {
                    avoid: &failed_on,
                    ..Ask::new(&job.spec, 1)
                })
            },
            reschedule: Some(Reschedule {
                previous_alloc_id: reported.alloc.id.clone(),
                attempt,
                start_after_unix_ms: now_unix_ms
                    .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
                history_unix_ms: history,
            }),
            ..Plan::default()
        }),
    }
}

/// The nodes `failed` and the allocs it replaces (its chain, through each one's
/// `previous_alloc_id`, as far as the server still holds them) ran on: where its replacement
/// should not go again.
fn nodes_failed_on<'r>(failed: &'r AllocRecord, allocs: &[&'r AllocRecord]) -> Vec<&'r str> {
    let by_id: BTreeMap<&str, &AllocRecord> =
        allocs.iter().map(|a| (a.alloc.id.as_str(), *a)).collect();
    let mut nodes = Vec::new();
    let mut next = Some(failed);
    // A chain is as long as the policy's attempts; the bound only guards against a cycle.
    for _ in 0..=allocs.len() {
        let Some(record) = next else { break };
        if let Some(node) = record.node_id.as_deref()
            && !nodes.contains(&node)
        {
            nodes.push(node);
        }
        next = record
            .alloc
            .reschedule
            .as_ref()
            .and_then(|r| by_id.get(r.previous_alloc_id.as_str()).copied());
    }
    nodes
}

/// Whether an unknown alloc whose node returned (`original`) is kept rather than its
/// running `stand_in`, by `rule` (see [`Reconcile`]): `best_score` ranks their nodes as
/// placement would for one more alloc of `job` over `nodes` (a node that is gone or
/// ineligible ranks last); `longest_running` keeps the one whose tasks last started or
/// restarted earlier. Ties keep the original.
pub fn keep_original<'a>(
    rule: Reconcile,
    job: &JobSpec,
    original: &AllocRecord,
    stand_in: &AllocRecord,
    nodes: &'a Nodes,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> bool {
    match rule {
        Reconcile::KeepOriginal => true,
        Reconcile::KeepReplacement => false,
        Reconcile::LongestRunning => {
            // Unknown start: the original by its age, a stand-in as just started.
            let original_since = running_since_unix_ms(original).unwrap_or(0);
            let stand_in_since = running_since_unix_ms(stand_in).unwrap_or(u64::MAX);
            original_since <= stand_in_since
        }
        Reconcile::BestScore => {
            let placer = Placer::new(nodes, allocs);
            let score = |record: &AllocRecord| {
                record
                    .node_id
                    .as_deref()
                    .and_then(|node| placer.score_for(job, node))
            };
            score(original) >= score(stand_in)
        }
    }
}

/// When the alloc's client last reported anything of its tasks (Unix ms): for a failed
/// alloc, when it failed; `None` when its client reported no event.
pub fn last_event_unix_ms(record: &AllocRecord) -> Option<u64> {
    let states = record.client_state.as_ref().map(|s| &s.task_states[..]);
    states
        .unwrap_or_default()
        .iter()
        .flat_map(|task| &task.events)
        .map(|event| event.time_unix_ms)
        .max()
}

/// Since when the alloc's tasks have run without a restart (Unix ms): its tasks' last
/// `Started` or `Restarting` event; `None` when its client reported none.
fn running_since_unix_ms(record: &AllocRecord) -> Option<u64> {
    let states = record.client_state.as_ref().map(|s| &s.task_states[..]);
    states
        .unwrap_or_default()
        .iter()
        .flat_map(|task| &task.events)
        .filter(|event| event.kind == "Started" || event.kind == "Restarting")
        .map(|event| event.time_unix_ms)
        .max()
}

/// How many allocs `job` lacks when a new leader takes over: its count, less every alloc of
/// its current version still desired to run and not replaced, whatever its client state. A
/// deploy its predecessor was cut short in left fewer; a failed alloc the takeover did not
/// replace (its reschedule limit reached, or no policy) and a batch alloc that completed
/// keep their places, so neither is placed again.
pub fn missing_at_takeover<'a>(
    job: &JobRecord,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> usize {
    if job.stopped || job.purged {
        return 0;
    }
    let present = allocs
        .into_iter()
        .filter(|a| a.alloc.job_id == job.spec.id && a.job_version == job.version)
        .filter(|a| a.alloc.desired_status == DesiredStatus::Run && !a.replaced)
        .count();
    (job.spec.count as usize).saturating_sub(present)
}

/// What a node's death does to the allocs it held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NodeLoss {
    /// Allocs that were not terminal on the node: now lost, and asked to stop.
    pub lost: Vec<String>,
    /// Per job, the lost allocs to mark replaced (`replace`) and their new allocs (`place`).
    pub replacements: Vec<(String, Plan)>,
    /// Allocs of jobs with a `[job.disconnect]` block: now unknown, left to run, until the
    /// node returns or their `lost_after` passes.
    pub unknown: Vec<String>,
    /// Per job, the unknown allocs to stand in for (`replace`) and their stand-ins
    /// (`place`, in the same order), for jobs whose block says `replace`.
    pub stand_ins: Vec<(String, Plan)>,
}

/// Decides what `node_id` going down does: `jobs` by id, `live_nodes` the nodes still up
/// (replacements go there), `allocs` every alloc in a stable order.
pub fn lose_node<'a>(
    node_id: &str,
    jobs: &BTreeMap<String, JobRecord>,
    live_nodes: &Nodes,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> NodeLoss {
    let allocs: Vec<&AllocRecord> = allocs.into_iter().collect();
    let on_node: Vec<&AllocRecord> = allocs
        .iter()
        .copied()
        .filter(|a| a.node_id.as_deref() == Some(node_id) && !a.is_terminal())
        // Already unknown (a node down again at a new leader's takeover): its `lost_after`
        // runs on from when its node first went silent.
        .filter(|a| {
            a.client_state
                .as_ref()
                .is_none_or(|s| s.client_status != ClientStatus::Unknown)
        })
        .collect();
    // Per job, the lost allocs to replace in one plan; a replacement of a failed alloc gets a
    // plan of its own, which carries its reschedule record to the alloc that takes its place:
    // its node's loss is no failure of its own, so its wait and its chain go on unchanged.
    type Group<'r> = (Vec<String>, Option<&'r Reschedule>);
    let mut to_replace: BTreeMap<(&str, Option<&str>), Group> = BTreeMap::new();
    let mut unknown = Vec::new();
    let mut to_stand_in: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for alloc in on_node.iter().filter(|a| a.is_wanted()) {
        let job = jobs
            .get(&alloc.alloc.job_id)
            .filter(|job| !job.purged && !job.stopped && job.version == alloc.job_version);
        if let Some(disconnect) = job.and_then(|job| job.spec.disconnect) {
            unknown.push(alloc.alloc.id.clone());
            if disconnect.replace {
                let group = to_stand_in.entry(alloc.alloc.job_id.as_str()).or_default();
                group.push(alloc.alloc.id.clone());
            }
        } else if job.is_some() {
            let reschedule = alloc.alloc.reschedule.as_ref();
            let key = (
                alloc.alloc.job_id.as_str(),
                reschedule.map(|r| r.previous_alloc_id.as_str()),
            );
            let group = to_replace.entry(key).or_insert((Vec::new(), reschedule));
            group.0.push(alloc.alloc.id.clone());
        }
    }
    // Each job's new allocs count toward the load the next job's are placed by.
    let mut placer = Placer::new(live_nodes, allocs.iter().copied());
    let mut replacements = Vec::new();
    for ((job_id, _), (replace, reschedule)) in to_replace {
        let Some(job) = jobs.get(job_id) else {
            continue;
        };
        let place = placer.place(Ask::new(&job.spec, replace.len()));
        replacements.push((
            job_id.to_string(),
            Plan {
                replace,
                place,
                reschedule: reschedule.cloned(),
                ..Plan::default()
            },
        ));
    }
    let mut stand_ins = Vec::new();
    for (job_id, replace) in to_stand_in {
        let Some(job) = jobs.get(job_id) else {
            continue;
        };
        let place = placer.place(Ask::new(&job.spec, replace.len()));
        stand_ins.push((
            job_id.to_string(),
            Plan {
                replace,
                place,
                ..Plan::default()
            },
        ));
    }
    NodeLoss {
        lost: on_node
            .iter()
            .map(|a| a.alloc.id.clone())
            .filter(|id| !unknown.contains(id))
            .collect(),
        replacements,
        unknown,
        stand_ins,
    }
}

#[cfg(test)]
mod reconnect_tests;
#[cfg(test)]
mod tests;
