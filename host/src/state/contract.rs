//! The [`StateDb`] contract, run against every implementation. Test-only: it drives each
//! store through the trait alone, so an implementation cannot pass by its internals.

use super::*;
use crate::model::structs::ClientStatus;

fn alloc(id: &str) -> Arc<Alloc> {
    Arc::new(Alloc::new(id, "job", "r.wasm", vec![]))
}

fn state(status: ClientStatus, description: &str) -> AllocState {
    AllocState {
        client_status: status,
        description: description.into(),
        task_states: vec![],
    }
}

fn put_all(id: &str) -> Vec<Write> {
    vec![
        Write::PutAlloc(alloc(id)),
        Write::PutAllocState {
            alloc_id: id.into(),
            state: state(ClientStatus::Running, "reported").into(),
        },
        Write::PutAckedState {
            alloc_id: id.into(),
            state: state(ClientStatus::Pending, "acked").into(),
        },
        Write::PutCheckpoint {
            alloc_id: id.into(),
            data: b"count=3".to_vec(),
        },
    ]
}

fn only(db: &dyn StateDb) -> SavedAlloc {
    let mut saved = db.client_allocs().unwrap();
    assert_eq!(saved.len(), 1, "{saved:?}");
    saved.remove(0)
}

fn an_empty_store_has_nothing(db: &dyn StateDb) {
    assert!(db.client_allocs().unwrap().is_empty());
    for table in [ServerTable::Jobs, ServerTable::Allocs, ServerTable::Meta] {
        assert!(db.server_records(table).unwrap().is_empty());
    }
}

fn every_client_record_reads_back(db: &dyn StateDb) {
    db.apply(put_all("a")).unwrap();
    let saved = only(db);
    assert_eq!(saved.alloc_id, "a");
    assert_eq!(saved.alloc, Some(Ok(Alloc::clone(&alloc("a")))));
    assert_eq!(
        saved.state,
        Some(Ok(state(ClientStatus::Running, "reported")))
    );
    assert_eq!(saved.acked, Some(Ok(state(ClientStatus::Pending, "acked"))));
    assert_eq!(saved.checkpoint.as_deref(), Some(&b"count=3"[..]));
    assert!(!saved.collected);
}

fn a_later_put_replaces_and_a_batch_applies_in_order(db: &dyn StateDb) {
    db.apply(put_all("a")).unwrap();
    db.apply(vec![
        Write::PutCheckpoint {
            alloc_id: "a".into(),
            data: b"count=4".to_vec(),
        },
        Write::PutCheckpoint {
            alloc_id: "a".into(),
            data: b"count=5".to_vec(),
        },
    ])
    .unwrap();
    assert_eq!(only(db).checkpoint.as_deref(), Some(&b"count=5"[..]));
}

fn collected_drops_the_checkpoint_and_keeps_the_final_state(db: &dyn StateDb) {
    db.apply(put_all("a")).unwrap();
    db.apply(vec![Write::MarkCollected("a".into())]).unwrap();
    let saved = only(db);
    assert!(saved.collected);
    assert_eq!(saved.checkpoint, None);
    assert!(saved.alloc.is_some() && saved.state.is_some());
}

fn delete_removes_every_record_and_missing_is_not_an_error(db: &dyn StateDb) {
    db.apply(put_all("a")).unwrap();
    db.apply(put_all("b")).unwrap();
    db.apply(vec![Write::MarkCollected("a".into())]).unwrap();
    db.apply(vec![
        Write::DeleteAlloc("a".into()),
        Write::DeleteAlloc("never-saved".into()),
    ])
    .unwrap();
    assert_eq!(only(db).alloc_id, "b");
}

fn a_record_without_its_alloc_is_listed_as_such(db: &dyn StateDb) {
    db.apply(vec![Write::PutAllocState {
        alloc_id: "orphan".into(),
        state: state(ClientStatus::Running, "").into(),
    }])
    .unwrap();
    let saved = only(db);
    assert_eq!(saved.alloc, None);
    assert!(saved.state.is_some());
}

fn allocs_are_listed_by_id(db: &dyn StateDb) {
    for id in ["c", "a", "b"] {
        db.apply(put_all(id)).unwrap();
    }
    let ids: Vec<String> = db
        .client_allocs()
        .unwrap()
        .into_iter()
        .map(|s| s.alloc_id)
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
}

