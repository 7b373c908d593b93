//! The client core against the in-memory server: the alloc map, sync and the garbage
//! collector, each Nomad invariant by name. Runners here are native (no wasm) except where a
//! test says so.

use crate::support::*;
use caravan_host::allocrunner::{
    AllocRunner, AllocRunnerConfig, AllocRunnerFactory, EmptyAllocRunner, Latch, LatchTrigger,
    NotRunningReason, StateUpdater, TaskActionError,
};
use caravan_host::client::gc::{DiskStats, GcConfig, StatsSource};
use caravan_host::client::{Client, ClientConfig};
use caravan_host::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use caravan_host::runtime::WasmAllocRunnerFactory;
use caravan_host::structs::{Alloc, AllocState, ClientStatus, DesiredStatus};
use caravan_host::testing::InMemoryServer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

const NODE: &str = "node-1";

/// Disk usage set by the test.
#[derive(Default)]
struct FakeStats(Mutex<(f64, f64)>);

impl FakeStats {
    fn set(&self, used_percent: f64, inodes_used_percent: f64) {
        *self.0.lock().unwrap() = (used_percent, inodes_used_percent);
    }
}

impl StatsSource for FakeStats {
    fn stats(&self) -> std::io::Result<DiskStats> {
        let (used_percent, inodes_used_percent) = *self.0.lock().unwrap();
        Ok(DiskStats {
            used_percent,
            inodes_used_percent,
        })
    }
}

fn empty_factory() -> AllocRunnerFactory {
    Arc::new(|config| Ok(Arc::new(EmptyAllocRunner::new(config)) as Arc<dyn AllocRunner>))
}

fn client(
    server: &Arc<InMemoryServer>,
    factory: AllocRunnerFactory,
    gc: GcConfig,
    stats: Arc<FakeStats>,
) -> Client {
    let mut config = ClientConfig::new(NODE, own_data_dir());
    config.gc = gc;
    let client = Client::new(config, server.clone(), factory, stats);
    client.start();
    client
}

/// A data dir for one client: clients sharing one would sweep each other's alloc dirs as
/// leftovers and list each other's log files. Kept (not removed on drop), as the client
/// outlives its maker; `run-tests` clears the tests' temp dir at each run.
fn own_data_dir() -> std::path::PathBuf {
    tempfile::tempdir()
        .expect("a temp dir for the client")
        .keep()
}

fn gc_config(max_allocs: usize, parallel_destroys: i64) -> GcConfig {
    GcConfig {
        max_allocs,
        parallel_destroys,
        interval: std::time::Duration::from_secs(3600),
        ..GcConfig::default()
    }
}

fn allocs(job: &str, count: usize) -> Vec<Alloc> {
    (0..count)
        .map(|i| Alloc {
            id: format!("{job}-{i:03}"),
            job_id: job.into(),
            ..alloc("native", &["main"], &[])
        })
        .collect()
}

fn status_of(client: &Client, id: &str) -> Option<ClientStatus> {
    client.alloc_state(id).map(|state| state.client_status)
}

fn skipped_lines(logs: &LogCapture) -> Vec<serde_json::Value> {
    logs.with_message("garbage collection skipped because no terminal allocations")
}

#[tokio::test(start_paused = true)]
async fn gc_skipped_line_is_info_at_19_allocs_over_a_limit_of_10_and_warn_at_21() {
    let logs = LogCapture::start();
    let server = InMemoryServer::new();
    let client = client(&server, empty_factory(), gc_config(10, 2), Arc::default());
    server.place_many(NODE, allocs("web", 19));
    eventually("19 running allocs and one GC pass", || {
        client.live_allocs() == 19 && client.gc().passes() >= 1
    })
    .await;
    let lines = skipped_lines(&logs);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["level"], "INFO");
    assert_eq!(
        lines[0]["fields"]["reason"],
        "number of allocations (19) is over the limit (10)"
    );

    // Scaled to 21: over twice the limit, so the same line turns into a warning.
    server.place_many(NODE, allocs("web", 21));
    eventually("21 allocs and another pass", || {
        client.live_allocs() == 21 && client.gc().passes() >= 2
    })
    .await;
    let lines = skipped_lines(&logs);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(lines[1]["level"], "WARN");
    assert_eq!(
        lines[1]["fields"]["reason"],
        "number of allocations (21) is over the limit (10)"
    );
}

