//! Guest output into the agent's logger: `wasi:logging` calls and stdout/stderr lines become
//! tracing events inside the alloc's span, so they come out in the agent's format.
//!
//! Every line passes one per-alloc [`GuestLogSink`], which caps line length and rate: excess
//! lines are dropped and counted, and a single `dropped N log lines` event is emitted at most
//! once per [`DROP_REPORT_INTERVAL`], so a flooding guest can neither flood the agent's log
//! nor grow a queue. Admitted lines also go to the alloc's log file through its
//! [`AllocLogWriter`], which queues them and returns at once: the file is
//! [`crate::alloc_logs`]'s business, never this module's. Lines on stderr or at ERROR are also
//! heard as the runner's [`LastWords`], admitted or not.

use crate::alloc_logs::AllocLogWriter;
use crate::model::structs::Limits;
use crate::runtime::imports::bindings::{Level, LoggingImports};
use crate::runtime::imports::last_words::LastWords;
use crate::runtime::sandbox::token_bucket::TokenBucket;
use crate::util::locks::LockUnpoisoned;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// The target of every guest line, so operators can filter guest output (`caravan::guest=warn`).
pub const GUEST_TARGET: &str = "caravan::guest";

/// What one alloc's guest output may be, from its [`Limits`]: lines and bytes per second
/// (each with a burst of a second's worth), and the longest line and `wasi:logging` context.
#[derive(Debug, Clone, Copy)]
pub struct LogLimits {
    lines_per_second: u32,
    bytes_per_second: u64,
    line_bytes: usize,
    context_bytes: usize,
}

impl LogLimits {
    /// The log limits within `limits`.
    pub fn of(limits: &Limits) -> Self {
        LogLimits {
            lines_per_second: limits.log_lines_per_second,
            bytes_per_second: limits.log_bytes_per_second,
            line_bytes: crate::model::limits::as_len(limits.log_line_bytes),
            context_bytes: crate::model::limits::as_len(limits.log_field_bytes),
        }
    }
}

