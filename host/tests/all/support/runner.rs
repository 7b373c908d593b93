//! Runners of guests built through the wasm factory, and the recorder that awaits the states
//! and checkpoints they report.

use super::{runtime, within};
use caravan_host::alloc_logs::AllocLogs;
use caravan_host::allocrunner::{
    AllocRunner, AllocRunnerConfig, CheckpointSaved, StateUpdater, alloc_span, checkpoint_kept,
};
use caravan_host::model::structs::{Alloc, AllocState, ClientStatus, Limits, Task};
use caravan_host::runtime::{Runtime, WasmAllocRunner, WasmAllocRunnerFactory};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Records every state and checkpoint a runner reports.
pub struct Recorder {
    /// Bumped on every report, to wake waiters.
    reports: watch::Sender<usize>,
    pub history: Mutex<Vec<AllocState>>,
    pub checkpoints: Mutex<Vec<Vec<u8>>>,
}

impl Recorder {
    pub fn new() -> Arc<Self> {
        Arc::new(Recorder {
            reports: watch::channel(0).0,
            history: Mutex::new(Vec::new()),
            checkpoints: Mutex::new(Vec::new()),
        })
    }

    /// Waits until any state reported so far satisfies `predicate` (a state may already have
    /// been replaced by the time the test looks); fails the test after a minute.
    pub async fn wait_for(
        &self,
        what: &str,
        predicate: impl Fn(&AllocState) -> bool,
    ) -> AllocState {
        let mut reports = self.reports.subscribe();
        within(what, async {
            loop {
                if let Some(found) = self.history.lock().unwrap().iter().find(|s| predicate(s)) {
                    return found.clone();
                }
                reports.changed().await.expect("recorder alive");
            }
        })
        .await
    }

    pub async fn wait_for_status(&self, status: ClientStatus) -> AllocState {
        self.wait_for(&format!("status {status}"), |state| {
            state.client_status == status
        })
        .await
    }

    pub fn last_checkpoint(&self) -> Option<Vec<u8>> {
        self.checkpoints.lock().unwrap().last().cloned()
    }
}

impl StateUpdater for Recorder {
    fn alloc_state_updated(&self, _alloc_id: &str, state: &AllocState) {
        self.history.lock().unwrap().push(state.clone());
        self.reports.send_modify(|count| *count += 1);
    }

    fn checkpoint_saved(&self, _alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        self.checkpoints.lock().unwrap().push(data.to_vec());
        checkpoint_kept()
    }
}

/// An alloc of `runner` with the named tasks, each with `config`.
pub fn alloc(runner: &str, tasks: &[&str], config: &[(&str, &str)]) -> Alloc {
    let tasks = tasks
        .iter()
        .map(|name| Task {
            name: name.to_string(),
            config: config
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
        .collect();
    Alloc::new(
        format!("{:08x}-test-alloc", rand_u32()),
        "test-job",
        runner,
        tasks,
    )
}

/// An alloc of the `hostile` fixture, one task, making `attack` with `settings`.
pub fn hostile_attack(attack: &str, settings: &[(&str, &str)]) -> Alloc {
    let mut config = vec![("attack", attack)];
    config.extend_from_slice(settings);
    alloc(caravan_test_artifacts::FIXTURE_HOSTILE, &["main"], &config)
}

/// How many of this process's file descriptors are open on `path`.
pub fn descriptors_open_on(path: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("this process's descriptors are listed in /proc/self/fd")
        .filter_map(Result::ok)
        .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
        .count()
}

fn rand_u32() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A runner built through the wasm factory, with its recorder and alloc dir.
pub struct Started {
    pub runner: Arc<WasmAllocRunner>,
    pub recorder: Arc<Recorder>,
    pub alloc: Arc<Alloc>,
    /// Removed without recursion: a hostile runner may leave a tree deeper than any stack.
    pub data_dir: caravan_host::util::fs_tree::TempTree,
    /// The logs the runner's log writer belongs to.
    pub alloc_logs: AllocLogs,
}

impl Started {
    pub fn alloc_dir(&self) -> std::path::PathBuf {
        self.data_dir.path().join(&self.alloc.id)
    }

    /// Everything in the alloc's log file, as `alloc logs` shows it.
    pub async fn log_file_text(&self) -> String {
        let text = self.alloc_logs.read(&self.alloc.id).await.unwrap();
        String::from_utf8(text).unwrap()
    }

    pub async fn stopped(&self) -> AllocState {
        within("the runner to stop", self.runner.wait().wait()).await;
        self.runner.alloc_state()
    }

    /// Shuts the runner down, as a stopping agent does, and waits until it has.
    pub async fn shut_down(&self) {
        self.runner.shutdown();
        within("shutdown", self.runner.shutdown_done().wait()).await;
    }
}

/// Builds a runner for `alloc` through the wasm factory and starts it.
pub fn start(alloc: Alloc, restored: Option<Vec<u8>>) -> Started {
    start_on(runtime(), alloc, restored)
}

/// As [`start`], on a runtime of the test's own.
pub fn start_on(runtime: Runtime, alloc: Alloc, restored: Option<Vec<u8>>) -> Started {
    start_with(WasmAllocRunnerFactory::new(runtime), alloc, restored)
}

/// As [`start`], through `factory`.
pub fn start_with(
    factory: WasmAllocRunnerFactory,
    alloc: Alloc,
    restored: Option<Vec<u8>>,
) -> Started {
    let recorder = Recorder::new();
    let data_dir = caravan_host::util::fs_tree::TempTree::new("caravan-test-").unwrap();
    let alloc = Arc::new(alloc);
    let alloc_logs = AllocLogs::under_data_dir(data_dir.path());
    let config = AllocRunnerConfig {
        alloc: alloc.clone(),
        span: alloc_span(&alloc),
        state_updater: recorder.clone(),
        limits: Limits::default(),
        alloc_dir: data_dir.path().join(&alloc.id),
        restoring: restored.is_some(),
        restored,
        last_state: None,
        log_writer: Some(alloc_logs.writer(&alloc.id)),
    };
    let runner = factory
        .build(config)
        .expect("the factory builds the runner");
    runner.run();
    Started {
        runner,
        recorder,
        alloc,
        data_dir,
        alloc_logs,
    }
}
