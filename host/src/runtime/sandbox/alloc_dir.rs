//! An alloc's directory on the host: made when its runner starts, if the runner can reach
//! files (imports `wasi:filesystem`), removed when it is destroyed (with the alloc's log
//! files, in the same trip to the blocking pool; a runner with neither makes no trip).
//! Removal must survive whatever a guest left (any depth, odd names, links), so it goes
//! through [`crate::util::fs_tree`], never recursion, and a failure is never fatal to the agent.
//! This module touches that one directory, and the log files only through their writer.

use crate::alloc_logs::AllocLogWriter;
use crate::util::units::format_duration;
use std::path::Path;

/// Makes `alloc_dir`: one `mkdir` in the common case, its parents only on the first alloc of
/// a data dir. An existing directory (a restored alloc's) is kept as it is. Called only from
/// a runner's start, never when it is built: the client's leftover sweep relies on an alloc
/// being in its map before its directory exists. Returns whether it was made now, and so is
/// empty: what was there before is for the disk quota's first look to count.
pub(in crate::runtime) fn create_alloc_dir(alloc_dir: &Path) -> anyhow::Result<bool> {
    std::fs::create_dir(alloc_dir)
        .map(|()| true)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Ok(false),
            _ => std::fs::create_dir_all(alloc_dir).map(|()| true),
        })
        .map_err(|e| anyhow::anyhow!("cannot create alloc dir {}: {e}", alloc_dir.display()))
}

/// How often removing an alloc's directory is tried before it is left to the client's
/// leftover sweep.
const ALLOC_DIR_REMOVAL_ATTEMPTS: u32 = 5;

/// Removes what an alloc left on disk, its log files (first, and once) and its directory, on
/// the blocking pool and without recursion (a guest may have nested its directories 20,000
/// deep; see [`crate::util::fs_tree`]). A failure is reported and retried with a growing pause; it
/// is never fatal to the agent, and after the last attempt what is left is named in the log,
/// and left to the client, which sweeps directories no alloc owns at every GC interval and
/// at start.
pub(in crate::runtime) async fn remove_alloc_files(
    alloc_dir: &Path,
    mut log: Option<AllocLogWriter>,
    span: &tracing::Span,
) {
    // Doubling from a second, jittered: many allocs destroyed at once on a sick disk do
    // not all come back to it together.
    const REMOVAL_BACKOFF: crate::util::backoff::Backoff = crate::util::backoff::Backoff::new(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(60),
    );
    for attempt in 1..=ALLOC_DIR_REMOVAL_ATTEMPTS {
        let path = alloc_dir.to_path_buf();
        let log = log.take();
        // One trip for both: a short alloc's life has few enough of them that each counts.
        let removed = tokio::task::spawn_blocking(move || {
            if let Some(log) = log {
                log.remove_blocking();
            }
            crate::util::fs_tree::remove_tree(&path)
        })
        .await
        .unwrap_or_else(|join_error| Err(std::io::Error::other(join_error.to_string())));
        let Err(error) = removed else {
            return;
        };
        if attempt == ALLOC_DIR_REMOVAL_ATTEMPTS {
            tracing::error!(
                parent: span,
                path = %alloc_dir.display(),
                error = %error,
                attempts = attempt,
                "cannot remove what the alloc left; leaving it to the GC interval's sweep"
            );
            return;
        }
        let pause = REMOVAL_BACKOFF.wait(attempt);
        tracing::warn!(
            parent: span,
            path = %alloc_dir.display(),
            error = %error,
            attempt,
            retry_in = %format_duration(pause),
            "cannot remove what the alloc left; will try again"
        );
        tokio::time::sleep(pause).await;
    }
}
