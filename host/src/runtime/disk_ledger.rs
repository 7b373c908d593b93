//! One alloc directory's disk use, as the host accounts it, against the alloc's quota.
//!
//! Two sources keep the ledger: the [`super::disk_watch`] thread's look at the directory
//! about once a second (what is really there), and the host's WASI filesystem layer
//! ([`super::wasi_quota`]), which reserves every byte and entry a guest asks to add before
//! the write happens. Between looks the ledger holds the last look plus everything reserved
//! since that look began, so a write that would pass the quota is refused in the guest
//! ("no space") instead of landing on disk. Reservations overcount (an overwrite, or a
//! create of a file that exists, reserves too); the next look corrects them.
//!
//! The first limit passed, by a look or by a refused reservation, is reported once through
//! [`QuotaExceeded`], which ends the run with the alloc described as over its quota. The
//! ledger never touches the directory itself.

use crate::locks::LockUnpoisoned;
use crate::units::format_bytes;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// How deep directories may nest under the alloc directory.
pub const MAX_DIR_DEPTH: usize = 64;
/// Files, directories and links an alloc directory may hold.
pub const MAX_DISK_ENTRIES: u64 = 10_000;

/// The quota of one alloc directory.
#[derive(Debug, Clone, Copy)]
pub struct DiskQuota {
    /// Bytes in use (as `du` counts them: blocks).
    pub bytes: u64,
    /// Entries of any kind.
    pub entries: u64,
    /// Nesting of directories.
    pub depth: usize,
}

impl DiskQuota {
    /// The quota of an alloc allowed `bytes`, with the fixed entry and depth limits.
    pub fn of_bytes(bytes: u64) -> Self {
        DiskQuota {
            bytes,
            entries: MAX_DISK_ENTRIES,
            depth: MAX_DIR_DEPTH,
        }
    }

    /// The alloc's description when it holds more bytes than allowed.
    pub fn bytes_exceeded(&self) -> String {
        format!("disk quota of {} exceeded", format_bytes(self.bytes))
    }

    /// The alloc's description when it holds more entries than allowed.
    pub fn entries_exceeded(&self) -> String {
        format!(
            "disk quota exceeded: the alloc directory holds more than {} entries",
            self.entries
        )
    }
}

/// What a look found in the directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUse {
    /// Bytes in use.
    pub bytes: u64,
    /// Entries of any kind.
    pub entries: u64,
}

/// A reservation refused: adding it would pass the quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaFull;

/// One alloc directory's account. Shared by its store and the watcher thread.
pub struct DiskLedger {
    quota: DiskQuota,
    account: Mutex<Account>,
}

#[derive(Default)]
struct Account {
    /// What the last look found.
    looked: DiskUse,
    /// Everything reserved since the ledger began; never decreases but by a release.
    reserved: DiskUse,
    /// `reserved` when the last look began: what was reserved after it may not be on disk
    /// in time for the look to see it.
    reserved_at_look: DiskUse,
    /// Taken by the first report of a limit passed.
    exceeded: Option<oneshot::Sender<String>>,
}

