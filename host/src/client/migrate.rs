//! Allocs moving between nodes with their guest's state, as a node drain moves them (Nomad
//! moves an alloc dir's files with `ephemeral_disk { migrate = true }`; here the runner's
//! own checkpoint moves).
//!
//! Two ends, each on the node where it happens:
//! - **Leaving.** An alloc the server evicts (desired status `evict`) is shut down rather
//!   than killed: its runner saves a checkpoint and stops, and the client reports it
//!   complete. From then on [`Client::migration_checkpoint`] serves that checkpoint to the
//!   node of the alloc that replaces it (the agent's HTTP API carries it there). The alloc
//!   is not collected (which would delete the checkpoint) until it was served once, or for
//!   at most ten minutes; a restart of the node holds it again, for as long, since the
//!   hold is kept in memory only.
//! - **Arriving.** An alloc with a [`PreviousAlloc`] fetches that alloc's checkpoint through
//!   the client's [`CheckpointSource`], saves it as its own, and starts its runner from it
//!   (`restored`). While the previous alloc is still shutting down it waits; when the
//!   checkpoint cannot be had (its node is gone, no source is set, the wait ran out) the
//!   alloc starts without one and says why in a WARN. What the server sends of it meanwhile
//!   (its runner built, or not) is kept, and reaches its runner before the runner starts:
//!   stopped, it stops waiting and never runs; evicted in turn, it never runs either, and
//!   hands on the checkpoint it fetched as an evicted alloc hands on its own (asked for it
//!   before then, it answers "not final yet"); dropped, it is never run, nor kept.
//!
//! It knows the client's runners and store, not how a checkpoint crosses the network: that
//! is the source's.

use super::{Client, ClientInner};
use crate::allocrunner::AllocRunner;
use crate::model::structs::{Alloc, AllocState, ClientStatus, DesiredStatus, PreviousAlloc};
use crate::util::locks::LockUnpoisoned;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// Fetches the checkpoint of alloc `alloc_id` from the agent of node `node_id`.
pub type CheckpointSource = Arc<
    dyn Fn(PreviousAlloc) -> BoxFuture<'static, Result<Option<Vec<u8>>, CheckpointFetch>>
        + Send
        + Sync,
>;

/// Why a checkpoint was not fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointFetch {
    /// The previous alloc is still shutting down, or its node did not answer: ask again.
    #[error("not yet: {0}")]
    NotYet(String),
    /// It will never be had (its node is down, or does not know the alloc).
    #[error("{0}")]
    Gone(String),
}

/// Why [`Client::migration_checkpoint`] has no checkpoint to give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointUnavailable {
    /// This client does not hold the alloc.
    #[error("allocation {0:?} is not on this node")]
    Unknown(String),
    /// The alloc still runs, is still shutting down, or is still arriving here itself: its
    /// checkpoint is not final.
    #[error("allocation {0:?} is still running; its checkpoint is not final yet")]
    NotFinal(String),
    /// The store could not be read.
    #[error("cannot read the checkpoint of allocation {0:?}: {1}")]
    Store(String, String),
}

/// How long an arriving alloc waits for its previous alloc's checkpoint: past its kill
/// timeout (the most a shutdown takes) with room for a slow network.
const FETCH_PATIENCE: Duration = Duration::from_secs(60);

/// How long a moved alloc is kept from collection for its replacement to fetch its
/// checkpoint, at most: past the replacement's own patience.
const HOLD_FOR_REPLACEMENT: Duration = Duration::from_secs(600);

/// Where an alloc leaving this node stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Leaving {
    /// Its runner has stopped: the checkpoint is final.
    stopped: bool,
    /// Its checkpoint was served, or the hold ran out: it may be collected.
    released: bool,
}
/// Between two asks.
const FETCH_EVERY: Duration = Duration::from_millis(250);

impl Client {
    /// The client fetches the checkpoints of allocs moved here from other nodes through
    /// `source`. Without one, such an alloc starts afresh.
    pub fn fetch_checkpoints_from(&self, source: CheckpointSource) {
        *self.inner.checkpoint_source.lock_unpoisoned() = Some(source);
    }

