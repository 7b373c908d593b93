use super::*;
use crate::model::structs::{Alloc, Task};
use crate::testing::simulated_etcd::SimulatedEtcd;
use std::collections::BTreeSet;

/// Wins the leader key of `store` as an elected agent does, for a writer to fence on.
async fn won_fence(store: &EtcdStore) -> Fence {
    let key = keys::leader_key();
    assert!(store.create(&key, b"agent-1").await.unwrap());
    let held = store.get_many(std::slice::from_ref(&key)).await.unwrap();
    Fence {
        key,
        create_revision: held[0].create_revision,
    }
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
    let etcd = SimulatedEtcd::new();
    let store = etcd.store();
    let fence = won_fence(&store).await;
    let (db, _) = EtcdSchedulerDb::load(&store, fence).await.unwrap();

    // 40 nodes of 10 allocs: 400 puts, more than three transactions' worth.
    let nodes = 40;
    let writes: Vec<Write> = (0..400)
        .map(|i| saved_alloc(&format!("alloc-{i:03}"), &format!("node-{:02}", i % nodes)))
        .collect();
    assert!(writes.len() > 3 * MAX_FENCED_OPS);
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
