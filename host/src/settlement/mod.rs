//! The settlement contract: what a handler's outcome becomes on the wire.
//!
//! [`plan`] is a pure function from what is known about a delivery and its
//! mount to a [`Plan`]: which disposition to send, what to publish first, and
//! what to fall back to if that publish fails. The broker side carries plans
//! out; nothing here knows about sockets or wasm.

use std::time::Duration;

use crate::config::Settle;

/// The application property that counts the host's retry copies.
pub const RETRY_COUNT_PROPERTY: &str = "x-ruststream-retry-count";

/// What a handler decided about one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Processed.
    Ack,
    /// Failed; deliver again.
    Retry,
    /// Failed; deliver again after the delay.
    RetryAfter(Duration),
    /// Never deliver again.
    Drop,
}

/// An AMQP terminal delivery state the host sends for an unsettled delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// `accepted`.
    Accepted,
    /// `modified` with delivery-failed = true, undeliverable-here = false.
    Modified,
    /// `rejected`.
    Rejected,
    /// `released`: only to hand a delivery back when a publish it depended on
    /// failed on a broker that does not take `modified`.
    Released,
}

/// The counters a delivery carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// The broker's redelivery counter; `None` when the message has no header
    /// section (and so no counter).
    pub delivery_count: Option<u32>,
    /// `x-ruststream-retry-count`, present on copies the host published.
    pub retry_count: Option<u32>,
}

impl Counters {
    /// The attempt number the handler sees: 1 for a first delivery.
    pub fn attempt(&self) -> u32 {
        self.retry_count
            .unwrap_or(0)
            .saturating_add(self.delivery_count.unwrap_or(0))
            .saturating_add(1)
    }

    /// A copy is counted by the host, not the broker: it has no header
    /// section, or carries the host's retry count (some brokers add a header
    /// of their own to every message, with a counter that never moves).
    pub fn is_copy(&self) -> bool {
        self.delivery_count.is_none() || self.retry_count.is_some()
    }
}

/// What a mount declares and its broker supports; fixed for a link's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How the receiver settles.
    pub settle: Settle,
    /// The attempt at which retries stop.
    pub max_attempts: Option<u32>,
    /// Whether the mount declares a dead-letter address.
    pub dead_letter: bool,
    /// Whether the broker takes `modified` on this link. Without it, `retry`
    /// takes the copy path so the attempt limit still works.
    pub modified_supported: bool,
}

/// A message the host owes the broker before (or instead of) settling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// The delivery exactly as it arrived, to the dead-letter address, now.
    DeadLetter,
    /// A copy (no header, `x-ruststream-retry-count = retry_count`) to the
    /// subscription address after `delay`.
    Copy {
        /// The copy's retry count: the delivery's plus one.
        retry_count: u32,
        /// How long to wait before publishing.
        delay: Duration,
    },
}

/// Everything the host does for one outcome, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Plan {
    /// Send this disposition before anything else.
    pub settle_now: Option<Disposition>,
    /// Then publish this.
    pub publish: Option<Publish>,
    /// Once the broker has accepted the publish, send this disposition.
    pub settle_after_publish: Option<Disposition>,
    /// If the publish fails while the delivery is still unsettled, send this
    /// instead, so the broker keeps the message.
    pub on_publish_failure: Option<Disposition>,
    /// The outcome cannot act on the broker: the delivery was settled on
    /// receipt (`AckError::Unsupported`).
    pub unsupported: bool,
}

/// Decides what to do with a delivery once its handler's outcome is known.
pub fn plan(policy: &Policy, counters: &Counters, outcome: Outcome) -> Plan {
    match policy.settle {
        Settle::AtLeastOnce => at_least_once(policy, counters, outcome),
        Settle::AtMostOnce => at_most_once(policy, counters, outcome),
    }
}

fn at_least_once(policy: &Policy, counters: &Counters, outcome: Outcome) -> Plan {
    let delay = match outcome {
        Outcome::Ack => return settle(Disposition::Accepted),
        Outcome::Drop => return settle(Disposition::Rejected),
        Outcome::Retry => Duration::ZERO,
        Outcome::RetryAfter(delay) => delay,
    };
    let keep = if policy.modified_supported {
        Disposition::Modified
    } else {
        Disposition::Released
    };
    if stops_retrying(policy, counters) {
        return if policy.dead_letter {
            publish_then_accept(Publish::DeadLetter, keep)
        } else {
            settle(Disposition::Rejected)
        };
    }
    let copy = next_copy(counters, delay);
    match outcome {
        Outcome::RetryAfter(_) => Plan {
            settle_now: Some(Disposition::Rejected),
            publish: Some(copy),
            ..Plan::default()
        },
        _ if !policy.modified_supported => publish_then_accept(copy, keep),
        _ if counters.is_copy() && policy.max_attempts.is_some() => publish_then_accept(copy, keep),
        _ => settle(Disposition::Modified),
    }
}

fn at_most_once(policy: &Policy, counters: &Counters, outcome: Outcome) -> Plan {
    let (delay, unsupported) = match outcome {
        Outcome::Ack | Outcome::Drop => return unsupported(),
        // The broker's counter cannot move for a settled delivery; only the
        // host's own count on a copy can carry a limited retry forward.
        Outcome::Retry if policy.max_attempts.is_none() || !counters.is_copy() => {
            return unsupported();
        }
        Outcome::Retry => (Duration::ZERO, true),
        Outcome::RetryAfter(delay) => (delay, false),
    };
    let publish = if stops_retrying(policy, counters) {
        policy.dead_letter.then_some(Publish::DeadLetter)
    } else {
        Some(next_copy(counters, delay))
    };
    Plan {
        publish,
        unsupported,
        ..Plan::default()
    }
}

/// At the limit, or a dead-letter address with no limit (it takes every
/// retry).
fn stops_retrying(policy: &Policy, counters: &Counters) -> bool {
    match policy.max_attempts {
        Some(limit) => counters.attempt() >= limit,
        None => policy.dead_letter,
    }
}

fn next_copy(counters: &Counters, delay: Duration) -> Publish {
    Publish::Copy {
        retry_count: counters.retry_count.unwrap_or(0).saturating_add(1),
        delay,
    }
}

fn settle(disposition: Disposition) -> Plan {
    Plan {
        settle_now: Some(disposition),
        ..Plan::default()
    }
}

fn publish_then_accept(publish: Publish, keep: Disposition) -> Plan {
    Plan {
        publish: Some(publish),
        settle_after_publish: Some(Disposition::Accepted),
        on_publish_failure: Some(keep),
        ..Plan::default()
    }
}

fn unsupported() -> Plan {
    Plan {
        unsupported: true,
        ..Plan::default()
    }
}

#[cfg(test)]
mod tests;
