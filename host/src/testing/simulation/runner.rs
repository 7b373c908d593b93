//! The simulation's runner, native and scripted from the seed, and the [`Ledger`]: the
//! ground truth of what actually ran where, against which the invariants about runners are
//! checked the moment something starts, stops or is destroyed.

use super::Sabotage;
use super::trace::{Trace, fnv1a};
use crate::allocrunner::{
    AllocRunner, AllocRunnerConfig, AllocRunnerFactory, Latch, LatchTrigger, StateUpdater,
    TaskActionError,
};
use crate::model::structs::{Alloc, AllocState, ClientStatus, DesiredStatus};
use crate::server::EmbeddedServer;
use crate::state::{FaultyStateDb, StateDb};
use crate::util::determinism::simulated::splitmix64;
use crate::util::locks::LockUnpoisoned;
use std::collections::BTreeMap;
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

/// What the ground truth knows.
#[derive(Default)]
struct LedgerState {
    /// Allocs running now: where, and of which job.
    running: BTreeMap<String, (String, String)>,
    /// Allocs whose runner ended with a terminal status: that status, and the process.
    finished: BTreeMap<String, (ClientStatus, String)>,
    /// Destroys under way, per node process.
    destroying: BTreeMap<String, usize>,
    violations: Vec<String>,
}

/// The ground truth of runners, shared by every node of one simulation.
pub(super) struct Ledger {
    state: Mutex<LedgerState>,
    parallel_destroys: usize,
    trace: Trace,
    /// The server, to ask whether a destroyed alloc was one it still wants running.
    servers: Arc<dyn CurrentServer>,
}

/// Where the ledger asks what the server holds now: the one embedded server, or the
/// cluster's leader; none between two leaders, when the checks that need it are skipped.
pub(super) trait CurrentServer: Send + Sync {
    fn current(&self) -> Option<Arc<EmbeddedServer>>;
}

impl Ledger {
    pub(super) fn new(
        parallel_destroys: usize,
        trace: Trace,
        servers: Arc<dyn CurrentServer>,
    ) -> Arc<Ledger> {
        Arc::new(Ledger {
            state: Mutex::default(),
            parallel_destroys,
            trace,
            servers,
        })
    }

    fn violated(&self, state: &mut LedgerState, what: String) {
        self.trace.record(format!("VIOLATION {what}"));
        state.violations.push(what);
    }

    /// A runner starts. Wrong when the alloc runs elsewhere, when it finished in this same
    /// process, when its node's disk has it finished, or when its server recorded it
    /// finished (a node tells its server only what is on its disk). A finish that a crash
    /// took before the node's disk had it is not one: that alloc runs again from its last
    /// checkpoint, as documented.
    fn started(&self, process: &Process, alloc: &Alloc) {
        let node = &process.node;
        let finished = |state: Option<&AllocState>| {
            let status = state?.client_status;
            matches!(status, ClientStatus::Complete | ClientStatus::Failed).then_some(status)
        };
        let server = self.servers.current();
        let recorded = server.and_then(|server| server.alloc(&alloc.id).ok());
        let recorded = recorded.and_then(|record| finished(record.client_state.as_ref()));
        let saved = process.db.client_allocs().unwrap_or_default();
        let saved = saved.into_iter().find(|saved| saved.alloc_id == alloc.id);
        let on_disk = saved.and_then(|saved| finished(saved.state.and_then(Result::ok).as_ref()));
        let mut state = self.state.lock_unpoisoned();
        if let Some((elsewhere, _)) = state.running.get(&alloc.id).cloned() {
            let what = format!("alloc {} runs twice: on {elsewhere} and {node}", alloc.id);
            self.violated(&mut state, what);
        }
        let finished_here = state.finished.get(&alloc.id).cloned();
        if let Some((status, _)) = finished_here.filter(|(_, within)| *within == process.name) {
            let what = format!(
                "alloc {} ran again in {} after it was {status}",
                alloc.id, process.name
            );
            self.violated(&mut state, what);
        }
        if let Some(status) = on_disk {
            let what = format!(
                "alloc {} ran again on {node} although its disk has it {status}",
                alloc.id
            );
            self.violated(&mut state, what);
        }
        if let Some(status) = recorded {
            let what = format!(
                "alloc {} ran again on {node} after its server recorded it {status}",
                alloc.id
            );
            self.violated(&mut state, what);
        }
        state
            .running
            .insert(alloc.id.clone(), (node.to_string(), alloc.job_id.clone()));
        self.trace
            .record(format!("run {} of {} on {node}", alloc.id, alloc.job_id));
    }

    fn ended(&self, process: &Process, alloc_id: &str, status: Option<ClientStatus>) {
        let node = &process.node;
        let mut state = self.state.lock_unpoisoned();
        state.running.remove(alloc_id);
        match status {
            Some(status) => {
                let finished = (status, process.name.clone());
                state.finished.insert(alloc_id.to_string(), finished);
                self.trace
                    .record(format!("end {alloc_id} on {node}: {status}"));
            }
            None => self.trace.record(format!("shut down {alloc_id} on {node}")),
        }
    }

