//! In-place restarts of a crashed runner (see [`crate::restart`]): the alloc's tracker, and
//! the last checkpoint the next run starts from. Only an alloc with a restart policy keeps a
//! copy of its checkpoint in memory; the others hand their restored one to their one run.
//!
//! The alloc's limits hold across its runs: its CPU budget and its wall time are its own, not
//! each run's (the store's meter starts from what earlier runs used, and the wall-time
//! deadline is set once), and a crash because either ran out is final.

use super::Shared;
use crate::allocrunner::{CheckpointSaved, StateUpdater};
use crate::locks::LockUnpoisoned;
use crate::restart::{RestartDecision, RestartPolicy, RestartTracker};
use crate::runtime::bindings::Event;
use crate::runtime::outcome::RunOutcome;
use crate::structs::AllocState;
use crate::units::format_duration;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// One alloc's restarts: `None` inside when it has no restart policy.
pub(super) struct Restarts {
    tracking: Option<Tracking>,
    /// The checkpoint the first run starts from, for an alloc without a policy: taken by it.
    restored: Mutex<Option<Vec<u8>>>,
}

struct Tracking {
    tracker: Mutex<RestartTracker>,
    /// The last checkpoint kept by the client (or the restored one, until the first).
    last_checkpoint: Arc<Mutex<Option<Vec<u8>>>>,
}

/// What to do after a crash.
pub(super) enum CrashPlan {
    /// Not a crash to restart from (or no policy): end with the run's own outcome.
    Finish,
    /// The restarts are used and the mode is `fail`: end failed with this description.
    Fail(String),
    /// Start the runner again after `delay`.
    Restart {
        /// The crash.
        why: String,
        /// The wait.
        delay: Duration,
        /// Which restart of the window, from 1.
        attempt: u32,
        /// The policy's limit, as statuses word it (`2 in 30m`).
        limit: String,
    },
}

impl Restarts {
    pub(super) fn new(policy: Option<RestartPolicy>, restored: Option<Vec<u8>>) -> Self {
        match policy.filter(|p| p.attempts > 0) {
            Some(policy) => Restarts {
                tracking: Some(Tracking {
                    tracker: Mutex::new(RestartTracker::new(policy)),
                    last_checkpoint: Arc::new(Mutex::new(restored)),
                }),
                restored: Mutex::new(None),
            },
            None => Restarts {
                tracking: None,
                restored: Mutex::new(restored),
            },
        }
    }

    /// `updater`, remembering each checkpoint the client kept when restarts need it.
    pub(super) fn keeping_checkpoints(
        &self,
        updater: Arc<dyn StateUpdater>,
    ) -> Arc<dyn StateUpdater> {
        match &self.tracking {
            None => updater,
            Some(tracking) => Arc::new(KeepingCheckpoints {
                inner: updater,
                last_checkpoint: tracking.last_checkpoint.clone(),
            }),
        }
    }

    /// The checkpoint the next run starts from.
    pub(super) fn checkpoint(&self) -> Option<Vec<u8>> {
        match &self.tracking {
            None => self.restored.lock_unpoisoned().take(),
            Some(tracking) => tracking.last_checkpoint.lock_unpoisoned().clone(),
        }
    }

    /// The runner crashed (`why`) now.
    pub(super) fn on_crash(&self, why: String) -> CrashPlan {
        let Some(tracking) = &self.tracking else {
            return CrashPlan::Finish;
        };
        let mut tracker = tracking.tracker.lock_unpoisoned();
        let limit = tracker.policy().limit_text();
        match tracker.on_crash(tokio::time::Instant::now()) {
            RestartDecision::Restart { delay, attempt } => CrashPlan::Restart {
                why,
                delay,
                attempt,
                limit,
            },
            RestartDecision::LimitReached => {
                CrashPlan::Fail(format!("{why} (restart limit reached: {limit})"))
            }
        }
    }
}

impl Shared {
    /// Whether the alloc's own CPU budget or wall time is spent: no restart brings it back.
    fn alloc_limit_spent(&self) -> bool {
        let cpu_spent = self.usage.snapshot().cpu_used >= self.limits.cpu;
        let wall_spent = self.limits.wall_time.is_some()
            && self
                .wall_deadline
                .lock_unpoisoned()
                .is_some_and(|deadline| tokio::time::Instant::now() >= deadline);
        cpu_spent || wall_spent
    }

    /// Runs the guest, and again after each crash its restart policy allows, until a run
    /// ends for good; returns how the last one ended.
    pub(super) async fn run_until_done(
        self: Arc<Self>,
        events: mpsc::UnboundedReceiver<Event>,
    ) -> RunOutcome {
        let mut events = events;
        loop {
            let restored = self.restarts.checkpoint();
            let (outcome, events_back) = self.clone().run_guest(events, restored).await;
            let Some(events_back) = events_back else {
                return outcome;
            };
            let stopping = self.lifecycle().stop_asked();
            let last = self.state.get();
            let crash = outcome.crash_description(&self.limits);
            let plan = match crash {
                Some(why)
                    if !stopping
                        && !last.client_status.is_terminal()
                        && !self.alloc_limit_spent() =>
                {
                    self.restarts.on_crash(why)
                }
                _ => CrashPlan::Finish,
            };
            match plan {
                CrashPlan::Finish => return outcome,
                CrashPlan::Fail(description) => return RunOutcome::Failed(description),
                CrashPlan::Restart {
                    why,
                    delay,
                    attempt,
                    limit,
                } => {
                    let restarting = crate::runtime::outcome::restarting_state(
                        last,
                        &why,
                        delay,
                        attempt,
                        &limit,
                        crate::timestamp::unix_ms_now(),
                    );
                    tracing::warn!(
                        parent: &self.config.span,
                        reason = %why,
                        attempt,
                        delay = %format_duration(delay),
                        "runner crashed; restarting it in place"
                    );
                    self.restarting.store(true, Ordering::SeqCst);
                    self.state.restart(restarting);
                    let stop_asked = self.stop_asked.latch();
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = stop_asked.wait() => {}
                    }
                    // Under the lock task actions are refused under: a stop that came as the
                    // wait ended still wins, and no action slips in before the next run.
                    {
                        let lifecycle = self.lifecycle();
                        if lifecycle.stop_asked() {
                            return RunOutcome::StoppedWhileRestarting;
                        }
                        self.restarting.store(false, Ordering::SeqCst);
                    }
                    events = events_back;
                }
            }
        }
    }
}

/// Passes everything on, and keeps a copy of each checkpoint the client kept.
struct KeepingCheckpoints {
    inner: Arc<dyn StateUpdater>,
    last_checkpoint: Arc<Mutex<Option<Vec<u8>>>>,
}

impl StateUpdater for KeepingCheckpoints {
    fn alloc_state_updated(&self, alloc_id: &str, state: &AllocState) {
        self.inner.alloc_state_updated(alloc_id, state);
    }

    fn checkpoint_saved(&self, alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        let saving = self.inner.checkpoint_saved(alloc_id, data);
        let last_checkpoint = self.last_checkpoint.clone();
        let data = data.to_vec();
        Box::pin(async move {
            saving.await?;
            *last_checkpoint.lock_unpoisoned() = Some(data);
            Ok(())
        })
    }
}
