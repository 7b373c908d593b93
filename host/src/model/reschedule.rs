//! The reschedule policy: what happens when one of a job's allocs fails (Nomad's `reschedule`
//! block). A failed alloc is replaced by a new one, not at once but after a delay that grows
//! with each replacement in its chain, up to `attempts` replacements within `interval`; past
//! that it stays failed and the job says so, until an operator acts. A runner that crashes
//! on start therefore costs a few instances spread over minutes, never a tight loop.
//!
//! A leaf: the policy as a job states it, and the arithmetic of one decision. It reads no
//! clock (callers pass the time) and knows nothing of servers or runners.

use crate::model::written::AsWritten;
use crate::util::units::{format_duration, parse_duration};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a job's failed allocs are replaced. Without a `[job.reschedule]` block a service job
/// gets [`ReschedulePolicy::service_default`] and a batch job none (see
/// [`ReschedulePolicy::default_for`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReschedulePolicy {
    /// Replacements allowed within `interval`, per chain of replacements.
    pub attempts: u32,
    /// The window `attempts` counts in.
    pub interval: Duration,
    /// The wait before the first replacement of a chain.
    pub delay: Duration,
    /// How the wait grows from one replacement to the next.
    pub delay_function: DelayFunction,
    /// The longest wait.
    pub max_delay: Duration,
    /// Replace without limit (`attempts` is then ignored; the delay still grows with the
    /// replacements within `interval`).
    pub unlimited: bool,
    /// How the block wrote its durations, to say them back as written.
    #[serde(default, skip_serializing_if = "AsWritten::is_empty")]
    pub written: AsWritten,
}

/// How the wait before a replacement grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DelayFunction {
    /// The same `delay` every time.
    Constant,
    /// `delay`, then twice that, four times, ... up to `max_delay`.
    Exponential,
}

/// The shortest `delay` a job may ask for: less would spin a crashing runner.
pub const MIN_DELAY: Duration = Duration::from_secs(1);

impl DelayFunction {
    /// The wait before the `nth` retry (from 1): `delay`, or for `exponential` twice the
    /// last one, never over `max_delay`.
    pub fn wait(self, delay: Duration, max_delay: Duration, nth: u32) -> Duration {
        match self {
            DelayFunction::Constant => delay,
            DelayFunction::Exponential => delay
                .checked_mul(1u32 << nth.saturating_sub(1).min(31))
                .unwrap_or(max_delay)
                .min(max_delay),
        }
    }

    /// `delay_function` as a job file writes it (`None`: `default`).
    pub(crate) fn parse(text: Option<&str>, default: Self) -> Result<Self, String> {
        match text {
            None => Ok(default),
            Some("constant") => Ok(DelayFunction::Constant),
            Some("exponential") => Ok(DelayFunction::Exponential),
            Some(other) => Err(format!(
                "{other:?}; expected \"constant\" or \"exponential\""
            )),
        }
    }
}

/// The rules a policy's `delay` and `max_delay` keep, in either block: the key at fault and
/// why.
pub(crate) fn check_delays(
    delay: Duration,
    max_delay: Duration,
    written: &AsWritten,
) -> Result<(), (&'static str, String)> {
    if delay < MIN_DELAY {
        return Err((
            "delay",
            format!(
                "{} is too short; at least {}: a shorter wait would spin a crashing runner",
                written.duration("delay", delay),
                format_duration(MIN_DELAY)
            ),
        ));
    }
    if max_delay < delay {
        return Err((
            "max_delay",
            format!(
                "{} is shorter than delay ({})",
                written.duration("max_delay", max_delay),
                written.duration("delay", delay)
            ),
        ));
    }
    Ok(())
}

/// Most replacement times kept in a chain's history, and so the most `attempts` a policy
/// may have (an unlimited policy's history is cut to it).
pub const MAX_HISTORY: usize = 64;

impl ReschedulePolicy {
    /// A service job's policy when it states none: `attempts` (the agent's
    /// `[server] reschedule_limit`, 3 by default) replacements an hour, 5 s apart at first,
    /// doubling up to 5 minutes.
    pub fn service_default(attempts: u32) -> Self {
        ReschedulePolicy {
            attempts,
            interval: Duration::from_secs(3600),
            delay: Duration::from_secs(5),
            delay_function: DelayFunction::Exponential,
            max_delay: Duration::from_secs(300),
            unlimited: false,
            written: AsWritten::default(),
        }
    }

    /// The policy of a job that states none: the service default for a service job; none
    /// for a batch job, whose runs may not be safe to repeat: it asks with a
    /// `[job.reschedule]` block.
    pub fn default_for(is_service: bool, attempts: u32) -> Option<Self> {
        is_service.then(|| Self::service_default(attempts))
    }

