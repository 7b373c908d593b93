//! The client and the embedded server together, with real wasm runners: a job's allocs are
//! placed, run, reported, collected by the server's GC, and then pruned and freed by the
//! client.

use crate::support::*;
use caravan_host::jobspec::{JobSpec, JobType};
use caravan_host::server::{EmbeddedServer, ServerConfig};
use caravan_host::state::{RedbStateDb, ServerTable, StateDb};
use caravan_host::structs::{ClientStatus, LimitOverrides, Task};
use caravan_test_artifacts::SLEEPER;
use std::sync::Arc;

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
        id: "sleepy".into(),
        job_type: JobType::Batch,
        count: 3,
        runner: SLEEPER.into(),
        limits: LimitOverrides::default(),
        tasks: vec![Task {
            name: "main".into(),
            config: vec![("run_for".into(), "2s".into())],
        }],
        meta: vec![],
        capabilities: Default::default(),
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
            .all(|id| data_dir.path().join("allocs").join(id).is_dir())
    );

    let removed = server.collect_garbage(true).unwrap();
    assert_eq!(removed.len(), 3);
    eventually("pruned from the client", || client.alloc_ids().is_empty()).await;
    eventually("alloc dirs removed", || {
        placed
            .iter()
            .all(|id| !data_dir.path().join("allocs").join(id).exists())
    })
    .await;
    eventually("their saved records deleted", || {
        db.client_allocs().unwrap().is_empty()
    })
    .await;
    assert!(
        server.allocs().is_empty() && db.server_records(ServerTable::Allocs).unwrap().is_empty(),
        "server records deleted with the allocs"
    );
}
