//! The alloc directory's quota, looked at the way Nomad checks `ephemeral_disk`: the host
//! looks at what the directory holds every [`CHECK_INTERVAL`] while the runner runs, keeps
//! the alloc's [`DiskLedger`] up to date with what it found, and fails the alloc, naming the
//! limit, once it holds more bytes, more entries or deeper directories than allowed.
//!
//! One [`DiskWatcher`] thread per runtime looks at every watched directory in turn. A timer
//! and a blocking-pool task per alloc cost an agent with 1,000 idle allocs 0.85 s of CPU per
//! 10 s (0.05 s without any check); this thread costs 0.13 s (see `docs/bench/history.md`).
//!
//! The look is what corrects the ledger (deletions, overwrites) and what catches depth; the
//! write that would cross the line is refused by the WASI layer (`runtime/wasi_quota.rs`)
//! from the ledger's account. Each look is bounded too: it stops as soon as a limit is
//! passed, so a guest's million files cost it one failed check, not a million `stat`s per
//! second. It holds one descriptor per level it is in, and never goes deeper than the depth
//! limit.
//!
//! It only reads the alloc directory; it never changes it.

use super::disk_ledger::{DiskLedger, DiskQuota, DiskUse};
use crate::util::locks::LockUnpoisoned;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use std::collections::HashMap;
use std::ffi::CString;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a running alloc's directory is looked at.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Watches alloc directories from one thread of its own. Cheap to clone.
#[derive(Clone)]
pub struct DiskWatcher {
    inner: Arc<WatcherInner>,
}

struct WatcherInner {
    watched: Mutex<HashMap<u64, Watched>>,
    next_id: AtomicU64,
    stop: Arc<AtomicBool>,
}

struct Watched {
    ledger: Arc<DiskLedger>,
}

/// One directory being watched; dropping it stops the watch.
pub struct Watch {
    id: u64,
    watcher: DiskWatcher,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.watcher
            .inner
            .watched
            .lock_unpoisoned()
            .remove(&self.id);
    }
}

impl DiskWatcher {
    /// Starts the watching thread; it ends when `stop` is set.
    pub fn start(stop: Arc<AtomicBool>) -> std::io::Result<DiskWatcher> {
        let watcher = DiskWatcher {
            inner: Arc::new(WatcherInner {
                watched: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                stop,
            }),
        };
        let looking = watcher.inner.clone();
        std::thread::Builder::new()
            .name("caravan-disk-watch".into())
            .spawn(move || looking.run())?;
        Ok(watcher)
    }

    /// Looks at `ledger`'s directory (against its quota) until the returned [`Watch`] is
    /// dropped; a limit passed is reported through the ledger.
    pub fn watch(&self, ledger: Arc<DiskLedger>) -> Watch {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let watched = Watched { ledger };
        self.inner.watched.lock_unpoisoned().insert(id, watched);
        Watch {
            id,
            watcher: self.clone(),
        }
    }
}

impl WatcherInner {
    fn run(&self) {
        let mut round_started = std::time::Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            // A round slower than the interval starts the next one at once, and says so: the
            // quota is then looked at less often than promised.
            let took = round_started.elapsed();
            if took > CHECK_INTERVAL {
                tracing::warn!(
                    took_ms = took.as_millis() as u64,
                    watched = self.watched.lock_unpoisoned().len(),
                    "looking at every alloc dir took longer than the quota check interval"
                );
            } else {
                std::thread::sleep(CHECK_INTERVAL - took);
            }
            round_started = std::time::Instant::now();
            let ledgers: Vec<Arc<DiskLedger>> = self
                .watched
                .lock_unpoisoned()
                .values()
                .filter(|watched| !watched.ledger.is_reported())
                .map(|watched| watched.ledger.clone())
                .collect();
            for ledger in ledgers {
                ledger.look_now();
            }
        }
    }
}

