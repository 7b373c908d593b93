//! The cluster's membership and leader election, simulated: real [`Member`]s (lease
//! keeping, the live key, the campaign, the leader key's watch, the revocation of a
//! previous run's lease, a clean leave) of several agents over the simulated etcd, on
//! tokio's paused clock, with faults drawn from the seed: agents crashed and restarted (at
//! once, or later), agents that leave and come back, agents cut off from etcd (every call
//! lost) for up to several TTLs, answers lost before or after etcd applied the call, writes
//! applied late, and compactions.
//!
//! What it checks:
//! - **at every moment** (a sweep every 50 ms of simulated time): an agent whose view says
//!   it leads with its lease known fresh (what lets the HTTP API answer from its memory)
//!   truly holds the leader key in etcd, under its lease and at its fence's create
//!   revision;
//! - **once the faults stop**, within a bounded time: exactly one agent leads, every
//!   agent's view names it, and every agent's node is live.
//!
//! The scheduler that runs under the leadership is not driven here: the `cluster`
//! simulation runs it, with nodes, under the same faults.

use super::SimOutcome;
use super::trace::{Draws, Trace};
use crate::cluster::{EtcdStore, Member, MemberRecord, MemberView, keys};
use crate::testing::simulated_etcd::{CallFate, CallKind, SimulatedEtcd};
use crate::util::locks::LockUnpoisoned;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One leadership simulation's shape.
#[derive(Debug, Clone)]
pub struct LeadershipConfig {
    /// Every choice is drawn from it.
    pub seed: u64,
    /// How many agents.
    pub agents: usize,
    /// How many fault steps before the cluster is left to settle.
    pub steps: usize,
    /// Keep every line of the trace, not only the last ones.
    pub keep_trace: bool,
    /// Plant a defect in the simulated etcd (leases end at half their TTL), to show that
    /// the checks catch what follows.
    pub leases_end_early: bool,
}

impl LeadershipConfig {
    /// Three agents, forty steps.
    pub fn new(seed: u64) -> LeadershipConfig {
        LeadershipConfig {
            seed,
            agents: 3,
            steps: 40,
            keep_trace: false,
            leases_end_early: false,
        }
    }
}

/// The agents' lease TTL (renewed every third of it).
const TTL: Duration = Duration::from_secs(6);
/// How long the cluster gets to elect one leader, named by all, once the faults stop: a
/// leader that was cut off keeps the key until its lease runs out (one TTL after its last
/// renewal), the others see the key go and campaign at once, and a renewal or a watch
/// broken by the faults is tried again within a renewal interval.
const SETTLE: Duration = Duration::from_secs(20);
/// How often the every-moment check runs.
const SWEEP: Duration = Duration::from_millis(50);

/// Runs one leadership simulation on a runtime of its own, on this thread.
pub fn simulate_leadership(config: &LeadershipConfig) -> SimOutcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(run(config))
}

/// Which agents are cut off from etcd, and whether random faults are on: what the fate
/// plan reads.
#[derive(Default)]
pub(super) struct Faults {
    /// By connection name (an agent's, or a node's).
    pub(super) cut_off: BTreeMap<String, bool>,
    /// Every call lost, whoever makes it.
    pub(super) etcd_down: bool,
    pub(super) on: bool,
}

struct Agent {
    name: String,
    store: EtcdStore,
    member: Option<Member>,
    /// The lease of its last run, for the next run to revoke (as the agent keeps it in its
    /// data dir).
    last_lease: Option<i64>,
    runs: u32,
}

impl Agent {
    fn record(&self) -> MemberRecord {
        MemberRecord {
            node: self.name.clone(),
            api: format!("http://{}.sim:4646", self.name),
            agent: format!("agent-{}", self.name),
            info: Default::default(),
        }
    }

    fn start(&mut self, trace: &Trace) {
        self.runs += 1;
        trace.record(format!(
            "{} starts (run {}, previous lease {:?})",
            self.name, self.runs, self.last_lease
        ));
        self.member = Some(Member::join(
            self.store.clone(),
            self.record(),
            TTL,
            self.last_lease,
        ));
    }

    fn remember_lease(&mut self) {
        if let Some(lease) = self.member.as_ref().and_then(|m| m.view().borrow().lease) {
            self.last_lease = Some(lease);
        }
    }
}

