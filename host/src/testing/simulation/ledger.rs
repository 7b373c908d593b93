//! The ground truth of the simulation's runners: which node process ran what, and when it
//! ended or was destroyed. Every invariant about runners is checked against it the moment
//! something starts, stops or is destroyed, and the rest at every step.
//!
//! It reads the server (through [`CurrentServer`]) and the nodes' stores; it changes neither.

use super::trace::Trace;
use crate::model::node::NodeInfo;
use crate::model::structs::{Alloc, AllocState, ClientStatus, DesiredStatus};
use crate::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use crate::server::EmbeddedServer;
use crate::state::{FaultyStateDb, StateDb};
use crate::util::locks::LockUnpoisoned;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// What the ground truth knows.
#[derive(Default)]
struct LedgerState {
    /// Allocs running now.
    running: BTreeMap<String, RunningAlloc>,
    /// When a node process received each stop (the alloc in a `get_allocs` answer with a
    /// desired status of stop or evict), by process and alloc: the first time only.
    stops_received: BTreeMap<(String, String), Instant>,
    /// The last checkpoint each alloc's runner was told is kept, by alloc.
    checkpoints: BTreeMap<String, Checkpoint>,
    /// Allocs whose runner ended with a terminal status: that status, and the process.
    finished: BTreeMap<String, (ClientStatus, String)>,
    /// Destroys under way, per node process.
    destroying: BTreeMap<String, usize>,
    violations: Vec<String>,
}

/// One alloc running now.
struct RunningAlloc {
    process: Arc<Process>,
    job: String,
    /// How long its runner may take to stop once told to.
    kill_timeout: Duration,
}

/// A scripted runner's checkpoint, as its bytes say: `root#sequence`, where `root` is the
/// first alloc of the line it continues (an alloc moved off a drained node continues its
/// predecessor's) and `sequence` counts up along that line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Checkpoint {
    pub(super) root: String,
    pub(super) sequence: u64,
}

impl Checkpoint {
    pub(super) fn bytes(&self) -> Vec<u8> {
        format!("{}#{}", self.root, self.sequence).into_bytes()
    }

    /// The checkpoint these bytes hold; `None` when they are not one a scripted runner wrote.
    pub(super) fn read(bytes: &[u8]) -> Option<Checkpoint> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (root, sequence) = text.rsplit_once('#')?;
        Some(Checkpoint {
            root: root.to_string(),
            sequence: sequence.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.root, self.sequence)
    }
}

