//! A tenant's budgets at run time, shared by all its mounts. A delivery
//! waits for room before its handler runs; a mount whose deliveries wait
//! takes no more off its link (its credit is not renewed), so reaching a
//! budget slows the tenant down and never fails or loses a delivery.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::sandbox::TenantShare;
use crate::sync::Locked;
use wharf_core::config::TenantBudget;

/// The semaphores behind a tenant's budget; `None` where it sets no limit.
pub(crate) struct TenantLimits {
    /// The tenant's mounts, which share its `max_buffered`.
    mounts: u32,
    running: Option<Arc<Semaphore>>,
    pending_copies: Option<Arc<Semaphore>>,
    pace: Option<Pace>,
    buffered: Buffered,
    share: TenantShare,
}

/// A tenant's `max_rate`: deliveries start at most that many a second,
/// [`Pace::BURST`] of them at once after a quiet spell.
struct Pace {
    interval: Duration,
    /// When the next delivery would start if they all came evenly spaced.
    next: Mutex<Instant>,
}

impl Pace {
    /// How far ahead of its even spacing a delivery may start.
    const BURST: Duration = Duration::from_millis(100);

    fn new(per_second: u32) -> Pace {
        Pace {
            interval: Duration::from_secs(1) / per_second.max(1),
            next: Mutex::new(Instant::now()),
        }
    }

    /// Waits for this delivery's time to start: its slot in the even
    /// spacing, less the burst.
    async fn wait(&self) {
        let at = {
            let mut next = self.next.locked();
            let slot = (*next).max(Instant::now());
            *next = slot + self.interval;
            slot.checked_sub(Pace::BURST).unwrap_or(slot)
        };
        tokio::time::sleep_until(at).await;
    }
}

/// Bytes of deliveries held from when each is taken off its link until it
/// is settled (a tenant's `max_buffered`, or the host's). Counted in KiB.
#[derive(Clone)]
pub(crate) struct Buffered {
    kib: Arc<Semaphore>,
    total: u32,
}

impl Buffered {
    pub(crate) fn new(bytes: u64) -> Buffered {
        let total = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .clamp(1, Semaphore::MAX_PERMITS as u32);
        Buffered {
            kib: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// The budget, in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        u64::from(self.total) * 1024
    }

    /// Waits for room for a delivery of `bytes`: at most the whole budget,
    /// so a delivery larger than it still passes, alone.
    pub(crate) async fn hold(&self, bytes: usize) -> OwnedSemaphorePermit {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        self.kib
            .clone()
            .acquire_many_owned(kib.clamp(1, self.total))
            .await
            .expect("budget semaphores are never closed")
    }
}

/// What a delivery holds from when it is taken off its link until it is
/// settled: its place among the mount's unsettled deliveries, and its bytes
/// in its tenant's and the host's [`Buffered`] budgets.
pub(crate) struct Room {
    _unsettled: OwnedSemaphorePermit,
    _tenant: OwnedSemaphorePermit,
    _host: OwnedSemaphorePermit,
}

impl Room {
    pub(crate) fn new(
        unsettled: OwnedSemaphorePermit,
        tenant: OwnedSemaphorePermit,
        host: OwnedSemaphorePermit,
    ) -> Room {
        Room {
            _unsettled: unsettled,
            _tenant: tenant,
            _host: host,
        }
    }
}

/// A delivery's admission to run: a running slot and a pending-copy slot, held
/// until the delivery is settled. A delivery whose copy waits out a delay
/// gives its running slot back and keeps the pending-copy slot.
pub(crate) struct Admission {
    running: Option<OwnedSemaphorePermit>,
    _copy_slot: Option<OwnedSemaphorePermit>,
}

impl Admission {
    /// The handler is done; only the wait for a delayed copy remains.
    pub(crate) fn release_running(&mut self) {
        self.running = None;
    }
}

impl TenantLimits {
    pub(crate) fn new(budget: TenantBudget, mounts: usize) -> Arc<TenantLimits> {
        let semaphore = |n: u32| Arc::new(Semaphore::new(n as usize));
        Arc::new(TenantLimits {
            mounts: u32::try_from(mounts).unwrap_or(u32::MAX).max(1),
            running: budget.max_running.map(semaphore),
            pending_copies: budget.max_pending_copies.map(semaphore),
            pace: budget.max_rate.map(Pace::new),
            buffered: Buffered::new(budget.max_buffered),
            share: TenantShare::new(&budget),
        })
    }

