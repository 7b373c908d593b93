//! The alloc map and its sync with the server: allocs the server drops, runners that fail to
//! build, wasm runners, stray updates, a client shutting down mid-build, and an alloc named
//! as new again while it starts.

use super::*;
use caravan_host::allocrunner::AllocRunnerConfig;
use caravan_host::model::structs::DesiredStatus;
use caravan_host::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use caravan_host::runtime::WasmAllocRunnerFactory;
use std::time::Duration;

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

/// A server whose second watch answers at once with the first answer's allocs (as one whose
/// index moved for something else would), and whose second fetch is slow, with the client's
/// disk failing from then on: the window in which an alloc moved here from a drained node
/// starts on a task of its own while a second answer still names it as new.
struct SlowSecondFetch {
    inner: Arc<InMemoryServer>,
    client_disk: Arc<caravan_host::testing::FaultyStateDb>,
    watches: std::sync::atomic::AtomicU32,
    fetches: std::sync::atomic::AtomicU32,
    first_answer: Mutex<Option<NodeAllocs>>,
}

#[async_trait::async_trait]
impl ServerApi for SlowSecondFetch {
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
        use std::sync::atomic::Ordering;
        if self.watches.fetch_add(1, Ordering::SeqCst) == 1 {
            let first = self.first_answer.lock().unwrap().clone().unwrap();
            return Ok(NodeAllocs {
                index: first.index + 1,
                allocs: first.allocs,
            });
        }
        let answer = self.inner.watch_allocs(node_id, min_index, wait).await?;
        self.first_answer
            .lock()
            .unwrap()
            .get_or_insert_with(|| answer.clone());
        Ok(answer)
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        use std::sync::atomic::Ordering;
        if self.fetches.fetch_add(1, Ordering::SeqCst) == 1 {
            self.client_disk.fail_writes(true);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.inner.get_allocs(ids).await
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        self.inner.update_allocs(updates).await
    }
}

/// Found by the simulation (seed 60,459): the second answer's save failed, and the client
/// failed the alloc, reported it failed while its runner ran, and its GC destroyed it.
#[tokio::test(start_paused = true)]
async fn an_alloc_starting_after_a_move_is_not_failed_by_a_slow_second_answer() {
    let _logs = LogCapture::start();
    let inner = InMemoryServer::new();
    let client_disk = Arc::new(caravan_host::testing::FaultyStateDb::new(Arc::new(
        caravan_host::state::MemoryStateDb::new(),
    )));
    let server = Arc::new(SlowSecondFetch {
        inner: inner.clone(),
        client_disk: client_disk.clone(),
        watches: Default::default(),
        fetches: Default::default(),
        first_answer: Mutex::new(None),
    });
    let moved = Alloc {
        previous_alloc: Some(caravan_host::model::structs::PreviousAlloc {
            alloc_id: "drained-away".into(),
            node_id: "node-2".into(),
            checkpoint: true,
        }),
        ..alloc("native", &["main"], &[])
    };
    inner.place(NODE, moved.clone());
    let mut config = ClientConfig::new(NODE, own_data_dir());
    config.gc = gc_config(0, 2);
    let client = Client::with_state(
        config,
        server.clone(),
        empty_factory(),
        Arc::new(FakeStats::default()),
        client_disk.clone(),
    );
    client.start();

    eventually("the second fetch", || {
        server.fetches.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    client_disk.fail_writes(false);
    eventually("running and reported so", || {
        inner
            .client_state(&moved.id)
            .is_some_and(|state| state.client_status == ClientStatus::Running)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let runner = client.runner(&moved.id).expect("its runner");
    assert_eq!(runner.alloc_state().client_status, ClientStatus::Running);
    assert!(!runner.is_destroyed(), "the GC destroyed a running alloc");
    assert_eq!(
        inner
            .client_state(&moved.id)
            .map(|state| state.client_status),
        Some(ClientStatus::Running),
        "the server heard it failed"
    );
}
