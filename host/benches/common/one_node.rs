//! One node's client core in process, on an in-memory server, with sandboxed sim allocs: what
//! the GC storm and churn benches drive. Included with `#[path]` by the benches that use it.
// Each bench uses a different subset.
#![allow(dead_code)]

use caravan_host::allocrunner::AllocRunnerFactory;
use caravan_host::client::gc::{DiskStats, GcConfig, StatsSource};
use caravan_host::client::{Client, ClientConfig};
use caravan_host::model::structs::{Alloc, Task};
use caravan_host::rpc::ServerApi;
use caravan_host::state::StateDb;
use caravan_test_artifacts::SIM;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The node's name.
pub const NODE: &str = "bench-node";
/// Longest wait for any phase; a bench that stalls says where, rather than hanging.
pub const PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a cheap condition is looked at.
pub const LOOK: Duration = Duration::from_millis(5);

/// Disk usage that never crosses a threshold: only the alloc count triggers the GC.
struct NoDiskPressure;

impl StatsSource for NoDiskPressure {
    fn stats(&self) -> std::io::Result<DiskStats> {
        Ok(DiskStats {
            used_percent: 0.0,
            inodes_used_percent: 0.0,
        })
    }
}

/// An alloc of job `job` running the sim runner with one task, `main`, of `config`, naming
/// the sim runner's build as the agent's server does.
pub fn sim_alloc(id: String, job: &str, config: &[(&str, &str)]) -> Alloc {
    static SIM_BUILD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let mut task = Task::named("main");
    task.config = config
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    let mut alloc = Alloc::new(id, job, SIM, vec![task]);
    alloc.runner_sha256 = Some(
        SIM_BUILD
            .get_or_init(|| crate::common::build_of(SIM))
            .clone(),
    );
    alloc
}

/// The node's client on `server` and `db`, with alloc dirs under `data_dir`.
pub fn client(
    server: Arc<dyn ServerApi>,
    factory: &AllocRunnerFactory,
    db: &Arc<dyn StateDb>,
    data_dir: &std::path::Path,
    gc: GcConfig,
) -> Client {
    let mut config = ClientConfig::new(NODE, data_dir);
    config.gc = gc;
    Client::with_state(
        config,
        server,
        factory.clone(),
        Arc::new(NoDiskPressure),
        db.clone(),
    )
}

/// Allocs the client's GC has collected: a sum of a few counters, cheap enough to look at
/// every [`LOOK`].
pub fn collected(client: &Client) -> u64 {
    client.allocs_collected_total()
}

/// Waits until `done`, looking every `every`; gives up, naming `what`, after
/// [`PHASE_TIMEOUT`].
pub async fn wait_until(what: &str, every: Duration, mut done: impl FnMut() -> bool) {
    let since = Instant::now();
    while !done() {
        assert!(
            since.elapsed() < PHASE_TIMEOUT,
            "gave up after {PHASE_TIMEOUT:?} waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}
