//! A deterministic simulation of the control plane in one thread on tokio's paused clock:
//! the real embedded server (intake, placement, reconcile, replacement, node liveness, GC)
//! and real client cores (watch, sync, restore, GC, checkpoints moved with drained allocs)
//! whose runners are scripted from a seed (they run, finish, fail, checkpoint, and some hang
//! past their kill timeout), joined by wires that lose, delay and duplicate what crosses
//! them, with operators (drains included), crashes, partitions and failing or slow disks in
//! between. Every choice is drawn from
//! the seed, and what the host itself draws (ids, jitter, the wall clock, hash map order, the
//! blocking pool) is the simulation's while it runs (`util::determinism`), so one seed always
//! gives one trace.
//!
//! What it checks, at every step and at the end:
//! - no alloc runs in two places at once, and none runs again once it ended complete or
//!   failed in the same process, or once its node's disk or its server had it so (a
//!   completed batch alloc never reruns; one whose end a crash took before the disk had it
//!   runs again from its checkpoint, as `docs/operating.md` says);
//! - a job never has more allocs running than its count, counting those its server still
//!   wants running and does not hold lost;
//! - no alloc runs longer than its kill timeout once the node process running it received
//!   its stop, so an alloc and its replacement never both run longer than that once the node
//!   knows (how soon it knows is its wire's);
//! - a runner restored after a crash starts from at least the last checkpoint it was told is
//!   kept, of its own line; an alloc moved off a drained node starts from its predecessor's
//!   last such checkpoint (or afresh, when that cannot be had), never an older one, and never
//!   while its predecessor still runs;
//! - the GC destroys no alloc its server wants running, and never more at once on a node than
//!   `gc_parallel_destroys`;
//! - every job change the server acknowledged is there, after a server restart too, and no
//!   job whose registration it refused ever is;
//! - the server holds each node with what that node said of itself;
//! - a node is taken down (its allocs lost) only after a TTL in which the server heard
//!   nothing of it;
//! - once the faults stop, every steady service job converges to exactly its count within
//!   a bounded simulated time, and nothing of a stopped job runs.
//!
//! Layout: `actions` (what operators and faults do between checks), `link` (the faulty
//! wire), `runner` (the scripted runners), `ledger` (the ground truth of what ran, and the
//! checks made against it), `peers` (how nodes fetch each other's checkpoints), `trace`.
//!
//! Two more simulations stand beside it, over the simulated etcd: `leadership` (the
//! cluster's membership and leader election, real `Member`s, checked every 50 ms) and
//! `cluster` (cluster mode whole: agents electing a leader that schedules on etcd, nodes
//! talking through `EtcdServerApi`, with the same runners and ledger as here).
//!
//! Not simulated yet: a save to the server's store or to etcd that takes simulated time (a
//! client's commits do, on a slow disk); `docs/testing.md` lists what else is not.
//!
//! Test-only, with the rest of `testing`: it drives the server and the client through their
//! public seams and changes neither. A crash is [`Client::halt`] and the runners' process
//! marked dead: the old client watches, saves and reports nothing more, and its runners
//! ignore what a task it left behind still asks of them.

mod actions;
mod cluster;
mod leadership;
mod ledger;
mod link;
mod peers;
mod runner;
mod trace;

use crate::client::gc::{DiskStats, GcConfig, StatsSource};
use crate::client::{Client, ClientConfig};
use crate::model::node::NodeInfo;
use crate::model::structs::{ClientStatus, DesiredStatus};
use crate::server::{EmbeddedServer, ServerConfig};
use crate::state::{FaultyStateDb, MemoryStateDb, StateDb};
use actions::end_drain;
use ledger::{Ledger, Observed, Process};
use link::{Link, ServerSlot};
use peers::Peers;
use runner::Behaviour;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use trace::{Draws, Trace};

pub use cluster::{ClusterSimConfig, EtcdSabotage, simulate_cluster};
pub use leadership::{LeadershipConfig, simulate_leadership};

