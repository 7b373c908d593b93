//! The alloc's runs: the loop that starts the runner again after a crash its restart policy
//! allows (see [`crate::model::restart`]) or for an upgrade in place (see `upgrade`), the tracker,
//! and the last checkpoint the next run starts from (a copy of what the client kept, in
//! memory: at most the alloc's `checkpoint_size`).
//!
//! The alloc's limits hold across its runs: its CPU budget and its wall time are its own, not
//! each run's (the store's meter starts from what earlier runs used, and the wall-time
//! deadline is set once), and a crash because either ran out is final.

use super::upgrade::{Build, Upgrading};
use super::{Checkpoint, Shared};
use crate::allocrunner::{CheckpointSaved, StateUpdater};
use crate::model::restart::{RestartDecision, RestartPolicy, RestartTracker};
use crate::model::structs::AllocState;
use crate::runtime::imports::event_queue::EventReceiver;
use crate::runtime::runner::outcome::RunOutcome;
use crate::util::locks::LockUnpoisoned;
use crate::util::units::format_duration;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One alloc's restarts and its last checkpoint.
pub(super) struct Restarts {
    /// `None` when it has no restart policy.
    tracker: Option<Mutex<RestartTracker>>,
    /// The last checkpoint kept by the client (or the restored one, until the first),
    /// shared with the run that starts from it rather than copied.
    last_checkpoint: Arc<Mutex<Option<Checkpoint>>>,
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
        /// The wait as statuses word it (the job's `delay` as written, when it is that).
        wait: String,
        /// Which restart of the window, from 1.
        attempt: u32,
        /// The policy's limit, as statuses word it (`2 in 30m`).
        limit: String,
    },
}

impl Restarts {
    pub(super) fn new(policy: Option<RestartPolicy>, restored: Option<Vec<u8>>) -> Self {
        Restarts {
            tracker: policy
                .filter(|p| p.attempts > 0)
                .map(|policy| Mutex::new(RestartTracker::new(policy))),
            last_checkpoint: Arc::new(Mutex::new(restored.map(Checkpoint::from))),
        }
    }

    /// `updater`, remembering each checkpoint the client kept.
    pub(super) fn keeping_checkpoints(
        &self,
        updater: Arc<dyn StateUpdater>,
    ) -> Arc<dyn StateUpdater> {
        Arc::new(KeepingCheckpoints {
            inner: updater,
            last_checkpoint: self.last_checkpoint.clone(),
        })
    }

    /// The checkpoint the next run starts from.
    pub(super) fn checkpoint(&self) -> Option<Checkpoint> {
        self.last_checkpoint.lock_unpoisoned().clone()
    }

    /// Makes `checkpoint` the one the next run starts from (a rolled-back upgrade's).
    pub(super) fn set_checkpoint(&self, checkpoint: Option<Checkpoint>) {
        *self.last_checkpoint.lock_unpoisoned() = checkpoint;
    }

