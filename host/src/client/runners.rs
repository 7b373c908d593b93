//! The client's runners from birth to removal: an alloc's runner built (off the async
//! workers) and started, or the alloc failed when it cannot be; updates passed on; a
//! removal pruned and collected; and the [`StateUpdater`] through which each runner reports
//! into the client. The alloc map itself and its invariants are `client/mod.rs`'s.

use super::ClientInner;
use crate::allocrunner::{
    AllocRunner, AllocRunnerConfig, CheckpointSaved, StateUpdater, alloc_span,
};
use crate::model::structs::{Alloc, AllocState, DesiredStatus};
use crate::util::locks::LockUnpoisoned;
use std::sync::{Arc, Weak};

/// What the runner of an alloc restored after a restart starts from.
#[derive(Default)]
pub(super) struct Restoring {
    /// Its last checkpoint, if it saved one.
    pub(super) checkpoint: Option<Vec<u8>>,
    /// Its last saved state, if it reported one.
    pub(super) last_state: Option<AllocState>,
}

/// One alloc's runner as its factory built it (or why not), with what its config carried.
pub(super) struct Built {
    pub(super) alloc: Arc<Alloc>,
    pub(super) span: tracing::Span,
    pub(super) last_state: Option<AllocState>,
    pub(super) runner: anyhow::Result<Arc<dyn AllocRunner>>,
}

/// An alloc's directory under a client's data dir.
pub(super) fn alloc_dir_in(data_dir: &std::path::Path, alloc_id: &str) -> std::path::PathBuf {
    data_dir.join("allocs").join(alloc_id)
}

impl ClientInner {
    /// Builds and starts the runners of new allocs, saved already, in their order; or fails
    /// the allocs whose runner cannot be built. Each starts as soon as it is built.
    pub(super) async fn add_allocs(self: &Arc<Self>, allocs: &[Arc<Alloc>]) {
        let mut configs = Vec::with_capacity(allocs.len());
        for alloc in allocs {
            match &alloc.previous_alloc {
                // Moved here from a drained node: it starts once its checkpoint is here, on
                // a task of its own, so that the others do not wait for it. (Evicted in
                // turn already, it still fetches the checkpoint, to hand it on.)
                Some(previous)
                    if previous.checkpoint
                        && matches!(
                            alloc.desired_status,
                            DesiredStatus::Run | DesiredStatus::Evict
                        ) =>
                {
                    self.arrive(alloc, previous);
                }
                _ => configs.push(self.runner_config(alloc, None)),
            }
        }
        self.start_built(configs).await;
    }

    /// Builds the runners of `configs` and starts each as soon as it is built, or fails its
    /// alloc when it cannot be.
    async fn start_built(self: &Arc<Self>, configs: Vec<AllocRunnerConfig>) {
        let mut built = self.build_runners(configs);
        while let Some(built) = built.recv().await {
            match built.runner {
                Ok(runner) => self.start_runner(&built.alloc.id, runner),
                Err(error) => self.fail_alloc(built.alloc, &built.span, format!("{error:#}")),
            }
        }
    }

