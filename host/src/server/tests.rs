//! The embedded server's unit tests: registration, replacement, stop, GC, purge.

use super::*;
use crate::model::jobspec::JobType;
use crate::model::structs::{AllocState, ClientStatus, DesiredStatus};
use crate::rpc::{AllocUpdate, ServerApi};
use crate::state::{ServerTable, Write};
use testkit::spec;

fn wanted(server: &EmbeddedServer, job: &str) -> usize {
    server
        .job_allocs(job)
        .iter()
        .filter(|a| a.is_wanted())
        .count()
}

async fn report(server: &EmbeddedServer, alloc_id: &str, status: ClientStatus) {
    let state = AllocState {
        client_status: status,
        description: String::new(),
        task_states: vec![],
    };
    server
        .update_allocs(&[AllocUpdate {
            alloc_id: alloc_id.into(),
            state: state.into(),
        }])
        .await
        .unwrap();
}

#[tokio::test]
async fn allocs_wait_for_a_node_then_are_placed_on_it() {
    let server = EmbeddedServer::new(ServerConfig::default());
    server
        .register_job(spec("web", JobType::Service, 2))
        .unwrap();
    assert!(server.allocs().iter().all(|a| a.node_id.is_none()));
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    let seen = server.watch_allocs("n1", 0, Duration::ZERO).await.unwrap();
    assert_eq!(seen.allocs.len(), 2);
}

#[tokio::test]
async fn scaling_up_adds_allocs_and_down_stops_the_newest() {
    let server = EmbeddedServer::new(ServerConfig::default());
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    let first = server
        .register_job(spec("web", JobType::Service, 2))
        .unwrap();
    assert!(first.created);
    let up = server
        .register_job(spec("web", JobType::Service, 4))
        .unwrap();
    assert_eq!(
        (up.created, up.placed.len(), up.stopped.len()),
        (false, 2, 0)
    );
    let down = server
        .register_job(spec("web", JobType::Service, 1))
        .unwrap();
    assert_eq!(down.stopped.len(), 3);
    assert!(
        down.stopped
            .iter()
            .all(|id| !first.placed[..1].contains(id)),
        "the oldest stays"
    );
    assert_eq!(wanted(&server, "web"), 1);
}

#[tokio::test]
async fn a_changed_runner_upgrades_every_alloc_in_place_and_other_changes_replace_them() {
    let server = EmbeddedServer::new(ServerConfig::default());
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    let first = server
        .register_job(spec("web", JobType::Service, 2))
        .unwrap();
    let index_before = server.alloc(&first.placed[0]).unwrap().alloc.modify_index;
    let upgraded = server
        .register_job(JobSpec {
            runner: "other.wasm".into(),
            ..spec("web", JobType::Service, 2)
        })
        .unwrap();
    let sorted = |ids: &[String]| std::collections::BTreeSet::from_iter(ids.to_vec());
    assert_eq!(sorted(&upgraded.upgraded), sorted(&first.placed));
    assert!(upgraded.placed.is_empty() && upgraded.stopped.is_empty());
    for id in &first.placed {
        let record = server.alloc(id).unwrap();
        assert_eq!(record.alloc.runner, "other.wasm");
        assert_eq!(record.alloc.desired_status, DesiredStatus::Run);
        assert!(
            record.alloc.modify_index > index_before,
            "clients see a new version"
        );
        assert_eq!(record.job_version, 2);
    }

    let changed = server
        .register_job(JobSpec {
            runner: "other.wasm".into(),
            tasks: vec![crate::model::structs::Task {
                name: "main".into(),
                config: vec![("run_for".into(), "1s".into())],
            }],
            ..spec("web", JobType::Service, 2)
        })
        .unwrap();
    assert_eq!(sorted(&changed.stopped), sorted(&first.placed));
    assert_eq!(changed.placed.len(), 2);
    assert!(changed.upgraded.is_empty());
    assert!(
        first
            .placed
            .iter()
            .all(|id| server.alloc(id).unwrap().alloc.desired_status == DesiredStatus::Stop)
    );
    assert_eq!(server.job("web").unwrap().version, 3);
}