/// One simulation's shape.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Every choice is drawn from it.
    pub seed: u64,
    /// How many client nodes.
    pub nodes: usize,
    /// How many operator steps (with faults) before the cluster is left to settle.
    pub steps: usize,
    /// Keep every line of the trace, not only the last ones.
    pub keep_trace: bool,
    /// A defect planted on purpose, to show that the checks catch it.
    pub sabotage: Option<Sabotage>,
}

/// A defect a simulation can plant in its own runners or checks, never in the host: each
/// breaks one invariant, and a test shows that the simulation then reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// Runners never stop when killed: jobs run past their count, stopped jobs run on.
    RunnersIgnoreKills,
    /// A runner restored after a crash forgets that its alloc had finished, and runs it.
    RestoredRunnersForgetTheyFinished,
    /// The check of `gc_parallel_destroys` counts one fewer than the client was given.
    DestroyBoundOneTooLow,
    /// The check of a job's count takes one fewer than the job's.
    CountCheckOneTooLow,
    /// A runner's host side never tears down a guest that ignores a stop: the kill timeout
    /// is not enforced.
    KillTimeoutNotEnforced,
    /// A runner restored after a crash is not given its checkpoint.
    RestoredRunnersLoseTheirCheckpoint,
    /// An alloc moved off a drained node starts from the checkpoint before its
    /// predecessor's last.
    MovedAllocsStartOneCheckpointBack,
}

impl SimConfig {
    /// Three nodes, sixty steps.
    pub fn new(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            nodes: 3,
            steps: 60,
            keep_trace: false,
            sabotage: None,
        }
    }
}

/// What one simulation found.
#[derive(Debug, Clone)]
pub struct SimOutcome {
    /// The seed it ran.
    pub seed: u64,
    /// The first invariant it found broken.
    pub violation: Option<String>,
    /// The hash of its whole trace: one seed, one hash.
    pub trace_hash: String,
    /// How many lines the trace had.
    pub trace_lines: u64,
    /// The trace's lines kept: all of them, or the last ones.
    pub trace: Vec<String>,
    /// How long it ran in simulated time.
    pub simulated: Duration,
}

impl SimOutcome {
    /// The outcome of seed `seed`, ending now: its trace finished, and its first violation.
    fn ended(seed: u64, trace: &Trace, violation: Option<String>) -> SimOutcome {
        let (trace_hash, trace_lines, lines) = trace.finish();
        SimOutcome {
            seed,
            violation,
            trace_hash,
            trace_lines,
            trace: lines,
            simulated: trace.elapsed(),
        }
    }
}

impl std::fmt::Display for SimOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.violation {
            Some(violation) => writeln!(f, "seed {}: VIOLATED: {violation}", self.seed)?,
            None => writeln!(f, "seed {}: every invariant held", self.seed)?,
        }
        writeln!(
            f,
            "trace {} ({} lines, {:.1} s simulated); {}:",
            self.trace_hash,
            self.trace_lines,
            self.simulated.as_secs_f64(),
            if self.trace.len() as u64 == self.trace_lines {
                "every line"
            } else {
                "the last lines"
            }
        )?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// Runs one simulation to its end on a runtime of its own, on this thread.
pub fn simulate(config: &SimConfig) -> SimOutcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(World::run(config))
}

/// How long a node may go without a watch open before the server takes it down: shorter
/// than the default 30 s, so that partitions take nodes down often. It is shorter than a
/// client's longest wait between two watches too (its backoff, up to 12.5 s): a node that
/// is only waiting to try again may be taken down, as it would be with this TTL.
const NODE_TTL: Duration = Duration::from_secs(10);
/// How long the cluster gets to converge once the faults stop.
const SETTLE: Duration = Duration::from_secs(120);
/// The most jobs a simulation registers.
const MAX_JOBS: usize = 8;

/// What the simulation believes the server acknowledged of a job.
#[derive(Debug, Clone)]
struct SimJob {
    behaviour: Behaviour,
    count: u32,
    stopped: bool,
}

