//! Guest output into the agent's logger: `wasi:logging` calls and stdout/stderr lines become
//! tracing events inside the alloc's span, so they come out in the agent's format.
//!
//! Every line passes one per-alloc [`GuestLogSink`], which caps line length and rate: excess
//! lines are dropped and counted, and a single `dropped N log lines` event is emitted at most
//! once per [`DROP_REPORT_INTERVAL`], so a flooding guest can neither flood the agent's log
//! nor grow a queue. This module touches nothing but tracing.

use super::bindings::{Level, LoggingImports};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// The target of every guest line, so operators can filter guest output (`caravan::guest=warn`).
pub const GUEST_TARGET: &str = "caravan::guest";

/// Longest guest line kept, in bytes; longer lines are cut with a marker saying how much.
pub const MAX_LINE_BYTES: usize = 8 * 1024;

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
    limiter: Arc<Mutex<RateLimiter>>,
    file: Option<Arc<Mutex<LogFile>>>,
}

impl GuestLogSink {
    /// A sink logging into `span`, and into `log_file` (rotated) when given.
    pub fn new(span: tracing::Span, lines_per_second: u32, log_file: Option<PathBuf>) -> Self {
        GuestLogSink {
            span,
            limiter: Arc::new(Mutex::new(RateLimiter::new(lines_per_second))),
            file: log_file.map(|path| Arc::new(Mutex::new(LogFile::new(path)))),
        }
    }

    /// Emits one guest line at `level`, unless the rate limit drops it.
    pub fn emit(&self, level: tracing::Level, origin: Origin<'_>, message: &str) {
        let (admitted, dropped_report) = {
            let mut limiter = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
            let admitted = limiter.admit(Instant::now());
            (admitted, limiter.take_drop_report(Instant::now(), false))
        };
        if let Some(dropped) = dropped_report {
            self.report_dropped(dropped);
        }
        if admitted {
            let message = truncate_line(message);
            emit_event(&self.span, level, origin, &message);
            if let Some(file) = &self.file {
                let source = match origin {
                    Origin::Logging(context) => context,
                    Origin::Stream(stream) => stream,
                };
                file.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .append(level, source, &message);
            }
        }
    }

    /// Reports lines dropped since the last report, whatever the interval; called when the
    /// alloc's run ends so no drop goes unmentioned.
    pub fn flush(&self) {
        let report = self
            .limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_drop_report(Instant::now(), true);
        if let Some(dropped) = report {
            self.report_dropped(dropped);
        }
    }

    fn report_dropped(&self, dropped: u64) {
        tracing::warn!(target: GUEST_TARGET, parent: &self.span, dropped, "dropped {dropped} log lines");
    }
}

fn emit_event(span: &tracing::Span, level: tracing::Level, origin: Origin<'_>, message: &str) {
    // tracing needs the level and the field names at compile time: one arm per combination.
    macro_rules! at_level {
        ($field:ident, $value:expr) => {
            match level {
                tracing::Level::ERROR => tracing::error!(target: GUEST_TARGET, parent: span, $field = $value, "{message}"),
                tracing::Level::WARN => tracing::warn!(target: GUEST_TARGET, parent: span, $field = $value, "{message}"),
                tracing::Level::INFO => tracing::info!(target: GUEST_TARGET, parent: span, $field = $value, "{message}"),
                tracing::Level::DEBUG => tracing::debug!(target: GUEST_TARGET, parent: span, $field = $value, "{message}"),
                tracing::Level::TRACE => tracing::trace!(target: GUEST_TARGET, parent: span, $field = $value, "{message}"),
            }
        };
    }
    match origin {
        Origin::Logging(context) => at_level!(context, context),
        Origin::Stream(stream) => at_level!(stream, stream),
    }
}

/// Cuts `line` to [`MAX_LINE_BYTES`] on a character boundary, saying how much was cut.
fn truncate_line(line: &str) -> std::borrow::Cow<'_, str> {
    if line.len() <= MAX_LINE_BYTES {
        return line.into();
    }
    let mut cut = MAX_LINE_BYTES;
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{} [truncated {} bytes]", &line[..cut], line.len() - cut).into()
}

/// Largest size of one log file before it is rotated.
pub const LOG_FILE_MAX_BYTES: u64 = 1024 * 1024;
/// Rotated files kept besides the current one (`runner.log.1` is the newest of them).
pub const LOG_FILES_KEPT: usize = 2;

/// One alloc's log file, opened on the first line and rotated by size: `NAME`, `NAME.1`, ...
struct LogFile {
    path: PathBuf,
    file: Option<std::fs::File>,
    size: u64,
    failed: bool,
}

