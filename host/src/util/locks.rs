//! Locking a [`Mutex`] or an [`RwLock`] that a panic may have poisoned.
//!
//! Every mutex in the host guards data that each holder leaves whole (a value replaced, an
//! entry inserted or removed), so a panic elsewhere while the lock was held leaves nothing half
//! written. Panicking again on the poison would turn one bug into a dead agent: every later
//! caller (every alloc, every HTTP request) would panic in turn. So the host takes the guard
//! back and carries on. This module touches nothing but `std::sync`.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] that recovers the guard from a poisoned lock (see the module docs).
pub trait LockUnpoisoned<T: ?Sized> {
    /// Locks, waiting for the lock; never fails, never panics on poison.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockUnpoisoned<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// [`RwLock::read`] and [`RwLock::write`] that recover the guard from a poisoned lock.
pub trait RwLockUnpoisoned<T: ?Sized> {
    /// Shared access, waiting for writers; never panics on poison.
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T>;
    /// Exclusive access, waiting for everyone; never panics on poison.
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockUnpoisoned<T> for RwLock<T> {
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T> {
        self.write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::LockUnpoisoned;
    use std::sync::Mutex;

    #[test]
    fn a_poisoned_lock_still_hands_out_its_value() {
        let mutex = Mutex::new(1);
        let _ = std::panic::catch_unwind(|| {
            let _guard = mutex.lock().unwrap();
            panic!("poison the lock");
        });
        assert!(mutex.is_poisoned());
        *mutex.lock_unpoisoned() += 1;
        assert_eq!(*mutex.lock_unpoisoned(), 2);
    }
}
