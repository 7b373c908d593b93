//! The control plane in cluster mode, simulated: agents, each with its real membership
//! ([`Member`]), its real scheduler while it leads ([`schedule_while_leading`]: `lead`, the
//! server on `EtcdSchedulerDb`, its fenced writer) and its node's real client core talking
//! through [`EtcdServerApi`]; beside them nodes that never lead, as `caravan nodesim
//! --cluster etcd` joins them. All over the simulated etcd on tokio's paused clock, with the
//! runners scripted from the seed (`runner`).
//!
//! Faults, drawn from the seed: agents and nodes crashed (their runners with them) and
//! restarted on their own store, at once or later (an agent's restart revokes its previous
//! lease); agents and nodes cut off from etcd; etcd down for everyone; etcd answers lost
//! before or after etcd applied the call, writes applied late; compactions; node disks that
//! refuse writes.
//! Operators register, scale, stop and purge jobs, collect garbage and drain nodes, through
//! whichever agent leads, as the HTTP API forwards to it.
//!
//! What it checks, beside the ledger's checks of runners:
//! - **when etcd applies a write** (`writes`): only the agent run holding the leader key
//!   writes the scheduler's keys, so no deposed leader's write lands; and an alloc becomes
//!   lost only once its node's lease truly ended;
//! - **at every step**, on the leader's server: no job runs more allocs than its count, every
//!   job change a leader acknowledged is there (across leader changes), and each node is
//!   held with what it said of itself;
//! - **once the faults stop**, within a bounded time: one leader, named by every agent,
//!   every node live, every steady job running exactly its count, nothing of a stopped or
//!   purged job running.
//!
//! An operator's request that fails may still have landed (its save lost its answer, and
//! the leader stepped down): the job's acknowledged state is then unknown until the next
//! acknowledged change, and the end checks go by what the leader holds.
//!
//! A save to etcd takes no simulated time: the scheduler's writer runs on a thread of its
//! own, in lockstep with the simulation (`cluster::scheduler_db`).

mod actions;
mod writes;

use super::actions::end_drain;
use super::leadership::{Faults, fate_plan};
use super::ledger::{CurrentServer, Ledger, Observed, Process};
use super::peers::Peers;
use super::runner::{self, BEHAVIOUR_META, Behaviour};
use super::trace::{Draws, Trace};
use super::{RoomyDisk, SimJob, SimOutcome, check_counts, check_node_infos, node_info};
use crate::client::gc::GcConfig;
use crate::client::{Client, ClientConfig};
use crate::cluster::{
    EtcdServerApi, HistoryStats, Member, MemberRecord, MemberView, SchedulerConfig, ServerSlot,
    keys, schedule_while_leading,
};
use crate::server::{EmbeddedServer, ServerConfig};
use crate::state::{FaultyStateDb, MemoryStateDb, StateDb};
use crate::testing::simulated_etcd::SimulatedEtcd;
use crate::util::locks::LockUnpoisoned;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// One cluster simulation's shape.
#[derive(Debug, Clone)]
pub struct ClusterSimConfig {
    /// Every choice is drawn from it.
    pub seed: u64,
    /// How many agents (each a node too, and a candidate to lead).
    pub agents: usize,
    /// How many nodes beside the agents', which never lead.
    pub nodes: usize,
    /// How many operator steps (with faults) before the cluster is left to settle.
    pub steps: usize,
    /// Keep every line of the trace, not only the last ones.
    pub keep_trace: bool,
    /// A defect planted in the simulated etcd, to show that the checks catch what follows.
    pub sabotage: Option<EtcdSabotage>,
}

/// A defect a cluster simulation can plant in its simulated etcd, never in the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdSabotage {
    /// Every transaction's compares succeed: nothing is fenced.
    FencesNothing,
    /// Watches report each put of a node's live key, when the node joins again after its
    /// lease ended, followed by a delete that never happened: leaders believe the node gone
    /// again, on the strength of its earlier end.
    ReplaysDeletesOfRejoinedNodes,
}

