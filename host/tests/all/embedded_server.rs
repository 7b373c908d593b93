//! The client and the embedded server together, with real wasm runners: a job's allocs are
//! placed, run, reported, collected by the server's GC, and then pruned and freed by the
//! client; a crashing service alloc is replaced after growing delays, then no more.

use crate::support::*;
use caravan_host::model::jobspec::{JobSpec, JobType};
use caravan_host::model::reschedule::ReschedulePolicy;
use caravan_host::model::structs::{ClientStatus, LimitOverrides, Task};
use caravan_host::server::{EmbeddedServer, ServerConfig};
use caravan_host::state::{RedbStateDb, ServerTable, StateDb};
use caravan_test_artifacts::SLEEPER;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn a_batch_job_runs_to_completion_and_server_gc_then_client_pruning_remove_it() {
    let _logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    // The durable store, as the agent uses it: the whole flow saves through it.
    let db: Arc<dyn StateDb> = Arc::new(RedbStateDb::open(data_dir.path()).unwrap());
    let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    let client = wasm_client(data_dir.path(), server.clone(), db.clone());
    client.start();

    let job = JobSpec {
        namespace: "default".into(),
        id: "sleepy".into(),
        job_type: JobType::Batch,
        count: 3,
        runner: SLEEPER.into(),
        runner_sha256: None,
        limits: LimitOverrides::default(),
        tasks: vec![Task {
            name: "main".into(),
            config: vec![("run_for".into(), "2s".into())],
        }],
        meta: vec![],
        capabilities: Default::default(),
        reschedule: None,
        restart: None,
        update: Default::default(),
        constraints: Vec::new(),
        placement: Default::default(),
        migrate: Default::default(),
        disconnect: None,
    };
    let placed = server.register_job(job).unwrap().placed;
    assert_eq!(placed.len(), 3);
    let complete_on_server = |id: &String| {
        server
            .alloc(id)
            .unwrap()
            .client_state
            .is_some_and(|s| s.client_status == ClientStatus::Complete)
    };
    eventually("every alloc complete on the server", || {
        placed.iter().all(complete_on_server)
    })
    .await;
    eventually("every alloc marked on the client", || {
        client.gc().queued() == 3
    })
    .await;
    assert!(
        placed
            .iter()
            .all(|id| !data_dir.path().join("allocs").join(id).exists()),
        "the sleeper imports no wasi:filesystem: it is given no alloc dir"
    );

    let removed = server.collect_garbage(true).unwrap();
    assert_eq!(removed.len(), 3);
    eventually("pruned from the client", || client.alloc_ids().is_empty()).await;
    eventually("their saved records deleted", || {
        db.client_allocs().unwrap().is_empty()
    })
    .await;
    assert!(
        server.allocs().is_empty() && db.server_records(ServerTable::Allocs).unwrap().is_empty(),
        "server records deleted with the allocs"
    );
}

#[tokio::test(start_paused = true)]
async fn a_crashing_service_alloc_is_replaced_after_growing_delays_until_its_attempts_run_out() {
    let logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let db: Arc<dyn StateDb> = Arc::new(RedbStateDb::open(data_dir.path()).unwrap());
    let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    let client = wasm_client(data_dir.path(), server.clone(), db);
    client.start();
    let policy = ReschedulePolicy {
        attempts: 2,
        ..ReschedulePolicy::service_default(3)
    };
    let job = JobSpec {
        namespace: "default".into(),
        id: "crashy".into(),
        job_type: JobType::Service,
        count: 1,
        runner: SLEEPER.into(),
        runner_sha256: None,
        limits: LimitOverrides::default(),
        tasks: vec![Task {
            name: "main".into(),
            config: vec![("crash_after".into(), "10ms".into())],
        }],
        meta: vec![],
        capabilities: Default::default(),
        reschedule: Some(policy),
        restart: None,
        update: Default::default(),
        constraints: Vec::new(),
        placement: Default::default(),
        migrate: Default::default(),
        disconnect: None,
    };
    let first = server.register_job(job).unwrap().placed[0].clone();
    let status = |id: &str| {
        server
            .alloc(id)
            .unwrap()
            .client_state
            .map_or(ClientStatus::Pending, |s| s.client_status)
    };
    let replacement_of = |id: &str| {
        server.job_allocs("crashy").into_iter().find(|a| {
            a.alloc
                .reschedule
                .as_ref()
                .is_some_and(|r| r.previous_alloc_id == id)
        })
    };

    let mut failed = first;
    for (attempt, delay_secs) in [(1, 5), (2, 10)] {
        eventually("the alloc to crash and be replaced", || {
            status(&failed) == ClientStatus::Failed && replacement_of(&failed).is_some()
        })
        .await;
        let replacement = replacement_of(&failed).unwrap();
        let reschedule = replacement.alloc.reschedule.clone().unwrap();
        let replaced_at = *reschedule.history_unix_ms.last().unwrap();
        assert_eq!(reschedule.attempt, attempt);
        assert_eq!(
            reschedule.start_after_unix_ms - replaced_at,
            delay_secs * 1000,
            "attempt {attempt} waits {delay_secs} s"
        );
        // Within its delay the replacement does not start, however long the runner takes.
        tokio::time::sleep(Duration::from_secs(delay_secs - 1)).await;
        assert_eq!(
            status(&replacement.alloc.id),
            ClientStatus::Pending,
            "attempt {attempt} started before its delay (the captured log follows)"
        );
        failed = replacement.alloc.id.clone();
    }
    eventually("the last replacement to crash", || {
        status(&failed) == ClientStatus::Failed
    })
    .await;
    // Its chain used its two attempts: it stays failed, and the server says why, once.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(replacement_of(&failed).is_none(), "a third replacement");
    assert_eq!(server.job_allocs("crashy").len(), 3);
    assert_eq!(
        logs.with_message("not replacing failed allocation: reschedule limit reached")
            .len(),
        1
    );
}
