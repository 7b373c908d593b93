//! One alloc's log file on disk: the line format, appending in batches, rotation by size.
//!
//! Blocking std I/O only; callers hold the alloc's file lock and run off the async workers.

use super::{LOG_FILE_MAX_BYTES, LOG_FILES_KEPT};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Guest lines waiting for the file, as an alloc's queue holds them: stamped when the guest
/// logged them, formatted only by the writer, off the guest's path (and not at all when the
/// queue drops them). Every line's text shares one buffer, so once the buffers have grown,
/// queueing a line allocates nothing; the writer hands a written batch's buffers back for
/// the next one (see `AllocLog::drain`).
#[derive(Default)]
pub(super) struct QueuedLines {
    lines: Vec<LineMark>,
    /// Each line's source and then its message, line after line.
    text: String,
}

/// Where one queued line's source and message end in [`QueuedLines::text`].
struct LineMark {
    at: std::time::SystemTime,
    level: tracing::Level,
    source_end: usize,
    message_end: usize,
}

impl QueuedLines {
    /// What a line holds while queued (its text and about the size of its mark), for the
    /// queue's byte bound; known before the line is queued, so a dropped line costs no copy.
    pub(super) fn len_estimate(source: &str, message: &str) -> usize {
        32 + source.len() + message.len()
    }

    /// Queues a line, stamped now.
    pub(super) fn push(&mut self, level: tracing::Level, source: &str, message: &str) {
        self.text.push_str(source);
        let source_end = self.text.len();
        self.text.push_str(message);
        self.lines.push(LineMark {
            at: std::time::SystemTime::now(),
            level,
            source_end,
            message_end: self.text.len(),
        });
    }

    pub(super) fn len(&self) -> usize {
        self.lines.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Forgets every line and keeps the buffers.
    pub(super) fn clear(&mut self) {
        self.lines.clear();
        self.text.clear();
    }

    fn iter(&self) -> impl Iterator<Item = QueuedLine<'_>> {
        let mut line_start = 0;
        self.lines.iter().map(move |mark| {
            let line = QueuedLine {
                at: mark.at,
                level: mark.level,
                source: &self.text[line_start..mark.source_end],
                message: &self.text[mark.source_end..mark.message_end],
            };
            line_start = mark.message_end;
            line
        })
    }
}

/// One of [`QueuedLines`].
struct QueuedLine<'a> {
    at: std::time::SystemTime,
    level: tracing::Level,
    source: &'a str,
    message: &'a str,
}

/// What [`LogFile::append_batch`] appends: a queued line, formatted on the way (or, in tests,
/// a text that is already whole lines).
pub(super) trait FileLines {
    /// Appends the text to `out`; each line ends in a newline.
    fn write_to(&self, out: &mut String);
}

/// Lines already formatted, as tests give them.
#[cfg(test)]
impl<T: AsRef<str>> FileLines for T {
    fn write_to(&self, out: &mut String) {
        out.push_str(self.as_ref());
    }
}

impl FileLines for QueuedLine<'_> {
    fn write_to(&self, out: &mut String) {
        write_line(out, self.at, self.level, self.source, self.message);
    }
}

/// One line of the file, stamped now (see [`write_line`]).
#[cfg(test)]
pub(super) fn format_line(level: tracing::Level, source: &str, message: &str) -> String {
    let mut line = String::new();
    write_line(
        &mut line,
        std::time::SystemTime::now(),
        level,
        source,
        message,
    );
    line
}

/// Appends one line of the file to `out`: `2026-11-29T20:41:20.816Z  INFO stdout:
/// message\n`. The guest's source and message have their control characters escaped: one
/// guest line is one file line, and `alloc logs` never hands a terminal a raw escape.
fn write_line(
    out: &mut String,
    at: std::time::SystemTime,
    level: tracing::Level,
    source: &str,
    message: &str,
) {
    use crate::util::text::escape_controls;
    use crate::util::timestamp::{Fraction, write_utc};
    use std::fmt::Write;
    // Writing into a String cannot fail.
    let _ = write_utc(out, at, Fraction::Millis);
    let _ = write!(out, " {level:>5} ");
    out.push_str(&escape_controls(source));
    out.push_str(": ");
    out.push_str(&escape_controls(message));
    out.push('\n');
}

