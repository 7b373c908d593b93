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

use super::Checkpoint;
use super::Shared;
use crate::allocrunner::{Latch, LatchTrigger, UpgradeOutcome, UpgradeReport, short_hash};
use crate::model::structs::Alloc;
use crate::runtime::LoadedComponent;
use crate::runtime::runner::lifecycle::Phase;
use crate::util::locks::LockUnpoisoned;
use std::sync::{Arc, Mutex};

/// What runs the alloc: a component, and the version of the alloc its `run` is given.
#[derive(Clone)]
pub(super) struct Build {
    pub(super) component: Arc<LoadedComponent>,
    pub(super) alloc: Arc<Alloc>,
}

impl Build {
    fn short_hash(&self) -> &str {
        short_hash(&self.component.hash)
    }
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

/// The last upgrade asked, keyed by the alloc version it upgrades to: a late answer about an
/// older one (its load, its start) changes nothing.
struct LastUpgrade {
    report: UpgradeReport,
    version: u64,
    /// The state cell's count of reports `running` or `complete` when the new build started:
    /// one more, and it is done.
    started_at_report: Option<u64>,
}

impl LastUpgrade {
    fn took(&self, reports_running: u64) -> bool {
        self.started_at_report
            .is_some_and(|at| reports_running > at)
    }
}

/// A build that has started for an upgrade, and what to roll back to.
pub(super) struct Upgrading {
    /// The last build known to run the alloc: the one before an upgrade whose own new build
    /// had not reported yet when a newer one came.
    pub(super) from: Build,
    /// The checkpoint the new build starts from, and a rollback too.
    pub(super) checkpoint: Option<Checkpoint>,
    version: u64,
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

    /// The component the alloc is headed for: the one waiting to take over, else the one
    /// running. A new version is compared with it.
    pub(super) fn target_component(&self) -> Arc<LoadedComponent> {
        let slot = self.slot.lock_unpoisoned();
        let target = slot.pending.as_ref().unwrap_or(&slot.current);
        target.component.clone()
    }

    /// A version of the alloc that asks for no new run: the current build's next runs (a
    /// restart after a crash) are given it.
    pub(super) fn track(&self, alloc: Arc<Alloc>) {
        let mut slot = self.slot.lock_unpoisoned();
        if alloc.modify_index > slot.current.alloc.modify_index {
            slot.current.alloc = alloc;
        }
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
        if report.outcome == UpgradeOutcome::InProgress && last.took(reports_running) {
            report.outcome = UpgradeOutcome::Done;
        }
        Some(report)
    }

    /// The alloc's runs are over: a build still waiting will not run, and an upgrade whose
    /// new build never reported did not happen.
    pub(super) fn abandon(&self, reports_running: u64) {
        self.slot.lock_unpoisoned().pending = None;
        let mut last = self.last.lock_unpoisoned();
        if let Some(last) = last.as_mut()
            && last.report.outcome == UpgradeOutcome::InProgress
            && !last.took(reports_running)
        {
            last.report.outcome =
                UpgradeOutcome::Failed("the alloc stopped before the new build took over".into());
        }
    }

    fn record(&self, report: UpgradeReport, version: u64) {
        *self.last.lock_unpoisoned() = Some(LastUpgrade {
            report,
            version,
            started_at_report: None,
        });
    }

    /// Changes the record of the upgrade to `version`, if it is still the last one asked.
    fn with_record(&self, version: u64, change: impl FnOnce(&mut LastUpgrade)) {
        if let Some(last) = self.last.lock_unpoisoned().as_mut()
            && last.version == version
        {
            change(last);
        }
    }
}

/// Whether `new` asks for another build or another run than `current` (the alloc's last
/// version) and `target` (the component it runs, or is about to) give: a new runner path or
/// build, new tasks or new meta. The server sends such a version only for an upgrade in
/// place.
pub(super) fn asks_for_new_run(current: &Alloc, new: &Alloc, target: &LoadedComponent) -> bool {
    // A build named by hash is the build, whatever its path says (another machine's path to
    // the same file, say); only allocs saved before builds were named go by path.
    let new_build = match (&new.runner_sha256, &current.runner_sha256) {
        (Some(sha256), Some(_)) => *sha256 != target.hash,
        (sha256, _) => {
            new.runner != current.runner || sha256.as_ref().is_some_and(|s| *s != target.hash)
        }
    };
    new_build || new.tasks != current.tasks || new.meta != current.meta
}

impl Shared {
    /// Loads the build `alloc` names, on the blocking pool, and hands it to the run loop,
    /// asking the running guest to end; records why when it cannot.
    pub(super) fn upgrade_to(self: Arc<Self>, alloc: Arc<Alloc>) {
        let version = alloc.modify_index;
        let to = alloc
            .runner_sha256
            .clone()
            .unwrap_or_else(|| alloc.runner.clone());
        self.upgrades.record(
            UpgradeReport {
                from_sha256: self.upgrades.current().component.hash.clone(),
                to,
                outcome: UpgradeOutcome::InProgress,
                asked_unix_ms: crate::util::timestamp::unix_ms_now(),
            },
            version,
        );
        tracing::info!(parent: &self.config.span, runner = %alloc.runner, "upgrading the runner in place");
        tokio::spawn(async move {
            let (runtime, store, asked) = (self.runtime.clone(), self.store.clone(), alloc.clone());
            let loaded = crate::util::blocking::with_a_turn(move || {
                runtime.load_for_alloc(&asked, store.as_ref(), true)
            })
            .await;
            let component = match loaded {
                Ok(Ok(component)) => component,
                Ok(Err(error)) => return self.upgrade_failed(version, format!("{error:#}")),
                Err(error) => {
                    return self.upgrade_failed(version, format!("loading stopped: {error}"));
                }
            };
            if let Some(wanted) = &alloc.runner_sha256
                && *wanted != component.hash
            {
                let found = short_hash(&component.hash).to_string();
                let why = format!(
                    "the runner at {} is build {found}, not the {} its job was registered with",
                    alloc.runner,
                    short_hash(wanted)
                );
                return self.upgrade_failed(version, why);
            }
            let to = component.hash.clone();
            self.upgrades
                .with_record(version, |last| last.report.to = to);
            self.ask_upgrade(Build { component, alloc });
        });
    }