/// A node: its store outlives its processes.
struct SimNode {
    name: String,
    db: Arc<FaultyStateDb>,
    link: Arc<Link>,
    process: Arc<Process>,
    incarnation: u32,
    client: Option<Client>,
}

/// What node `name` says of itself: its own class and meta, so that a server that mixed
/// them up, or forgot them, shows.
fn node_info(name: &str) -> NodeInfo {
    NodeInfo {
        class: format!("class-of-{name}"),
        meta: BTreeMap::from([("node".to_string(), name.to_string())]),
        ..NodeInfo::default()
    }
}

/// A disk that is never full: the GC here collects by count and by the server's word.
struct RoomyDisk;

impl StatsSource for RoomyDisk {
    fn stats(&self) -> std::io::Result<DiskStats> {
        Ok(DiskStats {
            used_percent: 1.0,
            inodes_used_percent: 1.0,
        })
    }
}

struct World {
    seed: u64,
    sabotage: Option<Sabotage>,
    draws: Draws,
    trace: Trace,
    ledger: Arc<Ledger>,
    server_db: Arc<FaultyStateDb>,
    server_config: ServerConfig,
    slot: Arc<ServerSlot>,
    faults_on: Arc<AtomicBool>,
    nodes: Vec<SimNode>,
    /// Where nodes fetch the checkpoints of allocs moved to them.
    peers: Arc<Peers>,
    jobs: BTreeMap<String, SimJob>,
    registered: usize,
    /// Jobs whose registration the server refused: they must never appear.
    refused: BTreeSet<String>,
    gc: GcConfig,
    data_dir: tempfile::TempDir,
}

impl World {
    async fn run(config: &SimConfig) -> SimOutcome {
        // 2026-01-01T00:00:00Z: the wall clock every simulation starts at.
        let wall_start = std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let _world = crate::util::determinism::simulated::install(config.seed, wall_start);
        let trace = Trace::new(config.keep_trace);
        let mut world = World::new(config, trace.clone()).await;
        world.trace.record(format!(
            "seed {}: {} nodes, gc_parallel_destroys {}",
            config.seed, config.nodes, world.gc.parallel_destroys
        ));
        let links = world.nodes.iter().map(|node| node.link.clone()).collect();
        let sweeper = tokio::spawn(sweep(world.slot.clone(), links, world.ledger.clone()));
        for _ in 0..config.steps {
            let pause = world.draws.millis(50, 3_000);
            tokio::time::sleep(pause).await;
            world.act().await;
            world.check();
            if world.ledger.first_violation().is_some() {
                break;
            }
        }
        if world.ledger.first_violation().is_none() {
            world.settle().await;
        }
        sweeper.abort();
        SimOutcome::ended(config.seed, &trace, world.ledger.first_violation())
    }