/// One line of the file, taken apart: the inverse of `write_line`. `None` for a line not in
/// that format. A source holding `": "` is split at its first one (sources are the runner's
/// `wasi:logging` contexts, or `stdout` and `stderr`).
pub fn parse_line(line: &str) -> Option<super::LogLine<'_>> {
    let (time, rest) = line.split_once(' ')?;
    let rest = rest.trim_start();
    let (level, rest) = rest.split_once(' ')?;
    let (source, message) = rest.split_once(": ")?;
    let known = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level);
    (known && time.ends_with('Z')).then_some(super::LogLine {
        time,
        level,
        source,
        message: message.strip_suffix('\n').unwrap_or(message),
    })
}

/// `alloc_id`'s current file in `dir`: `<id>.log`.
pub(super) fn current_file(dir: &Path, alloc_id: &str) -> PathBuf {
    dir.join(format!("{alloc_id}.log"))
}

/// The alloc whose file `name` is (its current one, or a rotated one), if it is one: what
/// [`current_file`] and [`rotated`] name, read back.
pub(super) fn alloc_of(name: &str) -> Option<String> {
    let current = name.strip_suffix(".log").or_else(|| {
        let (current, n) = name.rsplit_once('.')?;
        n.parse::<usize>().ok()?;
        current.strip_suffix(".log")
    })?;
    (!current.is_empty()).then(|| current.to_string())
}

/// `<id>.log` -> `<id>.log.N`.
pub(super) fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// The current file and every rotated one, newest first.
pub(super) fn every_file(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    std::iter::once(path.to_path_buf()).chain((1..=LOG_FILES_KEPT).map(|n| rotated(path, n)))
}

/// One alloc's current log file, opened on the first line and rotated by size: `NAME`,
/// `NAME.1`, ... After a write fails it stops writing: the agent's log still has every line.
pub(super) struct LogFile {
    path: PathBuf,
    file: Option<std::fs::File>,
    size: u64,
    failed: bool,
}

