//! The settlement contract: what a handler's outcome becomes on the wire.
//!
//! [`plan`] is a pure function from what is known about a delivery and its
//! mount to a [`Plan`]: which disposition to send, what to publish first, and
//! what to fall back to if that publish fails. The broker side carries plans
//! out; nothing here knows about sockets or wasm.

use std::time::Duration;

use crate::config::Settle;

mod brokers;
pub use brokers::{LinkOffers, outputs_in_transactions, policy_for};

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

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Ack => f.write_str("ack"),
            Outcome::Retry => f.write_str("retry"),
            Outcome::RetryAfter(delay) => {
                write!(f, "retry-after {}", humantime::format_duration(*delay))
            }
            Outcome::Drop => f.write_str("drop"),
        }
    }
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

impl Disposition {
    /// The AMQP name of the disposition, e.g. `accepted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Disposition::Accepted => "accepted",
            Disposition::Modified => "modified",
            Disposition::Rejected => "rejected",
            Disposition::Released => "released",
        }
    }
}

/// The counters a delivery carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// The broker's redelivery counter; `None` when the message has no header
    /// section (and so no counter).
    pub delivery_count: Option<u32>,
    /// `x-ruststream-retry-count`, present on copies the host published.
    pub retry_count: Option<u32>,
    /// Attempts an ordered mount made again itself, holding the delivery
    /// ([`Plan::RunAgain`]).
    pub in_place: u32,
}

impl Counters {
    /// The attempt number the handler sees: 1 for a first delivery.
    pub fn attempt(&self) -> u32 {
        self.retry_count
            .unwrap_or(0)
            .saturating_add(self.delivery_count.unwrap_or(0))
            .saturating_add(self.in_place)
            .saturating_add(1)
    }

    /// A copy is counted by the host, not the broker: it has no header
    /// section, or carries the host's retry count (copies keep the
    /// original's header for durability, and some brokers add a header of
    /// their own to every message, with a counter that never moves).
    pub fn is_copy(&self) -> bool {
        self.delivery_count.is_none() || self.retry_count.is_some()
    }
}

/// How `retry` below the limit asks for another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPath {
    /// Settle `modified`: the broker puts the message back and counts the
    /// redelivery.
    Modified,
    /// Publish a copy carrying the host's retry count, then accept the
    /// original: for brokers that refuse `modified` or count nothing.
    Copy,
}

impl RetryPath {
    /// As the config and the logs write it: `modified` or `copy`.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryPath::Modified => "modified",
            RetryPath::Copy => "copy",
        }
    }
}

/// Where a `retry-after` copy waits out its delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayPath {
    /// On the broker: the copy is published at once with a delivery time
    /// (Artemis' `x-opt-delivery-time`), then the original is settled.
    Scheduled,
    /// In the host, with the original still unsettled: after the delay the
    /// copy is published, then the original is settled. A crash meanwhile
    /// leaves the original on the broker.
    Held,
}

impl DelayPath {
    /// As the config and the logs write it: `scheduled` or `held`.
    pub fn as_str(self) -> &'static str {
        match self {
            DelayPath::Scheduled => "scheduled",
            DelayPath::Held => "held",
        }
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
    /// How `retry` below the limit is carried out.
    pub retry: RetryPath,
    /// Whether the broker takes `modified`. Where it does not, a delivery
    /// whose publish failed is handed back `released` instead.
    pub modified_supported: bool,
    /// Where `retry-after` copies wait.
    pub delay: DelayPath,
    /// How the original of a `retry-after` is settled once its copy is
    /// accepted: `rejected` (the contract) or `accepted`.
    pub retry_after_original: Disposition,
    /// The broker puts a `rejected` delivery back on its queue (Qpid
    /// Broker-J without a delivery limit), so `rejected` cannot give a
    /// delivery up: the host does, to the dead-letter address, or with
    /// `accepted` (dropped) where the mount has none.
    pub rejected_requeues: bool,
    /// The mount orders its deliveries by key (`order_by`): a retry below
    /// the limit runs again in place, holding the key, so no later
    /// delivery of the key overtakes it.
    pub ordered: bool,
}

