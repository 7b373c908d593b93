//! The simulation's runner: native, scripted from the seed and the alloc's id, standing in
//! for a wasm runner and its host side (the kill timeout it enforces included). It tells
//! the [`Ledger`] what it really did, and may not touch the client or the server.

use super::Sabotage;
use super::ledger::{Checkpoint, Ledger, Process};
use super::trace::fnv1a;
use crate::allocrunner::{
    AllocRunner, AllocRunnerConfig, AllocRunnerFactory, Latch, LatchTrigger, StateUpdater,
    TaskActionError,
};
use crate::model::structs::{Alloc, AllocState, ClientStatus};
use crate::util::determinism::simulated::splitmix64;
use crate::util::locks::LockUnpoisoned;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How a job's runners behave, chosen when the job is registered and carried in its meta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Behaviour {
    /// A service whose runners run until stopped.
    Steady,
    /// A service whose runners may fail on their own after a while.
    Flaky,
    /// A batch job whose runners finish, most of them complete.
    Batch,
}

/// The alloc meta key the behaviour travels in.
pub(super) const BEHAVIOUR_META: &str = "sim_behaviour";

impl Behaviour {
    pub(super) fn name(self) -> &'static str {
        match self {
            Behaviour::Steady => "steady",
            Behaviour::Flaky => "flaky",
            Behaviour::Batch => "batch",
        }
    }

    fn of(alloc: &Alloc) -> Behaviour {
        let named = alloc.meta.iter().find(|(key, _)| key == BEHAVIOUR_META);
        match named.map(|(_, value)| value.as_str()) {
            Some("flaky") => Behaviour::Flaky,
            Some("batch") => Behaviour::Batch,
            _ => Behaviour::Steady,
        }
    }
}

/// A factory of scripted runners for one node process.
pub(super) fn factory(
    seed: u64,
    sabotage: Option<Sabotage>,
    process: Arc<Process>,
    ledger: Arc<Ledger>,
) -> AllocRunnerFactory {
    Arc::new(move |mut config: AllocRunnerConfig| {
        let mut script = Script::draw(seed, &config.alloc);
        match sabotage {
            Some(Sabotage::RestoredRunnersLoseTheirCheckpoint) if config.restoring => {
                config.restored = None;
            }
            Some(Sabotage::MovedAllocsStartOneCheckpointBack) if !config.restoring => {
                let from = config.restored.as_deref().and_then(Checkpoint::read);
                if let Some(from) = from.filter(|from| from.sequence > 1) {
                    let back = Checkpoint {
                        sequence: from.sequence - 1,
                        ..from
                    };
                    config.restored = Some(back.bytes());
                }
            }
            _ => {}
        }
        let last = config.last_state.as_ref().map(|state| state.client_status);
        let from = config.restored.as_deref();
        ledger.trace.record(format!(
            "build {} on {}{}{}",
            config.alloc.id,
            process.name,
            match (config.restoring, last) {
                (false, _) => String::new(),
                (true, None) => " (restoring)".into(),
                (true, Some(status)) => format!(" (restoring, was {status})"),
            },
            match from.map(|bytes| (bytes, Checkpoint::read(bytes))) {
                None => String::new(),
                Some((_, Some(checkpoint))) => format!(" from checkpoint {checkpoint}"),
                Some((bytes, None)) => format!(" from {} unknown bytes", bytes.len()),
            }
        ));
        ledger.built(&process, &config.alloc, config.restoring, from);
        match sabotage {
            Some(Sabotage::RunnersIgnoreKills) => script.ignores_kills = true,
            Some(Sabotage::KillTimeoutNotEnforced) => script.kill_timeout_enforced = false,
            Some(Sabotage::RestoredRunnersForgetTheyFinished) => config.last_state = None,
            _ => {}
        }
        Ok(Arc::new(ScriptedRunner(Arc::new(Inner::new(
            config,
            script,
            process.clone(),
            ledger.clone(),
        )))) as Arc<dyn AllocRunner>)
    })
}

/// What one alloc's runner does, drawn from the seed and the alloc's id.
#[derive(Debug, Clone, Copy)]
struct Script {
    /// When it ends by itself, and how.
    ends: Option<(Duration, ClientStatus)>,
    /// How long its guest takes to return once asked to stop (killed, or shut down).
    stops_within: Duration,
    /// Its guest never returns once asked to stop: the host tears it down at the kill
    /// timeout (a kill then fails the alloc, as a wasm runner's does).
    hangs: bool,
    /// How often it saves a checkpoint while it runs (it saves one more when shut down).
    checkpoint_every: Option<Duration>,
    /// How long freeing it takes.
    destroy_takes: Duration,
    /// Sabotaged: a kill never stops it.
    ignores_kills: bool,
    /// Its host side tears down a guest that does not return within the kill timeout;
    /// sabotaged, it waits for the guest however long it takes.
    kill_timeout_enforced: bool,
}

