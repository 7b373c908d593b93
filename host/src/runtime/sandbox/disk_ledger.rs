//! One alloc directory's disk use, as the host accounts it, against the alloc's quota.
//!
//! Two sources keep the ledger: looks at the directory (what is really there: the
//! [`crate::runtime::sandbox::disk_watch`] thread about once a second, and a look of the ledger's own when a
//! reservation would pass the quota), and the host's WASI filesystem layer
//! (`runtime/sandbox/wasi_quota.rs`), which reserves the blocks and entries a guest asks to add
//! before the operation runs. The account is
//!
//! ```text
//! what the last look found + what settled since that look began + what is in flight
//! ```
//!
//! A reservation is in flight until its operation completes ([`Reservation::settle`]) or
//! fails (dropped unsettled: given back). In-flight work is always counted, because a look
//! may or may not see it; settled work is counted until a look that began after it. Errors
//! are all on the safe side: an overwrite, or a create of a file that exists, reserves too,
//! and what a look saw of an in-flight write is counted twice. So before a reservation is
//! refused, the ledger looks again (at most every [`RECHECK_INTERVAL`]) and refuses only if
//! the directory is still too full.
//!
//! The first limit passed is reported once through [`QuotaExceeded`], which ends the run
//! with the alloc described as over its quota. The ledger only reads the directory.

use crate::runtime::sandbox::disk_usage::check;
pub use crate::runtime::sandbox::disk_usage::{DiskQuota, DiskUse};
use crate::util::locks::LockUnpoisoned;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The least time between two looks a refused reservation makes: a guest at its quota that
/// keeps writing costs one bounded look per interval, charged to its CPU budget.
pub const RECHECK_INTERVAL: Duration = Duration::from_millis(100);

/// A reservation refused: the directory would pass its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaFull;

/// One alloc directory's account. Shared by its store and the watcher thread.
pub struct DiskLedger {
    dir: PathBuf,
    quota: DiskQuota,
    /// Read on first use: most runners never write a file, and reading it costs a start
    /// two `stat`s, before its directory exists.
    block: OnceLock<u64>,
    recheck_interval: Duration,
    account: Mutex<Account>,
}

#[derive(Default)]
struct Account {
    /// What the last look found.
    looked: DiskUse,
    /// Every settled reservation since the ledger began.
    settled: DiskUse,
    /// `settled` when the last look began.
    settled_at_look: DiskUse,
    /// Reserved for operations not yet complete.
    in_flight: DiskUse,
    /// When the ledger last looked for itself.
    rechecked_at: Option<Instant>,
    /// Taken by the first report of a limit passed.
    exceeded: Option<oneshot::Sender<String>>,
}

impl Account {
    fn estimate(&self) -> DiskUse {
        self.looked
            .plus(self.settled.minus(self.settled_at_look))
            .plus(self.in_flight)
    }

    fn report(&mut self, description: String) {
        if let Some(tell) = self.exceeded.take() {
            let _ = tell.send(description);
        }
    }
}

/// Where the first limit passed is reported, once.
pub struct QuotaExceeded(oneshot::Receiver<String>);

impl QuotaExceeded {
    /// Completes with the alloc's description once a limit is passed; never, while none is.
    pub async fn description(&mut self) -> String {
        match (&mut self.0).await {
            Ok(description) => description,
            Err(_) => std::future::pending().await,
        }
    }

    /// The description, if a limit has been passed already.
    pub fn try_description(&mut self) -> Option<String> {
        self.0.try_recv().ok()
    }
}

/// Where a look began: what had settled by then.
struct LookMark(DiskUse);

/// Blocks and entries held for one operation: [`Reservation::settle`] it when the operation
/// has completed; dropping it unsettled gives it back.
#[must_use = "an unsettled reservation is given back when dropped"]
pub struct Reservation {
    ledger: Arc<DiskLedger>,
    amount: DiskUse,
}

impl Reservation {
    /// The operation completed: what it reserved is now on disk, for the next look to see.
    pub fn settle(mut self) {
        let amount = std::mem::take(&mut self.amount);
        let mut account = self.ledger.account.lock_unpoisoned();
        account.in_flight = account.in_flight.minus(amount);
        account.settled = account.settled.plus(amount);
    }

