//! Restore: at start, before the watch, gives every alloc saved by an earlier run its runner
//! back. It reads the client's records once and must not touch the server: what the server
//! wants is learned by the watch that follows.
//!
//! Invariants, each kept from the Nomad client for the reason given:
//! - Non-terminal allocs run again from their last checkpoint, so an agent restart costs a
//!   guest no more than the work since that checkpoint.
//! - Terminal ones keep their final state and are never run again: they already reported it,
//!   and running them twice would redo finished work.
//! - Collected ones stay collected, still answered for until the server drops them.
//! - A record that cannot be read fails that alloc alone; an alloc with no usable record is
//!   dropped with a WARN: one bad record must not keep the node from starting.
//! - A finished alloc whose runner cannot be rebuilt keeps its final state rather than being
//!   failed, which would rewrite history (and replace a service alloc).
//! - A state saved but never acknowledged is queued for the server again.
//! - An alloc directory no saved alloc owns (one whose removal failed, or was cut short by a
//!   crash) is removed: it would otherwise hold the node's disk for ever (see
//!   `client/leftovers.rs`, which goes on sweeping while the client runs).

use super::leftovers::{list_alloc_dirs, owned_by, remove_leftovers};
use super::runners::{Built, Restoring};
use super::{Client, ClientInner, check_alloc_id};
use crate::allocrunner::alloc_span;
use crate::model::structs::{AllocState, ClientStatus, DesiredStatus};
use crate::state::{SavedAlloc, StateError};
use crate::util::determinism::HashSet;
use std::sync::Arc;

impl Client {
    /// Gives every alloc saved by an earlier run its runner back (see the module docs) and
    /// returns how many were restored. Call once, before [`Client::start`]; a store that
    /// cannot be read at all is an error, a bad record costs only its alloc.
    pub async fn restore(&self) -> Result<usize, StateError> {
        let db = self.inner.persister.db().clone();
        let saved = crate::state::call_store(db.as_ref(), || db.client_allocs())?;
        let count = saved.len();
        self.inner.restore(saved).await;
        Ok(count)
    }
}

impl ClientInner {
    /// Restores what an earlier run saved (see [`Client::restore`]).
    async fn restore(self: &Arc<Self>, saved: Vec<SavedAlloc>) {
        let mut to_build = Vec::new();
        // The allocs whose directories stay: every saved one not yet collected.
        let owned: HashSet<String> = saved
            .iter()
            .filter(|record| !record.collected)
            .map(|record| record.alloc_id.clone())
            .collect();
        let allocs_dir = self.config.data_dir.join("allocs");
        let swept = crate::util::determinism::spawn_blocking(move || {
            let mut unowned = list_alloc_dirs(&allocs_dir);
            unowned.retain(|name| !owned_by(name, &owned));
            remove_leftovers(&allocs_dir, &unowned)
        });
        for record in saved {
            let alloc_id = record.alloc_id.clone();
            let alloc = match record.alloc {
                Some(Ok(alloc)) if check_alloc_id(&alloc.id).is_ok() && alloc.id == alloc_id => {
                    // Its log files may be newer than the owner's listing of them: a client
                    // restarted in process (nodesim's) follows one whose writer may still
                    // have written them after that.
                    self.config.alloc_logs.restored(&alloc_id);
                    Arc::new(alloc)
                }
                unusable => {
                    let why = match unusable {
                        Some(Err(reason)) => reason,
                        Some(Ok(_)) => "the saved alloc does not match its key".into(),
                        None => "no alloc record, only state".into(),
                    };
                    tracing::warn!(alloc_id, reason = %why, "dropping saved allocation with no usable record");
                    self.persister.delete(&alloc_id);
                    continue;
                }
            };
            let state = match record.state {
                Some(Err(reason)) => {
                    self.persister.restored(&alloc_id, None, false);
                    let span = alloc_span(&alloc);
                    self.fail_alloc(alloc, &span, format!("cannot restore the alloc: {reason}"));
                    continue;
                }
                Some(Ok(state)) => Some(state),
                None => None,
            };
            let acked = match record.acked {
                Some(Err(reason)) => {
                    // Only costs a resend of a state the server may already have.
                    tracing::warn!(alloc_id, reason = %reason, "ignoring unreadable acknowledged state");
                    None
                }
                Some(Ok(acked)) => Some(acked),
                None => None,
            };
            if let Some(acked) = &acked {
                self.sync.restore_acknowledged(&alloc_id, acked.clone());
            }
            if record.collected {
                // Nothing left to run or free; still answered for until the server drops it.
                let final_state = state.unwrap_or_else(|| AllocState {
                    client_status: ClientStatus::Complete,
                    description: "alloc was collected".into(),
                    task_states: Vec::new(),
                });
                self.persister
                    .restored(&alloc_id, Some(final_state.clone()), true);
                if acked.as_ref() != Some(&final_state) {
                    self.sync.put(&alloc_id, final_state.clone());
                }
                self.runnerless_lock()
                    .insert(alloc_id, (alloc, final_state));
                continue;
            }
            self.persister.restored(&alloc_id, state.clone(), false);
            if let Some(state) = &state
                && acked.as_ref() != Some(state)
            {
                // Saved but never acknowledged: the server has yet to hear it.
                self.sync.put(&alloc_id, state.clone());
            }
            to_build.push(self.runner_config(
                &alloc,
                Some(Restoring {
                    checkpoint: record.checkpoint,
                    last_state: state,
                }),
            ));
        }
        let mut built = self.build_runners(to_build);
        let (mut running, mut finished) = (0usize, 0usize);
        // Finished allocs whose runner cannot be rebuilt (often: it was deleted since, as a
        // finished job's file may well be): one line for all of them, not a WARN each.
        let mut runnerless = 0usize;
        let mut first_reason = None;
        while let Some(Built {
            alloc,
            span,
            last_state,
            runner,
        }) = built.recv().await
        {
            match (runner, last_state) {
                (Ok(runner), _) => {
                    if runner.alloc_state().client_status.is_terminal() {
                        finished += 1;
                    } else {
                        running += 1;
                    }
                    // Moving to another node when this one stopped: its checkpoint is
                    // held for its replacement again, which a restart forgot.
                    if alloc.desired_status == DesiredStatus::Evict {
                        self.hold_for_replacement(&alloc.id);
                    }
                    self.start_runner(&alloc.id, runner);
                }
                (Err(error), Some(last)) if last.client_status.is_terminal() => {
                    // Finished already: its runner is not needed to answer for it, and
                    // failing it now would rewrite history (and replace a service alloc).
                    let reason = format!("{error:#}");
                    tracing::debug!(parent: &span, error = %reason, "cannot rebuild a finished alloc's runner; keeping its final state");
                    first_reason.get_or_insert(reason);
                    runnerless += 1;
                    finished += 1;
                    self.runnerless_lock()
                        .insert(alloc.id.clone(), (alloc, last));
                }
                (Err(error), _) => self.fail_alloc(alloc, &span, format!("{error:#}")),
            }
        }
        if let Some(reason) = first_reason {
            tracing::info!(
                count = runnerless,
                first_reason = %reason,
                "{runnerless} finished allocs keep their final state without their runner, which cannot be rebuilt"
            );
        }
        let (swept, left_over) = swept.await.unwrap_or_default();
        self.metrics.set_leftover_dirs(left_over as u64);
        tracing::info!(
            running,
            finished,
            held = self.runnerless_lock().len(),
            swept,
            "restored allocations"
        );
    }
}
