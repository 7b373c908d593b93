//! Reconciliation's unit tests: plans from plain records, no store, lock or clock.

use super::*;
use crate::model::jobspec::UpdatePolicy;
use crate::model::structs::Alloc;
use crate::server::testkit::{alloc_on, failed, job, nodes, spec, stopping, terminal};
use std::sync::Arc;

fn ids(allocs: &[AllocRecord], sequences: &[u64]) -> Vec<String> {
    sequences
        .iter()
        .map(|seq| allocs[*seq as usize - 1].alloc.id.clone())
        .collect()
}

fn one_node() -> crate::server::placement::Nodes {
    nodes(&["n1"])
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
        tasks: vec![Task {
            name: "main".into(),
            config: vec![("run_for".into(), "5s".into())],
        }],
        ..spec("web", JobType::Service, 1)
    };
    let plan = reconcile_job(Some(&current), &changed, &one_node(), &allocs);
    assert_eq!(plan.change, JobChange::Replace);
    assert_eq!(plan.version, 2);
    assert_eq!(plan.plan.stop, ids(&allocs, &[1, 2]));
    assert_eq!(plan.plan.place.len(), 1, "the new count, all new");
    assert!(plan.plan.upgrade.is_empty());
}

#[test]
fn a_new_build_of_the_runner_upgrades_the_running_allocs_in_place() {
    let current = job(
        JobSpec {
            runner_sha256: Some("aa".repeat(32)),
            ..spec("web", JobType::Service, 3)
        },
        4,
    );
    let allocs = [
        alloc_on("web", 1, Some("n1")),
        alloc_on("web", 2, Some("n1")),
        alloc_on("web", 3, Some("n1")),
        stopping(alloc_on("web", 4, Some("n1"))),
    ];
    let new_build = JobSpec {
        runner_sha256: Some("bb".repeat(32)),
        ..spec("web", JobType::Service, 2)
    };
    let plan = reconcile_job(Some(&current), &new_build, &one_node(), &allocs);
    assert_eq!(plan.change, JobChange::InPlace);
    assert_eq!(plan.version, 5);
    assert_eq!(plan.plan.stop, ids(&allocs, &[3]), "scaled down as usual");
    assert_eq!(
        plan.plan.upgrade,
        ids(&allocs, &[1, 2]),
        "the wanted allocs that stay, not the stopping one"
    );
    assert!(plan.plan.place.is_empty());

    let new_path = JobSpec {
        runner: "elsewhere/r.wasm".into(),
        ..current.spec.clone()
    };
    let plan = reconcile_job(Some(&current), &new_path, &one_node(), &allocs);
    assert_eq!(
        plan.change,
        JobChange::Same,
        "a build named by hash is the build: another path to it (another machine's) is none"
    );
    let unnamed = |runner: &str| JobSpec {
        runner: runner.into(),
        ..spec("web", JobType::Service, 3)
    };
    let plan = reconcile_job(
        Some(&job(unnamed("r.wasm"), 4)),
        &unnamed("elsewhere/r.wasm"),
        &one_node(),
        &allocs,
    );
    assert_eq!(
        plan.change,
        JobChange::InPlace,
        "without builds named, a new path is a new build"
    );

    let saved_before_builds_were_recorded = job(spec("web", JobType::Service, 3), 4);
    let plan = reconcile_job(
        Some(&saved_before_builds_were_recorded),
        &JobSpec {
            runner_sha256: Some("aa".repeat(32)),
            ..spec("web", JobType::Service, 3)
        },
        &one_node(),
        &allocs,
    );
    assert_eq!(
        plan.change,
        JobChange::Same,
        "an unknown build is not a change"
    );
}

