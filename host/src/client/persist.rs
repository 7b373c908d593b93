//! Saving the client's allocs, their state and their checkpoints to the [`StateDb`].
//!
//! Invariants, each for the reason given:
//! - An alloc is saved before its runner is built ([`Persister::save_allocs`] waits for the
//!   commit), so a crash between the two cannot lose it.
//! - State reports are written behind, latest wins, many allocs per commit: a busy node would
//!   otherwise pay one disk sync per report. The server hears a state only after it is on
//!   disk (the `on_saved` hook runs after the commit, for allocs still known then), so a
//!   restart never finds the server ahead of the client: a finished alloc the server saw
//!   finished is finished on disk too.
//! - A report identical to the last one saved is skipped.
//! - A checkpoint is acknowledged to the guest only once committed, or refused with the reason.
//! - Saving checks, under the queue's lock, that the alloc is known and not collected; marking
//!   collected and deleting take the same lock and drop what is queued for the alloc, so a
//!   late save can never bring a collected alloc back.
//! - A failed commit keeps its writes (unless newer ones replaced them, or its alloc was
//!   deleted meanwhile, or collected: then its acknowledged state and checkpoint go) and
//!   retries with backoff; the waiters of that commit are told their write is not saved yet.
//!   (Waiters queued during the backoff wait for the retry.)
//!
//! Commits run on the persister's own task, one at a time. A store may ask for each commit
//! to take a while on tokio's clock ([`StateDb::commit_delay`]: a simulated slow disk); the
//! batch is in flight meanwhile, and what is asked queues for the next commit. Within a
//! commit, alloc records, collection marks and deletes keep the order they were asked in,
//! and come before states, acknowledgements and checkpoints (which saving and deleting keep
//! consistent with them).
//!
//! What this may not touch: runners, the server, the alloc map; it hears states and hands
//! them back through `on_saved` only.

use super::metrics::Metrics;
use crate::model::structs::{Alloc, AllocState};
use crate::state::{StateDb, StateError, Write, call_store};
use crate::util::determinism::HashMap;
use crate::util::locks::LockUnpoisoned;
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, oneshot};

/// Receives each state once it is on disk (the copy that was saved, shared).
pub type OnSaved = Box<dyn Fn(&str, &Arc<AllocState>) + Send + Sync>;

/// The client's write path to the state store.
pub struct Persister {
    db: Arc<dyn StateDb>,
    queue: Mutex<Queue>,
    wake: Notify,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Queue {
    /// Allocs the store holds (or will, once queued writes commit).
    known: HashMap<String, Known>,
    /// Alloc records and collection marks, in the order asked.
    structural: Vec<Write>,
    states: HashMap<String, Arc<AllocState>>,
    acked: HashMap<String, Arc<AllocState>>,
    checkpoints: HashMap<String, Vec<u8>>,
    /// Told the outcome of the next commit.
    waiters: Vec<oneshot::Sender<Result<(), String>>>,
}

struct Known {
    collected: bool,
    /// The last state queued or saved, to skip identical reports.
    last_state: Option<Arc<AllocState>>,
}

impl Persister {
    /// A persister writing to `db`. Nothing is written until [`Persister::run`] runs.
    pub fn new(db: Arc<dyn StateDb>, metrics: Arc<Metrics>) -> Self {
        Persister {
            db,
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            metrics,
        }
    }

    /// The store written to.
    pub fn db(&self) -> &Arc<dyn StateDb> {
        &self.db
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock_unpoisoned()
    }

    /// Records an alloc found in the store at restore, with its saved state.
    pub fn restored(&self, alloc_id: &str, last_state: Option<AllocState>, collected: bool) {
        self.lock().known.insert(
            alloc_id.to_string(),
            Known {
                collected,
                last_state: last_state.map(Arc::new),
            },
        );
    }

    /// Saves new allocs; resolves once they are on disk (or the commit failed).
    pub async fn save_allocs(&self, allocs: &[Arc<Alloc>]) -> Result<(), String> {
        let done = {
            let mut queue = self.lock();
            for alloc in allocs {
                queue.known.entry(alloc.id.clone()).or_insert(Known {
                    collected: false,
                    last_state: None,
                });
                queue.structural.push(Write::PutAlloc(alloc.clone()));
            }
            queue.waiter()
        };
        self.wake.notify_one();
        done.await
            .unwrap_or_else(|_| Err("the client is stopping".into()))
    }

    /// Saves a new version of a known alloc, behind.
    pub fn save_alloc_update(&self, alloc: Arc<Alloc>) {
        {
            let mut queue = self.lock();
            if queue.known.get(&alloc.id).is_none_or(|k| k.collected) {
                return;
            }
            queue.structural.push(Write::PutAlloc(alloc));
        }
        self.wake.notify_one();
    }