/// A native runner that reports `complete` a given number of times and whose destroy waits
/// for a gate the test opens, counting destroys in flight: a barrier, not a timer.
struct GatedRunner {
    alloc: Arc<Alloc>,
    updater: Arc<dyn StateUpdater>,
    reports: usize,
    gate: watch::Receiver<bool>,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
    destroy_started: std::sync::atomic::AtomicBool,
    destroyed: Arc<LatchTrigger>,
    stopped: LatchTrigger,
}

impl AllocRunner for GatedRunner {
    fn alloc(&self) -> Arc<Alloc> {
        self.alloc.clone()
    }
    fn run(&self) {
        for _ in 0..self.reports {
            self.updater
                .alloc_state_updated(&self.alloc.id, &self.alloc_state());
        }
        self.stopped.set();
    }
    fn update(&self, _alloc: Arc<Alloc>) {}
    fn shutdown(&self) {}
    fn signal(&self, task: Option<&str>, _signal: &str) -> Result<(), TaskActionError> {
        self.restart_task(task)
    }
    fn restart_task(&self, _task: Option<&str>) -> Result<(), TaskActionError> {
        let (alloc_id, reason) = (
            self.alloc.id.clone(),
            NotRunningReason::Finished(ClientStatus::Complete),
        );
        Err(TaskActionError::NotRunning { alloc_id, reason })
    }
    fn destroy(&self) {
        if self.destroy_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let (mut gate, in_flight, destroyed) = (
            self.gate.clone(),
            self.in_flight.clone(),
            self.destroyed.clone(),
        );
        tokio::spawn(async move {
            let _ = gate.wait_for(|open| *open).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            destroyed.set();
        });
    }
    fn alloc_state(&self) -> AllocState {
        AllocState {
            client_status: ClientStatus::Complete,
            description: "done".into(),
            task_states: vec![],
        }
    }
    fn is_destroyed(&self) -> bool {
        self.destroyed.latch().is_set()
    }
    fn wait(&self) -> Latch {
        self.stopped.latch()
    }
    fn shutdown_done(&self) -> Latch {
        self.stopped.latch()
    }
    fn destroyed(&self) -> Latch {
        self.destroyed.latch()
    }
}

/// Builds [`GatedRunner`]s sharing one gate and one pair of in-flight counters.
struct Gated {
    gate: watch::Sender<bool>,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
}

impl Gated {
    fn new() -> Arc<Self> {
        Arc::new(Gated {
            gate: watch::channel(false).0,
            in_flight: Arc::default(),
            most_in_flight: Arc::default(),
        })
    }

    fn factory(self: &Arc<Self>, reports: usize) -> AllocRunnerFactory {
        let gated = self.clone();
        Arc::new(move |config: AllocRunnerConfig| {
            Ok(Arc::new(GatedRunner {
                alloc: config.alloc,
                updater: config.state_updater,
                reports,
                gate: gated.gate.subscribe(),
                in_flight: gated.in_flight.clone(),
                most_in_flight: gated.most_in_flight.clone(),
                destroy_started: Default::default(),
                destroyed: Arc::new(Latch::new().0),
                stopped: Latch::new().0,
            }) as Arc<dyn AllocRunner>)
        })
    }

    fn open(&self) {
        self.gate.send_replace(true);
    }
}

