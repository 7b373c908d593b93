//! [`Latch`]: a flag that is set once and can be awaited by any number of waiters.
//! It knows nothing but an atomic flag and tokio's `Notify`.
//!
//! Every live alloc holds several (stopped, destroyed, a stop asked, a kill sent, an upgrade
//! asked), so a latch is kept small: a flag and a waiter list, about 64 bytes, where a
//! `watch` channel took over 300.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

#[derive(Debug, Default)]
struct Flag {
    set: AtomicBool,
    waiters: Notify,
}

/// The setting side of a [`Latch`]. Dropping it without [`LatchTrigger::set`] leaves the
/// latch unset for ever, so owners set it on every path (see the wasm runner's `finish`).
#[derive(Debug)]
pub struct LatchTrigger(Arc<Flag>);

/// Completes once its [`LatchTrigger`] is set; clones share the same flag.
#[derive(Debug, Clone)]
pub struct Latch(Arc<Flag>);

impl Latch {
    /// A new unset latch and its trigger.
    pub fn new() -> (LatchTrigger, Latch) {
        let flag = Arc::new(Flag::default());
        (LatchTrigger(flag.clone()), Latch(flag))
    }

    /// A latch that is already set.
    pub fn done() -> Latch {
        let (trigger, latch) = Latch::new();
        trigger.set();
        latch
    }

    /// True once set.
    pub fn is_set(&self) -> bool {
        self.0.set.load(Ordering::Acquire)
    }

    /// Waits until set. Returns at once if it already is. If the trigger was dropped unset,
    /// this waits for ever, as the event it stands for never happened. Cancel-safe.
    pub async fn wait(&self) {
        loop {
            let notified = self.0.waiters.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the flag is read: a `set` between the read and the await
            // still wakes this waiter.
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

impl LatchTrigger {
    /// Sets the latch, waking every waiter. Setting it again changes nothing.
    pub fn set(&self) {
        self.0.set.store(true, Ordering::Release);
        self.0.waiters.notify_waiters();
    }

    /// True once set: what `self.latch().is_set()` answers.
    pub fn is_set(&self) -> bool {
        self.0.set.load(Ordering::Acquire)
    }

    /// A latch that follows this trigger.
    pub fn latch(&self) -> Latch {
        Latch(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_before_and_after_setting_all_complete() {
        let (trigger, latch) = Latch::new();
        let early = tokio::spawn({
            let latch = latch.clone();
            async move { latch.wait().await }
        });
        assert!(!latch.is_set());
        trigger.set();
        early.await.unwrap();
        latch.wait().await;
        assert!(trigger.latch().is_set());
        assert!(trigger.is_set());
        assert!(Latch::done().is_set());
    }

    #[tokio::test]
    async fn every_waiter_already_waiting_is_woken_by_the_set() {
        let (trigger, latch) = Latch::new();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let latch = latch.clone();
                tokio::spawn(async move { latch.wait().await })
            })
            .collect();
        // On this one-thread runtime, yielding lets the waiters run until they wait.
        tokio::task::yield_now().await;
        assert!(waiters.iter().all(|waiter| !waiter.is_finished()));
        trigger.set();
        for waiter in waiters {
            // A lost wake-up fails here rather than hanging the test run.
            tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
                .await
                .expect("the set wakes every waiter")
                .unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_latch_whose_trigger_is_dropped_unset_never_completes() {
        let (trigger, latch) = Latch::new();
        drop(trigger);
        let waited = tokio::time::timeout(std::time::Duration::from_secs(3600), latch.wait());
        assert!(waited.await.is_err());
    }
}