    /// Saves a reported state, behind; `on_saved` hears it after the commit. Returns false
    /// when the store does not know the alloc (its runner was never built, or it was
    /// deleted), so the caller passes the state on itself. A collected alloc's report is
    /// dropped.
    pub fn save_state(&self, alloc_id: &str, state: &AllocState) -> bool {
        {
            let mut queue = self.lock();
            let Some(known) = queue.known.get_mut(alloc_id) else {
                return false;
            };
            if known.collected || known.last_state.as_deref() == Some(state) {
                return true;
            }
            // One copy, shared by the queue and the last-saved record.
            let state = Arc::new(state.clone());
            known.last_state = Some(state.clone());
            queue.states.insert(alloc_id.to_string(), state);
        }
        self.wake.notify_one();
        true
    }

    /// Saves the state the server acknowledged, behind.
    pub fn save_acked(&self, alloc_id: &str, state: Arc<AllocState>) {
        {
            let mut queue = self.lock();
            if queue.known.get(alloc_id).is_none_or(|k| k.collected) {
                return;
            }
            queue.acked.insert(alloc_id.to_string(), state);
        }
        self.wake.notify_one();
    }

    /// Saves a checkpoint; resolves once it is on disk, or with why it is not.
    pub fn save_checkpoint(
        self: &Arc<Self>,
        alloc_id: &str,
        data: &[u8],
    ) -> impl Future<Output = Result<(), String>> + Send + 'static {
        let done = {
            let mut queue = self.lock();
            match queue.known.get(alloc_id) {
                Some(known) if !known.collected => {
                    queue
                        .checkpoints
                        .insert(alloc_id.to_string(), data.to_vec());
                    Ok(queue.waiter())
                }
                _ => Err(format!(
                    "alloc {alloc_id} is not kept by the client any more"
                )),
            }
        };
        self.wake.notify_one();
        async move {
            done?
                .await
                .unwrap_or_else(|_| Err("the client is stopping".into()))
        }
    }

    /// The alloc was collected: its checkpoint goes, later saves are dropped, and its final
    /// state stays until [`Persister::delete`].
    pub fn mark_collected(&self, alloc_id: &str) {
        {
            let mut queue = self.lock();
            let Some(known) = queue.known.get_mut(alloc_id) else {
                return;
            };
            known.collected = true;
            queue.checkpoints.remove(alloc_id);
            queue.acked.remove(alloc_id);
            queue
                .structural
                .push(Write::MarkCollected(alloc_id.to_string()));
        }
        self.wake.notify_one();
    }

    /// Deletes every record of an alloc the server dropped, and forgets it.
    pub fn delete(&self, alloc_id: &str) {
        {
            let mut queue = self.lock();
            queue.known.remove(alloc_id);
            queue.states.remove(alloc_id);
            queue.acked.remove(alloc_id);
            queue.checkpoints.remove(alloc_id);
            queue.structural.retain(|write| match write {
                Write::PutAlloc(alloc) => alloc.id != alloc_id,
                Write::MarkCollected(id) => id != alloc_id,
                _ => true,
            });
            queue
                .structural
                .push(Write::DeleteAlloc(alloc_id.to_string()));
        }
        self.wake.notify_one();
    }

    /// Resolves once everything queued before the call is on disk (or failed to be).
    pub async fn flush(&self) -> Result<(), String> {
        let done = self.lock().waiter();
        self.wake.notify_one();
        done.await
            .unwrap_or_else(|_| Err("the client is stopping".into()))
    }

    /// The commit loop. Runs until its task is dropped.
    pub async fn run(self: Arc<Self>, on_saved: OnSaved) {
        let mut failures = 0u32;
        loop {
            self.wake.notified().await;
            match self.commit_once(&on_saved).await {
                Ok(()) => failures = 0,
                Err(error) => {
                    failures += 1;
                    let wait = super::sync::backoff(failures);
                    tracing::error!(error = %error, retry_in_ms = wait.as_millis() as u64, "cannot save client state");
                    tokio::time::sleep(wait).await;
                    self.wake.notify_one();
                }
            }
        }
    }

