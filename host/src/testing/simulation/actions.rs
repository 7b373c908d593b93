//! What happens to the simulated cluster between checks, each drawn from the seed: an
//! operator's change (register, scale, stop, purge, GC, drain), or a fault (a node's process
//! killed and restarted on its store, the server restarted on its store, a node cut off, a
//! disk that refuses writes).

use super::runner::{BEHAVIOUR_META, Behaviour};
use super::trace::{Draws, Trace, fnv1a};
use super::{MAX_JOBS, SimJob, World};
use crate::model::jobspec::{JobSpec, JobType};
use crate::model::structs::{LimitOverrides, Task};
use crate::server::{DrainRequest, EmbeddedServer};
use crate::state::FaultyStateDb;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

impl World {
    /// One operator action or fault, drawn from the seed.
    pub(super) async fn act(&mut self) {
        match self.draws.below(100) {
            0..=19 => self.register(),
            20..=39 => self.scale(),
            40..=46 => self.stop(),
            47..=54 => self.collect_garbage(),
            55..=62 => self.crash_node().await,
            63..=67 => self.restart_server(),
            68..=74 => self.partition_node(),
            75..=78 => self.fail_disk(),
            79..=81 => self.drain_node(),
            _ => {}
        }
    }

    fn register(&mut self) {
        if self.registered >= MAX_JOBS {
            return;
        }
        self.registered += 1;
        let (id, behaviour, count) = draw_job(&mut self.draws, self.registered);
        let spec = job_spec(&id, behaviour, count);
        match self.slot.server().register_job(spec) {
            Ok(registration) => {
                self.trace.record(format!(
                    "register {id} ({}, count {count}): {} placed",
                    behaviour.name(),
                    registration.placed.len()
                ));
                let job = SimJob {
                    behaviour,
                    count,
                    stopped: false,
                };
                self.jobs.insert(id, job);
            }
            Err(error) => {
                self.trace.record(format!("register {id} refused: {error}"));
                self.refused.insert(id);
            }
        }
    }

    /// A job drawn from those still registered.
    fn some_job(&mut self, services_only: bool) -> Option<String> {
        draw_running_job(&mut self.draws, &self.jobs, services_only)
    }