#[tokio::test(start_paused = true)]
async fn marking_allocation_for_gc_is_logged_once_for_an_alloc_reporting_terminal_five_times() {
    let logs = LogCapture::start();
    let server = InMemoryServer::new();
    let gated = Gated::new();
    let client = client(&server, gated.factory(5), gc_config(50, 2), Arc::default());
    server.place(NODE, alloc("native", &["main"], &[]));
    eventually("the alloc is marked", || client.gc().queued() == 1).await;
    assert_eq!(logs.with_message("marking allocation for GC").len(), 1);
    assert_eq!(client.metrics().allocs_marked, 1);
}

#[tokio::test(start_paused = true)]
async fn destroys_in_flight_never_exceed_gc_parallel_destroys() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let gated = Gated::new();
    let client = client(&server, gated.factory(1), gc_config(10, 3), Arc::default());
    server.place_many(NODE, allocs("batch", 200));
    eventually("three destroys in flight", || {
        gated.in_flight.load(Ordering::SeqCst) == 3
    })
    .await;
    // Give every other waiting destroy the chance to start, were the limit not enforced.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(gated.most_in_flight.load(Ordering::SeqCst), 3);
    assert_eq!(client.metrics().destroys_in_flight, 3);

    gated.open();
    eventually("190 allocs collected", || client.live_allocs() == 10).await;
    assert_eq!(
        gated.most_in_flight.load(Ordering::SeqCst),
        3,
        "never more than 3 at once"
    );
    assert_eq!(
        client.metrics().destroys_in_flight_peak,
        3,
        "the metrics' peak is what the destroys saw"
    );
    assert_eq!(
        client.alloc_ids().len(),
        200,
        "collected allocs stay in the map"
    );
    assert_eq!(client.metrics().allocs_collected["alloc_count"], 190);
}

#[tokio::test(start_paused = true)]
async fn gc_parallel_destroys_of_zero_becomes_one_with_a_warning() {
    let logs = LogCapture::start();
    let server = InMemoryServer::new();
    let client = client(&server, empty_factory(), gc_config(50, 0), Arc::default());
    assert_eq!(client.gc().parallel_destroys(), 1);
    let warning = logs.with_message("gc_parallel_destroys must be greater than 0; using 1");
    assert_eq!(warning.len(), 1);
    assert_eq!(warning[0]["level"], "WARN");
}

#[tokio::test(start_paused = true)]
async fn a_collected_alloc_stays_in_the_map_until_the_server_drops_it() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let client = client(&server, empty_factory(), gc_config(50, 2), Arc::default());
    let done = alloc("native", &["main"], &[]);
    server.place(NODE, done.clone());
    eventually("running", || {
        status_of(&client, &done.id) == Some(ClientStatus::Running)
    })
    .await;
    // The job is stopped: the runner is killed and ends complete.
    server.place(
        NODE,
        Alloc {
            desired_status: DesiredStatus::Stop,
            modify_index: 2,
            ..done.clone()
        },
    );
    eventually("complete on the server", || {
        server
            .client_state(&done.id)
            .is_some_and(|s| s.client_status == ClientStatus::Complete)
    })
    .await;

    client.collect(&done.id).await.unwrap();
    let runner = client
        .runner(&done.id)
        .expect("still in the map after collection");
    assert!(runner.is_destroyed());
    assert_eq!(
        status_of(&client, &done.id),
        Some(ClientStatus::Complete),
        "its final status is answerable"
    );
    assert_eq!(
        client.live_allocs(),
        0,
        "a destroyed runner no longer counts"
    );

    server.remove(&done.id);
    eventually("pruned", || client.runner(&done.id).is_none()).await;
    assert!(client.alloc_ids().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_server_dropping_a_running_alloc_kills_and_destroys_it() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let client = client(&server, empty_factory(), gc_config(50, 2), Arc::default());
    let running = alloc("native", &["main"], &[]);
    server.place(NODE, running.clone());
    eventually("running", || {
        status_of(&client, &running.id) == Some(ClientStatus::Running)
    })
    .await;
    let runner = client.runner(&running.id).unwrap();
    assert_eq!(client.live_allocs(), 1);

    server.remove(&running.id);
    within("destroyed", runner.destroyed().wait()).await;
    // Pruned from the map at once, but live (it holds its sandbox) until destroyed.
    eventually("no live alloc", || client.live_allocs() == 0).await;
    assert_eq!(
        runner.alloc_state().client_status,
        ClientStatus::Complete,
        "killed before it was freed"
    );
    assert!(client.runner(&running.id).is_none(), "pruned from the map");
    assert_eq!(client.metrics().allocs_collected["server_removed"], 1);
}

