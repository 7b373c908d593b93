//! Reconciliation: what a job's registration, a stop, or a failed alloc does to the job's
//! allocs. Pure functions from plain data (the job, the registered nodes, the current
//! [`AllocRecord`]s) to a [`Plan`]; the caller applies the plan with its own effects (alloc
//! ids, indexes, saving, waking clients). The embedded server calls them under its lock, and
//! a distributed scheduler can call the same functions on what it read from its store. They
//! must not touch a store, a lock or a clock.
//!
//! Rules kept from Nomad's scheduler, each for the reason given:
//! - A job update that changes only the count scales: up adds allocs, down stops the newest
//!   (the oldest have proven themselves). Any other change replaces every alloc, since their
//!   runner or config no longer matches the job, and bumps the job's version.
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
//! - When a node goes down (cluster mode), every alloc on it that is not terminal is lost and
//!   asked to stop, so that its node kills it if it comes back; each one its job still wanted
//!   is replaced on a live node, batch or service, without using a restart (its runner did
//!   not fail). A batch alloc that completed stays complete.

use super::placement::{node_load, place};
use super::records::{AllocRecord, JobRecord};
use crate::jobspec::{JobSpec, JobType};
use crate::reschedule::{Decision, ReschedulePolicy};
use crate::structs::{ClientStatus, DesiredStatus, Reschedule};
use std::collections::{BTreeMap, BTreeSet};

/// What to do to a job's allocs. Applied in field order: stops, then replacements, then new
/// allocs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Allocs to ask to stop (desired status `stop`).
    pub stop: Vec<String>,
    /// Failed allocs to mark replaced; each has its new alloc in `place`.
    pub replace: Vec<String>,
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

/// True when two specs produce the same allocs, counts and reschedule policies aside (a
/// policy applies to the next failure, not to what runs).
pub fn same_allocs(old: &JobSpec, new: &JobSpec) -> bool {
    JobSpec {
        count: 0,
        reschedule: None,
        ..old.clone()
    } == JobSpec {
        count: 0,
        reschedule: None,
        ..new.clone()
    }
}

