//! Cluster mode's store against a real three-member etcd: watches that survive members'
//! deaths and compactions without missing or repeating a change, retried writes that cannot
//! apply twice, the schema check, and unreachable endpoints named.

use crate::etcd::EtcdCluster;
use crate::support::within;
use caravan_host::cluster::{
    Change, EtcdStore, GuardedPut, PrefixWatch, SCHEMA_KEY, SCHEMA_VERSION,
};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_member_deaths_without_missing_or_repeating_a_change() {
    let mut cluster = EtcdCluster::start().await;
    let store = cluster.store().await;
    let (existing, mut watch) = PrefixWatch::start(&store, "/t/").await.unwrap();
    assert!(existing.is_empty());

    // One writer creates keys 0..300 in order, each a create-if-absent retried until it is
    // known to have landed; meanwhile members die and come back, one at a time.
    const KEYS: usize = 300;
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..KEYS {
                store
                    .create(&format!("/t/{i:04}"), i.to_string().as_bytes())
                    .await
                    .unwrap();
            }
        })
    };
    let mut seen: Vec<usize> = Vec::new();
    let mut next_fault = 50;
    let mut faults = 0;
    while seen.len() < KEYS {
        let changes = tokio::time::timeout(Duration::from_secs(60), watch.next())
            .await
            .expect("a change within a minute")
            .unwrap();
        for change in changes {
            let Change::Put(kv) = change else {
                panic!("only puts expected: {change:?}");
            };
            seen.push(String::from_utf8(kv.value).unwrap().parse().unwrap());
        }
        if seen.len() >= next_fault && faults < 3 {
            // Each member in turn, the next only once this one serves again: a cluster of
            // three keeps its quorum through one death at a time.
            if faults > 0 {
                cluster.wait_for_member(faults - 1).await;
            }
            cluster.restart(faults);
            faults += 1;
            next_fault += 80;
        }
    }
    writer.await.unwrap();
    assert_eq!(
        seen,
        (0..KEYS).collect::<Vec<_>>(),
        "every change, once, in order"
    );
}

#[tokio::test]
async fn after_a_compaction_a_watch_relists_and_carries_on() {
    let cluster = EtcdCluster::start().await;
    let store = cluster.store().await;
    assert!(store.create("/c/a", b"1").await.unwrap());
    let from = store.revision().await.unwrap();
    assert!(store.create("/c/b", b"2").await.unwrap());
    let now = store.revision().await.unwrap();
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    until_answered!("compacting etcd", client.compact(now, None));

    // A watch resuming from before the compaction cannot be served its history: it re-lists.
    let mut watch = PrefixWatch::from_revision(&store, "/c/", from);
    let changes = within("the re-list", watch.next()).await.unwrap();
    let [Change::Relisted { entries, revision }] = changes.as_slice() else {
        panic!("a re-list expected: {changes:?}");
    };
    assert_eq!(*revision, now);
    let keys: Vec<&str> = entries.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/c/a", "/c/b"]);
    // And carries on from there.
    assert!(store.create("/c/c", b"3").await.unwrap());
    let changes = within("the change after the re-list", watch.next())
        .await
        .unwrap();
    assert!(
        matches!(changes.as_slice(), [Change::Put(kv)] if kv.key == "/c/c"),
        "{changes:?}"
    );
}

#[tokio::test]
async fn a_create_is_applied_once_however_often_it_is_retried_and_a_second_writer_loses() {
    let cluster = EtcdCluster::start().await;
    let store = cluster.store().await;
    assert!(store.create("/once", b"first").await.unwrap());
    // A retry of the same create (its first answer lost) finds its own value: true again.
    assert!(store.create("/once", b"first").await.unwrap());
    assert!(!store.create("/once", b"second").await.unwrap());
    let (entries, _) = store.list("/once").await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].value, b"first");

    // A guarded put lands only while its guard exists, each on its own when some are gone.
    let put = |guard: &str, key: &str| GuardedPut {
        guard: guard.into(),
        key: key.into(),
        value: b"state".to_vec(),
    };
    let writes = [put("/once", "/status/a"), put("/gone", "/status/b")];
    assert_eq!(
        store.put_where_present(&writes).await.unwrap(),
        ["/status/a"]
    );
    let (written, _) = store.list("/status/").await.unwrap();
    assert_eq!(written.len(), 1);
}

