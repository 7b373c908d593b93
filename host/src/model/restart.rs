//! The restart policy: what the client does when an alloc's runner crashes (Nomad's
//! `restart` block). The runner is restarted in place, in a fresh sandbox on the same node,
//! with the same alloc id, directory and log, and its last checkpoint as `restored`, after a
//! delay; up to `attempts` times within `interval`. Past that, `mode = "fail"` lets the alloc
//! fail (and the job's reschedule policy replace it), `mode = "delay"` waits for the interval
//! to end and starts counting again.
//!
//! Only a crash counts (a trap, a limit, `run` returning an error): a runner that reports its
//! tasks failed has decided their fate itself, as the task driver it is.
//!
//! A leaf: the policy as a job states it, and a tracker that decides one crash at a time. It
//! reads no clock (callers pass the time) and knows nothing of runners.

use crate::model::written::AsWritten;
use crate::util::units::parse_duration;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::Instant;

/// How an alloc's crashed runner is restarted in place. Without a `[job.restart]` block it
/// is not: the job's reschedule policy replaces the failed alloc instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartPolicy {
    /// Restarts allowed within `interval`.
    pub attempts: u32,
    /// The window `attempts` counts in, from its first restart.
    pub interval: Duration,
    /// The wait before a restart.
    pub delay: Duration,
    /// How the wait grows from one restart of a window to the next.
    pub delay_function: crate::model::reschedule::DelayFunction,
    /// The longest wait (with `exponential`).
    pub max_delay: Duration,
    /// What happens once `attempts` are used within `interval`.
    pub mode: RestartMode,
    /// How the block wrote its durations, to say them back as written.
    #[serde(default, skip_serializing_if = "AsWritten::is_empty")]
    pub written: AsWritten,
}

/// What happens once a window's restarts are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartMode {
    /// The alloc fails; its job's reschedule policy may replace it.
    Fail,
    /// Wait until the window ends, then restart and count again.
    Delay,
}

/// How the description of an alloc whose runner waits to restart begins: `restarting in 15s
/// (restart 1, at most 2 in 30m) after: ...`. `job status` finds such allocs by it.
pub const RESTARTING_DESCRIPTION_PREFIX: &str = "restarting in ";

/// The most restarts a window may allow: beyond it, a policy is a tight loop by another name.
pub const MAX_ATTEMPTS: u32 = 64;

/// The shortest `delay` a job may ask for: less would spin a crashing runner.
pub use crate::model::reschedule::MIN_DELAY;

/// The longest wait of an `exponential` policy that does not set `max_delay`.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(300);

impl RestartPolicy {
    /// Nomad's values for the keys a `[job.restart]` block leaves out: 2 restarts in 30
    /// minutes, 15 s apart, then fail.
    pub fn block_default() -> Self {
        RestartPolicy {
            attempts: 2,
            interval: Duration::from_secs(30 * 60),
            delay: Duration::from_secs(15),
            delay_function: crate::model::reschedule::DelayFunction::Constant,
            max_delay: Duration::from_secs(15),
            mode: RestartMode::Fail,
            written: AsWritten::default(),
        }
    }

    /// The wait before the `nth` restart (from 1) of a window.
    fn delay_for(&self, nth: u32) -> Duration {
        self.delay_function.wait(self.delay, self.max_delay, nth)
    }

    /// `2 in 30m`, as statuses word the limit.
    pub fn limit_text(&self) -> String {
        let interval = self.written.duration("interval", self.interval);
        format!("{} in {interval}", self.attempts)
    }

    /// A wait before a restart, as statuses word it: the job's `delay` as written when the
    /// wait is that delay, the agent's form for a wait grown from it.
    pub fn wait_text(&self, wait: Duration) -> String {
        if wait == self.delay {
            self.written.duration("delay", wait)
        } else {
            crate::util::units::format_duration(wait)
        }
    }
}

