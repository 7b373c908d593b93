//! The client core against the in-memory server: the alloc map, sync and the garbage
//! collector, each Nomad invariant by name. Runners here are native (no wasm) except where a
//! test says so. This module holds the harness; the tests are in its submodules.

mod alloc_map;
mod gc;
mod stops;

use crate::support::*;
use caravan_host::allocrunner::{AllocRunner, AllocRunnerFactory, EmptyAllocRunner};
use caravan_host::client::gc::{DiskStats, GcConfig, StatsSource};
use caravan_host::client::{Client, ClientConfig};
use caravan_host::model::structs::{Alloc, ClientStatus};
use caravan_host::testing::InMemoryServer;
use std::sync::{Arc, Mutex};

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