    /// What to do when an alloc fails at `now_unix_ms`, `history` being the times (Unix ms)
    /// of the replacements in its chain so far.
    pub fn decide(&self, history: &[u64], now_unix_ms: u64) -> Decision {
        let window = u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX);
        let mut recent: Vec<u64> = history
            .iter()
            .copied()
            .filter(|&at| now_unix_ms.saturating_sub(at) < window)
            .collect();
        if !self.unlimited && recent.len() >= self.attempts as usize {
            return Decision::LimitReached {
                attempts: self.attempts,
                interval: self.interval,
            };
        }
        let attempt = u32::try_from(recent.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        let delay = self
            .delay_function
            .wait(self.delay, self.max_delay, attempt);
        recent.push(now_unix_ms);
        if recent.len() > MAX_HISTORY {
            recent.drain(..recent.len() - MAX_HISTORY);
        }
        Decision::Replace {
            delay,
            attempt,
            history: recent,
        }
    }

    /// `attempts` as `job status` words it: `3` or `unlimited`.
    pub fn attempts_text(&self) -> String {
        if self.unlimited {
            "unlimited".into()
        } else {
            self.attempts.to_string()
        }
    }
}

/// What [`ReschedulePolicy::decide`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Replace the alloc after `delay`: the `attempt`-th replacement of its chain within the
    /// interval; `history` is the chain's history to carry on, this replacement included.
    Replace {
        /// The wait before the replacement may start.
        delay: Duration,
        /// Which replacement this is within the interval, from 1.
        attempt: u32,
        /// The chain's replacement times, this one included, oldest first.
        history: Vec<u64>,
    },
    /// The chain used its attempts within the interval: the alloc stays failed.
    LimitReached {
        /// The policy's attempts.
        attempts: u32,
        /// The policy's interval.
        interval: Duration,
    },
}

/// A `[job.reschedule]` block as written; unset keys take the service default's values, its
/// `attempts` being the one the parser is given (not the agent's `reschedule_limit`, which only
/// a job without the block takes).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReschedule {
    attempts: Option<i64>,
    interval: Option<String>,
    delay: Option<String>,
    delay_function: Option<String>,
    max_delay: Option<String>,
    unlimited: Option<bool>,
}

/// A bad `[job.reschedule]` key: the key and what is wrong with it.
#[derive(Debug)]
pub(crate) struct RescheduleError {
    pub(crate) key: &'static str,
    pub(crate) message: String,
}

/// Every problem of one policy block: each key's own first, then how the keys agree (checked
/// only once each key reads), so that a job file's author sees them all at once.
pub(crate) struct BlockProblems<E>(pub(crate) Vec<E>);

impl<E> BlockProblems<E> {
    /// `checked`'s value, or `None` with its problem kept.
    pub(crate) fn keep<T>(&mut self, checked: Result<T, E>) -> Option<T> {
        checked.map_err(|problem| self.0.push(problem)).ok()
    }

    /// `value` when no problem was kept, else every problem.
    pub(crate) fn or_value<T>(self, value: T) -> Result<T, Vec<E>> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(self.0)
        }
    }
}