async fn run(config: &LeadershipConfig) -> SimOutcome {
    let wall_start = std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
    let _world = crate::util::determinism::simulated::install(config.seed, wall_start);
    let trace = Trace::new(config.keep_trace);
    let mut draws = Draws::new(config.seed);
    let etcd = SimulatedEtcd::new();
    if config.leases_end_early {
        etcd.end_leases_early();
    }
    let faults = Arc::new(Mutex::new(Faults::default()));
    etcd.set_fates(fate_plan(config.seed, faults.clone()));
    let mut agents: Vec<Agent> = (1..=config.agents.max(1))
        .map(|n| {
            let name = format!("agent-{n}");
            Agent {
                store: etcd.store_for(&name),
                name,
                member: None,
                last_lease: None,
                runs: 0,
            }
        })
        .collect();
    trace.record(format!(
        "seed {}: {} agents, TTL {:?}",
        config.seed,
        agents.len(),
        TTL
    ));
    for agent in &mut agents {
        agent.start(&trace);
    }
    let violation: Arc<Mutex<Option<String>>> = Arc::default();
    let views = Arc::new(Mutex::new(Vec::new()));
    let sweeper = tokio::spawn(sweep(
        etcd.clone(),
        views.clone(),
        violation.clone(),
        trace.clone(),
    ));
    *views.lock_unpoisoned() = watched(&agents);
    faults.lock_unpoisoned().on = true;
    for _ in 0..config.steps {
        tokio::time::sleep(draws.millis(50, 4_000)).await;
        act(&mut draws, &mut agents, &etcd, &faults, &views, &trace).await;
        // What crashed or left serves nothing more: its view is no longer checked.
        *views.lock_unpoisoned() = watched(&agents);
        if violation.lock_unpoisoned().is_some() {
            break;
        }
    }
    if violation.lock_unpoisoned().is_none() {
        // The faults stop: every agent runs and reaches etcd.
        {
            let mut faults = faults.lock_unpoisoned();
            faults.on = false;
            faults.cut_off.clear();
        }
        for agent in agents.iter_mut().filter(|a| a.member.is_none()) {
            agent.start(&trace);
        }
        *views.lock_unpoisoned() = watched(&agents);
        trace.record("faults stop".into());
        let stopped = tokio::time::Instant::now();
        let mut settled = settled_now(&etcd, &agents);
        while settled.is_err() && stopped.elapsed() < SETTLE {
            tokio::time::sleep(SWEEP).await;
            settled = settled_now(&etcd, &agents);
        }
        match settled {
            Ok(how) => trace.record(format!(
                "settled {} ms after the faults stopped: {how}",
                stopped.elapsed().as_millis()
            )),
            Err(problem) => {
                let problem = format!("{SETTLE:?} after the faults stopped, {problem}");
                trace.record(format!("VIOLATION: {problem}"));
                violation.lock_unpoisoned().get_or_insert(problem);
            }
        }
    }
    sweeper.abort();
    let violation = violation.lock_unpoisoned().clone();
    SimOutcome::ended(config.seed, &trace, violation)
}

/// The fate of each call: lost while its agent is cut off; otherwise, while faults are on,
/// now and then lost before or after etcd applied it, or applied late.
pub(super) fn fate_plan(
    seed: u64,
    faults: Arc<Mutex<Faults>>,
) -> impl FnMut(&str, CallKind) -> CallFate + Send + 'static {
    let mut draws = Draws::new(seed.rotate_left(17));
    move |connection, kind| {
        let faults = faults.lock_unpoisoned();
        // A connection named `node/run` is cut off with its node.
        let node = connection.split('/').next().unwrap_or(connection);
        if faults.etcd_down || faults.cut_off.get(node).copied().unwrap_or(false) {
            return CallFate::LostBefore;
        }
        if !faults.on || kind == CallKind::Watch && !draws.percent(2) {
            return CallFate::Answered;
        }
        match draws.below(100) {
            0..=2 => CallFate::LostBefore,
            3..=4 => CallFate::LostAfter,
            5 => CallFate::AppliedLater(draws.millis(100, 8_000)),
            _ => CallFate::Answered,
        }
    }
}

