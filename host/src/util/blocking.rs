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
    if super::determinism::blocking_work_runs_in_place() {
        return Ok(work());
    }
    // The semaphore is never closed: it lives as long as the process.
    let _turn = TURNS.acquire().await;
    tokio::task::spawn_blocking(work).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex};

    /// A gate work waits at, opened once.
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        opened: Condvar,
    }

    impl Gate {
        fn wait(&self) {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
        }

        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    /// Twice as much waiting work as there are turns, on a pool with one thread more than
    /// the turns: the work blocks until something that itself needs a pool thread (as a
    /// fetch's file write does) opens the gate. Without the turns every thread would hold
    /// waiting work and the gate would never open.
    #[test]
    fn work_waiting_on_the_pool_leaves_it_a_thread() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(MAX_TURNS + 1)
            .enable_time()
            .build()
            .unwrap();
        let gate = Arc::new(Gate::default());
        let finished = runtime.block_on(async {
            let started = Arc::new(AtomicUsize::new(0));
            let work: Vec<_> = (0..2 * MAX_TURNS)
                .map(|_| {
                    let (gate, started) = (gate.clone(), started.clone());
                    tokio::spawn(with_a_turn(move || {
                        started.fetch_add(1, Ordering::SeqCst);
                        gate.wait();
                    }))
                })
                .collect();
            while started.load(Ordering::SeqCst) < MAX_TURNS {
                tokio::task::yield_now().await;
            }
            let opener = gate.clone();
            let opened = tokio::task::spawn_blocking(move || opener.open());
            let all = async {
                opened.await.unwrap();
                for done in work {
                    done.await.unwrap().unwrap();
                }
            };
            // A bound on a hang, not on speed: the work is done in milliseconds.
            tokio::time::timeout(std::time::Duration::from_secs(60), all).await
        });
        // Whatever happened, nothing waits any more, so the runtime can shut down.
        gate.open();
        assert!(
            finished.is_ok(),
            "the work waited for ever: the pool had no thread left"
        );
    }
}