    /// Commits everything queued in one batch.
    async fn commit_once(&self, on_saved: &OnSaved) -> Result<(), StateError> {
        let (batch, states, waiters) = {
            let mut queue = self.lock();
            let structural = std::mem::take(&mut queue.structural);
            let states = std::mem::take(&mut queue.states);
            let acked = std::mem::take(&mut queue.acked);
            let checkpoints = std::mem::take(&mut queue.checkpoints);
            let waiters = std::mem::take(&mut queue.waiters);
            (
                Batch {
                    structural,
                    acked,
                    checkpoints,
                },
                states,
                waiters,
            )
        };
        if batch.is_empty() && states.is_empty() {
            for waiter in waiters {
                let _ = waiter.send(Ok(()));
            }
            return Ok(());
        }
        let delay = self.db.commit_delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let writes = batch.writes(&states);
        let count = writes.len();
        // A store that panics must not take the loop (and every waiter) down with it.
        let result = call_store(self.db.as_ref(), || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.db.apply(writes)))
                .unwrap_or_else(|_| Err(StateError::Io("the state store panicked".into())))
        });
        match &result {
            Ok(()) => {
                self.metrics.state_batch_saved(count as u64);
                for waiter in waiters {
                    let _ = waiter.send(Ok(()));
                }
                // An alloc deleted while the batch was in flight is not reported: the
                // client forgot it, and its server dropped it.
                let still_known: Vec<_> = {
                    let queue = self.lock();
                    let known = |id: &String| queue.known.contains_key(id);
                    states.iter().filter(|(id, _)| known(id)).collect()
                };
                for (alloc_id, state) in still_known {
                    on_saved(alloc_id, state);
                }
            }
            Err(error) => {
                for waiter in waiters {
                    let _ = waiter.send(Err(format!("not saved: {error}")));
                }
                self.requeue(batch, states);
            }
        }
        result
    }

    /// Puts a failed batch back, behind anything newer queued since.
    fn requeue(&self, batch: Batch, states: HashMap<String, Arc<AllocState>>) {
        let mut queue = self.lock();
        let still_known = |queue: &Queue, id: &str| queue.known.contains_key(id);
        // Collected while the batch was in flight: its acknowledged state and checkpoint are
        // not to come back after the mark (its final state stays, as `mark_collected` keeps).
        let still_kept =
            |queue: &Queue, id: &str| queue.known.get(id).is_some_and(|k| !k.collected);
        let mut structural: Vec<Write> = batch
            .structural
            .into_iter()
            .filter(|write| match write {
                Write::PutAlloc(alloc) => still_known(&queue, &alloc.id),
                _ => true,
            })
            .collect();
        structural.append(&mut queue.structural);
        queue.structural = structural;
        for (id, state) in states {
            if still_known(&queue, &id) && !queue.states.contains_key(&id) {
                queue.states.insert(id, state);
            }
        }
        for (id, state) in batch.acked {
            if still_kept(&queue, &id) && !queue.acked.contains_key(&id) {
                queue.acked.insert(id, state);
            }
        }
        for (id, data) in batch.checkpoints {
            if still_kept(&queue, &id) && !queue.checkpoints.contains_key(&id) {
                queue.checkpoints.insert(id, data);
            }
        }
    }
}

impl Queue {
    fn waiter(&mut self) -> oneshot::Receiver<Result<(), String>> {
        let (sender, receiver) = oneshot::channel();
        self.waiters.push(sender);
        receiver
    }
}

/// One commit's writes, apart from the states (kept to tell `on_saved`).
struct Batch {
    structural: Vec<Write>,
    acked: HashMap<String, Arc<AllocState>>,
    checkpoints: HashMap<String, Vec<u8>>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.structural.is_empty() && self.acked.is_empty() && self.checkpoints.is_empty()
    }

    /// Records, marks and deletes in the order asked, then states, acknowledgements and
    /// checkpoints. That order is right because deleting an alloc drops what is queued for
    /// it (so anything after a delete belongs to a later re-add), and marking it collected
    /// drops its queued checkpoint and keeps its final state.
    fn writes(&self, states: &HashMap<String, Arc<AllocState>>) -> Vec<Write> {
        let mut writes: Vec<Write> = self.structural.clone();
        writes.extend(states.iter().map(|(id, state)| Write::PutAllocState {
            alloc_id: id.clone(),
            state: state.clone(),
        }));
        writes.extend(self.acked.iter().map(|(id, state)| Write::PutAckedState {
            alloc_id: id.clone(),
            state: state.clone(),
        }));
        writes.extend(
            self.checkpoints
                .iter()
                .map(|(id, data)| Write::PutCheckpoint {
                    alloc_id: id.clone(),
                    data: data.clone(),
                }),
        );
        writes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{FaultyStateDb, MemoryStateDb};
    use std::time::Duration;

    /// Found in review, once a commit could be slow: an alloc collected while a commit
    /// holding its checkpoint was in flight, a commit that then failed, got that checkpoint
    /// back with the retry, after its collection mark.
    #[tokio::test(start_paused = true)]
    async fn a_checkpoint_whose_commit_failed_does_not_come_back_after_a_collection() {
        let disk = Arc::new(FaultyStateDb::new(Arc::new(MemoryStateDb::new())));
        let persister = Arc::new(Persister::new(disk.clone(), Arc::default()));
        let committing = tokio::spawn(persister.clone().run(Box::new(|_, _| {})));
        let alloc = Arc::new(Alloc::new("a1", "job", "r.wasm", vec![]));
        persister.save_allocs(&[alloc]).await.unwrap();

        disk.slow_commits(Duration::from_secs(1));
        disk.fail_writes(true);
        let saved = persister.save_checkpoint("a1", b"count=7");
        tokio::time::sleep(Duration::from_millis(500)).await;
        persister.mark_collected("a1");
        assert!(saved.await.is_err(), "the failed commit was acknowledged");
        disk.fail_writes(false);
        disk.slow_commits(Duration::ZERO);
        persister.flush().await.unwrap();

        let saved = disk.client_allocs().unwrap();
        let record = saved.iter().find(|r| r.alloc_id == "a1").unwrap();
        assert!(record.collected);
        assert_eq!(
            record.checkpoint, None,
            "a checkpoint came back after the collection mark"
        );
        committing.abort();
    }
}