    async fn new(config: &SimConfig, trace: Trace) -> World {
        let mut draws = Draws::new(config.seed);
        let gc = GcConfig {
            interval: Duration::from_secs(5),
            max_allocs: 1 + draws.below(6) as usize,
            parallel_destroys: 1 + draws.below(3) as i64,
            ..GcConfig::default()
        };
        let server_config = ServerConfig {
            job_gc_threshold: Duration::from_secs(30),
            node_ttl: NODE_TTL,
            ..ServerConfig::default()
        };
        let server_db = Arc::new(FaultyStateDb::new(Arc::new(MemoryStateDb::new())));
        let server = EmbeddedServer::open(server_config.clone(), server_db.clone())
            .expect("a server opens on an empty store");
        let slot = ServerSlot::new(server);
        let faults_on = Arc::new(AtomicBool::new(true));
        let destroy_bound = match config.sabotage {
            Some(Sabotage::DestroyBoundOneTooLow) => gc.parallel_destroys as usize - 1,
            _ => gc.parallel_destroys as usize,
        };
        let ledger = Ledger::new(destroy_bound, trace.clone(), slot.clone());
        let nodes = (1..=config.nodes)
            .map(|n| {
                let name = format!("node-{n}");
                let db = Arc::new(FaultyStateDb::new(Arc::new(MemoryStateDb::new())));
                SimNode {
                    link: Link::new(
                        &name,
                        config.seed,
                        slot.clone(),
                        faults_on.clone(),
                        trace.clone(),
                    ),
                    process: Process::new(&name, 0, db.clone()),
                    name,
                    db,
                    incarnation: 0,
                    client: None,
                }
            })
            .collect::<Vec<SimNode>>();
        let links: Vec<Arc<Link>> = nodes.iter().map(|node| node.link.clone()).collect();
        let peers = Peers::new(ledger.clone(), move |node| {
            let link = links.iter().find(|link| link.node == node);
            link.is_some_and(|link| !link.is_cut())
        });
        let mut world = World {
            seed: config.seed,
            sabotage: config.sabotage,
            draws,
            trace,
            ledger,
            server_db,
            server_config,
            slot,
            faults_on,
            nodes,
            peers,
            jobs: BTreeMap::new(),
            registered: 0,
            refused: BTreeSet::new(),
            gc,
            data_dir: tempfile::tempdir().expect("a temporary directory"),
        };
        for node in 0..world.nodes.len() {
            world.start_node(node).await;
        }
        world
    }

    /// Starts node `index`'s next process on its store.
    async fn start_node(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        node.incarnation += 1;
        node.process = Process::new(&node.name, node.incarnation, node.db.clone());
        let mut config = ClientConfig::new(&node.name, self.data_dir.path().join(&node.name));
        config.gc = self.gc.clone();
        config.node_info = node_info(&node.name);
        config.watch_wait = Duration::from_secs(5);
        let factory = runner::factory(
            self.seed,
            self.sabotage,
            node.process.clone(),
            self.ledger.clone(),
        );
        let db: Arc<dyn StateDb> = node.db.clone();
        let wire = Observed::new(node.link.clone(), node.process.clone(), self.ledger.clone());
        let client = Client::with_state(config, wire, factory, Arc::new(RoomyDisk), db);
        client.fetch_checkpoints_from(self.peers.source_for(&node.name));
        if let Err(error) = client.restore().await {
            self.ledger
                .violation(format!("{} cannot restore its state: {error}", node.name));
        }
        client.start();
        self.peers.serving(&node.name, &client);
        node.client = Some(client);
        self.trace.record(format!("start {}", node.process.name));
    }

    /// Every job change the server acknowledged is in the server now, and no job whose
    /// registration it refused.
    fn check_acknowledged(&self) {
        let server = self.slot.server();
        for (id, job) in &self.jobs {
            match server.job(id) {
                Ok(record) => {
                    let count = record.spec.count;
                    if !job.stopped && (record.stopped || count != job.count) {
                        self.ledger.violation(format!(
                            "{id}: acknowledged count {} running, server has count {count}, stopped {}",
                            job.count, record.stopped
                        ));
                    }
                    if job.stopped && !record.stopped {
                        self.ledger
                            .violation(format!("{id}: acknowledged stop lost"));
                    }
                }
                Err(_) if job.stopped => {} // purged
                Err(error) => self
                    .ledger
                    .violation(format!("{id}: acknowledged job lost: {error}")),
            }
        }
        for id in &self.refused {
            if server.job(id).is_ok() {
                self.ledger
                    .violation(format!("{id}: its registration was refused, yet it exists"));
            }
        }
    }

    /// The invariants that hold at every step.
    fn check(&self) {
        self.check_acknowledged();
        let server = self.slot.server();
        check_node_infos(&server, &self.ledger);
        check_counts(&server, &self.ledger, self.sabotage);
        self.ledger.check_stops();
    }

