//! A mount's circuit breaker: when too many of its attempts fail (a
//! downstream its handlers call is down), it stops taking deliveries for a
//! while, so messages wait on the broker instead of burning their attempts,
//! then lets one through to find out whether the downstream is back.
//!
//! Closed: attempts are counted over a sliding `window`; once at least
//! `min_deliveries` ended there and the share that failed reaches
//! `failure_rate`, it opens. Open: nothing is taken for `open_for`; then
//! half-open: one delivery is taken. Its attempt decides: success closes
//! the breaker (counts start afresh), failure opens it again. Only attempts
//! that began in the current state count, so what was already running when
//! it opened cannot close or reopen it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// `[tenant.mount.breaker]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerPolicy {
    /// The share of failed attempts (0 to 1) that opens the breaker.
    pub failure_rate: f64,
    /// The fewest attempts in the window before the share is trusted.
    pub min_deliveries: u32,
    /// How far back attempts are counted.
    pub window: Duration,
    /// How long the breaker stays open before it lets one delivery through.
    pub open_for: Duration,
}

impl BreakerPolicy {
    /// Half the attempts failing opens it.
    pub const DEFAULT_FAILURE_RATE: f64 = 0.5;
    /// Counted once 20 attempts ended in the window.
    pub const DEFAULT_MIN_DELIVERIES: u32 = 20;
    /// The last minute's attempts.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
    /// Thirty seconds open.
    pub const DEFAULT_OPEN_FOR: Duration = Duration::from_secs(30);
}

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Deliveries flow.
    Closed,
    /// Nothing is taken until `until`.
    Open {
        /// When it lets one delivery through.
        until: Instant,
    },
    /// One delivery is let through; its attempt decides.
    HalfOpen,
}

impl BreakerState {
    /// The state in a word, for metrics and the console.
    pub fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen => "half-open",
        }
    }
}

/// A change of state, with what caused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Too many attempts failed in the window.
    Opened {
        /// Failed attempts in the window.
        failed: u32,
        /// All attempts in the window.
        ended: u32,
    },
    /// The open time is over: one delivery goes through.
    HalfOpened,
    /// The delivery let through succeeded.
    Closed,
    /// The delivery let through failed.
    Reopened,
}

/// Attempts counted in one slice of the window.
#[derive(Debug, Clone, Copy)]
struct Slice {
    start: Instant,
    ended: u32,
    failed: u32,
}

/// Slices per window: the window slides in steps of a tenth of itself,
/// and what it remembers stays this small however many attempts end.
const SLICES: u32 = 10;

