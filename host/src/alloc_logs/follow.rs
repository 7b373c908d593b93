//! Reading one alloc's log: everything kept, then whatever is appended, across rotations.
//!
//! A follower's position is a rotation count and an offset into the file of that rotation.
//! Under the file lock, the number of rotations since then says which file that is now
//! (`.1` after one, `.2` after two): the follower reads the rest of it, then each newer file,
//! so every line arrives once and in order, however many rotations happened between reads.
//! Only when more rotations happened than there are kept files are lines gone, with the
//! files that held them.

use super::LOG_FILES_KEPT;
use super::file;
use super::log::AllocLog;
use crate::util::locks::RwLockUnpoisoned;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How often a follower waiting for lines asks whether the alloc has stopped.
pub const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// Reads one alloc's log as it grows. Made by [`super::AllocLogs::follow`]. While one is
/// alive, the alloc's lines go to the file as soon as they are queued (no
/// [`super::WRITE_BEHIND`]), so a follower sees them at once.
pub struct LogFollower {
    log: Arc<AllocLog>,
    stopped: Box<dyn Fn() -> bool + Send + Sync>,
    position: Position,
    started: bool,
}

impl Drop for LogFollower {
    fn drop(&mut self) {
        self.log.follower_left();
    }
}

/// Where the next unread byte is.
#[derive(Debug, Clone, Copy, Default)]
struct Position {
    /// The rotation count of the file being read; none before the first read, which starts
    /// with the oldest kept file.
    rotation: Option<i64>,
    offset: u64,
}

impl LogFollower {
    pub(super) fn new(
        log: Arc<AllocLog>,
        stopped: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Self {
        log.follower_arrived();
        LogFollower {
            log,
            stopped: Box::new(stopped),
            position: Position::default(),
            started: false,
        }
    }

    /// The next piece of the log: first everything kept (perhaps nothing), then each time
    /// what was appended since, waiting until there is some. `None` once the alloc has
    /// stopped and its last line was returned. Call from one task at a time (it takes
    /// `&mut self`); the writer never waits for a follower.
    pub async fn next_chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if !self.started {
            self.started = true;
            return self.read_new().await.map(Some);
        }
        loop {
            // Asked before reading, so the last lines of a stopped alloc are still read.
            let stopped = (self.stopped)();
            if stopped {
                self.log.settle().await;
            }
            let mut appended = self.log.done.subscribe();
            let chunk = self.read_new().await?;
            if !chunk.is_empty() {
                return Ok(Some(chunk));
            }
            if stopped {
                return Ok(None);
            }
            tokio::select! {
                _ = appended.changed() => {}
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
            }
        }
    }

    /// Everything in the files past the follower's position, which moves to the end.
    pub(super) async fn read_new(&mut self) -> std::io::Result<Vec<u8>> {
        let log = self.log.clone();
        let position = self.position;
        let (position, read) = crate::util::determinism::spawn_blocking(move || {
            let mut position = position;
            let read = position.read_new(&log);
            (position, read)
        })
        .await
        .map_err(std::io::Error::other)?;
        self.position = position;
        read
    }
}

impl Position {
    /// Reads from this position to the end of the current file, moving only on success.
    fn read_new(&mut self, log: &AllocLog) -> std::io::Result<Vec<u8>> {
        let files = log.files.read_unpoisoned();
        let mut text = Vec::new();
        if files.removed {
            return Ok(text);
        }
        let kept = LOG_FILES_KEPT as i64;
        let newest = files.rotations;
        let (mut rotation, mut offset) = match self.rotation {
            Some(rotation) if newest - rotation <= kept => (rotation, self.offset),
            // Not read yet, or its file is gone: from the oldest kept.
            _ => (newest - kept, 0),
        };
        loop {
            let behind = newest - rotation;
            let path = match behind {
                0 => files.current.path().to_path_buf(),
                n => file::rotated(files.current.path(), n as usize),
            };
            offset = read_from(&path, offset, &mut text)?;
            if behind == 0 {
                break;
            }
            rotation += 1;
            offset = 0;
        }
        *self = Position {
            rotation: Some(rotation),
            offset,
        };
        Ok(text)
    }
}

/// Appends `path` from `offset` to `text`, returning the offset of its end. A missing file is
/// empty; a file shorter than `offset` was replaced behind the owner's back and is read whole.
fn read_from(path: &Path, offset: u64, text: &mut Vec<u8>) -> std::io::Result<u64> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(error),
    };
    let offset = if file.metadata()?.len() < offset {
        0
    } else {
        offset
    };
    file.seek(SeekFrom::Start(offset))?;
    let read = file.read_to_end(text)?;
    Ok(offset + read as u64)
}