    /// Calls the factory for each config, in order, off the async workers: a factory may
    /// read and compile a component (tens of milliseconds, seconds for some languages). One
    /// trip to the blocking pool for the lot (with a turn: see [`crate::util::blocking`]),
    /// since after a component's first build each is cheap, cheaper than a trip; each result
    /// is handed back as soon as it is made, so a runner need not wait for the builds after
    /// it (ten thousand of them, or a compile of another language's component). A panic costs its own alloc only. The receiver ends
    /// after the last config, or at once when there is none (no trip then); a runtime
    /// shutting down may end it early, and then nothing is left to start anyway.
    pub(super) fn build_runners(
        &self,
        configs: Vec<AllocRunnerConfig>,
    ) -> tokio::sync::mpsc::UnboundedReceiver<Built> {
        let (results, received) = tokio::sync::mpsc::unbounded_channel();
        if configs.is_empty() {
            return received;
        }
        let factory = self.factory.clone();
        let build = move || {
            for config in configs {
                if results.is_closed() {
                    // Whoever wanted these stopped waiting (maybe while this waited for its
                    // turn): none need be built.
                    return;
                }
                let (alloc, span) = (config.alloc.clone(), config.span.clone());
                let last_state = config.last_state.clone();
                let runner =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| factory(config)))
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("the runner factory panicked")));
                let built = Built {
                    alloc,
                    span,
                    last_state,
                    runner,
                };
                if results.send(built).is_err() {
                    // Whoever wanted these stopped waiting: the rest need not be built.
                    return;
                }
            }
        };
        tokio::spawn(crate::util::blocking::with_a_turn(build));
        received
    }

    /// Puts a built runner in the map, and starts it (see [`ClientInner::begin`]).
    pub(super) fn start_runner(&self, alloc_id: &str, runner: Arc<dyn AllocRunner>) {
        if self.put_in_map(&mut self.runners_lock(), alloc_id, &runner) {
            self.begin(alloc_id, runner);
        }
    }

    /// Puts `runner` in `runners` (the map, locked by the caller) unless the client is
    /// stopping or the alloc has a runner already; whether it did. A runner not put in the
    /// map must never start.
    pub(super) fn put_in_map(
        &self,
        runners: &mut crate::util::determinism::HashMap<String, Arc<dyn AllocRunner>>,
        alloc_id: &str,
        runner: &Arc<dyn AllocRunner>,
    ) -> bool {
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        if runners.contains_key(alloc_id) {
            // Two answers applied at once may both add an alloc: the first runner stays, and
            // this one, never started, is let go (a second would run the alloc twice).
            tracing::debug!(alloc_id, "the alloc has a runner already");
            return false;
        }
        runners.insert(alloc_id.to_string(), runner.clone());
        self.gc.runner_added();
        true
    }

    /// Runs a runner just put in the map, unless it is restored terminal, in which case it
    /// only waits for collection. A replacement of a failed alloc runs once its reschedule
    /// delay is over (never earlier: the delay is what keeps a crashing runner from
    /// spinning); a kill or a shutdown meanwhile means it never runs.
    pub(super) fn begin(&self, alloc_id: &str, runner: Arc<dyn AllocRunner>) {
        if runner.alloc_state().client_status.is_terminal() {
            // One held for its replacement is marked once the hold ends (`migrate`).
            if !self.holds_for_its_replacement(alloc_id) {
                self.gc.mark_for_collection(alloc_id, runner);
            }
        } else if let Some(wait) = reschedule_wait(&runner.alloc()) {
            // Stopped meanwhile (killed, shut down, destroyed): the runner is let go at once.
            let stopped = runner.wait();
            tokio::spawn(async move {
                // Biased, stop first: a runner stopped as its delay ends is not run, and a
                // simulation replays (an unbiased select draws from tokio's own random).
                tokio::select! {
                    biased;
                    () = stopped.wait() => {}
                    () = tokio::time::sleep(wait) => runner.run(),
                }
            });
        } else {
            runner.run();
        }
    }

    /// The config of `alloc`'s runner: a new alloc's, or with `restoring`, one that comes
    /// back after the agent restarted.
    pub(super) fn runner_config(
        self: &Arc<Self>,
        alloc: &Arc<Alloc>,
        restoring: Option<Restoring>,
    ) -> AllocRunnerConfig {
        let is_restoring = restoring.is_some();
        let Restoring {
            checkpoint,
            last_state,
        } = restoring.unwrap_or_default();
        AllocRunnerConfig {
            alloc: alloc.clone(),
            span: alloc_span(alloc),
            state_updater: Arc::new(ClientStateUpdater {
                client: Arc::downgrade(self),
            }),
            limits: self.config.limits,
            alloc_dir: alloc_dir_in(&self.config.data_dir, &alloc.id),
            restored: checkpoint,
            restoring: is_restoring,
            last_state,
            log_writer: Some(self.config.alloc_logs.writer(&alloc.id)),
        }
    }

    /// Fails an alloc whose runner cannot be built: reported, remembered, never retried.
    pub(super) fn fail_alloc(&self, alloc: Arc<Alloc>, span: &tracing::Span, description: String) {
        tracing::warn!(parent: span, error = %description, "failed to build the alloc's runner");
        self.metrics.runner_build_failed();
        let state = AllocState::failed(description);
        self.runnerless_lock()
            .insert(alloc.id.clone(), (alloc.clone(), state.clone()));
        self.report_state(&alloc.id, &state);
    }

    pub(super) fn update_alloc(self: &Arc<Self>, alloc: Arc<Alloc>) {
        let runner = self.runners_lock().get(&alloc.id).cloned();
        // A version its runner has already (or a newer one) changes nothing, evict included.
        if runner
            .as_ref()
            .is_some_and(|runner| alloc.modify_index <= runner.alloc().modify_index)
        {
            return;
        }
        // An evicted alloc is shut down, not killed; a later answer naming it again must not
        // turn that shutdown into a kill.
        if alloc.desired_status == DesiredStatus::Evict
            && (self.evict(&alloc) || self.moved_lock().contains_key(&alloc.id))
        {
            return;
        }
        let Some(runner) = runner else {
            tracing::warn!(alloc_id = %alloc.id, "cannot update nonexistent alloc");
            return;
        };
        runner.update(alloc);
    }

    /// The server dropped the alloc: prune it, collect it if it still holds anything, then
    /// delete its records.
    pub(super) fn remove_alloc(self: &Arc<Self>, alloc_id: &str) {
        self.sync.forget(alloc_id);
        self.moved_lock().remove(alloc_id);
        if self.runnerless_lock().remove(alloc_id).is_some() {
            self.persister.delete(alloc_id);
            return;
        }
        // Still fetching its checkpoint: its task sees it gone and builds nothing.
        if self.arriving.lock_unpoisoned().remove(alloc_id).is_some() {
            tracing::debug!(
                alloc_id,
                "dropping an arriving allocation the server dropped"
            );
            self.persister.delete(alloc_id);
            return;
        }
        let Some(runner) = self.runners_lock().remove(alloc_id) else {
            return;
        };
        tracing::debug!(alloc_id, "pruning allocation the server dropped");
        if runner.is_destroyed() {
            self.gc.forget(alloc_id);
            self.persister.delete(alloc_id);
            return;
        }
        // Marked now, not after the destroy: a stop of the agent before the destroy ends must
        // not restore an alloc the server has already dropped.
        self.persister.mark_collected(alloc_id);
        let (gc, persister) = (self.gc.clone(), self.persister.clone());
        let alloc_id = alloc_id.to_string();
        tokio::spawn(async move {
            gc.collect_removed(&alloc_id, runner).await;
            persister.delete(&alloc_id);
        });
    }
}

