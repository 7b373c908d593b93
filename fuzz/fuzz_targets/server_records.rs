//! A saved server record, as a damaged or older state file may hold it (the first byte picks
//! its table): the embedded server opens on it, or refuses it naming what is wrong, and never
//! panics.
#![no_main]

use caravan_host::server::{EmbeddedServer, ServerConfig};
use caravan_host::state::{MemoryStateDb, ServerTable, StateDb, Write};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|input: &[u8]| {
    let Some((pick, value)) = input.split_first() else {
        return;
    };
    let table = [ServerTable::Jobs, ServerTable::Allocs, ServerTable::Meta][usize::from(*pick) % 3];
    let db = Arc::new(MemoryStateDb::new());
    let saved = db.apply(vec![Write::PutServer {
        table,
        key: "fuzzed".into(),
        value: value.to_vec(),
    }]);
    if saved.is_ok() {
        let _ = EmbeddedServer::open(ServerConfig::default(), db);
    }
});
