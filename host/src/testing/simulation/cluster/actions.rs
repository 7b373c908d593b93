//! What happens to the simulated cluster between checks, each drawn from the seed: an
//! operator's change through the leader (register, scale, stop, purge, GC, drain), or a
//! fault (a node's or an agent's process crashed, a node or an agent cut off from etcd, etcd
//! down for everyone, a compaction, a node's disk that refuses writes).

use super::super::MAX_JOBS;
use super::super::SimJob;
use super::super::actions::{draw_job, draw_running_job, job_spec, node_disk_fault};
use super::super::ledger::CurrentServer;
use super::{ClusterWorld, TTL};
use crate::server::{DrainRequest, EmbeddedServer, RequestError};
use crate::util::locks::LockUnpoisoned;
use std::sync::Arc;
use std::time::Duration;

impl ClusterWorld {
    /// One operator action or fault, drawn from the seed.
    pub(super) async fn act(&mut self) {
        match self.draws.below(100) {
            0..=17 => self.register(),
            18..=33 => self.scale(),
            34..=40 => self.stop(),
            41..=46 => self.collect_garbage(),
            47..=58 => self.crash_and_restart().await,
            59..=66 => self.cut_off(),
            67..=68 => self.etcd_down(),
            69..=72 => self.compact().await,
            73..=76 => self.fail_disk(),
            77..=79 => self.drain(),
            _ => {}
        }
    }

    /// The leader's server, or a line in the trace saying that `what` found none.
    fn leader_for(&self, what: &str) -> Option<Arc<EmbeddedServer>> {
        let leader = self.leaders.current();
        if leader.is_none() {
            self.trace.record(format!("{what}: no agent leads"));
        }
        leader
    }

    fn register(&mut self) {
        if self.registered >= MAX_JOBS {
            return;
        }
        self.registered += 1;
        let (id, behaviour, count) = draw_job(&mut self.draws, self.registered);
        let Some(server) = self.leader_for(&format!("register {id}")) else {
            return;
        };
        let answer = server.register_job(job_spec(&id, behaviour, count));
        self.answered(id, "register", answer, |world, id, registration| {
            let job = SimJob {
                behaviour,
                count,
                stopped: false,
            };
            world.jobs.insert(id.to_string(), job);
            format!(
                "register {id} ({}, count {count}): {} placed",
                behaviour.name(),
                registration.placed.len()
            )
        });
    }

    /// Records how an operator's change of job `id` went: acknowledged (`acknowledged`
    /// makes it in what the simulation believes, and says it for the trace), or failed,
    /// which leaves the job unknown: the change may have landed all the same.
    fn answered<T>(
        &mut self,
        id: String,
        what: &str,
        answer: Result<T, RequestError>,
        acknowledged: impl FnOnce(&mut Self, &str, T) -> String,
    ) {
        match answer {
            Ok(value) => {
                let line = acknowledged(self, &id, value);
                self.trace.record(line);
                self.unknown.remove(&id);
            }
            Err(error) => {
                self.trace.record(format!("{what} {id} failed: {error}"));
                self.unknown.insert(id);
            }
        }
    }

    /// A job drawn from those acknowledged and not stopped.
    fn some_job(&mut self, services_only: bool) -> Option<String> {
        draw_running_job(&mut self.draws, &self.jobs, services_only)
    }

    fn scale(&mut self) {
        let Some(id) = self.some_job(true) else {
            return;
        };
        let count = self.draws.below(6) as u32;
        let Some(server) = self.leader_for(&format!("scale {id}")) else {
            return;
        };
        let answer = server.scale_job(&id, count);
        self.answered(id, "scale", answer, |world, id, _| {
            if let Some(job) = world.jobs.get_mut(id) {
                job.count = count;
            }
            format!("scale {id} to {count}")
        });
    }

