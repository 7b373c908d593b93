//! One alloc's log as the owner keeps it: the bounded queue, the writer task that drains it,
//! the file lock, and deletion.
//!
//! The writer task runs only while there are lines: the first line queued starts it, and it
//! ends when it finds the queue empty, so a quiet or finished alloc holds no task. It first
//! waits out [`WRITE_BEHIND`], cut short by whoever needs the lines in the file now (a
//! settle, a follower, a removal, a half-full queue): see the module above for why. Each
//! batch is written on tokio's blocking pool, never on an async worker.

use super::file::{self, LogFile, QueuedLines};
use super::on_disk::FilesOnDisk;
use super::{QUEUE_MAX_BYTES, QUEUE_MAX_LINES, WRITE_BEHIND};
use crate::util::locks::LockUnpoisoned;
use crate::util::locks::RwLockUnpoisoned;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How often, at most, an alloc whose writer falls behind gets its WARN about dropped lines.
const DROP_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// One alloc's log, shared by its writers, its readers and its writer task.
pub(super) struct AllocLog {
    pub(super) alloc_id: String,
    queue: Mutex<Queue>,
    /// Every file operation holds this: writers and deletion exclusively, readers shared.
    pub(super) files: RwLock<Files>,
    /// Lines taken from the queue and done with: written, failed or discarded. Grows by
    /// whole batches, after they are in the file.
    pub(super) done: watch::Sender<u64>,
    dropped: AtomicU64,
    /// Ends the writer's wait for [`WRITE_BEHIND`]. A permit left when no writer waits only
    /// makes the next one write early.
    write_now: Notify,
    /// Live [`super::LogFollower`]s: while there is one, the writer does not wait.
    followers: AtomicUsize,
    /// Told before each batch is written, so a removal knows to look for files.
    on_disk: Arc<FilesOnDisk>,
}

struct Queue {
    lines: QueuedLines,
    bytes: usize,
    /// Lines ever queued; [`AllocLog::settle`] waits for `done` to reach it.
    accepted: u64,
    /// A writer task is running (or the writing thread is draining).
    draining: bool,
    /// The writer task is waiting out [`WRITE_BEHIND`] and nobody has cut it short yet.
    lingering: bool,
    removed: bool,
    unreported_drops: u64,
    reported_at: Option<Instant>,
}

/// The files' state, under the file lock.
pub(super) struct Files {
    pub(super) current: LogFile,
    /// Rotations since this log was made: a follower's position is a rotation count and an
    /// offset, so it finds its file again after any number of rotations.
    pub(super) rotations: i64,
    pub(super) removed: bool,
}

impl AllocLog {
    pub(super) fn new(alloc_id: &str, path: PathBuf, on_disk: Arc<FilesOnDisk>) -> Self {
        AllocLog {
            alloc_id: alloc_id.to_string(),
            queue: Mutex::new(Queue {
                lines: QueuedLines::default(),
                bytes: 0,
                accepted: 0,
                draining: false,
                lingering: false,
                removed: false,
                unreported_drops: 0,
                reported_at: None,
            }),
            files: RwLock::new(Files {
                current: LogFile::new(path),
                rotations: 0,
                removed: false,
            }),
            done: watch::Sender::new(0),
            dropped: AtomicU64::new(0),
            write_now: Notify::new(),
            followers: AtomicUsize::new(0),
            on_disk,
        }
    }

