//! Turns in tokio's blocking pool for work that may wait there for a runner build to arrive:
//! building an alloc's runner, loading a build for an upgrade in place, admitting a job.
//! Each may block its thread on a fetch from another agent, and the fetch writes the build
//! through tokio's files, which run on that same pool: with as many such waiters as the
//! pool has threads (512 by default), the fetch never gets one and nothing moves. One
//! process with thousands of clients (nodesim's nodes) did exactly that. A bound well under
//! the pool's size leaves the fetch its threads; past a runner's first build the work is
//! cheap, so the bound costs nothing measurable.
//!
//! A leaf: it runs what it is given, and knows nothing of what that is.

/// How much such work may hold the blocking pool at once, in the whole process.
pub const MAX_TURNS: usize = 64;

static TURNS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_TURNS);

/// Runs `work` on the blocking pool once one of [`MAX_TURNS`] turns is free, and holds the
/// turn until it is done. Dropped while it waits, nothing runs; dropped after, `work` still
/// finishes (as any blocking task does) and its turn is given back early.
pub async fn with_a_turn<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    // The semaphore is never closed: it lives as long as the process.
    let _turn = TURNS.acquire().await;
    tokio::task::spawn_blocking(work).await
}