    /// Queues `build` to take over, and asks the running guest (if one runs) to end.
    fn ask_upgrade(&self, mut build: Build) {
        let version = build.alloc.modify_index;
        // Under the lifecycle lock, as stops are asked: an alloc stopping is not upgraded,
        // and one that has stopped (`record_final` abandons what waits) sees no new build.
        let lifecycle = self.lifecycle();
        if lifecycle.phase() == Phase::Finished || lifecycle.stop_asked() {
            drop(lifecycle);
            return self.upgrade_failed(version, "the alloc stopped first".into());
        }
        let latest = self.alloc();
        if latest.modify_index > version {
            if asks_for_new_run(&build.alloc, &latest, &build.component) {
                // A newer version asks for another build (its own upgrade says how that
                // went) or for the one running (a revert while this one loaded).
                drop(lifecycle);
                let why = "a newer version of the alloc came first".into();
                return self.upgrade_failed(version, why);
            }
            build.alloc = latest;
        }
        let mut slot = self.upgrades.slot.lock_unpoisoned();
        slot.pending = Some(build);
        if let Some(live_run) = &slot.live_run {
            live_run.set();
        }
    }

    /// The upgrade to alloc `version` failed (`why`); the alloc runs the build it ran.
    pub(super) fn upgrade_failed(&self, version: u64, why: String) {
        tracing::warn!(parent: &self.config.span, reason = %why, "runner upgrade failed; the alloc runs the build it ran");
        self.upgrades.with_record(version, |last| {
            last.report.outcome = UpgradeOutcome::Failed(why);
        });
    }

    /// Starts `build` in place of the current one: returns what to roll back to, which is
    /// `unproven`'s if the upgrade before it had not reported yet.
    pub(super) fn start_upgrade(&self, build: Build, unproven: Option<Upgrading>) -> Upgrading {
        let replaced = self.upgrades.switch_to(build.clone());
        let (from, checkpoint) = match unproven {
            Some(unproven) => (unproven.from, unproven.checkpoint),
            None => (replaced, self.restarts.checkpoint()),
        };
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
        self.state.set_probation(true);
        let version = build.alloc.modify_index;
        self.upgrades.with_record(version, |last| {
            last.started_at_report = Some(started_at_report)
        });
        Upgrading {
            from,
            checkpoint,
            version,
            started_at_report,
        }
    }

    /// Whether the upgrade's new build has reported `running` or `complete`.
    pub(super) fn upgrade_took(&self, upgrading: &Upgrading) -> bool {
        self.state.reports_running() > upgrading.started_at_report
    }

    /// The new build failed (`why`) before it reported `running` or `complete`: the old
    /// one is made current again, to run from the checkpoint the new one started from
    /// (saved again, when there was one, so that an agent restart resumes from it too).
    pub(super) async fn roll_back(&self, upgrading: &Upgrading, why: &str) {
        let failed = self.upgrades.switch_to(upgrading.from.clone());
        crate::allocrunner::record_runner_hash(&self.config.span, &upgrading.from.component.hash);
        let why = format!(
            "build {} failed before it reported running ({why}); rolled back to build {}",
            failed.short_hash(),
            upgrading.from.short_hash()
        );
        self.upgrade_failed(upgrading.version, why.clone());
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
        let noted = crate::runtime::runner::outcome::with_event_on_every_task(
            self.state.get(),
            kind,
            message,
            crate::util::timestamp::unix_ms_now(),
        );
        self.state.restart(noted);
    }
}