    /// A node's process died: its runners stopped with it, reporting nothing.
    pub(super) fn crashed(&self, node: &str, process: &str) {
        let mut state = self.state.lock_unpoisoned();
        let before = state.running.len();
        state.running.retain(|_, (on, _)| on != node);
        state.destroying.remove(process);
        let died = before - state.running.len();
        self.trace
            .record(format!("crash {node}: {died} runners died with it"));
    }

    /// A destroy begins. Wrong when the server still holds the alloc as one to run (not
    /// stopped, not lost): a client may destroy a running alloc only once its server
    /// stopped it or forgot it.
    fn destroy_begun(&self, process: &str, alloc_id: &str) {
        let record = self.servers.current().and_then(|s| s.alloc(alloc_id).ok());
        let server_wants_it = record.is_some_and(|record| {
            let lost = record.client_state.as_ref().is_some_and(|state| {
                state.client_status.is_terminal() || state.client_status == ClientStatus::Unknown
            });
            record.alloc.desired_status == DesiredStatus::Run && !lost
        });
        let mut state = self.state.lock_unpoisoned();
        let node = process.split('#').next().unwrap_or(process);
        let running_here = state
            .running
            .get(alloc_id)
            .is_some_and(|(on, _)| on == node);
        if server_wants_it && running_here {
            let what = format!("alloc {alloc_id} destroyed while its server wants it running");
            self.violated(&mut state, what);
        }
        let under_way = state.destroying.entry(process.to_string()).or_default();
        *under_way += 1;
        let under_way = *under_way;
        if under_way > self.parallel_destroys {
            let what = format!(
                "{under_way} destroys at once on {process}, past gc_parallel_destroys = {}",
                self.parallel_destroys
            );
            self.violated(&mut state, what);
        }
        self.trace
            .record(format!("destroy {alloc_id} on {process}"));
    }

    fn destroy_done(&self, process: &str) {
        let mut state = self.state.lock_unpoisoned();
        if let Some(under_way) = state.destroying.get_mut(process) {
            *under_way = under_way.saturating_sub(1);
        }
    }

    /// The allocs running now: id, node, job.
    pub(super) fn running(&self) -> Vec<(String, String, String)> {
        let state = self.state.lock_unpoisoned();
        let running = state.running.iter();
        running
            .map(|(id, (node, job))| (id.clone(), node.clone(), job.clone()))
            .collect()
    }

    /// Records a violation found outside the ledger's own events.
    pub(super) fn violation(&self, what: String) {
        let mut state = self.state.lock_unpoisoned();
        self.violated(&mut state, what);
    }

    /// The first violation, if any.
    pub(super) fn first_violation(&self) -> Option<String> {
        self.state.lock_unpoisoned().violations.first().cloned()
    }
}

/// One run of a node's process: its runners live and die with it.
pub(super) struct Process {
    pub(super) node: String,
    /// The node's store, which outlives its processes.
    db: Arc<FaultyStateDb>,
    /// `node#incarnation`: destroys are counted per process.
    pub(super) name: String,
    alive: AtomicBool,
}

impl Process {
    pub(super) fn new(node: &str, incarnation: u32, db: Arc<FaultyStateDb>) -> Arc<Process> {
        Arc::new(Process {
            node: node.to_string(),
            db,
            name: format!("{node}#{incarnation}"),
            alive: AtomicBool::new(true),
        })
    }

    pub(super) fn kill(&self) {
        self.alive.store(false, Ordering::SeqCst);
    }

    fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
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
        let last = config.last_state.as_ref().map(|state| state.client_status);
        ledger.trace.record(format!(
            "build {} on {}{}",
            config.alloc.id,
            process.name,
            match (config.restoring, last) {
                (false, _) => String::new(),
                (true, None) => " (restoring)".into(),
                (true, Some(status)) => format!(" (restoring, was {status})"),
            }
        ));
        match sabotage {
            Some(Sabotage::RunnersIgnoreKills) => script.ignores_kills = true,
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
    /// How long a kill takes.
    stops_within: Duration,
    /// How long freeing it takes.
    destroy_takes: Duration,
    /// Sabotaged: a kill never stops it.
    ignores_kills: bool,
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
            stops_within: millis(below(2_000)),
            destroy_takes: millis(below(1_000)),
            ignores_kills: false,
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
        Inner {
            alloc: Mutex::new(config.alloc),
            state: Mutex::new(state),
            updater: config.state_updater,
            script,
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
            tokio::time::sleep(runner.script.stops_within).await;
            runner.finish(Some(ClientStatus::Complete), "alloc was stopped");
        });
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
            self.ledger.started(&self.process, &alloc);
        }
        self.report(ClientStatus::Running, "Tasks are running");
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
        self.0.finish(None, "");
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