    /// What the tenant's instances share.
    pub(crate) fn share(&self) -> TenantShare {
        self.share.clone()
    }

    /// Whether a host log line of about `bytes` about what the tenant's
    /// traffic did (a delivery refused unread, a handler's failure) may be
    /// logged at its level now: such lines are charged to the tenant's
    /// `log_rate` like its handlers' own, so a publisher flooding a mount
    /// with bad messages cannot flood the log.
    pub(crate) fn may_tell(&self, bytes: usize) -> bool {
        self.share.log.take(bytes)
    }

    /// One mount's share of the tenant's `max_buffered`, in bytes.
    pub(crate) fn buffered_share(&self) -> u64 {
        self.buffered.bytes() / u64::from(self.mounts)
    }

    /// The tenant's bytes of deliveries held.
    pub(crate) fn buffered(&self) -> &Buffered {
        &self.buffered
    }

    /// Waits until the tenant may run one more delivery.
    pub(crate) async fn admit(&self) -> Admission {
        if let Some(pace) = &self.pace {
            pace.wait().await;
        }
        Admission {
            running: acquire(&self.running).await,
            _copy_slot: acquire(&self.pending_copies).await,
        }
    }
}

async fn acquire(semaphore: &Option<Arc<Semaphore>>) -> Option<OwnedSemaphorePermit> {
    match semaphore {
        Some(semaphore) => Some(
            semaphore
                .clone()
                .acquire_owned()
                .await
                .expect("budget semaphores are never closed"),
        ),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_full_budget_waits_until_a_delivery_finishes() {
        let limits = TenantLimits::new(
            TenantBudget {
                max_running: Some(1),
                ..TenantBudget::default()
            },
            1,
        );
        let first = limits.admit().await;
        let second = tokio::time::timeout(std::time::Duration::from_secs(60), limits.admit());
        assert!(second.await.is_err(), "a second delivery got in");
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(1), limits.admit())
            .await
            .expect("room once the first finished");
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_held_wait_for_room_and_one_large_delivery_passes_alone() {
        let buffered = Buffered::new(64 * 1024);
        let large = buffered.hold(10 << 20).await;
        let next = tokio::time::timeout(std::time::Duration::from_secs(60), buffered.hold(1));
        assert!(
            next.await.is_err(),
            "room beside a delivery as large as the budget"
        );
        drop(large);
        let a = buffered.hold(32 * 1024).await;
        let _b = buffered.hold(32 * 1024).await;
        let third = tokio::time::timeout(std::time::Duration::from_secs(60), buffered.hold(1));
        assert!(third.await.is_err(), "the budget held more than it has");
        drop(a);
        let _room = tokio::time::timeout(std::time::Duration::from_secs(1), buffered.hold(1))
            .await
            .expect("room once a delivery was settled");
    }

    #[tokio::test(start_paused = true)]
    async fn max_rate_lets_a_burst_through_then_spaces_deliveries_evenly() {
        let limits = TenantLimits::new(
            TenantBudget {
                max_rate: Some(100),
                ..TenantBudget::default()
            },
            1,
        );
        let started = Instant::now();
        // A tenth of a second's worth at once, beside the first.
        for _ in 0..11 {
            let _ = limits.admit().await;
        }
        assert_eq!(started.elapsed(), Duration::ZERO);
        for _ in 0..100 {
            let _ = limits.admit().await;
        }
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        // After a quiet spell the burst is back, and no more than it.
        tokio::time::advance(Duration::from_secs(5)).await;
        let quiet = Instant::now();
        for _ in 0..12 {
            let _ = limits.admit().await;
        }
        assert_eq!(quiet.elapsed(), Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_copy_keeps_its_slot_after_the_handler_is_done() {
        let limits = TenantLimits::new(
            TenantBudget {
                max_pending_copies: Some(1),
                ..TenantBudget::default()
            },
            1,
        );
        let mut waiting_copy = limits.admit().await;
        waiting_copy.release_running();
        let waiting = tokio::time::timeout(std::time::Duration::from_secs(60), limits.admit());
        assert!(waiting.await.is_err(), "a pending copy's slot was free");
        drop(waiting_copy);
        tokio::time::timeout(std::time::Duration::from_secs(1), limits.admit())
            .await
            .expect("room once the copy was published");
    }
}