    /// Adds `more` to this reservation (a stream's next write before the last settled).
    pub fn merge(&mut self, more: Reservation) {
        self.amount = self.amount.plus(more.amount);
        std::mem::forget(more);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut account = self.ledger.account.lock_unpoisoned();
        account.in_flight = account.in_flight.minus(self.amount);
    }
}

impl DiskLedger {
    /// An empty account of `dir` against `quota`, and where its first limit passed is
    /// reported. Call [`DiskLedger::look_now`] before the guest runs when `dir` may hold
    /// something already.
    pub fn new(dir: PathBuf, quota: DiskQuota) -> (Arc<DiskLedger>, QuotaExceeded) {
        let (tell, told) = oneshot::channel();
        let ledger = DiskLedger {
            block: OnceLock::new(),
            dir,
            quota,
            recheck_interval: RECHECK_INTERVAL,
            account: Mutex::new(Account {
                exceeded: Some(tell),
                ..Account::default()
            }),
        };
        (Arc::new(ledger), QuotaExceeded(told))
    }

    /// The filesystem's block: what the smallest write to a new place takes on disk.
    pub fn block(&self) -> u64 {
        *self.block.get_or_init(|| block_size(&self.dir))
    }

    /// What writing `len` bytes at `offset` may take on disk: every block it touches, or,
    /// when the offset is not known, its length in blocks and one more.
    pub fn blocks_for_write(&self, offset: Option<u64>, len: u64) -> DiskUse {
        let block = self.block();
        let bytes = match (len, offset) {
            (0, _) => 0,
            (_, Some(offset)) => {
                let end = offset.saturating_add(len).div_ceil(block);
                (end - offset / block).saturating_mul(block)
            }
            (_, None) => len.div_ceil(block).saturating_add(1).saturating_mul(block),
        };
        DiskUse { bytes, entries: 0 }
    }

    /// Reserves `amount` for an operation about to run. When it would pass the quota the
    /// ledger looks at the directory first (unless it did within [`RECHECK_INTERVAL`]) and
    /// refuses, reporting the limit, only if it still would.
    pub fn reserve(self: &Arc<Self>, amount: DiskUse) -> Result<Reservation, QuotaFull> {
        let mut account = self.account.lock_unpoisoned();
        // Nothing asked (an open that creates nothing) always fits, however full the account.
        let adds = amount != DiskUse::default();
        if adds
            && self
                .quota
                .exceeded_by(account.estimate().plus(amount))
                .is_some()
        {
            let recently = account
                .rechecked_at
                .is_some_and(|at| at.elapsed() < self.recheck_interval);
            if !recently {
                account.rechecked_at = Some(Instant::now());
                drop(account);
                self.look_now();
                account = self.account.lock_unpoisoned();
            }
            if let Some(description) = self.quota.exceeded_by(account.estimate().plus(amount)) {
                account.report(description);
                return Err(QuotaFull);
            }
        }
        account.in_flight = account.in_flight.plus(amount);
        Ok(Reservation {
            ledger: self.clone(),
            amount,
        })
    }

    /// Looks at the directory now, on this thread, and corrects the account (or reports the
    /// limit it is over).
    pub fn look_now(&self) {
        let mark = self.look_starting();
        match check(&self.dir, self.quota) {
            Ok(Some(found)) => self.looked(mark, found),
            Ok(None) => {}
            Err(description) => self.exceeded(description),
        }
    }

    /// Whether a limit was passed and reported already: the watcher stops looking.
    pub fn is_reported(&self) -> bool {
        self.account.lock_unpoisoned().exceeded.is_none()
    }

    /// A look at the directory begins.
    fn look_starting(&self) -> LookMark {
        LookMark(self.account.lock_unpoisoned().settled)
    }

    /// The look that began at `mark` found `found`, within the quota.
    fn looked(&self, mark: LookMark, found: DiskUse) {
        let mut account = self.account.lock_unpoisoned();
        account.looked = found;
        account.settled_at_look = mark.0;
    }

    /// A look found the directory over its quota: `description` names the limit.
    fn exceeded(&self, description: String) {
        self.account.lock_unpoisoned().report(description);
    }
}