    /// The runner crashed (`why`) now.
    pub(super) fn on_crash(&self, why: String) -> CrashPlan {
        let Some(tracker) = &self.tracker else {
            return CrashPlan::Finish;
        };
        let mut tracker = tracker.lock_unpoisoned();
        let limit = tracker.policy().limit_text();
        match tracker.on_crash(tokio::time::Instant::now()) {
            RestartDecision::Restart { delay, attempt } => CrashPlan::Restart {
                why,
                delay,
                wait: tracker.policy().wait_text(delay),
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

    /// Runs the guest, again after each crash its restart policy allows, and each build an
    /// upgrade brings in its place, until a run ends for good; returns how the last one
    /// ended.
    pub(super) async fn run_until_done(self: Arc<Self>, events: EventReceiver) -> RunOutcome {
        let mut events = events;
        let mut next = NextRun::Current;
        // An upgrade whose new build was replaced by a newer one before it reported: the
        // newer one rolls back to what it would have.
        let mut unproven: Option<Upgrading> = None;
        loop {
            let (waiting, upgrade_asked) = self.upgrades.begin_run();
            if let Some(build) = waiting {
                next = NextRun::Upgrade(build);
            }
            let (build, restored, upgrading) = match std::mem::take(&mut next) {
                NextRun::Current => (self.upgrades.current(), self.restarts.checkpoint(), None),
                NextRun::Upgrade(build) => {
                    let upgrading = self.start_upgrade(build.clone(), unproven.take());
                    (build, upgrading.checkpoint.clone(), Some(upgrading))
                }
            };
            let (outcome, events_back) = self
                .clone()
                .run_guest(events, &build, restored, upgrade_asked)
                .await;
            let waiting = self.upgrades.end_run();
            let Some(events_back) = events_back else {
                return outcome;
            };
            events = events_back;
            let stopping = self.lifecycle().stop_asked();
            let last = self.state.get();
            let crash = outcome.crash_description(&self.limits);
            let limit_spent = crash.is_some() && self.alloc_limit_spent();
            self.state.set_probation(false);
            // A new build that ended before it got the alloc going, other than for a stop or
            // a newer build, failed: the one before it runs again.
            if let Some(upgrading) = &upgrading
                && !self.upgrade_took(upgrading)
                && !stopping
                && !limit_spent
                && waiting.is_none()
            {
                let why = crash
                    .clone()
                    .unwrap_or_else(|| "it returned without reporting".into());
                self.roll_back(upgrading, &why).await;
                continue; // with the current build, the old one again
            }
            let ended_cleanly = matches!(
                outcome,
                RunOutcome::Returned(Ok(())) | RunOutcome::ShutdownTimedOut
            );
            if let Some(build) = waiting.clone()
                && ended_cleanly
                && !stopping
                && !last.client_status.is_terminal()
            {
                if matches!(outcome, RunOutcome::ShutdownTimedOut) {
                    tracing::warn!(parent: &self.config.span, kill_timeout = %format_duration(self.limits.kill_timeout), "runner did not return within the kill timeout after the upgrade's shutdown; its sandbox was torn down and the new build starts from its last checkpoint");
                }
                unproven = upgrading.filter(|u| !self.upgrade_took(u));
                next = NextRun::Upgrade(build);
                continue;
            }
            let plan = match crash {
                Some(why) if !stopping && !last.client_status.is_terminal() && !limit_spent => {
                    self.restarts.on_crash(why)
                }
                _ => CrashPlan::Finish,
            };
            let CrashPlan::Restart {
                why,
                delay,
                wait,
                attempt,
                limit,
            } = plan
            else {
                return match plan {
                    CrashPlan::Fail(description) => RunOutcome::Failed(description),
                    _ => outcome,
                };
            };
            let restarting = crate::runtime::runner::outcome::restarting_state(
                last,
                &why,
                &wait,
                attempt,
                &limit,
                crate::util::timestamp::unix_ms_now(),
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
            // Under the lock task actions are refused under: a stop that came as the wait
            // ended still wins, and no action slips in before the next run.
            {
                let lifecycle = self.lifecycle();
                if lifecycle.stop_asked() {
                    return RunOutcome::StoppedWhileRestarting;
                }
                self.restarting.store(false, Ordering::SeqCst);
            }
            // A build that came meanwhile is the one to restart with.
            if let Some(build) = waiting {
                next = NextRun::Upgrade(build);
            }
        }
    }
}

/// What the next run of the loop runs.
#[derive(Default)]
enum NextRun {
    /// The current build, from the last checkpoint.
    #[default]
    Current,
    /// A new build, taking over.
    Upgrade(Build),
}

/// Passes everything on, and keeps a copy of each checkpoint the client kept.
struct KeepingCheckpoints {
    inner: Arc<dyn StateUpdater>,
    last_checkpoint: Arc<Mutex<Option<Checkpoint>>>,
}

impl StateUpdater for KeepingCheckpoints {
    fn alloc_state_updated(&self, alloc_id: &str, state: &AllocState) {
        self.inner.alloc_state_updated(alloc_id, state);
    }

    fn checkpoint_saved(&self, alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        let saving = self.inner.checkpoint_saved(alloc_id, data);
        let last_checkpoint = self.last_checkpoint.clone();
        let data = Checkpoint::from(data);
        Box::pin(async move {
            saving.await?;
            *last_checkpoint.lock_unpoisoned() = Some(data);
            Ok(())
        })
    }
}