#[tokio::test(start_paused = true)]
async fn forced_collection_refuses_a_running_alloc_and_collect_all_takes_every_terminal_one() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let client = client(&server, empty_factory(), gc_config(50, 2), Arc::default());
    let batch = allocs("batch", 3);
    server.place_many(NODE, batch.clone());
    eventually("three running", || client.live_allocs() == 3).await;

    let refused = client.collect(&batch[0].id).await.unwrap_err().to_string();
    assert_eq!(
        refused,
        format!(
            "allocation {} is running; only terminal allocations can be collected",
            batch[0].id
        )
    );
    assert_eq!(
        client.collect("nope").await.unwrap_err().to_string(),
        "unknown allocation nope"
    );

    for alloc in &batch[..2] {
        server.place(
            NODE,
            Alloc {
                desired_status: DesiredStatus::Stop,
                modify_index: 2,
                ..alloc.clone()
            },
        );
    }
    eventually("two marked", || client.gc().queued() == 2).await;
    client.collect_all().await;
    assert_eq!(client.live_allocs(), 1, "the running one is left alone");
    assert_eq!(client.metrics().allocs_collected["forced_full_node"], 2);
}

#[tokio::test(start_paused = true)]
async fn disk_and_inode_thresholds_drive_collection_through_the_stats_source() {
    let logs = LogCapture::start();
    let server = InMemoryServer::new();
    let stats = Arc::new(FakeStats::default());
    let client = client(&server, empty_factory(), gc_config(50, 2), stats.clone());
    let batch = allocs("batch", 2);
    server.place_many(NODE, batch.clone());
    eventually("two running", || client.live_allocs() == 2).await;
    for alloc in &batch {
        server.place(
            NODE,
            Alloc {
                desired_status: DesiredStatus::Stop,
                modify_index: 2,
                ..alloc.clone()
            },
        );
    }
    eventually("two marked", || client.gc().queued() == 2).await;
    assert_eq!(
        client.live_allocs(),
        2,
        "under every threshold: nothing collected"
    );

    stats.set(91.0, 10.0);
    let gc = client.gc().clone();
    gc.pass().await;
    assert_eq!(
        client.live_allocs(),
        0,
        "disk over 80: both collected, then skipped"
    );
    assert_eq!(logs.with_message("garbage collecting allocation").len(), 2);
    let skipped = skipped_lines(&logs);
    assert_eq!(
        skipped.last().unwrap()["fields"]["reason"],
        "disk usage of 91 is over gc threshold of 80"
    );
    assert_eq!(skipped.last().unwrap()["level"], "WARN");

    // Disk back under its threshold; a third alloc finishes; inode usage over 70 collects it.
    stats.set(10.0, 10.0);
    let third = Alloc {
        id: "batch-third".into(),
        ..batch[0].clone()
    };
    server.place(NODE, third.clone());
    eventually("third running", || client.live_allocs() == 1).await;
    server.place(
        NODE,
        Alloc {
            desired_status: DesiredStatus::Stop,
            modify_index: 3,
            ..third
        },
    );
    eventually("third marked", || client.gc().queued() == 1).await;
    stats.set(10.0, 75.0);
    gc.pass().await;
    assert_eq!(client.live_allocs(), 0, "inodes over 70: collected");
    let skipped = skipped_lines(&logs);
    assert_eq!(
        skipped.last().unwrap()["fields"]["reason"],
        "inode usage of 75 is over gc threshold of 70"
    );
    let collected = client.metrics().allocs_collected;
    assert_eq!((collected["disk_usage"], collected["inode_usage"]), (2, 1));
    assert_eq!(client.metrics().allocs_destroyed, 3);
}