/// Reconciles `spec` with the job as it is: `existing` is the job's record (if any, purged or
/// not), `allocs` every alloc the server holds (all jobs: placement needs each node's load),
/// in a stable order.
pub fn reconcile_job<'a>(
    existing: Option<&JobRecord>,
    spec: &JobSpec,
    nodes: &BTreeSet<String>,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> JobPlan {
    let allocs: Vec<&AllocRecord> = allocs.into_iter().collect();
    let existing = existing.filter(|job| !job.purged);
    let same_shape = existing.is_some_and(|job| !job.stopped && same_allocs(&job.spec, spec));
    let version = match existing {
        Some(job) if same_shape => job.version,
        Some(job) => job.version + 1,
        None => 1,
    };
    let mut wanted: Vec<&AllocRecord> = allocs
        .iter()
        .copied()
        .filter(|a| a.alloc.job_id == spec.id && a.is_wanted())
        .collect();
    let mut plan = Plan::default();
    if !same_shape {
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
        plan.place = place(&node_load(nodes, allocs), count - wanted.len());
    }
    JobPlan {
        created: existing.is_none(),
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
/// service job gets `restart_limit` attempts (the agent's `[server] restart_limit`).
pub fn reschedule_policy(job: &JobSpec, restart_limit: u32) -> Option<ReschedulePolicy> {
    job.reschedule
        .or_else(|| ReschedulePolicy::default_for(job.job_type == JobType::Service, restart_limit))
}

/// Whether `reported`, just updated by its client at `now_unix_ms`, is a failed alloc to
/// replace under its job's reschedule policy (see [`reschedule_policy`]): `job` is its job's
/// record (if any), `allocs` every alloc the server holds (placement needs each node's load).
/// The replacement waits out the policy's delay (its [`Reschedule`]).
pub fn replace_failed<'a>(
    reported: &AllocRecord,
    job: Option<&JobRecord>,
    restart_limit: u32,
    now_unix_ms: u64,
    nodes: &BTreeSet<String>,
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
    let Some(policy) = reschedule_policy(&job.spec, restart_limit) else {
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
            place: place(&node_load(nodes, allocs), 1),
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

/// How many allocs `job` lacks when a new leader takes over: its count, less every alloc of
/// its current version still desired to run and not replaced, whatever its client state. A
/// deploy its predecessor was cut short in left fewer; a failed alloc past the restart limit
/// and a batch alloc that completed keep their places, so neither is placed again.
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
}

/// Decides what `node_id` going down does: `jobs` by id, `live_nodes` the nodes still up
/// (replacements go there), `allocs` every alloc in a stable order.
pub fn lose_node<'a>(
    node_id: &str,
    jobs: &BTreeMap<String, JobRecord>,
    live_nodes: &BTreeSet<String>,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> NodeLoss {
    let allocs: Vec<&AllocRecord> = allocs.into_iter().collect();
    let on_node: Vec<&AllocRecord> = allocs
        .iter()
        .copied()
        .filter(|a| a.node_id.as_deref() == Some(node_id) && !a.is_terminal())
        .collect();
    // Per job, the lost allocs to replace in one plan; a replacement of a failed alloc gets a
    // plan of its own, which carries its reschedule record to the alloc that takes its place:
    // its node's loss is no failure of its own, so its wait and its chain go on unchanged.
    type Group<'r> = (Vec<String>, Option<&'r Reschedule>);
    let mut to_replace: BTreeMap<(&str, Option<&str>), Group> = BTreeMap::new();
    for alloc in on_node.iter().filter(|a| a.is_wanted()) {
        let current = jobs
            .get(&alloc.alloc.job_id)
            .is_some_and(|job| !job.purged && !job.stopped && job.version == alloc.job_version);
        if current {
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
    let mut load = node_load(live_nodes, allocs.iter().copied());
    let mut replacements = Vec::new();
    for ((job_id, _), (replace, reschedule)) in to_replace {
        let place = place(&load, replace.len());
        for node in place.iter().flatten() {
            *load.entry(node.clone()).or_default() += 1;
        }
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
    NodeLoss {
        lost: on_node.iter().map(|a| a.alloc.id.clone()).collect(),
        replacements,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::testkit::{alloc_on, failed, job, spec, stopping, terminal};
    use crate::structs::Alloc;
    use std::sync::Arc;

    fn ids(allocs: &[AllocRecord], sequences: &[u64]) -> Vec<String> {
        sequences
            .iter()
            .map(|seq| allocs[*seq as usize - 1].alloc.id.clone())
            .collect()
    }

    fn one_node() -> BTreeSet<String> {
        BTreeSet::from(["n1".to_string()])
    }

    #[test]
    fn a_new_job_places_its_count_at_version_one() {
        let plan = reconcile_job(None, &spec("web", JobType::Service, 2), &one_node(), []);
        assert!(plan.created);
        assert_eq!(plan.version, 1);
        assert_eq!(plan.plan.place, [Some("n1".into()), Some("n1".into())]);
        assert!(plan.plan.stop.is_empty());
    }

    #[test]
    fn scaling_up_adds_allocs_and_keeps_the_version() {
        let current = job(spec("web", JobType::Service, 2), 3);
        let allocs = [
            alloc_on("web", 1, Some("n1")),
            alloc_on("web", 2, Some("n1")),
        ];
        let plan = reconcile_job(
            Some(&current),
            &spec("web", JobType::Service, 4),
            &one_node(),
            &allocs,
        );
        assert!(!plan.created);
        assert_eq!(plan.version, 3);
        assert_eq!(plan.plan.place.len(), 2);
        assert!(plan.plan.stop.is_empty());
    }

    #[test]
    fn scaling_down_stops_the_newest_and_counts_only_wanted_allocs() {
        let current = job(spec("web", JobType::Service, 4), 1);
        // Sequence 2 is already stopping and 3 is terminal: neither counts, neither is stopped
        // again.
        let allocs = [
            alloc_on("web", 1, Some("n1")),
            stopping(alloc_on("web", 2, Some("n1"))),
            terminal(alloc_on("web", 3, Some("n1"))),
            alloc_on("web", 4, Some("n1")),
            alloc_on("web", 5, Some("n1")),
            alloc_on("other", 6, Some("n1")),
        ];
        let plan = reconcile_job(
            Some(&current),
            &spec("web", JobType::Service, 1),
            &one_node(),
            &allocs,
        );
        assert_eq!(plan.plan.stop, ids(&allocs, &[4, 5]));
        assert!(plan.plan.place.is_empty());
        assert_eq!(plan.version, 1);
    }

    #[test]
    fn any_other_change_replaces_every_alloc_and_bumps_the_version() {
        let current = job(spec("web", JobType::Service, 2), 1);
        let allocs = [
            alloc_on("web", 1, Some("n1")),
            alloc_on("web", 2, Some("n1")),
        ];
        let changed = JobSpec {
            runner: "other.wasm".into(),
            ..spec("web", JobType::Service, 1)
        };
        let plan = reconcile_job(Some(&current), &changed, &one_node(), &allocs);
        assert_eq!(plan.version, 2);
        assert_eq!(plan.plan.stop, ids(&allocs, &[1, 2]));
        assert_eq!(plan.plan.place.len(), 1, "the new count, all new");
    }

    #[test]
    fn registering_a_stopped_job_starts_it_at_a_new_version() {
        let mut current = job(spec("web", JobType::Service, 1), 1);
        current.stopped = true;
        let allocs = [stopping(alloc_on("web", 1, Some("n1")))];
        let plan = reconcile_job(
            Some(&current),
            &spec("web", JobType::Service, 1),
            &one_node(),
            &allocs,
        );
        assert!(!plan.created);
        assert_eq!(plan.version, 2);
        assert_eq!(plan.plan.place.len(), 1);
        assert!(plan.plan.stop.is_empty(), "already asked to stop");
    }

    #[test]
    fn a_purged_job_is_created_anew() {
        let mut current = job(spec("web", JobType::Service, 1), 5);
        current.purged = true;
        let plan = reconcile_job(
            Some(&current),
            &spec("web", JobType::Service, 1),
            &one_node(),
            [],
        );
        assert!(plan.created);
        assert_eq!(plan.version, 1);
    }

    #[test]
    fn stopping_a_job_asks_every_wanted_alloc_to_stop_and_deletes_nothing() {
        let allocs = [
            alloc_on("web", 1, Some("n1")),
            terminal(alloc_on("web", 2, Some("n1"))),
            alloc_on("web", 3, None),
            alloc_on("other", 4, Some("n1")),
        ];
        let plan = stop_job("web", &allocs);
        assert_eq!(plan.stop, ids(&allocs, &[1, 3]));
        assert!(plan.replace.is_empty() && plan.place.is_empty());
    }

    #[test]
    fn a_failed_service_alloc_is_replaced_after_a_delay_until_its_chain_runs_out() {
        let current = job(spec("web", JobType::Service, 1), 1);
        let first = failed(alloc_on("web", 1, Some("n1")));
        let now = 1_000_000;
        let decide = |alloc: &AllocRecord, at: u64| {
            replace_failed(alloc, Some(&current), 2, at, &one_node(), [alloc])
        };
        let Replacement::Replace(plan) = decide(&first, now) else {
            panic!("the first failure is replaced");
        };
        assert_eq!(
            (plan.replace.clone(), plan.place.clone()),
            (
                ids(std::slice::from_ref(&first), &[1]),
                vec![Some("n1".into())]
            )
        );
        let reschedule = plan.reschedule.clone().unwrap();
        assert_eq!(
            reschedule,
            Reschedule {
                previous_alloc_id: first.alloc.id.clone(),
                attempt: 1,
                start_after_unix_ms: now + 5_000,
                history_unix_ms: vec![now],
            },
            "5 s later, the service default's first delay"
        );
        // The replacement fails in turn: its chain goes on, twice as slow.
        let second = AllocRecord {
            alloc: Arc::new(Alloc {
                reschedule: Some(reschedule),
                ..Alloc::clone(&first.alloc)
            }),
            ..first.clone()
        };
        let Replacement::Replace(plan) = decide(&second, now + 10_000) else {
            panic!("the second failure is replaced");
        };
        let reschedule = plan.reschedule.unwrap();
        assert_eq!(
            (reschedule.attempt, reschedule.start_after_unix_ms),
            (2, now + 10_000 + 10_000)
        );
        let third = AllocRecord {
            alloc: Arc::new(Alloc {
                reschedule: Some(reschedule),
                ..Alloc::clone(&first.alloc)
            }),
            ..first.clone()
        };
        assert_eq!(
            decide(&third, now + 30_000),
            Replacement::LimitReached {
                attempts: 2,
                interval: std::time::Duration::from_secs(3600)
            },
            "two replacements within the hour: no third"
        );
    }

    #[test]
    fn only_a_wanted_failed_alloc_of_the_current_service_version_is_replaced() {
        let service = job(spec("web", JobType::Service, 1), 2);
        let of_version_2 = |record: AllocRecord| AllocRecord {
            job_version: 2,
            ..record
        };
        let current = of_version_2(failed(alloc_on("web", 1, Some("n1"))));
        let stopped_job = JobRecord {
            stopped: true,
            ..service.clone()
        };
        let batch = job(spec("web", JobType::Batch, 1), 2);
        let cases = [
            (
                "that completed",
                of_version_2(terminal(alloc_on("web", 1, Some("n1")))),
                &service,
            ),
            (
                "of an older version",
                failed(alloc_on("web", 1, Some("n1"))),
                &service,
            ),
            (
                "already replaced",
                AllocRecord {
                    replaced: true,
                    ..current.clone()
                },
                &service,
            ),
            ("asked to stop", stopping(current.clone()), &service),
            ("of a stopped job", current.clone(), &stopped_job),
            (
                "of a batch job without a reschedule block",
                current.clone(),
                &batch,
            ),
        ];
        for (what, alloc, job) in cases {
            assert_eq!(
                replace_failed(&alloc, Some(job), 3, 0, &one_node(), [&alloc]),
                Replacement::NotNeeded,
                "an alloc {what} is not replaced"
            );
        }
        assert!(matches!(
            replace_failed(&current, Some(&service), 3, 0, &one_node(), [&current]),
            Replacement::Replace(_)
        ));
        assert_eq!(
            replace_failed(&current, None, 3, 0, &one_node(), [&current]),
            Replacement::NotNeeded,
            "no job: nothing to replace it with"
        );
    }

    #[test]
    fn a_replacement_lost_with_its_node_keeps_its_wait_and_its_chain() {
        let jobs = BTreeMap::from([("web".to_string(), job(spec("web", JobType::Service, 2), 1))]);
        let waiting = Reschedule {
            previous_alloc_id: "failed-one".into(),
            attempt: 2,
            start_after_unix_ms: 50_000,
            history_unix_ms: vec![10_000, 40_000],
        };
        let mut replacement = alloc_on("web", 1, Some("dead"));
        replacement.alloc = Arc::new(Alloc {
            reschedule: Some(waiting.clone()),
            ..Alloc::clone(&replacement.alloc)
        });
        let allocs = [replacement, alloc_on("web", 2, Some("dead"))];
        let loss = lose_node("dead", &jobs, &one_node(), &allocs);
        let plans: Vec<(Vec<String>, Option<Reschedule>)> = loss
            .replacements
            .into_iter()
            .map(|(_, plan)| (plan.replace, plan.reschedule))
            .collect();
        assert_eq!(
            plans,
            [
                (ids(&allocs, &[2]), None),
                (ids(&allocs, &[1]), Some(waiting)),
            ],
            "no attempt is used, and none is forgotten"
        );
    }

    #[test]
    fn a_lost_node_loses_its_live_allocs_and_they_are_replaced_on_live_nodes() {
        let jobs = BTreeMap::from([
            ("web".to_string(), job(spec("web", JobType::Service, 2), 1)),
            ("once".to_string(), job(spec("once", JobType::Batch, 2), 1)),
        ]);
        let allocs = [
            alloc_on("web", 1, Some("dead")),
            alloc_on("web", 2, Some("n1")),
            terminal(alloc_on("once", 3, Some("dead"))),
            alloc_on("once", 4, Some("dead")),
            stopping(alloc_on("web", 5, Some("dead"))),
        ];
        let loss = lose_node("dead", &jobs, &one_node(), &allocs);
        assert_eq!(
            loss.lost,
            ids(&allocs, &[1, 4, 5]),
            "the complete batch alloc stays complete"
        );
        assert_eq!(
            loss.replacements,
            [
                (
                    "once".to_string(),
                    Plan {
                        replace: ids(&allocs, &[4]),
                        place: vec![Some("n1".into())],
                        ..Plan::default()
                    }
                ),
                (
                    "web".to_string(),
                    Plan {
                        replace: ids(&allocs, &[1]),
                        place: vec![Some("n1".into())],
                        ..Plan::default()
                    }
                ),
            ],
            "the stopping alloc is lost but not replaced"
        );
    }

    #[test]
    fn lost_allocs_of_a_stopped_job_or_an_older_version_are_not_replaced() {
        let mut stopped = job(spec("web", JobType::Service, 1), 1);
        stopped.stopped = true;
        let newer = job(spec("api", JobType::Service, 1), 2);
        let jobs = BTreeMap::from([("web".to_string(), stopped), ("api".to_string(), newer)]);
        let allocs = [
            alloc_on("web", 1, Some("dead")),
            alloc_on("api", 2, Some("dead")),
        ];
        let loss = lose_node("dead", &jobs, &one_node(), &allocs);
        assert_eq!(loss.lost.len(), 2);
        assert!(loss.replacements.is_empty());
    }

    #[test]
    fn a_takeover_fills_only_what_a_deploy_left_out() {
        let web = job(spec("web", JobType::Service, 4), 1);
        let allocs = [
            alloc_on("web", 1, Some("n1")),
            failed(alloc_on("web", 2, Some("n1"))),
            terminal(alloc_on("web", 3, Some("n1"))),
            stopping(alloc_on("web", 4, Some("n1"))),
            AllocRecord {
                replaced: true,
                ..failed(alloc_on("web", 5, Some("n1")))
            },
            alloc_on("other", 6, Some("n1")),
        ];
        assert_eq!(
            missing_at_takeover(&web, &allocs),
            1,
            "failed and completed allocs keep their places; stopping and replaced ones do not"
        );
        let mut stopped = web.clone();
        stopped.stopped = true;
        assert_eq!(missing_at_takeover(&stopped, &allocs), 0);
    }
}