impl LogFile {
    fn new(path: PathBuf) -> Self {
        LogFile {
            path,
            file: None,
            size: 0,
            failed: false,
        }
    }

    fn append(&mut self, level: tracing::Level, source: &str, message: &str) {
        use std::io::Write;
        if self.failed {
            return;
        }
        let line = format!("{} {level:>5} {source}: {message}\n", rfc3339_now());
        if self.size + line.len() as u64 > LOG_FILE_MAX_BYTES && self.size > 0 {
            self.rotate();
        }
        let result = self.open().and_then(|file| file.write_all(line.as_bytes()));
        match result {
            Ok(()) => self.size += line.len() as u64,
            Err(error) => {
                // Once: the agent's log still has every line.
                self.failed = true;
                tracing::warn!(path = %self.path.display(), error = %error, "cannot write the alloc's log file; lines go to the agent log only");
            }
        }
    }

    fn open(&mut self) -> std::io::Result<&mut std::fs::File> {
        if self.file.is_none() {
            if let Some(parent) = self.path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            self.size = file.metadata()?.len();
            self.file = Some(file);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    fn rotate(&mut self) {
        self.file = None;
        for n in (1..LOG_FILES_KEPT).rev() {
            let _ = std::fs::rename(rotated(&self.path, n), rotated(&self.path, n + 1));
        }
        let _ = std::fs::rename(&self.path, rotated(&self.path, 1));
        self.size = 0;
    }
}

/// `runner.log` -> `runner.log.N`.
pub fn rotated(path: &std::path::Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// The current UTC time as `2026-11-29T20:41:20.816Z`.
fn rfc3339_now() -> String {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since_epoch.as_secs();
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since_epoch.subsec_millis()
    )
}

/// A token bucket of `lines_per_second` with a burst of the same size, plus the count of
/// lines dropped since the last report.
struct RateLimiter {
    capacity: f64,
    tokens: f64,
    refilled_at: Option<Instant>,
    dropped: u64,
    reported_at: Option<Instant>,
}

impl RateLimiter {
    fn new(lines_per_second: u32) -> Self {
        let capacity = f64::from(lines_per_second.max(1));
        RateLimiter {
            capacity,
            tokens: capacity,
            refilled_at: None,
            dropped: 0,
            reported_at: None,
        }
    }

    fn admit(&mut self, now: Instant) -> bool {
        if let Some(refilled_at) = self.refilled_at {
            let elapsed = now.saturating_duration_since(refilled_at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.capacity).min(self.capacity);
        }
        self.refilled_at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
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

/// Buffers one partial line; never holds more than [`MAX_LINE_BYTES`].
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
        let room = MAX_LINE_BYTES.saturating_sub(self.line.len());
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
        let mut limiter = RateLimiter::new(10);
        let admitted = (0..25).filter(|_| limiter.admit(start)).count();
        assert_eq!(admitted, 10);
        assert_eq!(limiter.take_drop_report(start, false), Some(15));
        limiter.admit(start);
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
        assert!(limiter.admit(start + Duration::from_secs(2)));
    }

    #[test]
    fn the_log_file_rotates_by_size_and_keeps_two_old_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs").join("a.log");
        let mut file = LogFile::new(path.clone());
        let line = "x".repeat(1000);
        for _ in 0..(3 * LOG_FILE_MAX_BYTES as usize / 1000 + 10) {
            file.append(tracing::Level::INFO, "test", &line);
        }
        for n in 1..=LOG_FILES_KEPT {
            assert!(rotated(&path, n).exists(), "{n}");
        }
        assert!(
            !rotated(&path, LOG_FILES_KEPT + 1).exists(),
            "older files are dropped"
        );
        assert!(std::fs::metadata(&path).unwrap().len() <= LOG_FILE_MAX_BYTES);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.lines()
                .all(|l| l.ends_with(&format!(" INFO test: {line}"))),
            "{}",
            &text[..80]
        );
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let now = rfc3339_now();
        assert_eq!(now.len(), "2026-11-29T20:41:20.816Z".len(), "{now}");
        assert!(
            now.starts_with("20") && now.ends_with('Z') && &now[10..11] == "T",
            "{now}"
        );
    }

    #[test]
    fn long_lines_are_cut_on_a_character_boundary_with_a_marker() {
        let line = "é".repeat(MAX_LINE_BYTES);
        let cut = truncate_line(&line);
        assert!(cut.len() < MAX_LINE_BYTES + 40);
        assert!(cut.ends_with(&format!("[truncated {} bytes]", MAX_LINE_BYTES)));
    }
}