#[tokio::test]
async fn a_failed_service_alloc_is_replaced_up_to_the_reschedule_limit() {
    let server = EmbeddedServer::new(ServerConfig {
        reschedule_limit: 1,
        ..ServerConfig::default()
    });
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    let first = server
        .register_job(spec("web", JobType::Service, 1))
        .unwrap()
        .placed[0]
        .clone();
    report(&server, &first, ClientStatus::Failed).await;
    assert_eq!(server.job_allocs("web").len(), 2, "one replacement");
    let second = server
        .job_allocs("web")
        .into_iter()
        .find(|a| a.alloc.id != first)
        .unwrap()
        .alloc
        .id
        .clone();
    report(&server, &second, ClientStatus::Failed).await;
    assert_eq!(
        server.job_allocs("web").len(),
        2,
        "the limit is reached: no more"
    );
}

#[tokio::test]
async fn a_late_non_terminal_report_does_not_bring_a_finished_alloc_back() {
    let server = EmbeddedServer::new(ServerConfig::default());
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    let id = server
        .register_job(spec("once", JobType::Batch, 1))
        .unwrap()
        .placed[0]
        .clone();
    report(&server, &id, ClientStatus::Complete).await;
    // A restarted node's request still in flight from before it finished the alloc.
    report(&server, &id, ClientStatus::Running).await;
    let status = server
        .alloc(&id)
        .unwrap()
        .client_state
        .unwrap()
        .client_status;
    assert_eq!(status, ClientStatus::Complete);
}

