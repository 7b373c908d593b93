//! A stop reaches its runner as soon as the client has it in hand: not after a commit of
//! new allocs that a failing disk holds up, and not after an alloc moved here from a drained
//! node has fetched its checkpoint and started. Each was found by the simulation, whose
//! check is that no alloc runs longer than its kill timeout once its node received its stop.
//! And an eviction hands the alloc's checkpoint on: when it comes before the alloc started,
//! and across a restart of its node.

use super::*;
use caravan_host::client::migrate::{CheckpointFetch, CheckpointSource, CheckpointUnavailable};
use caravan_host::model::structs::{DesiredStatus, PreviousAlloc};
use caravan_host::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use caravan_host::state::MemoryStateDb;
use caravan_host::testing::FaultyStateDb;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// An alloc moved here from `node-2`, to start from its predecessor's checkpoint.
fn moved_here() -> Alloc {
    Alloc {
        previous_alloc: Some(PreviousAlloc {
            alloc_id: "drained-away".into(),
            node_id: "node-2".into(),
            checkpoint: true,
        }),
        ..alloc("native", &["main"], &[])
    }
}

/// `alloc` as the server has it once stopped: the next version, desired status stop.
fn stopped(alloc: &Alloc) -> Alloc {
    Alloc {
        desired_status: DesiredStatus::Stop,
        modify_index: alloc.modify_index + 1,
        ..alloc.clone()
    }
}

fn client_on(server: Arc<dyn ServerApi>, disk: Arc<FaultyStateDb>) -> Client {
    let mut config = ClientConfig::new(NODE, own_data_dir());
    config.gc = gc_config(0, 2);
    Client::with_state(
        config,
        server,
        empty_factory(),
        Arc::new(FakeStats::default()),
        disk,
    )
}

fn memory_disk() -> Arc<FaultyStateDb> {
    Arc::new(FaultyStateDb::new(Arc::new(MemoryStateDb::new())))
}

/// A started client, on a disk of its own, that runs `alloc` once placed on `server`;
/// returned once it runs.
async fn client_running(
    server: &Arc<InMemoryServer>,
    alloc: &Alloc,
) -> (Client, Arc<FaultyStateDb>) {
    server.place(NODE, alloc.clone());
    let disk = memory_disk();
    let client = client_on(server.clone(), disk.clone());
    client.start();
    eventually("the first alloc running", || {
        client
            .alloc_state(&alloc.id)
            .is_some_and(|state| state.client_status == ClientStatus::Running)
    })
    .await;
    (client, disk)
}

/// Whether the server ever heard `alloc_id` running.
fn ever_reported_running(server: &InMemoryServer, alloc_id: &str) -> bool {
    server.update_batches().iter().flatten().any(|update| {
        update.alloc_id == alloc_id && update.state.client_status == ClientStatus::Running
    })
}

/// A client to which an alloc was moved, asking for its predecessor's checkpoint: the
/// first ask made, and every answer "not yet".
async fn moved_here_waiting_for_ever(
    server: &Arc<InMemoryServer>,
) -> (Client, Alloc, Arc<FaultyStateDb>) {
    let moved = moved_here();
    server.place(NODE, moved.clone());
    let disk = memory_disk();
    let asks = Arc::new(AtomicU32::new(0));
    let counted = asks.clone();
    let never_ready: CheckpointSource = Arc::new(move |_previous| {
        counted.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(CheckpointFetch::NotYet("still shutting down".into())) })
    });
    let client = client_on(server.clone(), disk.clone());
    client.fetch_checkpoints_from(never_ready);
    client.start();
    eventually("the first ask for its checkpoint", || {
        asks.load(Ordering::SeqCst) >= 1
    })
    .await;
    (client, moved, disk)
}

/// Found by the simulation (seed 66): the server stopped an alloc moved here while its
/// checkpoint was still being fetched; the client dropped that version, and the runner
/// started as the alloc arrived and ran until a later answer (as late as the watch's wait,
/// five minutes by default) said it again.
#[tokio::test(start_paused = true)]
async fn an_alloc_stopped_while_its_checkpoint_is_fetched_never_runs() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let (client, moved, _disk) = moved_here_waiting_for_ever(&server).await;
    server.place(NODE, stopped(&moved));
    // Far less than the client's patience with a checkpoint (a minute): a stopped alloc
    // does not wait for it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runner = client.runner(&moved.id).expect("its runner, built");
    assert!(
        runner.alloc().desired_status.is_stop(),
        "its runner was built from the version it arrived with, not the stop"
    );
    assert!(
        !ever_reported_running(&server, &moved.id),
        "an alloc stopped before it started ran"
    );
}