impl ClusterSimConfig {
    /// Three agents, two more nodes, forty steps.
    pub fn new(seed: u64) -> ClusterSimConfig {
        ClusterSimConfig {
            seed,
            agents: 3,
            nodes: 2,
            steps: 40,
            keep_trace: false,
            sabotage: None,
        }
    }
}

/// The lease TTL of agents and nodes alike (the node TTL a new leader grants too).
const TTL: Duration = Duration::from_secs(6);
/// How long the cluster gets to converge once the faults stop.
const SETTLE: Duration = Duration::from_secs(120);
/// How often convergence is looked for once the faults stop.
const SETTLE_POLL: Duration = Duration::from_secs(1);

/// Runs one cluster simulation on a runtime of its own, on this thread.
pub fn simulate_cluster(config: &ClusterSimConfig) -> SimOutcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(ClusterWorld::run(config))
}

/// Which agent run leads now as etcd has it (the one whose lease holds the leader key, at
/// its fence's revision), and the server it published: what operators and checks talk to.
struct Leaders {
    etcd: SimulatedEtcd,
    /// Each running agent's view and published server, by node name.
    agents: Mutex<BTreeMap<String, Published>>,
}

/// An agent's membership view, and where its scheduler publishes its server.
type Published = (
    watch::Receiver<MemberView>,
    watch::Receiver<Option<Arc<EmbeddedServer>>>,
);

impl CurrentServer for Leaders {
    fn current(&self) -> Option<Arc<EmbeddedServer>> {
        let held = self.etcd.get(&keys::leader_key())?;
        let agents = self.agents.lock_unpoisoned();
        agents.values().find_map(|(view, server)| {
            let view = view.borrow();
            let fence = view.leading.as_ref()?;
            let holds =
                view.lease == Some(held.lease) && fence.create_revision == held.create_revision;
            if holds { server.borrow().clone() } else { None }
        })
    }
}

/// A node, and when it is an agent, the agent: its store outlives its processes.
struct SimNode {
    name: String,
    /// An agent, which campaigns to lead; else a node only.
    agent: bool,
    db: Arc<FaultyStateDb>,
    process: Arc<Process>,
    incarnation: u32,
    running: Option<Running>,
    /// The lease of its last run, which the next run revokes (as an agent keeps it in its
    /// data dir).
    last_lease: Option<i64>,
    /// Where its scheduler publishes its server while it leads.
    slot: ServerSlot,
}

/// What lives and dies with a node's process.
struct Running {
    member: Member,
    client: Client,
    scheduling: Option<tokio::task::JoinHandle<()>>,
}

struct ClusterWorld {
    seed: u64,
    draws: Draws,
    trace: Trace,
    etcd: SimulatedEtcd,
    faults: Arc<Mutex<Faults>>,
    ledger: Arc<Ledger>,
    leaders: Arc<Leaders>,
    scheduler: SchedulerConfig,
    gc: GcConfig,
    nodes: Vec<SimNode>,
    /// Where nodes fetch the checkpoints of allocs moved to them.
    peers: Arc<Peers>,
    /// What a leader acknowledged of each job.
    jobs: BTreeMap<String, SimJob>,
    /// Jobs whose last change failed, which may have landed all the same.
    unknown: BTreeSet<String>,
    registered: usize,
    /// The agent run the leader key named at the last step.
    leader_seen: Option<String>,
    data_dir: tempfile::TempDir,
}

impl ClusterWorld {
    async fn run(config: &ClusterSimConfig) -> SimOutcome {
        let wall_start = std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let _world = crate::util::determinism::simulated::install(config.seed, wall_start);
        let trace = Trace::new(config.keep_trace);
        let mut world = ClusterWorld::new(config, trace.clone());
        world.trace.record(format!(
            "seed {}: {} agents, {} more nodes, TTL {:?}, gc_parallel_destroys {}",
            config.seed, config.agents, config.nodes, TTL, world.gc.parallel_destroys
        ));
        for index in 0..world.nodes.len() {
            world.start(index).await;
        }
        world.faults.lock_unpoisoned().on = true;
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
        let outcome = SimOutcome::ended(config.seed, &trace, world.ledger.first_violation());
        // Every process stops as in a crash. Aborted tasks are dropped when the runtime
        // next runs, or when it goes; a scheduler's writer thread then ends on its own, its
        // queue of saves closed (it is not joined).
        for index in 0..world.nodes.len() {
            world.crash(index);
        }
        outcome
    }

