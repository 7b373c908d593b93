//! The nodes' reports, taken in groups: calls of `update_allocs` that arrive while a save is
//! under way wait, and the next of them to run takes every report waiting in one change of
//! the server's state and one save (group commit). A save is a disk sync; one per report made
//! the server's save rate, not its CPU, the limit on how many updates it took per second
//! (1,400/s with 5,000 simulated nodes).
//!
//! Invariants, for the reasons given:
//! - A report is answered only after the save that holds it, with what that save accepted,
//!   or with the save's error, so a client still never forgets an update a restart would undo.
//! - Reports are taken in the order their calls queued them: two reports of one alloc keep
//!   their order.
//! - Whoever leads a group takes it whole and then steps aside: no caller serves others for
//!   longer than one save (leadership is a fair lock, so callers lead in the order they came).
//! - A caller that goes away (its HTTP request dropped) leaves its report queued: it is
//!   taken all the same, and the client, not having heard, sends it again (taking a report
//!   twice changes nothing).
//!
//! This module only groups; what an update does to an alloc is `api`'s `take_updates`.

use super::EmbeddedServer;
use crate::locks::LockUnpoisoned;
use crate::rpc::{AllocUpdate, ServerError};
use std::collections::BTreeSet;
use std::sync::Mutex;
use tokio::sync::oneshot;

type Answer = Result<Vec<String>, ServerError>;

/// One caller's report, waiting for a group.
struct Waiting {
    updates: Vec<AllocUpdate>,
    answer: oneshot::Sender<Answer>,
}

/// Reports waiting, and who may take them.
#[derive(Default)]
pub(super) struct ReportIntake {
    waiting: Mutex<Vec<Waiting>>,
    /// Held by the caller taking a group; tokio's mutex is fair, so the callers waiting for
    /// it lead in turn.
    leader: tokio::sync::Mutex<()>,
}

impl EmbeddedServer {
    /// Takes a node's report with whatever others wait beside it; see the module docs.
    pub(super) async fn take_report(&self, updates: &[AllocUpdate]) -> Answer {
        let (answer, mut answered) = oneshot::channel();
        self.intake.waiting.lock_unpoisoned().push(Waiting {
            updates: updates.to_vec(),
            answer,
        });
        loop {
            tokio::select! {
                biased;
                answer = &mut answered => {
                    return answer.unwrap_or_else(|_| {
                        Err(ServerError::Unavailable("the server dropped the report".into()))
                    });
                }
                _leading = self.intake.leader.lock() => {
                    let group = std::mem::take(&mut *self.intake.waiting.lock_unpoisoned());
                    if !group.is_empty() {
                        self.take_group(group);
                    }
                }
            }
        }
    }

    /// Reports queued and not yet taken.
    #[cfg(test)]
    pub(super) fn reports_waiting(&self) -> usize {
        self.intake.waiting.lock_unpoisoned().len()
    }

    /// One change and one save for every report in `group`; each caller hears its own part.
    fn take_group(&self, group: Vec<Waiting>) {
        let restart_limit = self.config.restart_limit;
        let now_unix_ms = crate::timestamp::unix_ms_now();
        let mut reporting_nodes = BTreeSet::new();
        let (accepted, saved) = self.change(|state, index| {
            group
                .iter()
                .map(|waiting| {
                    state.take_updates(
                        &waiting.updates,
                        index,
                        restart_limit,
                        now_unix_ms,
                        &mut reporting_nodes,
                    )
                })
                .collect::<Vec<_>>()
        });
        match saved {
            Ok(()) => {
                self.metrics
                    .updates_taken(accepted.iter().map(Vec::len).sum());
                // A node busy starting its allocs may be a while between two watches; its
                // reports show it is there all the same.
                for node in &reporting_nodes {
                    self.liveness.seen(node);
                }
                for (waiting, accepted) in group.into_iter().zip(accepted) {
                    let _ = waiting.answer.send(Ok(accepted));
                }
            }
            // Not acknowledged unless on disk: the clients keep them and send them again.
            Err(error) => {
                let error = format!("cannot save server state: {error}");
                for waiting in group {
                    let _ = waiting
                        .answer
                        .send(Err(ServerError::Unavailable(error.clone())));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
