//! The garbage collector through the client: when it marks, skips and collects, how many
//! destroys it runs at once, and the disk and inode thresholds.

use super::*;
use caravan_host::allocrunner::{
    AllocRunnerConfig, Latch, LatchTrigger, NotRunningReason, StateUpdater, TaskActionError,
};
use caravan_host::model::structs::{AllocState, DesiredStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::watch;

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
