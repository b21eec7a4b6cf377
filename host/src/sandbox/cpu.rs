//! Keeping long-running handlers from crowding out everyone else.
//!
//! Handlers are expected to finish in milliseconds. One that keeps running
//! past [`LONG_RUNNING_AFTER_SLICES`] epoch ticks is deprioritised: from then
//! on each of its slices needs its tenant's [`CpuLane`] (one slice of the
//! tenant's long-running handlers at a time) and is followed by a pause. A
//! tenant whose handlers all spin therefore gets at most
//! `slice / (slice + pause)` of one core, and other tenants keep their speed.
//! Short handlers never meet the lane.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Epoch ticks a call may run before it counts as long-running (about
/// 50 ms of running at the 10 ms tick).
pub(crate) const LONG_RUNNING_AFTER_SLICES: u32 = 5;

/// The pause after each slice of a long-running call: with 10 ms slices a
/// tenant's long-running handlers together get at most a tenth of a core.
pub(crate) const PAUSE: Duration = Duration::from_millis(90);

/// The right to run one slice of a long-running handler, shared by one
/// tenant's mounts.
#[derive(Clone)]
pub struct CpuLane {
    slot: Arc<Semaphore>,
}

impl CpuLane {
    /// A lane of its own.
    pub fn new() -> CpuLane {
        CpuLane {
            slot: Arc::new(Semaphore::new(1)),
        }
    }
}

impl Default for CpuLane {
    fn default() -> CpuLane {
        CpuLane::new()
    }
}

/// One call's use of its lane.
pub(crate) struct CpuUse {
    lane: CpuLane,
    slices: u32,
    held: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl CpuUse {
    pub(crate) fn new(lane: CpuLane) -> CpuUse {
        CpuUse {
            lane,
            slices: 0,
            held: Arc::default(),
        }
    }

    /// A new call starts with a clean record.
    pub(crate) fn reset(&mut self) {
        self.slices = 0;
        self.release();
    }

    /// Called at every epoch tick the call runs through: `None` while it is
    /// short, else what to wait for before its next slice.
    pub(crate) fn tick(&mut self) -> Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> {
        self.slices += 1;
        if self.slices < LONG_RUNNING_AFTER_SLICES {
            return None;
        }
        self.release();
        let slot = self.lane.slot.clone();
        let held = self.held.clone();
        Some(Box::pin(async move {
            tokio::time::sleep(PAUSE).await;
            let permit = slot
                .acquire_owned()
                .await
                .expect("lane semaphores are never closed");
            *lock(&held) = Some(permit);
        }))
    }

    fn release(&mut self) {
        lock(&self.held).take();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