    /// Stops the faults, heals every cut, and gives the cluster time to converge; then
    /// every steady job runs exactly its count, and nothing of a stopped job runs.
    async fn settle(&mut self) {
        self.faults_on.store(false, Ordering::SeqCst);
        for node in &self.nodes {
            node.link.partition(false);
            node.db.fail_writes(false);
            node.db.slow_commits(Duration::ZERO);
        }
        self.server_db.fail_writes(false);
        for node in &self.nodes {
            end_drain(&self.slot.server(), &self.trace, &node.name);
        }
        self.trace.record("faults stop".to_string());
        tokio::time::sleep(SETTLE).await;
        let running = self.ledger.running();
        for (id, job) in &self.jobs {
            let runs = running.iter().filter(|(_, _, of)| of == id).count() as u32;
            if job.stopped && runs > 0 {
                self.ledger.violation(format!(
                    "{id} was stopped, yet {runs} of its allocs still run {} s after the faults",
                    SETTLE.as_secs()
                ));
            }
            if !job.stopped && job.behaviour == Behaviour::Steady && runs != job.count {
                self.ledger.violation(format!(
                    "{id} runs {runs} allocs {} s after the faults stopped, not its count of {}",
                    SETTLE.as_secs(),
                    job.count
                ));
            }
        }
        self.trace
            .record(format!("settled: {} allocs running", running.len()));
    }
}

/// `server` holds each node with what that node said of itself.
fn check_node_infos(server: &EmbeddedServer, ledger: &Ledger) {
    for details in server.node_details() {
        if details.info != node_info(&details.id) {
            ledger.violation(format!(
                "the server holds {} with what another said of itself: {:?}",
                details.id, details.info
            ));
        }
    }
}

/// No job has more allocs running than its count, counting those `server` wants running
/// and does not hold lost (a replacement may run while the alloc it replaces, on a node
/// taken down, still does).
fn check_counts(server: &EmbeddedServer, ledger: &Ledger, sabotage: Option<Sabotage>) {
    let mut running_per_job: BTreeMap<String, u32> = BTreeMap::new();
    for (alloc_id, _node, job_id) in ledger.running() {
        let Ok(record) = server.alloc(&alloc_id) else {
            continue;
        };
        let held_lost = record.client_state.as_ref().is_some_and(|state| {
            matches!(
                state.client_status,
                ClientStatus::Lost | ClientStatus::Unknown
            )
        });
        if record.alloc.desired_status == DesiredStatus::Run && !held_lost {
            *running_per_job.entry(job_id).or_default() += 1;
        }
    }
    for (job_id, running) in running_per_job {
        let Ok(record) = server.job(&job_id) else {
            continue;
        };
        let count = match sabotage {
            Some(Sabotage::CountCheckOneTooLow) => record.spec.count.saturating_sub(1),
            _ => record.spec.count,
        };
        if running > count {
            ledger.violation(format!(
                "{job_id} has {running} allocs running, past its count of {}",
                record.spec.count
            ));
        }
    }
}

/// What the agent's sweep does, on the simulated clock: nodes without a watch go down, and
/// drains and disconnects move on. A node taken down must have been silent for a TTL, as
/// its wire saw it: a node is lost only when it truly stopped talking.
async fn sweep(slot: Arc<ServerSlot>, links: Vec<Arc<Link>>, ledger: Arc<Ledger>) {
    let mut sweeps = tokio::time::interval(NODE_TTL / 4);
    loop {
        sweeps.tick().await;
        let server = slot.server();
        let downed = server.down_silent_nodes("").unwrap_or_default();
        for node in downed {
            let Some(link) = links.iter().find(|link| link.node == node) else {
                continue;
            };
            match link.silent_for() {
                None => ledger.violation(format!("{node} taken down while it watched")),
                Some(silent) if silent <= NODE_TTL => ledger.violation(format!(
                    "{node} taken down after {} ms of silence, within its TTL of {} ms",
                    silent.as_millis(),
                    NODE_TTL.as_millis()
                )),
                Some(_) => {}
            }
        }
        let _ = server.tick();
    }
}