/// How often, at most, a flooding guest gets its `dropped N log lines` event.
pub const DROP_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Where a line came from.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// A `wasi:logging` call with this context.
    Logging(&'a str),
    /// A line the guest wrote to stdout or stderr.
    Stream(&'static str),
}

/// The one gate all of an alloc's guest output passes. Cheap to clone; clones share limits.
#[derive(Clone)]
pub struct GuestLogSink {
    span: tracing::Span,
    limits: LogLimits,
    limiter: Arc<Mutex<RateLimiter>>,
    last_words: Arc<Mutex<LastWords>>,
    log_writer: Option<AllocLogWriter>,
}

impl GuestLogSink {
    /// A sink logging into `span`, and into the alloc's log file through `log_writer` when
    /// given.
    pub fn new(span: tracing::Span, limits: LogLimits, log_writer: Option<AllocLogWriter>) -> Self {
        GuestLogSink {
            span,
            limits,
            limiter: Arc::new(Mutex::new(RateLimiter::new(&limits))),
            last_words: Arc::default(),
            log_writer,
        }
    }

    /// Emits one guest line at `level`, message and context cut to their limits, unless the
    /// rate limit (lines and bytes per second) drops it.
    pub fn emit(&self, level: tracing::Level, origin: Origin<'_>, message: &str) {
        let message = crate::util::text::cut(message, self.limits.line_bytes);
        let context;
        let origin = match origin {
            Origin::Logging(full) => {
                context = crate::util::text::cut(full, self.limits.context_bytes);
                Origin::Logging(&context)
            }
            stream => stream,
        };
        if level == tracing::Level::ERROR || matches!(origin, Origin::Stream("stderr")) {
            // A logged message may hold a whole traceback: each of its lines is heard.
            let now = Instant::now();
            let mut last_words = self.last_words.lock_unpoisoned();
            message.lines().for_each(|line| last_words.hear(line, now));
        }
        let bytes = message.len()
            + match origin {
                Origin::Logging(context) => context.len(),
                Origin::Stream(_) => 0,
            };
        let (admitted, dropped_report) = {
            let mut limiter = self.limiter.lock_unpoisoned();
            // Read under the lock, so that no report takes an older time than the last one.
            let now = Instant::now();
            let admitted = limiter.admit(now, bytes);
            (admitted, limiter.take_drop_report(now, false))
        };
        if let Some(dropped) = dropped_report {
            self.report_dropped(dropped);
        }
        if admitted {
            emit_event(&self.span, level, origin, &message);
            if let Some(log_writer) = &self.log_writer {
                let source = match origin {
                    Origin::Logging(context) => context,
                    Origin::Stream(stream) => stream,
                };
                log_writer.write(level, source, &message);
            }
        }
    }

    /// Reports lines dropped since the last report, whatever the interval; called when the
    /// alloc's run ends so no drop goes unmentioned.
    pub fn flush(&self) {
        let report = self
            .limiter
            .lock_unpoisoned()
            .take_drop_report(Instant::now(), true);
        if let Some(dropped) = report {
            self.report_dropped(dropped);
        }
    }

    /// The runner's last words so far (see [`LastWords::summary`]).
    pub fn last_words(&self) -> Option<String> {
        self.last_words.lock_unpoisoned().summary(Instant::now())
    }

    fn report_dropped(&self, dropped: u64) {
        tracing::warn!(target: GUEST_TARGET, parent: &self.span, dropped, "dropped {dropped} log lines");
    }
}

fn emit_event(span: &tracing::Span, level: tracing::Level, origin: Origin<'_>, message: &str) {
    // tracing needs the level and the field names at compile time: one arm per combination.
    // The message goes as a string field, not as format arguments: a formatter writes it
    // without going through `fmt`. Named last: the logs bench measured the JSON line slower
    // with it first (23% of the no-op rate against 29%); the text line puts it first anyway.
    macro_rules! at_level {
        ($field:ident, $value:expr) => {
            match level {
                tracing::Level::ERROR => tracing::error!(target: GUEST_TARGET, parent: span, $field = $value, message),
                tracing::Level::WARN => tracing::warn!(target: GUEST_TARGET, parent: span, $field = $value, message),
                tracing::Level::INFO => tracing::info!(target: GUEST_TARGET, parent: span, $field = $value, message),
                tracing::Level::DEBUG => tracing::debug!(target: GUEST_TARGET, parent: span, $field = $value, message),
                tracing::Level::TRACE => tracing::trace!(target: GUEST_TARGET, parent: span, $field = $value, message),
            }
        };
    }
    match origin {
        Origin::Logging(context) => at_level!(context, context),
        Origin::Stream(stream) => at_level!(stream, stream),
    }
}

/// Token buckets of lines and of bytes per second, each with a burst of a second's worth,
/// plus the count of lines dropped since the last report.
struct RateLimiter {
    lines: TokenBucket,
    bytes: TokenBucket,
    dropped: u64,
    reported_at: Option<Instant>,
}

impl RateLimiter {
    fn new(limits: &LogLimits) -> Self {
        let lines = f64::from(limits.lines_per_second.max(1));
        let bytes = limits.bytes_per_second as f64;
        RateLimiter {
            lines: TokenBucket::new(lines, lines),
            bytes: TokenBucket::new(bytes, bytes),
            dropped: 0,
            reported_at: None,
        }
    }

    /// Admits one line of `bytes` bytes if both its line and its byte budget allow it.
    fn admit(&mut self, now: Instant, bytes: usize) -> bool {
        self.lines.refill(now);
        self.bytes.refill(now);
        let bytes = bytes as f64;
        if self.lines.holds(1.0) && self.bytes.holds(bytes) {
            self.lines.spend(1.0);
            self.bytes.spend(bytes);
            true
        } else {
            self.dropped += 1;
            false
        }
    }

    fn take_drop_report(&mut self, now: Instant, force: bool) -> Option<u64> {
        if self.dropped == 0 {
            return None;
        }
        let due = force
            || self
                .reported_at
                .is_none_or(|at| now.saturating_duration_since(at) >= DROP_REPORT_INTERVAL);
        if !due {
            return None;
        }
        self.reported_at = Some(now);
        Some(std::mem::take(&mut self.dropped))
    }
}

/// The `wasi:logging` import of one alloc.
pub struct GuestLogging {
    sink: GuestLogSink,
}

impl GuestLogging {
    pub fn new(sink: GuestLogSink) -> Self {
        GuestLogging { sink }
    }

    /// Reports any lines still counted as dropped; called when the run ends.
    pub fn flush(&self) {
        self.sink.flush();
    }

    /// What the runner last wrote to stderr or logged at ERROR (see [`LastWords`]).
    pub fn last_words(&self) -> Option<String> {
        self.sink.last_words()
    }
}

impl LoggingImports for GuestLogging {
    fn log(&mut self, level: Level, context: String, message: String) {
        let level = match level {
            Level::Trace => tracing::Level::TRACE,
            Level::Debug => tracing::Level::DEBUG,
            Level::Info => tracing::Level::INFO,
            Level::Warn => tracing::Level::WARN,
            Level::Error | Level::Critical => tracing::Level::ERROR,
        };
        self.sink.emit(level, Origin::Logging(&context), &message);
    }
}

/// A guest's stdout or stderr: bytes are split into lines and each line goes to the sink.
/// stdout lines are INFO, stderr lines WARN (a Rust guest's panic message arrives there);
/// blank lines are skipped.
#[derive(Clone)]
pub struct GuestOutput {
    sink: GuestLogSink,
    stream: &'static str,
    level: tracing::Level,
}

impl GuestOutput {
    pub fn stdout(sink: GuestLogSink) -> Self {
        GuestOutput {
            sink,
            stream: "stdout",
            level: tracing::Level::INFO,
        }
    }

    pub fn stderr(sink: GuestLogSink) -> Self {
        GuestOutput {
            sink,
            stream: "stderr",
            level: tracing::Level::WARN,
        }
    }

    fn writer(&self) -> LineWriter {
        LineWriter {
            output: self.clone(),
            line: Vec::new(),
            overflow: 0,
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.writer())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.writer())
    }
}