#[tokio::test]
async fn stop_and_gc_remove_only_terminal_allocs_and_purge_removes_the_job_last() {
    let server = EmbeddedServer::new(ServerConfig::default());
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    let ids = server
        .register_job(spec("web", JobType::Service, 2))
        .unwrap()
        .placed;
    assert_eq!(server.stop_job("web", true).unwrap().len(), 2);
    report(&server, &ids[0], ClientStatus::Complete).await;
    assert!(
        server.collect_garbage(false).unwrap().is_empty(),
        "within job_gc_threshold: kept"
    );
    assert_eq!(
        server.collect_garbage(true).unwrap(),
        [ids[0].clone()],
        "forced: the terminal one goes"
    );
    assert!(
        server.alloc(&ids[1]).is_ok(),
        "a non-terminal alloc is never removed"
    );
    assert!(
        server.job("web").is_err(),
        "a purged job is gone from listings at once"
    );
    report(&server, &ids[1], ClientStatus::Complete).await;
    server.collect_garbage(true).unwrap();
    assert!(server.allocs().is_empty());
    assert!(matches!(
        server.stop_job("nope", false),
        Err(RequestError::JobNotFound(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_finished_batch_job_is_collected_after_the_threshold() {
    let server = EmbeddedServer::new(ServerConfig {
        job_gc_threshold: Duration::from_secs(60),
        ..ServerConfig::default()
    });
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    let id = server
        .register_job(spec("once", JobType::Batch, 1))
        .unwrap()
        .placed[0]
        .clone();
    report(&server, &id, ClientStatus::Complete).await;
    assert!(server.collect_garbage(false).unwrap().is_empty());
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(server.collect_garbage(false).unwrap(), [id]);
}

#[tokio::test]
async fn a_drain_evicts_one_alloc_at_a_time_into_replacements_that_start_from_its_checkpoint() {
    let db = Arc::new(crate::state::MemoryStateDb::new());
    let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    for node in ["n1", "n2"] {
        server
            .register_node(node, &Default::default())
            .await
            .unwrap();
    }
    server
        .register_job(spec("web", JobType::Service, 4))
        .unwrap();
    let on = |node: &str| -> Vec<AllocRecord> {
        let allocs = server.job_allocs("web").into_iter();
        allocs
            .filter(|a| a.node_id.as_deref() == Some(node) && !a.is_terminal())
            .collect()
    };
    assert_eq!((on("n1").len(), on("n2").len()), (2, 2));
    for alloc in server.job_allocs("web") {
        report(&server, &alloc.alloc.id, ClientStatus::Running).await;
    }

    assert_eq!(
        server.set_drain("nope", Some(DrainRequest::default()), false),
        Err(RequestError::NodeNotFound("nope".into()))
    );
    server
        .set_drain("n1", Some(DrainRequest::default()), false)
        .unwrap();
    let evicted: Vec<_> = on("n1")
        .into_iter()
        .filter(|a| a.alloc.desired_status == DesiredStatus::Evict)
        .collect();
    assert_eq!(evicted.len(), 1, "one at a time");
    let arriving: Vec<_> = on("n2")
        .into_iter()
        .filter(|a| a.alloc.previous_alloc.is_some())
        .collect();
    assert_eq!(arriving.len(), 1);
    let previous = arriving[0].alloc.previous_alloc.clone().unwrap();
    assert_eq!(
        (previous.alloc_id.as_str(), previous.node_id.as_str()),
        (evicted[0].alloc.id.as_str(), "n1")
    );
    assert_eq!(
        server.set_eligibility("n1", true),
        Err(RequestError::NodeDraining("n1".into()))
    );

    // The evicted one stops and its replacement runs: the next one moves.
    report(&server, &evicted[0].alloc.id, ClientStatus::Complete).await;
    report(&server, &arriving[0].alloc.id, ClientStatus::Running).await;
    let second = on("n1");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].alloc.desired_status, DesiredStatus::Evict);
    report(&server, &second[0].alloc.id, ClientStatus::Complete).await;
    assert!(on("n1").is_empty());
    assert_eq!(wanted(&server, "web"), 4, "the job never lost an alloc");
    let n1 = |server: &EmbeddedServer| {
        let details = server.node_details();
        details.into_iter().find(|d| d.id == "n1").unwrap().schedule
    };
    assert_eq!(
        n1(&server),
        drain::NodeSchedule {
            ineligible: true,
            drain: None
        },
        "drain done, the node stays ineligible"
    );
    server
        .register_job(spec("web", JobType::Service, 6))
        .unwrap();
    assert!(
        on("n1").is_empty(),
        "nothing new goes to an ineligible node"
    );

    // The schedule outlives a restart of the server, and the node's own.
    drop(server);
    let server = EmbeddedServer::open(ServerConfig::default(), db).unwrap();
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    assert!(!n1(&server).eligible());
    server.set_eligibility("n1", true).unwrap();
    assert!(n1(&server).eligible());
}

fn disconnecting(id: &str, count: u32, rule: &str, replace: bool) -> JobSpec {
    let text = format!(
        "[job]\nid = {id:?}\ntype = \"service\"\ncount = {count}\nrunner = \"r.wasm\"\n\
         [job.disconnect]\nlost_after = \"1h\"\nreplace = {replace}\nreconcile = {rule:?}\n"
    );
    crate::model::jobspec::parse_toml(&text).unwrap()
}

fn status_of(server: &EmbeddedServer, id: &str) -> Option<ClientStatus> {
    let record = server.alloc(id).unwrap();
    record.client_state.map(|s| s.client_status)
}

/// A server with nodes n1 and n2 running `jobs`, every alloc reported running.
async fn running_on_two_nodes(jobs: Vec<JobSpec>) -> Arc<EmbeddedServer> {
    let server = EmbeddedServer::new(ServerConfig::default());
    for node in ["n1", "n2"] {
        server
            .register_node(node, &Default::default())
            .await
            .unwrap();
    }
    for job in jobs {
        server.register_job(job).unwrap();
    }
    for alloc in server.allocs() {
        report(&server, &alloc.alloc.id, ClientStatus::Running).await;
    }
    server
}

#[tokio::test]
async fn a_node_back_within_lost_after_keeps_one_of_each_pair_by_its_jobs_rule() {
    let server = running_on_two_nodes(vec![
        disconnecting("orig", 2, "keep_original", true),
        disconnecting("repl", 2, "keep_replacement", true),
    ])
    .await;
    let on_n2 = |job: &str| {
        let allocs = server.job_allocs(job).into_iter();
        allocs
            .filter(|a| a.node_id.as_deref() == Some("n2"))
            .map(|a| a.alloc.id.clone())
            .next()
            .unwrap()
    };
    let (orig, repl) = (on_n2("orig"), on_n2("repl"));
    let unknown = server.node_down("n2").unwrap();
    assert_eq!(unknown.len(), 2);
    assert_eq!(status_of(&server, &orig), Some(ClientStatus::Unknown));
    let stand_in = |job: &str, of: &str| {
        let mut allocs = server.job_allocs(job).into_iter();
        allocs
            .find(|a| a.stands_in_for.as_deref() == Some(of))
            .map(|a| a.alloc.id.clone())
            .unwrap()
    };
    let (orig_stand_in, repl_stand_in) = (stand_in("orig", &orig), stand_in("repl", &repl));
    // A stand-in counts only once it runs: one that has not started never wins.
    report(&server, &orig_stand_in, ClientStatus::Running).await;
    report(&server, &repl_stand_in, ClientStatus::Running).await;
    assert_eq!(
        wanted(&server, "orig"),
        2,
        "the stand-in counts, the unknown does not"
    );

    server
        .register_node("n2", &Default::default())
        .await
        .unwrap();
    let desired = |id: &str| server.alloc(id).unwrap().alloc.desired_status;
    assert_eq!(status_of(&server, &orig), Some(ClientStatus::Running));
    assert_eq!(desired(&orig), DesiredStatus::Run, "keep_original");
    assert_eq!(desired(&orig_stand_in), DesiredStatus::Stop);
    assert_eq!(desired(&repl), DesiredStatus::Stop, "keep_replacement");
    assert_eq!(desired(&repl_stand_in), DesiredStatus::Run);
    assert_eq!((wanted(&server, "orig"), wanted(&server, "repl")), (2, 2));
}

#[tokio::test]
async fn an_unknown_alloc_past_lost_after_is_lost_and_replaced_when_it_had_no_stand_in() {
    let server = running_on_two_nodes(vec![disconnecting("web", 2, "best_score", false)]).await;
    server.node_down("n2").unwrap();
    assert_eq!(server.allocs().len(), 2, "replace = false: no stand-in");
    assert_eq!(wanted(&server, "web"), 2, "the unknown alloc still counts");
    // An hour on, as the tick that follows it would see it.
    let later = crate::util::timestamp::unix_ms_now() + 3_600_001;
    let (_, saved) = server.change(|state, index| state.expire_disconnects(index, later));
    saved.unwrap();
    let statuses: Vec<_> = server
        .allocs()
        .iter()
        .map(|a| a.client_state.as_ref().map(|s| s.client_status))
        .collect();
    assert!(statuses.contains(&Some(ClientStatus::Lost)), "{statuses:?}");
    assert_eq!(server.allocs().len(), 3, "replaced once lost");
    assert_eq!(wanted(&server, "web"), 2);
}

#[tokio::test]
async fn a_late_report_from_a_node_still_away_does_not_bring_its_unknown_alloc_back() {
    let server = running_on_two_nodes(vec![disconnecting("web", 2, "keep_original", true)]).await;
    let on_n2 = server
        .job_allocs("web")
        .into_iter()
        .find(|a| a.node_id.as_deref() == Some("n2"))
        .unwrap()
        .alloc
        .id
        .clone();
    server.node_down("n2").unwrap();
    report(&server, &on_n2, ClientStatus::Running).await;
    assert_eq!(
        status_of(&server, &on_n2),
        Some(ClientStatus::Unknown),
        "sent before n2 went silent: it says nothing of now"
    );
    report(&server, &on_n2, ClientStatus::Unknown).await;
    assert_eq!(status_of(&server, &on_n2), Some(ClientStatus::Unknown));
    report(&server, &on_n2, ClientStatus::Complete).await;
    assert_eq!(
        status_of(&server, &on_n2),
        Some(ClientStatus::Complete),
        "how it ended is taken whenever it comes"
    );
    assert_eq!(wanted(&server, "web"), 2, "its stand-in runs on");
}

/// A store holding job `web` (one service alloc, on `n1`), whose alloc `edit` rewrites as a
/// failure no leader acted on; and that alloc's id.
async fn store_with_an_unreplaced_failure(
    edit: impl FnOnce(&mut records::SavedAllocRecord),
) -> (Arc<MemoryStateDb>, String) {
    let db = Arc::new(MemoryStateDb::new());
    let first = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    first
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    first
        .register_job(spec("web", JobType::Service, 1))
        .unwrap();
    let (alloc_id, bytes) = db.server_records(ServerTable::Allocs).unwrap().remove(0);
    let mut record: records::SavedAllocRecord = serde_json::from_slice(&bytes).unwrap();
    record.client_state = Some(AllocState {
        client_status: ClientStatus::Failed,
        description: "exited 1".into(),
        task_states: vec![],
    });
    edit(&mut record);
    db.apply(vec![Write::PutServer {
        table: ServerTable::Allocs,
        key: alloc_id.clone(),
        value: records::encode(&record),
    }])
    .unwrap();
    (db, alloc_id)
}

/// The next leader's server on `db`, with `n1` live, after its takeover.
async fn taken_over(db: Arc<MemoryStateDb>) -> (Arc<EmbeddedServer>, usize) {
    let next = EmbeddedServer::open(ServerConfig::default(), db).unwrap();
    next.register_node("n1", &Default::default()).await.unwrap();
    let placed = next.complete_deploys().unwrap();
    (next, placed)
}

#[tokio::test]
async fn a_takeover_replaces_a_failure_no_leader_replaced() {
    // A node's report of a failure that no leader acted on (it came between two leaders, or
    // the save of its replacement ended the leadership) is in the store, unreplaced: the
    // next leader's takeover decides it as the report would have been.
    let (db, alloc_id) = store_with_an_unreplaced_failure(|_| {}).await;
    let (next, placed) = taken_over(db).await;
    assert_eq!(placed, 1);
    let allocs = next.job_allocs("web");
    assert!(
        allocs.iter().any(|a| a.alloc.id == alloc_id && a.replaced),
        "{allocs:#?}"
    );
    assert_eq!(wanted(&next, "web"), 1, "{allocs:#?}");
}

#[tokio::test]
async fn a_takeover_long_after_a_failure_at_its_reschedule_limit_does_not_replace_it() {
    // Three replacements within the hour before it failed (the service default's limit),
    // three hours ago: decided at its failure, not at the takeover, the limit holds.
    let now = crate::util::timestamp::unix_ms_now();
    let failed_at = now - 3 * 3_600_000;
    let (db, alloc_id) = store_with_an_unreplaced_failure(|record| {
        let minutes = |m: u64| failed_at - m * 60_000;
        record.alloc.reschedule = Some(crate::model::structs::Reschedule {
            previous_alloc_id: "an-older-one".into(),
            attempt: 3,
            start_after_unix_ms: minutes(10),
            history_unix_ms: vec![minutes(30), minutes(20), minutes(10)],
        });
        let state = record.client_state.as_mut().unwrap();
        state.task_states = vec![crate::model::structs::TaskState {
            name: "main".into(),
            state: crate::model::structs::TaskLifecycle::Dead,
            failed: true,
            restarts: 0,
            events: vec![crate::model::structs::TaskEvent {
                kind: "Terminated".into(),
                message: "exited 1".into(),
                time_unix_ms: failed_at,
            }],
        }];
    })
    .await;
    let (next, placed) = taken_over(db).await;
    assert_eq!(placed, 0);
    let allocs = next.job_allocs("web");
    assert!(
        allocs.iter().all(|a| a.alloc.id == alloc_id && !a.replaced),
        "{allocs:#?}"
    );
}

#[tokio::test]
async fn a_takeover_marks_a_failure_whose_replacement_landed_without_the_mark() {
    // A save split over transactions and cut between them: the replacement is in the store,
    // its predecessor not marked replaced. The takeover marks it and places nothing more.
    let (db, failed_id) = store_with_an_unreplaced_failure(|_| {}).await;
    let (_, bytes) = db.server_records(ServerTable::Allocs).unwrap().remove(0);
    let mut replacement: records::SavedAllocRecord = serde_json::from_slice(&bytes).unwrap();
    replacement.alloc.id = "the-replacement".into();
    replacement.alloc.reschedule = Some(crate::model::structs::Reschedule {
        previous_alloc_id: failed_id.clone(),
        attempt: 1,
        start_after_unix_ms: 0,
        history_unix_ms: vec![crate::util::timestamp::unix_ms_now()],
    });
    replacement.client_state = None;
    db.apply(vec![Write::PutServer {
        table: ServerTable::Allocs,
        key: "the-replacement".into(),
        value: records::encode(&replacement),
    }])
    .unwrap();
    let (next, placed) = taken_over(db).await;
    assert_eq!(placed, 0);
    let allocs = next.job_allocs("web");
    assert!(
        allocs.iter().any(|a| a.alloc.id == failed_id && a.replaced),
        "{allocs:#?}"
    );
    assert_eq!(wanted(&next, "web"), 1, "{allocs:#?}");
}
