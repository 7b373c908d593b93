use super::super::{EmbeddedServer, ServerConfig};
use crate::model::jobspec::JobType;
use crate::model::structs::{AllocState, ClientStatus};
use crate::rpc::{AllocUpdate, ServerApi, ServerError};
use crate::server::testkit::spec;
use crate::state::{MemoryStateDb, SavedAlloc, ServerTable, StateDb, StateError, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

/// A store whose next save, once armed, waits for the test to release it: a save under way
/// for as long as the test needs to queue reports behind it.
struct GatedDb {
    inner: MemoryStateDb,
    saves: AtomicU64,
    hold_next: AtomicBool,
    entered: Mutex<mpsc::Sender<()>>,
    release: Mutex<mpsc::Receiver<()>>,
}

impl StateDb for GatedDb {
    fn apply(&self, writes: Vec<Write>) -> Result<(), StateError> {
        if self.hold_next.swap(false, Ordering::SeqCst) {
            self.entered.lock().unwrap().send(()).unwrap();
            self.release.lock().unwrap().recv().unwrap();
        }
        self.saves.fetch_add(1, Ordering::SeqCst);
        self.inner.apply(writes)
    }

    fn client_allocs(&self) -> Result<Vec<SavedAlloc>, StateError> {
        self.inner.client_allocs()
    }

    fn server_records(&self, table: ServerTable) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.inner.server_records(table)
    }
}

impl GatedDb {
    /// A gated store, the receiver told when a held save begins, and the sender that lets it
    /// go on.
    fn new() -> (Arc<GatedDb>, mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (entered, saving) = mpsc::channel();
        let (release, released) = mpsc::channel();
        let db = Arc::new(GatedDb {
            inner: MemoryStateDb::new(),
            saves: AtomicU64::new(0),
            hold_next: AtomicBool::new(false),
            entered: Mutex::new(entered),
            release: Mutex::new(released),
        });
        (db, saving, release)
    }

    fn saves(&self) -> u64 {
        self.saves.load(Ordering::SeqCst)
    }
}

/// Waits until `count` requests are queued behind the save under way; fails, rather than
/// hangs, when they never are (a request that blocks before it queues).
async fn until_waiting(server: &EmbeddedServer, count: usize) {
    let since = std::time::Instant::now();
    while server.requests_waiting() < count {
        assert!(
            since.elapsed() < std::time::Duration::from_secs(10),
            "{} of {count} requests queued behind the save",
            server.requests_waiting()
        );
        tokio::task::yield_now().await;
    }
}

fn running(alloc_id: &str) -> AllocUpdate {
    AllocUpdate {
        alloc_id: alloc_id.into(),
        state: AllocState {
            client_status: ClientStatus::Running,
            description: String::new(),
            task_states: vec![],
        }
        .into(),
    }
}