impl Policy {
    /// What gives a delivery up to the broker's dead-letter policy:
    /// `rejected`, or where the broker would only put it back, the mount's
    /// dead-letter address or nothing.
    fn give_up(&self) -> Plan {
        if self.rejected_requeues && self.dead_letter {
            Plan::PublishThenSettle {
                publish: Publish::DeadLetter,
                then: Disposition::Accepted,
                otherwise: self.keep(),
            }
        } else {
            self.give_up_unread()
        }
    }

    /// What gives up a delivery the host holds none of (discarded unread):
    /// `rejected`, or where the broker would only put it back, `accepted`.
    fn give_up_unread(&self) -> Plan {
        Plan::Settle(if self.rejected_requeues {
            Disposition::Accepted
        } else {
            Disposition::Rejected
        })
    }

    /// What becomes of a delivery that is to be retried no more: it goes
    /// to the dead-letter address as it arrived, or is given up to the
    /// broker's policy.
    pub fn at_limit(&self) -> Plan {
        if self.dead_letter {
            Plan::PublishThenSettle {
                publish: Publish::DeadLetter,
                then: Disposition::Accepted,
                otherwise: self.keep(),
            }
        } else {
            self.give_up()
        }
    }

    /// What hands a delivery back to the broker when what the host owed
    /// before settling it could not be published.
    pub fn keep(&self) -> Disposition {
        if self.modified_supported {
            Disposition::Modified
        } else {
            Disposition::Released
        }
    }
}

/// A message the host owes the broker before (or instead of) settling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// The delivery exactly as it arrived, to the dead-letter address, now.
    DeadLetter,
    /// What the handler sent through its outbox, each message to its
    /// address: published only for an `ack`.
    Outputs,
    /// A copy (`x-ruststream-retry-count = retry_count`) to the subscription
    /// address, due after `delay`.
    Copy {
        /// The copy's retry count: the delivery's plus one.
        retry_count: u32,
        /// How long until the copy is due.
        delay: Duration,
        /// Where it waits.
        path: DelayPath,
    },
}

/// Everything the host does for one outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Send this disposition.
    Settle(Disposition),
    /// Publish, and once the broker has accepted it settle `then`; if the
    /// publish fails, settle `otherwise` so the broker keeps the message.
    PublishThenSettle {
        /// What to publish.
        publish: Publish,
        /// The disposition once the publish is accepted.
        then: Disposition,
        /// The disposition if it is not.
        otherwise: Disposition,
    },
    /// Ordered mounts: keep the delivery unsettled and its key held, and run
    /// the handler on it again after `delay` (the attempt counted in
    /// [`Counters::in_place`]). Nothing is sent or published.
    RunAgain {
        /// How long the key waits first.
        delay: Duration,
    },
    /// At most once: the delivery was settled on receipt, so only a publish
    /// (if any) can act; `unsupported` when the outcome asked for more
    /// (`AckError::Unsupported`).
    Presettled {
        /// What to publish, if anything.
        publish: Option<Publish>,
        /// The outcome cannot act on the broker.
        unsupported: bool,
    },
}

impl Plan {
    /// The plan of an `ack` whose handler sent messages: publish them, and
    /// accept the delivery once the broker has taken them all (at most once,
    /// publish them after the fact). Keeps the delivery when they cannot be
    /// published, so they are published if and only if it is accepted.
    pub fn with_outputs(self, policy: &Policy) -> Plan {
        match self {
            Plan::Settle(Disposition::Accepted) => Plan::PublishThenSettle {
                publish: Publish::Outputs,
                then: Disposition::Accepted,
                otherwise: policy.keep(),
            },
            Plan::Presettled {
                publish: None,
                unsupported,
            } => Plan::Presettled {
                publish: Some(Publish::Outputs),
                unsupported,
            },
            other => other,
        }
    }

