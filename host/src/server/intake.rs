//! What nodes send, taken in groups: registrations and reports (`update_allocs`) that
//! arrive while a save is under way wait, and the next of their callers to run takes every
//! one waiting in one change of the server's state and one save (group commit). A save is a
//! disk sync; one per request made the server's sync rate, not its CPU, the limit on how
//! fast nodes joined and how many updates it took a second (1,400 a second with 5,000
//! simulated nodes, and 5 to 30 s for them to register, as the disk allowed).
//!
//! Invariants, for the reasons given:
//! - A report is answered only after the save that holds it, with what that save accepted,
//!   or with the save's error, so a client never forgets an update a restart would undo. A
//!   registration likewise, except for a node the server already holds that says nothing
//!   new of itself: it is answered yes even when its group's save fails, as it was before
//!   groups, since registering again changes nothing and a node that cannot register cannot
//!   watch (a server restarted before the node was saved does not hold it, and the node's
//!   next watch registers it again). A known node that says something new is answered as
//!   a new one: a failed save forgets what it said, and it registers again.
//! - Requests are taken in the order their calls queued them: two reports of one alloc keep
//!   their order.
//! - Whoever leads a group takes it whole and then steps aside: no caller serves others for
//!   longer than one save (leadership is a fair lock, so callers lead in the order they came).
//! - A request whose caller went away before its group was taken (its HTTP request dropped)
//!   is not applied: the client, not having heard, sends it again, and a registration
//!   applied late could bring back a node taken down meanwhile.
//! - A group holds at most [`MAX_GROUP`] requests (each report at most the HTTP API's 512
//!   updates), so that one save, and the server's lock held through it, stays bounded; the
//!   rest lead the next group.
//!
//! This module only groups; what an update does to an alloc is `apply`'s `take_updates`.

use super::{EmbeddedServer, MAX_NODES, State};
use crate::model::node::NodeInfo;
use crate::rpc::{AllocUpdate, ServerError};
use crate::util::locks::LockUnpoisoned;
use std::collections::BTreeSet;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// One caller's request, waiting for a group, with where its answer goes.
enum Request {
    Register {
        node_id: String,
        info: NodeInfo,
        answer: oneshot::Sender<Result<bool, ServerError>>,
    },
    Report {
        updates: Vec<AllocUpdate>,
        answer: oneshot::Sender<Result<Vec<String>, ServerError>>,
    },
}

/// The most requests taken in one group.
const MAX_GROUP: usize = 1024;

/// What the group's change made of one request, with where its answer goes once the save
/// is known.
enum Reply {
    /// The node was registered before this group: answered yes, saved or not.
    Known(oneshot::Sender<Result<bool, ServerError>>),
    /// Registered now (true), or refused: the server has its most nodes (false).
    Registered(oneshot::Sender<Result<bool, ServerError>>, bool),
    /// The ids of the allocs whose updates were taken.
    Accepted(
        oneshot::Sender<Result<Vec<String>, ServerError>>,
        Vec<String>,
    ),
}

impl Request {
    fn abandoned(&self) -> bool {
        match self {
            Request::Register { answer, .. } => answer.is_closed(),
            Request::Report { answer, .. } => answer.is_closed(),
        }
    }
}

/// Requests waiting, and who may take them.
#[derive(Default)]
pub(super) struct Intake {
    waiting: Mutex<Vec<Request>>,
    /// Held by the caller taking a group; tokio's mutex is fair, so the callers waiting for
    /// it lead in turn.
    leader: tokio::sync::Mutex<()>,
}

impl EmbeddedServer {
    /// Registers a node not yet known, with whatever others wait beside it; `false` when the
    /// server has its most nodes already.
    pub(super) async fn take_registration(
        &self,
        node_id: &str,
        info: NodeInfo,
    ) -> Result<bool, ServerError> {
        let (answer, answered) = oneshot::channel();
        let request = Request::Register {
            node_id: node_id.to_string(),
            info,
            answer,
        };
        self.submit(request, answered).await
    }

    /// Takes a node's report with whatever others wait beside it; see the module docs.
    pub(super) async fn take_report(
        &self,
        updates: &[AllocUpdate],
    ) -> Result<Vec<String>, ServerError> {
        let (answer, answered) = oneshot::channel();
        let request = Request::Report {
            updates: updates.to_vec(),
            answer,
        };
        self.submit(request, answered).await
    }