    /// The final checkpoint of an alloc this node shut down to move it (`None` when its
    /// runner saved none). Refused while the alloc still runs, or is still arriving here
    /// itself (fetching its own predecessor's), so the node it moves to never starts from a
    /// checkpoint older than the last.
    pub async fn migration_checkpoint(
        &self,
        alloc_id: &str,
    ) -> Result<Option<Vec<u8>>, CheckpointUnavailable> {
        let not_final = || Err(CheckpointUnavailable::NotFinal(alloc_id.to_string()));
        if self.inner.arriving_version(alloc_id).is_some() {
            return not_final();
        }
        let leaving = self.inner.moved_lock().get(alloc_id).copied();
        // Out of the map's lock before it is asked anything (runners are never called with
        // the map locked).
        let runner = self.inner.runners_lock().get(alloc_id).cloned();
        let status = match runner {
            Some(_) if leaving.is_some_and(|l| l.stopped) => ClientStatus::Complete,
            Some(_) if leaving.is_some() => ClientStatus::Running,
            Some(runner) => runner.client_status(),
            None => match self.inner.runnerless_lock().get(alloc_id) {
                Some((_, state)) => state.client_status,
                // Held for its replacement, its runner still being put in the map.
                None if leaving.is_some() => return not_final(),
                None => return Err(CheckpointUnavailable::Unknown(alloc_id.to_string())),
            },
        };
        if !status.is_terminal() {
            return not_final();
        }
        let db = self.inner.persister.db();
        let checkpoint =
            crate::state::call_store(db.as_ref(), || db.client_checkpoint(alloc_id))
                .map_err(|e| CheckpointUnavailable::Store(alloc_id.to_string(), e.to_string()))?;
        self.inner.release(alloc_id);
        Ok(checkpoint)
    }
}

impl ClientInner {
    /// Shuts down the runner of an evicted alloc so that it saves a checkpoint, then
    /// reports the alloc complete. False when the alloc has no running runner (the caller
    /// passes the update on as any other).
    pub(super) fn evict(self: &Arc<Self>, alloc: &Arc<Alloc>) -> bool {
        let Some(runner) = self.runners_lock().get(&alloc.id).cloned() else {
            return false;
        };
        if runner.client_status().is_terminal() {
            return false;
        }
        {
            let mut moved = self.moved_lock();
            if moved.contains_key(&alloc.id) {
                return false;
            }
            moved.insert(alloc.id.clone(), Leaving::default());
        }
        tracing::info!(alloc_id = %alloc.id, "moving the allocation to another node: shutting it down with a checkpoint");
        runner.shutdown();
        let client = Arc::downgrade(self);
        let client_after_hold = client.clone();
        let alloc_id = alloc.id.clone();
        tokio::spawn(async move {
            runner.shutdown_done().wait().await;
            let Some(client) = client.upgrade() else {
                return;
            };
            if let Some(leaving) = client.moved_lock().get_mut(&alloc_id) {
                leaving.stopped = true;
            }
            let ended = AllocState {
                client_status: ClientStatus::Complete,
                description: "moved to another node: shut down with a checkpoint for the \
                              alloc that replaces it"
                    .into(),
                task_states: runner.alloc_state().task_states,
            };
            client.report_state(&alloc_id, &ended);
            drop((client, runner));
            tokio::time::sleep(HOLD_FOR_REPLACEMENT).await;
            if let Some(client) = client_after_hold.upgrade() {
                client.release(&alloc_id);
            }
        });
        true
    }

    /// Starts `alloc`, moved here from a drained node, on a task of its own once its
    /// predecessor's checkpoint is here (see the module docs). Nothing when it is arriving
    /// already, or has its runner: until then each watch answer names it as new.
    pub(super) fn arrive(self: &Arc<Self>, alloc: &Arc<Alloc>, previous: &PreviousAlloc) {
        {
            // Both locks at once (in `apply`'s order): a runner that starts between two
            // separate looks would get a second.
            let runners = self.runners_lock();
            let mut arriving = self.arriving.lock_unpoisoned();
            if runners.contains_key(&alloc.id) || arriving.contains_key(&alloc.id) {
                return;
            }
            arriving.insert(alloc.id.clone(), alloc.clone());
        }
        let (client, alloc, previous) = (self.clone(), alloc.clone(), previous.clone());
        let task = tokio::spawn(async move {
            let checkpoint = client.arriving_checkpoint(&alloc, &previous).await;
            // Built as the newest version the server sent says; one evicted in turn holds
            // the checkpoint for its own replacement. One dropped meanwhile is not built.
            let Some(newest) = client.arriving_version(&alloc.id) else {
                return;
            };
            if newest.desired_status == DesiredStatus::Evict {
                client.hold_for_replacement(&newest.id);
            }
            let mut config = client.runner_config(&newest, None);
            config.restored = checkpoint;
            let Some(built) = client.build_runners(vec![config]).recv().await else {
                return; // the runtime is shutting down
            };
            match built.runner {
                Ok(runner) => client.adopt_arriving(&newest.id, runner),
                Err(error) => {
                    if client
                        .arriving
                        .lock_unpoisoned()
                        .remove(&newest.id)
                        .is_some()
                    {
                        client.fail_alloc(built.alloc, &built.span, format!("{error:#}"));
                    }
                }
            }
        });
        let mut tasks = self.tasks.lock_unpoisoned();
        tasks.retain(|task| !task.is_finished());
        tasks.push(task.abort_handle());
    }