/// A server on `db` with node `n1` running `count` allocs of job `web`; their ids, in order.
async fn server_with_allocs(
    db: Arc<dyn StateDb>,
    count: u32,
) -> (Arc<EmbeddedServer>, Vec<String>) {
    let server = EmbeddedServer::open(ServerConfig::default(), db).unwrap();
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    server
        .register_job(spec("web", JobType::Service, count))
        .unwrap();
    let mut ids: Vec<String> = server.allocs().iter().map(|a| a.alloc.id.clone()).collect();
    ids.sort();
    (server, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_that_arrive_during_a_save_share_the_next_one_and_each_hears_its_own() {
    let (db, saving, release) = GatedDb::new();
    let (server, ids) = server_with_allocs(db.clone(), 3).await;
    let saves_before = db.saves();

    db.hold_next.store(true, Ordering::SeqCst);
    let report = |id: &String| {
        let (server, update) = (server.clone(), running(id));
        tokio::spawn(async move { server.update_allocs(&[update]).await })
    };
    let first = report(&ids[0]);
    saving.recv().unwrap(); // The first report's save has begun, and waits.
    let (second, third) = (report(&ids[1]), report(&ids[2]));
    until_waiting(&server, 2).await;
    release.send(()).unwrap();

    assert_eq!(first.await.unwrap().unwrap(), vec![ids[0].clone()]);
    assert_eq!(second.await.unwrap().unwrap(), vec![ids[1].clone()]);
    assert_eq!(third.await.unwrap().unwrap(), vec![ids[2].clone()]);
    assert_eq!(
        db.saves() - saves_before,
        2,
        "the first report's save, then one for the two that waited behind it"
    );
    for record in server.allocs() {
        let status = record.client_state.map(|s| s.client_status);
        assert_eq!(status, Some(ClientStatus::Running), "{}", record.alloc.id);
    }
}

#[tokio::test]
async fn a_report_whose_save_fails_is_not_acknowledged_and_is_taken_when_sent_again() {
    let db = Arc::new(crate::state::FaultyStateDb::new(Arc::new(
        MemoryStateDb::new(),
    )));
    let (server, ids) = server_with_allocs(db.clone(), 1).await;
    db.fail_writes(true);
    let refused = server.update_allocs(&[running(&ids[0])]).await.unwrap_err();
    assert!(
        matches!(&refused, ServerError::Unavailable(m) if m.starts_with("cannot save server state")),
        "{refused:?}"
    );
    db.fail_writes(false);
    assert_eq!(
        server.update_allocs(&[running(&ids[0])]).await.unwrap(),
        vec![ids[0].clone()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_join_during_a_save_join_in_the_next_one_and_share_the_waiting_allocs() {
    let (db, saving, release) = GatedDb::new();
    let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    server
        .register_job(spec("web", JobType::Service, 4))
        .unwrap();
    let waiting_alloc = server.allocs()[0].alloc.id.clone();
    let saves_before = db.saves();

    // A report of an alloc not yet placed is taken (and saved) all the same.
    db.hold_next.store(true, Ordering::SeqCst);
    let holder = {
        let (server, update) = (server.clone(), running(&waiting_alloc));
        tokio::spawn(async move { server.update_allocs(&[update]).await })
    };
    saving.recv().unwrap();
    let join = |node: &'static str| {
        let server = server.clone();
        tokio::spawn(async move { server.register_node(node, &Default::default()).await })
    };
    let (first, second) = (join("n1"), join("n2"));
    until_waiting(&server, 2).await;
    release.send(()).unwrap();

    assert_eq!(holder.await.unwrap().unwrap(), vec![waiting_alloc]);
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(
        db.saves() - saves_before,
        2,
        "the held save, then one for both nodes"
    );
    let on = |node: &str| {
        let allocs = server.allocs();
        allocs
            .iter()
            .filter(|a| a.node_id.as_deref() == Some(node))
            .count()
    };
    assert_eq!((on("n1"), on("n2")), (2, 2), "placed once both had joined");
}

#[tokio::test]
async fn a_node_registering_again_costs_no_save_and_is_answered_while_saves_fail() {
    let (db, server) = faulty_server();
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    db.fail_writes(true);
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    assert_eq!(db.failed_writes(), 0, "nothing to save for a known node");

    let refused = server
        .register_node("n2", &Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ServerError::Unavailable(_)),
        "{refused:?}"
    );
    // n2's change was forgotten with its failed save, so n1's next registration has nothing
    // to save again; n1 is still a node, and is told so: a node that cannot register cannot
    // watch.
    server
        .register_node("n1", &Default::default())
        .await
        .unwrap();
    assert_eq!(db.failed_writes(), 1);
    assert_eq!(server.nodes(), vec!["n1".to_string()], "n2 was refused");
}

fn faulty_server() -> (Arc<crate::state::FaultyStateDb>, Arc<EmbeddedServer>) {
    let db = Arc::new(crate::state::FaultyStateDb::new(Arc::new(
        MemoryStateDb::new(),
    )));
    let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    (db, server)
}

fn info_of_class(class: &str) -> crate::model::node::NodeInfo {
    crate::model::node::NodeInfo {
        class: class.into(),
        ..Default::default()
    }
}

/// Registers `node` as of `class`.
async fn register_as(server: &EmbeddedServer, node: &str, class: &str) -> Result<(), ServerError> {
    server.register_node(node, &info_of_class(class)).await
}

#[tokio::test]
async fn a_node_taken_down_keeps_what_it_said_of_itself_across_a_failed_save() {
    let (db, server) = faulty_server();
    register_as(&server, "n1", "edge").await.unwrap();
    server.node_down("n1").unwrap();
    db.fail_writes(true);
    server
        .register_job(spec("web", JobType::Service, 1))
        .unwrap_err();
    db.fail_writes(false);
    // Back without registering (it registers only after an error): as it said it was.
    server
        .watch_allocs("n1", 0, std::time::Duration::ZERO)
        .await
        .unwrap();
    let details = server.node_details();
    assert_eq!(details.len(), 1);
    assert_eq!(details[0].info.class, "edge");
}

#[tokio::test]
async fn a_node_the_server_does_not_know_is_told_to_register_when_it_watches() {
    let db = Arc::new(MemoryStateDb::new());
    let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    register_as(&server, "n1", "edge").await.unwrap();
    server.node_down("n1").unwrap();
    // What departed nodes said of themselves is kept in memory only: a restart forgets it.
    let server = EmbeddedServer::open(ServerConfig::default(), db).unwrap();
    let refused = server
        .watch_allocs("n1", 0, std::time::Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("register it again"),
        "{refused}"
    );
    assert!(
        server.node_details().is_empty(),
        "not taken back as saying nothing"
    );
    register_as(&server, "n1", "edge").await.unwrap();
    server
        .watch_allocs("n1", 0, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(server.node_details()[0].info.class, "edge");
}

#[tokio::test]
async fn a_known_node_that_says_something_new_is_told_when_that_is_not_saved() {
    let (db, server) = faulty_server();
    register_as(&server, "n1", "edge").await.unwrap();
    db.fail_writes(true);
    register_as(&server, "n1", "edge").await.unwrap();
    let refused = register_as(&server, "n1", "core").await.unwrap_err();
    assert!(
        matches!(refused, ServerError::Unavailable(_)),
        "{refused:?}"
    );
    assert_eq!(server.node_details()[0].info.class, "edge", "forgotten");
    db.fail_writes(false);
    register_as(&server, "n1", "core").await.unwrap();
    assert_eq!(server.node_details()[0].info.class, "core");
}

#[tokio::test]
async fn nothing_is_saved_while_the_state_cannot_be_read_back_after_a_failed_save() {
    let (db, server) = faulty_server();
    server
        .register_job(spec("web", JobType::Service, 1))
        .unwrap();
    db.fail_writes(true);
    db.fail_reads(true);
    server.scale_job("web", 4).unwrap_err();
    db.fail_writes(false);
    // The disk writes again but cannot be read: the scale still in memory must not ride
    // along with the next change, which is refused too.
    let refused = server
        .register_job(spec("api", JobType::Service, 1))
        .unwrap_err();
    assert!(
        refused.to_string().contains("cannot be read back"),
        "{refused}"
    );
    db.fail_reads(false);
    server
        .register_job(spec("api", JobType::Service, 1))
        .unwrap();
    let reopened = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    assert_eq!(reopened.job("web").unwrap().spec.count, 1);
    assert_eq!(server.job("web").unwrap().spec.count, 1);
    assert!(reopened.job("api").is_ok());
}

#[tokio::test]
async fn a_change_refused_because_its_save_failed_is_never_saved_by_a_later_one() {
    let (db, server) = faulty_server();
    server
        .register_job(spec("web", JobType::Service, 1))
        .unwrap();
    db.fail_writes(true);
    let refused = server.scale_job("web", 4).unwrap_err();
    assert!(
        matches!(refused, super::super::RequestError::NotSaved(_)),
        "{refused:?}"
    );
    assert_eq!(
        server.job("web").unwrap().spec.count,
        1,
        "forgotten at once"
    );
    db.fail_writes(false);
    // The next change saves only itself: the refused scale does not ride along.
    server
        .register_job(spec("api", JobType::Service, 1))
        .unwrap();
    let reopened = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    assert_eq!(reopened.job("web").unwrap().spec.count, 1);
    assert_eq!(server.job("web").unwrap().spec.count, 1);
    assert_eq!(server.job_allocs("web").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_whose_caller_went_away_before_its_group_is_not_applied() {
    let (db, saving, release) = GatedDb::new();
    let (server, ids) = server_with_allocs(db.clone(), 3).await;
    db.hold_next.store(true, Ordering::SeqCst);
    let report = |id: &String| {
        let (server, update) = (server.clone(), running(id));
        tokio::spawn(async move { server.update_allocs(&[update]).await })
    };
    let first = report(&ids[0]);
    saving.recv().unwrap();
    let gone = report(&ids[1]);
    until_waiting(&server, 1).await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    release.send(()).unwrap();
    first.await.unwrap().unwrap();

    // The abandoned report is still queued; the next caller's group passes over it.
    assert_eq!(
        report(&ids[2]).await.unwrap().unwrap(),
        vec![ids[2].clone()]
    );
    let status = |id: &String| {
        let allocs = server.allocs();
        let record = allocs.iter().find(|a| &a.alloc.id == id).unwrap();
        record.client_state.as_ref().map(|s| s.client_status)
    };
    assert_eq!(status(&ids[0]), Some(ClientStatus::Running));
    assert_eq!(
        status(&ids[1]),
        None,
        "its caller went away before it was taken"
    );
    assert_eq!(status(&ids[2]), Some(ClientStatus::Running));
    assert_eq!(server.requests_waiting(), 0);
}
