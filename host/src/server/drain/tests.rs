//! Drain steps as tables: a node's allocs in, what moves out.

use super::*;
use crate::model::structs::{Alloc, AllocState, PreviousAlloc};
use crate::server::testkit::{alloc_on, job, spec, terminal};
use std::sync::Arc;

fn drain(deadline_unix_ms: Option<u64>) -> Drain {
    Drain {
        started_unix_ms: 0,
        deadline_unix_ms,
        ignore_system: false,
    }
}

fn jobs() -> BTreeMap<String, JobRecord> {
    BTreeMap::from([
        ("web".to_string(), job(spec("web", JobType::Service, 3), 1)),
        ("api".to_string(), job(spec("api", JobType::Service, 1), 1)),
        ("etl".to_string(), job(spec("etl", JobType::Batch, 1), 1)),
    ])
}

fn ids(step: &DrainStep) -> Vec<&str> {
    step.migrate.iter().map(String::as_str).collect()
}

#[test]
fn one_alloc_per_service_job_moves_at_a_time_and_batch_allocs_wait_for_the_deadline() {
    let allocs = [
        alloc_on("web", 1, Some("n1")),
        alloc_on("web", 2, Some("n1")),
        alloc_on("api", 3, Some("n1")),
        alloc_on("etl", 4, Some("n1")),
        alloc_on("web", 5, Some("n2")),
    ];
    let step = drain_step("n1", &drain(Some(10_000)), &jobs(), &allocs, 5_000);
    assert_eq!(
        ids(&step),
        ["web-1", "api-3"],
        "the oldest of each service job"
    );
    assert_eq!(
        (step.done, step.left, step.past_deadline),
        (false, 4, false)
    );

    let step = drain_step("n1", &drain(Some(10_000)), &jobs(), &allocs, 10_000);
    assert_eq!(
        ids(&step),
        ["web-1", "web-2", "api-3", "etl-4"],
        "at the deadline everything left goes"
    );
    assert!(step.past_deadline);
}

#[test]
fn the_next_alloc_of_a_job_waits_until_the_last_ones_replacement_runs() {
    let evicted = AllocRecord {
        replaced: true,
        alloc: Arc::new(Alloc {
            desired_status: DesiredStatus::Evict,
            ..Alloc::clone(&alloc_on("web", 1, Some("n1")).alloc)
        }),
        ..alloc_on("web", 1, Some("n1"))
    };
    let arriving = AllocRecord {
        alloc: Arc::new(Alloc {
            previous_alloc: Some(PreviousAlloc {
                alloc_id: "web-1".into(),
                node_id: "n1".into(),
                checkpoint: true,
            }),
            ..Alloc::clone(&alloc_on("web", 3, Some("n2")).alloc)
        }),
        ..alloc_on("web", 3, Some("n2"))
    };
    let second = alloc_on("web", 2, Some("n1"));
    let step = drain_step(
        "n1",
        &drain(None),
        &jobs(),
        [&evicted, &second, &arriving],
        0,
    );
    assert!(step.migrate.is_empty(), "web-1 is still stopping");

    let stopped = terminal(evicted.clone());
    let step = drain_step(
        "n1",
        &drain(None),
        &jobs(),
        [&stopped, &second, &arriving],
        0,
    );
    assert!(step.migrate.is_empty(), "its replacement does not run yet");

    let running = AllocRecord {
        client_state: Some(AllocState {
            client_status: ClientStatus::Running,
            description: String::new(),
            task_states: Default::default(),
        }),
        ..arriving.clone()
    };
    let step = drain_step(
        "n1",
        &drain(None),
        &jobs(),
        [&stopped, &second, &running],
        0,
    );
    assert_eq!(ids(&step), ["web-2"]);
}

#[test]
fn a_drain_is_done_when_nothing_on_the_node_runs_and_stopped_jobs_are_not_moved() {
    let mut jobs = jobs();
    jobs.get_mut("api").unwrap().stopped = true;
    let allocs = [
        terminal(alloc_on("web", 1, Some("n1"))),
        alloc_on("api", 2, Some("n1")),
    ];
    let step = drain_step("n1", &drain(None), &jobs, &allocs, 0);
    assert!(
        step.migrate.is_empty(),
        "a stopped job's alloc is left to stop"
    );
    assert!(!step.done);
    let step = drain_step("n1", &drain(None), &jobs, &allocs[..1], 0);
    assert!(step.done);
    assert_eq!(step.left, 0);
}