/// The ground truth of runners, shared by every node of one simulation.
pub(super) struct Ledger {
    state: Mutex<LedgerState>,
    parallel_destroys: usize,
    pub(super) trace: Trace,
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
    pub(super) fn started(&self, process: &Arc<Process>, alloc: &Alloc, kill_timeout: Duration) {
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
        if let Some(elsewhere) = state.running.get(&alloc.id).map(|r| r.process.node.clone()) {
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
        let running = RunningAlloc {
            process: process.clone(),
            job: alloc.job_id.clone(),
            kill_timeout,
        };
        state.running.insert(alloc.id.clone(), running);
        self.trace
            .record(format!("run {} of {} on {node}", alloc.id, alloc.job_id));
    }

    pub(super) fn ended(&self, process: &Process, alloc_id: &str, status: Option<ClientStatus>) {
        let node = &process.node;
        let mut state = self.state.lock_unpoisoned();
        if let Some(what) = overran(&state, alloc_id, Instant::now()) {
            self.violated(&mut state, what);
        }
        state.running.remove(alloc_id);
        state.stops_received.retain(|(_, of), _| of != alloc_id);
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
        let now = Instant::now();
        let on_it = state.running.iter().filter(|(_, r)| r.process.node == node);
        let overruns: Vec<String> = on_it
            .filter_map(|(alloc_id, _)| overran(&state, alloc_id, now))
            .collect();
        for what in overruns {
            self.violated(&mut state, what);
        }
        let before = state.running.len();
        state
            .running
            .retain(|_, running| running.process.node != node);
        state.stops_received.retain(|(by, _), _| by != process);
        state.destroying.remove(process);
        let died = before - state.running.len();
        self.trace
            .record(format!("crash {node}: {died} runners died with it"));
    }

    /// A destroy begins. Wrong when the server still holds the alloc as one to run (not
    /// stopped, not lost): a client may destroy a running alloc only once its server
    /// stopped it or forgot it.
    pub(super) fn destroy_begun(&self, process: &str, alloc_id: &str) {
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
            .is_some_and(|running| running.process.node == node);
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

    pub(super) fn destroy_done(&self, process: &str) {
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
            .map(|(id, running)| {
                (
                    id.clone(),
                    running.process.node.clone(),
                    running.job.clone(),
                )
            })
            .collect()
    }

    /// Node process `process` received alloc `alloc_id` with a desired status of stop or
    /// evict: its client has the stop in hand from now on.
    fn stop_received(&self, process: &Process, alloc_id: &str) {
        let mut state = self.state.lock_unpoisoned();
        let key = (process.name.clone(), alloc_id.to_string());
        state.stops_received.entry(key).or_insert_with(Instant::now);
    }

    /// No alloc runs longer than its kill timeout after the node process running it
    /// received its stop: the client tells the runner at once (the runner of an alloc that
    /// arrives or restarts later starts as the stop says), and the runner's host side tears
    /// down a guest that does not return in time. So an alloc and its replacement never both
    /// run longer than that once the node knows; how soon it knows is up to its wire, and a
    /// node cut off learns nothing (its alloc is lost, and its replacement may run beside
    /// it, as in Nomad).
    /// Checked at every step, and as each runner ends or dies.
    pub(super) fn check_stops(&self) {
        let now = Instant::now();
        let mut state = self.state.lock_unpoisoned();
        let late: Vec<String> = state
            .running
            .keys()
            .filter_map(|alloc_id| overran(&state, alloc_id, now))
            .collect();
        for what in late {
            self.violated(&mut state, what);
        }
    }

    /// The runner of `alloc_id` in `process` was told its checkpoint is kept.
    pub(super) fn checkpoint_kept(&self, process: &Process, alloc_id: &str, kept: Checkpoint) {
        if !process.alive() {
            return;
        }
        let mut state = self.state.lock_unpoisoned();
        // Two saves answered by one commit may resume in either order: the later one counts.
        let newer = match state.checkpoints.get(alloc_id) {
            Some(known) if known.root == kept.root => kept.sequence > known.sequence,
            _ => true,
        };
        if newer {
            state.checkpoints.insert(alloc_id.to_string(), kept);
        }
    }

    /// Node `node` served `served` as the final checkpoint of alloc `alloc_id`, moved off it.
    /// Wrong when that is less than the last checkpoint the alloc's runner was told is kept,
    /// for an alloc shut down to move (held from collection until its checkpoint is served).
    pub(super) fn served(&self, node: &str, alloc_id: &str, served: Option<&[u8]>) {
        let mut state = self.state.lock_unpoisoned();
        // One that ended by itself (or was killed) before the move reached it was not shut
        // down to move: it is collected as any finished alloc, its checkpoint with it.
        if state.finished.contains_key(alloc_id) {
            return;
        }
        let Some(kept) = state.checkpoints.get(alloc_id).cloned() else {
            return;
        };
        let served = served.map(|bytes| (Checkpoint::read(bytes), bytes));
        let wrong = match served {
            None => Some("no checkpoint".to_string()),
            Some((Some(served), _))
                if served.root == kept.root && served.sequence >= kept.sequence =>
            {
                None
            }
            Some((Some(served), _)) => Some(format!("checkpoint {served}")),
            Some((None, bytes)) => Some(format!("{:?}", String::from_utf8_lossy(bytes))),
        };
        if let Some(wrong) = wrong {
            let what = format!(
                "{node} served {wrong} for {alloc_id}, moved off it, whose runner was told \
                 {kept} is kept"
            );
            self.violated(&mut state, what);
        }
    }

    /// A runner is built for `alloc` in `process`, from checkpoint `from` (as
    /// [`AllocRunnerConfig::restored`] has it). Wrong when an alloc restored after a crash
    /// starts from less than the last checkpoint it was told is kept, or from another line's;
    /// or when an alloc moved off a drained node starts from a checkpoint older than the
    /// last its predecessor was told is kept, or while that predecessor still runs (its
    /// checkpoint is not final then). A moved alloc may start afresh: its predecessor's node
    /// may not answer in time.
    ///
    /// [`AllocRunnerConfig::restored`]: crate::allocrunner::AllocRunnerConfig::restored
    pub(super) fn built(
        &self,
        process: &Process,
        alloc: &Alloc,
        restoring: bool,
        from: Option<&[u8]>,
    ) {
        if !process.alive() {
            return;
        }
        let from_bytes = from;
        let from = from.and_then(Checkpoint::read);
        let mut state = self.state.lock_unpoisoned();
        let id = &alloc.id;
        let kept = state.checkpoints.get(id).cloned();
        let wrong = if restoring {
            match (&kept, &from) {
                (Some(kept), None) => Some(format!(
                    "alloc {id} restored on {} without checkpoint {kept}, which it was told is kept",
                    process.name
                )),
                (Some(kept), Some(from))
                    if from.root != kept.root || from.sequence < kept.sequence =>
                {
                    Some(format!(
                        "alloc {id} restored on {} from checkpoint {from}, not at least {kept}, \
                         which it was told is kept",
                        process.name
                    ))
                }
                _ => None,
            }
        } else if let Some(bytes) = from_bytes {
            let previous = alloc.previous_alloc.as_ref().map(|p| p.alloc_id.clone());
            let predecessor_kept = previous.as_ref().and_then(|p| state.checkpoints.get(p));
            match (&previous, predecessor_kept, &from) {
                (None, _, _) => Some(format!("new alloc {id} started from a checkpoint")),
                (Some(p), _, _) if state.running.contains_key(p) => Some(format!(
                    "alloc {id} started from the checkpoint of {p}, which still runs"
                )),
                (Some(p), Some(last), Some(from))
                    if from.root != last.root || from.sequence < last.sequence =>
                {
                    Some(format!(
                        "alloc {id} moved from {p} started from checkpoint {from}, \
                         not at least {last}, the last {p} was told is kept"
                    ))
                }
                (Some(p), _, None) => Some(format!(
                    "alloc {id} moved from {p} started from {:?}, which no runner wrote",
                    String::from_utf8_lossy(bytes)
                )),
                // A predecessor told of none may still have saved one: its last, cut off
                // by the kill timeout or a crash after the commit, before it heard back.
                _ => None,
            }
        } else {
            None
        };
        if let Some(what) = wrong {
            self.violated(&mut state, what);
        }
        // Saved as its own before its runner was built: kept, as far as its runner knows.
        if let Some(from) = from {
            state.checkpoints.insert(id.clone(), from);
        }
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
    pub(super) db: Arc<FaultyStateDb>,
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

    pub(super) fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

/// What is wrong, if anything, with running alloc `alloc_id` at `now`: it runs past its kill
/// timeout since its node process received its stop.
fn overran(state: &LedgerState, alloc_id: &str, now: Instant) -> Option<String> {
    let running = state.running.get(alloc_id)?;
    let key = (running.process.name.clone(), alloc_id.to_string());
    let since = now.duration_since(*state.stops_received.get(&key)?);
    (since > running.kill_timeout).then(|| {
        format!(
            "alloc {alloc_id} still runs on {} {} ms after it received its stop, past its \
             kill timeout of {} ms",
            running.process.name,
            since.as_millis(),
            running.kill_timeout.as_millis()
        )
    })
}

/// The wire of one node process as its client sees it, telling the ledger of every stop
/// the client receives; what it forwards, it does not change.
pub(super) struct Observed {
    inner: Arc<dyn ServerApi>,
    process: Arc<Process>,
    ledger: Arc<Ledger>,
}

impl Observed {
    pub(super) fn new(
        inner: Arc<dyn ServerApi>,
        process: Arc<Process>,
        ledger: Arc<Ledger>,
    ) -> Arc<Observed> {
        Arc::new(Observed {
            inner,
            process,
            ledger,
        })
    }
}

#[async_trait::async_trait]
impl ServerApi for Observed {
    async fn register_node(&self, node_id: &str, info: &NodeInfo) -> Result<(), ServerError> {
        self.inner.register_node(node_id, info).await
    }

    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError> {
        self.inner.watch_allocs(node_id, min_index, wait).await
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        let allocs = self.inner.get_allocs(ids).await?;
        if self.process.alive() {
            for alloc in allocs.iter().filter(|a| a.desired_status.is_stop()) {
                self.ledger.stop_received(&self.process, &alloc.id);
            }
        }
        Ok(allocs)
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        self.inner.update_allocs(updates).await
    }
}
