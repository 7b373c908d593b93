//! Alloc sync: runner state reports, batched to the server.
//!
//! Invariants, each paid for by the Nomad client:
//! - Latest wins: reports wait in a map keyed by alloc id, so a burst of reports for one
//!   alloc sends one update.
//! - Urgent updates (the client status changed from what the server acknowledged) go at
//!   once; typical ones (description, task states) ride along or go every
//!   [`TYPICAL_EVERY_TICKS`] ticks; unchanged ones not at all. This keeps a busy node from
//!   flooding the server while status changes still travel fast.
//! - A failed send keeps its updates (unless newer ones arrived) and retries with exponential
//!   backoff and jitter, so a recovering server is not stampeded.
//! - Nothing is sent before the first successful contact with the server.
//!
//! This module knows the server seam and the plain state types only.

use super::metrics::Metrics;
use crate::model::structs::AllocState;
use crate::rpc::{AllocUpdate, ServerApi};
use crate::util::backoff::Backoff;
use crate::util::determinism::{HashMap, HashSet};
use crate::util::locks::LockUnpoisoned;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// How often pending updates are looked at.
pub const SYNC_TICK: Duration = Duration::from_millis(200);
/// Typical updates are sent at least this many ticks apart.
pub const TYPICAL_EVERY_TICKS: u64 = 5;
/// The longest wait between retries of a failed send.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Pending updates and what the server last acknowledged.
pub struct AllocSync {
    state: Mutex<SyncState>,
    urgent: Notify,
    contacted: AtomicBool,
    metrics: Arc<Metrics>,
    on_acked: OnAcked,
}

/// Hears each state the server acknowledged, so it can be saved (the copy sync keeps as
/// acknowledged, shared).
pub type OnAcked = Box<dyn Fn(&str, &Arc<AllocState>) + Send + Sync>;

#[derive(Default)]
struct SyncState {
    pending: HashMap<String, Arc<AllocState>>,
    acknowledged: HashMap<String, Arc<AllocState>>,
}

impl AllocSync {
    /// An empty sync that sends nothing until [`AllocSync::contacted`]; `on_acked` hears
    /// every state the server takes.
    pub fn new(metrics: Arc<Metrics>, on_acked: OnAcked) -> Self {
        AllocSync {
            state: Mutex::new(SyncState::default()),
            urgent: Notify::new(),
            contacted: AtomicBool::new(false),
            metrics,
            on_acked,
        }
    }

    /// Records what the server acknowledged before a restart, so it is not sent again.
    pub fn restore_acknowledged(&self, alloc_id: &str, state: AllocState) {
        self.lock()
            .acknowledged
            .insert(alloc_id.to_string(), Arc::new(state));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.state.lock_unpoisoned()
    }

    /// Queues `state` for `alloc_id`, replacing any pending one; wakes the sender when the
    /// client status differs from what the server acknowledged.
    pub fn put(&self, alloc_id: &str, state: impl Into<Arc<AllocState>>) {
        let state = state.into();
        let urgent = {
            let mut sync = self.lock();
            let urgent = sync
                .acknowledged
                .get(alloc_id)
                .is_none_or(|acked| acked.client_status != state.client_status);
            sync.pending.insert(alloc_id.to_string(), state);
            urgent
        };
        if urgent {
            self.urgent.notify_one();
        }
    }

    /// Forgets an alloc the server dropped: nothing more is sent for it.
    pub fn forget(&self, alloc_id: &str) {
        let mut sync = self.lock();
        sync.pending.remove(alloc_id);
        sync.acknowledged.remove(alloc_id);
    }

    /// Records the first successful contact with the server; sending may start.
    pub fn contacted(&self) {
        if !self.contacted.swap(true, Ordering::SeqCst) {
            self.urgent.notify_one();
        }
    }

    /// How many updates wait to be sent.
    pub fn pending_count(&self) -> usize {
        self.lock().pending.len()
    }

