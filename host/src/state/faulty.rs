//! [`FaultyStateDb`]: a [`StateDb`] that fails when told to, for tests of the failure paths.
//! It touches nothing but the store it wraps.

use super::{SavedAlloc, ServerTable, StateDb, StateError, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Passes everything to an inner store, except that while writes are failing every
/// [`StateDb::apply`] returns [`StateError::Injected`] and changes nothing (as a full disk
/// would), and reads can be made to fail too.
pub struct FaultyStateDb {
    inner: Arc<dyn StateDb>,
    fail_writes: AtomicBool,
    fail_reads: AtomicBool,
    failed_writes: AtomicU64,
    commit_delay_ms: AtomicU64,
}

impl FaultyStateDb {
    /// A store that behaves as `inner` until told otherwise.
    pub fn new(inner: Arc<dyn StateDb>) -> Self {
        FaultyStateDb {
            inner,
            fail_writes: AtomicBool::new(false),
            fail_reads: AtomicBool::new(false),
            failed_writes: AtomicU64::new(0),
            commit_delay_ms: AtomicU64::new(0),
        }
    }

    /// Makes every later batch fail (`true`) or pass again (`false`).
    pub fn fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Ordering::SeqCst);
    }

    /// Makes every later commit of a client's persister take `delay` on tokio's clock (see
    /// [`StateDb::commit_delay`]); zero: no delay, as before.
    pub fn slow_commits(&self, delay: std::time::Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.commit_delay_ms.store(millis, Ordering::SeqCst);
    }

    /// Makes every later read fail (`true`) or pass again (`false`).
    pub fn fail_reads(&self, fail: bool) {
        self.fail_reads.store(fail, Ordering::SeqCst);
    }

    /// How many batches were refused so far.
    pub fn failed_writes(&self) -> u64 {
        self.failed_writes.load(Ordering::SeqCst)
    }

    fn check_read(&self) -> Result<(), StateError> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(StateError::Injected("reads are failing".into()));
        }
        Ok(())
    }
}

impl StateDb for FaultyStateDb {
    fn apply(&self, writes: Vec<Write>) -> Result<(), StateError> {
        if self.fail_writes.load(Ordering::SeqCst) {
            self.failed_writes.fetch_add(1, Ordering::SeqCst);
            return Err(StateError::Injected("writes are failing".into()));
        }
        self.inner.apply(writes)
    }

    fn client_allocs(&self) -> Result<Vec<SavedAlloc>, StateError> {
        self.check_read()?;
        self.inner.client_allocs()
    }

    fn server_records(&self, table: ServerTable) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.check_read()?;
        self.inner.server_records(table)
    }

    fn reads_back_saved_state(&self) -> bool {
        self.inner.reads_back_saved_state()
    }

    fn waits_on_io(&self) -> bool {
        self.inner.waits_on_io()
    }

    fn commit_delay(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.commit_delay_ms.load(Ordering::SeqCst))
    }
}