    /// Queues a line, stamped now, starting the writer if none runs. False when the queue was
    /// full and the line dropped. After [`AllocLog::remove_blocking`] every line is discarded, and that
    /// is no drop.
    pub(super) fn enqueue(
        self: &Arc<Self>,
        level: tracing::Level,
        source: &str,
        message: &str,
    ) -> bool {
        let len = QueuedLines::len_estimate(source, message);
        let mut queue = self.queue.lock_unpoisoned();
        if queue.removed {
            return true;
        }
        let full = queue.lines.len() >= QUEUE_MAX_LINES
            || (!queue.lines.is_empty() && queue.bytes + len > QUEUE_MAX_BYTES);
        if full {
            queue.unreported_drops += 1;
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        queue.bytes += len;
        queue.lines.push(level, source, message);
        queue.accepted += 1;
        if !queue.draining {
            queue.draining = true;
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    queue.lingering = true;
                    drop(queue);
                    // The guard goes into the task as it is made: a task dropped before its
                    // first poll finishes the drain too.
                    runtime.spawn(AllocLog::drain(UnfinishedDrain {
                        log: self.clone(),
                        in_flight: 0,
                        finished: false,
                    }));
                }
                // No runtime to hand the work to: the writing thread is not a guest's.
                Err(_) => {
                    drop(queue);
                    self.drain_here();
                }
            }
        } else if queue.lines.len() >= QUEUE_MAX_LINES / 2 || queue.bytes >= QUEUE_MAX_BYTES / 2 {
            // Half full: written now, so a burst finds room rather than a full queue.
            self.write_soon_locked(&mut queue);
        }
        true
    }

    /// Has the writer take what is queued to the file now, not after [`WRITE_BEHIND`].
    fn write_soon(&self) {
        let mut queue = self.queue.lock_unpoisoned();
        self.write_soon_locked(&mut queue);
    }

    fn write_soon_locked(&self, queue: &mut Queue) {
        if std::mem::take(&mut queue.lingering) {
            self.write_now.notify_one();
        }
    }

    /// A follower arrived: until it leaves, lines go to the file as soon as they are queued.
    pub(super) fn follower_arrived(&self) {
        self.followers.fetch_add(1, Ordering::SeqCst);
        self.write_soon();
    }

    pub(super) fn follower_left(&self) {
        self.followers.fetch_sub(1, Ordering::SeqCst);
    }

    pub(super) fn lines_dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Returns once every line queued before the call is done with (written now, without
    /// waiting out [`WRITE_BEHIND`]).
    pub(super) async fn settle(&self) {
        let accepted = {
            // One lock for both: a line queued in between would start a writer that waits.
            let mut queue = self.queue.lock_unpoisoned();
            self.write_soon_locked(&mut queue);
            queue.accepted
        };
        let mut done = self.done.subscribe();
        // The sender lives in `self`: this never sees it closed.
        let _ = done.wait_for(|done| *done >= accepted).await;
    }

    /// The writer task: waits out [`WRITE_BEHIND`] (unless cut short or followed), then
    /// batches until the queue is empty. A written batch's buffers take the next batch's
    /// place in the queue, so a steady flood reuses two sets of buffers; they are freed when
    /// the drain ends.
    async fn drain(mut unfinished: UnfinishedDrain) {
        let this = unfinished.log.clone();
        if this.followers.load(Ordering::SeqCst) == 0 {
            tokio::select! {
                () = tokio::time::sleep(WRITE_BEHIND) => {}
                () = this.write_now.notified() => {}
            }
        }
        this.queue.lock_unpoisoned().lingering = false;
        let mut written = QueuedLines::default();
        while let Some(batch) = this.next_batch(written) {
            let count = batch.len() as u64;
            unfinished.in_flight = count;
            let log = this.clone();
            // A panic while writing loses that batch only; it still counts as done.
            written = crate::util::determinism::spawn_blocking(move || {
                log.write_batch(&batch);
                batch
            })
            .await
            .unwrap_or_default();
            unfinished.in_flight = 0;
            this.done.send_modify(|done| *done += count);
            this.report_drops(false);
        }
        unfinished.finished = true;
    }

    /// [`AllocLog::drain`] on the calling thread.
    ///
    /// Also how a drain the runtime dropped midway (it shut down) is finished.
    fn drain_here(&self) {
        let mut written = QueuedLines::default();
        while let Some(batch) = self.next_batch(written) {
            self.write_batch(&batch);
            self.done.send_modify(|done| *done += batch.len() as u64);
            written = batch;
        }
    }

    /// Takes every queued line, leaving `written`'s emptied buffers in their place, or, when
    /// there is none, ends the drain (and reports drops not yet reported).
    fn next_batch(&self, mut written: QueuedLines) -> Option<QueuedLines> {
        let mut queue = self.queue.lock_unpoisoned();
        if queue.lines.is_empty() {
            queue.draining = false;
            // A quiet alloc holds no buffer (freed once the lock is let go).
            let _idle = std::mem::take(&mut queue.lines);
            drop(queue);
            self.report_drops(true);
            return None;
        }
        queue.bytes = 0;
        written.clear();
        Some(std::mem::replace(&mut queue.lines, written))
    }

    fn write_batch(&self, queued: &QueuedLines) {
        let mut files = self.files.write_unpoisoned();
        if !files.removed {
            // Every batch, not the first only: another log of the same alloc (one made after
            // this one was forgotten) may have deleted the files and had them forgotten.
            self.on_disk.writing(&self.alloc_id);
            files.rotations += files.current.append_queued(queued) as i64;
        }
    }

    /// One WARN for the lines dropped since the last one, at most once a
    /// [`DROP_REPORT_INTERVAL`] unless `now`.
    fn report_drops(&self, now: bool) {
        let dropped = {
            let mut queue = self.queue.lock_unpoisoned();
            let at = Instant::now();
            let due = now
                || queue
                    .reported_at
                    .is_none_or(|last| at.saturating_duration_since(last) >= DROP_REPORT_INTERVAL);
            if queue.unreported_drops == 0 || !due {
                return;
            }
            queue.reported_at = Some(at);
            std::mem::take(&mut queue.unreported_drops)
        };
        tracing::warn!(
            alloc_id = %self.alloc_id,
            dropped,
            "the alloc's log writer fell behind: dropped {dropped} lines from its log file (the agent's log has them)"
        );
    }

    /// Discards queued lines, refuses later ones, and deletes every file, one at a time, on
    /// the calling thread, which may block on the disk.
    pub(super) fn remove_blocking(&self) {
        self.discard_queued_lines();
        self.remove_files();
    }

    /// Removal when no file of this alloc can exist, without the disk: discards queued lines
    /// and refuses later ones, as [`AllocLog::remove_blocking`] does, and returns true. Does
    /// nothing and returns false when a file may exist, or a batch is being written (its
    /// writer holds the file lock, and may wait on the disk, so this does not wait for it).
    /// `unregister` is called, under the file lock, once the removal is certain.
    pub(super) fn remove_if_nothing_on_disk(&self, unregister: impl FnOnce()) -> bool {
        let Ok(mut files) = self.files.try_write() else {
            return false;
        };
        // Under the file lock: a batch written before it was taken has told `on_disk`, and
        // none is written after, once `removed` is set.
        if self.on_disk.may_have_files(&self.alloc_id) {
            return false;
        }
        unregister();
        files.removed = true;
        drop(files);
        self.discard_queued_lines();
        true
    }

    /// Discards what is queued and every later line (both count as done), and lets the
    /// writer go: it has nothing left to wait for.
    fn discard_queued_lines(&self) {
        let discarded = {
            let mut queue = self.queue.lock_unpoisoned();
            queue.removed = true;
            queue.bytes = 0;
            self.write_soon_locked(&mut queue);
            std::mem::take(&mut queue.lines)
        };
        self.done
            .send_modify(|done| *done += discarded.len() as u64);
    }

    fn remove_files(&self) {
        let mut files = self.files.write_unpoisoned();
        files.removed = true;
        files.current.close();
        if !self.on_disk.may_have_files(&self.alloc_id) {
            return;
        }
        let mut all_gone = true;
        for path in file::every_file(files.current.path()) {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    all_gone = false;
                    tracing::warn!(
                        alloc_id = %self.alloc_id,
                        path = %path.display(),
                        error = %error,
                        "cannot remove the alloc's log file"
                    );
                }
            }
        }
        if all_gone {
            self.on_disk.deleted(&self.alloc_id);
        }
    }
}

/// Finishes a drain whose task the runtime dropped midway (it shut down, as a test's or a
/// restarted node's runtime does), so the log does not stay "draining" with no writer: its
/// lines would wait forever, and so would whoever settles it. The batch the blocking pool
/// has counts as done (written or not, it is not the queue's any more); what is left is
/// written on the dropping thread.
struct UnfinishedDrain {
    log: Arc<AllocLog>,
    in_flight: u64,
    finished: bool,
}

impl Drop for UnfinishedDrain {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let in_flight = self.in_flight;
        self.log.done.send_modify(|done| *done += in_flight);
        self.log.queue.lock_unpoisoned().lingering = false;
        self.log.drain_here();
    }
}
