//! The scheduler's writer: the thread that makes each save of the elected scheduler's store
//! as fenced etcd transactions (see the parent module's docs), and how a save is cut into
//! transactions and sent.
//!
//! A save is cut into transactions of at most [`MAX_FENCED_OPS`] operations, no group split.
//! Transactions of alloc keys only (`allocs/`, `unplaced/`, `status/`: each alloc's own) that
//! touch no key of another in flight go together, up to [`IN_FLIGHT`] at once: each is one
//! round of etcd's consensus, and one after another a placement of 10,000 allocs waited for
//! 167 of them in turn. Any other transaction (a job, the counters) waits for everything
//! before it and goes alone, so that nothing lands before what it depends on. A failure still
//! ends the save with an error, and the leadership with it; the transactions already sent may
//! land, in any order among themselves, as a transaction whose answer was lost always could.

use super::super::keys;
use super::super::lease::{Fence, FencedOp, MAX_FENCED_OPS};
use super::super::store::{EtcdStore, StoreError};
use crate::state::StateError;
use std::collections::HashSet;

/// Most transactions of alloc keys in flight at once.
const IN_FLIGHT: usize = 16;

/// Writes that land together or not at all.
pub(super) type Group = Vec<FencedOp>;

/// One save: its writes, and where to say how it went.
type Save = (Vec<Group>, std::sync::mpsc::Sender<Result<(), StateError>>);

/// The thread that makes the saves (see the module docs); it ends when its sender is
/// dropped.
pub(super) struct Writer {
    saves: tokio::sync::mpsc::UnboundedSender<Save>,
}

impl Writer {
    /// `like`: the store whose cluster and access the writer's own connection copies (made
    /// on the writer's thread's runtime, which its calls must run on).
    pub(super) async fn start(like: EtcdStore, fence: Fence) -> Result<Writer, StoreError> {
        let (saves, mut pending) = tokio::sync::mpsc::unbounded_channel::<Save>();
        let (connected, connection) = tokio::sync::oneshot::channel();
        let joined = like.endpoints();
        let unreachable = |reason: String| StoreError::Unreachable {
            endpoints: joined.clone(),
            reason,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Local(format!("cannot start the scheduler's writer: {e}")))?;
        let spawned = std::thread::Builder::new()
            .name("caravan-scheduler-writer".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let store = match like.connect_again().await {
                        Ok(store) => {
                            let _ = connected.send(Ok(()));
                            store
                        }
                        Err(error) => {
                            let _ = connected.send(Err(error));
                            return;
                        }
                    };
                    while let Some((ops, answer)) = pending.recv().await {
                        let _ = answer.send(write(&store, &fence, &ops).await);
                    }
                })
            });
        if let Err(error) = spawned {
            return Err(StoreError::Local(format!(
                "cannot start the scheduler's writer: {error}"
            )));
        }
        connection
            .await
            .unwrap_or_else(|_| Err(unreachable("the scheduler's writer stopped".into())))?;
        Ok(Writer { saves })
    }

    /// Makes `ops` and waits for the answer, blocking this thread.
    pub(super) fn save(&self, ops: Vec<Group>) -> Result<(), StateError> {
        let (answer, answered) = std::sync::mpsc::channel();
        self.saves
            .send((ops, answer))
            .map_err(|_| StateError::Io("the scheduler's writer stopped".into()))?;
        answered
            .recv()
            .unwrap_or_else(|_| Err(StateError::Io("the scheduler's writer stopped".into())))
    }
}

/// Makes `groups` in fenced transactions of at most [`MAX_FENCED_OPS`], none split, sent
/// in [`waves`]: each wave's at once, the next once all of it landed.
async fn write(store: &EtcdStore, fence: &Fence, groups: &[Group]) -> Result<(), StateError> {
    for wave in waves(transactions(groups)) {
        let sent = wave
            .iter()
            .map(|transaction| store.write_fenced(fence, transaction));
        for held in futures_util::future::join_all(sent).await {
            let held = held.map_err(|e| StateError::Io(e.to_string()))?;
            if !held {
                return Err(StateError::Io(format!(
                    "this agent no longer holds {} (another agent leads): nothing more is written",
                    fence.key
                )));
            }
        }
    }
    Ok(())
}