/// A mount's circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    policy: BreakerPolicy,
    state: BreakerState,
    /// Moves on with every transition: an attempt counts only in the state
    /// it began in.
    epoch: u64,
    slices: VecDeque<Slice>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(policy: BreakerPolicy) -> Breaker {
        Breaker {
            policy,
            state: BreakerState::Closed,
            epoch: 0,
            slices: VecDeque::new(),
        }
    }

    /// Where it stands.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// What an attempt beginning now carries, to be [`Breaker::record`]ed
    /// with when it ends.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// An attempt that began in `epoch` ended at `now`, `failed` or not;
    /// the transition it caused, if any.
    pub fn record(&mut self, epoch: u64, failed: bool, now: Instant) -> Option<Transition> {
        if epoch != self.epoch {
            return None;
        }
        match self.state {
            BreakerState::Open { .. } => None,
            BreakerState::HalfOpen if failed => {
                self.open(now);
                Some(Transition::Reopened)
            }
            BreakerState::HalfOpen => {
                self.state = BreakerState::Closed;
                self.epoch += 1;
                self.slices.clear();
                Some(Transition::Closed)
            }
            BreakerState::Closed => {
                self.count(failed, now);
                let (ended, failed) = self
                    .slices
                    .iter()
                    .fold((0, 0), |(e, f), slice| (e + slice.ended, f + slice.failed));
                let tripped = ended >= self.policy.min_deliveries
                    && f64::from(failed) >= self.policy.failure_rate * f64::from(ended);
                tripped.then(|| {
                    self.open(now);
                    Transition::Opened { failed, ended }
                })
            }
        }
    }

    /// Time passes: an open breaker whose time is over lets one through.
    pub fn tick(&mut self, now: Instant) -> Option<Transition> {
        match self.state {
            BreakerState::Open { until } if now >= until => {
                self.state = BreakerState::HalfOpen;
                self.epoch += 1;
                Some(Transition::HalfOpened)
            }
            _ => None,
        }
    }

    fn open(&mut self, now: Instant) {
        self.state = BreakerState::Open {
            until: now + self.policy.open_for,
        };
        self.epoch += 1;
        self.slices.clear();
    }

    fn count(&mut self, failed: bool, now: Instant) {
        let window = self.policy.window;
        while self
            .slices
            .front()
            .is_some_and(|slice| now.saturating_duration_since(slice.start) >= window)
        {
            self.slices.pop_front();
        }
        let width = window / SLICES;
        match self.slices.back_mut() {
            Some(slice) if now.saturating_duration_since(slice.start) < width => {
                slice.ended += 1;
                slice.failed += u32::from(failed);
            }
            _ => self.slices.push_back(Slice {
                start: now,
                ended: 1,
                failed: u32::from(failed),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn policy() -> BreakerPolicy {
        BreakerPolicy {
            failure_rate: 0.5,
            min_deliveries: 4,
            window: 10 * SECOND,
            open_for: 5 * SECOND,
        }
    }

    #[test]
    fn opens_once_enough_attempts_failed_then_lets_one_through() {
        let start = Instant::now();
        let mut breaker = Breaker::new(policy());
        let epoch = breaker.epoch();
        // Three failures are not yet enough attempts to judge by.
        for _ in 0..3 {
            assert_eq!(breaker.record(epoch, true, start), None);
        }
        assert_eq!(
            breaker.record(epoch, false, start),
            Some(Transition::Opened {
                failed: 3,
                ended: 4
            })
        );
        assert_eq!(
            breaker.state(),
            BreakerState::Open {
                until: start + 5 * SECOND
            }
        );
        // What was running when it opened counts for nothing.
        assert_eq!(breaker.record(epoch, false, start + SECOND), None);
        assert_eq!(breaker.tick(start + 4 * SECOND), None);
        assert_eq!(
            breaker.tick(start + 5 * SECOND),
            Some(Transition::HalfOpened)
        );
        let probe = breaker.epoch();
        assert_eq!(
            breaker.record(probe, true, start + 6 * SECOND),
            Some(Transition::Reopened)
        );
        assert_eq!(
            breaker.tick(start + 11 * SECOND),
            Some(Transition::HalfOpened)
        );
        let probe = breaker.epoch();
        assert_eq!(
            breaker.record(probe, false, start + 12 * SECOND),
            Some(Transition::Closed)
        );
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn failures_older_than_the_window_are_forgotten() {
        let start = Instant::now();
        let mut breaker = Breaker::new(policy());
        let epoch = breaker.epoch();
        for _ in 0..3 {
            breaker.record(epoch, true, start);
        }
        // Ten seconds on, the three failures are out of the window: one
        // more failure among successes does not open it.
        let later = start + 10 * SECOND;
        for failed in [true, false, false] {
            assert_eq!(breaker.record(epoch, failed, later), None);
        }
        assert_eq!(breaker.record(epoch, false, later), None);
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn a_low_failure_rate_never_opens_it() {
        let start = Instant::now();
        let mut breaker = Breaker::new(policy());
        let epoch = breaker.epoch();
        for i in 0..1_000u32 {
            let at = start + Duration::from_millis(u64::from(i) * 10);
            assert_eq!(breaker.record(epoch, i % 3 == 1, at), None);
        }
        assert!(breaker.slices.len() <= SLICES as usize + 1);
    }
}