    /// Takes the updates due now: none unless one is urgent or `typical_due`; then all that
    /// differ from what the server acknowledged. Unchanged ones are dropped.
    fn due(&self, typical_due: bool) -> Vec<AllocUpdate> {
        let mut sync = self.lock();
        let SyncState {
            pending,
            acknowledged,
        } = &mut *sync;
        pending.retain(|id, state| acknowledged.get(id) != Some(state));
        let urgent = pending.iter().any(|(id, state)| {
            acknowledged
                .get(id)
                .is_none_or(|a| a.client_status != state.client_status)
        });
        if !urgent && !typical_due {
            return Vec::new();
        }
        pending
            .iter()
            .map(|(id, state)| AllocUpdate {
                alloc_id: id.clone(),
                state: Arc::clone(state),
            })
            .collect()
    }

    /// The server took `sent`; drops each pending update that is still the one sent.
    fn acknowledge(&self, sent: Vec<AllocUpdate>, accepted: &[String]) {
        // A set: a busy node sends thousands at once, and a scan per update was quadratic.
        let accepted: HashSet<&str> = accepted.iter().map(String::as_str).collect();
        let mut taken = Vec::new();
        {
            let mut sync = self.lock();
            for AllocUpdate { alloc_id, state } in sent {
                if sync.pending.get(&alloc_id) == Some(&state) {
                    sync.pending.remove(&alloc_id);
                }
                if accepted.contains(alloc_id.as_str()) {
                    // The one copy, kept as acknowledged and handed to be saved.
                    sync.acknowledged.insert(alloc_id.clone(), state.clone());
                    taken.push((alloc_id, state));
                }
            }
        }
        for (alloc_id, state) in taken {
            (self.on_acked)(&alloc_id, &state);
        }
    }

    /// The sending loop. Runs until the task is dropped.
    pub async fn run(self: Arc<Self>, server: Arc<dyn ServerApi>) {
        let mut ticker = tokio::time::interval(SYNC_TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        let mut failures: u32 = 0;
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            // Biased so that a simulation replays (an unbiased select draws from tokio's own
            // random); an urgent wake-up not taken now is still there on the next turn.
            let typical_due = tokio::select! {
                biased;
                _ = ticker.tick() => {
                    ticks += 1;
                    ticks.is_multiple_of(TYPICAL_EVERY_TICKS)
                }
                _ = self.urgent.notified() => false,
            };
            if !self.contacted.load(Ordering::SeqCst) {
                continue;
            }
            if let Some(at) = retry_at {
                if tokio::time::Instant::now() < at {
                    continue;
                }
                // Retrying: send everything pending, urgent or not.
                retry_at = None;
                self.send(&*server, true, &mut failures, &mut retry_at)
                    .await;
                continue;
            }
            self.send(&*server, typical_due, &mut failures, &mut retry_at)
                .await;
        }
    }

    async fn send(
        &self,
        server: &dyn ServerApi,
        typical_due: bool,
        failures: &mut u32,
        retry_at: &mut Option<tokio::time::Instant>,
    ) {
        let batch = self.due(typical_due);
        if batch.is_empty() {
            return;
        }
        match server.update_allocs(&batch).await {
            Ok(accepted) => {
                *failures = 0;
                self.metrics.sync_batch_sent();
                self.acknowledge(batch, &accepted);
            }
            Err(error) => {
                *failures += 1;
                self.metrics.sync_batch_failed();
                let wait = backoff(*failures);
                tracing::warn!(
                    error = %error,
                    updates = batch.len(),
                    retry_in_ms = wait.as_millis() as u64,
                    "error updating allocations"
                );
                *retry_at = Some(tokio::time::Instant::now() + wait);
            }
        }
    }
}