/// Counts one alloc's restarts in the current window (Nomad's restart tracker).
#[derive(Debug)]
pub struct RestartTracker {
    policy: RestartPolicy,
    window_start: Option<Instant>,
    restarts_in_window: u32,
}

/// What [`RestartTracker::on_crash`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartDecision {
    /// Start the runner again after `delay`: the `attempt`-th restart of its window.
    Restart {
        /// The wait.
        delay: Duration,
        /// Which restart of the window, from 1 (after a `delay`-mode wait, 1 again).
        attempt: u32,
    },
    /// The window's restarts are used and the mode is `fail`: the alloc fails.
    LimitReached,
}

impl RestartTracker {
    /// A tracker for `policy`, with no restart counted yet.
    pub fn new(policy: RestartPolicy) -> Self {
        RestartTracker {
            policy,
            window_start: None,
            restarts_in_window: 0,
        }
    }

    /// The policy it applies.
    pub fn policy(&self) -> &RestartPolicy {
        &self.policy
    }

    /// The runner crashed at `now`: restart it (after how long), or let the alloc fail.
    pub fn on_crash(&mut self, now: Instant) -> RestartDecision {
        let policy = &self.policy;
        if policy.attempts == 0 {
            return RestartDecision::LimitReached;
        }
        let window_over = self
            .window_start
            .is_none_or(|start| now.saturating_duration_since(start) >= policy.interval);
        if window_over {
            self.window_start = Some(now);
            self.restarts_in_window = 0;
        }
        if self.restarts_in_window < policy.attempts {
            self.restarts_in_window += 1;
            return RestartDecision::Restart {
                delay: policy.delay_for(self.restarts_in_window),
                attempt: self.restarts_in_window,
            };
        }
        match policy.mode {
            RestartMode::Fail => RestartDecision::LimitReached,
            RestartMode::Delay => {
                // The rest of the window, and never less than the delay: then a new window
                // begins, when this restart happens, with it as its first.
                let left = self
                    .window_start
                    .map_or(Duration::ZERO, |start| {
                        policy
                            .interval
                            .saturating_sub(now.saturating_duration_since(start))
                    })
                    .max(policy.delay);
                self.window_start = Some(now + left);
                self.restarts_in_window = 1;
                RestartDecision::Restart {
                    delay: left,
                    attempt: 1,
                }
            }
        }
    }
}

/// A `[job.restart]` block as written; unset keys take [`RestartPolicy::block_default`]'s.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRestart {
    attempts: Option<i64>,
    interval: Option<String>,
    delay: Option<String>,
    delay_function: Option<String>,
    max_delay: Option<String>,
    mode: Option<String>,
}

/// A bad `[job.restart]` key: the key and what is wrong with it.
#[derive(Debug)]
pub(crate) struct RestartError {
    pub(crate) key: &'static str,
    pub(crate) message: String,
}