/// The block size of the filesystem `dir` is on (of its nearest existing ancestor), within
/// sane bounds; 4 KiB when none can be read.
fn block_size(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    dir.ancestors()
        .find_map(|ancestor| std::fs::metadata(ancestor).ok())
        .map(|metadata| metadata.blksize().clamp(512, 1 << 20))
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ledger of a fresh directory that looks again on every refusal (`ZERO`) or only on
    /// the first (`MAX`), so no test depends on how fast it runs.
    fn ledger(
        bytes: u64,
        recheck_interval: Duration,
    ) -> (tempfile::TempDir, Arc<DiskLedger>, QuotaExceeded) {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, exceeded) =
            DiskLedger::new(dir.path().to_path_buf(), DiskQuota::of_bytes(bytes));
        let mut ledger = Arc::into_inner(ledger).unwrap();
        ledger.recheck_interval = recheck_interval;
        (dir, Arc::new(ledger), exceeded)
    }

    fn bytes(bytes: u64) -> DiskUse {
        DiskUse { bytes, entries: 0 }
    }

    #[tokio::test]
    async fn a_reservation_past_the_quota_is_refused_and_reported_once() {
        let (_dir, ledger, mut exceeded) = ledger(8192, Duration::MAX);
        ledger.reserve(bytes(4096)).unwrap().settle();
        ledger.reserve(bytes(4096)).unwrap().settle();
        // The first refusal looks first, and finds nothing on disk (nothing was written): the
        // reservation goes through. Later ones do not look again.
        let third = ledger.reserve(bytes(4096)).unwrap();
        let fourth = ledger.reserve(bytes(4096)).unwrap();
        assert_eq!(ledger.reserve(bytes(1)).err(), Some(QuotaFull));
        drop((third, fourth));
        assert!(ledger.is_reported());
        assert_eq!(exceeded.description().await, "disk quota of 8 KiB exceeded");
        let entries = DiskUse {
            bytes: 0,
            entries: u64::from(crate::model::structs::Limits::default().disk_entries) + 1,
        };
        assert_eq!(ledger.reserve(entries).err(), Some(QuotaFull));
    }

    #[test]
    fn in_flight_work_always_counts_and_settled_work_until_a_later_look() {
        let (dir, ledger, _exceeded) = ledger(3 * 4096, Duration::ZERO);
        let in_flight = ledger.reserve(bytes(4096)).unwrap();
        // A look while that write is in flight sees nothing of it.
        ledger.look_now();
        // Another write completes, and is on disk.
        ledger.reserve(bytes(4096)).unwrap().settle();
        std::fs::write(dir.path().join("f"), vec![1u8; 4096]).unwrap();
        // Looking again finds the settled one; the in-flight one still counts.
        assert_eq!(ledger.reserve(bytes(2 * 4096)).err(), Some(QuotaFull));
        // An operation that fails gives its reservation back.
        drop(in_flight);
        let mut writes = ledger.reserve(bytes(4096)).unwrap();
        writes.merge(ledger.reserve(bytes(4096)).unwrap());
        writes.settle();
        // A look finds only what is on disk (one block): three more do not fit.
        assert!(ledger.reserve(bytes(3 * 4096)).is_err());
    }

    #[test]
    fn a_write_reserves_every_block_it_touches() {
        let (_dir, ledger, _exceeded) = ledger(1 << 20, Duration::ZERO);
        let block = ledger.block();
        let blocks = |offset, len| ledger.blocks_for_write(offset, len).bytes / block;
        assert_eq!(blocks(Some(0), 1), 1);
        assert_eq!(blocks(Some(block - 1), 2), 2, "across a block boundary");
        assert_eq!(blocks(Some(10 * block), block), 1);
        assert_eq!(blocks(None, 1), 2, "an unknown offset may straddle");
        assert_eq!(blocks(Some(5), 0), 0);
        assert_eq!(blocks(Some(u64::MAX - 1), 10), 1, "no overflow at the end");
    }

    #[test]
    fn a_refusal_looks_again_so_overwrites_do_not_fail_an_honest_runner() {
        let (dir, ledger, _exceeded) = ledger(2 * 4096, Duration::ZERO);
        // The runner rewrites one 4 KiB file again and again: each write reserves a block,
        // and each refusal's look finds one block in use.
        std::fs::write(dir.path().join("state"), vec![1u8; 4096]).unwrap();
        for _ in 0..10 {
            ledger.reserve(bytes(4096)).unwrap().settle();
        }
        assert!(!ledger.is_reported());
    }
}