/// The client's wait before retrying a call to the server after `failures` failures in a
/// row: 200 ms doubled per failure up to [`MAX_BACKOFF`], jittered (the agent's one
/// [`Backoff`]), so that many clients do not retry in step.
pub fn backoff(failures: u32) -> Duration {
    const BACKOFF: Backoff = Backoff::new(SYNC_TICK, MAX_BACKOFF);
    BACKOFF.wait(failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::structs::{Alloc, ClientStatus};
    use crate::testing::InMemoryServer;

    fn state(status: ClientStatus, description: &str) -> AllocState {
        AllocState {
            client_status: status,
            description: description.into(),
            task_states: vec![],
        }
    }

    fn server_with(ids: &[&str]) -> Arc<InMemoryServer> {
        let server = InMemoryServer::new();
        for id in ids {
            server.place("node", Alloc::new(*id, "job", "r.wasm", vec![]));
        }
        server
    }

    fn start(server: &Arc<InMemoryServer>) -> Arc<AllocSync> {
        let sync = Arc::new(AllocSync::new(
            Arc::new(Metrics::default()),
            Box::new(|_, _| {}),
        ));
        tokio::spawn(sync.clone().run(server.clone()));
        sync
    }

    #[tokio::test(start_paused = true)]
    async fn sync_sends_only_the_latest_of_a_burst() {
        let server = server_with(&["a"]);
        let sync = start(&server);
        sync.contacted();
        sync.put("a", state(ClientStatus::Pending, "one"));
        sync.put("a", state(ClientStatus::Running, "two"));
        sync.put("a", state(ClientStatus::Running, "three"));
        tokio::time::sleep(SYNC_TICK).await;
        let batches = server.update_batches();
        assert_eq!(batches.len(), 1, "{batches:?}");
        assert_eq!(batches[0].len(), 1);
        assert_eq!(server.client_state("a").unwrap().description, "three");
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_updates_go_at_once_and_typical_ones_within_five_ticks() {
        let server = server_with(&["a"]);
        let sync = start(&server);
        sync.contacted();
        // Half-way between two ticks, a status change: it must not wait for the next tick.
        tokio::time::sleep(SYNC_TICK / 2).await;
        let before = server.update_batches().len();
        sync.put("a", state(ClientStatus::Running, "started"));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            server.update_batches().len(),
            before + 1,
            "a status change is sent at once"
        );

        // Same status, new description: typical, so it waits for the fifth tick.
        sync.put("a", state(ClientStatus::Running, "still running"));
        tokio::time::sleep(SYNC_TICK * 3).await;
        assert_eq!(
            server.update_batches().len(),
            before + 1,
            "a typical update waits"
        );
        tokio::time::sleep(SYNC_TICK * 2).await;
        assert_eq!(
            server.update_batches().len(),
            before + 2,
            "and goes within five ticks"
        );

        // Unchanged from what the server has: never sent.
        sync.put("a", state(ClientStatus::Running, "still running"));
        tokio::time::sleep(SYNC_TICK * 10).await;
        assert_eq!(server.update_batches().len(), before + 2);
        assert_eq!(sync.pending_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_send_keeps_the_updates_and_retries_with_backoff() {
        let server = server_with(&["a"]);
        server.fail_next_updates(2);
        let sync = start(&server);
        sync.contacted();
        sync.put("a", state(ClientStatus::Running, "first"));
        tokio::time::sleep(SYNC_TICK).await;
        assert!(server.client_state("a").is_none(), "the first send failed");
        assert_eq!(sync.pending_count(), 1, "the update is kept");
        // A newer report arrives while the sender backs off: it replaces the failed one.
        sync.put("a", state(ClientStatus::Complete, "newer"));
        tokio::time::sleep(backoff(1) + backoff(2) + SYNC_TICK * 2 + MAX_BACKOFF / 4).await;
        assert_eq!(server.client_state("a").unwrap().description, "newer");
        assert_eq!(
            server.update_batches().len(),
            1,
            "only the successful batch is recorded"
        );
        assert_eq!(sync.pending_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_sent_before_first_contact_with_the_server() {
        let server = server_with(&["a"]);
        let sync = start(&server);
        sync.put("a", state(ClientStatus::Running, "early"));
        tokio::time::sleep(SYNC_TICK * 20).await;
        assert!(server.update_batches().is_empty());
        sync.contacted();
        tokio::time::sleep(SYNC_TICK).await;
        assert_eq!(server.client_state("a").unwrap().description, "early");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_bounded_jitter() {
        assert!(backoff(1) >= SYNC_TICK && backoff(1) <= SYNC_TICK * 5 / 4);
        assert!(backoff(3) >= SYNC_TICK * 4);
        assert!(backoff(40) <= MAX_BACKOFF * 5 / 4);
    }
}
