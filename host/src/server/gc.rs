//! Server-side garbage collection: which terminal allocs and purged jobs the server may
//! forget. Pure functions over plain data (the jobs, the current [`AllocRecord`]s and the
//! time `now` the caller passes in); the caller removes what they name and saves the
//! removal. They must not touch a store, a lock or a clock.
//!
//! Invariants, each for the reason given:
//! - Only terminal allocs are ever collected: a client may still run any other, and a server
//!   that forgot it could not tell the client to stop it.
//! - A terminal alloc is collectable when its job is stopped or is a batch job whose allocs
//!   have all finished, or when it was itself stopped or replaced (a scale-down, a deploy, a
//!   failed service alloc), so server state does not grow with every deploy. The allocs of a
//!   running service job that are still wanted stay: they are the job.
//! - Collection waits `job_gc_threshold` after the alloc turned terminal (or none when
//!   forced), so an operator can still read what happened.
//! - A purged job goes when its last alloc does, never before: its allocs still name it.

use super::records::{AllocRecord, JobRecord};
use crate::model::jobspec::JobType;
use crate::model::structs::DesiredStatus;
use crate::util::determinism::HashSet;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;

/// The ids of the allocs to collect at `now`, in the order given: those eligible (see the
/// module docs) and terminal for at least `threshold`, or all eligible ones when `force`.
pub fn collectable_allocs<'a>(
    jobs: &BTreeMap<String, JobRecord>,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
    now: Instant,
    threshold: Duration,
    force: bool,
) -> Vec<String> {
    let allocs: Vec<&AllocRecord> = allocs.into_iter().collect();
    // One pass over the allocs, not one per job: a server with many batch jobs and many
    // allocs would otherwise pay jobs x allocs on every GC tick.
    let jobs_still_running: HashSet<&str> = allocs
        .iter()
        .filter(|a| !a.is_terminal())
        .map(|a| a.alloc.job_id.as_str())
        .collect();
    let finished_jobs: HashSet<&str> = jobs
        .iter()
        .filter(|(id, job)| {
            job.stopped
                || (job.spec.job_type == JobType::Batch
                    && !jobs_still_running.contains(id.as_str()))
        })
        .map(|(id, _)| id.as_str())
        .collect();
    allocs
        .iter()
        .filter(|a| {
            finished_jobs.contains(a.alloc.job_id.as_str())
                || a.replaced
                || a.alloc.desired_status != DesiredStatus::Run
        })
        .filter(|a| a.is_terminal())
        .filter(|a| {
            force
                || a.terminal_since
                    .is_some_and(|since| now.duration_since(since) >= threshold)
        })
        .map(|a| a.alloc.id.clone())
        .collect()
}

/// The purged jobs with no alloc left: they can go now.
pub fn empty_purged_jobs<'a>(
    jobs: &BTreeMap<String, JobRecord>,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> Vec<String> {
    let with_allocs: BTreeSet<&str> = allocs
        .into_iter()
        .map(|a| a.alloc.job_id.as_str())
        .collect();
    jobs.iter()
        .filter(|(id, job)| job.purged && !with_allocs.contains(id.as_str()))
        .map(|(id, _)| id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::structs::ClientStatus;
    use crate::server::testkit::{alloc_on, job, reported, spec, stopping};

    const THRESHOLD: Duration = Duration::from_secs(60);

    fn jobs(records: impl IntoIterator<Item = JobRecord>) -> BTreeMap<String, JobRecord> {
        records
            .into_iter()
            .map(|job| (job.spec.id.clone(), job))
            .collect()
    }

    fn complete(record: AllocRecord, since: Instant) -> AllocRecord {
        reported(record, ClientStatus::Complete, since)
    }

    #[test]
    fn terminal_allocs_of_a_stopped_job_go_after_the_threshold_and_running_ones_never() {
        let since = Instant::now();
        let jobs = jobs([JobRecord {
            stopped: true,
            ..job(spec("web", JobType::Service, 2), 1)
        }]);
        let allocs = [
            complete(stopping(alloc_on("web", 1, Some("n1"))), since),
            stopping(alloc_on("web", 2, Some("n1"))),
        ];
        let at = |elapsed| since + elapsed;
        assert!(collectable_allocs(&jobs, &allocs, at(THRESHOLD / 2), THRESHOLD, false).is_empty());
        assert_eq!(
            collectable_allocs(&jobs, &allocs, at(THRESHOLD), THRESHOLD, false),
            ["web-1"]
        );
        assert_eq!(
            collectable_allocs(&jobs, &allocs, since, THRESHOLD, true),
            ["web-1"],
            "forced: at once, and still never the one not terminal"
        );
    }

    #[test]
    fn a_batch_job_is_finished_only_when_all_its_allocs_are() {
        let since = Instant::now();
        let later = since + THRESHOLD;
        let jobs = jobs([job(spec("once", JobType::Batch, 2), 1)]);
        let done = complete(alloc_on("once", 1, Some("n1")), since);
        let running = alloc_on("once", 2, Some("n1"));
        assert!(
            collectable_allocs(&jobs, [&done, &running], later, THRESHOLD, false).is_empty(),
            "one still runs: the job is not finished"
        );
        let both = [done, complete(running, since)];
        assert_eq!(
            collectable_allocs(&jobs, &both, later, THRESHOLD, false),
            ["once-1", "once-2"]
        );
    }

    #[test]
    fn a_batch_job_still_running_does_not_hold_back_another_that_finished() {
        let since = Instant::now();
        let jobs = jobs([
            job(spec("done", JobType::Batch, 1), 1),
            job(spec("busy", JobType::Batch, 1), 1),
        ]);
        let allocs = [
            complete(alloc_on("done", 1, Some("n1")), since),
            alloc_on("busy", 1, Some("n1")),
        ];
        assert_eq!(
            collectable_allocs(&jobs, &allocs, since, THRESHOLD, true),
            ["done-1"]
        );
    }

    #[test]
    fn a_running_service_keeps_its_wanted_allocs_and_loses_stopped_and_replaced_ones() {
        let since = Instant::now();
        let jobs = jobs([job(spec("web", JobType::Service, 1), 2)]);
        let allocs = [
            complete(alloc_on("web", 1, Some("n1")), since),
            complete(stopping(alloc_on("web", 2, Some("n1"))), since),
            AllocRecord {
                replaced: true,
                ..reported(alloc_on("web", 3, Some("n1")), ClientStatus::Failed, since)
            },
        ];
        assert_eq!(
            collectable_allocs(&jobs, &allocs, since, THRESHOLD, true),
            ["web-2", "web-3"]
        );
    }

    #[test]
    fn a_purged_job_goes_with_its_last_alloc() {
        let purged = |id| JobRecord {
            stopped: true,
            purged: true,
            ..job(spec(id, JobType::Service, 1), 1)
        };
        let jobs = jobs([
            purged("empty"),
            purged("busy"),
            job(spec("kept", JobType::Service, 0), 1),
        ]);
        let allocs = [stopping(alloc_on("busy", 1, Some("n1")))];
        assert_eq!(empty_purged_jobs(&jobs, &allocs), ["empty"]);
    }
}