    fn scale(&mut self) {
        let Some(id) = self.some_job(true) else {
            return;
        };
        let count = self.draws.below(6) as u32;
        match self.slot.server().scale_job(&id, count) {
            Ok(_) => {
                self.trace.record(format!("scale {id} to {count}"));
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.count = count;
                }
            }
            Err(error) => self.trace.record(format!("scale {id} refused: {error}")),
        }
    }

    fn stop(&mut self) {
        let Some(id) = self.some_job(false) else {
            return;
        };
        let purge = self.draws.percent(50);
        match self.slot.server().stop_job(&id, purge) {
            Ok(stopped) => {
                self.trace.record(format!(
                    "stop {id} (purge {purge}): {} allocs",
                    stopped.len()
                ));
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.stopped = true;
                }
            }
            Err(error) => self.trace.record(format!("stop {id} refused: {error}")),
        }
    }

    fn collect_garbage(&mut self) {
        match self.slot.server().collect_garbage(true) {
            Ok(removed) => self
                .trace
                .record(format!("server gc: {} allocs forgotten", removed.len())),
            Err(error) => self.trace.record(format!("server gc refused: {error}")),
        }
    }

    /// Kills a node's process (its runners die with it, unreported), and starts a new one
    /// on the same store a moment later.
    async fn crash_node(&mut self) {
        let index = self.draws.below(self.nodes.len() as u64) as usize;
        let down_for = self.draws.millis(0, 5_000);
        let node = &mut self.nodes[index];
        node.process.kill();
        self.ledger.crashed(&node.name, &node.process.name);
        self.peers.down(&node.name);
        if let Some(client) = node.client.take() {
            client.halt();
        }
        tokio::time::sleep(down_for).await;
        self.start_node(index).await;
    }

    /// The server dies and a new one opens the same store: what it acknowledged must be
    /// there.
    fn restart_server(&mut self) {
        let server = match EmbeddedServer::open(self.server_config.clone(), self.server_db.clone())
        {
            Ok(server) => server,
            Err(error) => {
                self.ledger
                    .violation(format!("the server cannot reopen its store: {error}"));
                return;
            }
        };
        self.slot.replace(server);
        self.trace.record("server restarted".to_string());
        self.check_acknowledged();
    }

    /// Cuts a node off for a while: its calls hang until the cut heals.
    fn partition_node(&mut self) {
        let index = self.draws.below(self.nodes.len() as u64) as usize;
        let heals_after = self.draws.millis(1_000, 30_000);
        let link = self.nodes[index].link.clone();
        link.partition(true);
        self.trace.record(format!(
            "partition {} for {} ms",
            self.nodes[index].name,
            heals_after.as_millis()
        ));
        tokio::spawn(async move {
            tokio::time::sleep(heals_after).await;
            link.partition(false);
        });
    }

    /// A disk misbehaves for a while: a node's (see [`node_disk_fault`]), or the server's,
    /// which fails every write, as a full one does (it refuses changes).
    fn fail_disk(&mut self) {
        let which = self.draws.below(self.nodes.len() as u64 + 1) as usize;
        match self.nodes.get(which) {
            Some(node) => {
                let (db, name) = (node.db.clone(), node.name.clone());
                node_disk_fault(&mut self.draws, db, name, &self.trace);
            }
            None => {
                let heals_after = self.draws.millis(500, 20_000);
                let db = self.server_db.clone();
                fail_writes_for(db, "the server".into(), heals_after, &self.trace);
            }
        }
    }

    /// An operator drains a node (its allocs move elsewhere, by a deadline or not), and
    /// ends the drain a while later.
    fn drain_node(&mut self) {
        let index = self.draws.below(self.nodes.len() as u64) as usize;
        let name = self.nodes[index].name.clone();
        let deadline = self.draws.percent(50).then(|| self.draws.millis(0, 20_000));
        let ends_after = self.draws.millis(1_000, 40_000);
        let request = DrainRequest {
            deadline,
            ignore_system: false,
        };
        match self.slot.server().set_drain(&name, Some(request), false) {
            Ok(_) => self.trace.record(format!(
                "drain {name} (deadline {:?} ms) for {} ms",
                deadline.map(|d| d.as_millis()),
                ends_after.as_millis()
            )),
            Err(error) => {
                self.trace.record(format!("drain {name} refused: {error}"));
                return;
            }
        }
        let (slot, trace) = (self.slot.clone(), self.trace.clone());
        tokio::spawn(async move {
            tokio::time::sleep(ends_after).await;
            end_drain(&slot.server(), &trace, &name);
        });
    }
}

/// Ends a drain, and makes the node eligible again (a drain that finished leaves its node
/// ineligible, as Nomad's does, until an operator says otherwise). False when `server`
/// refused to.
pub(super) fn end_drain(server: &EmbeddedServer, trace: &Trace, node: &str) -> bool {
    let details = server.node_details();
    let Some(schedule) = details
        .iter()
        .find(|details| details.id == node)
        .map(|details| &details.schedule)
    else {
        return true;
    };
    let ended = if schedule.drain.is_some() {
        server.set_drain(node, None, false)
    } else if schedule.ineligible {
        server.set_eligibility(node, true)
    } else {
        return true;
    };
    match ended {
        Ok(_) => {
            trace.record(format!("{node} eligible again"));
            true
        }
        Err(error) => {
            trace.record(format!("making {node} eligible again refused: {error}"));
            false
        }
    }
}

