//! Waits between attempts to reach something that failed.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher as _;
use std::time::Duration;

/// How long to wait between attempts: doubling from `initial` to `max`,
/// each wait picked at random between half and all of it, so many mounts
/// cut off at once do not come back in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

/// The waits of one run of failures.
#[derive(Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    failures: u32,
    random: RandomState,
}

impl Backoff {
    /// A backoff with no failures yet.
    pub fn new(policy: BackoffPolicy) -> Backoff {
        Backoff {
            policy,
            failures: 0,
            random: RandomState::new(),
        }
    }

    /// The wait before the next attempt, after one more failure.
    pub fn next_wait(&mut self) -> Duration {
        let doubled = self
            .policy
            .initial
            .saturating_mul(1 << self.failures.min(20));
        let ceiling = doubled.min(self.policy.max).max(self.policy.initial);
        self.failures = self.failures.saturating_add(1);
        // Between half and all of the ceiling.
        let spread = u64::try_from(ceiling.as_nanos() / 2).unwrap_or(u64::MAX);
        let jitter = self.random.hash_one(self.failures) % spread.max(1);
        ceiling - Duration::from_nanos(spread) + Duration::from_nanos(jitter)
    }

    /// Forgets earlier failures: the thing came up and stayed up.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: BackoffPolicy = BackoffPolicy {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(2),
    };

    #[test]
    fn waits_double_within_their_jitter_and_stop_at_the_ceiling() {
        let mut backoff = Backoff::new(POLICY);
        for ceiling_ms in [100u64, 200, 400, 800, 1600, 2000, 2000, 2000] {
            let wait = backoff.next_wait();
            let ceiling = Duration::from_millis(ceiling_ms);
            assert!(
                wait >= ceiling / 2 && wait <= ceiling,
                "{wait:?} not within half of {ceiling:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next_wait() <= POLICY.initial);
    }
}