#[tokio::test]
async fn a_newer_schema_is_refused_and_the_first_agent_records_its_own() {
    let cluster = EtcdCluster::start().await;
    let store = cluster.store().await;
    store.check_schema().await.unwrap();
    let (entries, _) = store.list(SCHEMA_KEY).await.unwrap();
    assert_eq!(entries[0].value, SCHEMA_VERSION.to_string().as_bytes());
    store.check_schema().await.unwrap();

    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    until_answered!("writing schema 99", client.put(SCHEMA_KEY, "99", None));
    assert_eq!(
        store.check_schema().await.unwrap_err().to_string(),
        format!(
            "etcd at {} holds Caravan's cluster schema 99; this build knows up to \
             {SCHEMA_VERSION}: upgrade this agent",
            cluster.endpoints().join(",")
        )
    );
}

#[tokio::test(start_paused = true)]
async fn unreachable_endpoints_are_named_in_one_line() {
    let endpoints = vec![
        "http://127.0.0.1:1".to_string(),
        "http://127.0.0.1:2".to_string(),
    ];
    let error = EtcdStore::connect(&endpoints)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.starts_with("etcd is unreachable at http://127.0.0.1:1,http://127.0.0.1:2: ")
            && !error.contains('\n'),
        "{error}"
    );
}

/// A client core on the seam over etcd: the scheduler's writes are made by hand here (the
/// elected scheduler does not exist yet), and the client runs what appears under its node,
/// reports states beside it, survives a member's death, and drops what is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_core_runs_its_nodes_allocs_from_etcd_and_reports_their_states() {
    use caravan_host::cluster::{EtcdServerApi, alloc_key, status_key};
    use caravan_host::model::structs::{AllocState, ClientStatus};
    use caravan_host::state::MemoryStateDb;
    use caravan_test_artifacts::MINIMAL;
    use std::sync::Arc;

    let _logs = crate::support::LogCapture::start();
    let mut cluster = EtcdCluster::start().await;
    let store = cluster.store().await;
    let data_dir = tempfile::tempdir().unwrap();
    let api = EtcdServerApi::new(store.clone());
    let client =
        crate::support::wasm_client(data_dir.path(), api.clone(), Arc::new(MemoryStateDb::new()));
    client.restore().await.unwrap();
    client.start();
    let place = |alloc: &caravan_host::model::structs::Alloc| {
        let store = store.clone();
        let (key, value) = (
            alloc_key("node-1", &alloc.id),
            serde_json::to_vec(&serde_json::json!({ "alloc": alloc })).unwrap(),
        );
        async move { store.put(&key, &value).await.unwrap() }
    };
    let reported = |alloc_id: String| {
        let store = store.clone();
        async move {
            let (entries, _) = store.list(&status_key(&alloc_id)).await.unwrap();
            entries
                .first()
                .map(|kv| serde_json::from_slice::<AllocState>(&kv.value).unwrap())
                .map(|state| (state.client_status, kv_revision(&entries)))
        }
    };

    let first = crate::support::alloc(MINIMAL, &["main"], &[]);
    place(&first).await;
    crate::support::eventually_async("the first alloc reported running", || {
        let reported = reported(first.id.clone());
        async move { matches!(reported.await, Some((ClientStatus::Running, _))) }
    })
    .await;

    // A member dies and comes back; the client's watch carries on through it.
    cluster.restart(0);
    let second = crate::support::alloc(MINIMAL, &["main"], &[]);
    place(&second).await;
    crate::support::eventually_async("the second alloc reported running", || {
        let reported = reported(second.id.clone());
        async move { matches!(reported.await, Some((ClientStatus::Running, _))) }
    })
    .await;

    // The scheduler removes the first: the client kills and drops it, and a state sent for it
    // after the delete (as a client would in a race with it) is refused: its alloc key is
    // gone, so no status is written for it again. The test's own raw client below may pick
    // the restarted member, so that member must serve first (it did not always by now: a
    // refused connection failed CI once).
    cluster.wait_for_member(0).await;
    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let deleted_at = until_answered!(
        "deleting the first alloc's key",
        raw.delete(alloc_key("node-1", &first.id), None)
    )
    .header()
    .unwrap()
    .revision();
    crate::support::eventually("the first alloc dropped by the client", || {
        !client.alloc_ids().contains(&first.id)
    })
    .await;
    let late = caravan_host::rpc::AllocUpdate {
        alloc_id: first.id.clone(),
        state: AllocState::failed("too late").into(),
    };
    use caravan_host::rpc::ServerApi;
    assert_eq!(
        api.update_allocs(&[late]).await.unwrap(),
        Vec::<String>::new()
    );
    let (status, last_write) = reported(first.id.clone()).await.unwrap();
    assert!(
        last_write < deleted_at && status != ClientStatus::Failed,
        "a state was written for a removed alloc"
    );
    assert!(client.alloc_ids().contains(&second.id));
}