impl LogFile {
    pub(super) fn new(path: PathBuf) -> Self {
        LogFile {
            path,
            file: None,
            size: 0,
            failed: false,
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the queued lines, as [`LogFile::append_batch`] does.
    pub(super) fn append_queued(&mut self, batch: &QueuedLines) -> u64 {
        self.append_batch(batch.iter())
    }

    /// Appends `lines`, rotating before any that would take the file past
    /// [`LOG_FILE_MAX_BYTES`]; one write per file touched. Returns how many times it rotated.
    pub(super) fn append_batch<L: FileLines>(&mut self, lines: impl IntoIterator<Item = L>) -> u64 {
        let mut rotations = 0;
        let mut pending = Vec::new();
        // Each line is formatted here, one at a time, into the same buffer.
        let mut line = String::new();
        for next in lines {
            // Opened before the size check, so a file left by an earlier run counts.
            if self.failed || !self.open() {
                break;
            }
            line.clear();
            next.write_to(&mut line);
            if self.size + line.len() as u64 > LOG_FILE_MAX_BYTES && self.size > 0 {
                self.write_out(&mut pending);
                self.rotate();
                rotations += 1;
                if self.failed || !self.open() {
                    break;
                }
            }
            pending.extend_from_slice(line.as_bytes());
            self.size += line.len() as u64;
        }
        self.write_out(&mut pending);
        rotations
    }

    /// Closes the file; the next line reopens it.
    pub(super) fn close(&mut self) {
        self.file = None;
        self.size = 0;
    }

    fn write_out(&mut self, pending: &mut Vec<u8>) {
        if !pending.is_empty()
            && !self.failed
            && let Some(Err(error)) = self.file.as_mut().map(|file| file.write_all(pending))
        {
            self.fail(&error);
        }
        pending.clear();
    }

    fn fail(&mut self, error: &std::io::Error) {
        // Once: the agent's log still has every line.
        self.failed = true;
        tracing::warn!(path = %self.path.display(), error = %error, "cannot write the alloc's log file; lines go to the agent log only");
    }

    /// Opens the file unless it is open, learning its size; false (reported, and for good)
    /// when it cannot be opened.
    fn open(&mut self) -> bool {
        if self.file.is_some() {
            return true;
        }
        let opened = (|| {
            if let Some(parent) = self.path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            let size = file.metadata()?.len();
            Ok::<_, std::io::Error>((file, size))
        })();
        match opened {
            Ok((file, size)) => {
                self.file = Some(file);
                self.size = size;
                true
            }
            Err(error) => {
                self.fail(&error);
                false
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn file_names_name_their_alloc_and_other_names_none() {
        assert_eq!(alloc_of("a1b2.log").as_deref(), Some("a1b2"));
        assert_eq!(alloc_of("a1b2.log.2").as_deref(), Some("a1b2"));
        assert_eq!(alloc_of("web.1.log").as_deref(), Some("web.1"));
        for other in [
            ".log",
            "notes.txt",
            "a1b2.log.old",
            "a1b2.logs",
            "a1b2.log.",
        ] {
            assert_eq!(alloc_of(other), None, "{other}");
        }
    }

    #[test]
    fn queued_lines_come_back_as_queued_when_their_buffers_are_reused() {
        let mut queued = QueuedLines::default();
        for round in 0..2 {
            queued.clear();
            queued.push(Level::INFO, "stdout", "first");
            queued.push(Level::WARN, "", "");
            queued.push(Level::ERROR, "ctx", "é\n");
            let lines: Vec<_> = queued
                .iter()
                .map(|line| (line.level, line.source, line.message))
                .collect();
            let expected = [
                (Level::INFO, "stdout", "first"),
                (Level::WARN, "", ""),
                (Level::ERROR, "ctx", "é\n"),
            ];
            assert_eq!(lines, expected, "round {round}");
        }
    }

    #[test]
    fn the_log_file_rotates_by_size_and_keeps_two_old_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs").join("a.log");
        let mut file = LogFile::new(path.clone());
        let line = "x".repeat(1000);
        let mut rotations = 0;
        for _ in 0..(3 * LOG_FILE_MAX_BYTES as usize / 1000 + 10) {
            rotations += file.append_batch(&[format_line(tracing::Level::INFO, "test", &line)]);
        }
        assert_eq!(rotations, 3);
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
    fn a_batch_rotates_where_a_line_would_not_fit_and_keeps_every_line_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let mut file = LogFile::new(path.clone());
        let lines: Vec<String> = (0..1500)
            .map(|n| format!("{n:04} {}\n", "y".repeat(995)))
            .collect();
        assert_eq!(file.append_batch(&lines), 1);
        let old = std::fs::read_to_string(rotated(&path, 1)).unwrap();
        let new = std::fs::read_to_string(&path).unwrap();
        assert!(old.len() as u64 <= LOG_FILE_MAX_BYTES);
        assert!(old.len() as u64 + 1000 > LOG_FILE_MAX_BYTES, "filled first");
        assert_eq!(old + &new, lines.concat());
    }

    #[test]
    fn a_file_left_by_an_earlier_run_is_appended_to_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        std::fs::write(&path, "x".repeat(LOG_FILE_MAX_BYTES as usize - 10)).unwrap();
        let mut file = LogFile::new(path.clone());
        assert_eq!(file.append_batch(["short\n"]), 0);
        assert_eq!(file.append_batch(["longer than ten\n"]), 1);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "longer than ten\n");
    }
}
