//! Restarts of the client and server on one state store, in process with paused time: what
//! runs again, what never does, and what a bad record costs. (`agent_restart` does the same
//! through the real binary, `kill -9` included.)

use crate::support::*;
use caravan_host::client::Client;
use caravan_host::model::jobspec::{JobSpec, JobType};
use caravan_host::model::structs::AllocState;
use caravan_host::model::structs::{ClientStatus, LimitOverrides, Task};
use caravan_host::rpc::{AllocUpdate, ServerApi};
use caravan_host::server::{EmbeddedServer, ServerConfig};
use caravan_host::state::{MemoryStateDb, StateDb, Write};
use caravan_host::testing::FaultyStateDb;
use caravan_test_artifacts::{SLEEPER, STATEFUL};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// One "process": a server and a client on `db`, restored and started.
struct Node {
    server: Arc<EmbeddedServer>,
    client: Client,
}

async fn boot(db: Arc<dyn StateDb>, data_dir: &std::path::Path) -> Node {
    let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    let client = wasm_client(data_dir, server.clone(), db);
    client.restore().await.expect("the store reads");
    client.start();
    Node { server, client }
}

impl Node {
    /// Ends this "process" as a crash would: the client and server go without saving
    /// anything more, then the orphaned runners are stopped so they tick no further.
    async fn crash(self) {
        let runners: Vec<_> = self
            .client
            .alloc_ids()
            .iter()
            .filter_map(|id| self.client.runner(id))
            .collect();
        drop(self.client);
        drop(self.server);
        for runner in runners {
            runner.shutdown();
            within("an orphaned runner to stop", runner.wait().wait()).await;
        }
    }

    /// Registers the service job `counter` of `count` stateful allocs ticking every 100 ms;
    /// returns their ids.
    fn run_counters(&self, count: u32) -> Vec<String> {
        self.server
            .register_job(stateful_job(
                "counter",
                JobType::Service,
                count,
                &[("tick_every", "100")],
            ))
            .unwrap()
            .placed
    }

    fn status(&self, alloc_id: &str) -> Option<ClientStatus> {
        self.client.alloc_state(alloc_id).map(|s| s.client_status)
    }
}