/// `transactions` in the order given, cut into waves that may each be sent at once: up to
/// [`IN_FLIGHT`] transactions of alloc keys only with no key in common; any other
/// transaction is a wave of its own.
fn waves(transactions: Vec<Vec<FencedOp>>) -> Vec<Vec<Vec<FencedOp>>> {
    let mut waves: Vec<Vec<Vec<FencedOp>>> = Vec::new();
    let mut keys_in_wave: HashSet<String> = HashSet::new();
    let mut open = false;
    for transaction in transactions {
        let alone = !transaction.iter().all(|op| is_an_allocs_own(op.key()));
        let joins = open
            && !alone
            && waves.last().is_some_and(|wave| wave.len() < IN_FLIGHT)
            && !transaction.iter().any(|op| keys_in_wave.contains(op.key()));
        if !joins {
            waves.push(Vec::new());
            keys_in_wave.clear();
        }
        keys_in_wave.extend(transaction.iter().map(|op| op.key().to_string()));
        if let Some(wave) = waves.last_mut() {
            wave.push(transaction);
        }
        open = !alone;
    }
    waves
}

/// `groups` cut into transactions of at most [`MAX_FENCED_OPS`] operations, none split.
fn transactions(groups: &[Group]) -> Vec<Vec<FencedOp>> {
    let mut transactions: Vec<Vec<FencedOp>> = vec![Vec::new()];
    for group in groups {
        if transactions
            .last()
            .is_some_and(|t| t.len() + group.len() > MAX_FENCED_OPS)
        {
            transactions.push(Vec::new());
        }
        if let Some(transaction) = transactions.last_mut() {
            transaction.extend(group.iter().cloned());
        }
    }
    transactions.retain(|t| !t.is_empty());
    transactions
}

/// Whether `key` is one alloc's own: its placement, its wait for a node, or its state.
fn is_an_allocs_own(key: &str) -> bool {
    [
        keys::allocs_prefix(),
        keys::unplaced_prefix(),
        keys::status_prefix(),
    ]
    .iter()
    .any(|prefix| key.starts_with(prefix.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: String) -> FencedOp {
        FencedOp::Put {
            key,
            value: Vec::new(),
        }
    }

    fn placement(alloc: usize) -> Vec<FencedOp> {
        vec![
            FencedOp::Delete {
                key: keys::unplaced_key(&format!("a{alloc}")),
            },
            put(keys::alloc_key("n1", &format!("a{alloc}"))),
        ]
    }

    /// Each wave as the count of its transactions.
    fn shape(waves: &[Vec<Vec<FencedOp>>]) -> Vec<usize> {
        waves.iter().map(Vec::len).collect()
    }

    #[test]
    fn alloc_transactions_go_together_and_anything_else_alone_in_its_place() {
        let job = vec![put(keys::job_key("web"))];
        let mut transactions = vec![job.clone()];
        transactions.extend((0..40).map(placement));
        transactions.push(job.clone());
        transactions.extend((40..43).map(placement));
        let waves = waves(transactions);
        assert_eq!(
            shape(&waves),
            [1, IN_FLIGHT, IN_FLIGHT, 40 - 2 * IN_FLIGHT, 1, 3]
        );
        assert_eq!(waves[0][0], job, "the job before its allocs");
        assert_eq!(waves[4][0], job, "and after the allocs before it");
    }

    #[test]
    fn a_transaction_touching_a_key_in_flight_waits_for_it() {
        let moved = vec![
            FencedOp::Delete {
                key: keys::alloc_key("n1", "a1"),
            },
            put(keys::alloc_key("n2", "a1")),
        ];
        let waves = waves(vec![placement(1), placement(2), moved, placement(3)]);
        assert_eq!(
            shape(&waves),
            [2, 2],
            "the move waits for the placement it undoes"
        );
    }

    #[test]
    fn a_save_is_cut_between_groups_never_inside_one() {
        let groups: Vec<Group> = (0..100).map(placement).collect();
        let cut = transactions(&groups);
        assert!(
            cut.iter()
                .all(|t| t.len() <= MAX_FENCED_OPS && t.len() % 2 == 0)
        );
        assert_eq!(cut.iter().map(Vec::len).sum::<usize>(), 200);
    }
}