impl RawReschedule {
    /// The policy this block states over the defaults of a service job with
    /// `default_attempts`, or every problem it has.
    pub(crate) fn parse_all(
        &self,
        default_attempts: u32,
    ) -> Result<ReschedulePolicy, Vec<RescheduleError>> {
        let base = ReschedulePolicy::service_default(default_attempts);
        let duration = |key: &'static str, text: &Option<String>, default: Duration| match text {
            None => Ok(default),
            Some(text) => parse_duration(text).map_err(|e| RescheduleError {
                key,
                message: e.to_string(),
            }),
        };
        let mut found = BlockProblems(Vec::new());
        let attempts = found.keep(match self.attempts {
            None => Ok(base.attempts),
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|&n| n as usize <= MAX_HISTORY)
                .ok_or_else(|| RescheduleError {
                    key: "attempts",
                    message: format!(
                        "{n} is out of range; expected 0 to {MAX_HISTORY} (or `unlimited = true`)"
                    ),
                }),
        });
        let delay_function = found.keep(
            DelayFunction::parse(self.delay_function.as_deref(), base.delay_function).map_err(
                |message| RescheduleError {
                    key: "delay_function",
                    message,
                },
            ),
        );
        let interval = found.keep(duration("interval", &self.interval, base.interval));
        let delay = found.keep(duration("delay", &self.delay, base.delay));
        let max_delay = found.keep(duration("max_delay", &self.max_delay, base.max_delay));
        let (Some(attempts), Some(delay_function), Some(interval), Some(delay), Some(max_delay)) =
            (attempts, delay_function, interval, delay, max_delay)
        else {
            return Err(found.0);
        };
        let policy = ReschedulePolicy {
            attempts,
            interval,
            delay,
            delay_function,
            max_delay,
            unlimited: self.unlimited.unwrap_or(base.unlimited),
            written: AsWritten::of(&[
                ("interval", &self.interval),
                ("delay", &self.delay),
                ("max_delay", &self.max_delay),
            ]),
        };
        found.keep(
            check_delays(policy.delay, policy.max_delay, &policy.written)
                .map_err(|(key, message)| RescheduleError { key, message }),
        );
        if policy.interval.is_zero() && !policy.unlimited && policy.attempts > 0 {
            found.0.push(RescheduleError {
                key: "interval",
                message: "must be longer than 0s when attempts are limited".into(),
            });
        }
        found.or_value(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE_MS: u64 = 60_000;

    #[test]
    fn the_wait_doubles_up_to_its_ceiling_and_the_attempts_run_out() {
        let policy = ReschedulePolicy {
            attempts: 5,
            max_delay: Duration::from_secs(30),
            ..ReschedulePolicy::service_default(5)
        };
        let mut history = Vec::new();
        let mut waits = Vec::new();
        let mut now = 10 * MINUTE_MS;
        loop {
            match policy.decide(&history, now) {
                Decision::Replace {
                    delay,
                    attempt,
                    history: next,
                } => {
                    assert_eq!(attempt as usize, waits.len() + 1);
                    waits.push(delay.as_secs());
                    history = next;
                    now += MINUTE_MS;
                }
                Decision::LimitReached { attempts, .. } => {
                    assert_eq!(attempts, 5);
                    break;
                }
            }
        }
        assert_eq!(waits, [5, 10, 20, 30, 30]);
    }

    #[test]
    fn replacements_older_than_the_interval_no_longer_count() {
        let policy = ReschedulePolicy {
            attempts: 1,
            delay_function: DelayFunction::Constant,
            ..ReschedulePolicy::service_default(1)
        };
        let hour = 60 * MINUTE_MS;
        assert!(matches!(
            policy.decide(&[hour], hour + MINUTE_MS),
            Decision::LimitReached { .. }
        ));
        let Decision::Replace {
            attempt, history, ..
        } = policy.decide(&[hour], 2 * hour + 1)
        else {
            panic!("the old replacement is out of the window");
        };
        assert_eq!((attempt, history), (1, vec![2 * hour + 1]));
        let unlimited = ReschedulePolicy {
            unlimited: true,
            attempts: 0,
            ..policy
        };
        let long: Vec<u64> = (0..200).collect();
        let Decision::Replace { history, .. } = unlimited.decide(&long, 300) else {
            panic!("unlimited");
        };
        assert_eq!(history.len(), MAX_HISTORY, "the history stays bounded");
        let Decision::Replace { attempt, .. } = unlimited.decide(&long, 3 * hour) else {
            panic!("unlimited");
        };
        assert_eq!(attempt, 1, "a quiet interval starts the delays over");
    }

    #[test]
    fn a_block_names_its_bad_key() {
        let raw = |text: &str| -> RawReschedule { toml::from_str(text).unwrap() };
        for (text, key, message) in [
            ("delay = \"100ms\"", "delay", "too short"),
            (
                "delay = \"1m\"\nmax_delay = \"10s\"",
                "max_delay",
                "shorter than delay",
            ),
            (
                "delay_function = \"fibonacci\"",
                "delay_function",
                "expected",
            ),
            ("attempts = -1", "attempts", "out of range"),
            ("attempts = 65", "attempts", "expected 0 to 64"),
            ("interval = \"0s\"", "interval", "longer than 0s"),
        ] {
            let error = raw(text).parse_all(3).unwrap_err().remove(0);
            assert_eq!(error.key, key, "{text}");
            assert!(error.message.contains(message), "{text}: {}", error.message);
        }
        let echoed = raw("delay = \"120s\"\nmax_delay = \"90s\"")
            .parse_all(3)
            .unwrap_err();
        assert_eq!(
            echoed[0].message, "90s is shorter than delay (120s)",
            "as written"
        );
        let policy = raw("attempts = 2\ndelay_function = \"constant\"")
            .parse_all(3)
            .unwrap();
        assert_eq!(
            (policy.attempts, policy.delay_function, policy.delay),
            (2, DelayFunction::Constant, Duration::from_secs(5))
        );
    }
}