impl RawRestart {
    /// The policy this block states, or every problem it has.
    pub(crate) fn parse_all(&self) -> Result<RestartPolicy, Vec<RestartError>> {
        use crate::model::reschedule::{BlockProblems, DelayFunction};
        let base = RestartPolicy::block_default();
        let bad = |key: &'static str, message: String| RestartError { key, message };
        let duration = |key: &'static str, text: &Option<String>| match text {
            None => Ok(None),
            Some(text) => parse_duration(text)
                .map(Some)
                .map_err(|e| bad(key, e.to_string())),
        };
        let mut found = BlockProblems(Vec::new());
        let attempts = found.keep(match self.attempts {
            None => Ok(base.attempts),
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|&n| n <= MAX_ATTEMPTS)
                .ok_or_else(|| {
                    bad(
                        "attempts",
                        format!("{n} is out of range; expected 0 to {MAX_ATTEMPTS}"),
                    )
                }),
        });
        let delay_function = found.keep(
            DelayFunction::parse(self.delay_function.as_deref(), base.delay_function)
                .map_err(|message| bad("delay_function", message)),
        );
        let mode = found.keep(match self.mode.as_deref() {
            None => Ok(base.mode),
            Some("fail") => Ok(RestartMode::Fail),
            Some("delay") => Ok(RestartMode::Delay),
            Some(other) => Err(bad(
                "mode",
                format!(
                    "{:?}; expected \"fail\" or \"delay\"",
                    crate::util::text::cut(other, 64)
                ),
            )),
        });
        let delay = found.keep(duration("delay", &self.delay));
        let interval = found.keep(duration("interval", &self.interval));
        let max_delay = found.keep(duration("max_delay", &self.max_delay));
        let (
            Some(attempts),
            Some(delay_function),
            Some(mode),
            Some(delay),
            Some(interval),
            Some(max_delay),
        ) = (attempts, delay_function, mode, delay, interval, max_delay)
        else {
            return Err(found.0);
        };
        let delay = delay.unwrap_or(base.delay);
        let policy = RestartPolicy {
            attempts,
            interval: interval.unwrap_or(base.interval),
            delay,
            delay_function,
            // Unset: 5 minutes for a growing wait (or the delay, if longer); a constant wait
            // needs no ceiling.
            max_delay: max_delay.unwrap_or(match delay_function {
                DelayFunction::Constant => delay,
                DelayFunction::Exponential => delay.max(DEFAULT_MAX_DELAY),
            }),
            mode,
            written: AsWritten::of(&[
                ("interval", &self.interval),
                ("delay", &self.delay),
                ("max_delay", &self.max_delay),
            ]),
        };
        found.keep(
            crate::model::reschedule::check_delays(policy.delay, policy.max_delay, &policy.written)
                .map_err(|(key, message)| bad(key, message)),
        );
        if policy.interval < policy.delay {
            found.0.push(bad(
                "interval",
                format!(
                    "{} is shorter than delay ({}); the window must hold at least one restart",
                    policy.written.duration("interval", policy.interval),
                    policy.written.duration("delay", policy.delay)
                ),
            ));
        }
        found.or_value(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `seconds` after a fixed start, as the tracker's clock.
    #[allow(non_snake_case, reason = "reads as the moment it names: At(120)")]
    fn At(seconds: u64) -> Instant {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *START.get_or_init(Instant::now) + Duration::from_secs(seconds)
    }

    fn policy(mode: RestartMode) -> RestartPolicy {
        RestartPolicy {
            attempts: 2,
            interval: Duration::from_secs(600),
            delay: Duration::from_secs(10),
            mode,
            ..RestartPolicy::block_default()
        }
    }

    fn restart(delay: u64, attempt: u32) -> RestartDecision {
        RestartDecision::Restart {
            delay: Duration::from_secs(delay),
            attempt,
        }
    }

    #[test]
    fn fail_mode_restarts_attempts_times_per_window_then_fails() {
        let mut tracker = RestartTracker::new(policy(RestartMode::Fail));
        assert_eq!(tracker.on_crash(At(100)), restart(10, 1));
        assert_eq!(tracker.on_crash(At(120)), restart(10, 2));
        assert_eq!(tracker.on_crash(At(140)), RestartDecision::LimitReached);
        // A crash after the window has passed starts a new one.
        assert_eq!(tracker.on_crash(At(700)), restart(10, 1));
    }

    #[test]
    fn delay_mode_waits_out_the_window_then_counts_again() {
        let mut tracker = RestartTracker::new(policy(RestartMode::Delay));
        assert_eq!(tracker.on_crash(At(100)), restart(10, 1));
        assert_eq!(tracker.on_crash(At(120)), restart(10, 2));
        // The window began at 100 and lasts 600 s: 460 s are left at 240. The restart at
        // 700 is the first of the next window, so one more fits in it, then a wait again.
        assert_eq!(tracker.on_crash(At(240)), restart(460, 1));
        assert_eq!(tracker.on_crash(At(710)), restart(10, 2));
        assert_eq!(tracker.on_crash(At(720)), restart(580, 1));
    }

    #[test]
    fn exponential_waits_double_up_to_their_ceiling() {
        let mut tracker = RestartTracker::new(RestartPolicy {
            attempts: 4,
            delay_function: crate::model::reschedule::DelayFunction::Exponential,
            max_delay: Duration::from_secs(30),
            ..policy(RestartMode::Fail)
        });
        let waits: Vec<_> = (0..4)
            .map(|i| match tracker.on_crash(At(i)) {
                RestartDecision::Restart { delay, .. } => delay.as_secs(),
                RestartDecision::LimitReached => 0,
            })
            .collect();
        assert_eq!(waits, [10, 20, 30, 30]);
    }

    #[test]
    fn no_attempts_means_no_restart() {
        let mut tracker = RestartTracker::new(RestartPolicy {
            attempts: 0,
            ..policy(RestartMode::Delay)
        });
        assert_eq!(tracker.on_crash(At(0)), RestartDecision::LimitReached);
    }

    fn parse(toml_text: &str) -> Result<RestartPolicy, String> {
        let raw: RawRestart = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        raw.parse_all()
            .map_err(|problems| format!("{}: {}", problems[0].key, problems[0].message))
    }

    #[test]
    fn a_block_takes_nomads_defaults_for_what_it_leaves_out_and_refuses_a_tight_loop() {
        assert_eq!(parse(""), Ok(RestartPolicy::block_default()));
        let growing = parse("delay_function = \"exponential\"").unwrap();
        assert_eq!(
            growing.max_delay, DEFAULT_MAX_DELAY,
            "a growing wait has a ceiling"
        );
        let policy = parse("attempts = 5\ndelay = \"2s\"\nmode = \"delay\"").unwrap();
        assert_eq!(
            (policy.attempts, policy.delay, policy.mode),
            (5, Duration::from_secs(2), RestartMode::Delay)
        );
        for (text, error) in [
            (
                "attempts = 65",
                "attempts: 65 is out of range; expected 0 to 64",
            ),
            (
                "attempts = -1",
                "attempts: -1 is out of range; expected 0 to 64",
            ),
            (
                "delay = \"100ms\"",
                "delay: 100ms is too short; at least 1s: a shorter wait would spin a crashing runner",
            ),
            (
                "mode = \"retry\"",
                "mode: \"retry\"; expected \"fail\" or \"delay\"",
            ),
            (
                "delay = \"1m\"\ninterval = \"30s\"",
                "interval: 30s is shorter than delay (1m); the window must hold at least one restart",
            ),
            (
                "delay_function = \"exponential\"\nmax_delay = \"5s\"",
                "max_delay: 5s is shorter than delay (15s)",
            ),
            (
                "delay = \"90s\"\ninterval = \"60s\"",
                "interval: 60s is shorter than delay (90s); the window must hold at least one restart",
            ),
        ] {
            assert_eq!(parse(text), Err(error.to_string()), "{text}");
        }
    }

    #[test]
    fn the_limit_reads_as_the_block_wrote_it_and_how_it_was_written_changes_nothing() {
        let written = parse("attempts = 3\ninterval = \"600s\"").unwrap();
        assert_eq!(written.limit_text(), "3 in 600s");
        let plain = parse("attempts = 3\ninterval = \"10m\"").unwrap();
        assert_eq!(plain.limit_text(), "3 in 10m");
        assert_eq!(written, plain, "600s and 10m are the same policy");
        let broken = parse("attempts = 3\ninterval = \"600\\n s\"").unwrap();
        assert_eq!(broken.limit_text(), "3 in 600 s", "said back on one line");
        let unwritten = RestartPolicy {
            interval: Duration::from_secs(600),
            ..RestartPolicy::block_default()
        };
        assert_eq!(unwritten.limit_text(), "2 in 10m");
    }
}
