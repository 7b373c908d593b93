//! Helpers the benches share: allocs of one runner, their configs, and measurements.
// Each bench uses a different subset.
#![allow(dead_code)]

use caravan_host::allocrunner::{AllocRunnerConfig, StateUpdater, alloc_span};
use caravan_host::structs::{Alloc, AllocState, ClientStatus, Limits, Task};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Notifies once the guest reports `running`.
pub struct RunningSignal {
    pub running: Notify,
}

impl StateUpdater for RunningSignal {
    fn alloc_state_updated(&self, _alloc_id: &str, state: &AllocState) {
        if state.client_status == ClientStatus::Running {
            self.running.notify_one();
        }
    }
}

pub fn alloc(runner: &str, n: usize) -> Alloc {
    Alloc::new(
        format!("bench-{n}"),
        "bench",
        runner,
        vec![Task::named("main")],
    )
}

pub fn config(
    alloc: Alloc,
    data_dir: &std::path::Path,
    updater: Arc<dyn StateUpdater>,
) -> AllocRunnerConfig {
    let alloc = Arc::new(alloc);
    AllocRunnerConfig {
        span: alloc_span(&alloc),
        alloc_dir: data_dir.join(&alloc.id),
        alloc,
        state_updater: updater,
        limits: Limits::default(),
        restored: None,
        last_state: None,
        log_writer: None,
    }
}

pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}