impl Script {
    fn draw(seed: u64, alloc: &Alloc) -> Script {
        let mut state = seed ^ fnv1a(alloc.id.as_bytes());
        let mut below = |n: u64| splitmix64(&mut state) % n;
        let millis = |ms: u64| Duration::from_millis(ms);
        let ends = match Behaviour::of(alloc) {
            Behaviour::Steady => None,
            Behaviour::Flaky => {
                (below(2) == 0).then(|| (millis(1_000 + below(30_000)), ClientStatus::Failed))
            }
            Behaviour::Batch => {
                let status = if below(10) == 0 {
                    ClientStatus::Failed
                } else {
                    ClientStatus::Complete
                };
                Some((millis(500 + below(20_000)), status))
            }
        };
        Script {
            ends,
            // Fields are drawn in the order written: the later ones came later.
            stops_within: millis(below(2_000)),
            destroy_takes: millis(below(1_000)),
            hangs: below(8) == 0,
            checkpoint_every: (below(2) == 0).then(|| millis(500 + below(4_500))),
            ignores_kills: false,
            kill_timeout_enforced: true,
        }
    }
}

/// The runner: an `Arc` inside, so that the tasks it spawns can hold it.
struct ScriptedRunner(Arc<Inner>);

struct Inner {
    alloc: Mutex<Arc<Alloc>>,
    state: Mutex<AllocState>,
    updater: Arc<dyn StateUpdater>,
    script: Script,
    /// How long its host side waits for the guest to return once asked to stop.
    kill_timeout: Duration,
    /// The checkpoint it saves next.
    next_checkpoint: Mutex<Checkpoint>,
    process: Arc<Process>,
    ledger: Arc<Ledger>,
    started: AtomicBool,
    killing: AtomicBool,
    stopped: LatchTrigger,
    destroy_asked: AtomicBool,
    destroyed: LatchTrigger,
}

impl Inner {
    fn new(
        config: AllocRunnerConfig,
        script: Script,
        process: Arc<Process>,
        ledger: Arc<Ledger>,
    ) -> Inner {
        let state = config.last_state.unwrap_or_else(AllocState::pending);
        let stopped = Latch::new().0;
        if state.client_status.is_terminal() {
            stopped.set();
        }
        // The job's own kill timeout over the client's, as a wasm runner takes it.
        let kill_timeout = config
            .limits
            .with_overrides(&config.alloc.limits)
            .kill_timeout;
        // It goes on from the checkpoint it starts from; none: a line of its own.
        let restored = config.restored.as_deref().and_then(Checkpoint::read);
        let next_checkpoint = match restored {
            Some(from) => Checkpoint {
                root: from.root,
                sequence: from.sequence + 1,
            },
            None => Checkpoint {
                root: config.alloc.id.clone(),
                sequence: 1,
            },
        };
        Inner {
            alloc: Mutex::new(config.alloc),
            state: Mutex::new(state),
            updater: config.state_updater,
            script,
            kill_timeout,
            next_checkpoint: Mutex::new(next_checkpoint),
            process,
            ledger,
            started: AtomicBool::new(false),
            killing: AtomicBool::new(false),
            stopped,
            destroy_asked: AtomicBool::new(false),
            destroyed: Latch::new().0,
        }
    }

    fn alloc(&self) -> Arc<Alloc> {
        self.alloc.lock_unpoisoned().clone()
    }

    fn report(&self, status: ClientStatus, description: &str) {
        let state = {
            let mut state = self.state.lock_unpoisoned();
            state.client_status = status;
            state.description = description.to_string();
            state.clone()
        };
        if self.process.alive() {
            self.updater.alloc_state_updated(&self.alloc().id, &state);
        }
    }

    /// Ends the run with `status` (`None`: shut down, no terminal state), once.
    fn finish(&self, status: Option<ClientStatus>, description: &str) {
        if self.stopped.is_set() {
            return;
        }
        let was_running = self.state.lock_unpoisoned().client_status == ClientStatus::Running;
        if self.process.alive() && was_running {
            self.ledger.ended(&self.process, &self.alloc().id, status);
        }
        if let Some(status) = status {
            self.report(status, description);
        }
        self.stopped.set();
    }

    fn kill(self: &Arc<Self>) {
        if self.script.ignores_kills {
            return;
        }
        if self.stopped.is_set() || self.killing.swap(true, Ordering::SeqCst) {
            return;
        }
        if !self.started.load(Ordering::SeqCst) {
            self.finish(Some(ClientStatus::Complete), "alloc was stopped");
            return;
        }
        let runner = self.clone();
        tokio::spawn(async move {
            if runner.returns_in_time() {
                tokio::time::sleep(runner.script.stops_within).await;
                runner.finish(Some(ClientStatus::Complete), "alloc was stopped");
            } else {
                tokio::time::sleep(runner.grace()).await;
                let why = "runner did not stop within the kill timeout";
                runner.finish(Some(ClientStatus::Failed), why);
            }
        });
    }