#[tokio::test(start_paused = true)]
async fn a_factory_error_fails_one_alloc_and_leaves_its_neighbours_running() {
    let logs = LogCapture::start();
    let server = InMemoryServer::new();
    let factory: AllocRunnerFactory = Arc::new(|config: AllocRunnerConfig| {
        if config.alloc.id.ends_with("-001") {
            anyhow::bail!("runner component broken.wasm does not exist")
        }
        Ok(Arc::new(EmptyAllocRunner::new(config)) as Arc<dyn AllocRunner>)
    });
    let client = client(&server, factory, gc_config(50, 2), Arc::default());
    let batch = allocs("web", 3);
    server.place_many(NODE, batch.clone());
    eventually("the failure reaches the server", || {
        server
            .client_state("web-001")
            .is_some_and(|s| s.client_status == ClientStatus::Failed)
    })
    .await;
    assert_eq!(
        server.client_state("web-001").unwrap().description,
        "runner component broken.wasm does not exist"
    );
    assert_eq!(status_of(&client, "web-000"), Some(ClientStatus::Running));
    assert_eq!(status_of(&client, "web-002"), Some(ClientStatus::Running));
    assert_eq!(
        logs.with_message("failed to build the alloc's runner")
            .len(),
        1
    );

    // Later updates of the failed alloc are ignored: no second attempt, no second line.
    server.place(
        NODE,
        Alloc {
            modify_index: 5,
            ..batch[1].clone()
        },
    );
    server.place(
        NODE,
        Alloc {
            modify_index: 2,
            ..batch[0].clone()
        },
    );
    eventually("the neighbour's update applied", || {
        client
            .runner("web-000")
            .is_some_and(|r| r.alloc().modify_index == 2)
    })
    .await;
    assert_eq!(
        logs.with_message("failed to build the alloc's runner")
            .len(),
        1
    );
    assert_eq!(status_of(&client, "web-001"), Some(ClientStatus::Failed));
    assert_eq!(client.metrics().runner_build_failures, 1);
}

#[tokio::test(start_paused = true)]
async fn a_missing_runner_component_fails_that_alloc_naming_the_path() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let factory = WasmAllocRunnerFactory::new(runtime()).into_factory();
    let client = client(&server, factory, gc_config(50, 2), Arc::default());
    let missing = alloc("/no/such/runner.wasm", &["main"], &[]);
    server.place(NODE, missing.clone());
    eventually("failed", || {
        status_of(&client, &missing.id) == Some(ClientStatus::Failed)
    })
    .await;
    assert_eq!(
        client.alloc_state(&missing.id).unwrap().description,
        "runner component /no/such/runner.wasm does not exist"
    );
}

#[tokio::test(start_paused = true)]
async fn wasm_sleepers_run_through_the_client_and_their_states_reach_the_server() {
    let _logs = LogCapture::start();
    let server = InMemoryServer::new();
    let factory = WasmAllocRunnerFactory::new(runtime()).into_factory();
    let client = client(&server, factory, gc_config(50, 2), Arc::default());
    let sleepers: Vec<Alloc> = (0..3)
        .map(|i| Alloc {
            id: format!("sleeper-{i}"),
            ..alloc(
                caravan_test_artifacts::SLEEPER,
                &["main"],
                &[("run_for", "2s")],
            )
        })
        .collect();
    server.place_many(NODE, sleepers.clone());
    eventually("all complete on the server", || {
        sleepers.iter().all(|a| {
            server
                .client_state(&a.id)
                .is_some_and(|s| s.client_status == ClientStatus::Complete)
        })
    })
    .await;
    assert_eq!(server.nodes(), [NODE]);
    assert_eq!(
        client.gc().queued(),
        3,
        "each finished alloc is marked for collection"
    );
    assert_eq!(client.metrics().allocs_by_status["complete"], 3);
}