    /// How long before the handler runs again in place, for a
    /// [`Plan::RunAgain`].
    pub fn runs_again(&self) -> Option<Duration> {
        match *self {
            Plan::RunAgain { delay } => Some(delay),
            _ => None,
        }
    }

    /// What the plan publishes, if anything.
    pub fn publish(&self) -> Option<Publish> {
        match *self {
            Plan::Settle(_) | Plan::RunAgain { .. } => None,
            Plan::PublishThenSettle { publish, .. } => Some(publish),
            Plan::Presettled { publish, .. } => publish,
        }
    }

    /// Whether the outcome could not act: `AckError::Unsupported`.
    pub fn unsupported(&self) -> bool {
        matches!(
            self,
            Plan::Presettled {
                unsupported: true,
                ..
            }
        )
    }
}

/// What became of a message the host published: the broker's answer, as
/// far as the host can know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// The broker took it (`accepted`, or a committed transaction).
    Accepted,
    /// The broker said no: a `rejected`, `released` or `modified` outcome,
    /// a refused link to the address, a message too large for it. Trying
    /// the same publish again would most likely meet the same answer.
    Refused {
        /// What the broker said, in its words where it gave any.
        reason: String,
    },
    /// It never reached the broker: no credit in time, no link, no session.
    /// The broker holds no copy of it.
    NotSent {
        /// Why.
        reason: String,
    },
    /// It went out, but no answer came back (a time-out, a link that died
    /// after the transfer): the broker may or may not hold it.
    Unknown {
        /// Why.
        reason: String,
    },
    /// It could not be made: no attempt will ever make it.
    Unbuildable {
        /// Why.
        reason: String,
    },
}

impl Published {
    /// Why the publish did not go through, if it did not.
    pub fn failure(&self) -> Option<&str> {
        match self {
            Published::Accepted => None,
            Published::Refused { reason }
            | Published::NotSent { reason }
            | Published::Unknown { reason }
            | Published::Unbuildable { reason } => Some(reason),
        }
    }
}

/// What follows once the publish a plan owed is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterPublish {
    /// Send this disposition (or, at most once, nothing more).
    Settle(Option<Disposition>),
    /// The plan cannot stand: carry out this one instead, which publishes
    /// neither outputs nor a copy, so it is replaced once at most.
    Instead {
        /// The plan to carry out.
        plan: Plan,
        /// Why the first one could not stand.
        reason: String,
    },
}

/// What becomes of a delivery whose plan published something, given what
/// became of that publish. The one place a delivery's fate is decided after
/// its handler returned:
///
/// - accepted: the plan's own disposition;
/// - an `ack`'s outputs refused, never sent or never made: the handler's
///   `ack` cannot stand; the delivery is planned again as a failed attempt
///   (`retry`), so `max_attempts` and the dead-letter address apply;
/// - an `ack`'s outputs of unknown fate: handed back to the broker (which
///   counts it) rather than counted by the host, since the broker may hold
///   them and a dead letter would then be wrong;
/// - a copy that can never be made: handing the delivery back would bring
///   it back to the same copy, forever; it is given up as at its limit
///   ([`Policy::at_limit`]);
/// - a copy or dead letter not accepted, whatever the reason: handed back,
///   so the delivery is never lost.
pub fn after_publish(
    policy: &Policy,
    counters: &Counters,
    plan: &Plan,
    published: &Published,
) -> AfterPublish {
    let instead = |plan, reason: &str| AfterPublish::Instead {
        plan,
        reason: reason.to_owned(),
    };
    match *plan {
        Plan::Settle(disposition) => AfterPublish::Settle(Some(disposition)),
        Plan::Presettled { .. } | Plan::RunAgain { .. } => AfterPublish::Settle(None),
        Plan::PublishThenSettle {
            publish,
            then,
            otherwise,
        } => match (published, publish) {
            (Published::Accepted, _) => AfterPublish::Settle(Some(then)),
            (
                Published::Refused { reason }
                | Published::NotSent { reason }
                | Published::Unbuildable { reason },
                Publish::Outputs,
            ) => instead(
                crate::settlement::plan(policy, counters, Outcome::Retry),
                reason,
            ),
            (Published::Unbuildable { reason }, Publish::Copy { .. }) => {
                instead(policy.at_limit(), reason)
            }
            _ => AfterPublish::Settle(Some(otherwise)),
        },
    }
}

