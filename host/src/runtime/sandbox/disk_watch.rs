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
//! write that would cross the line is refused by the WASI layer (`runtime/sandbox/wasi_quota.rs`)
//! from the ledger's account. Each look is bounded too: it stops as soon as a limit is
//! passed, so a guest's million files cost it one failed check, not a million `stat`s per
//! second. It holds one descriptor per level it is in, and never goes deeper than the depth
//! limit.
//!
//! It only reads the alloc directory; it never changes it.

use crate::runtime::sandbox::disk_ledger::DiskLedger;
use crate::util::locks::LockUnpoisoned;
use std::collections::HashMap;
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