/// Buffers one partial line; never holds more than the alloc's longest line.
struct LineWriter {
    output: GuestOutput,
    line: Vec<u8>,
    /// Bytes of the current line beyond the cap, counted but not kept.
    overflow: usize,
}

impl LineWriter {
    fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match bytes.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    self.keep(&bytes[..end]);
                    self.emit_line();
                    bytes = &bytes[end + 1..];
                }
                None => {
                    self.keep(bytes);
                    bytes = &[];
                }
            }
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        let longest = self.output.sink.limits.line_bytes;
        let room = longest.saturating_sub(self.line.len());
        let kept = bytes.len().min(room);
        self.line.extend_from_slice(&bytes[..kept]);
        self.overflow += bytes.len() - kept;
    }

    fn emit_line(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        let text = text.strip_suffix('\r').unwrap_or(&text);
        // Blank lines carry nothing in a log (a Rust panic message starts with one).
        if text.trim().is_empty() && self.overflow == 0 {
            self.line.clear();
            return;
        }
        let message = if self.overflow > 0 {
            format!("{text} [truncated {} bytes]", self.overflow)
        } else {
            text.to_string()
        };
        self.output.sink.emit(
            self.output.level,
            Origin::Stream(self.output.stream),
            &message,
        );
        self.line.clear();
        self.overflow = 0;
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.line.is_empty() || self.overflow > 0 {
            self.emit_line();
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LineWriter {
    async fn ready(&mut self) {}
}

impl OutputStream for LineWriter {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for LineWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_over_the_rate_is_dropped_and_reported_once_per_interval() {
        let start = Instant::now();
        let limits = Limits {
            log_lines_per_second: 10,
            ..Limits::default()
        };
        let mut limiter = RateLimiter::new(&LogLimits::of(&limits));
        let admitted = (0..25).filter(|_| limiter.admit(start, 1)).count();
        assert_eq!(admitted, 10);
        assert_eq!(limiter.take_drop_report(start, false), Some(15));
        limiter.admit(start, 1);
        assert_eq!(
            limiter.take_drop_report(start, false),
            None,
            "reported at most once a second"
        );
        assert_eq!(
            limiter.take_drop_report(start + DROP_REPORT_INTERVAL, false),
            Some(1)
        );
        // A second later the bucket is full again.
        assert!(limiter.admit(start + Duration::from_secs(2), 1));
    }
}
