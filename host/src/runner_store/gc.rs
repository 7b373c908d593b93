//! Removing builds nothing uses: a build no job version and no alloc of this node references,
//! and that nothing used for a grace period, is deleted from the store. Each round marks the
//! builds in use as used now, so a build's grace starts when the last job using it goes.
//!
//! The grace period is what keeps a build uploaded for a job that is not registered yet (a
//! `job run` between its upload and its registration), and one a job used until just now (an
//! operator who stops a job and runs it again), from being fetched again. What references a
//! build is the caller's to say: the agent knows its jobs and allocs, this module does not.

use super::RunnerStore;
use std::collections::HashSet;
use std::time::{Duration, SystemTime};

/// How long an unreferenced build is kept after its last use, unless the agent's config says
/// (`[client] runner_gc_grace`).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60 * 60);

/// Removes from `store` every build not in `referenced` whose last use is more than `grace`
/// before `now`; returns the SHA-256s removed. A build that cannot be removed is left for the
/// next round, with a WARN.
pub fn collect_unused(
    store: &RunnerStore,
    referenced: &HashSet<String>,
    grace: Duration,
    now: SystemTime,
) -> std::io::Result<Vec<String>> {
    let mut removed = Vec::new();
    let unused_since = now.checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH);
    for build in store.list()? {
        if referenced.contains(&build.sha256) {
            // In use now: its grace starts again from here, however long ago it was stored.
            store.touch(&build.sha256);
            continue;
        }
        if build.last_used > unused_since {
            continue;
        }
        match store.remove_unused(&build.sha256, unused_since) {
            Ok(true) => removed.push(build.sha256),
            Ok(false) => {}
            Err(error) => tracing::warn!(
                runner_sha256 = %build.sha256,
                error = %error,
                "cannot remove an unused runner build"
            ),
        }
    }
    if !removed.is_empty() {
        tracing::info!(
            removed = removed.len(),
            "removed runner builds no job has used for {}",
            crate::util::units::format_duration(grace)
        );
    }
    Ok(removed)
}
