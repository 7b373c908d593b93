//! The agent log's writer: formatted lines are appended to a buffer in memory and a thread of
//! their own writes them to stderr, so the thread that logs (a guest's, in its `log` call)
//! never waits for a `write(2)`, and a burst of lines becomes one write.
//!
//! It may not reorder, rewrite or drop a line: lines leave in the order they arrived, and
//! when the buffer holds [`PENDING_BYTES_MAX`] a logger waits for room, as it would wait for
//! a full pipe, rather than a line being lost. Only [`flush`] waits for stderr itself; the
//! process calls it before it exits, so the last lines are written.

use crate::util::locks::LockUnpoisoned;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How much formatted log may wait in memory before a logger waits for the writer.
pub const PENDING_BYTES_MAX: usize = 1 << 20;

/// How long the writer, having written a batch, lets the next one gather before it writes
/// again: within it, loggers append without waking anyone. A line logged while the writer
/// is idle is written at once.
const GATHER: Duration = Duration::from_millis(1);

/// How long [`flush`] waits for a stderr that does not drain (a reader that stopped reading).
const FLUSH_PATIENCE: Duration = Duration::from_secs(2);

/// How a batch is written out: as it is, or with the JSON log's extra escapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escaping {
    /// Text lines: the formatter has escaped them already.
    None,
    /// JSON lines: DEL, C1 and bidirectional controls are written as `\uXXXX` (see
    /// [`crate::util::text::escape_json_controls`]), which JSON's own escaping leaves raw.
    JsonControls,
}

#[derive(Default)]
struct Pending {
    lines: Vec<u8>,
    /// The writer holds a batch it has not finished writing.
    writing: bool,
    /// The writer sleeps until a logger wakes it.
    idle: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    /// Lines arrived for the writer.
    arrived: Condvar,
    /// The writer took a batch (room for loggers) or finished writing one (progress for
    /// [`flush`]).
    progress: Condvar,
}

/// A handle to the one writer; cheap to clone. Its [`Write`] takes whole lines, as
/// tracing's formatter hands them.
#[derive(Clone)]
pub struct StderrWriter {
    shared: Arc<Shared>,
}

static WRITER: OnceLock<StderrWriter> = OnceLock::new();

impl StderrWriter {
    /// The process's writer, starting its thread on first use; `escaping` is taken from the
    /// first call.
    pub fn global(escaping: Escaping) -> std::io::Result<StderrWriter> {
        if let Some(writer) = WRITER.get() {
            return Ok(writer.clone());
        }
        let writer = StderrWriter::start(escaping, std::io::stderr())?;
        Ok(WRITER.get_or_init(|| writer).clone())
    }

