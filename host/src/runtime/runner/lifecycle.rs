//! Where one wasm runner is in its life, as one value: its [`Phase`] and what it was asked
//! to do (stop by `shutdown`, stop by `kill`, free by `destroy`).
//!
//! Each [`Lifecycle`] method is one transition, taken under the runner's lock and answering
//! what the caller must do next, so two callers racing (a kill from the GC, a shutdown from
//! the agent, the guest returning) can never both act on the same step. This module decides
//! only; it sends no event, touches no store and logs nothing.

/// How far the runner got. It only moves forward: `NotStarted` -> `Running` -> `Finished`,
/// or straight from `NotStarted` to `Finished` when it is stopped before it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `run` was not called yet; the guest has no store.
    NotStarted,
    /// The guest's `run` was started; its final state is not recorded yet.
    Running,
    /// The final state is recorded, or is being recorded by the one caller that moved here.
    Finished,
}

/// What a stop request asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopStep {
    /// The same request was made before: nothing to do.
    AlreadyAsked,
    /// The runner never ran and now never will: record that as its final state.
    NeverStarted,
    /// The guest is running: send it the event and start the kill timeout.
    AskGuest,
    /// The runner already finished; a kill may still make a non-terminal state terminal.
    AlreadyFinished,
}

/// One runner's lifecycle. Not thread-safe by itself: the runner keeps it behind a lock.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    phase: Phase,
    shutdown_asked: bool,
    kill_asked: bool,
    destroy_asked: bool,
}

impl Lifecycle {
    /// A runner that has not run yet, or (for a restored terminal alloc) one that is finished
    /// and must never run.
    pub fn new(finished: bool) -> Self {
        Lifecycle {
            phase: if finished {
                Phase::Finished
            } else {
                Phase::NotStarted
            },
            shutdown_asked: false,
            kill_asked: false,
            destroy_asked: false,
        }
    }

    /// The phase now.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// `run` was called: true for the one call that may start the guest.
    pub fn start(&mut self) -> bool {
        let first = self.phase == Phase::NotStarted;
        if first {
            self.phase = Phase::Running;
        }
        first
    }

    /// A `kill` request (stop, evict, destroy).
    pub fn ask_kill(&mut self) -> StopStep {
        if std::mem::replace(&mut self.kill_asked, true) {
            return StopStep::AlreadyAsked;
        }
        self.stop_step(true)
    }

    /// A `shutdown` request (the agent stopping, not the alloc).
    pub fn ask_shutdown(&mut self) -> StopStep {
        if std::mem::replace(&mut self.shutdown_asked, true) {
            return StopStep::AlreadyAsked;
        }
        self.stop_step(false)
    }

    fn stop_step(&mut self, kill: bool) -> StopStep {
        match self.phase {
            Phase::NotStarted => {
                self.phase = Phase::Finished;
                StopStep::NeverStarted
            }
            Phase::Running => StopStep::AskGuest,
            // A shutdown of a finished runner has nothing left to ask.
            Phase::Finished if kill => StopStep::AlreadyFinished,
            Phase::Finished => StopStep::AlreadyAsked,
        }
    }

    /// The guest's run ended (returned, trapped, or timed out): true for the one caller that
    /// records the final state.
    pub fn finish(&mut self) -> bool {
        let first = self.phase == Phase::Running;
        if first {
            self.phase = Phase::Finished;
        }
        first
    }

    /// A `destroy` request: true the first time only.
    pub fn ask_destroy(&mut self) -> bool {
        !std::mem::replace(&mut self.destroy_asked, true)
    }

    /// Whether a kill was asked; it outranks a pending shutdown.
    pub fn kill_asked(&self) -> bool {
        self.kill_asked
    }

    /// Whether a stop of any kind was asked.
    pub fn stop_asked(&self) -> bool {
        self.kill_asked || self.shutdown_asked
    }

    /// Whether the run ends by a shutdown alone, so the alloc stays non-terminal and is
    /// restored later.
    pub fn shut_down_only(&self) -> bool {
        self.shutdown_asked && !self.kill_asked
    }
}

#[cfg(test)]
mod tests {
    use super::{Lifecycle, Phase, StopStep};

    #[test]
    fn a_runner_starts_once_and_finishes_once() {
        let mut lifecycle = Lifecycle::new(false);
        assert!(lifecycle.start());
        assert!(
            !lifecycle.start(),
            "a second run must not start the guest again"
        );
        assert_eq!(lifecycle.phase(), Phase::Running);
        assert!(lifecycle.finish());
        assert!(!lifecycle.finish(), "the final state is recorded once");
        assert_eq!(lifecycle.phase(), Phase::Finished);
    }

    #[test]
    fn a_stop_before_run_finishes_it_and_run_then_does_nothing() {
        for ask in [Lifecycle::ask_kill, Lifecycle::ask_shutdown] {
            let mut lifecycle = Lifecycle::new(false);
            assert_eq!(ask(&mut lifecycle), StopStep::NeverStarted);
            assert_eq!(lifecycle.phase(), Phase::Finished);
            assert!(!lifecycle.start());
            assert!(
                !lifecycle.finish(),
                "NeverStarted is the final state already"
            );
        }
    }

    #[test]
    fn each_stop_is_asked_of_the_guest_once_and_a_kill_outranks_a_shutdown() {
        let mut lifecycle = Lifecycle::new(false);
        lifecycle.start();
        assert_eq!(lifecycle.ask_shutdown(), StopStep::AskGuest);
        assert_eq!(lifecycle.ask_shutdown(), StopStep::AlreadyAsked);
        assert!(lifecycle.shut_down_only());
        assert_eq!(lifecycle.ask_kill(), StopStep::AskGuest);
        assert_eq!(lifecycle.ask_kill(), StopStep::AlreadyAsked);
        assert!(lifecycle.kill_asked() && !lifecycle.shut_down_only());
    }

    #[test]
    fn after_the_end_only_a_kill_has_something_left_to_do() {
        let mut lifecycle = Lifecycle::new(false);
        lifecycle.start();
        lifecycle.finish();
        assert_eq!(lifecycle.ask_shutdown(), StopStep::AlreadyAsked);
        assert_eq!(lifecycle.ask_kill(), StopStep::AlreadyFinished);
    }

    #[test]
    fn a_restored_terminal_runner_never_runs_and_destroy_is_asked_once() {
        let mut lifecycle = Lifecycle::new(true);
        assert_eq!(lifecycle.phase(), Phase::Finished);
        assert!(!lifecycle.start());
        assert_eq!(lifecycle.ask_kill(), StopStep::AlreadyFinished);
        assert!(lifecycle.ask_destroy());
        assert!(!lifecycle.ask_destroy());
    }
}