pub(super) fn job_spec(id: &str, behaviour: Behaviour, count: u32) -> JobSpec {
    JobSpec {
        namespace: "default".into(),
        id: id.into(),
        job_type: if behaviour == Behaviour::Batch {
            JobType::Batch
        } else {
            JobType::Service
        },
        count,
        runner: "simulated.wasm".into(),
        runner_sha256: None,
        limits: LimitOverrides {
            kill_timeout: Some(kill_timeout_of(id)),
            ..LimitOverrides::default()
        },
        tasks: vec![Task::named("main")],
        meta: vec![(BEHAVIOUR_META.into(), behaviour.name().into())],
        capabilities: Default::default(),
        reschedule: None,
        restart: None,
        update: Default::default(),
        constraints: Vec::new(),
        placement: Default::default(),
        migrate: Default::default(),
        disconnect: None,
    }
}

/// Job `id`'s kill timeout, drawn from its id: at once, half a second, two seconds, or
/// Nomad's default of five. Runners take up to two seconds to stop, and some never do.
fn kill_timeout_of(id: &str) -> Duration {
    const CHOICES_MS: [u64; 4] = [0, 500, 2_000, 5_000];
    Duration::from_millis(CHOICES_MS[(fnv1a(id.as_bytes()) % 4) as usize])
}

/// The next job to register, drawn from the seed: its id (the `number`th), its runners'
/// behaviour and its count.
pub(super) fn draw_job(draws: &mut Draws, number: usize) -> (String, Behaviour, u32) {
    let behaviour = match draws.below(3) {
        0 => Behaviour::Steady,
        1 => Behaviour::Flaky,
        _ => Behaviour::Batch,
    };
    let count = 1 + draws.below(4) as u32;
    (format!("job-{number}"), behaviour, count)
}

/// A job drawn from those acknowledged and not stopped (services only, when asked).
pub(super) fn draw_running_job(
    draws: &mut Draws,
    jobs: &BTreeMap<String, SimJob>,
    services_only: bool,
) -> Option<String> {
    let candidates: Vec<_> = jobs
        .iter()
        .filter(|(_, job)| {
            let wanted = !services_only || job.behaviour != Behaviour::Batch;
            !job.stopped && wanted
        })
        .map(|(id, _)| id.clone())
        .collect();
    let index = draws.below(candidates.len() as u64) as usize;
    candidates.get(index).cloned()
}

/// `db`, the disk of node `name`, misbehaves for a while, drawn from the seed: it fails every
/// write, as a full one does (its client cannot save states, checkpoints or new allocs), or
/// each commit of its client takes up to two seconds, as on a slow or saturated disk (its
/// client's other tasks go on meanwhile, and writes queue behind the commit).
pub(super) fn node_disk_fault(
    draws: &mut Draws,
    db: Arc<FaultyStateDb>,
    name: String,
    trace: &Trace,
) {
    let heals_after = draws.millis(500, 20_000);
    if draws.percent(50) {
        fail_writes_for(db, name, heals_after, trace);
        return;
    }
    let delay = draws.millis(10, 2_000);
    db.slow_commits(delay);
    trace.record(format!(
        "disk of {name} takes {} ms a commit for {} ms",
        delay.as_millis(),
        heals_after.as_millis()
    ));
    let healed = format!("disk of {name} is quick again");
    heal_after(heals_after, trace, healed, move || {
        db.slow_commits(Duration::ZERO)
    });
}

/// `db`, the disk of `name`, fails every write for `heals_after`, as a full one does.
pub(super) fn fail_writes_for(
    db: Arc<FaultyStateDb>,
    name: String,
    heals_after: Duration,
    trace: &Trace,
) {
    db.fail_writes(true);
    trace.record(format!(
        "disk of {name} fails writes for {} ms",
        heals_after.as_millis()
    ));
    let healed = format!("disk of {name} writes again");
    heal_after(heals_after, trace, healed, move || db.fail_writes(false));
}

/// After `heals_after`, `heal`s a fault and records `healed`.
fn heal_after(
    heals_after: Duration,
    trace: &Trace,
    healed: String,
    heal: impl FnOnce() + Send + 'static,
) {
    let trace = trace.clone();
    tokio::spawn(async move {
        tokio::time::sleep(heals_after).await;
        heal();
        trace.record(healed);
    });
}