    /// A writer whose thread writes to `out`.
    fn start(escaping: Escaping, mut out: impl Write + Send + 'static) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            arrived: Condvar::new(),
            progress: Condvar::new(),
        });
        let for_thread = shared.clone();
        std::thread::Builder::new()
            .name("caravan-log-writer".into())
            .spawn(move || write_forever(&for_thread, escaping, &mut out))?;
        Ok(StderrWriter { shared })
    }

    /// Waits until every line given so far is written, or [`FLUSH_PATIENCE`] has passed.
    pub fn flush_pending(&self) {
        let deadline = Instant::now() + FLUSH_PATIENCE;
        let mut pending = self.shared.pending.lock_unpoisoned();
        self.shared.arrived.notify_one();
        while !pending.lines.is_empty() || pending.writing {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            pending = match self.shared.progress.wait_timeout(pending, left) {
                Ok((pending, _)) => pending,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

/// Writes every line given so far to stderr before returning (within a bounded wait). Does
/// nothing when no writer was started.
pub fn flush() {
    if let Some(writer) = WRITER.get() {
        writer.flush_pending();
    }
}

impl Write for StderrWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut pending = self.shared.pending.lock_unpoisoned();
        while pending.lines.len() >= PENDING_BYTES_MAX {
            pending = match self.shared.progress.wait(pending) {
                Ok(pending) => pending,
                Err(poisoned) => poisoned.into_inner(),
            };
        }
        // A gathering writer comes back on its own, unless the buffer is filling up.
        pending.lines.extend_from_slice(line);
        let wake =
            std::mem::take(&mut pending.idle) || pending.lines.len() >= PENDING_BYTES_MAX / 2;
        drop(pending);
        if wake {
            self.shared.arrived.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn write_forever(shared: &Shared, escaping: Escaping, out: &mut impl Write) {
    let mut batch = Vec::new();
    loop {
        {
            let mut pending = shared.pending.lock_unpoisoned();
            pending.writing = false;
            shared.progress.notify_all();
            if pending.lines.len() < PENDING_BYTES_MAX / 2 {
                pending = match shared.arrived.wait_timeout(pending, GATHER) {
                    Ok((pending, _)) => pending,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
            while pending.lines.is_empty() {
                pending.idle = true;
                pending = match shared.arrived.wait(pending) {
                    Ok(pending) => pending,
                    Err(poisoned) => poisoned.into_inner(),
                };
            }
            pending.idle = false;
            batch.clear();
            std::mem::swap(&mut batch, &mut pending.lines);
            pending.writing = true;
        }
        // The buffer is empty again: loggers waiting for room may go on.
        shared.progress.notify_all();
        // A stderr that fails (closed, full disk) loses these lines: there is nowhere left
        // to say so, and the loggers must not stop for it.
        let _ = write_batch(out, &batch, escaping);
        // A burst can grow a buffer far past the usual; do not keep that memory for ever.
        if batch.capacity() > 2 * PENDING_BYTES_MAX {
            batch = Vec::new();
        }
    }
}

fn write_batch(out: &mut impl Write, batch: &[u8], escaping: Escaping) -> std::io::Result<()> {
    // ASCII below DEL has nothing to escape: most batches, settled by one scan.
    if escaping == Escaping::None || batch.iter().all(|&b| b < 0x7f) {
        out.write_all(batch)?;
        return out.flush();
    }
    match std::str::from_utf8(batch) {
        Ok(text) => out.write_all(crate::util::text::escape_json_controls(text).as_bytes())?,
        // The formatter writes text, so whole lines are UTF-8; if not, pass the bytes on.
        Err(_) => out.write_all(batch)?,
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `out` that a test can read, and hold shut to fill the buffer.
    #[derive(Clone, Default)]
    struct Captured {
        bytes: Arc<Mutex<Vec<u8>>>,
        gate: Arc<Mutex<()>>,
    }

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _open = self.gate.lock_unpoisoned();
            self.bytes.lock_unpoisoned().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.bytes.lock_unpoisoned().clone()).unwrap()
        }
    }

    #[test]
    fn lines_arrive_whole_and_in_order_after_a_flush() {
        let out = Captured::default();
        let writer = StderrWriter::start(Escaping::None, out.clone()).unwrap();
        let loggers: Vec<_> = (0..4)
            .map(|t| {
                let mut writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        writer.write_all(format!("t{t} {i}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for logger in loggers {
            logger.join().unwrap();
        }
        writer.flush_pending();
        let text = out.text();
        assert_eq!(text.lines().count(), 4000);
        for t in 0..4 {
            let own: Vec<String> = text
                .lines()
                .filter(|line| line.starts_with(&format!("t{t} ")))
                .map(str::to_owned)
                .collect();
            let expected: Vec<String> = (0..1000).map(|i| format!("t{t} {i}")).collect();
            assert_eq!(own, expected, "logger {t}'s lines, whole and in order");
        }
    }

    #[test]
    fn a_full_buffer_makes_the_logger_wait_and_loses_nothing() {
        let out = Captured::default();
        let writer = StderrWriter::start(Escaping::None, out.clone()).unwrap();
        let line = vec![b'x'; 1023];
        let lines = 3 * PENDING_BYTES_MAX / 1024;
        let shut = out.gate.lock_unpoisoned();
        let logger = {
            let mut writer = writer.clone();
            let line = line.clone();
            std::thread::spawn(move || {
                for _ in 0..lines {
                    writer.write_all(&line).unwrap();
                    writer.write_all(b"\n").unwrap();
                }
            })
        };
        // The writer is stuck on its first batch; the logger fills the buffer and waits.
        let filled = |writer: &StderrWriter| {
            writer.shared.pending.lock_unpoisoned().lines.len() >= PENDING_BYTES_MAX
        };
        while !filled(&writer) {
            // Not a spin on the lock: that could keep the logger from ever taking it.
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!logger.is_finished(), "the logger waits for room");
        drop(shut);
        logger.join().unwrap();
        writer.flush_pending();
        let text = out.text();
        assert_eq!(text.lines().count(), lines);
        assert!(text.lines().all(|l| l.len() == 1023));
    }

    #[test]
    fn json_batches_get_the_control_escapes() {
        let out = Captured::default();
        let mut writer = StderrWriter::start(Escaping::JsonControls, out.clone()).unwrap();
        writer
            .write_all("{\"m\":\"a\u{7f}\u{202e}b\"}\n".as_bytes())
            .unwrap();
        writer.flush_pending();
        assert_eq!(out.text(), "{\"m\":\"a\\u007f\\u202eb\"}\n");
    }
}