/// A server whose fetch of the stopped version of one alloc waits, before it answers, until
/// `runner_started` says that alloc's runner is in the client's map: the window in which an
/// answer's diff, made before that runner started, names the alloc as new.
struct FetchOutlivesTheStart {
    inner: Arc<InMemoryServer>,
    alloc_id: String,
    release_checkpoint: Arc<Notify>,
    client: OnceLock<Client>,
    held: AtomicBool,
}

#[async_trait::async_trait]
impl ServerApi for FetchOutlivesTheStart {
    async fn register_node(
        &self,
        node_id: &str,
        info: &caravan_host::model::node::NodeInfo,
    ) -> Result<(), ServerError> {
        self.inner.register_node(node_id, info).await
    }

    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError> {
        self.inner.watch_allocs(node_id, min_index, wait).await
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        let stop_fetched = ids.contains(&self.alloc_id)
            && self
                .inner
                .alloc(&self.alloc_id)
                .is_some_and(|alloc| alloc.desired_status.is_stop());
        if stop_fetched && !self.held.swap(true, Ordering::SeqCst) {
            self.release_checkpoint.notify_one();
            let client = self.client.get().expect("the client, set before it starts");
            eventually("the moved alloc's runner to start", || {
                client.runner(&self.alloc_id).is_some()
            })
            .await;
        }
        self.inner.get_allocs(ids).await
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        self.inner.update_allocs(updates).await
    }
}

/// Found by the simulation (seed 683): an answer named a moved alloc as new (its runner was
/// not started when the answer was compared), and by the time the fetch of its stopped
/// version came back the runner had started; the client dropped that version as a
/// duplicate add, and the runner ran on until a later answer said it again.
#[tokio::test(start_paused = true)]
async fn a_stop_fetched_while_a_moved_alloc_starts_reaches_its_runner() {
    let _logs = LogCapture::start();
    let inner = InMemoryServer::new();
    let moved = moved_here();
    inner.place(NODE, moved.clone());
    let release_checkpoint = Arc::new(Notify::new());
    let server = Arc::new(FetchOutlivesTheStart {
        inner: inner.clone(),
        alloc_id: moved.id.clone(),
        release_checkpoint: release_checkpoint.clone(),
        client: OnceLock::new(),
        held: AtomicBool::new(false),
    });
    let asks = Arc::new(AtomicU32::new(0));
    let counted = asks.clone();
    let released_once_asked: CheckpointSource = Arc::new(move |_previous| {
        counted.fetch_add(1, Ordering::SeqCst);
        let release = release_checkpoint.clone();
        Box::pin(async move {
            release.notified().await;
            Ok(None)
        })
    });
    let client = client_on(server.clone(), memory_disk());
    client.fetch_checkpoints_from(released_once_asked);
    let _ = server.client.set(client.clone());
    client.start();

    eventually("the ask for its checkpoint", || {
        asks.load(Ordering::SeqCst) >= 1
    })
    .await;
    inner.place(NODE, stopped(&moved));
    eventually("its runner, started", || client.runner(&moved.id).is_some()).await;
    // Far less than the watch's wait: no later answer repeats the stop meanwhile.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let runner = client.runner(&moved.id).expect("its runner");
    assert!(
        runner.alloc().desired_status.is_stop(),
        "the stop fetched while its runner started never reached it"
    );
    assert!(
        runner.alloc_state().client_status.is_terminal(),
        "still {:?} 10 s after the stop was fetched",
        runner.alloc_state().client_status
    );
}

/// Found by the simulation (seed 282): an answer with a stop for a running alloc and a new
/// alloc applied the stop only after the new alloc's commit, which a failing disk held
/// through the persister's backoff (up to 10 s): the stopped alloc ran that much longer.
#[tokio::test(start_paused = true)]
async fn a_stop_does_not_wait_for_a_new_allocs_commit_on_a_failing_disk() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let running = alloc("native", &["main"], &[]);
    let (client, disk) = client_running(&server, &running).await;

    // The disk fails, and keeps failing a commit (another alloc's, refused) long enough for
    // the persister's backoff to reach its cap.
    disk.fail_writes(true);
    server.place(NODE, alloc("native", &["main"], &[]));
    tokio::time::sleep(Duration::from_secs(60)).await;
    let newcomer = alloc("native", &["main"], &[]);
    server.place_many(NODE, [stopped(&running), newcomer]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let state = client.alloc_state(&running.id).expect("its state");
    assert!(
        state.client_status.is_terminal(),
        "the stop waited behind the new alloc's commit: still {:?} 500 ms after the answer",
        state.client_status
    );
}

