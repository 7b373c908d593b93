//! The server watch: registering the node, watching the server's allocs for it, and applying
//! each answer to the alloc map. It must not build, run or destroy runners itself: an answer
//! becomes calls on the map's own operations (add, update, remove) and on the persister.
//!
//! Invariants, each kept from the Nomad client for the reason given:
//! - Each watch result is diffed by modify index into added, updated, removed and ignored:
//!   the server is the source of truth and a stale or repeated answer changes nothing.
//! - Updates for an alloc whose runner could not be built are ignored, its removal is not:
//!   it stays failed until the server drops it.
//! - New allocs are on disk before any runner is built (one commit for the lot): a crash
//!   between the two must not leave a runner nothing would restore.
//! - Every error is retried with backoff, and the node registers again after one: the server
//!   may have restarted and forgotten it.

use super::{Client, ClientInner, check_alloc_id, sync};
use crate::allocrunner::alloc_span;
use crate::rpc::{NodeAllocs, ServerError};
use crate::util::determinism::{HashMap, HashSet};
use crate::util::locks::LockUnpoisoned;
use std::sync::{Arc, Weak};

/// How an alloc diff sorts the server's answer. Each list is sorted by id, so a caller may
/// look an id up with a binary search.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AllocDiff {
    /// On the server, not on the client.
    pub added: Vec<String>,
    /// On both, with a higher modify index on the server.
    pub updated: Vec<String>,
    /// On the client, no longer on the server.
    pub removed: Vec<String>,
    /// On both, unchanged (or failed on the client and so ignored).
    pub ignored: Vec<String>,
}

/// Diffs the client's allocs (id -> modify index) against the server's. Ids in `failed`
/// are allocs whose runner could not be built: never updated, only removed.
pub fn diff_allocs(
    client: &HashMap<String, u64>,
    failed: &HashMap<String, u64>,
    server: &HashMap<String, u64>,
) -> AllocDiff {
    let mut diff = AllocDiff::default();
    for (id, &server_index) in server {
        match client.get(id) {
            _ if failed.contains_key(id) => diff.ignored.push(id.clone()),
            None => diff.added.push(id.clone()),
            Some(&client_index) if server_index > client_index => diff.updated.push(id.clone()),
            Some(_) => diff.ignored.push(id.clone()),
        }
    }
    for id in client.keys().chain(failed.keys()) {
        if !server.contains_key(id) {
            diff.removed.push(id.clone());
        }
    }
    for list in [
        &mut diff.added,
        &mut diff.updated,
        &mut diff.removed,
        &mut diff.ignored,
    ] {
        list.sort();
    }
    diff
}

impl Client {
    /// Applies one watch answer, as the watch loop does. Public so tests and simulators can
    /// feed a client answers of their own; new allocs are saved first, so the client must
    /// have been started (its state-saving loop running).
    pub async fn apply(&self, answer: &NodeAllocs) -> Result<(), ServerError> {
        self.inner.apply(answer).await
    }
}

