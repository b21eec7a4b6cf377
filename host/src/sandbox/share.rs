//! What the instances of one tenant's mounts share: its memory budget, its
//! CPU lane, its outbound HTTP connections and its log allowance. Clones
//! share them.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::cpu::CpuLane;
use super::http::HttpConnections;
use super::instances::MemoryBudget;
use crate::sync::Locked;
use wharf_core::config::{LogLevel, TenantBudget};

/// One tenant's share of the host, as its instances see it.
#[derive(Clone)]
pub struct TenantShare {
    /// Instance memory, if the tenant sets `max_memory`.
    pub memory: Option<MemoryBudget>,
    /// Where its handlers take turns on the cores.
    pub lane: CpuLane,
    /// Its outbound HTTP connections.
    pub http_connections: HttpConnections,
    /// What its handlers may log.
    pub log: GuestLog,
}

impl TenantShare {
    /// The share `budget` gives.
    pub fn new(budget: &TenantBudget) -> TenantShare {
        TenantShare {
            memory: budget.max_memory.map(MemoryBudget::new),
            lane: CpuLane::new(budget.max_cpu),
            http_connections: HttpConnections::new(budget.max_http_connections),
            log: GuestLog::new(budget.log_rate, budget.log_level),
        }
    }
}

/// What a tenant's handlers may log: bytes per second (a bucket holding
/// one second's worth, so a burst of that much passes) and the most severe
/// level.
#[derive(Clone)]
pub struct GuestLog {
    bucket: Arc<Mutex<Bucket>>,
    /// The most severe level a line is logged at.
    pub level: LogLevel,
}

struct Bucket {
    per_second: f64,
    bytes: f64,
    filled: Instant,
}

impl GuestLog {
    /// `per_second` bytes a second, lines logged at most at `level`.
    pub fn new(per_second: u64, level: LogLevel) -> GuestLog {
        let per_second = per_second as f64;
        GuestLog {
            bucket: Arc::new(Mutex::new(Bucket {
                per_second,
                bytes: per_second,
                filled: Instant::now(),
            })),
            level,
        }
    }

    /// Whether a line of `bytes` may be logged now; if so it is counted.
    pub(crate) fn take(&self, bytes: usize) -> bool {
        let mut bucket = self.bucket.locked();
        let now = Instant::now();
        let refill = now.duration_since(bucket.filled).as_secs_f64() * bucket.per_second;
        bucket.bytes = (bucket.bytes + refill).min(bucket.per_second);
        bucket.filled = now;
        let bytes = bytes as f64;
        if bytes <= bucket.bytes {
            bucket.bytes -= bytes;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_past_the_rate_is_dropped_and_the_rate_comes_back() {
        let log = GuestLog::new(1000, LogLevel::Warn);
        assert!(log.take(600));
        assert!(log.take(400));
        assert!(
            !log.take(100),
            "more than a second's worth went through at once"
        );
        tokio::time::advance(std::time::Duration::from_millis(200)).await;
        assert!(log.take(200), "nothing came back after 200 ms");
        assert!(!log.take(1), "more came back than 200 ms hold");
    }
}