/// Why the host settles a delivery without running its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unhandled {
    /// It is not a readable AMQP message, or nests too deep or holds too
    /// many values to be read: its bytes are at hand.
    Unreadable,
    /// It is over the mount's `max_message_size`: discarded unread, the host
    /// holds nothing of it.
    Oversized,
}

/// Decides what to do with a delivery no handler sees. An unreadable one
/// is at its limit at once: to the dead-letter address as it arrived, or
/// given up to the broker. An oversized one, of which nothing can be
/// published, is given up to the broker (`rejected`; `accepted`, gone,
/// where the broker would put a rejected one back). At most once, only
/// the dead letter can act.
pub fn plan_unhandled(policy: &Policy, unhandled: Unhandled) -> Plan {
    match (policy.settle, unhandled) {
        (Settle::AtLeastOnce, Unhandled::Unreadable) => policy.at_limit(),
        (Settle::AtLeastOnce, Unhandled::Oversized) => policy.give_up_unread(),
        (Settle::AtMostOnce, Unhandled::Unreadable) => Plan::Presettled {
            publish: policy.dead_letter.then_some(Publish::DeadLetter),
            unsupported: false,
        },
        (Settle::AtMostOnce, Unhandled::Oversized) => Plan::Presettled {
            publish: None,
            unsupported: false,
        },
    }
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
        Outcome::Ack => return Plan::Settle(Disposition::Accepted),
        Outcome::Drop => return policy.give_up(),
        Outcome::Retry => None,
        Outcome::RetryAfter(delay) => Some(delay),
    };
    let keep = policy.keep();
    let publish_then = |publish, then| Plan::PublishThenSettle {
        publish,
        then,
        otherwise: keep,
    };
    if stops_retrying(policy, counters) {
        return policy.at_limit();
    }
    // A copy or a redelivery would let the key's later deliveries pass.
    if policy.ordered {
        return Plan::RunAgain {
            delay: delay.unwrap_or_default(),
        };
    }
    match delay {
        Some(delay) => publish_then(
            next_copy(counters, delay, policy.delay),
            policy.retry_after_original,
        ),
        // A copy carries its own count forward; a redelivery would lose it.
        None if policy.retry == RetryPath::Copy
            || (counters.is_copy() && policy.max_attempts.is_some()) =>
        {
            publish_then(
                next_copy(counters, Duration::ZERO, policy.delay),
                Disposition::Accepted,
            )
        }
        None => Plan::Settle(Disposition::Modified),
    }
}

fn at_most_once(policy: &Policy, counters: &Counters, outcome: Outcome) -> Plan {
    let (delay, unsupported) = match outcome {
        Outcome::Ack | Outcome::Drop => return nothing_presettled(),
        // The broker's counter cannot move for a settled delivery; only the
        // host's own count on a copy can carry a limited retry forward.
        Outcome::Retry if policy.max_attempts.is_none() || !counters.is_copy() => {
            return nothing_presettled();
        }
        Outcome::Retry => (Duration::ZERO, true),
        Outcome::RetryAfter(delay) => (delay, false),
    };
    let publish = if stops_retrying(policy, counters) {
        policy.dead_letter.then_some(Publish::DeadLetter)
    } else {
        Some(next_copy(counters, delay, policy.delay))
    };
    Plan::Presettled {
        publish,
        unsupported,
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

fn next_copy(counters: &Counters, delay: Duration, path: DelayPath) -> Publish {
    Publish::Copy {
        retry_count: counters.retry_count.unwrap_or(0).saturating_add(1),
        delay,
        path,
    }
}

fn nothing_presettled() -> Plan {
    Plan::Presettled {
        publish: None,
        unsupported: true,
    }
}

#[cfg(test)]
mod tests;
