//! Locks that ignore poisoning. A panic in a delivery task or a handler's
//! host call must not spread to every later user of a shared map or
//! counter: each lock in the host guards data a single statement updates,
//! which a panic cannot leave half-written.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] without poisoning.
pub(crate) trait Locked<T> {
    /// The guard, whether or not an earlier holder panicked.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock`] without poisoning.
pub(crate) trait ReadWrite<T> {
    /// A read guard, whether or not an earlier holder panicked.
    fn reading(&self) -> RwLockReadGuard<'_, T>;
    /// A write guard, whether or not an earlier holder panicked.
    fn writing(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T> ReadWrite<T> for RwLock<T> {
    fn reading(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn writing(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}