    /// Queues `request`, then waits for its answer, leading a group when its turn comes.
    async fn submit<T>(
        &self,
        request: Request,
        mut answered: oneshot::Receiver<Result<T, ServerError>>,
    ) -> Result<T, ServerError> {
        self.intake.waiting.lock_unpoisoned().push(request);
        loop {
            tokio::select! {
                biased;
                answer = &mut answered => {
                    return answer.unwrap_or_else(|_| {
                        Err(ServerError::Unavailable("the server dropped the request".into()))
                    });
                }
                _leading = self.intake.leader.lock() => {
                    let group: Vec<Request> = {
                        let mut waiting = self.intake.waiting.lock_unpoisoned();
                        let taken = waiting.len().min(MAX_GROUP);
                        waiting.drain(..taken).collect()
                    };
                    if !group.is_empty() {
                        self.take_group(group);
                    }
                }
            }
        }
    }

    /// Requests queued and not yet taken.
    #[cfg(test)]
    pub(super) fn requests_waiting(&self) -> usize {
        self.intake.waiting.lock_unpoisoned().len()
    }

    /// One change and one save for every request in `group`; each caller hears its own part.
    fn take_group(&self, group: Vec<Request>) {
        let reschedule_limit = self.config.reschedule_limit;
        let now_unix_ms = crate::util::timestamp::unix_ms_now();
        let mut reporting_nodes = BTreeSet::new();
        let (replies, saved) = self.change(|state, index| {
            // A request whose caller went away is not applied, nor answered.
            let replies: Vec<Reply> = group
                .into_iter()
                .filter(|request| !request.abandoned())
                .map(|request| match request {
                    Request::Register {
                        node_id,
                        info,
                        answer,
                    } if state.nodes.contains_key(&node_id) => {
                        let changed = state.add_node(&node_id, info);
                        // Registered all along at a new leader, its allocs unknown since an
                        // earlier one: they are known again too.
                        state.reconnect_node(&node_id, index);
                        if changed {
                            // What it says of itself is new: answered as a registration,
                            // so a failed save makes it register again.
                            Reply::Registered(answer, true)
                        } else {
                            Reply::Known(answer)
                        }
                    }
                    Request::Register {
                        node_id,
                        info,
                        answer,
                    } => Reply::Registered(answer, register(state, &node_id, info, index)),
                    Request::Report { updates, answer } => {
                        let accepted = state.take_updates(
                            &updates,
                            index,
                            reschedule_limit,
                            now_unix_ms,
                            &mut reporting_nodes,
                        );
                        Reply::Accepted(answer, accepted)
                    }
                })
                .collect();
            // The allocs waiting for a node are tried once for the group (`add_node` marks
            // that room was made), over every node that joined.
            replies
        });
        // Not acknowledged unless on disk: the clients keep them and send them again.
        let unsaved = saved
            .err()
            .map(|error| ServerError::Unavailable(format!("cannot save server state: {error}")));
        let mut updates_taken = 0;
        for reply in replies {
            match reply {
                Reply::Known(answer) => {
                    let _ = answer.send(Ok(true));
                }
                Reply::Registered(answer, registered) => {
                    let _ = answer.send(unsaved.clone().map_or(Ok(registered), Err));
                }
                Reply::Accepted(answer, accepted) => {
                    updates_taken += accepted.len();
                    let _ = answer.send(unsaved.clone().map_or(Ok(accepted), Err));
                }
            }
        }
        if unsaved.is_some() {
            return;
        }
        self.metrics.updates_taken(updates_taken);
        // A node busy starting its allocs may be a while between two watches; its reports
        // show it is there all the same.
        for node in &reporting_nodes {
            self.liveness.seen(node);
        }
    }
}

/// Adds a node not yet known to the nodes allocs are placed on, unless the server has its
/// most nodes (each costs the server memory and a longer node list to save). True when added.
fn register(state: &mut State, node_id: &str, info: NodeInfo, index: u64) -> bool {
    if state.nodes.len() >= MAX_NODES {
        return false;
    }
    state.add_node(node_id, info);
    // A node back from a partition: what it still runs is known again.
    state.reconnect_node(node_id, index);
    true
}

#[cfg(test)]
mod tests;