    /// Puts the built runner of an arriving alloc in the map and takes the alloc out of
    /// `arriving` in one step, unless the server dropped it meanwhile or the client is
    /// stopping (then the runner is let go, never started). A version the server sent while
    /// it was built reaches it before it starts.
    fn adopt_arriving(self: &Arc<Self>, alloc_id: &str, runner: Arc<dyn AllocRunner>) {
        let last = {
            let mut runners = self.runners_lock();
            let mut arriving = self.arriving.lock_unpoisoned();
            let Some(last) = arriving.remove(alloc_id) else {
                return;
            };
            if !self.put_in_map(&mut runners, alloc_id, &runner) {
                return;
            }
            last
        };
        if last.modify_index > runner.alloc().modify_index {
            self.update_alloc(last);
        }
        self.begin(alloc_id, runner);
    }

    /// The newest version the server sent of an alloc moved here whose runner is not in
    /// the map yet.
    pub(super) fn arriving_version(&self, alloc_id: &str) -> Option<Arc<Alloc>> {
        self.arriving.lock_unpoisoned().get(alloc_id).cloned()
    }

    /// An evicted alloc whose runner will not run: one moved here and evicted in turn before
    /// its runner started (its new node drained too), or one restored after a restart of
    /// this node (the hold of its checkpoint is in memory only). Its checkpoint (for the
    /// first, its predecessor's, saved as its own) is final: it is served to the alloc's
    /// replacement and held from collection as a shut-down evicted alloc's is. Called
    /// before its runner is built or started.
    pub(super) fn hold_for_replacement(self: &Arc<Self>, alloc_id: &str) {
        let leaving = Leaving {
            stopped: true,
            released: false,
        };
        self.moved_lock().insert(alloc_id.to_string(), leaving);
        tracing::info!(
            alloc_id,
            "holding the checkpoint of an allocation moving to another node for its replacement"
        );
        let (client, alloc_id) = (Arc::downgrade(self), alloc_id.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(HOLD_FOR_REPLACEMENT).await;
            if let Some(client) = client.upgrade() {
                client.release(&alloc_id);
            }
        });
    }

    /// Whether a terminal alloc is kept from collection for its replacement (see
    /// [`Leaving`]).
    pub(super) fn holds_for_its_replacement(&self, alloc_id: &str) -> bool {
        self.moved_lock().get(alloc_id).is_some_and(|l| !l.released)
    }

    /// A moved alloc's checkpoint was served, or its hold ran out: it is collected as any
    /// terminal alloc from now on.
    fn release(&self, alloc_id: &str) {
        {
            let mut moved = self.moved_lock();
            match moved.get_mut(alloc_id) {
                Some(leaving) if leaving.stopped && !leaving.released => leaving.released = true,
                _ => return,
            }
        }
        let runner = self.runners_lock().get(alloc_id).cloned();
        if let Some(runner) = runner {
            self.gc.mark_for_collection(alloc_id, runner);
            self.gc.trigger();
        }
    }

    /// The checkpoint an alloc moved here starts from: its previous alloc's, fetched and
    /// saved as its own, or `None` (see the module docs).
    pub(super) async fn arriving_checkpoint(
        self: &Arc<Self>,
        alloc: &Alloc,
        previous: &PreviousAlloc,
    ) -> Option<Vec<u8>> {
        let source = self.checkpoint_source.lock_unpoisoned().clone();
        let warn = |why: &str| {
            tracing::warn!(
                alloc_id = %alloc.id,
                previous_alloc = %previous.alloc_id,
                previous_node = %previous.node_id,
                why,
                "starting without the checkpoint of the allocation this one replaces"
            );
        };
        let Some(source) = source else {
            warn("this node cannot fetch checkpoints from other nodes");
            return None;
        };
        let deadline = tokio::time::Instant::now() + FETCH_PATIENCE;
        let checkpoint = loop {
            // Stopped or dropped meanwhile, it will not run: no need of a checkpoint. (One
            // evicted in turn still fetches it, to hand it on.)
            let newest = self.arriving_version(&alloc.id);
            if newest.is_none_or(|newest| newest.desired_status == DesiredStatus::Stop) {
                tracing::info!(alloc_id = %alloc.id, "stopped while its checkpoint was fetched: it will not run");
                return None;
            }
            match source(previous.clone()).await {
                Ok(checkpoint) => break checkpoint,
                Err(CheckpointFetch::Gone(why)) => {
                    warn(&why);
                    return None;
                }
                Err(CheckpointFetch::NotYet(why)) if tokio::time::Instant::now() >= deadline => {
                    warn(&format!("gave up waiting: {why}"));
                    return None;
                }
                Err(CheckpointFetch::NotYet(_)) => tokio::time::sleep(FETCH_EVERY).await,
            }
        };
        let checkpoint = checkpoint?;
        // Its own from now: a restart of this node before its first checkpoint resumes
        // from it too.
        if let Err(why) = self.persister.save_checkpoint(&alloc.id, &checkpoint).await {
            warn(&format!("cannot keep it: {why}"));
            return None;
        }
        tracing::info!(
            alloc_id = %alloc.id,
            previous_alloc = %previous.alloc_id,
            bytes = checkpoint.len(),
            "starting from the checkpoint of the allocation this one replaces"
        );
        Some(checkpoint)
    }
}