fn server_records_are_put_deleted_and_kept_apart(db: &dyn StateDb) {
    let put = |table, key: &str, value: &[u8]| Write::PutServer {
        table,
        key: key.into(),
        value: value.to_vec(),
    };
    db.apply(vec![
        put(ServerTable::Jobs, "web", b"job"),
        put(ServerTable::Allocs, "a", b"alloc a"),
        put(ServerTable::Allocs, "b", b"alloc b"),
        put(ServerTable::Meta, "index", b"7"),
    ])
    .unwrap();
    db.apply(vec![Write::DeleteServer {
        table: ServerTable::Allocs,
        key: "a".into(),
    }])
    .unwrap();
    assert_eq!(
        db.server_records(ServerTable::Allocs).unwrap(),
        [("b".to_string(), b"alloc b".to_vec())]
    );
    assert_eq!(db.server_records(ServerTable::Jobs).unwrap().len(), 1);
    assert!(
        db.client_allocs().unwrap().is_empty(),
        "server rows are not client allocs"
    );
}

macro_rules! contract {
    ($module:ident, $make:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn an_empty_store_has_nothing() {
                let (db, _keep) = $make;
                super::an_empty_store_has_nothing(&db);
            }

            #[test]
            fn every_client_record_reads_back() {
                let (db, _keep) = $make;
                super::every_client_record_reads_back(&db);
            }

            #[test]
            fn a_later_put_replaces_and_a_batch_applies_in_order() {
                let (db, _keep) = $make;
                super::a_later_put_replaces_and_a_batch_applies_in_order(&db);
            }

            #[test]
            fn collected_drops_the_checkpoint_and_keeps_the_final_state() {
                let (db, _keep) = $make;
                super::collected_drops_the_checkpoint_and_keeps_the_final_state(&db);
            }

            #[test]
            fn delete_removes_every_record_and_missing_is_not_an_error() {
                let (db, _keep) = $make;
                super::delete_removes_every_record_and_missing_is_not_an_error(&db);
            }

            #[test]
            fn a_record_without_its_alloc_is_listed_as_such() {
                let (db, _keep) = $make;
                super::a_record_without_its_alloc_is_listed_as_such(&db);
            }

            #[test]
            fn allocs_are_listed_by_id() {
                let (db, _keep) = $make;
                super::allocs_are_listed_by_id(&db);
            }

            #[test]
            fn server_records_are_put_deleted_and_kept_apart() {
                let (db, _keep) = $make;
                super::server_records_are_put_deleted_and_kept_apart(&db);
            }
        }
    };
}

contract!(memory, (MemoryStateDb::new(), ()));
contract!(redb, {
    let dir = tempfile::tempdir().unwrap();
    (RedbStateDb::open(dir.path()).unwrap(), dir)
});
contract!(
    faulty_when_healthy,
    (FaultyStateDb::new(Arc::new(MemoryStateDb::new())), ())
);

#[test]
fn an_injected_write_failure_changes_nothing() {
    let db = FaultyStateDb::new(Arc::new(MemoryStateDb::new()));
    db.apply(put_all("a")).unwrap();
    db.fail_writes(true);
    let error = db
        .apply(vec![Write::DeleteAlloc("a".into())])
        .expect_err("refused");
    assert!(matches!(error, StateError::Injected(_)));
    db.fail_writes(false);
    assert_eq!(only(&db).alloc_id, "a");
}

#[test]
fn a_record_that_does_not_decode_is_an_error_in_that_record_only() {
    let db = MemoryStateDb::new();
    db.apply(put_all("a")).unwrap();
    db.garble_client_record("a", "state", b"{not json");
    let saved = only(&db);
    assert!(matches!(saved.alloc, Some(Ok(_))));
    let Some(Err(reason)) = saved.state else {
        panic!("expected a decode error, got {:?}", saved.state)
    };
    assert!(
        reason.contains("saved alloc state cannot be read"),
        "{reason}"
    );
}

#[test]
fn the_durable_store_keeps_everything_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = RedbStateDb::open(dir.path()).unwrap();
    db.apply(put_all("a")).unwrap();
    drop(db);
    let db = RedbStateDb::open(dir.path()).unwrap();
    every_client_record_reads_back_after_reopen(&db);
}

fn every_client_record_reads_back_after_reopen(db: &dyn StateDb) {
    let saved = only(db);
    assert_eq!(saved.checkpoint.as_deref(), Some(&b"count=3"[..]));
    assert_eq!(
        saved.state,
        Some(Ok(state(ClientStatus::Running, "reported")))
    );
}