/// One seam serving two nodes, as each of nodesim's etcd connections serves a hundred: a
/// fetch answers each alloc from the mirror of the node that holds it, as its watch
/// delivered it (with its key's modify revision), nothing for an id no node holds, and asks
/// etcd nothing: the watch has already brought every value. The allocs of one transaction
/// reach a waiting watch together; a rewritten alloc is fetched anew, a deleted one no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_answers_from_the_nodes_mirrors_without_reading_etcd() {
    use caravan_host::cluster::{EtcdServerApi, alloc_key};
    use caravan_host::model::node::NodeInfo;
    use caravan_host::rpc::ServerApi;
    use caravan_test_artifacts::MINIMAL;

    let cluster = EtcdCluster::start_with(1, &[]).await;
    let store = cluster.store().await;
    let api = EtcdServerApi::new(store.clone());
    let mut placed = Vec::new();
    for node in ["node-1", "node-2"] {
        api.register_node(node, &NodeInfo::default()).await.unwrap();
        let alloc = crate::support::alloc(MINIMAL, &["main"], &[]);
        let value = serde_json::to_vec(&serde_json::json!({ "alloc": alloc })).unwrap();
        store
            .put(&alloc_key(node, &alloc.id), &value)
            .await
            .unwrap();
        let (entries, _) = store.list(&alloc_key(node, &alloc.id)).await.unwrap();
        placed.push((node, alloc.id, kv_revision(&entries) as u64));
    }
    for (node, id, _) in &placed {
        crate::support::eventually_async("the alloc in its node's mirror", || async {
            let answer = api.watch_allocs(node, 0, Duration::from_secs(1)).await;
            answer.is_ok_and(|answer| answer.allocs.contains_key(id))
        })
        .await;
    }

    let reads_before = etcd_reads(&cluster);
    let wanted: Vec<String> = placed
        .iter()
        .map(|(_, id, _)| id.clone())
        .chain(["no-such-alloc".to_string()])
        .collect();
    let mut fetched: Vec<(String, u64)> = api
        .get_allocs(&wanted)
        .await
        .unwrap()
        .iter()
        .map(|alloc| (alloc.id.clone(), alloc.modify_index))
        .collect();
    fetched.sort();
    let mut expected: Vec<(String, u64)> = placed
        .iter()
        .map(|(_, id, revision)| (id.clone(), *revision))
        .collect();
    expected.sort();
    assert_eq!(fetched, expected);
    assert_eq!(
        etcd_reads(&cluster),
        reads_before,
        "the fetch read from etcd"
    );

    // Twenty allocs placed in one transaction share a revision: the first answer past the
    // last index has all of them, not those the mirror had taken in when it woke.
    let index = api
        .watch_allocs("node-1", 0, Duration::from_secs(1))
        .await
        .unwrap()
        .index;
    let batch: Vec<_> = (0..20)
        .map(|_| crate::support::alloc(MINIMAL, &["main"], &[]))
        .collect();
    let puts: Vec<etcd_client::TxnOp> = batch
        .iter()
        .map(|alloc| {
            let value = serde_json::to_vec(&serde_json::json!({ "alloc": alloc })).unwrap();
            etcd_client::TxnOp::put(alloc_key("node-1", &alloc.id), value, None)
        })
        .collect();
    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    until_answered!(
        "writing the allocs",
        raw.txn(etcd_client::Txn::new().and_then(puts.clone()))
    );
    let answer = api
        .watch_allocs("node-1", index, Duration::from_secs(10))
        .await
        .unwrap();
    let missing: Vec<&String> = batch
        .iter()
        .map(|alloc| &alloc.id)
        .filter(|id| !answer.allocs.contains_key(*id))
        .collect();
    assert!(missing.is_empty(), "the first answer lacks {missing:?}");

    // An alloc written again is fetched at its new revision; one deleted is gone.
    let (node, rewritten, _) = &placed[0];
    let again = api
        .get_allocs(std::slice::from_ref(rewritten))
        .await
        .unwrap();
    let mut alloc = (*again[0]).clone();
    alloc.meta.push(("changed".into(), "yes".into()));
    let value = serde_json::to_vec(&serde_json::json!({ "alloc": alloc })).unwrap();
    store
        .put(&alloc_key(node, rewritten), &value)
        .await
        .unwrap();
    let (entries, _) = store.list(&alloc_key(node, rewritten)).await.unwrap();
    let revision = kv_revision(&entries) as u64;
    crate::support::eventually_async(
        "the rewritten alloc fetched at its new revision",
        || async {
            let fetched = api
                .get_allocs(std::slice::from_ref(rewritten))
                .await
                .unwrap();
            fetched
                .first()
                .is_some_and(|a| a.modify_index == revision && a.meta.len() == alloc.meta.len())
        },
    )
    .await;
    let (node, deleted, _) = &placed[1];
    until_answered!(
        "deleting an alloc's key",
        raw.delete(alloc_key(node, deleted), None)
    );
    crate::support::eventually_async("the deleted alloc gone from its node's answers", || async {
        let listed = api
            .watch_allocs(node, 0, Duration::from_secs(1))
            .await
            .unwrap();
        !listed.allocs.contains_key(deleted)
            && api
                .get_allocs(std::slice::from_ref(deleted))
                .await
                .unwrap()
                .is_empty()
    })
    .await;
}