/// A server that answers `get_allocs` with one alloc nobody asked for.
struct StraySender {
    inner: Arc<InMemoryServer>,
    stray: Arc<Alloc>,
}

#[async_trait::async_trait]
impl ServerApi for StraySender {
    async fn register_node(&self, node_id: &str) -> Result<(), ServerError> {
        self.inner.register_node(node_id).await
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
        let mut allocs = self.inner.get_allocs(ids).await?;
        allocs.push(self.stray.clone());
        Ok(allocs)
    }
    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        self.inner.update_allocs(updates).await
    }
}

#[tokio::test(start_paused = true)]
async fn an_update_for_an_unknown_alloc_is_logged_and_ignored() {
    let logs = LogCapture::start();
    let inner = InMemoryServer::new();
    let stray = Arc::new(Alloc {
        id: "stray".into(),
        ..alloc("native", &["main"], &[])
    });
    let server = Arc::new(StraySender {
        inner: inner.clone(),
        stray,
    });
    let mut config = ClientConfig::new(NODE, own_data_dir());
    config.gc = gc_config(50, 2);
    let client = Client::new(
        config,
        server,
        empty_factory(),
        Arc::new(FakeStats::default()),
    );
    client.start();
    let real = alloc("native", &["main"], &[]);
    inner.place(NODE, real.clone());
    eventually("the real alloc runs", || {
        status_of(&client, &real.id) == Some(ClientStatus::Running)
    })
    .await;
    let warning = logs.with_message("cannot update nonexistent alloc");
    assert_eq!(warning.len(), 1);
    assert_eq!(warning[0]["level"], "WARN");
    assert_eq!(warning[0]["fields"]["alloc_id"], "stray");
    assert!(client.runner("stray").is_none());
}

/// A node shutting down (as a simulated restart does) must not start a runner whose build
/// was under way: the node's next run starts it, and two would run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_runner_starts_once_the_client_is_shutting_down() {
    let server = InMemoryServer::new();
    let (building_tx, building) = std::sync::mpsc::channel::<()>();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = std::sync::Mutex::new(release_rx);
    // Every runner built, weakly: one the client let go is gone; one it started is held.
    let built: Arc<std::sync::Mutex<Vec<std::sync::Weak<EmptyAllocRunner>>>> = Arc::default();
    let factory: AllocRunnerFactory = Arc::new({
        let built = built.clone();
        move |config: AllocRunnerConfig| {
            // Each build waits for the test's word.
            let _ = building_tx.send(());
            let _ = release_rx.lock().unwrap().recv();
            let runner = Arc::new(EmptyAllocRunner::new(config));
            built.lock().unwrap().push(Arc::downgrade(&runner));
            Ok(runner as Arc<dyn AllocRunner>)
        }
    });
    let client = client(&server, factory, gc_config(50, 2), Arc::default());
    let building = Arc::new(std::sync::Mutex::new(building));
    let build_begins = |what: &'static str| {
        let building = building.clone();
        within(what, async move {
            tokio::task::spawn_blocking(move || building.lock().unwrap().recv().unwrap())
                .await
                .unwrap()
        })
    };
    server.place_many(NODE, allocs("late", 2));
    build_begins("the first build to begin").await;
    client.shutdown_all().await;
    release.send(()).unwrap();
    build_begins("the second build to begin").await;
    release.send(()).unwrap();
    // Both builds end after the shutdown; a runner the client started would be in its map
    // (and so alive), one it refused is dropped.
    eventually(
        "both built runners to be let go (a runner started after shutdown_all)",
        || {
            let built = built.lock().unwrap();
            built.len() == 2 && built.iter().all(|runner| runner.strong_count() == 0)
        },
    )
    .await;
    for id in ["late-000", "late-001"] {
        assert!(
            client.runner(id).is_none(),
            "{id} started after shutdown_all"
        );
    }
    client.flush_state().await;
}