/// A source that answers "not yet" until `released`, then `checkpoint`.
fn released_later(
    asks: Arc<AtomicU32>,
    released: Arc<AtomicBool>,
    checkpoint: &'static [u8],
) -> CheckpointSource {
    Arc::new(move |_previous| {
        asks.fetch_add(1, Ordering::SeqCst);
        let answer = match released.load(Ordering::SeqCst) {
            true => Ok(Some(checkpoint.to_vec())),
            false => Err(CheckpointFetch::NotYet("still shutting down".into())),
        };
        Box::pin(async move { answer })
    })
}

/// Found in review: an alloc moved here and evicted in turn (its new node drained too)
/// while it fetched its checkpoint must not run, and must hand that checkpoint on to its
/// own replacement, as any evicted alloc hands on its own.
#[tokio::test(start_paused = true)]
async fn an_alloc_evicted_while_its_checkpoint_is_fetched_hands_it_on_without_running() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let moved = moved_here();
    server.place(NODE, moved.clone());
    let (asks, released) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let client = client_on(server.clone(), memory_disk());
    client.fetch_checkpoints_from(released_later(asks.clone(), released.clone(), b"count=41"));
    client.start();

    eventually("the ask for its checkpoint", || {
        asks.load(Ordering::SeqCst) >= 1
    })
    .await;
    server.place(
        NODE,
        Alloc {
            desired_status: DesiredStatus::Evict,
            ..stopped(&moved)
        },
    );
    // It goes on asking (an eviction is no reason to give up the checkpoint), and, asked
    // for it itself meanwhile, says it is not final yet.
    let asked_before = asks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        asks.load(Ordering::SeqCst) > asked_before,
        "it stopped asking for its checkpoint once evicted"
    );
    assert!(
        matches!(
            client.migration_checkpoint(&moved.id).await,
            Err(CheckpointUnavailable::NotFinal(_))
        ),
        "asked for its checkpoint while it still fetched it, it did not say \"not yet\""
    );
    released.store(true, Ordering::SeqCst);
    eventually("its runner, built", || client.runner(&moved.id).is_some()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !ever_reported_running(&server, &moved.id),
        "an alloc evicted before it started ran"
    );
    assert_eq!(
        client.migration_checkpoint(&moved.id).await,
        Ok(Some(b"count=41".to_vec())),
        "the checkpoint it fetched is not handed on"
    );
}

/// Found in review: an alloc moved here that the server dropped while its checkpoint was
/// fetched (its job purged) was never named as removed, being in neither of the client's
/// maps, and its runner started once the wait ran out.
#[tokio::test(start_paused = true)]
async fn an_alloc_dropped_while_its_checkpoint_is_fetched_is_never_built() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let (client, moved, disk) = moved_here_waiting_for_ever(&server).await;
    server.remove(&moved.id);
    tokio::time::sleep(Duration::from_secs(90)).await;
    client.flush_state().await;
    let saved = caravan_host::state::StateDb::client_allocs(disk.as_ref()).unwrap();
    assert!(
        saved.iter().all(|record| record.alloc_id != moved.id),
        "the record of an alloc the server dropped is kept"
    );
    assert!(
        client.runner(&moved.id).is_none(),
        "a runner was built for an alloc the server dropped"
    );
    assert!(!ever_reported_running(&server, &moved.id));
    assert!(!client.alloc_ids().contains(&moved.id));
}

/// Found by the simulation once it checked what a drained node serves (seed 1,584): an
/// alloc shut down to move, whose node restarted before its replacement fetched the
/// checkpoint, was restored finished and collected at once (the hold of its checkpoint is
/// in memory only), and its replacement started afresh.
#[tokio::test(start_paused = true)]
async fn an_evicted_allocs_checkpoint_is_held_for_its_replacement_across_a_restart() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let leaving = alloc("native", &["main"], &[]);
    let (first, disk) = client_running(&server, &leaving).await;
    let checkpoint = caravan_host::state::Write::PutCheckpoint {
        alloc_id: leaving.id.clone(),
        data: b"count=12".to_vec(),
    };
    caravan_host::state::StateDb::apply(disk.as_ref(), vec![checkpoint]).unwrap();
    let evicted = Alloc {
        desired_status: DesiredStatus::Evict,
        ..stopped(&leaving)
    };
    server.place(NODE, evicted);
    eventually("the alloc shut down to move", || {
        server
            .client_state(&leaving.id)
            .is_some_and(|state| state.client_status.is_terminal())
    })
    .await;
    first.flush_state().await;
    first.halt();

    let second = client_on(server.clone(), disk.clone());
    second.restore().await.unwrap();
    second.start();
    // Its GC keeps nothing finished (`gc_config(0, _)`) unless it is held, and runs at the
    // next change: a new alloc.
    server.place(NODE, alloc("native", &["main"], &[]));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        second.migration_checkpoint(&leaving.id).await,
        Ok(Some(b"count=12".to_vec())),
        "the restarted node lost the checkpoint it holds for the replacement"
    );
}