    fn stop(&mut self) {
        let Some(id) = self.some_job(false) else {
            return;
        };
        let purge = self.draws.percent(50);
        let Some(server) = self.leader_for(&format!("stop {id}")) else {
            return;
        };
        let answer = server.stop_job(&id, purge);
        self.answered(id, "stop", answer, |world, id, stopped| {
            if let Some(job) = world.jobs.get_mut(id) {
                job.stopped = true;
            }
            format!("stop {id} (purge {purge}): {} allocs", stopped.len())
        });
    }

    fn collect_garbage(&mut self) {
        let Some(server) = self.leader_for("server gc") else {
            return;
        };
        match server.collect_garbage(true) {
            Ok(removed) => self
                .trace
                .record(format!("server gc: {} allocs forgotten", removed.len())),
            Err(error) => self.trace.record(format!("server gc failed: {error}")),
        }
    }

    /// Kills a node's or an agent's process, and starts the next at once or a while later.
    async fn crash_and_restart(&mut self) {
        let index = self.draws.below(self.nodes.len() as u64) as usize;
        let down_for = match self.draws.percent(40) {
            true => Duration::ZERO,
            false => self.draws.millis(0, 3 * TTL.as_millis() as u64),
        };
        if self.nodes[index].running.is_none() {
            return;
        }
        self.crash(index);
        self.trace.record(format!(
            "crash {} for {} ms",
            self.nodes[index].name,
            down_for.as_millis()
        ));
        tokio::time::sleep(down_for).await;
        self.start(index).await;
    }

    /// Cuts a node or an agent off from etcd (every call lost) for a while.
    fn cut_off(&mut self) {
        let index = self.draws.below(self.nodes.len() as u64) as usize;
        let heals_after = self.draws.millis(500, 4 * TTL.as_millis() as u64);
        let name = self.nodes[index].name.clone();
        self.faults
            .lock_unpoisoned()
            .cut_off
            .insert(name.clone(), true);
        self.trace.record(format!(
            "{name} cut off from etcd for {} ms",
            heals_after.as_millis()
        ));
        let (faults, trace) = (self.faults.clone(), self.trace.clone());
        tokio::spawn(async move {
            tokio::time::sleep(heals_after).await;
            faults.lock_unpoisoned().cut_off.remove(&name);
            trace.record(format!("{name} reaches etcd again"));
        });
    }

    /// etcd answers nobody for a while (its quorum lost).
    fn etcd_down(&mut self) {
        let back_after = self.draws.millis(500, 3 * TTL.as_millis() as u64);
        self.faults.lock_unpoisoned().etcd_down = true;
        self.trace
            .record(format!("etcd down for {} ms", back_after.as_millis()));
        let (faults, trace) = (self.faults.clone(), self.trace.clone());
        tokio::spawn(async move {
            tokio::time::sleep(back_after).await;
            faults.lock_unpoisoned().etcd_down = false;
            trace.record("etcd answers again".into());
        });
    }

    async fn compact(&mut self) {
        let revision = self.etcd.current_revision();
        let compacted = self.etcd.store().compact(revision).await;
        self.trace
            .record(format!("compaction to {revision}: {compacted:?}"));
    }

    /// A node's disk misbehaves for a while (see [`node_disk_fault`]).
    fn fail_disk(&mut self) {
        let index = self.draws.below(self.nodes.len() as u64) as usize;
        let (name, db) = (self.nodes[index].name.clone(), self.nodes[index].db.clone());
        node_disk_fault(&mut self.draws, db, name, &self.trace);
    }

    /// An operator drains a node; the drain ends once the faults stop.
    fn drain(&mut self) {
        let index = self.draws.below(self.nodes.len() as u64) as usize;
        let name = self.nodes[index].name.clone();
        let deadline = self.draws.percent(50).then(|| self.draws.millis(0, 20_000));
        let Some(server) = self.leader_for(&format!("drain {name}")) else {
            return;
        };
        let request = DrainRequest {
            deadline,
            ignore_system: false,
        };
        match server.set_drain(&name, Some(request), false) {
            Ok(_) => self.trace.record(format!(
                "drain {name} (deadline {:?} ms)",
                deadline.map(|d| d.as_millis())
            )),
            Err(error) => self.trace.record(format!("drain {name} failed: {error}")),
        }
    }
}
