//! A runner's last words: the last few lines it wrote to stderr or logged at ERROR, kept so
//! that when it traps, the alloc's description can say what the guest said before it died (a
//! Rust panic's location and message, a Python traceback's last line, a JavaScript
//! exception), not only which wasm instruction stopped it.
//!
//! Bounded whatever the guest writes: at most [`LINES`] lines of at most [`LINE_BYTES`] bytes
//! each, their buffers reused; only lines heard within [`RECENT`] of the trap are told.
//! Lines are heard whether or not the log's rate limit admitted them, so a runner that floods
//! its log and then panics still has its panic named. Stack
//! frames (indented lines) and the toolchains' boilerplate are not words: they would push the
//! message out and mean nothing to an operator without the guest's sources.
//!
//! This module only keeps text; [`crate::runtime::imports::logging`] feeds it and [`crate::runtime::runner::outcome`] reads it.

use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// How many lines are kept: a Rust panic takes two (where, then what).
pub const LINES: usize = 3;

/// The longest line kept, in bytes; longer ones are cut with a marker.
pub const LINE_BYTES: usize = 240;

/// How recent a line must be to count as last words: a crash prints its message just before
/// it traps, and a startup warning from an hour ago is not why it died.
pub const RECENT: Duration = Duration::from_secs(5);

/// The last [`LINES`] lines heard, oldest first, each with when it was heard.
#[derive(Default)]
pub struct LastWords {
    lines: VecDeque<(Instant, String)>,
}

impl LastWords {
    /// Keeps `line`, heard at `now`, as the newest of the last words, unless it is a stack
    /// frame or a toolchain's boilerplate.
    pub fn hear(&mut self, line: &str, now: Instant) {
        if !is_words(line) {
            return;
        }
        let mut slot = if self.lines.len() == LINES {
            self.lines
                .pop_front()
                .map(|(_, text)| text)
                .unwrap_or_default()
        } else {
            String::new()
        };
        slot.clear();
        slot.push_str(&crate::util::text::cut(line.trim_end(), LINE_BYTES));
        self.lines.push_back((now, slot));
    }

    /// The lines kept that were heard within [`RECENT`] of `now`, oldest first, joined on
    /// one line; `None` when the guest said nothing lately.
    pub fn summary(&self, now: Instant) -> Option<String> {
        let recent: Vec<&str> = self
            .lines
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= RECENT)
            .map(|(_, text)| text.as_str())
            .collect();
        (!recent.is_empty()).then(|| recent.join(" / "))
    }
}

/// False for what every crash prints around its message: stack frames (Rust, Python and
/// JavaScript all indent them), the headers above them, and Rust's advice to set
/// `RUST_BACKTRACE`, which a sandbox without the agent's environment cannot follow.
fn is_words(line: &str) -> bool {
    const BOILERPLATE: [&str; 6] = [
        "note: run with `RUST_BACKTRACE=1`",
        "note: Some details are omitted",
        "stack backtrace:",
        "Traceback (most recent call last):",
        // componentize-js, after an exception's message
        "Stack:",
        "Redirecting call to abort() to mozalloc_abort",
    ];
    !line.trim().is_empty()
        && !line.starts_with([' ', '\t'])
        && !BOILERPLATE.iter().any(|prefix| line.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(lines: &str) -> Option<String> {
        let now = Instant::now();
        let mut words = LastWords::default();
        lines.lines().for_each(|line| words.hear(line, now));
        words.summary(now)
    }

    #[test]
    fn words_said_long_before_the_end_are_not_last_words() {
        let start = Instant::now();
        let mut words = LastWords::default();
        words.hear("warning: config file is old", start);
        let later = start + RECENT + Duration::from_secs(1);
        assert_eq!(words.summary(later), None);
        words.hear("panicked", later);
        assert_eq!(words.summary(later).as_deref(), Some("panicked"));
    }

    #[test]
    fn a_rust_panic_is_its_location_and_message() {
        let panic = "thread '<unnamed>' panicked at src/lib.rs:24:5:\n\
                     config says crash\n\
                     note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace";
        assert_eq!(
            heard(panic).as_deref(),
            Some("thread '<unnamed>' panicked at src/lib.rs:24:5: / config says crash")
        );
    }

    #[test]
    fn a_python_traceback_is_its_last_line() {
        let traceback = "Traceback (most recent call last):\n  \
                         File \"app.py\", line 12, in run\n    \
                         x = config[\"k\"]\n\
                         KeyError: 'k'";
        assert_eq!(heard(traceback).as_deref(), Some("KeyError: 'k'"));
    }

    #[test]
    fn only_the_newest_lines_are_kept_each_cut_to_its_limit() {
        let now = Instant::now();
        let mut words = LastWords::default();
        for n in 0..1000 {
            words.hear(&format!("line {n}"), now);
        }
        words.hear(&"x".repeat(10_000), now);
        let summary = words.summary(now).unwrap();
        assert!(
            summary.starts_with("line 998 / line 999 / xxx"),
            "{summary}"
        );
        assert!(summary.ends_with("[truncated 9760 bytes]"), "{summary}");
        assert_eq!(heard("\n   \n"), None, "blank lines are not words");
    }
}
