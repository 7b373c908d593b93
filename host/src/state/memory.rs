//! [`MemoryStateDb`]: the [`StateDb`] semantics with nothing on disk. It touches nothing but
//! its own map.

use super::{RowValue, SavedAlloc, ServerTable, StateDb, StateError, Table, Write};
use crate::util::locks::LockUnpoisoned;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Keeps every row in one map under one lock, so a batch is atomic by construction. Lost when
/// dropped: for tests, simulators and `caravan run`, which has nothing to restore.
///
/// Rows keep what was written (a shared alloc or state, not its bytes); a read makes the
/// bytes a durable store would have kept, and decodes them as it would.
#[derive(Default)]
pub struct MemoryStateDb {
    rows: Mutex<Rows>,
}

type Rows = BTreeMap<(Table, String), RowValue>;

impl MemoryStateDb {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rows> {
        self.rows.lock_unpoisoned()
    }

    /// Overwrites one client record with raw bytes, as a bit flip or an older build would:
    /// for tests of what a record that does not decode costs. `record` is one of `alloc`,
    /// `state`, `acked`.
    pub fn garble_client_record(&self, alloc_id: &str, record: &str, bytes: &[u8]) {
        let table = match record {
            "alloc" => Table::Allocs,
            "state" => Table::AllocStates,
            "acked" => Table::AckedStates,
            other => panic!("no client record named {other:?}"),
        };
        self.lock().insert(
            (table, alloc_id.to_string()),
            RowValue::Bytes(bytes.to_vec()),
        );
    }
}

impl StateDb for MemoryStateDb {
    fn reads_back_saved_state(&self) -> bool {
        true
    }

    fn apply(&self, writes: Vec<Write>) -> Result<(), StateError> {
        let changes = super::rows_of(writes);
        let mut rows = self.lock();
        for (table, key, value) in changes {
            match value {
                Some(value) => rows.insert((table, key), value),
                None => rows.remove(&(table, key)),
            };
        }
        Ok(())
    }

    fn client_allocs(&self) -> Result<Vec<SavedAlloc>, StateError> {
        // One lock for every table: one consistent snapshot. Its records are shared and never
        // change, so their bytes are made after the lock is let go, not holding up commits.
        let mut snapshot: BTreeMap<Table, Vec<(String, RowValue)>> = {
            let rows = self.lock();
            Table::CLIENT
                .into_iter()
                .map(|table| (table, table_values(&rows, table)))
                .collect()
        };
        super::assemble_client_allocs(|table| {
            Ok(in_bytes(snapshot.remove(&table).unwrap_or_default()))
        })
    }

    fn server_records(&self, table: ServerTable) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let values = table_values(&self.lock(), Table::Server(table));
        Ok(in_bytes(values))
    }

    fn waits_on_io(&self) -> bool {
        false
    }
}

fn table_values(rows: &Rows, table: Table) -> Vec<(String, RowValue)> {
    rows.iter()
        .filter(|((t, _), _)| *t == table)
        .map(|((_, key), value)| (key.clone(), value.clone()))
        .collect()
}

fn in_bytes(values: Vec<(String, RowValue)>) -> Vec<(String, Vec<u8>)> {
    values
        .into_iter()
        .map(|(key, value)| (key, value.into_bytes()))
        .collect()
}
