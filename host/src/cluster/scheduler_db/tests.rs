use super::*;
use crate::model::structs::{Alloc, Task};
use crate::testing::simulated_etcd::SimulatedEtcd;
use std::collections::BTreeSet;

/// A leader's store on an empty simulated etcd: its leader key won as an elected agent wins
/// it, for the writer to fence on. Saves block: make them with `spawn_blocking`.
async fn leading_db() -> (EtcdStore, EtcdSchedulerDb) {
    let store = SimulatedEtcd::new().store();
    let key = keys::leader_key();
    assert!(store.create(&key, b"agent-1").await.unwrap());
    let held = store.get_many(std::slice::from_ref(&key)).await.unwrap();
    let fence = Fence {
        key,
        create_revision: held[0].create_revision,
    };
    let (db, _) = EtcdSchedulerDb::load(&store, fence).await.unwrap();
    (store, db)
}

/// An alloc record on `node`, as the server saves it.
fn saved_alloc(id: &str, node: &str) -> Write {
    let record = serde_json::json!({
        "alloc": Alloc::new(id, "web", "r.wasm", vec![Task::named("main")]),
        "node_id": node,
        "client_state": null,
        "job_version": 1,
        "sequence": 1,
        "terminal_since_unix_ms": null,
        "replaced": false,
    });
    Write::PutServer {
        table: ServerTable::Allocs,
        key: id.to_string(),
        value: serde_json::to_vec(&record).unwrap(),
    }
}

/// The server saves its allocs in the order of their ids, which spreads a node's allocs over
/// every transaction of a large save; its node would then start and report them one
/// transaction at a time, a status write for each. The save writes them node by node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_writes_each_nodes_allocs_together() {
    let (store, db) = leading_db().await;

    // 40 nodes of 10 allocs: 400 puts, more than three transactions' worth.
    let nodes = 40;
    let writes: Vec<Write> = (0..400)
        .map(|i| saved_alloc(&format!("alloc-{i:03}"), &format!("node-{:02}", i % nodes)))
        .collect();
    assert!(
        writes.len() > 3 * MAX_FENCED_OPS,
        "too few writes to span the transactions this test needs"
    );
    tokio::task::spawn_blocking(move || db.apply(writes))
        .await
        .unwrap()
        .unwrap();

    let (written, _) = store.list(&keys::allocs_prefix()).await.unwrap();
    assert_eq!(written.len(), 400);
    for node in 0..nodes {
        let node_prefix = keys::node_allocs_prefix(&format!("node-{node:02}"));
        let revisions: BTreeSet<i64> = written
            .iter()
            .filter(|kv| kv.key.starts_with(&node_prefix))
            .map(|kv| kv.mod_revision)
            .collect();
        assert!(
            revisions.len() <= 2,
            "node-{node:02}'s allocs were written in {} transactions: {revisions:?}",
            revisions.len()
        );
    }
}

/// An alloc record with no node yet, as the server saves it.
fn saved_unplaced_alloc(id: &str) -> Write {
    let Write::PutServer { value, .. } = saved_alloc(id, "-") else {
        unreachable!("saved_alloc puts")
    };
    let mut record: serde_json::Value = serde_json::from_slice(&value).unwrap();
    record["node_id"] = serde_json::Value::Null;
    Write::PutServer {
        table: ServerTable::Allocs,
        key: id.to_string(),
        value: serde_json::to_vec(&record).unwrap(),
    }
}

/// Each group's writes, as "put KEY" or "delete KEY".
fn described(groups: &[Group]) -> Vec<Vec<String>> {
    groups
        .iter()
        .map(|group| {
            group
                .iter()
                .map(|op| match op {
                    FencedOp::Put { key, .. } => format!("put {key}"),
                    FencedOp::Delete { key } => format!("delete {key}"),
                })
                .collect()
        })
        .collect()
}

/// Only the allocs move: the counters stay first (a save cut short must not let the next
/// leader reuse sequence numbers), the job before its allocs, the node schedules after them,
/// and a move or a delete sorts by the node key it touches, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_sorts_only_its_allocs_and_keeps_each_group_whole() {
    let (_, db) = leading_db().await;
    let db = std::sync::Arc::new(db);
    let first = vec![saved_unplaced_alloc("m"), saved_alloc("d", "node-b")];
    let saving = db.clone();
    tokio::task::spawn_blocking(move || saving.apply(first))
        .await
        .unwrap()
        .unwrap();

    let meta = SavedMeta {
        index: 2,
        next_sequence: 7,
        nodes: Default::default(),
    };
    let second = vec![
        Write::PutServer {
            table: ServerTable::Jobs,
            key: "web".into(),
            value: b"{}".to_vec(),
        },
        saved_alloc("a1", "node-b"),
        saved_alloc("a2", "node-a"),
        Write::DeleteServer {
            table: ServerTable::Allocs,
            key: "d".into(),
        },
        saved_alloc("m", "node-a"),
        Write::PutServer {
            table: ServerTable::Meta,
            key: META_KEY.into(),
            value: serde_json::to_vec(&meta).unwrap(),
        },
        Write::PutServer {
            table: ServerTable::Meta,
            key: NODE_SCHEDULES_KEY.into(),
            value: b"{}".to_vec(),
        },
    ];
    let (groups, _) = db.plan(second).unwrap();

    let put = |key: String| format!("put {key}");
    let delete = |key: String| format!("delete {key}");
    assert_eq!(
        described(&groups),
        vec![
            vec![put(keys::scheduler_meta_key())],
            vec![put(keys::job_key("web"))],
            vec![put(keys::alloc_key("node-a", "a2"))],
            vec![
                delete(keys::unplaced_key("m")),
                put(keys::alloc_key("node-a", "m"))
            ],
            vec![put(keys::alloc_key("node-b", "a1"))],
            vec![
                delete(keys::status_key("d")),
                delete(keys::alloc_key("node-b", "d"))
            ],
            vec![put(keys::node_schedules_key())],
        ]
    );
}