    /// Whether its guest returns within the kill timeout once asked to stop.
    fn returns_in_time(&self) -> bool {
        !self.script.hangs && self.script.stops_within <= self.grace()
    }

    /// How long its host side waits for a guest asked to stop: the kill timeout, unless
    /// sabotaged.
    fn grace(&self) -> Duration {
        match self.script.kill_timeout_enforced {
            true => self.kill_timeout,
            false => Duration::from_secs(365 * 24 * 3600),
        }
    }

    /// Shut down (the alloc moves to another node, or the agent stops): the guest saves a
    /// last checkpoint and returns, unless the kill timeout runs out first; either way the
    /// run ends without a terminal state, as a wasm runner's does.
    fn shutdown(self: &Arc<Self>) {
        if self.stopped.is_set() || self.killing.swap(true, Ordering::SeqCst) {
            return;
        }
        if !self.started.load(Ordering::SeqCst) {
            self.finish(None, "");
            return;
        }
        let runner = self.clone();
        tokio::spawn(async move {
            let guest = async {
                if runner.script.hangs {
                    std::future::pending::<()>().await;
                }
                if runner.script.checkpoint_every.is_some() {
                    runner.save_checkpoint().await;
                }
                tokio::time::sleep(runner.script.stops_within).await;
            };
            let _ = tokio::time::timeout(runner.grace(), guest).await;
            runner.finish(None, "");
        });
    }

    /// Saves its next checkpoint, and tells the ledger once the client says it is kept.
    async fn save_checkpoint(&self) {
        if !self.process.alive() {
            return;
        }
        let checkpoint = {
            let mut next = self.next_checkpoint.lock_unpoisoned();
            let this = next.clone();
            next.sequence += 1;
            this
        };
        let alloc_id = self.alloc().id.clone();
        let saved = self
            .updater
            .checkpoint_saved(&alloc_id, &checkpoint.bytes());
        // A guest torn down meanwhile never hears the answer (its call went with it).
        if saved.await.is_ok() && !self.stopped.is_set() {
            self.ledger
                .checkpoint_kept(&self.process, &alloc_id, checkpoint);
        }
    }

    fn run(self: &Arc<Self>) {
        if self.destroy_asked.load(Ordering::SeqCst)
            || self.stopped.is_set()
            || self.started.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let alloc = self.alloc();
        if alloc.desired_status.is_stop() {
            self.finish(Some(ClientStatus::Complete), "alloc was stopped");
            return;
        }
        if self.process.alive() {
            self.ledger
                .started(&self.process, &alloc, self.kill_timeout);
        }
        self.report(ClientStatus::Running, "Tasks are running");
        if let Some(every) = self.script.checkpoint_every {
            let runner = self.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let ended = runner.killing.load(Ordering::SeqCst) || runner.stopped.is_set();
                    if ended || !runner.process.alive() {
                        break;
                    }
                    runner.save_checkpoint().await;
                }
            });
        }
        if let Some((after, status)) = self.script.ends {
            let runner = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                if !runner.killing.load(Ordering::SeqCst) {
                    runner.finish(Some(status), "the script ended it");
                }
            });
        }
    }

    fn destroy(self: &Arc<Self>) {
        if self.destroy_asked.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.process.alive() {
            self.ledger
                .destroy_begun(&self.process.name, &self.alloc().id);
        }
        self.kill();
        let runner = self.clone();
        tokio::spawn(async move {
            runner.stopped.latch().wait().await;
            tokio::time::sleep(runner.script.destroy_takes).await;
            if runner.process.alive() {
                runner.ledger.destroy_done(&runner.process.name);
            }
            runner.destroyed.set();
        });
    }
}

impl AllocRunner for ScriptedRunner {
    fn alloc(&self) -> Arc<Alloc> {
        self.0.alloc()
    }

    fn run(&self) {
        self.0.run();
    }

    fn update(&self, alloc: Arc<Alloc>) {
        let stop = {
            let mut current = self.0.alloc.lock_unpoisoned();
            if alloc.modify_index <= current.modify_index {
                return;
            }
            *current = alloc;
            current.desired_status.is_stop()
        };
        if stop {
            self.0.kill();
        }
    }

    fn shutdown(&self) {
        self.0.shutdown();
    }

    fn signal(&self, _task: Option<&str>, _signal: &str) -> Result<(), TaskActionError> {
        Ok(())
    }

    fn restart_task(&self, _task: Option<&str>) -> Result<(), TaskActionError> {
        Ok(())
    }

    fn destroy(&self) {
        self.0.destroy();
    }

    fn alloc_state(&self) -> AllocState {
        self.0.state.lock_unpoisoned().clone()
    }

    fn is_destroyed(&self) -> bool {
        self.0.destroyed.is_set()
    }

    fn wait(&self) -> Latch {
        self.0.stopped.latch()
    }

    fn shutdown_done(&self) -> Latch {
        self.0.stopped.latch()
    }

    fn destroyed(&self) -> Latch {
        self.0.destroyed.latch()
    }
}