impl ClientInner {
    async fn apply(self: &Arc<Self>, answer: &NodeAllocs) -> Result<(), ServerError> {
        let client: HashMap<String, u64> = {
            let runners: Vec<_> = self
                .runners_lock()
                .iter()
                .map(|(id, r)| (id.clone(), r.clone()))
                .collect();
            runners
                .into_iter()
                .map(|(id, runner)| (id, runner.alloc().modify_index))
                .collect()
        };
        let failed: HashMap<String, u64> = self
            .runnerless_lock()
            .iter()
            .map(|(id, (alloc, _))| (id.clone(), alloc.modify_index))
            .collect();
        let diff = diff_allocs(&client, &failed, &answer.allocs);
        // Allocs still arriving are in neither map: one the server dropped meanwhile is
        // removed here, or its runner would start after its checkpoint came.
        let dropped_arriving: Vec<String> = {
            let arriving = self.arriving.lock_unpoisoned();
            let dropped = arriving
                .keys()
                .filter(|id| !answer.allocs.contains_key(*id));
            dropped.cloned().collect()
        };
        tracing::debug!(
            added = diff.added.len(),
            updated = diff.updated.len(),
            removed = diff.removed.len(),
            ignored = diff.ignored.len(),
            "allocation updates"
        );

        let wanted: Vec<String> = diff.added.iter().chain(&diff.updated).cloned().collect();
        let fetched = if wanted.is_empty() {
            Vec::new()
        } else {
            self.server.get_allocs(&wanted).await?
        };
        // Each requested alloc once; what the server sends besides is not ours to add.
        let mut seen = HashSet::default();
        let (mut added, mut updated) = (Vec::new(), Vec::new());
        for alloc in fetched {
            if !seen.insert(alloc.id.clone()) {
                continue;
            }
            // The diff's lists are sorted: a scan per alloc was quadratic in a big answer.
            if diff.added.binary_search(&alloc.id).is_ok() {
                added.push(alloc);
            } else {
                updated.push(alloc);
            }
        }
        // The fetch took a while: an alloc an earlier answer added may have its runner by
        // now (one moved here from a drained node starts on a task of its own), or be about
        // to. It is not added again: failing it when that second save fails would report a
        // running alloc failed, and the GC would destroy it. A newer version of it still
        // counts: one still arriving keeps it for its runner to start with (see `migrate`),
        // one whose runner started since gets it as an update. Dropped, a stop sent
        // meanwhile would reach the runner only with a later answer.
        let (mut arriving_newer, mut started_since) = (Vec::new(), Vec::new());
        {
            let (runners, mut arriving) = (self.runners_lock(), self.arriving.lock_unpoisoned());
            added.retain(|alloc| {
                if let Some(known) = arriving.get_mut(&alloc.id) {
                    if alloc.modify_index > known.modify_index {
                        *known = alloc.clone();
                        arriving_newer.push(alloc.clone());
                    }
                    return false;
                }
                let Some(runner) = runners.get(&alloc.id) else {
                    return true;
                };
                started_since.push((alloc.clone(), runner.clone()));
                false
            });
        }
        // One whose runner could not be built since (failed, held without a runner) is
        // known too.
        {
            let runnerless = self.runnerless_lock();
            added.retain(|alloc| !runnerless.contains_key(&alloc.id));
        }
        for alloc in arriving_newer {
            self.persister.save_alloc_update(alloc);
        }
        for (alloc, runner) in started_since {
            if alloc.modify_index > runner.alloc().modify_index {
                updated.push(alloc);
            }
        }
        // New allocs are on disk before any runner is built: one commit for the lot.
        let (valid, invalid): (Vec<_>, Vec<_>) = added
            .into_iter()
            .partition(|alloc| check_alloc_id(&alloc.id).is_ok());
        for alloc in invalid {
            let reason = check_alloc_id(&alloc.id).unwrap_err();
            self.fail_alloc(alloc.clone(), &alloc_span(&alloc), reason);
        }
        // Updates and removals wait on no commit: they are queued behind whatever the
        // persister holds, in order, and reach the runners at once. They go before the new
        // allocs' commit, which a failing disk holds through the persister's backoff: a stop
        // that waited for it would keep its alloc running that much longer.
        for alloc in updated {
            self.persister.save_alloc_update(alloc.clone());
            self.update_alloc(alloc);
        }
        for alloc_id in diff.removed.iter().chain(&dropped_arriving) {
            self.remove_alloc(alloc_id);
        }
        if !valid.is_empty() {
            match self.persister.save_allocs(&valid).await {
                Ok(()) => self.add_allocs(&valid).await,
                Err(error) => {
                    for alloc in valid {
                        let reason = format!("cannot save the alloc before running it: {error}");
                        self.fail_alloc(alloc.clone(), &alloc_span(&alloc), reason);
                    }
                }
            }
        }
        if !diff.added.is_empty() || !diff.updated.is_empty() || !diff.removed.is_empty() {
            self.gc.trigger();
        }
        Ok(())
    }
}

/// Registers the node, then watches the server's allocs for it and applies each change.
/// Every error is retried with backoff; the loop ends when the client is dropped.
pub(super) async fn watch_loop(client: Weak<ClientInner>) {
    let mut failures = 0u32;
    let mut index = 0u64;
    let mut registered = false;
    loop {
        let Some(inner) = client.upgrade() else {
            return;
        };
        let (server, node_id, wait) = (
            inner.server.clone(),
            inner.config.node_id.clone(),
            inner.config.watch_wait,
        );
        drop(inner);
        let result = async {
            if !registered {
                let info = client
                    .upgrade()
                    .map(|inner| inner.config.node_info.clone())
                    .unwrap_or_default();
                server.register_node(&node_id, &info).await?;
                registered = true;
                tracing::info!(node_id = %node_id, "node registered");
            }
            let answer = server.watch_allocs(&node_id, index, wait).await?;
            let Some(inner) = client.upgrade() else {
                return Ok(());
            };
            inner.sync.contacted();
            inner.apply(&answer).await?;
            index = answer.index;
            Ok::<(), ServerError>(())
        }
        .await;
        match result {
            Ok(()) => failures = 0,
            Err(error) => {
                failures += 1;
                // The server may have lost the node (a restart): register again.
                registered = false;
                let wait = sync::backoff(failures);
                tracing::warn!(error = %error, retry_in_ms = wait.as_millis() as u64, "error watching allocations");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, u64)]) -> HashMap<String, u64> {
        entries
            .iter()
            .map(|(id, index)| (id.to_string(), *index))
            .collect()
    }

    #[test]
    fn the_diff_sorts_server_allocs_by_modify_index() {
        let client = map(&[("same", 3), ("newer", 3), ("gone", 1)]);
        let server = map(&[("same", 3), ("newer", 4), ("new", 1)]);
        let diff = diff_allocs(&client, &HashMap::default(), &server);
        assert_eq!(diff.added, ["new"]);
        assert_eq!(diff.updated, ["newer"]);
        assert_eq!(diff.removed, ["gone"]);
        assert_eq!(diff.ignored, ["same"]);
    }

    #[test]
    fn an_older_index_from_the_server_is_ignored_not_applied() {
        let diff = diff_allocs(&map(&[("a", 5)]), &HashMap::default(), &map(&[("a", 4)]));
        assert_eq!(diff.ignored, ["a"]);
        assert!(diff.updated.is_empty());
    }

    #[test]
    fn updates_for_a_failed_alloc_are_ignored_and_its_removal_is_not() {
        let failed = map(&[("bad", 1), ("dropped", 1)]);
        let diff = diff_allocs(&HashMap::default(), &failed, &map(&[("bad", 7)]));
        assert_eq!(diff.ignored, ["bad"]);
        assert_eq!(diff.removed, ["dropped"]);
        assert!(diff.added.is_empty());
    }
}