/// One fault or operator action between two checks.
async fn act(
    draws: &mut Draws,
    agents: &mut [Agent],
    etcd: &SimulatedEtcd,
    faults: &Mutex<Faults>,
    views: &Views,
    trace: &Trace,
) {
    let index = draws.below(agents.len() as u64) as usize;
    let agent = &mut agents[index];
    match draws.below(10) {
        0 | 1 => {
            if agent.member.is_some() {
                agent.remember_lease();
                agent.member = None;
                trace.record(format!("{} crashes", agent.name));
                if draws.percent(50) {
                    agent.start(trace);
                }
            } else {
                agent.start(trace);
            }
        }
        2 => {
            if let Some(member) = agent.member.take() {
                agent.remember_lease();
                trace.record(format!("{} leaves", agent.name));
                // An agent that is leaving serves nothing more: its view is no longer
                // checked from here on.
                views
                    .lock_unpoisoned()
                    .retain(|(name, _)| *name != agent.name);
                member.leave().await;
            }
        }
        3 | 4 => {
            let mut faults = faults.lock_unpoisoned();
            let cut = faults.cut_off.entry(agent.name.clone()).or_default();
            *cut = !*cut;
            let now = if *cut { "is cut off from" } else { "reaches" };
            trace.record(format!("{} {now} etcd", agent.name));
        }
        5 => {
            let revision = etcd.current_revision();
            let compacted = etcd.store().compact(revision).await;
            trace.record(format!("compaction to {revision}: {compacted:?}"));
        }
        _ => {}
    }
}

/// An agent's name and its view.
type NamedView = (String, tokio::sync::watch::Receiver<MemberView>);

/// Each running agent's name and view, for the sweep.
fn watched(agents: &[Agent]) -> Vec<NamedView> {
    agents
        .iter()
        .filter_map(|a| Some((a.name.clone(), a.member.as_ref()?.view())))
        .collect()
}

type Views = Arc<Mutex<Vec<NamedView>>>;

/// Every [`SWEEP`]: no agent believes it leads, with its lease fresh, unless etcd says so.
/// Records each change of the leader key's holder.
async fn sweep(
    etcd: SimulatedEtcd,
    views: Views,
    violation: Arc<Mutex<Option<String>>>,
    trace: Trace,
) {
    let leader_key = keys::leader_key();
    let mut last_holder = None;
    loop {
        tokio::time::sleep(SWEEP).await;
        let held = etcd.get(&leader_key);
        let holder = held.as_ref().map(|kv| (kv.lease, kv.create_revision));
        if holder != last_holder {
            trace.record(format!("leader key now {holder:?}"));
            last_holder = holder;
        }
        for (name, view) in views.lock_unpoisoned().iter() {
            let view = view.borrow();
            let Some(fence) = view.leading.as_ref().filter(|_| view.lease_is_fresh()) else {
                continue;
            };
            let truly = held.as_ref().is_some_and(|kv| {
                Some(kv.lease) == view.lease && kv.create_revision == fence.create_revision
            });
            if !truly {
                let problem = format!(
                    "{name} believes it leads (lease {:?}, fence at {}, fresh) but etcd's leader key is {holder:?}",
                    view.lease, fence.create_revision
                );
                trace.record(format!("VIOLATION: {problem}"));
                violation.lock_unpoisoned().get_or_insert(problem);
            }
        }
    }
}

/// Once the faults stopped: one leader, named by every agent, every node live.
fn settled_now(etcd: &SimulatedEtcd, agents: &[Agent]) -> Result<String, String> {
    let leaders: Vec<&str> = agents
        .iter()
        .filter(|a| {
            a.member.as_ref().is_some_and(|m| {
                let view = m.view().borrow().clone();
                view.leading.is_some() && view.lease_is_fresh()
            })
        })
        .map(|a| a.name.as_str())
        .collect();
    let [leader] = leaders.as_slice() else {
        return Err(format!("{} agents lead: {leaders:?}", leaders.len()));
    };
    for agent in agents {
        let view = agent.member.as_ref().map(|m| m.view().borrow().clone());
        let named = view.and_then(|v| v.leader).map(|r| r.node);
        if named.as_deref() != Some(*leader) {
            return Err(format!(
                "{} names {named:?} as the leader, not {leader}",
                agent.name
            ));
        }
    }
    let live: Vec<String> = etcd
        .snapshot()
        .into_iter()
        .filter(|kv| kv.key.starts_with(&keys::live_prefix()))
        .map(|kv| kv.key)
        .collect();
    for agent in agents {
        if !live.contains(&keys::live_key(&agent.name)) {
            return Err(format!("{}'s node is not live", agent.name));
        }
    }
    Ok(format!("{leader} leads; every node live"))
}