/// The reads member 0 of `cluster` has handled (ranges and transactions).
fn etcd_reads(cluster: &EtcdCluster) -> u64 {
    cluster
        .metrics(0)
        .lines()
        .filter(|line| {
            line.starts_with("grpc_server_handled_total")
                && (line.contains("grpc_method=\"Range\"") || line.contains("grpc_method=\"Txn\""))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn a_listing_in_pages_reads_every_key_once_in_order_at_one_revision() {
    let etcd = EtcdCluster::start_with(1, &[]).await;
    let store = etcd.store().await;
    for n in 0..25 {
        store.put(&format!("/paged/k{n:02}"), b"v").await.unwrap();
    }
    store.put("/pagedX", b"outside the prefix").await.unwrap();
    let (entries, revision) = store.list_in_pages("/paged/", 10).await.unwrap();
    let keys: Vec<&str> = entries.iter().map(|kv| kv.key.as_str()).collect();
    let expected: Vec<String> = (0..25).map(|n| format!("/paged/k{n:02}")).collect();
    assert_eq!(keys, expected);
    assert_eq!(revision, store.revision().await.unwrap());
    // The same as one unpaged read.
    let (whole, _) = store.list_in_pages("/paged/", 1_000).await.unwrap();
    assert_eq!(whole, entries);
}

fn kv_revision(entries: &[caravan_host::cluster::KeyValue]) -> i64 {
    entries.first().map_or(0, |kv| kv.mod_revision)
}