fn stateful_job(id: &str, job_type: JobType, count: u32, config: &[(&str, &str)]) -> JobSpec {
    JobSpec {
        namespace: "default".into(),
        id: id.into(),
        job_type,
        count,
        runner: STATEFUL.into(),
        runner_sha256: None,
        limits: LimitOverrides::default(),
        tasks: vec![Task {
            name: "count".into(),
            config: config
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
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
    }
}

/// Guest lines logged for `alloc_id` whose message starts with `prefix`.
fn guest_lines(logs: &LogCapture, alloc_id: &str, prefix: &str) -> Vec<String> {
    logs.lines()
        .iter()
        .filter(|line| line["span"]["alloc_id"] == alloc_id)
        .map(|line| message(line).to_string())
        .filter(|m| m.starts_with(prefix))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_restart_resumes_running_allocs_from_their_checkpoints_and_never_reruns_finished_ones() {
    let logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
    let node = boot(db.clone(), data_dir.path()).await;

    let counters = node.run_counters(2);
    let batch = node
        .server
        .register_job(stateful_job(
            "quick",
            JobType::Batch,
            2,
            &[("tick_every", "10"), ("stop_after", "2")],
        ))
        .unwrap()
        .placed;
    eventually("the batch allocs to finish", || {
        batch
            .iter()
            .all(|id| node.status(id) == Some(ClientStatus::Complete))
    })
    .await;
    node.client.collect(&batch[0]).await.expect("collectable");
    tokio::time::sleep(Duration::from_millis(450)).await;
    node.client.flush_state().await;
    let ticks_before: Vec<usize> = counters
        .iter()
        .map(|id| guest_lines(&logs, id, "tick ").len())
        .collect();
    assert!(ticks_before.iter().all(|&n| n >= 4), "{ticks_before:?}");
    node.crash().await;
    let lines_before = logs.lines().len();

    let node = boot(db.clone(), data_dir.path()).await;
    for (id, ticks) in counters.iter().zip(&ticks_before) {
        // The saved state says running at once; the guest proves it by ticking again.
        eventually("the counter to tick again", || {
            guest_lines(&logs, id, "tick ").len() > *ticks
        })
        .await;
        let resumed = guest_lines(&logs, id, "resuming from checkpoint at count");
        assert_eq!(
            resumed,
            [format!("resuming from checkpoint at count {ticks}")],
            "alloc {id} resumes once, from its last checkpoint"
        );
    }
    // The finished batch alloc keeps its state and never runs again; the collected one stays
    // collected.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: Vec<Value> = logs.lines().split_off(lines_before);
    for id in &batch {
        assert_eq!(node.status(id), Some(ClientStatus::Complete));
        assert!(
            !after
                .iter()
                .any(|l| l["span"]["alloc_id"] == id.as_str() && message(l).starts_with("tick")),
            "finished alloc {id} ran again"
        );
    }
    assert!(
        node.client.runner(&batch[0]).is_none(),
        "collected: no runner"
    );
    let log_file = data_dir
        .path()
        .join("logs")
        .join(format!("{}.log", batch[0]));
    assert!(
        !log_file.exists(),
        "collected: nothing written for it since"
    );
    // Nothing duplicated: the server holds the same allocs, the client the same ids.
    assert_eq!(node.server.job_allocs("counter").len(), 2);
    assert_eq!(node.server.job_allocs("quick").len(), 2);
    let mut expected: Vec<String> = counters.iter().chain(&batch).cloned().collect();
    expected.sort();
    assert_eq!(node.client.alloc_ids(), expected);
}

#[tokio::test(start_paused = true)]
async fn a_clean_shutdown_checkpoints_and_the_next_start_resumes() {
    let logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
    let node = boot(db.clone(), data_dir.path()).await;
    let ids = node.run_counters(1);
    eventually("running", || {
        node.status(&ids[0]) == Some(ClientStatus::Running)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    node.client.shutdown_all().await;
    let ticks = guest_lines(&logs, &ids[0], "tick ").len();
    assert_eq!(
        node.status(&ids[0]),
        Some(ClientStatus::Running),
        "not terminal"
    );
    drop(node);

    let _node = boot(db, data_dir.path()).await;
    eventually("ticking again", || {
        guest_lines(&logs, &ids[0], "tick ").len() > ticks
    })
    .await;
    assert_eq!(
        guest_lines(&logs, &ids[0], "resuming from checkpoint at count"),
        [format!("resuming from checkpoint at count {ticks}")]
    );
}

#[tokio::test(start_paused = true)]
async fn a_record_that_cannot_be_read_fails_that_alloc_and_the_rest_restore() {
    let _logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let memory = Arc::new(MemoryStateDb::new());
    let node = boot(memory.clone(), data_dir.path()).await;
    let ids = node
        .server
        .register_job(JobSpec {
            runner: SLEEPER.into(),
            ..stateful_job("sleepy", JobType::Service, 2, &[])
        })
        .unwrap()
        .placed;
    eventually("both running", || {
        ids.iter()
            .all(|id| node.status(id) == Some(ClientStatus::Running))
    })
    .await;
    node.client.flush_state().await;
    node.crash().await;
    memory.garble_client_record(&ids[0], "state", b"\x00garbage");

    let node = boot(memory, data_dir.path()).await;
    let state = node.client.alloc_state(&ids[0]).expect("still held");
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert!(
        state
            .description
            .contains("saved alloc state cannot be read"),
        "{}",
        state.description
    );
    let runner = node
        .client
        .runner(&ids[1])
        .expect("the other alloc has its runner back");
    assert_eq!(runner.alloc_state().client_status, ClientStatus::Running);
    drop(node);
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_that_cannot_be_saved_is_refused_to_the_guest_and_saving_resumes() {
    let logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyStateDb::new(Arc::new(MemoryStateDb::new())));
    let node = boot(faulty.clone(), data_dir.path()).await;
    let ids = node.run_counters(1);
    eventually("running", || {
        node.status(&ids[0]) == Some(ClientStatus::Running)
    })
    .await;
    faulty.fail_writes(true);
    eventually("the guest told its checkpoint failed", || {
        !logs
            .with_message("runner's checkpoint was refused")
            .is_empty()
    })
    .await;
    // The stateful runner treats a refused checkpoint as fatal: its alloc fails, and that
    // state is saved once the store works again.
    faulty.fail_writes(false);
    eventually("the failure saved and reported", || {
        node.server
            .alloc(&ids[0])
            .ok()
            .and_then(|a| a.client_state)
            .is_some_and(|s| s.client_status == ClientStatus::Failed)
    })
    .await;
    assert!(faulty.failed_writes() > 0);
    let failed = node.client.alloc_state(&ids[0]).unwrap();
    assert!(
        failed.description.contains("not saved"),
        "{}",
        failed.description
    );
}

#[tokio::test(start_paused = true)]
async fn a_restored_alloc_the_server_had_stopped_is_killed_not_run() {
    let logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
    let node = boot(db.clone(), data_dir.path()).await;
    let ids = node.run_counters(1);
    eventually("ticking", || {
        !guest_lines(&logs, &ids[0], "tick ").is_empty()
    })
    .await;
    let running = node.client.alloc_state(&ids[0]).unwrap();
    // The stop is saved, then the agent dies before the runner's answer to it is: put the
    // running state back over whatever the kill left.
    node.server.stop_job("counter", false).unwrap();
    eventually("the stop saved", || {
        db.client_allocs().unwrap()[0]
            .alloc
            .as_ref()
            .is_some_and(|a| a.as_ref().unwrap().desired_status.is_stop())
    })
    .await;
    node.crash().await;
    db.apply(vec![Write::PutAllocState {
        alloc_id: ids[0].clone(),
        state: running.into(),
    }])
    .unwrap();
    let ticks = guest_lines(&logs, &ids[0], "tick ").len();

    let node = boot(db, data_dir.path()).await;
    eventually("stopped", || {
        node.status(&ids[0]).is_some_and(|s| s.is_terminal())
    })
    .await;
    assert_eq!(node.status(&ids[0]), Some(ClientStatus::Complete));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        guest_lines(&logs, &ids[0], "tick ").len(),
        ticks,
        "never ran again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restart_removes_alloc_directories_no_alloc_owns_and_keeps_the_rest() {
    let _logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
    let node = boot(db.clone(), data_dir.path()).await;
    let counters = node.run_counters(1);
    eventually("the counter running", || {
        node.status(&counters[0]) == Some(ClientStatus::Running)
    })
    .await;
    node.crash().await;
    // What a removal cut short by the crash leaves: a deep tree no saved alloc owns. The
    // counter reaches no files and was given no directory: one is made for it here, as an
    // earlier build of its runner that could reach files would have left it.
    let allocs = data_dir.path().join("allocs");
    std::fs::create_dir_all(allocs.join(&counters[0])).unwrap();
    let orphan = allocs.join("0000dead-orphan");
    std::fs::create_dir_all(orphan.join("d/d/d/d")).unwrap();
    std::fs::write(orphan.join("d/file"), "left").unwrap();

    let node = boot(db.clone(), data_dir.path()).await;
    assert!(!orphan.exists(), "the orphan directory is removed at start");
    assert!(
        allocs.join(&counters[0]).is_dir(),
        "a restored alloc keeps its directory"
    );
    // Its runner made no directory in this run, but a restored one may have one: collected,
    // the alloc takes it along.
    node.server.stop_job("counter", false).unwrap();
    eventually("the counter stopped", || {
        node.status(&counters[0])
            .is_some_and(|status| status.is_terminal())
    })
    .await;
    node.client.collect(&counters[0]).await.unwrap();
    assert!(
        !allocs.join(&counters[0]).exists(),
        "a collected restored alloc's directory is removed"
    );
    node.crash().await;
}

#[tokio::test(start_paused = true)]
async fn a_running_client_sweeps_leftover_alloc_directories_at_the_gc_interval() {
    let _logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
    let node = boot(db, data_dir.path()).await;
    let counters = node.run_counters(2);
    eventually("the counters running", || {
        counters
            .iter()
            .all(|id| node.status(id) == Some(ClientStatus::Running))
    })
    .await;
    // One alloc stopped and collected, its runner still listed (until the server drops it):
    // what is left of its directory is a leftover too.
    let allocs = data_dir.path().join("allocs");
    let collected = &counters[1];
    node.server.stop_alloc(collected).unwrap();
    eventually("the second counter stopped", || {
        node.status(collected).is_some_and(|s| s.is_terminal())
    })
    .await;
    node.client.collect(collected).await.unwrap();
    assert!(node.client.runner(collected).unwrap().is_destroyed());
    // What destroys whose removal failed leave, while the agent goes on running: the
    // collected alloc's directory, and one of an alloc this client never knew.
    let leftover = allocs.join("0000dead-leftover");
    // The running counter's own directory, as an earlier build that reached files left it.
    std::fs::create_dir_all(allocs.join(&counters[0])).unwrap();
    for dir in [&leftover, &allocs.join(collected)] {
        std::fs::create_dir_all(dir.join("d/d/d/d")).unwrap();
        std::fs::write(dir.join("d/file"), "left").unwrap();
    }

    // The sweep at the first interval (a minute by default) only notes them: a directory must
    // be unowned at two sweeps in a row, so an alloc just starting is never swept.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(leftover.is_dir(), "kept at the first sweep");
    tokio::time::sleep(Duration::from_secs(60)).await;
    eventually("the leftovers removed", || {
        !leftover.exists() && !allocs.join(collected).exists()
    })
    .await;
    assert!(
        allocs.join(&counters[0]).is_dir(),
        "a running alloc keeps its directory"
    );
    assert_eq!(node.client.metrics().leftover_dirs, 0);
    node.crash().await;
}

#[tokio::test(start_paused = true)]
async fn saved_records_without_their_alloc_are_dropped_with_a_warning() {
    let logs = LogCapture::start();
    let data_dir = tempfile::tempdir().unwrap();
    let db: Arc<dyn StateDb> = Arc::new(MemoryStateDb::new());
    db.apply(vec![Write::PutCheckpoint {
        alloc_id: "orphan".into(),
        data: b"3".to_vec(),
    }])
    .unwrap();
    let node = boot(db.clone(), data_dir.path()).await;
    let warning = logs.with_message("dropping saved allocation with no usable record");
    assert_eq!(warning.len(), 1);
    assert_eq!(warning[0]["fields"]["alloc_id"], "orphan");
    assert!(node.client.alloc_ids().is_empty());
    node.client.flush_state().await;
    assert!(
        db.client_allocs().unwrap().is_empty(),
        "its records deleted"
    );
}

#[tokio::test(start_paused = true)]
async fn the_server_acknowledges_an_update_only_once_it_is_saved() {
    let _logs = LogCapture::start();
    let faulty = Arc::new(FaultyStateDb::new(Arc::new(MemoryStateDb::new())));
    let server = EmbeddedServer::open(ServerConfig::default(), faulty.clone()).unwrap();
    server
        .register_node("node-1", &Default::default())
        .await
        .unwrap();
    let id = server
        .register_job(stateful_job("counter", JobType::Service, 1, &[]))
        .unwrap()
        .placed[0]
        .clone();
    let update = AllocUpdate {
        alloc_id: id.clone(),
        state: AllocState {
            client_status: ClientStatus::Running,
            description: String::new(),
            task_states: vec![],
        }
        .into(),
    };
    faulty.fail_writes(true);
    let refused = server.update_allocs(std::slice::from_ref(&update)).await;
    assert!(refused.is_err(), "not acknowledged: {refused:?}");
    faulty.fail_writes(false);
    let accepted = server.update_allocs(&[update]).await.unwrap();
    assert_eq!(accepted, [id]);
}
