//! Alloc directories that no alloc owns, removed: at start, what a crash or a failed removal
//! left; then at every GC interval, what a destroy could not remove since (its own retries
//! given up), so a cleanup that fails is retried for as long as the agent runs.
//!
//! A directory is swept only when no alloc the client holds owns it (a runner in its map not
//! yet destroyed, an alloc held without a runner, or one being destroyed), and, while the
//! client runs, only when it was unowned at two sweeps in a row. That relies on one order,
//! which the runtime keeps: an alloc's directory is made by its runner's start, after the
//! client has put the runner in its map, so a directory listed belongs to an alloc already
//! there. Removal goes through [`crate::util::fs_tree`], without
//! recursion. Each removal and each failure is logged with its path, and the count still left
//! is the `caravan_client_leftover_dirs` gauge. This module removes directories under
//! `<data_dir>/allocs` and touches nothing else.

use super::ClientInner;
use crate::util::determinism::HashSet;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Weak;

/// Removes every directory under `allocs_dir` named in `names`; returns how many were removed
/// and how many could not be (each logged with its path).
pub(super) fn remove_leftovers(allocs_dir: &Path, names: &[OsString]) -> (usize, usize) {
    let (mut removed, mut failed) = (0, 0);
    for name in names {
        let path = allocs_dir.join(name);
        match crate::util::fs_tree::remove_tree(&path) {
            Ok(()) => {
                removed += 1;
                tracing::info!(path = %path.display(), "removed an alloc directory no alloc owns");
            }
            Err(error) => {
                failed += 1;
                tracing::warn!(
                    path = %path.display(),
                    error = %error,
                    "cannot remove an alloc directory no alloc owns; will try again at the next GC interval"
                );
            }
        }
    }
    (removed, failed)
}

/// The names of the entries under `allocs_dir` (whatever their bytes: a name that is not
/// UTF-8 is no alloc's, and is a leftover too); none when it does not exist yet.
pub(super) fn list_alloc_dirs(allocs_dir: &Path) -> Vec<OsString> {
    let Ok(entries) = std::fs::read_dir(allocs_dir) else {
        return Vec::new();
    };
    entries.flatten().map(|entry| entry.file_name()).collect()
}

/// Whether `name` is the directory of one of `owners`.
pub(super) fn owned_by(name: &OsString, owners: &HashSet<String>) -> bool {
    name.to_str().is_some_and(|name| owners.contains(name))
}

impl ClientInner {
    /// Every alloc whose directory is its own: a runner in the map not yet destroyed (a
    /// destroyed one stays listed until the server drops it, and its directory is then a
    /// leftover if its removal failed), one held without a runner, or one being destroyed (a
    /// destroy removes its directory itself).
    fn alloc_dir_owners(&self) -> HashSet<String> {
        let mut owners: HashSet<String> = self
            .runners_lock()
            .iter()
            .filter(|(_, runner)| !runner.is_destroyed())
            .map(|(alloc_id, _)| alloc_id.clone())
            .collect();
        owners.extend(self.runnerless_lock().keys().cloned());
        owners.extend(self.gc.destroying_ids());
        owners
    }
}

/// Sweeps leftovers at every GC interval until the client is dropped (see the module docs).
pub(super) async fn sweep_loop(client: Weak<ClientInner>) {
    let Some(interval) = client.upgrade().map(|c| c.config.gc.interval) else {
        return;
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    // Unowned at the last sweep: removed if still unowned at this one.
    let mut suspects: HashSet<OsString> = HashSet::default();
    loop {
        ticker.tick().await;
        let Some(inner) = client.upgrade() else {
            return;
        };
        let allocs_dir = inner.config.data_dir.join("allocs");
        // Listed before the owners are read: a directory listed was made by an alloc
        // already in the map.
        let listing = allocs_dir.clone();
        let Ok(listed) =
            crate::util::determinism::spawn_blocking(move || list_alloc_dirs(&listing)).await
        else {
            continue;
        };
        let owners = inner.alloc_dir_owners();
        let unowned: HashSet<OsString> = listed
            .into_iter()
            .filter(|name| !owned_by(name, &owners))
            .collect();
        let due: Vec<OsString> = unowned.intersection(&suspects).cloned().collect();
        if unowned.is_empty() {
            inner.metrics.set_leftover_dirs(0);
        }
        suspects = unowned;
        if due.is_empty() {
            continue;
        }
        let metrics = inner.metrics.clone();
        drop(inner);
        // What is removed is not listed next time; what failed is, and is tried again.
        let removal =
            crate::util::determinism::spawn_blocking(move || remove_leftovers(&allocs_dir, &due));
        if let Ok((_removed, failed)) = removal.await {
            metrics.set_leftover_dirs(failed as u64);
        }
    }
}
