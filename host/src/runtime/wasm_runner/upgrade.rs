//! Upgrades in place: a new build of an alloc's runner (or a new version of its tasks' config,
//! when the job carries checkpoints) takes over the running alloc without losing its state.
//!
//! The running guest is asked to `shutdown`, as for an agent restart, and checkpoints; the
//! new build starts in a fresh store with that checkpoint as `restored`, keeping the alloc
//! id, its directory and its log. A new build that fails (a trap, a limit, an error from
//! `run`) before it reports `running` or `complete` is rolled back: the old build starts again from the
//! same checkpoint, and the upgrade fails, not the alloc. A build that cannot be loaded
//! never stops the running one. Nomad replaces an alloc whose job changed, and Spin and
//! wasmCloud restart a component fresh; a runner's state is the thing worth keeping here.
//!
//! This module holds what runs the alloc ([`Build`]), the build waiting to take over, and
//! how the last upgrade went; the run loop (`restarts`) decides when a build starts.

use super::Shared;
use crate::allocrunner::{Latch, LatchTrigger, UpgradeOutcome, UpgradeReport};
use crate::locks::LockUnpoisoned;
use crate::runtime::LoadedComponent;
use crate::structs::Alloc;
use std::sync::{Arc, Mutex};

/// What runs the alloc: a component, and the version of the alloc its `run` is given.
#[derive(Clone)]
pub(super) struct Build {
    pub(super) component: Arc<LoadedComponent>,
    pub(super) alloc: Arc<Alloc>,
}

impl Build {
    fn short_hash(&self) -> &str {
        short(&self.component.hash)
    }
}

fn short(sha256: &str) -> &str {
    sha256
        .get(..crate::allocrunner::SHORT_HASH_DIGITS)
        .unwrap_or(sha256)
}

/// One alloc's builds: the one running, the one waiting to take over, the last upgrade.
pub(super) struct Upgrades {
    slot: Mutex<Slot>,
    last: Mutex<Option<LastUpgrade>>,
}

struct Slot {
    /// What runs the alloc now, or runs it next.
    current: Build,
    /// A loaded build waiting for the current run to end.
    pending: Option<Build>,
    /// The running guest's trigger for `shutdown`; `None` between runs.
    live_run: Option<LatchTrigger>,
}

struct LastUpgrade {
    report: UpgradeReport,
    /// The state cell's count of reports `running` (or `complete`) when the new build started: one
    /// more, and it is done.
    started_at_report: Option<u64>,
}

/// A build that has started for an upgrade, and what to roll back to.
pub(super) struct Upgrading {
    pub(super) from: Build,
    /// The checkpoint both builds start from.
    pub(super) checkpoint: Option<Vec<u8>>,
    started_at_report: u64,
}

impl Upgrades {
    pub(super) fn new(component: Arc<LoadedComponent>, alloc: Arc<Alloc>) -> Self {
        Upgrades {
            slot: Mutex::new(Slot {
                current: Build { component, alloc },
                pending: None,
                live_run: None,
            }),
            last: Mutex::new(None),
        }
    }

    /// What runs the alloc now (or next).
    pub(super) fn current(&self) -> Build {
        self.slot.lock_unpoisoned().current.clone()
    }

    /// A run is starting: returns the build waiting to take over (the run is to be that
    /// build's), and the latch through which this run's guest is asked to end for the next.
    pub(super) fn begin_run(&self) -> (Option<Build>, Latch) {
        let mut slot = self.slot.lock_unpoisoned();
        let (trigger, latch) = Latch::new();
        slot.live_run = Some(trigger);
        (slot.pending.take(), latch)
    }

    /// The run has ended: returns the build waiting to take over, if one came.
    pub(super) fn end_run(&self) -> Option<Build> {
        let mut slot = self.slot.lock_unpoisoned();
        slot.live_run = None;
        slot.pending.take()
    }