/// An alloc id names a directory on this machine, so it must be one plain path component.
pub(super) fn check_alloc_id(id: &str) -> Result<(), String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if id.is_empty() || id.len() > 128 || id == "." || id == ".." || !id.chars().all(plain) {
        return Err(format!(
            "invalid alloc id {id:?}: expected 1 to 128 letters, digits, '-', '_' or '.', and not . or .."
        ));
    }
    Ok(())
}

/// Routes one runner's reports into the client: saved, then to the sync, and to the GC once
/// terminal; checkpoints are saved before the guest hears `ok`.
struct ClientStateUpdater {
    client: Weak<ClientInner>,
}

impl StateUpdater for ClientStateUpdater {
    fn alloc_state_updated(&self, alloc_id: &str, state: &AllocState) {
        if let Some(client) = self.client.upgrade() {
            client.report_state(alloc_id, state);
        }
    }

    fn checkpoint_saved(&self, alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        match self.client.upgrade() {
            Some(client) => Box::pin(client.persister.save_checkpoint(alloc_id, data)),
            None => Box::pin(std::future::ready(
                Err("the client is stopping".to_string()),
            )),
        }
    }
}

/// How long a replacement alloc must still wait before it starts, by the wall clock (the
/// server that set the time may be another machine), and never longer than the delay the
/// server gave it: a server clock ahead of this one must not hold it back more.
fn reschedule_wait(alloc: &Alloc) -> Option<std::time::Duration> {
    let reschedule = alloc.reschedule.as_ref()?;
    let decided_at = reschedule
        .history_unix_ms
        .last()
        .copied()
        .unwrap_or_default();
    let delay = reschedule.start_after_unix_ms.saturating_sub(decided_at);
    let left = reschedule
        .start_after_unix_ms
        .checked_sub(crate::util::timestamp::unix_ms_now())?;
    let wait = left.min(delay);
    (wait > 0).then(|| std::time::Duration::from_millis(wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alloc_id_must_be_one_plain_path_component() {
        assert!(check_alloc_id("0b5e3c1e-9f1a-4c1e-8d1b-3f8e2a1c9d00").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "../etc",
            "/",
            "a/b",
            "a\\b",
            &"x".repeat(129),
        ] {
            assert!(check_alloc_id(bad).is_err(), "{bad:?} accepted");
        }
    }
}
