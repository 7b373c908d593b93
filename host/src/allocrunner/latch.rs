//! [`Latch`]: a flag that is set once and can be awaited by any number of waiters.
//! It knows nothing but tokio's `watch` channel.

use tokio::sync::watch;

/// The setting side of a [`Latch`]. Dropping it without [`LatchTrigger::set`] leaves the
/// latch unset for ever, so owners set it on every path (see the wasm runner's `finish`).
#[derive(Debug)]
pub struct LatchTrigger(watch::Sender<bool>);

/// Completes once its [`LatchTrigger`] is set; clones share the same flag.
#[derive(Debug, Clone)]
pub struct Latch(watch::Receiver<bool>);

impl Latch {
    /// A new unset latch and its trigger.
    pub fn new() -> (LatchTrigger, Latch) {
        let (sender, receiver) = watch::channel(false);
        (LatchTrigger(sender), Latch(receiver))
    }

    /// A latch that is already set.
    pub fn done() -> Latch {
        let (trigger, latch) = Latch::new();
        trigger.set();
        latch
    }

    /// True once set.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until set. Returns at once if it already is. If the trigger was dropped unset,
    /// this waits for ever, as the event it stands for never happened.
    pub async fn wait(&self) {
        let mut receiver = self.0.clone();
        if receiver.wait_for(|set| *set).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl LatchTrigger {
    /// Sets the latch, waking every waiter. Setting it again changes nothing.
    pub fn set(&self) {
        self.0.send_replace(true);
    }

    /// True once set: what `self.latch().is_set()` answers, without subscribing a waiter
    /// (the GC asks every runner, at every pass).
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// A latch that follows this trigger.
    pub fn latch(&self) -> Latch {
        Latch(self.0.subscribe())
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
}