impl Account {
    fn estimate(&self) -> DiskUse {
        DiskUse {
            bytes: self.looked.bytes.saturating_add(
                self.reserved
                    .bytes
                    .saturating_sub(self.reserved_at_look.bytes),
            ),
            entries: self.looked.entries.saturating_add(
                self.reserved
                    .entries
                    .saturating_sub(self.reserved_at_look.entries),
            ),
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
    pub fn already(&mut self) -> Option<String> {
        self.0.try_recv().ok()
    }
}

/// Where a look began, to hand back to [`DiskLedger::looked`].
pub struct LookMark(DiskUse);

impl DiskLedger {
    /// An empty account against `quota`, and where its first limit passed is reported.
    pub fn new(quota: DiskQuota) -> (Arc<DiskLedger>, QuotaExceeded) {
        let (tell, told) = oneshot::channel();
        let ledger = DiskLedger {
            quota,
            account: Mutex::new(Account {
                exceeded: Some(tell),
                ..Account::default()
            }),
        };
        (Arc::new(ledger), QuotaExceeded(told))
    }

    /// The quota this ledger holds the directory to.
    pub fn quota(&self) -> DiskQuota {
        self.quota
    }

    /// Reserves `bytes` for a write about to happen; refused, and the limit reported, when
    /// they would pass the quota.
    pub fn reserve_bytes(&self, bytes: u64) -> Result<(), QuotaFull> {
        let mut account = self.account.lock_unpoisoned();
        if account.estimate().bytes.saturating_add(bytes) > self.quota.bytes {
            report(&mut account, self.quota.bytes_exceeded());
            return Err(QuotaFull);
        }
        account.reserved.bytes = account.reserved.bytes.saturating_add(bytes);
        Ok(())
    }

    /// Reserves one entry for a file, directory or link about to be made; refused, and the
    /// limit reported, when it would pass the quota.
    pub fn reserve_entry(&self) -> Result<(), QuotaFull> {
        let mut account = self.account.lock_unpoisoned();
        if account.estimate().entries.saturating_add(1) > self.quota.entries {
            report(&mut account, self.quota.entries_exceeded());
            return Err(QuotaFull);
        }
        account.reserved.entries = account.reserved.entries.saturating_add(1);
        Ok(())
    }

    /// Gives back what an operation reserved and then did not use (it failed).
    pub fn release(&self, unused: DiskUse) {
        let mut account = self.account.lock_unpoisoned();
        account.reserved.bytes = account.reserved.bytes.saturating_sub(unused.bytes);
        account.reserved.entries = account.reserved.entries.saturating_sub(unused.entries);
    }

    /// Whether a limit was passed (and reported) already: the watcher stops looking.
    pub fn is_exceeded(&self) -> bool {
        self.account.lock_unpoisoned().exceeded.is_none()
    }

    /// A look at the directory begins.
    pub fn look_starting(&self) -> LookMark {
        LookMark(self.account.lock_unpoisoned().reserved)
    }

    /// The look that began at `mark` found `found`, within the quota.
    pub fn looked(&self, mark: LookMark, found: DiskUse) {
        let mut account = self.account.lock_unpoisoned();
        account.looked = found;
        account.reserved_at_look = mark.0;
    }

    /// A look found the directory over its quota: `description` names the limit.
    pub fn exceeded(&self, description: String) {
        report(&mut self.account.lock_unpoisoned(), description);
    }
}

fn report(account: &mut Account, description: String) {
    if let Some(tell) = account.exceeded.take() {
        let _ = tell.send(description);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(bytes: u64, entries: u64) -> DiskQuota {
        DiskQuota {
            bytes,
            entries,
            depth: MAX_DIR_DEPTH,
        }
    }

    #[tokio::test]
    async fn a_reservation_past_the_quota_is_refused_and_reported_once() {
        let (ledger, mut exceeded) = DiskLedger::new(quota(1000, 2));
        assert_eq!(ledger.reserve_bytes(600), Ok(()));
        assert_eq!(ledger.reserve_bytes(400), Ok(()));
        assert_eq!(ledger.reserve_bytes(1), Err(QuotaFull));
        assert!(ledger.is_exceeded());
        assert_eq!(
            exceeded.description().await,
            "disk quota of 1000 bytes exceeded"
        );
        // Entries are their own limit, reported only if nothing was before.
        assert_eq!(ledger.reserve_entry(), Ok(()));
        assert_eq!(ledger.reserve_entry(), Ok(()));
        assert_eq!(ledger.reserve_entry(), Err(QuotaFull));
    }

    #[test]
    fn a_look_replaces_what_was_reserved_before_it_began() {
        let (ledger, _exceeded) = DiskLedger::new(quota(1000, 10));
        ledger.reserve_bytes(900).unwrap();
        // The guest deleted most of it; the look sees 100 bytes. A reservation made while the
        // look ran still counts, as the look may have missed it.
        let mark = ledger.look_starting();
        ledger.reserve_bytes(50).unwrap();
        ledger.looked(
            mark,
            DiskUse {
                bytes: 100,
                entries: 1,
            },
        );
        assert_eq!(ledger.reserve_bytes(850), Ok(()));
        assert_eq!(ledger.reserve_bytes(1), Err(QuotaFull));
        // A failed write gives its reservation back.
        let (ledger, _exceeded) = DiskLedger::new(quota(1000, 10));
        ledger.reserve_bytes(1000).unwrap();
        ledger.release(DiskUse {
            bytes: 1000,
            entries: 0,
        });
        assert_eq!(ledger.reserve_bytes(1000), Ok(()));
        assert!(!ledger.is_exceeded());
    }
}