    /// Makes `build` the one that runs the alloc; returns the one it replaces.
    pub(super) fn switch_to(&self, build: Build) -> Build {
        std::mem::replace(&mut self.slot.lock_unpoisoned().current, build)
    }

    /// How the last upgrade went; `reports_running` is the state cell's count now.
    pub(super) fn last(&self, reports_running: u64) -> Option<UpgradeReport> {
        let last = self.last.lock_unpoisoned();
        let last = last.as_ref()?;
        let mut report = last.report.clone();
        if report.outcome == UpgradeOutcome::InProgress
            && last
                .started_at_report
                .is_some_and(|at| reports_running > at)
        {
            report.outcome = UpgradeOutcome::Done;
        }
        Some(report)
    }

    fn record(&self, report: UpgradeReport) {
        *self.last.lock_unpoisoned() = Some(LastUpgrade {
            report,
            started_at_report: None,
        });
    }

    fn set_outcome(&self, outcome: UpgradeOutcome) {
        if let Some(last) = self.last.lock_unpoisoned().as_mut() {
            last.report.outcome = outcome;
        }
    }
}

/// Whether `new` asks for another build or another run than `current` (the alloc's last
/// version) and `running` (the component it runs) give: a new runner path or build, new
/// tasks or new meta. The server sends such a version only for an upgrade in place.
pub(super) fn asks_for_new_run(current: &Alloc, new: &Alloc, running: &LoadedComponent) -> bool {
    new.runner != current.runner
        || new
            .runner_sha256
            .as_ref()
            .is_some_and(|sha256| *sha256 != running.hash)
        || new.tasks != current.tasks
        || new.meta != current.meta
}

impl Shared {
    /// Loads the build `alloc` names, on the blocking pool, and hands it to the run loop,
    /// asking the running guest to end; records why when it cannot.
    pub(super) fn upgrade_to(self: Arc<Self>, alloc: Arc<Alloc>) {
        let from = self.upgrades.current();
        let to = alloc
            .runner_sha256
            .clone()
            .unwrap_or_else(|| alloc.runner.clone());
        self.upgrades.record(UpgradeReport {
            from_sha256: from.component.hash.clone(),
            to,
            outcome: UpgradeOutcome::InProgress,
            asked_unix_ms: crate::timestamp::unix_ms_now(),
        });
        tracing::info!(parent: &self.config.span, runner = %alloc.runner, "upgrading the runner in place");
        tokio::spawn(async move {
            let runtime = self.runtime.clone();
            let path = alloc.runner.clone();
            let loaded = tokio::task::spawn_blocking(move || {
                runtime.load_file_now(std::path::Path::new(&path))
            })
            .await;
            let component = match loaded {
                Ok(Ok(component)) => component,
                Ok(Err(error)) => return self.upgrade_failed(format!("{error:#}")),
                Err(error) => return self.upgrade_failed(format!("loading stopped: {error}")),
            };
            if let Some(wanted) = &alloc.runner_sha256
                && *wanted != component.hash
            {
                let found = short(&component.hash).to_string();
                return self.upgrade_failed(format!(
                    "the runner at {} is build {found}, not the {} its job was registered with",
                    alloc.runner,
                    short(wanted)
                ));
            }
            if let Some(last) = self.upgrades.last.lock_unpoisoned().as_mut() {
                last.report.to = component.hash.clone();
            }
            self.ask_upgrade(Build { component, alloc });
        });
    }

    /// Queues `build` to take over, and asks the running guest (if one runs) to end.
    fn ask_upgrade(&self, build: Build) {
        // Under the lifecycle lock, as stops are asked: an alloc stopping is not upgraded.
        let lifecycle = self.lifecycle();
        if lifecycle.phase() == crate::runtime::lifecycle::Phase::Finished || lifecycle.stop_asked()
        {
            drop(lifecycle);
            return self.upgrade_failed("the alloc stopped first".into());
        }
        let mut slot = self.upgrades.slot.lock_unpoisoned();
        if slot
            .pending
            .as_ref()
            .is_some_and(|waiting| waiting.alloc.modify_index > build.alloc.modify_index)
        {
            return; // a newer version is waiting already
        }
        slot.pending = Some(build);
        if let Some(live_run) = &slot.live_run {
            live_run.set();
        }
    }

