//! Shutting the process down: one [`Shutdown`] per command, which turns Ctrl-C and SIGTERM
//! into stages every part of the command can wait for, and knows when they have all finished.
//!
//! The stages only move forward: [`Stage::Running`], then [`Stage::Stopping`] (the first
//! Ctrl-C or SIGTERM: stop gracefully, e.g. `kill` the alloc or stop the agent), then
//! [`Stage::Abandoning`] (a second one: stop waiting for the graceful stop). Each part of the
//! command holds a [`ShutdownListener`]; dropping it says the part has finished, which
//! [`Shutdown::finished`] waits for.
//!
//! This module decides nothing about what stopping means: it never touches a runner, the
//! agent or the process's exit status. Only [`Shutdown::on_signals`] touches the operating
//! system; everything else is plain channels, so it can be tested without signals.

use anyhow::Context;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// How far the shutdown has gone. Ordered: a later stage implies the earlier ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Nobody asked to stop.
    Running,
    /// Stop gracefully: the first Ctrl-C or SIGTERM.
    Stopping,
    /// Stop waiting for the graceful stop: a second Ctrl-C or SIGTERM.
    Abandoning,
}

/// The command's side of the shutdown: asks to stop and waits until every listener is gone.
pub struct Shutdown {
    stage: Arc<watch::Sender<Stage>>,
    /// Cloned into every listener; kept here only to clone, dropped by [`Shutdown::finished`].
    finished_sender: mpsc::Sender<()>,
    finished: mpsc::Receiver<()>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A shutdown at [`Stage::Running`], with no listener yet and no signal handled.
    pub fn new() -> Self {
        let (stage, _) = watch::channel(Stage::Running);
        let (finished_sender, finished) = mpsc::channel(1);
        Shutdown {
            stage: Arc::new(stage),
            finished_sender,
            finished,
        }
    }

    /// A handle for one part of the command to wait on; [`Shutdown::finished`] waits until it
    /// is dropped. A listener made late still sees the stage already reached.
    pub fn listener(&self) -> ShutdownListener {
        ShutdownListener {
            stage: self.stage.subscribe(),
            _finished: self.finished_sender.clone(),
        }
    }

    /// The stage reached so far.
    pub fn stage(&self) -> Stage {
        *self.stage.borrow()
    }

    /// Moves to the next stage: `Running` to `Stopping`, `Stopping` to `Abandoning`. What the
    /// first and the second Ctrl-C do.
    pub fn escalate(&self) {
        advance(&self.stage, None);
    }

    /// Moves straight to `stage`, unless the shutdown is already there or further.
    pub fn advance_to(&self, stage: Stage) {
        advance(&self.stage, Some(stage));
    }

    /// From now on, each Ctrl-C (SIGINT) or SIGTERM escalates the shutdown by one stage. The
    /// handlers are installed before this returns, so a signal that arrives at any moment
    /// later is kept rather than killing the process; they stay installed for the life of
    /// the process. Call it once per `Shutdown`: each call adds a forwarder, so two would
    /// escalate twice per signal. Needs a tokio runtime; the forwarding task ends with the
    /// runtime.
    pub fn on_signals(&self) -> anyhow::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?;
        let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
        let stage = self.stage.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
                advance(&stage, None);
            }
        });
        Ok(())
    }

    /// Completes once every listener made by [`Shutdown::listener`] has been dropped: every
    /// part of the command has finished. It does not ask anything to stop by itself.
    pub async fn finished(self) {
        let Shutdown {
            finished_sender,
            mut finished,
            ..
        } = self;
        drop(finished_sender);
        // Nothing is ever sent: `None` means every sender, one per listener, is gone.
        let _ = finished.recv().await;
    }
}

/// One part of the command's view of the shutdown. Dropping it tells [`Shutdown::finished`]
/// this part is done.
pub struct ShutdownListener {
    stage: watch::Receiver<Stage>,
    _finished: mpsc::Sender<()>,
}

impl ShutdownListener {
    /// The stage reached so far.
    pub fn stage(&self) -> Stage {
        *self.stage.borrow()
    }

    /// Whether anyone asked to stop.
    pub fn is_stopping(&self) -> bool {
        self.stage() >= Stage::Stopping
    }

    /// Completes once the shutdown reaches [`Stage::Stopping`] (at once if it has).
    /// Cancel-safe.
    pub async fn stopping(&mut self) {
        self.reached(Stage::Stopping).await;
    }

    /// Completes once the shutdown reaches [`Stage::Abandoning`] (at once if it has).
    /// Cancel-safe.
    pub async fn abandoning(&mut self) {
        self.reached(Stage::Abandoning).await;
    }

    async fn reached(&mut self, stage: Stage) {
        // An error means the `Shutdown` is gone, so the stage can never be reached: wait
        // forever rather than pretend it was.
        if self.stage.wait_for(|now| *now >= stage).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Moves `stage` forward: to `target` if given and further on, else one stage on.
fn advance(stage: &watch::Sender<Stage>, target: Option<Stage>) {
    stage.send_if_modified(|now| {
        let next = target.unwrap_or(match *now {
            Stage::Running => Stage::Stopping,
            Stage::Stopping | Stage::Abandoning => Stage::Abandoning,
        });
        if next > *now {
            *now = next;
            true
        } else {
            false
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[tokio::test]
    async fn the_first_escalation_asks_to_stop_and_the_second_to_stop_waiting() {
        let shutdown = Shutdown::new();
        let mut listener = shutdown.listener();
        assert!(!listener.is_stopping());
        assert!(listener.stopping().now_or_never().is_none());

        shutdown.escalate();
        assert_eq!(shutdown.stage(), Stage::Stopping);
        assert!(listener.stopping().now_or_never().is_some());
        assert!(listener.abandoning().now_or_never().is_none());

        shutdown.escalate();
        assert_eq!(listener.stage(), Stage::Abandoning);
        assert!(listener.abandoning().now_or_never().is_some());
        assert!(
            listener.stopping().now_or_never().is_some(),
            "a later stage implies the earlier ones"
        );
    }

    #[tokio::test]
    async fn a_listener_waiting_is_woken_and_a_late_listener_sees_the_stage_reached() {
        let shutdown = Shutdown::new();
        let mut early = shutdown.listener();
        let waiting = tokio::spawn(async move { early.stopping().await });
        shutdown.escalate();
        waiting.await.unwrap();

        let late = shutdown.listener();
        assert!(late.is_stopping());
    }

    #[test]
    fn stages_never_move_back() {
        let shutdown = Shutdown::new();
        shutdown.advance_to(Stage::Abandoning);
        shutdown.advance_to(Stage::Stopping);
        shutdown.escalate();
        assert_eq!(shutdown.stage(), Stage::Abandoning);
    }

    #[tokio::test]
    async fn finished_waits_for_every_listener_to_be_dropped() {
        let shutdown = Shutdown::new();
        let first = shutdown.listener();
        let second = shutdown.listener();
        let mut finished = Box::pin(shutdown.finished());
        assert!((&mut finished).now_or_never().is_none());
        drop(first);
        assert!((&mut finished).now_or_never().is_none());
        drop(second);
        assert!(finished.now_or_never().is_some());
    }

    #[tokio::test]
    async fn with_no_listener_finished_completes_at_once() {
        assert!(Shutdown::new().finished().now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_listener_whose_shutdown_is_gone_never_sees_a_stop() {
        let shutdown = Shutdown::new();
        let mut listener = shutdown.listener();
        drop(shutdown);
        assert!(listener.stopping().now_or_never().is_none());
    }
}