#[test]
fn carry_checkpoint_lets_a_config_or_meta_change_go_in_place_but_not_a_new_task() {
    let current = job(spec("web", JobType::Service, 1), 1);
    let allocs = [alloc_on("web", 1, Some("n1"))];
    let carrying = UpdatePolicy {
        carry_checkpoint: true,
    };
    let new_config = JobSpec {
        tasks: vec![Task {
            name: "main".into(),
            config: vec![("log_every".into(), "1s".into())],
        }],
        meta: vec![("owner".into(), "ops".into())],
        update: carrying,
        ..spec("web", JobType::Service, 1)
    };
    let plan = reconcile_job(Some(&current), &new_config, &one_node(), &allocs);
    assert_eq!(plan.change, JobChange::InPlace);
    assert_eq!(plan.plan.upgrade, ids(&allocs, &[1]));

    let new_task = JobSpec {
        tasks: vec![Task::named("main"), Task::named("sidecar")],
        ..new_config.clone()
    };
    let plan = reconcile_job(Some(&current), &new_task, &one_node(), &allocs);
    assert_eq!(
        plan.change,
        JobChange::Replace,
        "which tasks there are is fixed"
    );
    let new_limits = JobSpec {
        limits: crate::model::structs::LimitOverrides {
            wall_time: Some(std::time::Duration::from_secs(60)),
            ..Default::default()
        },
        ..new_config
    };
    let plan = reconcile_job(Some(&current), &new_limits, &one_node(), &allocs);
    assert_eq!(plan.change, JobChange::Replace);
}

#[test]
fn a_change_of_policies_alone_changes_no_alloc() {
    let current = job(spec("web", JobType::Service, 1), 2);
    let allocs = [alloc_on("web", 1, Some("n1"))];
    let policies_only = JobSpec {
        update: UpdatePolicy {
            carry_checkpoint: true,
        },
        reschedule: crate::model::reschedule::ReschedulePolicy::default_for(true, 3),
        ..spec("web", JobType::Service, 1)
    };
    let plan = reconcile_job(Some(&current), &policies_only, &one_node(), &allocs);
    assert_eq!(plan.change, JobChange::Same);
    assert_eq!(plan.version, 2);
    assert_eq!(plan.plan, Plan::default());
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

#[test]
fn a_replacement_goes_to_a_node_its_chain_has_not_failed_on() {
    let current = job(spec("web", JobType::Service, 1), 1);
    // Nodes that state their size: binpack has one to pack toward (one that states none is
    // ranked by how empty it is).
    let sized = crate::model::node::NodeInfo {
        resources: crate::model::node::NodeResources {
            memory_bytes: Some(4 << 30),
            default_alloc_memory_bytes: Some(64 << 20),
            alloc_slots: Some(100),
        },
        ..Default::default()
    };
    let nodes: crate::server::placement::Nodes = ["n1", "n2", "n3"]
        .iter()
        .map(|n| (n.to_string(), sized.clone()))
        .collect();
    // Alloc 1 failed on n1 and was replaced by alloc 2, which failed on n2; n3 is busiest.
    let first = AllocRecord {
        replaced: true,
        ..failed(alloc_on("web", 1, Some("n1")))
    };
    let second = failed(AllocRecord {
        alloc: Arc::new(Alloc {
            reschedule: Some(Reschedule {
                previous_alloc_id: first.alloc.id.clone(),
                attempt: 1,
                start_after_unix_ms: 0,
                history_unix_ms: vec![0],
            }),
            ..Alloc::clone(&alloc_on("web", 2, Some("n2")).alloc)
        }),
        ..alloc_on("web", 2, Some("n2"))
    });
    let busy = [
        alloc_on("other", 3, Some("n3")),
        alloc_on("other", 4, Some("n3")),
    ];
    let all = [&first, &second, &busy[0], &busy[1]];
    let Replacement::Replace(plan) = replace_failed(&second, Some(&current), 5, 0, &nodes, all)
    else {
        panic!("replaced");
    };
    assert_eq!(
        plan.place,
        [Some("n3".to_string())],
        "neither n1 nor n2 again"
    );
    let just_failed = failed(alloc_on("web", 1, Some("n1")));
    let all = [&just_failed, &second, &busy[0], &busy[1]];
    let Replacement::Replace(plan) =
        replace_failed(&just_failed, Some(&current), 5, 0, &nodes, all)
    else {
        panic!("replaced");
    };
    assert_eq!(
        plan.place,
        [Some("n3".to_string())],
        "not n1, then the fullest that fits (binpack)"
    );
}