    pub(super) fn upgrade_failed(&self, why: String) {
        tracing::warn!(parent: &self.config.span, reason = %why, "runner upgrade failed; the alloc runs the build it ran");
        self.upgrades.set_outcome(UpgradeOutcome::Failed(why));
    }

    /// Starts `build` in place of the current one: returns what to roll back to.
    pub(super) fn start_upgrade(&self, build: Build) -> Upgrading {
        let from = self.upgrades.switch_to(build.clone());
        crate::allocrunner::record_runner_hash(&self.config.span, &build.component.hash);
        let message = if from.component.hash == build.component.hash {
            format!(
                "Runner restarted in place for the alloc's new config (build {})",
                build.short_hash()
            )
        } else {
            format!(
                "Runner upgraded in place from build {} to {}",
                from.short_hash(),
                build.short_hash()
            )
        };
        tracing::info!(parent: &self.config.span, from = from.short_hash(), to = build.short_hash(), "starting the runner's new build");
        self.note_on_tasks("Upgrading", &message);
        let started_at_report = self.state.reports_running();
        if let Some(last) = self.upgrades.last.lock_unpoisoned().as_mut() {
            last.started_at_report = Some(started_at_report);
        }
        Upgrading {
            from,
            checkpoint: self.restarts.checkpoint(),
            started_at_report,
        }
    }

    /// The alloc's runs are over: an upgrade still `waiting`, or one `upgrading` whose new
    /// build never reported `running`, did not happen.
    pub(super) fn upgrade_ends_with_the_alloc(&self, upgrading: Option<&Upgrading>, waiting: bool) {
        if waiting {
            self.upgrade_failed("the alloc's run ended before the new build started".into());
        } else if upgrading.is_some_and(|upgrading| !self.upgrade_took(upgrading)) {
            self.upgrade_failed(
                "the alloc's run ended before the new build reported running".into(),
            );
        }
    }

    /// Whether the upgrade's new build has reported `running` (or `complete`).
    pub(super) fn upgrade_took(&self, upgrading: &Upgrading) -> bool {
        self.state.reports_running() > upgrading.started_at_report
    }

    /// The new build failed (`why`) before it reported `running` (or `complete`): the old one is made
    /// current again, to run from the checkpoint the new one started from (saved again, so
    /// an agent restart resumes from it too).
    pub(super) async fn roll_back(&self, upgrading: &Upgrading, why: &str) {
        let failed = self.upgrades.switch_to(upgrading.from.clone());
        crate::allocrunner::record_runner_hash(&self.config.span, &upgrading.from.component.hash);
        let why = format!(
            "build {} failed before it reported running ({why}); rolled back to build {}",
            failed.short_hash(),
            upgrading.from.short_hash()
        );
        self.upgrade_failed(why.clone());
        self.note_on_tasks("Upgrade Failed", &format!("Runner {why}"));
        self.restarts.set_checkpoint(upgrading.checkpoint.clone());
        if let Some(checkpoint) = &upgrading.checkpoint
            && let Err(error) = self.state.checkpoint(checkpoint).await
        {
            tracing::warn!(parent: &self.config.span, %error, "could not save the checkpoint again for the rolled-back build");
        }
    }

    /// Adds an event to every task of the alloc's state, which the next guest's reports
    /// then carry on from.
    fn note_on_tasks(&self, kind: &str, message: &str) {
        let noted = crate::runtime::outcome::with_event_on_every_task(
            self.state.get(),
            kind,
            message,
            crate::timestamp::unix_ms_now(),
        );
        self.state.restart(noted);
    }
}