    fn new(config: &ClusterSimConfig, trace: Trace) -> ClusterWorld {
        let mut draws = Draws::new(config.seed);
        let gc = GcConfig {
            interval: Duration::from_secs(5),
            max_allocs: 1 + draws.below(6) as usize,
            parallel_destroys: 1 + draws.below(3) as i64,
            ..GcConfig::default()
        };
        let etcd = SimulatedEtcd::new();
        match config.sabotage {
            Some(EtcdSabotage::FencesNothing) => etcd.ignore_compares(),
            Some(EtcdSabotage::ReplaysDeletesOfRejoinedNodes) => {
                etcd.report_phantom_deletes(&keys::live_prefix());
            }
            None => {}
        }
        let faults = Arc::new(Mutex::new(Faults::default()));
        etcd.set_fates(fate_plan(config.seed, faults.clone()));
        let leaders = Arc::new(Leaders {
            etcd: etcd.clone(),
            agents: Mutex::default(),
        });
        let ledger = Ledger::new(
            gc.parallel_destroys as usize,
            trace.clone(),
            leaders.clone(),
        );
        etcd.check_writes(writes::check_each(ledger.clone()));
        let scheduler = SchedulerConfig {
            server: ServerConfig {
                job_gc_threshold: Duration::from_secs(30),
                node_ttl: TTL,
                ..ServerConfig::default()
            },
            node_ttl: TTL,
            gc_interval: Duration::from_secs(30),
            compact_interval: Some(Duration::from_secs(20)),
            history: Arc::new(HistoryStats::default()),
        };
        let names = (1..=config.agents.max(1))
            .map(|n| (format!("agent-{n}"), true))
            .chain((1..=config.nodes).map(|n| (format!("node-{n}"), false)));
        let nodes = names
            .map(|(name, agent)| {
                let db = Arc::new(FaultyStateDb::new(Arc::new(MemoryStateDb::new())));
                SimNode {
                    process: Process::new(&name, 0, db.clone()),
                    name,
                    agent,
                    db,
                    incarnation: 0,
                    running: None,
                    last_lease: None,
                    slot: watch::channel(None).0,
                }
            })
            .collect();
        // Checkpoints cross from agent to agent, found through etcd's live nodes: a node cut
        // off, or etcd down, does not answer.
        let reachable = faults.clone();
        let peers = Peers::new(ledger.clone(), move |node| {
            let faults = reachable.lock_unpoisoned();
            !faults.etcd_down && !faults.cut_off.get(node).copied().unwrap_or(false)
        });
        ClusterWorld {
            seed: config.seed,
            draws,
            trace,
            etcd,
            faults,
            ledger,
            leaders,
            scheduler,
            gc,
            nodes,
            peers,
            jobs: BTreeMap::new(),
            unknown: BTreeSet::new(),
            registered: 0,
            leader_seen: None,
            data_dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// Starts node `index`'s next process: its membership (and scheduler, for an agent),
    /// and its client restored from its store.
    async fn start(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        node.incarnation += 1;
        // The connection's name carries the run: the write check tells runs apart by it, and
        // the fate plan cuts off a node by the name before the '/'.
        let connection = format!("{}/{}", node.name, node.incarnation);
        let store = self.etcd.store_for(&connection);
        let record = MemberRecord {
            node: node.name.clone(),
            api: format!("http://{}.sim:4646", node.name),
            agent: connection.clone(),
            info: node_info(&node.name),
        };
        let (member, scheduling) = if node.agent {
            let member = Member::join(store.clone(), record, TTL, node.last_lease);
            let scheduling = tokio::spawn(schedule_while_leading(
                store.clone(),
                member.view(),
                self.scheduler.clone(),
                node.slot.clone(),
            ));
            self.leaders
                .agents
                .lock_unpoisoned()
                .insert(node.name.clone(), (member.view(), node.slot.subscribe()));
            (member, Some(scheduling))
        } else {
            (Member::join_as_node_only(store.clone(), record, TTL), None)
        };
        node.process = Process::new(&node.name, node.incarnation, node.db.clone());
        let mut config = ClientConfig::new(&node.name, self.data_dir.path().join(&node.name));
        config.gc = self.gc.clone();
        config.node_info = node_info(&node.name);
        config.watch_wait = Duration::from_secs(5);
        let factory = runner::factory(self.seed, None, node.process.clone(), self.ledger.clone());
        let db: Arc<dyn StateDb> = node.db.clone();
        let wire = Observed::new(
            EtcdServerApi::new(store),
            node.process.clone(),
            self.ledger.clone(),
        );
        let client = Client::with_state(config, wire, factory, Arc::new(RoomyDisk), db);
        client.fetch_checkpoints_from(self.peers.source_for(&node.name));
        if let Err(error) = client.restore().await {
            self.ledger
                .violation(format!("{} cannot restore its state: {error}", node.name));
        }
        client.start();
        self.peers.serving(&node.name, &client);
        node.running = Some(Running {
            member,
            client,
            scheduling,
        });
        self.trace.record(format!("start {connection}"));
    }

    /// Kills node `index`'s process: its runners, client, membership and scheduler die with
    /// it, and its lease is left to expire.
    fn crash(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        let Some(running) = node.running.take() else {
            return;
        };
        if let Some(lease) = running.member.view().borrow().lease {
            node.last_lease = Some(lease);
        }
        node.process.kill();
        self.ledger.crashed(&node.name, &node.process.name);
        self.peers.down(&node.name);
        running.client.halt();
        if let Some(scheduling) = running.scheduling {
            scheduling.abort();
        }
        node.slot.send_replace(None);
        self.leaders.agents.lock_unpoisoned().remove(&node.name);
    }

    /// The agent run holding the leader key, as etcd has it.
    fn leader_key_holder(&self) -> Option<String> {
        let held = self.etcd.get(&keys::leader_key())?;
        let record = serde_json::from_slice::<MemberRecord>(&held.value).ok()?;
        Some(record.agent)
    }

    /// The invariants that hold at every step, on the leader's server; and a line in the
    /// trace when the leader key changed hands.
    fn check(&mut self) {
        let holder = self.leader_key_holder();
        if holder != self.leader_seen {
            self.trace
                .record(format!("the leader key now names {holder:?}"));
            self.leader_seen = holder;
        }
        self.ledger.check_stops();
        let Some(server) = self.leaders.current() else {
            return;
        };
        for (id, job) in self
            .jobs
            .iter()
            .filter(|(id, _)| !self.unknown.contains(*id))
        {
            match server.job(id) {
                Ok(record) if job.stopped && !record.stopped => self
                    .ledger
                    .violation(format!("{id}: acknowledged stop lost")),
                Ok(record)
                    if !job.stopped && (record.stopped || record.spec.count != job.count) =>
                {
                    self.ledger.violation(format!(
                        "{id}: acknowledged count {} running, the leader has count {}, stopped {}",
                        job.count, record.spec.count, record.stopped
                    ))
                }
                Ok(_) => {}
                Err(_) if job.stopped => {} // purged
                Err(error) => self
                    .ledger
                    .violation(format!("{id}: acknowledged job lost: {error}")),
            }
        }
        check_node_infos(&server, &self.ledger);
        check_counts(&server, &self.ledger, None);
    }

    /// Stops the faults, restarts what is down, ends the drains once an agent leads, and
    /// waits for the cluster to converge (see [`ClusterWorld::converged`]).
    async fn settle(&mut self) {
        {
            let mut faults = self.faults.lock_unpoisoned();
            faults.on = false;
            faults.etcd_down = false;
            faults.cut_off.clear();
        }
        for node in &self.nodes {
            node.db.fail_writes(false);
            node.db.slow_commits(Duration::ZERO);
        }
        for index in 0..self.nodes.len() {
            if self.nodes[index].running.is_none() {
                self.start(index).await;
            }
        }
        self.trace.record("faults stop".into());
        let stopped = tokio::time::Instant::now();
        let mut drains_ended = false;
        loop {
            tokio::time::sleep(SETTLE_POLL).await;
            if !drains_ended && let Some(server) = self.leaders.current() {
                // Until a leader took every end: one deposed meanwhile may have lost some.
                drains_ended = true;
                for node in &self.nodes {
                    drains_ended &= end_drain(&server, &self.trace, &node.name);
                }
            }
            let converged = self.converged();
            if let Ok(how) = &converged {
                self.trace.record(format!(
                    "settled {} ms after the faults stopped: {how}",
                    stopped.elapsed().as_millis()
                ));
                return;
            }
            if stopped.elapsed() >= SETTLE {
                let problem = converged.err().unwrap_or_default();
                self.ledger.violation(format!(
                    "{} s after the faults stopped, {problem}",
                    SETTLE.as_secs()
                ));
                return;
            }
        }
    }

    /// One leader, named by every agent; every node live; every steady job running its
    /// count and nothing of a stopped or purged job running, as the leader holds them.
    fn converged(&self) -> Result<String, String> {
        let server = self.leaders.current().ok_or("no agent leads")?;
        for node in self.nodes.iter().filter(|n| n.agent) {
            let view = node
                .running
                .as_ref()
                .map(|r| r.member.view().borrow().clone());
            let named = view.and_then(|v| v.leader).map(|r| r.agent);
            if named.is_none() || named != self.leader_key_holder() {
                return Err(format!("{} names {named:?} as the leader", node.name));
            }
        }
        for node in &self.nodes {
            if self.etcd.get(&keys::live_key(&node.name)).is_none() {
                return Err(format!("{}'s node is not live", node.name));
            }
        }
        let mut runs: BTreeMap<String, u32> = BTreeMap::new();
        for (_, _, job) in self.ledger.running() {
            *runs.entry(job).or_default() += 1;
        }
        let jobs: BTreeMap<String, _> = server
            .jobs()
            .into_iter()
            .map(|j| (j.spec.id.clone(), j))
            .collect();
        for (id, running) in &runs {
            match jobs.get(id) {
                Some(job) if job.stopped => {
                    return Err(format!("{id} was stopped, yet {running} of its allocs run"));
                }
                None => return Err(format!("{id} is gone, yet {running} of its allocs run")),
                Some(_) => {}
            }
        }
        for (id, job) in &jobs {
            let steady = job
                .spec
                .meta
                .iter()
                .any(|(key, value)| key == BEHAVIOUR_META && value == Behaviour::Steady.name());
            let running = runs.get(id).copied().unwrap_or(0);
            if steady && !job.stopped && running != job.spec.count {
                let running_ids: Vec<String> = self
                    .ledger
                    .running()
                    .into_iter()
                    .map(|(alloc, node, _)| format!("{alloc} on {node}"))
                    .collect();
                let held: Vec<String> = server
                    .job_allocs(id)
                    .iter()
                    .map(|a| {
                        let status = a.client_state.as_ref().map(|s| s.client_status);
                        format!(
                            "{} on {:?}: {:?}, {status:?}",
                            a.alloc.id, a.node_id, a.alloc.desired_status
                        )
                    })
                    .collect();
                return Err(format!(
                    "{id} runs {running} allocs, not its count of {}; the leader holds {held:?}; running: {running_ids:?}",
                    job.spec.count
                ));
            }
        }
        Ok(format!("{} allocs running", runs.values().sum::<u32>()))
    }
}