/// What `dir` holds, or the first limit it passes, described for the alloc; `None` when it
/// cannot be opened. Unreadable entries are skipped: the check only ever fails an alloc for
/// what it saw.
pub fn check(dir: &Path, quota: DiskQuota) -> Result<Option<DiskUse>, String> {
    let Ok(root) = rustix::fs::openat(
        CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Ok(None);
    };
    let (mut bytes, mut entries) = (0u64, 0u64);
    // Directories still to read: their parent (kept open while any child waits), name, depth.
    let mut pending: Vec<(Rc<OwnedFd>, CString, usize)> = Vec::new();
    let mut reading = Some((Rc::new(root), 0usize));
    while let Some((directory, depth)) = reading.take() {
        // Counted while read, so a directory of a million entries costs one limit's worth.
        let Ok(mut reader) = rustix::fs::Dir::read_from(&*directory) else {
            reading = next_directory(&mut pending);
            continue;
        };
        while let Some(Ok(entry)) = reader.read() {
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let (name, file_type) = (name.to_owned(), entry.file_type());
            entries += 1;
            if entries > quota.entries {
                return Err(quota.entries_exceeded());
            }
            let Ok(stat) = rustix::fs::statat(
                directory.as_fd(),
                name.as_c_str(),
                AtFlags::SYMLINK_NOFOLLOW,
            ) else {
                continue;
            };
            bytes = bytes.saturating_add(u64::try_from(stat.st_blocks).unwrap_or(0) * 512);
            if bytes > quota.bytes {
                return Err(quota.bytes_exceeded());
            }
            let is_directory = match file_type {
                FileType::Directory => true,
                FileType::Unknown => FileType::from_raw_mode(stat.st_mode) == FileType::Directory,
                _ => false,
            };
            if is_directory {
                if depth + 1 > quota.depth {
                    return Err(format!(
                        "disk quota exceeded: directories nest deeper than {} levels",
                        quota.depth
                    ));
                }
                pending.push((directory.clone(), name, depth + 1));
            }
        }
        drop(directory);
        reading = next_directory(&mut pending);
    }
    Ok(Some(DiskUse { bytes, entries }))
}

/// Opens the next pending directory that can still be opened.
fn next_directory(
    pending: &mut Vec<(Rc<OwnedFd>, CString, usize)>,
) -> Option<(Rc<OwnedFd>, usize)> {
    while let Some((parent, name, depth)) = pending.pop() {
        let opened = rustix::fs::openat(
            parent.as_fd(),
            name.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        if let Ok(directory) = opened {
            return Some((Rc::new(directory), depth));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(bytes: u64, entries: u64, depth: usize) -> DiskQuota {
        DiskQuota {
            bytes,
            entries,
            depth,
        }
    }

    #[test]
    fn a_directory_within_its_quota_passes_with_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/file"), vec![1u8; 10_000]).unwrap();
        let found = check(dir.path(), DiskQuota::of_bytes(1 << 30))
            .unwrap()
            .unwrap();
        assert_eq!(found.entries, 3);
        assert!(found.bytes >= 10_000, "{found:?}");
        assert_eq!(check(&dir.path().join("missing"), quota(1, 1, 1)), Ok(None));
    }

    #[test]
    fn bytes_entries_and_depth_are_each_named_when_passed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big"), vec![1u8; 1 << 20]).unwrap();
        assert_eq!(
            check(dir.path(), quota(512 * 1024, 100, 10)),
            Err("disk quota of 512 KiB exceeded".to_string())
        );

        let dir = tempfile::tempdir().unwrap();
        for i in 0..20 {
            std::fs::write(dir.path().join(format!("f{i}")), "").unwrap();
        }
        assert_eq!(
            check(dir.path(), quota(1 << 30, 10, 10)),
            Err("disk quota exceeded: the alloc directory holds more than 10 entries".to_string())
        );

        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("1/2/3/4/5")).unwrap();
        assert_eq!(
            check(dir.path(), quota(1 << 30, 100, 4)),
            Err("disk quota exceeded: directories nest deeper than 4 levels".to_string())
        );
        assert!(check(dir.path(), quota(1 << 30, 100, 5)).is_ok());
    }
}
